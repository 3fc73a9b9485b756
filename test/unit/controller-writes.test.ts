// The writer's decisions for one Service: Services pier never wrote stay
// untouched, a status that says what the allocation says costs nothing
// (also on a server that drops ipMode), and Events follow what clients can
// actually reach.
import type { V1Lease, V1Node, V1Service } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';

import { allocate, defaultAllocatorConfig, type ServiceAllocation } from '../../controller/allocate.ts';
import {
  assignmentEvent,
  hasWrites,
  newProblems,
  problemKey,
  sameProblems,
  served,
  serverDroppedIpMode,
  serviceState,
  serviceWork,
} from '../../controller/writes.ts';
import { LEASE_FORWARDING_IPV4, LEASE_FORWARDING_IPV6, PORT_MAPPING_ANNOTATION, PORT_MODE, READY_CONDITION } from '../../lib/contract.ts';

const NOW = Date.parse('2025-06-01T12:00:00Z');
const config = defaultAllocatorConfig();

function node(name: string, ip: string): V1Node {
  return { metadata: { name }, status: { addresses: [{ type: 'InternalIP', address: ip }], conditions: [{ type: 'Ready', status: 'True' }] } };
}
function lease(name: string): V1Lease {
  return {
    metadata: { name: `pier-agent-${name}`, namespace: 'pier-system', annotations: { [LEASE_FORWARDING_IPV4]: 'true', [LEASE_FORWARDING_IPV6]: 'true' } },
    spec: { holderIdentity: name, leaseDurationSeconds: 15, renewTime: new Date(NOW - 1000) as never },
  };
}
function service(name: string, extra: Partial<V1Service> = {}, cls: string | null = 'pier.dev/lb'): V1Service {
  return {
    metadata: { namespace: 'shop', name, resourceVersion: '7', creationTimestamp: new Date(NOW - 60_000), ...extra.metadata },
    spec: { type: 'LoadBalancer', loadBalancerClass: cls ?? undefined, ipFamilies: ['IPv4'], ports: [{ name: 'http', port: 80, protocol: 'TCP' }], ...extra.spec },
    status: extra.status ?? {},
  };
}
function allocationOf(...services: V1Service[]): Map<string, ServiceAllocation> {
  return allocate({ services, nodes: [node('n1', '192.0.2.1'), node('n2', '192.0.2.2')], slices: [], leases: [lease('n1'), lease('n2')], now: NOW, config }).services;
}
/** What the server stores after a status merge patch, as a client reads it back. */
function stored(svc: V1Service, work: ReturnType<typeof serviceWork>, dropIpMode = false): V1Service {
  const status = { ...svc.status, ...work.status?.status };
  const ingress = status.loadBalancer?.ingress?.map((i) => {
    const out = { ...i };
    if (dropIpMode) delete out.ipMode;
    return out;
  });
  return { ...svc, metadata: { ...svc.metadata, resourceVersion: '8' }, status: { ...status, loadBalancer: { ingress } } as V1Service['status'] };
}

describe('serviceWork', () => {
  it('writes a new Service, then nothing once the status says it', () => {
    const svc = service('web');
    const desired = allocationOf(svc).get('shop/web')!;
    const first = serviceWork(svc, desired, { ipModeDropped: false });
    expect(first.status?.status.loadBalancer?.ingress).toEqual([
      { ip: '192.0.2.1', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }] },
      { ip: '192.0.2.2', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }] },
    ]);
    expect(first.clearing).toBe(false);
    expect(first.annotation).toBeUndefined();
    expect(hasWrites(serviceWork(stored(svc, first), desired, { ipModeDropped: false }))).toBe(false);
  });

  it('compares without ipMode once the server is known to drop it, and only then', () => {
    const svc = service('web');
    const desired = allocationOf(svc).get('shop/web')!;
    const first = serviceWork(svc, desired, { ipModeDropped: false });
    const back = stored(svc, first, true);
    expect(serverDroppedIpMode(first.status!, back)).toBe(true);
    expect(serverDroppedIpMode(first.status!, stored(svc, first))).toBe(false);
    // Without the guard the writer would send the same patch forever.
    expect(serviceWork(back, desired, { ipModeDropped: false }).status?.status.loadBalancer).toBeDefined();
    expect(hasWrites(serviceWork(back, desired, { ipModeDropped: true }))).toBe(false);
    // A real change is still written.
    const moved = allocate({ services: [back], nodes: [node('n1', '192.0.2.1')], slices: [], leases: [lease('n1')], now: NOW, config }).services.get('shop/web')!;
    expect(serviceWork(back, moved, { ipModeDropped: true }).status?.status.loadBalancer?.ingress).toHaveLength(1);
  });

  it('never writes a Service pier never wrote, whatever its status says', () => {
    const foreign = service('other', { status: { loadBalancer: { ingress: [{ ip: '192.0.2.1', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }] }] } } }, 'example.com/lb');
    const classless = service('classless', {}, null);
    expect(allocationOf(foreign, classless).size).toBe(0);
    for (const svc of [foreign, classless]) {
      expect(serviceWork(svc, undefined, { ipModeDropped: false })).toEqual({ clearing: false });
      expect(serviceWork(svc, undefined, { ipModeDropped: true })).toEqual({ clearing: false });
    }
  });

  it('clears what pier wrote from a Service that is no longer pier\'s, keeping everything else', () => {
    const svc = service('web');
    const desired = allocationOf(svc).get('shop/web')!;
    const mine = stored(svc, serviceWork(svc, desired, { ipModeDropped: false }));
    mine.status!.conditions = [...(mine.status!.conditions ?? []), { type: 'example.com/Other', status: 'True', reason: 'Fine', message: '', lastTransitionTime: new Date(NOW) }];
    mine.status!.loadBalancer!.ingress!.push({ hostname: 'lb.example.com' });
    const work = serviceWork(mine, undefined, { ipModeDropped: false });
    expect(work.clearing).toBe(true);
    expect(work.status?.status.conditions?.map((c) => c.type)).toEqual(['example.com/Other']);
    expect(work.status?.status.loadBalancer?.ingress).toEqual([{ hostname: 'lb.example.com' }]);
    expect(work.status?.metadata?.resourceVersion).toBe('8');
  });

  it('keeps the port-mapping annotation in step in port-mode allocate', () => {
    const svc = service('alloc', { metadata: { annotations: { [PORT_MODE]: 'allocate' } } });
    const desired = allocationOf(svc).get('shop/alloc')!;
    const work = serviceWork(svc, desired, { ipModeDropped: false });
    expect(work.annotation).toEqual({ metadata: { annotations: { [PORT_MAPPING_ANNOTATION]: '{"80/TCP":40000}' } } });
    const annotated = { ...stored(svc, work), metadata: { ...svc.metadata, annotations: { [PORT_MODE]: 'allocate', [PORT_MAPPING_ANNOTATION]: '{"80/TCP":40000}' } } };
    expect(hasWrites(serviceWork(annotated, desired, { ipModeDropped: false }))).toBe(false);
  });
});

