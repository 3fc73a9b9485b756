// Drift inside pier's own chains, healed by the agent: a real API server, one
// lab node running `pier agent` with a short resync period, and real
// connections from a client. Each case changes the node's rules behind the
// agent's back (a flush of one chain of every kind pier makes, in nat and
// filter; a deleted rule; a foreign rule inserted; a jump deleted; a stray
// pier chain), then waits for a verifying resync to put the kernel back to
// exactly what it held, and checks the Services answer again and the agent
// said what it found.
import { CoreV1Api, DiscoveryV1Api, PatchStrategy, setHeaderOptions, type V1Service } from '@kubernetes/client-node';
import type { ResultPromise } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseSave } from '../../agent/iptables/restore.ts';
import { ensureNamespace, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { ECHO_PORT, HOST_V4, Lab, type Endpoint, type LabNode } from '../lab/lab.ts';
import { CLI, registerLabNodes, stopProcesses } from '../lab/pier.ts';
import { endpointSlice, lbService } from '../support/objects.ts';
import { eventually } from '../support/wait.ts';

const NS = 'shop';
const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);
const BUILTIN = new Set(['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING']);
/** Every kind of chain pier renders, by table: fixed names, and prefixes of hashed ones. */
const KINDS = {
  nat: ['PIER-SERVICES', 'PIER-POSTROUTING', 'PIER-CANARY', 'PIER-SVCS-', 'PIER-SVC-'],
  filter: ['PIER-FORWARD', 'PIER-ACCEPT', 'PIER-NOENDPOINTS', 'PIER-SOURCES', 'PIER-CANARY', 'PIER-FWD-', 'PIER-NOEP-', 'PIER-SRCS-', 'PIER-SRC-', 'PIER-LSRC-'],
} as const;
const kindOf = (chain: string) => (/^PIER-[A-Z]+-[0-9A-Z]{4,}$/.test(chain) ? chain.replace(/[0-9A-Z]+$/, '') : chain);

