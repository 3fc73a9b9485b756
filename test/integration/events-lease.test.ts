// Events and Leases against the real API server: the shapes client-node
// produces must pass the server's validation (MicroTime with six fractional
// digits, required events.k8s.io/v1 fields), repeats fold into a series, and
// a renewed Lease reports fresh annotations, with one write per renewal.
import { setTimeout as sleep } from 'node:timers/promises';
import { CoordinationV1Api, CoreV1Api, EventsV1Api } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EventRecorder } from '../../lib/events.ts';
import { LeaseRenewer, leaseIsFresh } from '../../lib/lease.ts';
import { apiserverRequests, ensureNamespace, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { eventually } from '../support/wait.ts';

describe('events and leases', () => {
  let cp: ControlPlane;
  beforeAll(async () => {
    cp = await startControlPlane();
    await ensureNamespace(cp.admin.makeApiClient(CoreV1Api), 'pier-system');
  });
  afterAll(async () => cp?.stop());

  it('writes an Event for a cluster-scoped object and folds repeats into a series', async () => {
    const events = cp.admin.makeApiClient(EventsV1Api);
    const rec = new EventRecorder({ kc: cp.admin, controller: 'pier.dev/test', instance: 'n1', minIntervalMs: 0 });
    const e = { regarding: { apiVersion: 'v1', kind: 'Node', name: 'n1' }, type: 'Warning' as const, reason: 'ForwardingDisabled', action: 'Check', note: 'ipv4: off' };
    await rec.write(e);
    await rec.write(e);
    await rec.write(e);
    const list = await events.listNamespacedEvent({ namespace: 'default' });
    const mine = list.items.filter((x) => x.reason === 'ForwardingDisabled');
    expect(mine).toHaveLength(1);
    expect(mine[0]!.series?.count).toBe(3);
    expect(mine[0]!.regarding?.name).toBe('n1');
    expect(mine[0]!.reportingController).toBe('pier.dev/test');
  });

  it('creates, renews and reports through a Lease', async () => {
    let state = 'one';
    const renewer = new LeaseRenewer({
      kc: cp.admin,
      namespace: 'pier-system',
      name: 'pier-agent-n1',
      holder: 'n1',
      durationSeconds: 10,
      renewEveryMs: 200,
      annotations: () => ({ 'pier.dev/state': state }),
    });
    const api = cp.admin.makeApiClient(CoordinationV1Api);
    renewer.start();
    try {
      const first = await eventually('lease created', async () => api.readNamespacedLease({ name: 'pier-agent-n1', namespace: 'pier-system' }).catch(() => undefined));
      expect(first.metadata?.annotations?.['pier.dev/state']).toBe('one');
      expect(leaseIsFresh(first)).toBe(true);
      state = 'two';
      const second = await eventually('lease renewed with new annotations', async () => {
        const l = await api.readNamespacedLease({ name: 'pier-agent-n1', namespace: 'pier-system' });
        return l.metadata?.annotations?.['pier.dev/state'] === 'two' ? l : false;
      });
      expect(new Date(second.spec!.renewTime!).getTime()).toBeGreaterThan(new Date(first.spec!.renewTime!).getTime());
      expect(second.spec?.leaseTransitions).toBe(0);
    } finally {
      await renewer.stop();
    }
    const last = await api.readNamespacedLease({ name: 'pier-agent-n1', namespace: 'pier-system' });
    expect(leaseIsFresh(last, Date.now() + 11_000)).toBe(false);
  });

  it('renews with one request per renewal, and reads again when another wrote the Lease in between', async () => {
    const name = 'pier-agent-n2';
    const renewer = new LeaseRenewer({ kc: cp.admin, namespace: 'pier-system', name, holder: 'n2', durationSeconds: 10, renewEveryMs: 100, annotations: () => ({ 'pier.dev/state': 'mine' }) });
    const api = cp.admin.makeApiClient(CoordinationV1Api);
    const count = async () => {
      const m = await apiserverRequests(cp);
      return { get: m.get('GET leases') ?? 0, put: m.get('PUT leases') ?? 0 };
    };
    renewer.start();
    try {
      await renewer.firstRenewal;
      const before = await count();
      await sleep(2000);
      const after = await count();
      // The control plane is this file's alone: every Lease request is the renewer's.
      expect(after.put - before.put).toBeGreaterThanOrEqual(10);
      expect(after.get - before.get).toBe(0);

      // Another writer: the renewer's next write meets a 409, reads, and writes over it.
      // (It may itself meet a 409 from a renewal in between: it reads again, as the renewer does.)
      const theirs = await eventually('another writer', async () => {
        const lease = await api.readNamespacedLease({ name, namespace: 'pier-system' });
        lease.metadata!.annotations = { ...lease.metadata!.annotations, 'example.com/other': 'yes' };
        return api.replaceNamespacedLease({ name, namespace: 'pier-system', body: lease }).catch(() => false as const);
      });
      const renewed = await eventually('renewed over the other write', async () => {
        const l = await api.readNamespacedLease({ name, namespace: 'pier-system' });
        return l.metadata?.annotations?.['pier.dev/state'] === 'mine' && l.metadata.resourceVersion !== theirs.metadata!.resourceVersion && l.metadata.annotations['example.com/other'] === 'yes' ? l : false;
      });
      expect(renewed.spec?.holderIdentity).toBe('n2');
      expect((await count()).get - after.get).toBeGreaterThanOrEqual(1);
    } finally {
      await renewer.stop();
    }
  });
});