describe('Events and metrics', () => {
  const ing = (ip: string, ...ports: [number, string?][]) => ({ ip, ipMode: 'Proxy' as const, ports: ports.map(([port, error]) => ({ port, protocol: 'TCP', ...(error ? { error } : {}) })) });

  it('counts only served ports as an assignment', () => {
    expect(served([ing('2001:db8::1', [80], [81, 'PortConflict']), ing('192.0.2.1', [80])])).toEqual(['192.0.2.1:80/TCP', '[2001:db8::1]:80/TCP']);
  });

  it('says Assigned when a Service becomes reachable, AssignmentChanged when that changes, and nothing otherwise', () => {
    const before = { loadBalancer: { ingress: [ing('192.0.2.1', [80]), ing('192.0.2.2', [80])] } };
    expect(assignmentEvent(undefined, [ing('192.0.2.1', [80])])).toEqual({ reason: 'Assigned', note: 'served on 192.0.2.1:80/TCP' });
    expect(assignmentEvent({ loadBalancer: { ingress: [ing('192.0.2.1', [80, 'PortConflict'])] } }, [ing('192.0.2.1', [80])])?.reason).toBe('Assigned');
    expect(assignmentEvent(before, [ing('192.0.2.2', [80]), ing('192.0.2.1', [80])])).toBeUndefined();
    expect(assignmentEvent(before, [ing('192.0.2.1', [80]), ing('192.0.2.3', [80])])).toEqual({
      reason: 'AssignmentChanged',
      note: 'added 192.0.2.3:80/TCP; removed 192.0.2.2:80/TCP; now served on 192.0.2.1:80/TCP, 192.0.2.3:80/TCP',
    });
    expect(assignmentEvent(before, [])).toEqual({ reason: 'AssignmentChanged', note: 'no longer served (was 192.0.2.1:80/TCP, 192.0.2.2:80/TCP)' });
    // A conflict that leaves nothing reachable is a Warning (a problem), not an assignment.
    expect(assignmentEvent(undefined, [ing('192.0.2.1', [80, 'PortConflict'])])).toBeUndefined();
  });

  it('sorts Services into serving, partial and unserved', () => {
    const a = allocationOf(service('old'), service('young', { metadata: { creationTimestamp: new Date(NOW) }, spec: { ports: [{ port: 80 }, { port: 81 }] } }), service('none', { spec: { ports: [{ port: 22 }] } }));
    expect(serviceState(a.get('shop/old')!)).toBe('serving');
    expect(serviceState(a.get('shop/young')!)).toBe('partial');
    expect(serviceState(a.get('shop/none')!)).toBe('unserved');
    expect(a.get('shop/none')!.condition.reason).toBe('PortReserved');
    expect(a.get('shop/none')!.ingress.every((i) => i.ports.every((p) => p.error === 'PortReserved'))).toBe(true);
  });

  it('reports each problem once and notices when the set changes', () => {
    const p1 = { reason: 'PortConflict', message: 'port 80/TCP is held by shop/old' };
    const p2 = { reason: 'PortReserved', message: 'port 22/TCP is reserved' };
    const reported = new Set([problemKey(p1)]);
    expect(newProblems(reported, [p1, p2])).toEqual([p2]);
    expect(sameProblems(reported, [p1])).toBe(true);
    expect(sameProblems(reported, [p1, p1])).toBe(true);
    expect(sameProblems(reported, [])).toBe(false);
    expect(sameProblems(undefined, [])).toBe(true);
    expect(sameProblems(reported, [p2])).toBe(false);
  });

  it('stamps a new condition with the time of the write', () => {
    const svc = service('web');
    const work = serviceWork(svc, allocationOf(svc).get('shop/web')!, { ipModeDropped: false, now: new Date(NOW) });
    expect(work.status?.status.conditions).toEqual([
      { type: READY_CONDITION, status: 'True', reason: 'Serving', message: 'served on 192.0.2.1, 192.0.2.2, port 80/TCP', lastTransitionTime: '2025-06-01T12:00:00Z' },
    ]);
  });
});