describe('pier agent heals drift inside its chains', () => {
  let lab: Lab;
  let cp: ControlPlane;
  let node: LabNode;
  let client: Endpoint;
  let agent: ResultPromise;
  let log = '';
  /** The node's rules with pier's in place, as the agent left them after its first syncs. */
  let baseline: Record<string, Record<string, string[]>>;

  /** pier's chains and every built-in chain of nat and filter, both families, rule order kept and chains sorted. */
  const kernel = async () => {
    const out: Record<string, Record<string, string[]>> = {};
    for (const tool of ['iptables-save', 'ip6tables-save']) {
      for (const [table, chains] of parseSave((await lab.exec(node.ns, tool, [])).stdout)) {
        if (table !== 'nat' && table !== 'filter') continue;
        const kept = [...chains].filter(([c]) => c.startsWith('PIER-') || BUILTIN.has(c)).sort(([a], [b]) => (a < b ? -1 : 1));
        out[`${tool} ${table}`] = Object.fromEntries(kept);
      }
    }
    return out;
  };
  const healed = () =>
    eventually('the kernel back to what the agent wrote', async () => JSON.stringify(await kernel()) === JSON.stringify(baseline), { timeoutMs: 10_000, intervalMs: 100 });

  /** Connections every case must get answered once healed: the services through every chain kind. */
  const serve = async (family: 'v4' | 'v6' = 'v4') => {
    for (const port of [80, 7000, 7031]) {
      const results = await lab.probe(client, node[family], port, { count: 3, timeoutMs: 1000 });
      expect(results.every((r) => r.ok), `${family} port ${port}: ${JSON.stringify(results)}`).toBe(true);
    }
    // A port without endpoints is refused, not dropped.
    const [empty] = await lab.probe(client, node[family], 7100, { timeoutMs: 1500 });
    expect(empty).toMatchObject({ ok: false, error: 'ECONNREFUSED' });
  };

  async function createService(name: string, ports: number[], pods: LabNode['pods'], extra: Partial<NonNullable<V1Service['spec']>>) {
    const core = cp.admin.makeApiClient(CoreV1Api);
    const discovery = cp.admin.makeApiClient(DiscoveryV1Api);
    const named = ports.map((port) => ({ name: `p${port}`, port, targetPort: ECHO_PORT }));
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, name, named, { ipFamilyPolicy: 'PreferDualStack', ipFamilies: ['IPv4', 'IPv6'], ...extra }) });
    for (const [family, type] of [['v4', 'IPv4'], ['v6', 'IPv6']] as const) {
      await discovery.createNamespacedEndpointSlice({
        namespace: NS,
        body: endpointSlice(NS, name, type, pods.map((p) => ({ address: p[family], nodeName: p.node })), named.map((p) => ({ name: p.name, port: ECHO_PORT }))),
      });
    }
    const ingress = [node.v4, node.v6].map((ip) => ({ ip, ipMode: 'Proxy', ports: ports.map((port) => ({ port, protocol: 'TCP' })) }));
    await core.patchNamespacedServiceStatus({ name, namespace: NS, body: { status: { loadBalancer: { ingress } } } }, mergePatch);
  }

  beforeAll(async () => {
    lab = await Lab.create({ nodes: [5], clients: 1, hostLink: true });
    node = lab.nodes[0]!;
    client = lab.clients[0]!;
    cp = await startControlPlane({ address: HOST_V4 });
    const core = cp.admin.makeApiClient(CoreV1Api);
    await ensureNamespace(core, NS);
    await ensureNamespace(core, 'pier-system');
    await registerLabNodes(core, lab);
    // A strict host: what crosses FORWARD needs pier's accept.
    for (const tool of ['iptables', 'ip6tables']) await lab.exec(node.ns, tool, ['-P', 'FORWARD', 'DROP']);
    await lab.exec(node.ns, 'iptables', ['-A', 'INPUT', '-s', '203.0.113.7/32', '-j', 'DROP']);
    const ranges = (n: number) => [`${client.v4}/32`, `${client.v6}/128`, ...Array.from({ length: n }, (_, i) => `203.0.113.${16 * i}/28`)];
    // 40 ports with two ranges: dispatch trees in nat (PIER-SVCS-), forward (PIER-FWD-) and sources (PIER-SRCS-).
    await createService('wide', Array.from({ length: 40 }, (_, i) => 7000 + i), node.pods, { loadBalancerSourceRanges: ranges(1) });
    // Five local endpoints and nine ranges: a port's own chains (PIER-SVC-, PIER-SRC-, PIER-LSRC-).
    await createService('many', [80], node.pods, { externalTrafficPolicy: 'Local', loadBalancerSourceRanges: ranges(8) });
    // 40 ports without endpoints: the no-endpoints tree (PIER-NOEP-).
    await createService('empty', Array.from({ length: 40 }, (_, i) => 7100 + i), [], {});
    agent = lab.spawn(node.ns, process.execPath, [
      CLI, 'agent', '--node-name', node.name, '--kubeconfig', cp.adminKubeconfigPath,
      '--min-sync-interval', '100ms', '--resync-period', '1s', '--log-level', 'info',
    ]);
    agent.stderr?.on('data', (d: Buffer) => (log += d.toString()));
    await eventually('every Service answered', async () => {
      const [r] = await lab.probe(client, node.v4, 7031, { timeoutMs: 500 });
      const [s] = await lab.probe(client, node.v6, 80, { timeoutMs: 500 });
      return r?.ok && s?.ok;
    }, { timeoutMs: 30_000 });
    // Two resyncs in a row that find the same rules: the state the agent keeps.
    await eventually('the rules settled', async () => {
      const a = JSON.stringify(await kernel());
      await new Promise((r) => setTimeout(r, 1500));
      return a === JSON.stringify(await kernel());
    }, { timeoutMs: 20_000 });
    baseline = await kernel();
    expect(log).not.toContain('changed from outside');
  });

  afterAll(async () => {
    if (agent) await stopProcesses([agent]);
    if (log && /"level":"(error|fatal)"/.test(log)) console.log(log.split('\n').filter((l) => /"level":"(error|fatal)"/.test(l)).slice(-10).join('\n'));
    await lab?.destroy();
    await cp?.stop();
  });

  /** The warnings the agent logged since `from`, parsed. */
  const driftLogs = (from: number) =>
    log.slice(from).split('\n').filter((l) => l.includes('changed from outside')).map((l) => JSON.parse(l) as { level: string; family: string; chains: string[]; jumps?: string[] });

  it('renders every kind of chain in this set-up, and serves through them', async () => {
    for (const [table, kinds] of Object.entries(KINDS)) {
      const have = new Set(Object.keys(baseline[`iptables-save ${table}`]!).filter((c) => c.startsWith('PIER-')).map(kindOf));
      expect([...have].sort(), table).toEqual([...kinds].sort());
    }
    await serve('v4');
    await serve('v6');
  });

  for (const [table, kinds] of Object.entries(KINDS)) {
    for (const kind of kinds) {
      it(`heals a flush of ${table} ${kind}${kind.endsWith('-') ? '*' : ''}`, async () => {
        const chain = Object.keys(baseline[`iptables-save ${table}`]!).find((c) => kindOf(c) === kind)!;
        const from = log.length;
        // Flush and read back in one go: the agent may heal at any moment after.
        const flushed = await lab.exec(node.ns, 'sh', ['-c', `iptables -t ${table} -F ${chain} && iptables -t ${table} -S ${chain}`]);
        expect(flushed.stdout.trim()).toBe(`-N ${chain}`);
        await healed();
        await serve();
        const found = await eventually('the drift logged', () => driftLogs(from)[0]);
        expect(found).toMatchObject({ level: 'warn', family: 'ipv4' });
        expect(found.chains).toContainEqual(expect.stringMatching(new RegExp(`^${table} ${chain}: changed, [1-9]\\d* rules lost, 0 added$`)));
      });
    }
  }

  it('heals a single deleted rule, and a foreign rule inserted in a pier chain', async () => {
    const svc = Object.keys(baseline['iptables-save nat']!).find((c) => c.startsWith('PIER-SVC-'))!;
    let from = log.length;
    await lab.exec(node.ns, 'iptables', ['-t', 'nat', '-D', svc, '3']);
    await healed();
    expect((await eventually('logged', () => driftLogs(from)[0])).chains).toEqual([`nat ${svc}: changed, 1 rules lost, 0 added`]);

    from = log.length;
    // Port 80 returned from pier's dispatch before it is DNATed: the Service stops answering.
    await lab.exec(node.ns, 'iptables', ['-t', 'nat', '-I', 'PIER-SERVICES', '1', '-p', 'tcp', '--dport', '80', '-j', 'RETURN']);
    await healed();
    await serve();
    expect((await eventually('logged', () => driftLogs(from)[0])).chains).toEqual(['nat PIER-SERVICES: changed, 0 rules lost, 1 added']);
  });

  it('puts back a deleted jump, removes a duplicated one, and deletes a stray pier chain with the jump to it', async () => {
    let from = log.length;
    await lab.exec(node.ns, 'iptables', ['-t', 'nat', '-D', 'PREROUTING', '1']);
    await healed();
    await serve();
    expect((await eventually('logged', () => driftLogs(from)[0])).jumps).toEqual(['nat: 1 missing, 0 unwanted']);

    from = log.length;
    const [dup] = (await lab.exec(node.ns, 'iptables', ['-t', 'filter', '-S', 'FORWARD'])).stdout.split('\n').filter((l) => l.includes('PIER-FORWARD'));
    // One transaction: a resync between separate commands would see only part of the drift.
    const drift = ['*filter', ':PIER-STRAY - [0:0]', dup!, '-A PIER-STRAY -j DROP', '-I INPUT 1 -j PIER-STRAY', 'COMMIT', ''].join('\n');
    await lab.exec(node.ns, 'iptables-restore', ['--noflush'], { input: drift });
    await healed();
    await serve();
    const found = await eventually('logged', () => driftLogs(from)[0]);
    expect(found.chains).toEqual(['filter PIER-STRAY: unwanted, 0 rules lost, 1 added']);
    expect(found.jumps).toEqual(['filter: 0 missing, 2 unwanted']);
  });

  it('heals IPv6 as well', async () => {
    const from = log.length;
    await lab.exec(node.ns, 'ip6tables', ['-t', 'nat', '-F', 'PIER-SERVICES']);
    await healed();
    await serve('v6');
    expect(await eventually('logged', () => driftLogs(from)[0])).toMatchObject({ family: 'ipv6', chains: [expect.stringMatching(/^nat PIER-SERVICES: changed/)] });
  });

  it('counts what it healed in a metric', async () => {
    const metrics = await (await fetch(`http://${node.v4}:10265/metrics`)).text();
    const count = (labels: string) => Number(new RegExp(`pier_agent_drift_total\\{${labels}\\} (\\d+)`).exec(metrics)?.[1] ?? 0);
    // One flushed chain per kind, the deleted rule, the foreign rule, the stray chain.
    expect(count('family="ipv4",table="nat",kind="chain"')).toBe(KINDS.nat.length + 2);
    expect(count('family="ipv4",table="filter",kind="chain"')).toBe(KINDS.filter.length + 1);
    expect(count('family="ipv4",table="nat",kind="jump"')).toBe(1);
    expect(count('family="ipv4",table="filter",kind="jump"')).toBe(2);
    expect(count('family="ipv6",table="nat",kind="chain"')).toBe(1);
  });
});
