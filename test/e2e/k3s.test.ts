// pier on a real k3s server, installed with the README's k3s quick start as
// written (test/support/readme.ts lists each substitution and why): k3s
// built from its Go module (test/k3s/build.sh, cached in ~/.cache/pier/k3s) and run
// as one node in a lab node's network namespace (test/k3s/k3s.ts, which
// names each part of k3s turned off and why); pier's images imported by the
// README's `k3s ctr images import -` line (as `ctr`, k3s's link: readme.ts
// says why); `kubectl apply -k deploy/overlays/k3s`; the
// Deployment `hello` exposed and reached from the lab's client, TCP and UDP,
// IPv4 and IPv6; then the README's uninstall and the cleanup sweep.
//
// A cold k3s build is 13 to 25 minutes on two cores: this test never starts one
// unless PIER_K3S=build. Without the binary it is skipped, saying so.
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { V1Service } from '@kubernetes/client-node';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { kubectlPath } from '../cluster/controlplane.ts';
import { ensureImages, type BuiltImages } from '../images/images.ts';
import { BUILD_SH, K3S_BINARY, K3S_VERSION, k3sRecipeIsCurrent, startK3s, type K3sNode } from '../k3s/k3s.ts';
import { Lab, type ProbeResult } from '../lab/lab.ts';
import { runReadme } from '../support/readme.ts';
import { eventually } from '../support/wait.ts';

const BUILD = process.env['PIER_K3S'] === 'build';
const HAVE_K3S = existsSync(K3S_BINARY);
const SYSTEM = 'pier-system';
const NS = 'default';

if (HAVE_K3S && !BUILD && !k3sRecipeIsCurrent()) {
  // Used anyway: a rebuild is the reader's call (`bash test/k3s/build.sh`), not the test's.
  console.warn(`[k3s] ${K3S_BINARY} was built by another version of test/k3s/build.sh; running with it. Rebuild with \`bash test/k3s/build.sh\`.`);
}
if (!HAVE_K3S && !BUILD) {
  // Printed, so that a skip is never silent.
  console.warn(
    `[k3s] SKIPPED test/e2e/k3s.test.ts: no k3s ${K3S_VERSION} at ${K3S_BINARY}, and a cold build (13 to 25 minutes on two cores) is too long to start from a test. ` +
      'Prime the cache once with `bash test/k3s/build.sh` (every later run uses it), or run with PIER_K3S=build to build it here.',
  );
}

/**
 * One docker-archive holding every image of `archives` (each a
 * docker-archive of one image), as `docker save A B` writes: the layers and
 * configs side by side, manifest.json listing both.
 */
async function mergeDockerArchives(archives: string[], out: string, work: string): Promise<void> {
  const manifest: unknown[] = [];
  for (const archive of archives) {
    await execa('tar', ['-xf', archive, '-C', work]);
    manifest.push(...(JSON.parse(readFileSync(join(work, 'manifest.json'), 'utf8')) as unknown[]));
  }
  writeFileSync(join(work, 'manifest.json'), JSON.stringify(manifest));
  // `repositories` is the older format's index; ctr reads manifest.json.
  rmSync(join(work, 'repositories'), { force: true });
  await execa('tar', ['-cf', out, '-C', work, '.']);
}

