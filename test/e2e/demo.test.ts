// The demo the way a person runs it: as a process (demo/demo.ts, and
// ./scripts/demo.sh read from README.md's set-up block and run as written,
// signalled by its own pid), reading only what it prints (what
// kubectl printed, who answered, where things were), then checking that it
// left nothing behind: the lab's namespaces and host link, the control plane's
// and the nodes' folders and processes.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { execa } from 'execa';
import { describe, expect, it } from 'vitest';
import { envSite } from '../cluster/cluster.ts';
import { listLabNamespaces, nodeAddr, SITES } from '../lab/lab.ts';
import { runReadme, spawnReadme } from '../support/readme.ts';
import { eventually } from '../support/wait.ts';

const DEMO = fileURLToPath(new URL('../../demo/demo.ts', import.meta.url));
// The demo's cluster is startCluster()'s: on the site PIER_LAB_SITE names.
const NODES = [1, 2].map((i) => nodeAddr(SITES[envSite()]!, i));
const NODES_V4 = NODES.map((n) => n.v4);
const NODES_V6 = NODES.map((n) => n.v6);
// A cold build takes half an hour; the tests expect the caches warm (scripts/test.sh builds first).
const TIMEOUT = 900_000;

interface Printed {
  runId: string;
  cpDir: string;
  nodeDirs: string[];
  kubeconfig: string;
  /** What the demo printed under `$ kubectl get ...`, each line split into its cells. */
  pods: string[][];
  webPods: string[][];
  services: string[][];
  answeredBy: string[];
}

/** What a reader takes from the demo's output: kubectl's tables, who answered, and where things were. */
function read(stdout: string): Printed {
  const after = (command: string) => {
    const lines = stdout.split('\n');
    const at = lines.indexOf(`$ kubectl ${command}`);
    expect(at, `\`kubectl ${command}\` in:\n${stdout}`).toBeGreaterThanOrEqual(0);
    const end = lines.findIndex((l, i) => i > at && l.trim() === '');
    return lines.slice(at + 1, end).map((l) => l.trim().split(/\s+/));
  };
  return {
    runId: /network namespaces pierlab-(\w+)-\*/.exec(stdout)?.[1] ?? '',
    cpDir: /\(files in (\/\S+)\)/.exec(stdout)?.[1] ?? '',
    nodeDirs: /nodes' files [^:]*: (.*)$/m.exec(stdout)?.[1]?.split(' ') ?? [],
    kubeconfig: /--kubeconfig (\S+)/.exec(stdout)?.[1] ?? '',
    pods: after('get pods -A -o wide'),
    webPods: after('get pods -l app=web -o wide'),
    services: after('get svc -o wide'),
    answeredBy: stdout.split('\n').flatMap((l) => /answered by (\S+),/.exec(l)?.[1] ?? []),
  };
}

function expectServed(p: Printed, stdout: string) {
  // pier's own pods, as `kubectl apply -k` made them: two controllers, an agent on each node, all running.
  // NODE is counted from the right: RESTARTS may read "1 (5s ago)".
  const pier = p.pods.filter(([ns]) => ns === 'pier-system').map((r) => ({ name: r[1]!, status: r[3], node: r.at(-3) }));
  expect(pier.filter((q) => q.name.startsWith('pier-agent-')).map((q) => `${q.status} ${q.node}`).sort()).toEqual(['Running n1', 'Running n2']);
  expect(pier.filter((q) => q.name.startsWith('pier-controller-')).map((q) => q.status)).toEqual(['Running', 'Running']);

  const [header, ...rows] = p.services;
  expect(header).toEqual(['NAME', 'TYPE', 'CLUSTER-IP', 'EXTERNAL-IP', 'PORT(S)', 'AGE', 'SELECTOR']);
  const svc = (name: string) => rows.find((r) => r[0] === name) ?? [];
  const [, webType, webClusterIP, webExternal, webPorts] = svc('web');
  expect(webType).toBe('LoadBalancer');
  expect(webClusterIP).toMatch(/^198\.18\.\d+\.\d+$/);
  expect(webExternal!.split(',').sort()).toEqual([...NODES_V4, ...NODES_V6].sort());
  expect(webPorts).toMatch(/^80:\d+\/TCP$/);
  const [, udpType, , udpExternal, udpPorts] = svc('web-udp');
  expect(udpType).toBe('LoadBalancer');
  expect(udpExternal!.split(',').sort()).toEqual(NODES_V4);
  expect(udpPorts).toMatch(/^80:\d+\/UDP$/);

  // Two requests to each of six addresses, every one answered by one of web's two pods, and both pods answering.
  const webPods = p.webPods.slice(1).map(([name]) => name!);
  expect(webPods, stdout).toHaveLength(2);
  expect(p.answeredBy.length, stdout).toBe(12);
  expect([...new Set(p.answeredBy)].sort(), stdout).toEqual(webPods.sort());
  expect(stdout).not.toContain('NOT ANSWERED');
}

