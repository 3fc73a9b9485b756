// `pier controller` as a process against the real API server, with the
// permissions the README lists and nothing more: Nodes, agent Leases,
// Services and EndpointSlices are written by the test, as kubelets, agents
// and users would; the controller writes statuses. Then restarts, a steady
// period, and two replicas handing leadership over.
import { setTimeout as sleep } from 'node:timers/promises';
import {
  CoordinationV1Api,
  CoreV1Api,
  DiscoveryV1Api,
  EventsV1Api,
  PatchStrategy,
  setHeaderOptions,
  type EventsV1Event,
  type V1LoadBalancerIngress,
  type V1Service,
} from '@kubernetes/client-node';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  AGENT_LEASE_LABEL,
  AGENT_LEASE_LABEL_VALUE,
  LEADER_LEASE_NAME,
  LEASE_FORWARDING_IPV4,
  LEASE_FORWARDING_IPV6,
  LEASE_IPTABLES_BACKEND,
  LEASE_NODE,
  LEASE_VERSION,
  PORT_MAPPING_ANNOTATION,
  PORT_MODE,
  READY_CONDITION,
  agentLeaseName,
} from '../../lib/contract.ts';
import { LeaseRenewer } from '../../lib/lease.ts';
import { ensureNamespace, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { atExit } from '../support/cleanup.ts';
import { endpointSlice, lbService, node } from '../support/objects.ts';
import { startController as startControllerProcess, type ControllerRun } from '../support/controller.ts';
import { apply, render } from '../support/deploy.ts';
import { eventually } from '../support/wait.ts';

const SYSTEM = 'pier-system';
const NS = 'shop';
const RACE = 'race';
const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);

/** Short enough to test hand-overs quickly; the ratios are client-go's. */
const LEASE_MS = 4000;
const RETRY_MS = 500;
const AGENT_LEASE_S = 4;

const NODES = [
  { name: 'n1', v4: '198.51.100.11', v6: '2001:db8::11' },
  { name: 'n2', v4: '198.51.100.12', v6: '2001:db8::12' },
];
type TestNode = (typeof NODES)[number];

interface Running extends ControllerRun {
  id: string;
}

