// How the controller uses the API server, beyond what it decides
// (controller.test.ts): it shares one connection among all its requests and
// watches (lib/connections.ts), which must all come back after the API
// server restarts; and the watch events of its own status writes do not
// cost it a full allocation each, or writing a backlog would be bound by
// allocations instead of by the API server; and its Events wait for the
// status writes to pause, without being lost on a graceful stop; and a
// Node's heartbeats cost it no allocation, where a real change does.
import { setTimeout as sleep } from 'node:timers/promises';
import { CoreV1Api, EventsV1Api, PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { AGENT_LEASE_LABEL, AGENT_LEASE_LABEL_VALUE, LEASE_FORWARDING_IPV4, LEASE_FORWARDING_IPV6, LEASE_NODE, agentLeaseName } from '../../lib/contract.ts';
import { LeaseRenewer } from '../../lib/lease.ts';
import { ensureNamespace, registerNode, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { Fleet, StatusWatch } from '../support/fleet.ts';
import { lbService, node } from '../support/objects.ts';
import { startController as startControllerProcess, type ControllerRun } from '../support/controller.ts';
import { eventually } from '../support/wait.ts';

const NS = 'shop';
const BACKLOG_NS = 'backlog';
const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);
const NODES = [
  { name: 'n1', v4: '198.51.100.11' },
  { name: 'n2', v4: '198.51.100.12' },
];

type Running = ControllerRun;

describe('controller and the API server', () => {
  let cp: ControlPlane;
  let core: CoreV1Api;
  let eventsApi: EventsV1Api;
  let current: Running | undefined;
  const renewers: LeaseRenewer[] = [];

  const startController = () => startControllerProcess(cp.adminKubeconfigPath, ['--leader-elect=false', '--log-level', 'info']);
  const stopController = (r: Running) => r.stop();
  const metric = (r: Running, name: string) => r.metric(name);

  beforeAll(async () => {
    cp = await startControlPlane();
    core = cp.admin.makeApiClient(CoreV1Api);
    eventsApi = cp.admin.makeApiClient(EventsV1Api);
    for (const ns of ['pier-system', NS, BACKLOG_NS]) await ensureNamespace(core, ns);
    for (const n of NODES) {
      await registerNode(core, node(n.name, [{ type: 'InternalIP', address: n.v4 }]));
      // Long enough to outlast the outage: these tests are not about Lease expiry.
      const r = new LeaseRenewer({
        kc: cp.admin,
        namespace: 'pier-system',
        name: agentLeaseName(n.name),
        holder: n.name,
        durationSeconds: 120,
        renewEveryMs: 1000,
        labels: { [AGENT_LEASE_LABEL]: AGENT_LEASE_LABEL_VALUE },
        annotations: () => ({ [LEASE_NODE]: n.name, [LEASE_FORWARDING_IPV4]: 'true', [LEASE_FORWARDING_IPV6]: 'false' }),
      });
      r.start();
      renewers.push(r);
    }
    current = await startController();
  });

  afterEach((ctx) => {
    if (ctx.task.result?.state === 'fail' && current) console.error(`--- controller log ---\n${current.log().split('\n').slice(-30).join('\n')}`);
  });

  afterAll(async () => {
    current?.proc.kill('SIGKILL');
    await current?.proc;
    await Promise.all(renewers.map((r) => r.stop()));
    await cp?.stop();
  });

  const assignedEvents = async (namespace: string) =>
    (await eventsApi.listNamespacedEvent({ namespace })).items.filter((e) => e.reportingController === 'pier.dev/controller' && e.reason === 'Assigned').length;

  const ports = async (name: string) => {
    const svc = await core.readNamespacedService({ name, namespace: NS });
    return JSON.stringify((svc.status?.loadBalancer?.ingress ?? []).map((i) => i.ports?.[0]?.port));
  };

  it('watches and writes again once the API server is back', async () => {
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'before', [{ name: 'http', port: 8080 }]) });
    await eventually('status of a Service created before the outage', async () => (await ports('before')) === '[8080,8080]', { timeoutMs: 15_000, intervalMs: 100 });

    await cp.killApiServer();
    await sleep(1000);
    await cp.restartApiServer();

    await core.patchNamespacedService({ name: 'before', namespace: NS, body: { spec: { ports: [{ name: 'http', port: 8081, protocol: 'TCP', targetPort: 8081 }] } } }, mergePatch);
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'after', [{ name: 'http', port: 9090 }]) });
    await eventually('the changed Service followed', async () => (await ports('before')) === '[8081,8081]', { timeoutMs: 30_000, intervalMs: 200 });
    await eventually('status of a Service created after the outage', async () => (await ports('after')) === '[9090,9090]', { timeoutMs: 30_000, intervalMs: 200 });
    expect(current!.exited()).toBe(false);
  });

  it('allocates for a Node change but not for its heartbeats', async () => {
    current ??= await startController();
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'beats', [{ name: 'http', port: 7171 }]) });
    await eventually('status of a Service listing both nodes', async () => (await ports('beats')) === '[7171,7171]', { timeoutMs: 15_000, intervalMs: 100 });
    const allocations = () => metric(current!, 'pier_controller_allocate_duration_seconds_count');
    const heartbeat = (extra: object = {}) =>
      core.patchNodeStatus({ name: 'n1', body: { status: { conditions: [{ type: 'Ready', status: 'True', reason: 'KubeletReady', lastHeartbeatTime: new Date(), lastTransitionTime: new Date() }], ...extra } } }, mergePatch);
    await sleep(500);
    const before = await allocations();
    // 20 heartbeats in 2 s: without the filter, one allocation per 200 ms (the coalescer's spacing).
    for (let i = 0; i < 20; i++) {
      await heartbeat();
      await sleep(100);
    }
    await sleep(500);
    expect(await allocations()).toBe(before);
    // The same kind of write, with an address added: the status follows.
    const ips = async () => (await core.readNamespacedService({ name: 'beats', namespace: NS })).status?.loadBalancer?.ingress?.map((i) => i.ip).sort();
    await heartbeat({ addresses: [{ type: 'ExternalIP', address: '198.51.100.21' }, { type: 'InternalIP', address: NODES[0]!.v4 }, { type: 'Hostname', address: 'n1' }] });
    await eventually('the ExternalIP listed', async () => JSON.stringify(await ips()) === JSON.stringify(['198.51.100.12', '198.51.100.21']), { timeoutMs: 10_000, intervalMs: 100 });
    expect(await allocations()).toBeGreaterThan(before);
    await heartbeat({ addresses: [{ type: 'InternalIP', address: NODES[0]!.v4 }, { type: 'Hostname', address: 'n1' }] });
    await eventually('the InternalIP listed again', async () => JSON.stringify(await ips()) === JSON.stringify(['198.51.100.11', '198.51.100.12']), { timeoutMs: 10_000, intervalMs: 100 });
    await eventually('its writes and Events done', async () => (await metric(current!, 'pier_controller_queue_depth')) + (await metric(current!, 'pier_controller_events_pending')) === 0, { timeoutMs: 30_000, intervalMs: 200 });
  });

  it('writes a backlog of 500 Services with a handful of allocations, not one per few writes', async () => {
    await stopController(current!);
    current = undefined;
    const fleet = new Fleet(cp.admin);
    const spec = { namespace: BACKLOG_NS, prefix: 'b-', count: 500, firstPort: 20000, targetPort: 8080, endpoints: { IPv4: [{ address: '198.19.1.10', nodeName: 'n1' }] } };
    const items = await fleet.create(spec, { concurrency: 20 });
    const watch = await StatusWatch.start(cp.admin, BACKLOG_NS);
    let eventsByLastStatus: number;
    try {
      current = await startController();
      await watch.waitFor(items.map((i) => i.name), 120_000);
      eventsByLastStatus = await assignedEvents(BACKLOG_NS);
    } finally {
      watch.stop();
    }
    await sleep(500);
    const writes = await metric(current, 'pier_controller_status_writes_total{kind="status",result="ok"}');
    const allocations = await metric(current, 'pier_controller_allocate_duration_seconds_count');
    expect(writes).toBeGreaterThanOrEqual(500);
    // One allocation at start-up and at most a few for the Lease renewals and
    // the odd Service the API server itself touched; writing 500 at the
    // coalescer's 200 ms spacing would otherwise allocate every ~200 ms.
    expect(allocations).toBeLessThanOrEqual(5);
    // Statuses first: the Events wait for the writes to pause, then all come.
    expect(eventsByLastStatus).toBeLessThan(100);
    await eventually('an Assigned Event for each of the 500', async () => (await assignedEvents(BACKLOG_NS)) >= 500, { timeoutMs: 60_000, intervalMs: 500 });
    expect(await metric(current, 'pier_controller_events_pending')).toBe(0);
  });

  it('writes the Events still waiting when stopped gracefully', async () => {
    current ??= await startController();
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'last-words', [{ name: 'http', port: 7070 }]) });
    await eventually('its status', async () => (await ports('last-words')) === '[7070,7070]', { timeoutMs: 15_000, intervalMs: 20 });
    // Its Event waits for a second without writes; the stop comes first.
    await stopController(current);
    current = undefined;
    const events = await eventsApi.listNamespacedEvent({ namespace: NS });
    expect(events.items.filter((e) => e.regarding?.name === 'last-words').map((e) => e.reason)).toEqual(['Assigned']);
  });
});