// A skip names its reason in the title, which the run's summary lists.
const skipped = !HAVE_K3S && !BUILD ? ` (skipped: no k3s build at ${K3S_BINARY}; \`bash test/k3s/build.sh\` primes the cache)` : '';
describe.skipIf(skipped !== '')(`pier on k3s ${K3S_VERSION}, installed as the README's k3s quick start says${skipped}`, () => {
  let lab: Lab;
  let k3s: K3sNode;
  let images: BuiltImages;
  // Made in beforeAll: a skipped suite's body still runs, and would leave it behind.
  let work: string;
  let bin: string;

  const client = () => lab.clients[0]!;
  const node = () => lab.nodes[0]!;
  const inClient = () => ['ip', 'netns', 'exec', client().ns];
  // `bin` holds `ctr` as the k3s installer links it (to k3s), ahead of Debian's ctr: see the k3s-import run's substitution.
  const readme = (env: Record<string, string> = {}) => ({ kubeconfig: k3s.kubeconfig, wrap: k3s.wrap, path: [bin], env });
  const svc = async (name: string) => JSON.parse(await k3s.kubectl(['get', 'svc', '-n', NS, name, '-o', 'json'])) as V1Service;
  const ingressIps = (s: V1Service) => (s.status?.loadBalancer?.ingress ?? []).map((i) => i.ip!).sort();
  const running = async (selector: string) =>
    (await k3s.kubectl(['get', 'pods', '-n', NS, '-l', selector, '--field-selector=status.phase=Running', '-o', 'jsonpath={.items[*].metadata.name}'])).split(' ').filter(Boolean);
  const answeredBy = (rs: ProbeResult[]) => rs.map((r) => (r.ok ? r.reply!.pod : `failed: ${r.error}`));
  /** Every probe of `count` from the client answered; by which pods. */
  const answers = (host: string, port: number, proto: 'tcp' | 'udp') =>
    eventually(`${proto.toUpperCase()} answers on [${host}]:${port}`, async () => {
      const r = await lab.probe(client(), host, port, { proto, count: 6 });
      return r.every((x) => x.ok) ? answeredBy(r) : undefined;
    }, { timeoutMs: 30_000, intervalMs: 250 });
  /** pier's iptables chains and nftables tables on the node. */
  const pierRules = async () => {
    const out: string[] = [];
    for (const save of ['iptables-save', 'ip6tables-save']) {
      const { stdout } = await k3s.exec(save, []);
      out.push(...stdout.split('\n').filter((l) => l.includes('PIER-')).map((l) => `${save}: ${l}`));
    }
    const { stdout } = await k3s.exec('nft', ['list', 'tables']);
    out.push(...stdout.split('\n').filter((l) => /^table ip6? pier$/.test(l)));
    return out;
  };

  beforeAll(async () => {
    if (BUILD) {
      // PIER_K3S=build: the cold build is asked for (progress on stderr).
      const r = await execa('bash', [BUILD_SH], { stdin: 'ignore', stderr: 'inherit', reject: false });
      if (r.exitCode !== 0) throw new Error(`test/k3s/build.sh exited with ${r.exitCode} (its log is above)`);
    }
    work = mkdtempSync(join(tmpdir(), 'pier-k3s-test-'));
    bin = join(work, 'bin');
    images = await ensureImages();
    // No host link: the API server is k3s's, inside the node; nothing is routed in the machine's own namespace.
    lab = await Lab.create({ nodes: [0], clients: 1, podBridges: false });
    k3s = await startK3s({ node: node(), kubectl: await kubectlPath(), preload: [images.archives.pause, images.archives.echo] });
    mkdirSync(join(work, 'images'));
    mkdirSync(bin);
    symlinkSync(K3S_BINARY, join(bin, 'ctr'));
    await mergeDockerArchives([images.archives.controller, images.archives.agent], join(work, 'pier-images.tar'), join(work, 'images'));
  }, 1_800_000);

  afterAll(async () => {
    await k3s?.stop();
    await lab?.destroy();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  it("the README's k3s quick start: the images into k3s's containerd, kubectl apply -k deploy/overlays/k3s, rollout status", async () => {
    const [imported] = await runReadme('k3s-import', readme({ IMAGES_ARCHIVE: join(work, 'pier-images.tar') }));
    expect(imported!.stdout).toMatch(/pier\/controller:0\.1\.0/);
    expect(imported!.stdout).toMatch(/pier\/agent:0\.1\.0/);
    await runReadme('k3s-install', readme());
    const out = await k3s.kubectl(['get', 'pods', '-n', SYSTEM, '-o', 'jsonpath={range .items[*]}{.metadata.labels.app\\.kubernetes\\.io/name} {.status.containerStatuses[0].ready}{"\\n"}{end}']);
    const pods = out.split('\n').filter(Boolean).map((l) => l.split(' '));
    // Two controller replicas (one node: the spread is a preference) and the node's agent, all ready.
    expect(pods.filter(([app]) => app === 'pier-controller').map(([, ready]) => ready)).toEqual(['true', 'true']);
    expect(pods.filter(([app]) => app === 'pier-agent').map(([, ready]) => ready)).toEqual(['true']);
  });

  it("the README's k3s quick start: kubectl create deployment hello + expose --type=LoadBalancer, get svc, curl from another machine; the node's address in the status, TCP answered by the pods", async () => {
    // The image built here stands in for nginx (test/support/readme.ts says why).
    await runReadme('k3s-hello', readme({ IMAGE: images.names.echo }));
    await k3s.kubectl(['rollout', 'status', 'deployment/hello', '--timeout=120s']);
    const status = await eventually('hello\'s status to list the node', async () => {
      const s = await svc('hello');
      return ingressIps(s).join() === node().v4 ? s : undefined;
    });
    expect(status.status?.loadBalancer?.ingress?.every((i) => i.ipMode === 'Proxy')).toBe(true);
    const pods = await running('app=hello');
    expect(pods).toHaveLength(2);
    for (const pod of await answers(node().v4, 8080, 'tcp')) expect(pods).toContain(pod);

    const [getSvc] = await runReadme('k3s-get-svc', readme());
    const [header, row] = getSvc!.stdout.split('\n').map((l) => l.trim().split(/\s+/));
    expect(header![3]).toBe('EXTERNAL-IP');
    expect(row![3]).toBe(node().v4);
    // The README's curl, from another machine on the node's network: the lab's client.
    const [curl] = await runReadme('k3s-curl', { wrap: inClient(), env: { NODE_ADDRESS: row![3]! } });
    expect(pods).toContain((JSON.parse(curl!.stdout) as { pod: string }).pod);
  });

  it('serves UDP, and IPv4 and IPv6 on a dual-stack Service (k3s started dual-stack)', async () => {
    // Not README lines: the same Deployment behind a UDP Service and a dual-stack TCP+UDP one.
    await k3s.kubectl(['expose', 'deployment', 'hello', '--name=hello-udp', '--type=LoadBalancer', '--protocol=UDP', '--port=9090', '--target-port=8080']);
    await k3s.kubectl(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'v1',
        kind: 'Service',
        metadata: { name: 'hello-dual', namespace: NS },
        spec: {
          type: 'LoadBalancer',
          ipFamilyPolicy: 'RequireDualStack',
          ipFamilies: ['IPv4', 'IPv6'],
          selector: { app: 'hello' },
          ports: [
            { name: 'tcp', protocol: 'TCP', port: 9100, targetPort: 8080 },
            { name: 'udp', protocol: 'UDP', port: 9100, targetPort: 8080 },
          ],
        },
      }),
    });
    const pods = await running('app=hello');
    await eventually('hello-udp\'s status', async () => ingressIps(await svc('hello-udp')).join() === node().v4);
    for (const pod of await answers(node().v4, 9090, 'udp')) expect(pods).toContain(pod);

    const both = [node().v4, node().v6].sort();
    await eventually('hello-dual\'s status to list both of the node\'s addresses', async () => ingressIps(await svc('hello-dual')).join() === both.join());
    for (const host of [node().v4, node().v6]) {
      for (const proto of ['tcp', 'udp'] as const) for (const pod of await answers(host, 9100, proto)) expect(pods).toContain(pod);
    }
  });

  it('uninstalls as the README says: kubectl delete -k deploy/overlays/k3s, then deploy/cleanup leaves no PIER chain and no pier table on the node', async () => {
    expect((await pierRules()).length).toBeGreaterThan(0);
    await runReadme('uninstall-k3s', readme());
    // The agents stop; their rules stay (an upgrade must drop no traffic).
    await eventually('pier-system\'s pods to be gone', async () => (await k3s.kubectl(['get', 'pods', '-n', SYSTEM, '-o', 'name'])).trim() === '', { timeoutMs: 120_000 });
    expect((await pierRules()).length).toBeGreaterThan(0);
    await runReadme('uninstall-k3s-sweep', readme());
    expect(await pierRules()).toEqual([]);
  });
});

