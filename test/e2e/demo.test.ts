// `npm run demo` the way a person runs it: as a process, reading only what it
// prints, then checking that it left nothing behind (the lab's namespaces and
// host link, the control plane's processes and files, the demo's own files).
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { describe, expect, it } from 'vitest';
import { ensureBinaries } from '../cluster/controlplane.ts';
import { listLabNamespaces } from '../lab/lab.ts';
import { eventually } from '../support/wait.ts';

const DEMO = fileURLToPath(new URL('../../demo/demo.ts', import.meta.url));
const NODES_V4 = ['198.51.100.11', '198.51.100.12'];
const NODES_V6 = ['2001:db8:0:1::11', '2001:db8:0:1::12'];
const PODS = ['n1-p1', 'n2-p1'];

interface Printed {
  runId: string;
  cpDir: string;
  header: string[];
  row: string[];
  answeredBy: string[];
  kubeconfig: string | undefined;
}

/** What a reader takes from the demo's output: the table, who answered, and where things were. */
function read(stdout: string): Printed {
  const lines = stdout.split('\n');
  const headerAt = lines.findIndex((l) => l.startsWith('NAME '));
  expect(headerAt, stdout).toBeGreaterThanOrEqual(0);
  return {
    runId: /network namespaces pierlab-(\w+)-\*/.exec(stdout)?.[1] ?? '',
    cpDir: /\(files in (\/\S+)\)/.exec(stdout)?.[1] ?? '',
    header: lines[headerAt]!.trim().split(/\s+/),
    row: (lines[headerAt + 1] ?? '').trim().split(/\s+/),
    answeredBy: lines.flatMap((l) => /answered by (\S+),/.exec(l)?.[1] ?? []),
    kubeconfig: /--kubeconfig (\S+)/.exec(stdout)?.[1],
  };
}

function expectServed(p: Printed, stdout: string) {
  expect(p.header).toEqual(['NAME', 'TYPE', 'CLUSTER-IP', 'EXTERNAL-IP', 'PORT(S)', 'AGE']);
  const [name, type, clusterIP, externalIP, ports] = p.row;
  expect({ name, type }).toEqual({ name: 'web', type: 'LoadBalancer' });
  expect(clusterIP).toMatch(/^198\.18\.\d+\.\d+$/);
  expect(externalIP!.split(',').sort()).toEqual([...NODES_V4, ...NODES_V6].sort());
  expect(ports).toMatch(/^80:\d+\/TCP,80:\d+\/UDP$/);
  expect(p.answeredBy.length, stdout).toBeGreaterThanOrEqual(6);
  expect([...new Set(p.answeredBy)].sort(), stdout).toEqual(PODS);
  expect(stdout).not.toContain('NOT ANSWERED');
}

function expectNothingLeft(p: Printed) {
  expect(p.runId).not.toBe('');
  expect(p.cpDir).toMatch(/^\/tmp\/pier-cp-/);
  expect(listLabNamespaces().filter((ns) => ns.startsWith(`pierlab-${p.runId}-`))).toEqual([]);
  expect(existsSync(`/sys/class/net/pl${p.runId}`)).toBe(false);
  expect(existsSync(p.cpDir)).toBe(false);
  // etcd, kube-apiserver and pier's processes all name the control plane's folder on their command line.
  expect(processesMentioning(p.cpDir)).toEqual([]);
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
  it('with --exit: prints the Service with both node addresses, answers from both pods, exits 0 and leaves nothing', async () => {
    const run = await execa(process.execPath, [DEMO, '--exit'], { reject: false, timeout: 900_000 });
    expect(run.exitCode, `${run.stdout}\n${run.stderr}`).toBe(0);
    const printed = read(run.stdout);
    expectServed(printed, run.stdout);
    expect(run.stdout).toMatch(/\[demo\] removed everything\n?$/);
    expectNothingLeft(printed);
  }, 900_000);

  it('waits for Ctrl-C, prints what kubectl prints, and on SIGINT removes everything and exits 0', async () => {
    const demo = execa(process.execPath, [DEMO], { reject: false, timeout: 900_000 });
    let stdout = '';
    demo.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    await eventually('the demo waiting for Ctrl-C', () => stdout.includes('Ctrl-C removes everything'), { timeoutMs: 900_000, intervalMs: 200 });
    const printed = read(stdout);
    expectServed(printed, stdout);

    // The table's columns are the real kubectl's, cell for cell (AGE aside: time passed).
    expect(printed.kubeconfig).toBeDefined();
    const kubectl = await execa(`${await ensureBinaries()}/kubectl`, ['--kubeconfig', printed.kubeconfig!, 'get', 'svc', '-n', 'demo', '-o', 'wide']);
    const [realHeader, realRow] = kubectl.stdout.split('\n').map((l) => l.trim().split(/\s+/));
    expect(realHeader!.slice(0, 6)).toEqual(printed.header);
    expect(realRow!.slice(0, 5)).toEqual(printed.row.slice(0, 5));

    // What the cleanup checks look for is there while the demo runs: etcd, kube-apiserver, the controller, two agents.
    expect(processesMentioning(printed.cpDir).length).toBeGreaterThanOrEqual(5);
    expect(listLabNamespaces().filter((ns) => ns.startsWith(`pierlab-${printed.runId}-`)).length).toBeGreaterThan(0);

    demo.kill('SIGINT');
    const result = await demo;
    expect(result.exitCode, `${stdout}\n${result.stderr}`).toBe(0);
    expect(stdout).toContain('[demo] SIGINT: removing everything');
    expect(stdout).toMatch(/\[demo\] removed everything\n?$/);
    expectNothingLeft(printed);
  }, 900_000);
});
