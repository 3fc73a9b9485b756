// Issue 27, "Restarts that refuse nothing": an agent that starts where
// pier's rules are already in place (its own restart, a rolling update, a
// node's reboot with its rules restored) must never apply a ruleset in which
// a port it served has lost what it still has, and never leave a moment
// without the DNAT. Here the whole of pier runs in the lab, as on real nodes:
// a real API server, the controller, an agent in each node namespace run as
// the DaemonSet runs it (default sync interval and resync period), Services
// with endpoints, a steady client on one node's address, and that node's
// agent SIGKILLed and started again, on both rule backends: at once (the
// kubelet's first restart), and after its Lease ran out (the kubelet's
// back-off, a node's reboot), when the controller has withdrawn the node
// from the statuses while the rules left in place still serve it.
// Refusals, resets and timeouts are counted apart: each points at another gap.
import { CoreV1Api, DiscoveryV1Api } from '@kubernetes/client-node';
import type { ResultPromise } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureNamespace, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { ECHO_PORT, HOST_V4, Lab, type LabNode } from '../lab/lab.ts';
import { CLI, registerLabNodes, spawnController, stopProcesses } from '../lab/pier.ts';
import { describeTally, steadyClient, tally, type SteadyClient } from '../lab/steady.ts';
import { endpointSlice, lbService } from '../support/objects.ts';
import { eventually } from '../support/wait.ts';

const NS = 'restart';
const SERVICES = 4;
/** A short Lease, so that one runs out within the test; the DaemonSet's (and the default) are 20 s, renewed every 5 s. */
const SHORT_LEASE = ['--lease-duration', '3s', '--lease-renew-interval', '1s'];
const SHORT_LEASE_MS = 3000;