describe('pier controller against a real API server', () => {
  let cp: ControlPlane;
  let core: CoreV1Api;
  let discovery: DiscoveryV1Api;
  let coordination: CoordinationV1Api;
  let eventsApi: EventsV1Api;
  let kubeconfig: string;
  const renewers = new Map<string, LeaseRenewer>();
  const controllers = new Set<Running>();
  let current: Running;
  let started = 0;

  // ---------------------------------------------------------------------------
  // Harness

  async function startController(id: string, extra: string[] = []): Promise<Running> {
    const run = await startControllerProcess(kubeconfig, [
      '--leader-elect-id', id,
      '--leader-elect-lease-duration', `${LEASE_MS}ms`,
      '--leader-elect-renew-deadline', '3s',
      '--leader-elect-retry-period', `${RETRY_MS}ms`,
      '--resync-period', '2s',
      '--log-level', 'debug',
      ...extra,
    ]);
    const r: Running = { ...run, id };
    controllers.add(r);
    void run.proc.then(() => controllers.delete(r));
    return r;
  }

  const stopController = (r: Running, signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM') => r.stop(signal);
  const metrics = (r: Running) => r.metrics();
  const writes = (r: Running) => r.metric('pier_controller_status_writes_total');
  const leaderOf = async () => (await coordination.readNamespacedLease({ name: LEADER_LEASE_NAME, namespace: SYSTEM })).spec?.holderIdentity;

  function agentLease(n: TestNode): LeaseRenewer {
    const r = new LeaseRenewer({
      kc: cp.admin,
      namespace: SYSTEM,
      name: agentLeaseName(n.name),
      holder: n.name,
      durationSeconds: AGENT_LEASE_S,
      renewEveryMs: 1000,
      labels: { [AGENT_LEASE_LABEL]: AGENT_LEASE_LABEL_VALUE },
      annotations: () => ({
        [LEASE_NODE]: n.name,
        [LEASE_FORWARDING_IPV4]: 'true',
        [LEASE_FORWARDING_IPV6]: 'true',
        [LEASE_IPTABLES_BACKEND]: 'nft',
        [LEASE_VERSION]: 'test',
      }),
    });
    r.start();
    renewers.set(n.name, r);
    return r;
  }

  async function setReady(n: TestNode, ready: boolean): Promise<void> {
    const status = node(n.name, [{ type: 'InternalIP', address: n.v4 }, { type: 'InternalIP', address: n.v6 }], ready).status;
    await core.patchNodeStatus({ name: n.name, body: { status } }, mergePatch);
  }

  const read = (name: string, namespace = NS) => core.readNamespacedService({ name, namespace });
  const ips = (svc: V1Service) => (svc.status?.loadBalancer?.ingress ?? []).map((i) => i.ip);
  const ready = (svc: V1Service) => svc.status?.conditions?.find((c) => c.type === READY_CONDITION);
  /** Waits until the Service's ingress addresses are exactly `want`, and returns it. */
  const ingressIs = (name: string, want: string[], namespace = NS, timeoutMs = 15_000) =>
    eventually(`${namespace}/${name} served on ${want.join(', ') || 'nothing'}`, async () => {
      const svc = await read(name, namespace);
      return JSON.stringify(ips(svc)) === JSON.stringify(want) ? svc : false;
    }, { timeoutMs, intervalMs: 50 });

  async function eventsFor(name: string, namespace = NS): Promise<EventsV1Event[]> {
    const list = await eventsApi.listNamespacedEvent({ namespace });
    return list.items.filter((e) => e.regarding?.name === name && e.reportingController === 'pier.dev/controller');
  }
  async function allVersions(): Promise<Map<string, string>> {
    const list = await core.listServiceForAllNamespaces();
    return new Map(list.items.map((s) => [`${s.metadata!.namespace}/${s.metadata!.name}`, s.metadata!.resourceVersion!]));
  }
  async function controllerEvents(): Promise<number> {
    const list = await eventsApi.listEventForAllNamespaces();
    return list.items.filter((e) => e.reportingController === 'pier.dev/controller').length;
  }

  // ---------------------------------------------------------------------------

  beforeAll(async () => {
    cp = await startControlPlane();
    core = cp.admin.makeApiClient(CoreV1Api);
    discovery = cp.admin.makeApiClient(DiscoveryV1Api);
    coordination = cp.admin.makeApiClient(CoordinationV1Api);
    eventsApi = cp.admin.makeApiClient(EventsV1Api);
    for (const ns of [SYSTEM, NS, RACE]) await ensureNamespace(core, ns);

    // Exactly the permissions deploy/ gives pier controller: its RBAC and admission policies.
    await apply(cp.adminKubeconfigPath, (await render('base')).yaml);
    kubeconfig = cp.writeKubeconfig(await cp.serviceAccount(SYSTEM, 'pier-controller'), 'pier-controller');

    for (const n of NODES) {
      await core.createNode({ body: node(n.name, []) });
      await setReady(n, true);
      agentLease(n);
    }
    // Last resort if the run is interrupted: no controller outlives it.
    atExit(() => {
      for (const r of controllers) r.proc.kill('SIGKILL');
    });
    current = await startController(`a-${started++}`);
    await eventually('first controller to lead', async () => (await leaderOf()) === current.id);
  });

  afterEach((ctx) => {
    if (ctx.task.result?.state !== 'fail') return;
    for (const r of controllers) {
      const lines = r.log().split('\n').filter((l) => !l.includes('"level":"debug"'));
      console.error(`--- controller ${r.id}, last log lines ---\n${lines.slice(-40).join('\n')}`);
    }
  });

  afterAll(async () => {
    await Promise.all([...controllers].map((r) => stopController(r, 'SIGKILL')));
    await Promise.all([...renewers.values()].map((r) => r.stop()));
    await cp?.stop();
  });

  // ---------------------------------------------------------------------------

  it('writes every eligible node address with ipMode Proxy and the ports, then follows updates and deletion', async () => {
    await core.createNamespacedService({
      namespace: NS,
      body: lbService(NS, 'web', [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }], { ipFamilyPolicy: 'RequireDualStack', ipFamilies: ['IPv4', 'IPv6'] }),
    });
    const web = await ingressIs('web', ['198.51.100.11', '198.51.100.12', '2001:db8::11', '2001:db8::12']);
    const ports = [{ port: 8080, protocol: 'TCP' }, { port: 5353, protocol: 'UDP' }];
    expect(web.status?.loadBalancer?.ingress).toEqual(web.status!.loadBalancer!.ingress!.map((i: V1LoadBalancerIngress) => ({ ip: i.ip, ipMode: 'Proxy', ports })));
    expect(ready(web)).toMatchObject({ status: 'True', reason: 'Serving' });
    const assigned = await eventually('an Assigned Event', async () => (await eventsFor('web')).find((e) => e.reason === 'Assigned'));
    expect(assigned.type).toBe('Normal');
    expect(assigned.note).toContain('198.51.100.11:8080/TCP');

    // A spec change moves the status with it.
    await core.patchNamespacedService({ name: 'web', namespace: NS, body: { spec: { ports: [{ name: 'http', port: 8081, protocol: 'TCP', targetPort: 8081 }, { name: 'dns', port: 5353, protocol: 'UDP', targetPort: 5353 }] } } }, mergePatch);
    await eventually('port 8081 in the status', async () => (await read('web')).status?.loadBalancer?.ingress?.[0]?.ports?.[0]?.port === 8081);
    await eventually('an AssignmentChanged Event', async () => (await eventsFor('web')).find((e) => e.reason === 'AssignmentChanged'));

    // externalTrafficPolicy Local: only nodes with a serving endpoint (every eligible node, refusing, until one has).
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'local', [{ name: 'http', port: 8090 }], { externalTrafficPolicy: 'Local' }) });
    await discovery.createNamespacedEndpointSlice({
      namespace: NS,
      body: endpointSlice(NS, 'local', 'IPv4', [{ address: '198.19.1.10', nodeName: 'n1' }], [{ name: 'http', port: 8090 }]),
    });
    await ingressIs('local', ['198.51.100.11']);
    await discovery.patchNamespacedEndpointSlice({
      name: 'local-ipv4',
      namespace: NS,
      body: { endpoints: [{ addresses: ['198.19.1.10'], nodeName: 'n1', conditions: { ready: true } }, { addresses: ['198.19.2.10'], nodeName: 'n2', conditions: { ready: true } }] },
    }, mergePatch);
    await ingressIs('local', ['198.51.100.11', '198.51.100.12']);

    // Deleting needs nothing from pier; the controller carries on.
    const before = await metrics(current);
    await core.deleteNamespacedService({ name: 'local', namespace: NS });
    await sleep(500);
    const after = await metrics(current);
    expect(after.get('pier_controller_status_writes_total{kind="status",result="error"}') ?? 0).toBe(before.get('pier_controller_status_writes_total{kind="status",result="error"}') ?? 0);
    expect(after.get('pier_controller_leader')).toBe(1);
  });

  it('drops a NotReady node, and a node whose agent Lease expires within the lease duration', async () => {
    const both = ['198.51.100.11', '198.51.100.12'];
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'drop', [{ port: 8100 }]) });
    await ingressIs('drop', both);

    await setReady(NODES[1]!, false);
    await ingressIs('drop', ['198.51.100.11']);
    await setReady(NODES[1]!, true);
    await ingressIs('drop', both);

    await renewers.get('n2')!.stop();
    const lease = await coordination.readNamespacedLease({ name: agentLeaseName('n2'), namespace: SYSTEM });
    const expires = new Date(lease.spec!.renewTime!).getTime() + AGENT_LEASE_S * 1000;
    await ingressIs('drop', ['198.51.100.11'], NS, AGENT_LEASE_S * 1000 + 5000);
    // Nothing announced the expiry: the controller woke up for it.
    expect(Date.now() - expires).toBeLessThan(1500);
    expect(Date.now()).toBeGreaterThanOrEqual(expires);

    agentLease(NODES[1]!);
    await ingressIs('drop', both);
  });

  it('gives port 80 to exactly one of 100 Services created at once, the oldest', async () => {
    // Sent youngest name first: creationTimestamp has whole seconds, so the
    // oldest by (time, name) is often among the last to arrive.
    const names = Array.from({ length: 100 }, (_, i) => `r${String(99 - i).padStart(3, '0')}`);
    await Promise.all(names.map((name) => core.createNamespacedService({ namespace: RACE, body: lbService(RACE, name, [{ name: 'http', port: 80 }]) })));
    const settled = await eventually('100 statuses with both addresses and a verdict on port 80', async () => {
      const list = (await core.listNamespacedService({ namespace: RACE })).items;
      const done = list.filter((s) => ips(s).length === 2 && ready(s)?.reason !== undefined);
      return done.length === 100 ? list : false;
    }, { timeoutMs: 60_000, intervalMs: 250 });
    // Give the last changes time to land, then judge the final state.
    await sleep(1000);
    const list = (await core.listNamespacedService({ namespace: RACE })).items;
    expect(list).toHaveLength(settled.length);
    const oldest = [...list].sort((a, b) =>
      new Date(a.metadata!.creationTimestamp!).getTime() - new Date(b.metadata!.creationTimestamp!).getTime() || (a.metadata!.name! < b.metadata!.name! ? -1 : 1),
    )[0]!;
    const holders = list.filter((s) => s.status!.loadBalancer!.ingress!.every((i) => i.ports!.every((p) => !p.error)));
    expect(holders.map((s) => s.metadata!.name)).toEqual([oldest.metadata!.name]);
    expect(ready(oldest)).toMatchObject({ status: 'True', reason: 'Serving' });
    for (const s of list) {
      if (s === oldest) continue;
      expect(s.status!.loadBalancer!.ingress!.flatMap((i) => i.ports!.map((p) => p.error))).toEqual(['PortConflict', 'PortConflict']);
      expect(ready(s)).toMatchObject({ status: 'False', reason: 'PortConflict' });
    }
    const loser = list.find((s) => s !== oldest)!;
    const warning = await eventually('a PortConflict Warning', async () => (await eventsFor(loser.metadata!.name!, RACE)).find((e) => e.reason === 'PortConflict'));
    expect(warning.type).toBe('Warning');
    expect(warning.note).toContain(`held by ${RACE}/${oldest.metadata!.name}`);
  });

  it('draws external ports from the range in port-mode allocate and records them in the annotation', async () => {
    const body = lbService(NS, 'alloc', [{ name: 'http', port: 80 }, { name: 'dns', port: 53, protocol: 'UDP' }]);
    body.metadata!.annotations = { [PORT_MODE]: 'allocate' };
    await core.createNamespacedService({ namespace: NS, body });
    const svc = await eventually('the port mapping annotation', async () => {
      const s = await read('alloc');
      return s.metadata?.annotations?.[PORT_MAPPING_ANNOTATION] && ips(s).length === 2 ? s : false;
    });
    expect(JSON.parse(svc.metadata!.annotations![PORT_MAPPING_ANNOTATION]!)).toEqual({ '80/TCP': 40000, '53/UDP': 40000 });
    expect(svc.status!.loadBalancer!.ingress![0]!.ports).toEqual([{ port: 40000, protocol: 'TCP' }, { port: 40000, protocol: 'UDP' }]);
  });

  it("never writes Services that are not pier's", async () => {
    const created = await Promise.all([
      core.createNamespacedService({ namespace: NS, body: lbService(NS, 'foreign', [{ port: 8200 }], { loadBalancerClass: 'example.com/lb' }) }),
      core.createNamespacedService({ namespace: NS, body: lbService(NS, 'classless', [{ port: 8201 }], { loadBalancerClass: undefined }) }),
      core.createNamespacedService({ namespace: NS, body: lbService(NS, 'plain', [{ port: 8202 }], { type: 'ClusterIP', loadBalancerClass: undefined }) }),
    ]);
    // Everything created before this Service is in the controller's cache once it is served.
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'barrier', [{ port: 8203 }]) });
    await ingressIs('barrier', ['198.51.100.11', '198.51.100.12']);
    await sleep(2500); // and a resync
    for (const svc of created) {
      const now = await read(svc.metadata!.name!);
      expect(now.metadata?.resourceVersion, svc.metadata!.name).toBe(svc.metadata?.resourceVersion);
      expect(now.status?.loadBalancer?.ingress ?? []).toEqual([]);
      expect(now.status?.conditions ?? []).toEqual([]);
      expect(await eventsFor(svc.metadata!.name!)).toEqual([]);
    }
  });

  it('clears its status from a Service that stops being a LoadBalancer', async () => {
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'leaving', [{ port: 8300 }]) });
    await ingressIs('leaving', ['198.51.100.11', '198.51.100.12']);
    await core.patchNamespacedService({
      name: 'leaving',
      namespace: NS,
      body: { spec: { type: 'ClusterIP', loadBalancerClass: null, externalTrafficPolicy: null, allocateLoadBalancerNodePorts: null, ports: [{ port: 8300, targetPort: 8300, protocol: 'TCP' }] } },
    }, mergePatch);
    const left = await eventually('pier condition gone', async () => {
      const svc = await read('leaving');
      return ready(svc) === undefined ? svc : false;
    });
    expect(left.status?.loadBalancer?.ingress ?? []).toEqual([]);
    await eventually('a StatusCleared Event', async () => (await eventsFor('leaving')).find((e) => e.reason === 'StatusCleared'));
  });

  it('changes nothing when restarted, and writes nothing while the cluster is steady', async () => {
    // Let the previous tests' writes settle.
    await sleep(1500);
    const versions = await allVersions();
    const events = await controllerEvents();

    await stopController(current);
    current = await startController(`a-${started++}`);
    // The old leader released the Lease: the new one leads at its first try.
    await eventually('the restarted controller to lead', async () => (await metrics(current)).get('pier_controller_leader') === 1, { timeoutMs: 5000 });
    // Several resyncs (2 s) and agent Lease renewals (1 s) later:
    await sleep(8000);
    const m = await metrics(current);
    expect(m.get('pier_controller_services{state="serving"}')).toBeGreaterThan(0);
    expect(await writes(current)).toBe(0);
    const now = await allVersions();
    const changed = [...now].filter(([k, v]) => versions.get(k) !== v).map(([k]) => k);
    expect(changed).toEqual([]);
    expect(await controllerEvents()).toBe(events);
  });

  it('lets only the leader write, and hands over within the lease duration on SIGKILL and at once on SIGTERM', async () => {
    const standby = await startController(`b-${started++}`);
    expect((await metrics(standby)).get('pier_controller_leader')).toBe(0);
    // Ready comes from the caches; the first read of the Lease may still be in flight.
    await eventually('the standby to name the leader', async () =>
      (await (await fetch(`http://127.0.0.1:${standby.port}/readyz`)).text()).includes(`standby; leader is ${current.id}`));

    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'ha1', [{ port: 8400 }]) });
    await ingressIs('ha1', ['198.51.100.11', '198.51.100.12']);
    await sleep(500);
    expect(await writes(current)).toBeGreaterThan(0);
    expect(await writes(standby)).toBe(0);

    // SIGKILL: no release, so the standby waits for the Lease to expire.
    const killed = Date.now();
    await stopController(current, 'SIGKILL');
    await eventually('the standby to take the Lease', async () => (await leaderOf()) === standby.id, { timeoutMs: LEASE_MS + 5000, intervalMs: 50 });
    const tookOver = Date.now() - killed;
    expect(tookOver).toBeLessThan(LEASE_MS + RETRY_MS * 1.2 + 1000);
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'ha2', [{ port: 8401 }]) });
    await ingressIs('ha2', ['198.51.100.11', '198.51.100.12']);
    expect(await writes(standby)).toBeGreaterThan(0);

    // SIGTERM: the leader releases the Lease, and the next standby takes it at its next try.
    const next = await startController(`c-${started++}`);
    const stopped = Date.now();
    await stopController(standby);
    await eventually('the new standby to take the Lease', async () => (await leaderOf()) === next.id, { timeoutMs: LEASE_MS, intervalMs: 50 });
    expect(Date.now() - stopped).toBeLessThan(RETRY_MS * 1.2 + 1500);
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'ha3', [{ port: 8402 }]) });
    await ingressIs('ha3', ['198.51.100.11', '198.51.100.12']);
    expect(await writes(next)).toBeGreaterThan(0);
    current = next;
    console.log(`hand-over after SIGKILL: ${tookOver} ms (lease duration ${LEASE_MS} ms)`);
  });

  it('runs without leader election as a single replica, leaving the Lease alone', async () => {
    // Every elected replica goes, also one a failed test above left behind.
    await Promise.all([...controllers].map((r) => stopController(r)));
    const lease = await coordination.readNamespacedLease({ name: LEADER_LEASE_NAME, namespace: SYSTEM });
    current = await startController(`solo-${started++}`, ['--leader-elect=false']);
    expect((await metrics(current)).get('pier_controller_leader')).toBe(1);
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'solo', [{ port: 8500 }]) });
    await ingressIs('solo', ['198.51.100.11', '198.51.100.12']);
    const after = await coordination.readNamespacedLease({ name: LEADER_LEASE_NAME, namespace: SYSTEM });
    expect(after.metadata?.resourceVersion).toBe(lease.metadata?.resourceVersion);
    expect(after.spec?.holderIdentity).toBe('');
  });
});
