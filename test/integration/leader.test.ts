// Leader election against the real API server: never two leaders, a
// released Lease is taken at the next try, an expired one only once it has
// expired, and a leader that cannot renew, or finds someone else in the
// Lease, stops leading by its renew deadline.
import { CoordinationV1Api, CoreV1Api, V1MicroTime } from '@kubernetes/client-node';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { LeaderElector, type LeaderTimings } from '../../lib/leader.ts';
import { ensureNamespace, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { eventually } from '../support/wait.ts';

const NS = 'pier-system';
const TIMINGS: LeaderTimings = { leaseDurationMs: 3000, renewDeadlineMs: 2000, retryPeriodMs: 400 };

describe('leader election', () => {
  let cp: ControlPlane;
  let leases: CoordinationV1Api;
  const running: LeaderElector[] = [];
  let leaseNo = 0;

  beforeAll(async () => {
    cp = await startControlPlane();
    leases = cp.admin.makeApiClient(CoordinationV1Api);
    await ensureNamespace(cp.admin.makeApiClient(CoreV1Api), NS);
  });
  afterEach(async () => {
    await Promise.all(running.splice(0).map((e) => e.stop()));
  });
  afterAll(async () => cp?.stop());

  /** An elector on `lease`, with a log of its transitions. */
  function candidate(identity: string, lease: string, timings: LeaderTimings = TIMINGS) {
    const log: { at: number; leading: boolean }[] = [];
    const e = new LeaderElector({
      kc: cp.admin,
      namespace: NS,
      name: lease,
      identity,
      ...timings,
      onStartedLeading: () => log.push({ at: Date.now(), leading: true }),
      onStoppedLeading: () => log.push({ at: Date.now(), leading: false }),
    });
    running.push(e);
    return { identity, e, log };
  }
  const holder = async (lease: string) => (await leases.readNamespacedLease({ name: lease, namespace: NS })).spec?.holderIdentity;

  it('elects one of several racing candidates, never two, and hands over at the next try on release', async () => {
    const lease = `race-${leaseNo++}`;
    const cs = ['a', 'b', 'c'].map((id) => candidate(id, lease));
    for (const c of cs) c.e.start();
    let most = 0;
    const deadline = Date.now() + 3000;
    while (Date.now() < deadline) {
      most = Math.max(most, cs.filter((c) => c.e.isLeader).length);
      await sleep(10);
    }
    expect(most).toBe(1);
    const first = cs.find((c) => c.e.isLeader)!;
    expect(await holder(lease)).toBe(first.identity);
    for (const c of cs) expect(c.e.leader).toBe(first.identity);

    const released = Date.now();
    await first.e.stop();
    expect(first.log.at(-1)?.leading).toBe(false);
    const next = await eventually('another candidate to lead', () => cs.find((c) => c !== first && c.e.isLeader), { intervalMs: 10 });
    // The next try, not the lease duration: the retry period with jitter, plus the request.
    expect(Date.now() - released).toBeLessThan(TIMINGS.retryPeriodMs * 1.2 + 600);
    const l = await leases.readNamespacedLease({ name: lease, namespace: NS });
    expect(l.spec?.leaseTransitions).toBe(1);
    expect(cs.filter((c) => c.e.isLeader)).toEqual([next]);
  });

  it('waits for a Lease held by someone else to expire, and takes it then', async () => {
    const lease = `expiry-${leaseNo++}`;
    const now = new V1MicroTime(Date.now());
    await leases.createNamespacedLease({
      namespace: NS,
      body: { metadata: { name: lease, namespace: NS }, spec: { holderIdentity: 'ghost', leaseDurationSeconds: 3, acquireTime: now, renewTime: now } },
    });
    const written = Date.now();
    const c = candidate('heir', lease);
    c.e.start();
    await sleep(2000);
    expect(c.e.isLeader).toBe(false);
    expect(c.e.leader).toBe('ghost');
    await eventually('heir to lead', () => c.e.isLeader, { intervalMs: 10, timeoutMs: 10_000 });
    const took = Date.now() - written;
    expect(took).toBeGreaterThanOrEqual(3000);
    expect(took).toBeLessThan(3000 + TIMINGS.retryPeriodMs * 1.2 + 600);
    expect(await holder(lease)).toBe('heir');
  });

  it('steps down when another holder appears in the Lease', async () => {
    const lease = `intruder-${leaseNo++}`;
    const c = candidate('incumbent', lease);
    c.e.start();
    await eventually('incumbent to lead', () => c.e.isLeader, { intervalMs: 10 });
    const l = await leases.readNamespacedLease({ name: lease, namespace: NS });
    const now = new V1MicroTime(Date.now());
    await leases.replaceNamespacedLease({ name: lease, namespace: NS, body: { ...l, spec: { ...l.spec, holderIdentity: 'intruder', renewTime: now, acquireTime: now } } });
    const wrote = Date.now();
    await eventually('incumbent to step down', () => !c.e.isLeader, { intervalMs: 10 });
    expect(Date.now() - wrote).toBeLessThan(TIMINGS.retryPeriodMs + 500);
    expect(c.e.leader).toBe('intruder');
    expect(await holder(lease)).toBe('intruder');
  });

  it('stops leading by the renew deadline when the API server is gone, and leads again once it is back', async () => {
    const lease = `outage-${leaseNo++}`;
    const c = candidate('survivor', lease);
    c.e.start();
    await eventually('survivor to lead', () => c.e.isLeader, { intervalMs: 10 });
    const renewed = Date.now();
    await cp.killApiServer();
    try {
      await eventually('survivor to step down', () => !c.e.isLeader, { intervalMs: 10, timeoutMs: 10_000 });
      const stopped = c.log.at(-1)!;
      expect(stopped.leading).toBe(false);
      // Before anyone else could take the Lease: it is valid for the lease duration after the last renewal.
      expect(stopped.at - renewed).toBeLessThan(TIMINGS.renewDeadlineMs + TIMINGS.retryPeriodMs + 100);
      expect(stopped.at - renewed).toBeLessThan(TIMINGS.leaseDurationMs);
    } finally {
      await cp.restartApiServer();
    }
    await eventually('survivor to lead again', () => c.e.isLeader, { intervalMs: 50, timeoutMs: 20_000 });
    expect(await holder(lease)).toBe('survivor');
  });
});