describe.each(['iptables', 'nftables'] as const)('agent restarts under a steady client, %s backend', (backend) => {
  let lab: Lab;
  let cp: ControlPlane;
  let core: CoreV1Api;
  const agents = new Map<string, ResultPromise>();
  let controller: ResultPromise | undefined;
  let log = '';

  const startAgent = (n: LabNode, extra: string[] = []) => {
    // As deploy/base/agent.yaml runs it: default intervals, log level info.
    const proc = lab.spawn(n.ns, process.execPath, [CLI, 'agent', '--node-name', n.name, '--kubeconfig', cp.adminKubeconfigPath, '--log-level', 'info', '--backend', backend, ...extra]);
    proc.stderr?.on('data', (d: Buffer) => {
      if (n === lab.nodes[0]) log += d.toString();
    });
    agents.set(n.name, proc);
  };
  const ready = (n: LabNode) =>
    eventually(`agent on ${n.name} ready`, async () => (await fetch(`http://${n.v4}:10265/readyz`).catch(() => undefined))?.ok, { timeoutMs: 30_000, intervalMs: 50 });
  const kill = async (n: LabNode) => {
    const proc = agents.get(n.name)!;
    proc.kill('SIGKILL');
    await proc.catch(() => undefined);
  };
  const ingress = async (name: string) => ((await core.readNamespacedService({ name, namespace: NS })).status?.loadBalancer?.ingress ?? []).map((i) => i.ip!).sort();
  /** pier's rules on `n`, without counters and handles. */
  const rules = async (n: LabNode) => {
    if (backend === 'iptables') {
      return (await lab.exec(n.ns, 'iptables-save', [])).stdout.split('\n').filter((l) => !l.startsWith('#')).map((l) => l.replace(/\[\d+:\d+\]/, '[0:0]')).join('\n');
    }
    const tables: string[] = [];
    for (const family of ['ip', 'ip6']) tables.push((await lab.exec(n.ns, 'nft', ['list', 'table', family, 'pier'])).stdout.replace(/counter packets \d+ bytes \d+/g, 'counter'));
    return tables.join('\n');
  };
  /** The client's failures, each with how long after which kill it began, and the agent's log: what a failing run prints. */
  const report = (what: string, results: readonly { ok: boolean; at?: number; error?: string }[], kills: number[]) => {
    console.log(`[agent-restart] ${backend}, ${what}: ${describeTally(tally(results as never))}`);
    const failed = results.filter((r) => !r.ok);
    if (failed.length === 0) return;
    const since = (at: number) => {
      const k = kills.filter((x) => x <= at).at(-1);
      return k === undefined ? 'before the first kill' : `${at - k} ms after kill ${kills.indexOf(k) + 1}`;
    };
    console.log(failed.map((r) => `  ${r.error} at ${new Date(r.at!).toISOString()} (${since(r.at!)})`).join('\n'));
    console.log(log.split('\n').slice(-60).join('\n'));
  };

  beforeAll(async () => {
    lab = await Lab.create({ nodes: [2, 2], clients: 2, hostLink: true });
    cp = await startControlPlane({ address: HOST_V4 });
    core = cp.admin.makeApiClient(CoreV1Api);
    const discovery = cp.admin.makeApiClient(DiscoveryV1Api);
    await ensureNamespace(core, NS);
    await ensureNamespace(core, 'pier-system');
    await registerLabNodes(core, lab);
    // Several Services, so that the lists carry more than one object; the client uses the first.
    for (let i = 0; i < SERVICES; i++) {
      await core.createNamespacedService({ namespace: NS, body: lbService(NS, `web${i}`, [{ name: 'http', port: 80 + i, targetPort: ECHO_PORT }]) });
      await discovery.createNamespacedEndpointSlice({
        namespace: NS,
        body: endpointSlice(NS, `web${i}`, 'IPv4', lab.pods.map((p) => ({ address: p.v4, nodeName: p.node })), [{ name: 'http', port: ECHO_PORT }]),
      });
    }
    for (const n of lab.nodes) startAgent(n);
    await Promise.all(lab.nodes.map(ready));
    controller = spawnController(lab, lab.clients[1]!, cp.adminKubeconfigPath);
    const all = lab.nodes.map((n) => n.v4).sort();
    for (let i = 0; i < SERVICES; i++) await eventually(`web${i} listed on every node`, async () => (await ingress(`web${i}`)).join() === all.join(), { timeoutMs: 30_000 });
    for (let i = 0; i < SERVICES; i++) {
      await eventually(`port ${80 + i} answered`, async () => (await lab.probe(lab.clients[0]!, lab.nodes[0]!.v4, 80 + i, { timeoutMs: 500 }))[0]?.ok, { timeoutMs: 20_000 });
    }
  });

  afterAll(async () => {
    await stopProcesses([...agents.values(), ...(controller ? [controller] : [])]);
    await lab?.destroy();
    await cp?.stop();
  });

  const withClient = async (n: LabNode, run: (kills: number[]) => Promise<void>) => {
    const client: SteadyClient = steadyClient(lab, lab.clients[0]!, n.v4, 80, { intervalMs: 50 });
    await client.started;
    const kills: number[] = [];
    try {
      await run(kills);
      await new Promise((r) => setTimeout(r, 1500));
    } finally {
      await client.stop();
    }
    return { results: client.results, kills };
  };

  it('SIGKILLed and started again at once, 6 times: no connection refused, reset or timed out, and the rules end as they were', async () => {
    const n = lab.nodes[0]!;
    const before = await rules(n);
    const { results, kills } = await withClient(n, async (kills) => {
      for (let i = 0; i < 6; i++) {
        await new Promise((r) => setTimeout(r, 1000));
        kills.push(Date.now());
        await kill(n);
        // The kubelet takes a moment to start the container again.
        await new Promise((r) => setTimeout(r, 200));
        log += `--- restart ${i + 1} ---\n`;
        startAgent(n);
        await ready(n);
      }
    });
    report('started again at once', results, kills);
    expect(results.length).toBeGreaterThan(6 * 15);
    expect(tally(results)).toMatchObject({ refused: 0, reset: 0, timeout: 0, other: 0 });
    expect(await rules(n)).toBe(before);
  });

  it('SIGKILLed and started again after its Lease ran out and the controller withdrew the node, 3 times: the rules left in place serve throughout, and the new agent refuses nothing', async () => {
    const n = lab.nodes[0]!;
    const before = await rules(n);
    const all = lab.nodes.map((x) => x.v4).sort();
    const logFrom = log.length;
    // The agent with a short Lease first (a restart at once, its Lease fresh).
    await kill(n);
    startAgent(n, SHORT_LEASE);
    await ready(n);
    const { results, kills } = await withClient(n, async (kills) => {
      for (let i = 0; i < 3; i++) {
        await new Promise((r) => setTimeout(r, 1000));
        kills.push(Date.now());
        await kill(n);
        // The controller stops advertising a node whose agent's Lease ran out
        // (within ~3 s; the first time up to 20 s, when the controller began
        // leading less than the agent's former 20 s Lease ago and grants that)...
        await eventually(`${n.name} withdrawn (${i + 1})`, async () => !(await ingress('web0')).includes(n.v4), { timeoutMs: SHORT_LEASE_MS + 30_000, intervalMs: 50 });
        // ...while its rules stay: the client is still answered.
        await new Promise((r) => setTimeout(r, 500));
        log += `--- restart ${i + 1}, the node withdrawn ---\n`;
        startAgent(n, SHORT_LEASE);
        await ready(n);
        await eventually(`${n.name} listed again (${i + 1})`, async () => (await ingress('web0')).join() === all.join(), { timeoutMs: 10_000, intervalMs: 50 });
      }
    });
    report('started again after its Lease ran out', results, kills);
    // Each new agent found its Lease run out and waited for the controller's answer.
    expect(log.slice(logFrom).match(/this node's Lease had run out when this agent renewed it/g)).toHaveLength(3);
    expect(results.length).toBeGreaterThan(3 * 40);
    expect(tally(results)).toMatchObject({ refused: 0, reset: 0, timeout: 0, other: 0 });
    expect(await rules(n)).toBe(before);
  });

  it('started again after its Lease ran out while the controller is frozen (SIGSTOP) for 5 s: the new agent keeps the rules until the controller, thawed, lists the node again, and refuses nothing', async () => {
    // A controller slower than the agent's 2 s of quiet (busy, failing
    // over): quiet is no answer while no Service lists the node.
    const n = lab.nodes[0]!;
    const before = await rules(n);
    const all = lab.nodes.map((x) => x.v4).sort();
    await kill(n);
    startAgent(n, SHORT_LEASE);
    await ready(n);
    const logFrom = log.length;
    const { results, kills } = await withClient(n, async (kills) => {
      await new Promise((r) => setTimeout(r, 1000));
      kills.push(Date.now());
      await kill(n);
      // From every Service: a Service still listing the node reads as an answer.
      for (let i = 0; i < SERVICES; i++) {
        await eventually(`${n.name} withdrawn from web${i}`, async () => !(await ingress(`web${i}`)).includes(n.v4), { timeoutMs: SHORT_LEASE_MS + 30_000, intervalMs: 50 });
      }
      controller!.kill('SIGSTOP');
      try {
        log += '--- restart with the controller frozen ---\n';
        // A Lease longer than the freeze: the agent waits at most that long.
        startAgent(n, ['--lease-duration', '15s', '--lease-renew-interval', '1s']);
        await new Promise((r) => setTimeout(r, 5000));
      } finally {
        controller!.kill('SIGCONT');
      }
      await ready(n);
      await eventually(`${n.name} listed again`, async () => (await ingress('web0')).join() === all.join(), { timeoutMs: 10_000, intervalMs: 50 });
    });
    report('started again while the controller was frozen', results, kills);
    const waited = log.slice(logFrom).match(/"waitedMs":(\d+),"listed":true/);
    expect(waited, log.slice(logFrom)).not.toBeNull();
    expect(Number(waited![1])).toBeGreaterThan(4000);
    expect(results.length).toBeGreaterThan(5 * 15);
    expect(tally(results)).toMatchObject({ refused: 0, reset: 0, timeout: 0, other: 0 });
    expect(await rules(n)).toBe(before);
  });
});
