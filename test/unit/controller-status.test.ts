// The writer's helpers: a patch only when the status would say something new
// once the API server's defaults are accounted for, other controllers'
// conditions carried along untouched, and pier's traces removed cleanly.
import type { V1Condition, V1LoadBalancerIngress, V1Service } from '@kubernetes/client-node';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';

import { PORT_MAPPING_ANNOTATION, allocate, defaultAllocatorConfig, type IngressAssignment, type ReadyCondition } from '../../controller/allocate.ts';
import { annotationPatch, clearPatch, normalizeStatus, statusPatch, type DesiredStatus } from '../../controller/status.ts';
import { READY_CONDITION } from '../../lib/contract.ts';

const NOW = new Date('2025-06-01T12:00:00Z');
const EARLIER = new Date('2025-05-01T08:30:00Z');

// ---------------------------------------------------------------------------
// A small model of the API server

/** RFC 7386. */
function mergePatch(target: unknown, patch: unknown): unknown {
  if (patch === null || typeof patch !== 'object' || Array.isArray(patch)) return patch;
  const out: Record<string, unknown> = target && typeof target === 'object' && !Array.isArray(target) ? { ...(target as Record<string, unknown>) } : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

/**
 * A Service as a client reads it back after the server stored it: empty
 * lists and strings omitted, ipMode defaulted, times at whole seconds and
 * turned into Dates by the client.
 */
function stored(svc: V1Service): V1Service {
  const out = JSON.parse(JSON.stringify(svc)) as V1Service;
  const status = out.status ?? {};
  const ingress = (status.loadBalancer?.ingress ?? []).map((i) => {
    const e: V1LoadBalancerIngress = { ...i };
    if (e.ip && !e.ipMode) e.ipMode = 'VIP';
    if (!e.ports?.length) delete e.ports;
    else e.ports = e.ports.map((p) => (p.error ? p : { port: p.port, protocol: p.protocol }));
    return e;
  });
  status.loadBalancer = ingress.length ? { ingress } : {};
  if (status.conditions?.length) {
    status.conditions = status.conditions.map((c) => ({ ...c, lastTransitionTime: new Date(Math.floor(new Date(c.lastTransitionTime).getTime() / 1000) * 1000) }));
  } else delete status.conditions;
  out.status = status;
  return out;
}

function apply(svc: V1Service, patch: object | undefined): V1Service {
  return patch ? stored(mergePatch(svc, patch) as V1Service) : svc;
}

// ---------------------------------------------------------------------------
// Generators

const portArb = fc.record(
  { port: fc.integer({ min: 1, max: 65535 }), protocol: fc.constantFrom('TCP', 'UDP', 'SCTP'), error: fc.constantFrom('PortConflict', 'PortReserved') },
  { requiredKeys: ['port', 'protocol'] },
);

const ingressArb: fc.Arbitrary<IngressAssignment> = fc.record({
  ip: fc.constantFrom('192.0.2.1', '192.0.2.2', '198.51.100.7', '2001:db8::1', '2001:db8::2'),
  ipMode: fc.constant('Proxy' as const),
  ports: fc.array(portArb, { maxLength: 3 }),
});

const conditionArb: fc.Arbitrary<ReadyCondition> = fc.record({
  status: fc.constantFrom('True', 'False') as fc.Arbitrary<'True' | 'False'>,
  reason: fc.constantFrom('Serving', 'PortConflict', 'NoEligibleNodes', 'PartiallyServed'),
  message: fc.constantFrom('served on 192.0.2.1', 'no node can serve IPv4', 'port 80/TCP is not served', ''),
});

const desiredArb: fc.Arbitrary<DesiredStatus> = fc.record({ ingress: fc.array(ingressArb, { maxLength: 3 }), condition: conditionArb });

const timeArb = fc.integer({ min: Date.parse('2024-01-01T00:00:00Z'), max: Date.parse('2025-05-31T00:00:00Z') }).map((ms) => new Date(ms));

const otherConditionArb: fc.Arbitrary<V1Condition> = fc.record(
  {
    type: fc.constantFrom('example.com/Healthy', 'Degraded', 'other.dev/Ready'),
    status: fc.constantFrom('True', 'False', 'Unknown'),
    reason: fc.constantFrom('Fine', 'Broken'),
    message: fc.constantFrom('', 'all good', 'not so good'),
    lastTransitionTime: timeArb,
    observedGeneration: fc.integer({ min: 1, max: 9 }),
  },
  { requiredKeys: ['type', 'status', 'reason', 'message', 'lastTransitionTime'] },
);

/** Anything a status might hold before pier looks at it: its own past writes, others' conditions, foreign ingress. */
const currentArb: fc.Arbitrary<V1Service> = fc
  .record({
    ingress: fc.array(
      fc.record(
        {
          ip: fc.constantFrom('192.0.2.1', '192.0.2.2', '2001:db8::1', '203.0.113.9'),
          ipMode: fc.constantFrom('Proxy', 'VIP'),
          hostname: fc.constantFrom('lb.example.com'),
          ports: fc.array(portArb, { maxLength: 3 }),
        },
        { requiredKeys: ['ip'] },
      ),
      { maxLength: 3 },
    ),
    others: fc.uniqueArray(otherConditionArb, { selector: (c) => c.type, maxLength: 3 }),
    ours: fc.option(fc.tuple(conditionArb, timeArb, fc.nat({ max: 3 }))),
    resourceVersion: fc.option(fc.integer({ min: 1, max: 99999 }).map(String), { nil: undefined }),
  })
  .map(({ ingress, others, ours, resourceVersion }) => {
    const conditions = [...others];
    if (ours) conditions.splice(Math.min(ours[2], conditions.length), 0, { type: READY_CONDITION, ...ours[0], lastTransitionTime: ours[1] });
    return stored({
      metadata: { namespace: 'default', name: 'web', generation: 3, ...(resourceVersion ? { resourceVersion } : {}) },
      spec: { type: 'LoadBalancer', loadBalancerClass: 'pier.dev/lb', ports: [{ port: 80 }] },
      status: { loadBalancer: { ingress }, conditions },
    });
  });

const plainTime = (t: unknown) => new Date(t as string).toISOString();
const othersOf = (svc: V1Service) =>
  (svc.status?.conditions ?? []).filter((c) => c.type !== READY_CONDITION).map((c) => ({ ...c, lastTransitionTime: plainTime(c.lastTransitionTime) }));

// ---------------------------------------------------------------------------
// Properties

describe('statusPatch: properties', () => {
  it('converges: after its patch is stored, it has nothing more to say', () => {
    fc.assert(
      fc.property(currentArb, desiredArb, (current, desired) => {
        const after = apply(current, statusPatch(current, desired, NOW));
        expect(statusPatch(after, desired, NOW)).toBeUndefined();
        expect(normalizeStatus(after.status).ingress).toEqual(normalizeStatus({ loadBalancer: { ingress: desired.ingress } }).ingress);
      }),
      { numRuns: 500 },
    );
  });

  it('writes nothing when the stored status already says it, whenever and for whichever generation it was written', () => {
    fc.assert(
      fc.property(desiredArb, fc.array(otherConditionArb, { maxLength: 2 }), timeArb, fc.integer({ min: 1, max: 5 }), (desired, others, since, generation) => {
        const svc = stored({
          metadata: { namespace: 'default', name: 'web', resourceVersion: '7' },
          status: {
            loadBalancer: { ingress: desired.ingress.map((i) => ({ ...i, ports: i.ports.map((p) => ({ ...p })) })) },
            conditions: [...others, { type: READY_CONDITION, ...desired.condition, lastTransitionTime: since, observedGeneration: generation }],
          },
        });
        expect(statusPatch(svc, desired, NOW)).toBeUndefined();
      }),
    );
  });

  it('carries every other controller\'s condition along unchanged, and keeps the transition time unless the status flips', () => {
    fc.assert(
      fc.property(currentArb, desiredArb, (current, desired) => {
        const patch = statusPatch(current, desired, NOW);
        const after = apply(current, patch);
        expect(othersOf(after)).toEqual(othersOf(current));
        const before = current.status?.conditions?.find((c) => c.type === READY_CONDITION);
        const ours = after.status?.conditions?.filter((c) => c.type === READY_CONDITION) ?? [];
        expect(ours).toHaveLength(1);
        expect(ours[0]).toMatchObject({ ...desired.condition });
        const expectedSince = before && before.status === desired.condition.status ? before.lastTransitionTime : NOW;
        expect(plainTime(ours[0]!.lastTransitionTime)).toBe(plainTime(expectedSince));
      }),
      { numRuns: 500 },
    );
  });

  it('patches only the status, with the resourceVersion whenever it rewrites the condition list', () => {
    fc.assert(
      fc.property(currentArb, desiredArb, (current, desired) => {
        const patch = statusPatch(current, desired, NOW);
        if (!patch) return;
        expect(Object.keys(patch).sort()).toEqual(patch.metadata ? ['metadata', 'status'] : ['status']);
        if (patch.status.conditions && current.metadata?.resourceVersion) expect(patch.metadata).toEqual({ resourceVersion: current.metadata.resourceVersion });
        // Plain JSON: what goes on the wire is what was compared.
        expect(JSON.parse(JSON.stringify(patch))).toEqual(patch);
      }),
    );
  });
});

describe('clearPatch: properties', () => {
  it('removes pier\'s condition and Proxy ingress, leaves the rest, and then has nothing more to do', () => {
    fc.assert(
      fc.property(currentArb, (current) => {
        const patch = clearPatch(current);
        const hadOurs = (current.status?.conditions ?? []).some((c) => c.type === READY_CONDITION);
        if (!hadOurs) {
          expect(patch).toBeUndefined();
          return;
        }
        const after = apply(current, patch);
        expect(after.status?.conditions?.some((c) => c.type === READY_CONDITION) ?? false).toBe(false);
        expect(othersOf(after)).toEqual(othersOf(current));
        expect(after.status?.loadBalancer?.ingress ?? []).toEqual((current.status?.loadBalancer?.ingress ?? []).filter((i) => i.ipMode !== 'Proxy'));
        expect(clearPatch(after)).toBeUndefined();
      }),
    );
  });
});

// ---------------------------------------------------------------------------
// Examples

const ingress = (ip: string, ports: { port: number; protocol: string; error?: string }[] = [{ port: 80, protocol: 'TCP' }]): IngressAssignment => ({ ip, ipMode: 'Proxy', ports });
const serving: ReadyCondition = { status: 'True', reason: 'Serving', message: 'served on 192.0.2.1, port 80/TCP' };

function service(status: V1Service['status'], resourceVersion = '42'): V1Service {
  return { metadata: { namespace: 'default', name: 'web', resourceVersion }, spec: { type: 'LoadBalancer' }, status };
}

describe('statusPatch: examples', () => {
  it('writes ingress and condition to a fresh Service, stamping the transition time', () => {
    expect(statusPatch(service({}), { ingress: [ingress('192.0.2.1')], condition: serving }, NOW)).toEqual({
      metadata: { resourceVersion: '42' },
      status: {
        loadBalancer: { ingress: [{ ip: '192.0.2.1', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }] }] },
        conditions: [{ type: READY_CONDITION, ...serving, lastTransitionTime: '2025-06-01T12:00:00Z' }],
      },
    });
  });

  it('treats a missing ipMode as the server\'s default VIP, which is not pier\'s Proxy', () => {
    const current = service({
      loadBalancer: { ingress: [{ ip: '192.0.2.1', ports: [{ port: 80, protocol: 'TCP' }] }] },
      conditions: [{ type: READY_CONDITION, ...serving, lastTransitionTime: EARLIER }],
    });
    expect(statusPatch(current, { ingress: [ingress('192.0.2.1')], condition: serving }, NOW)).toEqual({
      status: { loadBalancer: { ingress: [{ ip: '192.0.2.1', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }] }] } },
    });
  });

  it('sees absent ports, an empty error and a later transition time as no change', () => {
    const current = service({
      loadBalancer: { ingress: [{ ip: '192.0.2.1', ipMode: 'Proxy' }, { ip: '192.0.2.2', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP', error: '' }] }] },
      conditions: [{ type: READY_CONDITION, ...serving, lastTransitionTime: EARLIER, observedGeneration: 12 }],
    });
    expect(statusPatch(current, { ingress: [ingress('192.0.2.1', []), ingress('192.0.2.2')], condition: serving }, NOW)).toBeUndefined();
  });

  it('keeps the transition time when only the message changes, and replaces pier\'s condition in place', () => {
    const other: V1Condition = { type: 'example.com/Healthy', status: 'True', reason: 'Fine', message: '', lastTransitionTime: EARLIER };
    const current = service({
      loadBalancer: { ingress: [ingress('192.0.2.1')] },
      conditions: [{ type: READY_CONDITION, ...serving, lastTransitionTime: EARLIER }, other],
    });
    const patch = statusPatch(current, { ingress: [ingress('192.0.2.1')], condition: { ...serving, message: 'served on 192.0.2.1, ports 80/TCP' } }, NOW);
    expect(patch).toEqual({
      metadata: { resourceVersion: '42' },
      status: {
        conditions: [
          { type: READY_CONDITION, status: 'True', reason: 'Serving', message: 'served on 192.0.2.1, ports 80/TCP', lastTransitionTime: '2025-05-01T08:30:00Z' },
          { type: 'example.com/Healthy', status: 'True', reason: 'Fine', message: '', lastTransitionTime: '2025-05-01T08:30:00Z' },
        ],
      },
    });
  });

  it('stamps a new transition time when the status flips, and clears ingress with an empty list', () => {
    const current = service({ loadBalancer: { ingress: [ingress('192.0.2.1')] }, conditions: [{ type: READY_CONDITION, ...serving, lastTransitionTime: EARLIER }] });
    const down: ReadyCondition = { status: 'False', reason: 'NoEligibleNodes', message: 'no node can serve IPv4' };
    expect(statusPatch(current, { ingress: [], condition: down }, NOW)).toEqual({
      metadata: { resourceVersion: '42' },
      status: { loadBalancer: { ingress: [] }, conditions: [{ type: READY_CONDITION, ...down, lastTransitionTime: '2025-06-01T12:00:00Z' }] },
    });
  });

  it('brings a Service the allocator served to rest: one write, then none', () => {
    const config = defaultAllocatorConfig();
    const svc: V1Service = {
      metadata: { namespace: 'default', name: 'web', creationTimestamp: EARLIER, resourceVersion: '1' },
      spec: { type: 'LoadBalancer', loadBalancerClass: config.loadBalancerClass, ports: [{ port: 80, protocol: 'TCP' }, { port: 53, protocol: 'UDP' }] },
    };
    const world = {
      nodes: [{ metadata: { name: 'n1' }, status: { addresses: [{ type: 'InternalIP', address: '192.0.2.1' }], conditions: [{ type: 'Ready', status: 'True' }] } }],
      leases: [{ metadata: { name: 'pier-agent-n1', namespace: config.agentNamespace, annotations: { 'pier.dev/forwarding-ipv4': 'true' } }, spec: { renewTime: new Date(NOW.getTime() - 1000) as never, leaseDurationSeconds: 15 } }],
      slices: [],
      now: NOW.getTime(),
      config,
    };
    const first = allocate({ ...world, services: [svc] }).services.get('default/web')!;
    const written = apply(svc, statusPatch(svc, first, NOW));
    const second = allocate({ ...world, services: [written] }).services.get('default/web')!;
    expect(second).toEqual(first);
    expect(statusPatch(written, second, new Date(NOW.getTime() + 60_000))).toBeUndefined();
  });
});

describe('normalizeStatus', () => {
  it('fills in what the server would: ipMode VIP for an address, no ports, no empty error; and drops condition bookkeeping', () => {
    expect(
      normalizeStatus({
        loadBalancer: { ingress: [{ ip: '192.0.2.1' }, { hostname: 'lb.example.com', ports: [{ port: 80, protocol: 'TCP', error: '' }] }] },
        conditions: [{ type: READY_CONDITION, ...serving, lastTransitionTime: EARLIER, observedGeneration: 4 }],
      }),
    ).toEqual({
      ingress: [{ ip: '192.0.2.1', ipMode: 'VIP', ports: [] }, { hostname: 'lb.example.com', ports: [{ port: 80, protocol: 'TCP' }] }],
      conditions: [{ type: READY_CONDITION, ...serving }],
    });
    expect(normalizeStatus(undefined)).toEqual({ ingress: [], conditions: [] });
  });
});

describe('statusPatch: a duplicated condition', () => {
  it('is written back as one, even when the first copy already says the right thing', () => {
    const current = service({
      loadBalancer: { ingress: [ingress('192.0.2.1')] },
      conditions: [
        { type: READY_CONDITION, ...serving, lastTransitionTime: EARLIER },
        { type: READY_CONDITION, status: 'False', reason: 'NoEligibleNodes', message: 'stale', lastTransitionTime: EARLIER },
      ],
    });
    expect(statusPatch(current, { ingress: [ingress('192.0.2.1')], condition: serving }, NOW)).toEqual({
      metadata: { resourceVersion: '42' },
      status: { conditions: [{ type: READY_CONDITION, ...serving, lastTransitionTime: '2025-05-01T08:30:00Z' }] },
    });
  });
});

describe('clearPatch: examples', () => {
  it('leaves a Service pier never wrote alone', () => {
    expect(clearPatch(service({ loadBalancer: { ingress: [{ ip: '203.0.113.9', ipMode: 'Proxy' }] } }))).toBeUndefined();
  });

  it('removes only the addresses the caller says pier may have used', () => {
    const current = service({
      loadBalancer: { ingress: [ingress('192.0.2.1'), ingress('203.0.113.9'), { hostname: 'lb.example.com' }] },
      conditions: [{ type: READY_CONDITION, ...serving, lastTransitionTime: EARLIER }],
    });
    expect(clearPatch(current, (ip) => ip.startsWith('192.0.2.'))).toEqual({
      metadata: { resourceVersion: '42' },
      status: { conditions: [], loadBalancer: { ingress: [{ ip: '203.0.113.9', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }] }, { hostname: 'lb.example.com' }] } },
    });
  });
});

describe('annotationPatch', () => {
  it('sets, keeps and removes the port mapping annotation', () => {
    const svc = (value?: string): V1Service => ({ metadata: { name: 'web', annotations: value === undefined ? {} : { [PORT_MAPPING_ANNOTATION]: value } } });
    expect(annotationPatch(svc(), '{"80/TCP":40000}')).toEqual({ metadata: { annotations: { [PORT_MAPPING_ANNOTATION]: '{"80/TCP":40000}' } } });
    expect(annotationPatch(svc('{"80/TCP":40000}'), '{"80/TCP":40000}')).toBeUndefined();
    expect(annotationPatch(svc('{"80/TCP":40000}'), undefined)).toEqual({ metadata: { annotations: { [PORT_MAPPING_ANNOTATION]: null } } });
    expect(annotationPatch(svc(), undefined)).toBeUndefined();
  });
});
