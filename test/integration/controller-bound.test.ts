// `pier controller --max-addresses 2` as a process against the real API
// server, with deploy/'s permissions: each Service lists at most two of six
// nodes; a node going NotReady rewrites only the Services that listed it; a
// restarted controller and the node's return move nothing.
import { setTimeout as sleep } from 'node:timers/promises';
import { CoreV1Api, EventsV1Api, PatchStrategy, setHeaderOptions, type V1Service } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  AGENT_LEASE_LABEL,
  AGENT_LEASE_LABEL_VALUE,
  LEASE_FORWARDING_IPV4,
  LEASE_FORWARDING_IPV6,
  LEASE_NODE,
  MAX_ADDRESSES,
  agentLeaseName,
} from '../../lib/contract.ts';
import { LeaseRenewer } from '../../lib/lease.ts';
import { ensureNamespace, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { lbService, node } from '../support/objects.ts';
import { startController as startControllerProcess, type ControllerRun } from '../support/controller.ts';
import { apply, render } from '../support/deploy.ts';
import { eventually } from '../support/wait.ts';

const SYSTEM = 'pier-system';
const NS = 'bound';
const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);
const NODES = Array.from({ length: 6 }, (_, i) => ({ name: `n${i + 1}`, v4: `198.51.100.${21 + i}` }));
/** Twelve Services with the flag's bound, one with `all`, one with a value that is neither. */
const PLAIN = Array.from({ length: 12 }, (_, i) => `s${String(i).padStart(2, '0')}`);

describe('pier controller --max-addresses against a real API server', () => {
  let cp: ControlPlane;
  let core: CoreV1Api;
  let eventsApi: EventsV1Api;
  let kubeconfig: string;
  const renewers: LeaseRenewer[] = [];
  let controller: ControllerRun | undefined;

  async function startController(): Promise<void> {
    controller = await startControllerProcess(kubeconfig, ['--leader-elect=false', '--max-addresses', '2', '--resync-period', '2s', '--log-level', 'info']);
  }

  async function stopController(): Promise<void> {
    await controller?.stop();
    controller = undefined;
  }

  const setReady = (name: string, v4: string, ready: boolean) =>
    core.patchNodeStatus({ name, body: { status: node(name, [{ type: 'InternalIP', address: v4 }], ready).status } }, mergePatch);
  const ips = (svc: V1Service | undefined) => (svc?.status?.loadBalancer?.ingress ?? []).map((i) => i.ip!);
  const list = async () => new Map((await core.listNamespacedService({ namespace: NS })).items.map((s) => [s.metadata!.name!, s]));

  beforeAll(async () => {
    cp = await startControlPlane();
    core = cp.admin.makeApiClient(CoreV1Api);
    eventsApi = cp.admin.makeApiClient(EventsV1Api);
    for (const ns of [SYSTEM, NS]) await ensureNamespace(core, ns);
    await apply(cp.adminKubeconfigPath, (await render('base')).yaml);
    kubeconfig = cp.writeKubeconfig(await cp.serviceAccount(SYSTEM, 'pier-controller'), 'pier-controller');
    for (const n of NODES) {
      await core.createNode({ body: node(n.name, []) });
      await setReady(n.name, n.v4, true);
      const r = new LeaseRenewer({
        kc: cp.admin,
        namespace: SYSTEM,
        name: agentLeaseName(n.name),
        holder: n.name,
        durationSeconds: 10,
        renewEveryMs: 2000,
        labels: { [AGENT_LEASE_LABEL]: AGENT_LEASE_LABEL_VALUE },
        annotations: () => ({ [LEASE_NODE]: n.name, [LEASE_FORWARDING_IPV4]: 'true', [LEASE_FORWARDING_IPV6]: 'true' }),
      });
      r.start();
      renewers.push(r);
    }
    await startController();
  });

  afterAll(async () => {
    controller?.proc.kill('SIGKILL');
    await Promise.all(renewers.map((r) => r.stop()));
    await cp?.stop();
  });

  it('lists at most K per Service, rewrites only the Services that listed a lost node, and moves nothing on a restart or its return', async () => {
    const annotated = (name: string, value: string) => {
      const svc = lbService(NS, name, [{ port: 9000 }]);
      svc.metadata!.annotations = { [MAX_ADDRESSES]: value };
      return svc;
    };
    await Promise.all([
      ...PLAIN.map((name, i) => core.createNamespacedService({ namespace: NS, body: lbService(NS, name, [{ port: 8000 + i }]) })),
      core.createNamespacedService({ namespace: NS, body: annotated('everywhere', 'all') }),
      core.createNamespacedService({ namespace: NS, body: annotated('typo', 'two') }),
    ]);
    const all = NODES.map((n) => n.v4);
    const first = await eventually('every Service with its addresses', async () => {
      const now = await list();
      const done = [...PLAIN, 'typo'].every((name) => ips(now.get(name)).length === 2) && ips(now.get('everywhere')).length === all.length;
      return done ? now : false;
    }, { timeoutMs: 30_000, intervalMs: 200 });
    // Spread: with twelve Services on six nodes, more than two nodes are used.
    expect(new Set(PLAIN.flatMap((name) => ips(first.get(name)))).size).toBeGreaterThan(2);
    await eventually('a Warning for the bad annotation', async () => {
      const events = (await eventsApi.listNamespacedEvent({ namespace: NS })).items;
      return events.find((e) => e.regarding?.name === 'typo' && e.reason === 'InvalidMaxAddresses' && e.type === 'Warning');
    });

    // The node most Services list goes NotReady.
    const count = (ip: string) => PLAIN.filter((name) => ips(first.get(name)).includes(ip)).length;
    const victim = [...NODES].sort((a, b) => count(b.v4) - count(a.v4))[0]!;
    const listed = PLAIN.filter((name) => ips(first.get(name)).includes(victim.v4));
    const others = PLAIN.filter((name) => !listed.includes(name));
    expect(listed.length).toBeGreaterThan(0);
    expect(others.length).toBeGreaterThan(0);
    await setReady(victim.name, victim.v4, false);
    const moved = await eventually('the Services that listed it moved off it', async () => {
      const now = await list();
      const done = listed.every((name) => !ips(now.get(name)).includes(victim.v4) && ips(now.get(name)).length === 2);
      return done ? now : false;
    }, { timeoutMs: 20_000, intervalMs: 200 });
    for (const name of listed) {
      // One address replaced, the other kept.
      const kept = ips(first.get(name)).filter((ip) => ip !== victim.v4);
      for (const ip of kept) expect(ips(moved.get(name)), name).toContain(ip);
    }
    // Two resyncs later, the others have not been written at all.
    await sleep(4500);
    const settled = await list();
    for (const name of others) expect(settled.get(name)!.metadata!.resourceVersion, name).toBe(first.get(name)!.metadata!.resourceVersion);

    // A restart finds every status valid: it writes nothing.
    await stopController();
    await startController();
    await sleep(4500);
    const restarted = await list();
    for (const [name, svc] of settled) expect(svc.metadata!.resourceVersion, `${name} after the restart`).toBe(restarted.get(name)!.metadata!.resourceVersion);

    // The node comes back: only the Service that lists every node takes it again.
    await setReady(victim.name, victim.v4, true);
    await eventually('everywhere lists it again', async () => ips((await list()).get('everywhere')).includes(victim.v4), { timeoutMs: 20_000 });
    await sleep(4500);
    const back = await list();
    for (const name of [...PLAIN, 'typo']) expect(back.get(name)!.metadata!.resourceVersion, `${name} after the node's return`).toBe(restarted.get(name)!.metadata!.resourceVersion);
  });
});