function expectNothingLeft(p: Printed) {
  expect(p.runId).not.toBe('');
  expect(p.cpDir).toMatch(/^\/tmp\/pier-cp-/);
  expect(p.nodeDirs).toHaveLength(2);
  for (const dir of p.nodeDirs) expect(dir).toMatch(/^\/tmp\/pier-node-/);
  expect(listLabNamespaces().filter((ns) => ns.startsWith(`pierlab-${p.runId}-`))).toEqual([]);
  expect(existsSync(`/sys/class/net/pl${p.runId}`)).toBe(false);
  for (const dir of [p.cpDir, ...p.nodeDirs]) {
    expect(existsSync(dir), dir).toBe(false);
    // etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and each node's containerd, shims, kubelet and kube-proxy name their folder on their command line.
    expect(processesMentioning(dir)).toEqual([]);
  }
}

function processesMentioning(text: string): string[] {
  const found: string[] = [];
  for (const pid of readdirSync('/proc').filter((e) => /^\d+$/.test(e))) {
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
      if (cmd.includes(text)) found.push(`${pid}: ${cmd}`);
    } catch {
      // exited while we looked
    }
  }
  return found;
}

describe('npm run demo', () => {
  it('with --exit: pier installed and running, both Services listing the node addresses, answers from both pods, exits 0 and leaves nothing', async () => {
    const run = await execa(process.execPath, [DEMO, '--exit'], { reject: false, timeout: TIMEOUT });
    expect(run.exitCode, `${run.stdout}\n${run.stderr}`).toBe(0);
    const printed = read(run.stdout);
    expectServed(printed, run.stdout);
    expect(run.stdout).toMatch(/\[demo\] removed everything\n?$/);
    expectNothingLeft(printed);
  }, TIMEOUT);

  // A user who started ./scripts/demo.sh signals that pid (kill -INT, or Ctrl-C
  // in a terminal, which reaches the whole process group): it must stop the demo.
  it('./scripts/demo.sh waits for Ctrl-C, prints what kubectl prints, and on SIGINT to its pid removes everything and exits 0', async () => {
    // The README's `./scripts/demo.sh`, as written (bash execs it: the pid is the script's).
    // detached: a process group of its own, for the fallback below.
    const { child: demo } = await spawnReadme('setup-demo', { reject: false, timeout: TIMEOUT, detached: true });
    let stdout = '';
    demo.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    await eventually('the demo waiting for Ctrl-C', () => stdout.includes('Ctrl-C removes everything'), { timeoutMs: TIMEOUT, intervalMs: 200 });
    const printed = read(stdout);
    expectServed(printed, stdout);

    // The Services as the real kubectl prints them now, run as the README's transcript writes it, cell for cell (AGE aside: time passed).
    const [kubectl] = await runReadme('demo-get-svc', { kubeconfig: printed.kubeconfig });
    const real = kubectl!.stdout.trimEnd().split('\n').map((l) => l.trim().split(/\s+/));
    const withoutAge = (rows: string[][]) => rows.map((r) => r.toSpliced(5, 1));
    expect(withoutAge(real)).toEqual(withoutAge(printed.services));

    // What the cleanup checks look for is there while the demo runs.
    expect(processesMentioning(printed.cpDir).length).toBeGreaterThanOrEqual(4);
    for (const dir of printed.nodeDirs) expect(processesMentioning(dir).length, dir).toBeGreaterThanOrEqual(3);
    expect(listLabNamespaces().filter((ns) => ns.startsWith(`pierlab-${printed.runId}-`)).length).toBeGreaterThan(0);

    // The set-up done, the script's pid is the demo's own (exec), not a shell or npm that would not pass SIGINT on.
    const cmdline = readFileSync(`/proc/${demo.pid}/cmdline`, 'utf8').split('\0');
    process.kill(demo.pid!, 'SIGINT');
    // Should that not stop it, SIGINT to the whole group (Ctrl-C's way) does, rather than leaving the cluster running.
    const deadline = new AbortController();
    const stopped = await Promise.race([demo.then(() => true), sleep(120_000, false, { signal: deadline.signal })]);
    deadline.abort();
    if (!stopped) process.kill(-demo.pid!, 'SIGINT');
    const result = await demo;
    expect(stopped, `SIGINT to the pid of scripts/demo.sh (${cmdline.join(' ')}) did not stop the demo`).toBe(true);
    expect(cmdline).toContain('demo/demo.ts');
    expect(result.exitCode, `${stdout}\n${result.stderr}`).toBe(0);
    expect(stdout).toContain('[demo] SIGINT: removing everything');
    expect(stdout).toMatch(/\[demo\] removed everything\n?$/);
    expectNothingLeft(printed);
  }, TIMEOUT);
});
