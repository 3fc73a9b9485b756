// The container images, built as users build them: test/images/build.sh runs
// buildah on Dockerfile.agent and Dockerfile.controller as they are (FROM a
// node:24-bookworm-slim made locally, since no registry is reachable here),
// plus the pause and echo images the real-node tests need. These tests read
// what buildah committed, look into the images' root filesystems, run them
// with runc (the runtime under containerd) the way deploy/ runs them, against
// a real API server, and import the archives into a containerd.
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync, type Dirent } from 'node:fs';
import { createConnection } from 'node:net';
import { createSocket } from 'node:dgram';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { CoordinationV1Api, CoreV1Api, type KubernetesObject, type V1Container, type V1DaemonSet, type V1Deployment } from '@kubernetes/client-node';
import { execa, execaSync, type ResultPromise } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { binaries, type IptablesFlavour } from '../../agent/iptables/xtables.ts';
import { DEFAULT_NAMESPACE, FAMILIES, LEADER_LEASE_NAME } from '../../lib/contract.ts';
import { ensureNamespace, registerNode, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { ensureImages, imageConfig, IMAGES, mountImage, type BuiltImages, type ImageConfig, type ImageName } from '../images/images.ts';
import { parseUser, runContainer, startContainer, type Container, type RunOptions } from '../images/runc.ts';
import { atExit } from '../support/cleanup.ts';
import { containerEnv, render } from '../support/deploy.ts';
import { freePort } from '../support/ports.ts';
import { eventually } from '../support/wait.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const PKG = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  version: string;
  license: string;
  dependencies: Record<string, string>;
  scripts: Record<string, string>;
};
/** What deploy/ runs: the manifests pass only args (controller, agent, cleanup). */
const BUNDLE = '/app/dist/pier.mjs';
const PIER = ['agent', 'controller'] as const;
type Pier = (typeof PIER)[number];
/** Every backend the agent may pick; the Record makes a new IptablesFlavour a compile error here. */
const BACKENDS = Object.keys({ nft: true, legacy: true } satisfies Record<IptablesFlavour, true>) as IptablesFlavour[];
/** Uncompressed, with room to spare: a bigger image means something slipped in (a node_modules, apt's caches). */
const MAX_MB: Record<ImageName, number> = { agent: 300, controller: 300, echo: 300, pause: 2 };
/** Where the tests mount a kubeconfig, as a Secret would be. */
const KUBECONFIG = '/var/run/secrets/pier/kubeconfig';

/** A Docker-style reference in full: pier/agent:0.1.0 is docker.io/pier/agent:0.1.0. */
const fullName = (ref: string) => (/^[^/]+[.:][^/]*\//.test(ref) ? ref : `docker.io/${ref.includes('/') ? ref : `library/${ref}`}`);
const envOf = (config: ImageConfig) => Object.fromEntries((config.Env ?? []).map((e) => [e.slice(0, e.indexOf('=')), e.slice(e.indexOf('=') + 1)]));

/** Every container of a workload in deploy/ (base and the uninstall sweep) that runs one of pier's images. */
async function deployedContainers(images: BuiltImages): Promise<{ where: string; image: Pier; container: V1Container; workload: V1Deployment | V1DaemonSet }[]> {
  const found = [];
  for (const kustomization of ['base', 'cleanup'] as const) {
    const { objects } = await render(kustomization);
    for (const o of objects as (KubernetesObject & (V1Deployment | V1DaemonSet))[]) {
      if (o.kind !== 'Deployment' && o.kind !== 'DaemonSet') continue;
      const pod = o.spec!.template.spec!;
      for (const container of [...(pod.initContainers ?? []), ...pod.containers]) {
        const image = PIER.find((i) => fullName(container.image!) === images.names[i]);
        if (!image) throw new Error(`${kustomization}: ${o.kind} ${o.metadata?.name} runs ${container.image}, which is none of the built images (${PIER.map((i) => images.names[i]).join(', ')})`);
        found.push({ where: `${kustomization}: ${o.kind} ${o.metadata?.name}/${container.name}`, image, container, workload: o });
      }
    }
  }
  return found;
}

/** A Kubernetes memory quantity in MiB (binary and decimal suffixes, as deploy/ may write them). */
function mebibytes(quantity: string): number {
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|k|M|G)?$/.exec(quantity);
  if (!m) throw new Error(`not a memory quantity: ${quantity}`);
  const factor = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, k: 1e3, M: 1e6, G: 1e9 }[m[2] as 'Ki'] ?? 1;
  return (Number(m[1]) * factor) / 2 ** 20;
}

