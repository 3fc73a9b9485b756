// UDP flows across rule changes, with real packets: a client keeps sending
// from one source port (udp-flow.ts) while Services appear and endpoints go,
// and the agent must delete exactly the conntrack entries that pin the flow
// to an old outcome, so that a current endpoint answers within a second of
// the rules that should serve it; and a TCP source port left to an endpoint
// that then leaves the slices must not hold the next connection from it.
// The tests write Service status themselves, as agent.test.ts does.
import { mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { CoreV1Api, DiscoveryV1Api, EventsV1Api } from '@kubernetes/client-node';
import type { ResultPromise } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureNamespace, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { ECHO_PORT, HOST_V4, Lab, type LabNode, type LabPod } from '../lab/lab.ts';
import { createLabService, registerLabNodes, stopProcesses } from '../lab/pier.ts';
import { endpointSlice } from '../support/objects.ts';
import { eventually } from '../support/wait.ts';

const CLI = fileURLToPath(new URL('../../cmd/cli.ts', import.meta.url));
const UDP_FLOW = fileURLToPath(new URL('../lab/udp-flow.ts', import.meta.url));
const NS = 'flows';

interface Reply {
  at: number;
  pod: string;
  peer: string;
}

describe('flows across rule changes (conntrack clean-up)', () => {
  let lab: Lab;
  let cp: ControlPlane;
  let core: CoreV1Api;
  let discovery: DiscoveryV1Api;
  const agents = new Map<string, ResultPromise>();
  const flows: ResultPromise[] = [];
  let pathWithoutConntrack: string;

  const startAgent = (n: LabNode, env?: Record<string, string>) => {
    const proc = lab.spawn(
      n.ns,
      process.execPath,
      [CLI, 'agent', '--node-name', n.name, '--kubeconfig', cp.adminKubeconfigPath, '--min-sync-interval', '100ms', '--resync-period', '30s', '--log-level', 'warn'],
      { env },
    );
    agents.set(n.name, proc);
    return proc;
  };
  const ready = (n: LabNode) =>
    eventually(`agent on ${n.name} ready`, async () => (await fetch(`http://${n.v4}:10265/readyz`).catch(() => undefined))?.ok, { timeoutMs: 30_000 });
  const metric = async (n: LabNode, name: string) => {
    const text = await (await fetch(`http://${n.v4}:10265/metrics`)).text();
    return text
      .split('\n')
      .filter((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `))
      .reduce((sum, l) => sum + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
  };

  /** A steady flow from client c0, one fixed source port; its replies as they arrive. */
  function startFlow(host: string, port: number, sport: number): Reply[] {
    const proc = lab.spawn(lab.clients[0]!.ns, process.execPath, [UDP_FLOW, '--host', host, '--port', String(port), '--sport', String(sport), '--interval', '50']);
    flows.push(proc);
    const replies: Reply[] = [];
    createInterface({ input: proc.stdout! }).on('line', (l) => {
      const r = JSON.parse(l) as Reply & { started?: boolean };
      if (!r.started) replies.push(r);
    });
    return replies;
  }

  /** Polls a node's nat table until `test` holds; when it did (an upper bound on when the rules were in place). */
  async function rulesUntil(n: LabNode, family: 'v4' | 'v6', what: string, test: (save: string) => boolean): Promise<number> {
    await eventually(what, async () => test((await lab.exec(n.ns, family === 'v4' ? 'iptables-save' : 'ip6tables-save', ['-t', 'nat'])).stdout), {
      timeoutMs: 20_000,
      intervalMs: 20,
    });
    return Date.now();
  }

  const conntrack = async (n: LabNode, family: 'ipv4' | 'ipv6', port: number) =>
    (await lab.exec(n.ns, 'conntrack', ['-L', '-f', family, '-p', 'udp', '--orig-port-dst', String(port)], { reject: false })).stdout;

  const createUdpService = (name: string, port: number, pods: LabPod[], nodes: LabNode[]) =>
    createLabService({ core, discovery }, NS, name, [{ name: 'dns', port, protocol: 'UDP' }], pods, { nodes });

  async function writeSlices(name: string, pods: Omit<LabPod, 'name' | 'ns'>[], port: { name: string; protocol: 'TCP' | 'UDP' } = { name: 'dns', protocol: 'UDP' }): Promise<void> {
    for (const [family, type] of [['v4', 'IPv4'], ['v6', 'IPv6']] as const) {
      const body = endpointSlice(NS, name, type, pods.map((p) => ({ address: p[family], nodeName: p.node })), [{ ...port, port: ECHO_PORT }]);
      try {
        await discovery.replaceNamespacedEndpointSlice({ name: body.metadata!.name!, namespace: NS, body });
      } catch {
        await discovery.createNamespacedEndpointSlice({ namespace: NS, body });
      }
    }
  }

  beforeAll(async () => {
    lab = await Lab.create({ nodes: [2, 2], clients: 1, hostLink: true });
    cp = await startControlPlane({ address: HOST_V4 });
    core = cp.admin.makeApiClient(CoreV1Api);
    discovery = cp.admin.makeApiClient(DiscoveryV1Api);
    await ensureNamespace(core, NS);
    await ensureNamespace(core, 'pier-system');
    await registerLabNodes(core, lab);
    // n2 is a host without the conntrack tool: every command but that one.
    pathWithoutConntrack = mkdtempSync(join(tmpdir(), 'pier-path-'));
    for (const dir of ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin']) {
      for (const f of readdirSync(dir)) {
        if (f === 'conntrack') continue;
        try {
          symlinkSync(join(dir, f), join(pathWithoutConntrack, f));
        } catch {
          // Already linked from an earlier directory of PATH.
        }
      }
    }
    const [n1, n2] = lab.nodes as [LabNode, LabNode];
    startAgent(n1);
    startAgent(n2, { PATH: pathWithoutConntrack });
    await Promise.all([ready(n1), ready(n2)]);
  });

  afterAll(async () => {
    await stopProcesses([...flows, ...agents.values()]);
    await cp?.stop();
    await lab?.destroy();
    if (pathWithoutConntrack) rmSync(pathWithoutConntrack, { recursive: true, force: true });
  });

  it('a flow that began before its Service is answered by an endpoint within 1 s of the rules, IPv4 and IPv6', async () => {
    const n1 = lab.nodes[0]!;
    const pods = [lab.nodes[0]!.pods[1]!, lab.nodes[1]!.pods[1]!];
    const v4 = startFlow(n1.v4, 5300, 40530);
    const v6 = startFlow(n1.v6, 5300, 40531);
    // Nothing serves the port yet: the node refuses, and holds the flow un-NATed.
    await new Promise((r) => setTimeout(r, 1000));
    expect(v4.length + v6.length).toBe(0);
    expect(await conntrack(n1, 'ipv4', 5300)).toMatch(new RegExp(`sport=40530 dport=5300 .*src=${n1.v4} `));
    expect(await conntrack(n1, 'ipv6', 5300)).toMatch(/sport=40531 dport=5300 /);

    await createUdpService('dns', 5300, pods, [n1]);
    const [t4, t6] = await Promise.all([
      rulesUntil(n1, 'v4', 'IPv4 DNAT for 5300', (s) => s.includes('--dport 5300') && s.includes(`--to-destination ${pods[0]!.v4}:${ECHO_PORT}`)),
      rulesUntil(n1, 'v6', 'IPv6 DNAT for 5300', (s) => s.includes('--dport 5300') && s.includes(`--to-destination [${pods[0]!.v6}]:${ECHO_PORT}`)),
    ]);
    await eventually('both flows answered', () => v4.length > 0 && v6.length > 0, { timeoutMs: 10_000 });
    const names = pods.map((p) => p.name);
    expect(names).toContain(v4[0]!.pod);
    expect(names).toContain(v6[0]!.pod);
    process.stderr.write(`[conntrack] first reply after the rules: IPv4 ${v4[0]!.at - t4} ms, IPv6 ${v6[0]!.at - t6} ms\n`);
    expect(v4[0]!.at - t4, 'IPv4: ms from the rules to the first reply').toBeLessThan(1000);
    expect(v6[0]!.at - t6, 'IPv6: ms from the rules to the first reply').toBeLessThan(1000);
    expect(await metric(n1, 'pier_agent_conntrack_deleted_total')).toBeGreaterThanOrEqual(2);
  });

  it('a flow pinned to an endpoint that is removed moves to a current one within 1 s', async () => {
    const n1 = lab.nodes[0]!;
    const pods = [lab.nodes[0]!.pods[0]!, lab.nodes[1]!.pods[0]!];
    await createUdpService('pinned', 5301, pods, [n1]);
    const replies = startFlow(n1.v4, 5301, 40540);
    await eventually('the flow answered', () => replies.length >= 3, { timeoutMs: 10_000 });
    const first = replies[0]!.pod;
    expect(replies.every((r) => r.pod === first), 'a flow stays with one endpoint').toBe(true);
    const removed = pods.find((p) => p.name === first)!;
    const kept = pods.find((p) => p.name !== first)!;

    // The removed pod keeps running and answering: only the slice changes.
    await writeSlices('pinned', [kept]);
    const t = await rulesUntil(n1, 'v4', `no DNAT to ${removed.name}`, (s) => s.includes('--dport 5301') && !s.includes(`--to-destination ${removed.v4}:`));
    await eventually(`the flow answered by ${kept.name}`, () => replies.some((r) => r.at > t && r.pod === kept.name), { timeoutMs: 10_000 });
    const moved = replies.find((r) => r.at > t && r.pod === kept.name)!;
    process.stderr.write(`[conntrack] first reply from the remaining endpoint after the rules: ${moved.at - t} ms\n`);
    expect(moved.at - t, 'ms from the rules to the first reply from the remaining endpoint').toBeLessThan(1000);
    // Replies already in flight when the rules changed may still land; none after.
    expect(replies.filter((r) => r.pod === removed.name && r.at > t + 200)).toEqual([]);
  });

  it('an agent restart whose rules did not change deletes no flow', async () => {
    const n1 = lab.nodes[0]!;
    const ids = async () => {
      const lines = [];
      for (const f of ['ipv4', 'ipv6']) lines.push(...(await lab.exec(n1.ns, 'conntrack', ['-L', '-f', f, '-p', 'udp', '-o', 'id'])).stdout.split('\n'));
      return lines.filter((l) => /dport=530[01] /.test(l) && !l.includes('UNREPLIED')).map((l) => /id=(\d+)/.exec(l)?.[1]).sort();
    };
    const before = await ids();
    expect(before.length).toBeGreaterThanOrEqual(3); // the three flows of the tests above
    const agent = agents.get(n1.name)!;
    agent.kill('SIGTERM');
    await agent;
    startAgent(n1);
    await ready(n1);
    expect(await metric(n1, 'pier_agent_conntrack_deleted_total')).toBe(0);
    expect(await metric(n1, 'pier_agent_conntrack_errors_total')).toBe(0);
    expect(await ids()).toEqual(before);
  });

  it('without the conntrack tool the rules still apply, the failure is reported, and the clean-up is retried', async () => {
    const n2 = lab.nodes[1]!;
    const pods = [lab.nodes[0]!.pods[1]!];
    const replies = startFlow(n2.v4, 5302, 40550);
    await new Promise((r) => setTimeout(r, 500));
    await createUdpService('late', 5302, pods, [n2]);
    await rulesUntil(n2, 'v4', 'DNAT for 5302 on n2', (s) => s.includes('--dport 5302'));
    // New flows are served: the rules did not wait for the clean-up.
    const [fresh] = await lab.probe(lab.clients[0]!, n2.v4, 5302, { proto: 'udp', timeoutMs: 1000 });
    expect(fresh?.reply?.pod).toBe(pods[0]!.name);
    await eventually('conntrack errors counted', async () => (await metric(n2, 'pier_agent_conntrack_errors_total')) > 0, { timeoutMs: 10_000 });
    const events = cp.admin.makeApiClient(EventsV1Api);
    const ev = await eventually('ConntrackFailed Event on the Node', async () =>
      (await events.listNamespacedEvent({ namespace: 'default' })).items.find((e) => e.reason === 'ConntrackFailed' && e.regarding?.name === n2.name),
    );
    expect(ev.note).toContain('conntrack');
    expect(replies).toEqual([]); // the old flow is still pinned

    // The tool arrives: the next retry (backoff at most 30 s) frees the flow.
    symlinkSync('/usr/sbin/conntrack', join(pathWithoutConntrack, 'conntrack'));
    await eventually('the old flow answered after a retry', () => replies.length > 0, { timeoutMs: 40_000 });
    expect(replies[0]!.pod).toBe(pods[0]!.name);
    expect(await metric(n2, 'pier_agent_conntrack_deleted_total')).toBeGreaterThanOrEqual(1);
  });

  it('--dry-run and pier plan show the deletions the agent would make', async () => {
    const n1 = lab.nodes[0]!;
    const c = lab.clients[0]!;
    const proc = lab.spawn(c.ns, process.execPath, [CLI, 'agent', '--dry-run', '--node-name', n1.name, '--kubeconfig', cp.adminKubeconfigPath, '--health-port', '0']);
    let out = '';
    proc.stdout?.on('data', (d: Buffer) => (out += d.toString()));
    try {
      await eventually('dry-run conntrack lines', () => out.includes('conntrack: delete the udp flows to [2001:db8:0:1::11]:5301'), { timeoutMs: 20_000 });
    } finally {
      await stopProcesses([proc]);
    }
    expect(out).toMatch(/# pier agent --dry-run: node n1, ipv4, sync 1: conntrack\n/);
    // The endpoint the second test kept, the first pod of either node.
    expect(out).toMatch(new RegExp(`# conntrack: delete the udp flows to ${n1.v4}:5301: those not DNATed to 198\\.19\\.[12]\\.11:${ECHO_PORT}\n`));
    expect(out).not.toMatch(/conntrack: delete the tcp/);

    // pier plan, offline, from the same objects as manifests.
    const dir = mkdtempSync(join(tmpdir(), 'pier-plan-'));
    try {
      const items = [
        ...(await core.listNamespacedService({ namespace: NS })).items.map((x) => ({ apiVersion: 'v1', kind: 'Service', ...x })),
        ...(await discovery.listNamespacedEndpointSlice({ namespace: NS })).items.map((x) => ({ apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', ...x })),
        { apiVersion: 'v1', kind: 'Node', ...(await core.readNode({ name: n1.name })) },
      ];
      writeFileSync(join(dir, 'cluster.json'), JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
      const plan = await lab.exec(c.ns, process.execPath, [CLI, 'plan', '--node', n1.name, '--family', 'ipv6', '-f', dir]);
      const planned = plan.stdout.split('\n').filter((l) => l.startsWith('# conntrack:'));
      const dry = out.split('\n').filter((l) => l.startsWith('# conntrack:') && l.includes('[2001:'));
      expect(planned.length).toBe(2);
      expect(planned).toEqual(dry);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('TCP: a connection left unanswered by an endpoint that then left the slices holds no source port; the next connection from it reaches a current endpoint, IPv4 and IPv6', async () => {
    // A pod gone with its address: nothing answers for it, as after a rolling
    // restart. A client's SYN there leaves an entry (SYN_SENT, 2 minutes) that
    // conntrack would give the next connection from the same source port,
    // sending it to the gone address too (on real nodes: a lone timeout).
    const n1 = lab.nodes[0]!;
    const c = lab.clients[0]!;
    const live = lab.nodes[1]!.pods[0]!;
    const first = n1.pods[0]!;
    const gone = { v4: first.v4.replace(/\.\d+$/, '.250'), v6: first.v6.replace(/::[0-9a-f]+$/, '::250'), node: n1.name };
    const port = { name: 'web', protocol: 'TCP' as const };
    await createLabService({ core, discovery }, NS, 'hung', [{ ...port, port: 5310 }], [gone], { nodes: [n1] });
    const tcpEntries = async (family: 'ipv4' | 'ipv6', sport: number) =>
      (await lab.exec(n1.ns, 'conntrack', ['-L', '-f', family, '-p', 'tcp', '--orig-port-src', String(sport)], { reject: false })).stdout;
    const cases = [
      { family: 'ipv4' as const, host: n1.v4, sport: 40610, goneAt: gone.v4 },
      { family: 'ipv6' as const, host: n1.v6, sport: 40611, goneAt: gone.v6 },
    ];
    await rulesUntil(n1, 'v4', 'DNAT for 5310 to the gone address', (save) => save.includes(`--to-destination ${gone.v4}:${ECHO_PORT}`));
    await rulesUntil(n1, 'v6', 'IPv6 DNAT for 5310 to the gone address', (save) => save.includes(`--to-destination [${gone.v6}]:${ECHO_PORT}`));
    for (const k of cases) {
      const [hung] = await lab.probe(c, k.host, 5310, { sport: k.sport, timeoutMs: 1500 });
      expect(hung?.error).toBe('timeout');
      expect(await tcpEntries(k.family, k.sport)).toMatch(new RegExp(`SYN_SENT .*sport=${k.sport} dport=5310 .*src=${k.goneAt.replace(/[.]/g, '\\.')} `));
    }
    const deletedBefore = await metric(n1, 'pier_agent_conntrack_deleted_total');

    // The gone endpoint leaves the slices, a live one comes.
    await writeSlices('hung', [live], port);
    await rulesUntil(n1, 'v4', 'DNAT for 5310 to the live pod', (save) => save.includes(`--to-destination ${live.v4}:${ECHO_PORT}`) && !save.includes(gone.v4));
    await rulesUntil(n1, 'v6', 'IPv6 DNAT for 5310 to the live pod', (save) => save.includes(`--to-destination [${live.v6}]:${ECHO_PORT}`) && !save.includes(gone.v6));
    for (const k of cases) {
      await eventually(`the ${k.family} entry to the gone address deleted`, async () => !(await tcpEntries(k.family, k.sport)).includes(k.goneAt), { timeoutMs: 5000, intervalMs: 50 });
      const [again] = await lab.probe(c, k.host, 5310, { sport: k.sport, timeoutMs: 1500 });
      expect(again?.reply?.pod, `${k.family}: the same source port again`).toBe(live.name);
    }
    expect(await metric(n1, 'pier_agent_conntrack_deleted_total')).toBeGreaterThanOrEqual(deletedBefore + 2);
  });
});
