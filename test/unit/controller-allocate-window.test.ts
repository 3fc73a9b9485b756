// reallocate() tells a Service's ranked window of 2K nodes by its floor's
// rank and the previous run's nodes rather than keeping their names per
// Service: it must re-judge exactly what keeping the names did, no Service
// more. A node outside every window that changes again while it cannot
// serve (here: NotReady, then its agent's Lease expires) changes no choice.
import type { V1Lease, V1Node, V1Service } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';

import { allocate, defaultAllocatorConfig, reallocate, type AllocateInput } from '../../controller/allocate.ts';
import { LEASE_FORWARDING_IPV4, LEASE_FORWARDING_IPV6 } from '../../lib/contract.ts';

const NOW = 1_000_000;
const NODES = 60;
const SERVICES = 300;
const config = defaultAllocatorConfig({ maxAddresses: 3 });

function node(i: number, ready: boolean): V1Node {
  return {
    metadata: { name: `node-${i}`, labels: {} },
    status: { addresses: [{ type: 'InternalIP', address: `198.18.${i >> 8}.${i & 255}` }], conditions: [{ type: 'Ready', status: ready ? 'True' : 'False' }] },
  };
}

function lease(i: number, fresh: boolean): V1Lease {
  return {
    metadata: { name: `pier-agent-node-${i}`, namespace: 'pier-system', annotations: { [LEASE_FORWARDING_IPV4]: 'true', [LEASE_FORWARDING_IPV6]: 'true' } },
    spec: { renewTime: new Date(NOW - (fresh ? 1000 : 100_000)) as never, leaseDurationSeconds: 15 },
  };
}

function service(i: number): V1Service {
  return {
    metadata: { namespace: 'ns', name: `svc-${i}`, uid: `uid-${i}`, creationTimestamp: new Date(Date.parse('2025-01-01T00:00:00Z') + i * 1000) as never },
    spec: { type: 'LoadBalancer', loadBalancerClass: 'pier.dev/lb', ports: [{ port: 1024 + i, protocol: 'TCP' }], ipFamilies: ['IPv4'], externalTrafficPolicy: 'Cluster' },
  };
}

function world(nodes: V1Node[], leases: V1Lease[], services: V1Service[]): AllocateInput {
  return { services, nodes, leases, slices: [], now: NOW, config };
}

const json = (m: Map<string, unknown>) => JSON.stringify([...m]);

describe('reallocate: ranked windows', () => {
  it('re-judges no Service when a node that serves none changes again', () => {
    const services = Array.from({ length: SERVICES }, (_, i) => service(i));
    const nodes = Array.from({ length: NODES }, (_, i) => node(i, true));
    const leases = Array.from({ length: NODES }, (_, i) => lease(i, true));
    const first = reallocate(world(nodes, leases, services));

    const notReady = nodes.map((n, i) => (i === 7 ? node(7, false) : n));
    const lost = reallocate(world(notReady, leases, services), first.state);
    expect(lost.rejudged).toBeGreaterThan(0);
    expect(json(lost.services)).toBe(json(allocate(world(notReady, leases, services)).services));

    // Still unable to serve: no window holds it, and none may take it.
    const stale = leases.map((l, i) => (i === 7 ? lease(7, false) : l));
    const again = reallocate(world(notReady, stale, services), lost.state);
    expect(again.rejudged).toBe(0);
    expect(json(again.services)).toBe(json(allocate(world(notReady, stale, services)).services));

    // Back: the Services it now ranks in the window of are judged again, as before it left.
    const back = reallocate(world(nodes, leases, services), again.state);
    expect(back.rejudged).toBeGreaterThan(0);
    expect(json(back.services)).toBe(json(allocate(world(nodes, leases, services)).services));

    // Removed while in windows: those Services are judged again.
    const fewer = nodes.filter((_, i) => i !== 11);
    const removed = reallocate(world(fewer, leases, services), back.state);
    expect(removed.rejudged).toBeGreaterThan(0);
    expect(json(removed.services)).toBe(json(allocate(world(fewer, leases, services)).services));
  });
});