/** A pod's security settings as runc options: user, read-only root, the capabilities left after dropping ALL. */
function securityOf(container: V1Container, workload: V1Deployment | V1DaemonSet): Pick<RunOptions, 'user' | 'readOnlyRoot' | 'capabilities'> {
  const pod = workload.spec!.template.spec!.securityContext ?? {};
  const sc = container.securityContext ?? {};
  expect(sc.capabilities?.drop).toEqual(['ALL']);
  expect(sc.allowPrivilegeEscalation).toBe(false); // runc's noNewPrivileges, always set by runc.ts
  const uid = sc.runAsUser ?? pod.runAsUser;
  const gid = sc.runAsGroup ?? pod.runAsGroup;
  return {
    ...(uid !== undefined ? { user: { uid, gid: gid ?? uid } } : {}),
    readOnlyRoot: sc.readOnlyRootFilesystem === true,
    capabilities: sc.capabilities?.add ?? [],
  };
}

describe('the images, as buildah built them', () => {
  let images: BuiltImages;
  const configs = {} as Record<ImageName, ImageConfig>;

  beforeAll(async () => {
    images = await ensureImages();
    for (const image of IMAGES) configs[image] = await imageConfig(images, image);
  });

  it('deploy/ runs them by the names they are built under, with no command (so the ENTRYPOINT runs) or one the image has', async () => {
    const containers = await deployedContainers(images);
    expect(containers.map((c) => c.where)).toEqual(expect.arrayContaining(['base: Deployment pier-controller/controller', 'base: DaemonSet pier-agent/agent', 'cleanup: DaemonSet pier-cleanup/cleanup']));
    for (const { where, image, container } of containers) {
      if (container.command === undefined) {
        // args replace CMD: a subcommand; the main workloads' is the image's CMD.
        expect(container.args?.[0], where).toMatch(/^(agent|controller|cleanup)$/);
        if (where.startsWith('base: ')) expect(container.args, where).toEqual(configs[image].Cmd);
      } else {
        // The image must have the program the command names, on its PATH.
        const r = await runContainer(images, image, { command: [container.command[0]!, '--version'] });
        expect(r.exitCode, `${where}: ${container.command[0]} --version: ${r.stderr}`).toBe(0);
      }
    }
  });

  it.each(PIER)('%s: runs the CLI from /app with the entry point the manifests rely on, its subcommand by default', (image) => {
    const config = configs[image];
    // node, its flags (both keep their heap small), the bundled CLI.
    const [program, ...rest] = config.Entrypoint ?? [];
    expect(program).toBe('node');
    expect(rest.at(-1)).toBe(BUNDLE);
    expect(rest.length).toBeGreaterThan(1);
    for (const flag of rest.slice(0, -1)) expect(flag).toMatch(/^--[a-z-]+(=\S+)?$/);
    expect(config.WorkingDir).toBe('/app');
    expect(config.Cmd).toEqual([image]);
    expect(envOf(config)['NODE_ENV']).toBe('production');
  });

  it.each(PIER)('%s: OCI labels name it, its licence and package.json version', (image) => {
    const labels = configs[image].Labels ?? {};
    expect(labels['org.opencontainers.image.title']).toBe(`pier-${image}`);
    expect(labels['org.opencontainers.image.description']).toMatch(new RegExp(`^pier ${image}: `));
    expect(labels).toHaveProperty(['org.opencontainers.image.source']);
    expect(labels['org.opencontainers.image.licenses']).toBe(PKG.license);
    expect(labels['org.opencontainers.image.version']).toBe(PKG.version);
  });

  it('are named after package.json version', () => {
    expect(images.names.agent).toBe(`docker.io/pier/agent:${PKG.version}`);
    expect(images.names.controller).toBe(`docker.io/pier/controller:${PKG.version}`);
  });

  it('controller: runs as a non-root numeric user; agent: as root', () => {
    expect(configs.controller.User).toBe('65532:65532');
    expect(parseUser(configs.agent.User)).toEqual({ uid: 0, gid: 0 });
  });

  it('agent: npm run bench:agent measures the agent with the Node flags its image runs it with', () => {
    const flags = (configs.agent.Entrypoint ?? []).slice(1, -1);
    expect(flags.length).toBeGreaterThan(0);
    const bench = PKG.scripts['bench:agent']!.split(' ');
    expect(bench[0]).toBe('node');
    expect(bench.slice(1, -1).filter((f) => f !== '--expose-gc')).toEqual(flags);
  });

  it('controller: its old generation is bounded below the memory limit deploy/ gives it, with room for the rest of the process', async () => {
    const flags = (configs.controller.Entrypoint ?? []).slice(1, -1);
    const bound = flags.map((f) => /^--max-old-space-size=(\d+)$/.exec(f)).find(Boolean);
    expect(bound, `no --max-old-space-size in ${JSON.stringify(flags)}`).toBeTruthy();
    const heapMiB = Number(bound![1]);
    const { container } = (await deployedContainers(images)).find((c) => c.where === 'base: Deployment pier-controller/controller')!;
    const limitMiB = mebibytes(String(container.resources?.limits?.['memory']));
    const requestMiB = mebibytes(String(container.resources?.requests?.['memory']));
    // Code, the young generation, buffers and the node binary's pages take ~80-100 MB beside the heap (bench/README.md).
    expect(limitMiB - heapMiB).toBeGreaterThanOrEqual(96);
    expect(requestMiB).toBeLessThan(limitMiB);
  });

  it.each(PIER)('%s: /app holds the bundled CLI, its source map, the licences of what it bundles and package.json, and nothing else', async (image) => {
    const mounted = await mountImage(images, image);
    try {
      const app = join(mounted.rootfs, 'app');
      const files = (readdirSync(app, { recursive: true, withFileTypes: true }) as Dirent[]).filter((e) => !e.isDirectory());
      expect(files.map((e) => relative(app, join(e.parentPath, e.name))).sort()).toEqual(['dist/THIRD-PARTY-NOTICES.txt', 'dist/pier.mjs', 'dist/pier.mjs.map', 'package.json']);
      const notices = readFileSync(join(app, 'dist/THIRD-PARTY-NOTICES.txt'), 'utf8');
      for (const dep of Object.keys(PKG.dependencies)) expect(notices).toMatch(new RegExp(`^${dep} \\d+\\.\\d+\\.\\d+ \\(`, 'm'));
      expect(JSON.parse(readFileSync(join(app, 'package.json'), 'utf8'))).toMatchObject({ version: PKG.version });
      // No node_modules where the CLI could resolve one (the file list above covers /app), and
      // only the base image's npm among the global ones: the runs below prove the bundle complete.
      expect(existsSync(join(mounted.rootfs, 'node_modules'))).toBe(false);
      expect(readdirSync(join(mounted.rootfs, 'usr/local/lib/node_modules'))).toEqual(['npm']);
    } finally {
      await mounted.remove();
    }
  });

  it('agent: every iptables binary the agent calls, nft and legacy, IPv4 and IPv6, runs in the image', async () => {
    const needed = FAMILIES.flatMap((family) => BACKENDS.flatMap((backend) => Object.values(binaries(backend, family)).map((bin) => ({ bin, backend, family }))));
    expect(needed).toHaveLength(12);
    const r = await runContainer(images, 'agent', { command: ['sh', '-c', 'for b; do "$b" --version || exit 1; done', 'sh', ...needed.map((n) => n.bin)] });
    expect(r.exitCode, r.stderr).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines).toHaveLength(12);
    // e.g. "ip6tables-nft-save v1.8.9 (nf_tables)", "iptables v1.8.9 (legacy)": the family and backend each binary is.
    needed.forEach(({ bin, backend, family }, i) => {
      const name = family === 'ipv4' ? 'iptables' : 'ip6tables';
      expect(lines[i], bin).toMatch(new RegExp(`^${name}(-${backend})?(-save|-restore)? v1\\.8\\.\\d+ \\(${backend === 'nft' ? 'nf_tables' : 'legacy'}\\)$`));
    });
  });

  it('agent: conntrack, which deletes stale UDP and SCTP flows, runs in the image', async () => {
    const r = await runContainer(images, 'agent', { command: ['conntrack', '--version'] });
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^conntrack v1\.4\.\d+ \(conntrack-tools\)/);
  });

  it('agent: nft, which writes pier\'s table with --backend nftables, runs in the image', async () => {
    const r = await runContainer(images, 'agent', { command: ['nft', '--version'] });
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^nftables v1\.\d+\.\d+/);
  });

  it.each(['agent', 'controller', 'echo'] as const)('%s: runs Node 24, the version its NODE_VERSION names', async (image) => {
    const r = await runContainer(images, image, { command: ['node', '--version'] });
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^v24\.\d+\.\d+$/);
    expect(r.stdout).toBe(`v${envOf(configs[image])['NODE_VERSION']}`);
  });

  it('their sizes stay within bounds', () => {
    // A docker-archive holds every layer uncompressed: its size is the image's on a node's disk.
    const sizes = Object.fromEntries(IMAGES.map((i) => [i, statSync(images.archives[i]).size])) as Record<ImageName, number>;
    process.stderr.write(`[images] uncompressed sizes: ${IMAGES.map((i) => `${i} ${(sizes[i] / 1e6).toFixed(1)} MB`).join(', ')}\n`);
    for (const image of IMAGES) expect(sizes[image], image).toBeLessThan(MAX_MB[image] * 1e6);
  });

  it.each([
    ['controller', ['controller', '--help'], /^pier controller: .*\n\nUsage: pier controller/],
    ['controller', ['--help'], /^pier \d+\.\d+\.\d+: [\s\S]*Usage: pier <command>/],
    ['agent', ['agent', '--help'], /^pier agent: .*\n\nUsage: pier agent/],
    ['agent', ['plan', '--help'], /^pier plan: [\s\S]*\n\nUsage: pier plan/],
    ['agent', ['trace', '--help'], /^pier trace: [\s\S]*\n\nUsage: pier trace/],
    ['controller', ['status', '--help'], /^pier status: [\s\S]*\n\nUsage: pier status/],
    ['agent', ['cleanup', '--help'], /^pier cleanup: .*\n\nUsage: pier cleanup/],
    ['agent', ['check', '--help'], /^pier check: .*\n\nUsage: pier check/],
  ] as [Pier, string[], RegExp][])('%s image: %j exits 0 with its usage', async (image, args, usage) => {
    const r = await runContainer(images, image, { args, readOnlyRoot: true });
    expect(r.stderr).toBe('');
    expect(r.exitCode).toBe(0);
    expect(r.stdout).toMatch(usage);
  });

  it.each(PIER)('%s image: --version prints package.json version', async (image) => {
    const r = await runContainer(images, image, { args: ['--version'], readOnlyRoot: true });
    expect(r).toMatchObject({ exitCode: 0, stdout: PKG.version });
  });

  it('echo: answers TCP and UDP with the pod name from POD_NAME and the peer address it saw', async () => {
    expect(configs.echo.User).toBe('65532:65532');
    const port = await freePort();
    const c = await startContainer(images, 'echo', { args: ['--port', String(port)], env: { POD_NAME: 'echo-7f9c4-x2k8p' }, readOnlyRoot: true });
    const stop = atExit(() => c.proc.kill('SIGKILL'));
    try {
      await eventually('the echo server to listen', () => {
        if (c.exitCode() !== undefined) throw new Error(`exited: ${c.output()}`);
        return /^ready$/m.test(c.output()) || undefined;
      }, { timeoutMs: 30_000 });
      const tcp = await new Promise<string>((resolve, reject) => {
        let data = '';
        const sock = createConnection({ host: '127.0.0.1', port }, () => {});
        sock.on('data', (d) => (data += d));
        sock.on('end', () => resolve(data));
        sock.on('error', reject);
      });
      expect(JSON.parse(tcp)).toMatchObject({ pod: 'echo-7f9c4-x2k8p', proto: 'tcp', peer: '127.0.0.1' });
      const udp = await new Promise<string>((resolve, reject) => {
        const sock = createSocket('udp4');
        const timer = setTimeout(() => (sock.close(), reject(new Error('no UDP answer'))), 5000);
        sock.on('message', (msg) => (clearTimeout(timer), sock.close(), resolve(String(msg))));
        sock.send('x', port, '127.0.0.1');
      });
      expect(JSON.parse(udp)).toMatchObject({ pod: 'echo-7f9c4-x2k8p', proto: 'udp', peer: '127.0.0.1' });
      c.proc.kill('SIGTERM');
      expect((await c.proc).exitCode).toBe(0);
    } finally {
      c.proc.kill('SIGKILL');
      stop();
      await c.remove();
    }
  });

  it('pause: a static binary that runs as 65535, prints its version and stops on SIGTERM', async () => {
    expect(configs.pause).toMatchObject({ User: '65535:65535', Entrypoint: ['/pause'] });
    const v = await runContainer(images, 'pause', { args: ['-v'], readOnlyRoot: true });
    expect(v).toMatchObject({ exitCode: 0, stdout: expect.stringMatching(/^pause\.c v3\.\d+(\.\d+)?-v1\.\d+\.\d+$/) });
    const c = await startContainer(images, 'pause', { readOnlyRoot: true });
    try {
      const pid = await eventually('pause to start', () => c.pid().catch(() => undefined), { timeoutMs: 10_000 });
      expect(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]).toBe('65535');
      // The first process of its PID namespace, as a sandbox's pause is: no "should be the first process" warning.
      await sleep(200);
      c.proc.kill('SIGTERM');
      const r = await c.proc;
      expect(r.exitCode).toBe(0);
      expect(String(r.stderr)).toMatch(/Shutting down, got signal: Terminated/);
      expect(String(r.stderr)).not.toMatch(/first process/);
    } finally {
      await c.remove();
    }
  });

  it('the archives import into containerd under their names, and containerd runs them', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pier-containerd-'));
    let daemon: ResultPromise | undefined;
    let daemonExited = false;
    const stopSync = () => {
      if (daemon?.pid !== undefined && !daemonExited) {
        try {
          process.kill(daemon.pid, 'SIGKILL');
        } catch {
          // already gone
        }
      }
      const mounts = execaSync('findmnt', ['-rn', '-o', 'TARGET'], { reject: false }).stdout.split('\n').filter((m) => m.startsWith(`${dir}/`));
      for (const m of mounts.reverse()) execaSync('umount', ['-l', m], { reject: false });
      rmSync(dir, { recursive: true, force: true });
    };
    const unregister = atExit(stopSync);
    try {
      const sock = join(dir, 'containerd.sock');
      writeFileSync(
        join(dir, 'config.toml'),
        [`version = 2`, `root = "${dir}/root"`, `state = "${dir}/state"`, `disabled_plugins = ["io.containerd.grpc.v1.cri"]`, `[grpc]`, `  address = "${sock}"`, ''].join('\n'),
      );
      daemon = execa('containerd', ['--config', join(dir, 'config.toml')], { stdin: 'ignore', all: true, buffer: true, reject: false });
      void daemon.then(() => (daemonExited = true));
      const ctr = async (args: string[]) => {
        const r = await execa('ctr', ['--address', sock, '--namespace', 'k8s.io', ...args], { reject: false, all: true, stdin: 'ignore' });
        if (r.exitCode !== 0) throw new Error(`ctr ${args.join(' ')}: ${String(r.all)}`);
        return r.stdout;
      };
      await eventually('containerd to answer', async () => {
        if (daemonExited) throw new Error(`containerd exited: ${String((await daemon!).all).slice(-2000)}`);
        return (await ctr(['version']).then(() => true).catch(() => undefined)) ?? undefined;
      }, { timeoutMs: 30_000, intervalMs: 200 });
      for (const image of IMAGES) await ctr(['images', 'import', images.archives[image]]);
      const listed = (await ctr(['images', 'list', '--quiet'])).split('\n').filter(Boolean).sort();
      expect(listed).toEqual(IMAGES.map((i) => images.names[i]).sort());
      // ctr run uses the image's own configuration: ENTRYPOINT, USER.
      expect((await ctr(['run', '--rm', images.names.pause, 'pause-v', '/pause', '-v'])).trim()).toMatch(/^pause\.c v3\./);
      expect((await ctr(['run', '--rm', images.names.controller, 'controller-version', 'node', BUNDLE, '--version'])).trim()).toBe(PKG.version);
    } finally {
      daemon?.kill('SIGTERM');
      await daemon;
      stopSync();
      unregister();
    }
  });

  describe('against a real API server', () => {
    let cp: ControlPlane;
    let work: string;
    let unregister: () => void;

    beforeAll(async () => {
      cp = await startControlPlane();
      await ensureNamespace(cp.admin.makeApiClient(CoreV1Api), DEFAULT_NAMESPACE);
      work = mkdtempSync(join(tmpdir(), 'pier-images-'));
      unregister = atExit(() => rmSync(work, { recursive: true, force: true }));
    });

    afterAll(async () => {
      await cp?.stop();
      if (work) rmSync(work, { recursive: true, force: true });
      unregister?.();
    });

    /** The container deploy/base runs `image` in, as runc options: its args, environment and security settings, plus a kubeconfig and a free health port. */
    async function asDeployed(image: Pier, kubeconfigMode: number, extraArgs: string[], pod: { name: string; nodeName?: string }): Promise<{ opts: RunOptions; port: number }> {
      const { container, workload } = (await deployedContainers(images)).find((c) => c.where === (image === 'controller' ? 'base: Deployment pier-controller/controller' : 'base: DaemonSet pier-agent/agent'))!;
      const { objects } = await render('base');
      const env = containerEnv(objects, workload.kind as 'Deployment' | 'DaemonSet', workload.metadata!.name!, { ...pod, namespace: DEFAULT_NAMESPACE });
      const port = await freePort();
      const kubeconfig = join(work, `${image}-kubeconfig`);
      // Outside the image, readable by the container's user, like a mounted Secret.
      writeFileSync(kubeconfig, cp.admin.exportConfig(), { mode: kubeconfigMode });
      const opts: RunOptions = {
        ...securityOf(container, workload),
        args: [...(container.args ?? []), ...extraArgs, `--kubeconfig=${KUBECONFIG}`, '--health-address=127.0.0.1', `--health-port=${port}`],
        env,
        mounts: [{ source: kubeconfig, destination: KUBECONFIG }],
      };
      return { opts, port };
    }

    async function untilReady(c: Container, port: number, what: string, ready: (body: string) => boolean): Promise<string> {
      return eventually(
        what,
        async () => {
          if (c.exitCode() !== undefined) throw new Error(`exited with ${c.exitCode()}: ${c.output().slice(-2000)}`);
          const res = await fetch(`http://127.0.0.1:${port}/readyz`);
          const text = await res.text();
          return res.status === 200 && ready(text) ? text : undefined;
        },
        { timeoutMs: 60_000, intervalMs: 200 },
      );
    }

    it('the controller image, as deploy/ runs it (65532:65532, read-only root, no capabilities), becomes ready, leads, and stops cleanly on SIGTERM', async () => {
      const { opts, port } = await asDeployed('controller', 0o644, [], { name: 'pier-controller-image-test' });
      expect(opts).toMatchObject({ readOnlyRoot: true, capabilities: [], user: { uid: 65532, gid: 65532 } });
      const c = await startContainer(images, 'controller', opts);
      const stop = atExit(() => c.proc.kill('SIGKILL'));
      try {
        const body = await untilReady(c, port, 'the controller to report itself ready and leading', (text) => text.startsWith('leader'));
        expect(body).toMatch(/^leader/);
        // The process itself: its user, its capabilities, and the root it sees.
        const pid = await c.pid();
        const status = readFileSync(`/proc/${pid}/status`, 'utf8');
        expect(/^Uid:\s+(.*)$/m.exec(status)?.[1]?.split(/\s+/)).toEqual(['65532', '65532', '65532', '65532']);
        expect(/^Gid:\s+(.*)$/m.exec(status)?.[1]?.split(/\s+/)).toEqual(['65532', '65532', '65532', '65532']);
        expect(/^CapEff:\s+(\S+)$/m.exec(status)?.[1]).toBe('0000000000000000');
        expect(/^NoNewPrivs:\s+(\d)$/m.exec(status)?.[1]).toBe('1');
        const root = readFileSync(`/proc/${pid}/mountinfo`, 'utf8').split('\n').filter((l) => l.split(' ')[4] === '/').at(-1);
        expect(root?.split(' ')[5]?.split(',')).toContain('ro');
        // POD_NAME, from the downward API in deploy/, is the replica's identity.
        const lease = await cp.admin.makeApiClient(CoordinationV1Api).readNamespacedLease({ namespace: DEFAULT_NAMESPACE, name: LEADER_LEASE_NAME });
        expect(lease.spec?.holderIdentity).toBe('pier-controller-image-test');
        c.proc.kill('SIGTERM');
        const r = await c.proc;
        expect(r.exitCode, String(r.all)).toBe(0);
        // A write attempt on the read-only root would surface as EROFS.
        expect(String(r.all)).not.toMatch(/EROFS|EACCES|read-only file system/i);
      } finally {
        c.proc.kill('SIGKILL');
        stop();
        await c.remove();
      }
    });

    it('the agent image, as deploy/ runs it (root, read-only root, NET_ADMIN and NET_RAW) with its Node flags, syncs in dry-run mode', async () => {
      const core = cp.admin.makeApiClient(CoreV1Api);
      await registerNode(core, { metadata: { name: 'image-node' }, status: { addresses: [{ type: 'InternalIP', address: '198.51.100.31' }] } });
      const { opts, port } = await asDeployed('agent', 0o600, ['--dry-run'], { name: 'pier-agent-image-test', nodeName: 'image-node' });
      expect(opts).toMatchObject({ readOnlyRoot: true });
      expect(opts.capabilities?.sort()).toEqual(['NET_ADMIN', 'NET_RAW']);
      expect(opts.env?.['NODE_NAME']).toBe('image-node');
      const c = await startContainer(images, 'agent', opts);
      const stop = atExit(() => c.proc.kill('SIGKILL'));
      try {
        await untilReady(c, port, 'the agent to report its first sync', () => true);
        // The agent's process is node with the image's flags.
        const cmdline = readFileSync(`/proc/${await c.pid()}/cmdline`, 'utf8').split('\0').filter(Boolean);
        expect(cmdline.slice(0, configs.agent.Entrypoint!.length)).toEqual(configs.agent.Entrypoint);
        c.proc.kill('SIGTERM');
        const r = await c.proc;
        expect(r.exitCode, String(r.all)).toBe(0);
        // Each sync prints its restore input: pier's chains for the node, in both families.
        expect(String(r.stdout)).toMatch(/^\*nat$/m);
        expect(String(r.all)).not.toMatch(/"level":"(error|fatal)"/);
        expect(String(r.all)).not.toMatch(/EROFS|read-only file system/i);
      } finally {
        c.proc.kill('SIGKILL');
        stop();
        await c.remove();
      }
    });
  });
});
