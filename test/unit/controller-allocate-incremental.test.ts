// reallocate(), the controller's incremental allocation: after any sequence of
// cluster changes it must decide exactly what allocate() decides from
// scratch, while re-judging only the Services a change can affect.
import type { V1EndpointSlice, V1Lease, V1Node, V1Service } from '@kubernetes/client-node';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';

import { allocate, defaultAllocatorConfig, nodeReading, reallocate, type AllocateInput, type Allocation, type AllocatorConfig, type AllocatorState } from '../../controller/allocate.ts';
import { hasWrites, serviceWork } from '../../controller/writes.ts';
import { LEASE_FORWARDING_IPV4, LEASE_FORWARDING_IPV6, MAX_ADDRESSES, PORT_MODE, POOL } from '../../lib/contract.ts';

const NS = 'pier-system';
const NOW = 1_000_000;
const CREATED = Date.parse('2025-01-01T00:00:00Z');
const NODE_COUNT = 10;
const SERVICE_NAMES = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'];

// ---------------------------------------------------------------------------
// A world of plain specs, turned into API objects; each change makes new objects, as informers do.

interface NodeSpec {
  ready: boolean;
  excluded: boolean;
  pool?: string;
  /** Index into a small address space, so that nodes sometimes share one. */
  v4?: number | null;
  v6?: number | null;
  external4?: number | null;
}
interface LeaseSpec {
  fresh: boolean;
  fwd4: boolean;
  fwd6: boolean;
}
interface ServiceSpec {
  ports: { port: number; protocol: string; nodePort?: number | null }[];
  families: string[];
  local: boolean;
  pool?: string;
  mode?: string;
  max?: string;
  lbIP?: string;
  created: number;
  cls?: string;
}
interface World {
  nodes: Map<number, V1Node>;
  leases: Map<number, { lease: V1Lease; fresh: boolean }>;
  services: Map<string, V1Service>;
  slices: Map<string, V1EndpointSlice>;
}

const nodeName = (i: number) => `node-${i}`;

function nodeObject(i: number, n: NodeSpec): V1Node {
  const addresses = [];
  if (n.external4 != null) addresses.push({ type: 'ExternalIP', address: `203.0.113.${n.external4}` });
  if (n.v4 != null) addresses.push({ type: 'InternalIP', address: `192.0.2.${n.v4}` });
  if (n.v6 != null) addresses.push({ type: 'InternalIP', address: `2001:db8::${n.v6.toString(16)}` });
  return {
    metadata: { name: nodeName(i), labels: { ...(n.excluded ? { 'node.kubernetes.io/exclude-from-external-load-balancers': '' } : {}), ...(n.pool ? { [POOL]: n.pool } : {}) } },
    status: { addresses, conditions: [{ type: 'Ready', status: n.ready ? 'True' : 'False' }] },
  };
}

function leaseObject(i: number, l: LeaseSpec): V1Lease {
  return {
    metadata: { name: `pier-agent-${nodeName(i)}`, namespace: NS, annotations: { [LEASE_FORWARDING_IPV4]: String(l.fwd4), [LEASE_FORWARDING_IPV6]: String(l.fwd6) } },
    spec: { leaseDurationSeconds: 15 },
  };
}

function serviceObject(name: string, s: ServiceSpec, status?: V1Service['status']): V1Service {
  const annotations: Record<string, string> = {};
  if (s.pool) annotations[POOL] = s.pool;
  if (s.mode) annotations[PORT_MODE] = s.mode;
  if (s.max) annotations[MAX_ADDRESSES] = s.max;
  return {
    metadata: { namespace: 'ns', name, uid: `uid-${name}`, creationTimestamp: new Date(CREATED + s.created * 1000) as never, annotations },
    spec: {
      type: 'LoadBalancer',
      ...(s.cls !== '' ? { loadBalancerClass: s.cls ?? 'pier.dev/lb' } : {}),
      ports: s.ports.map((p, i) => ({ name: `p${i}`, port: p.port, protocol: p.protocol, ...(p.nodePort ? { nodePort: p.nodePort } : {}) })),
      ipFamilies: s.families,
      externalTrafficPolicy: s.local ? 'Local' : 'Cluster',
      ...(s.lbIP ? { loadBalancerIP: s.lbIP } : {}),
    },
    status: status ?? { loadBalancer: {} },
  };
}

function sliceObject(name: string, endpoints: { node: number; ready: boolean; v6: boolean }[]): V1EndpointSlice {
  return {
    addressType: 'IPv4',
    metadata: { namespace: 'ns', name: `${name}-x`, labels: { 'kubernetes.io/service-name': name } },
    // Both families in one list is not what the API makes; the allocator reads only nodeName and conditions, and each family is its own slice below.
    endpoints: endpoints.filter((e) => !e.v6).map((e, j) => ({ addresses: [`10.0.0.${j + 1}`], nodeName: nodeName(e.node), conditions: { ready: e.ready, serving: true } })),
  };
}

function slice6Object(name: string, endpoints: { node: number; ready: boolean; v6: boolean }[]): V1EndpointSlice {
  return {
    addressType: 'IPv6',
    metadata: { namespace: 'ns', name: `${name}-y`, labels: { 'kubernetes.io/service-name': name } },
    endpoints: endpoints.filter((e) => e.v6).map((e, j) => ({ addresses: [`fd00::${j + 1}`], nodeName: nodeName(e.node), conditions: { ready: e.ready } })),
  };
}

function input(w: World, config: AllocatorConfig): AllocateInput {
  return {
    nodes: [...w.nodes.values()],
    leases: [...w.leases.values()].map((l) => l.lease),
    leaseFreshUntil: new Map([...w.leases.values()].map((l) => [l.lease.metadata!.name!, l.fresh ? NOW + 1 : NOW - 1])),
    services: [...w.services.values()],
    slices: [...w.slices.values()],
    now: NOW,
    config,
  };
}

// ---------------------------------------------------------------------------
// Generators

const nodeArb: fc.Arbitrary<NodeSpec> = fc.record(
  {
    ready: fc.constantFrom(true, true, true, true, false),
    excluded: fc.constantFrom(false, false, false, false, false, true),
    pool: fc.constantFrom(undefined, undefined, undefined, undefined, 'b'),
    v4: fc.option(fc.integer({ min: 1, max: 14 }), { freq: 8 }),
    v6: fc.option(fc.integer({ min: 1, max: 14 }), { freq: 2 }),
    external4: fc.option(fc.integer({ min: 1, max: 3 }), { freq: 6 }),
  },
  { requiredKeys: ['ready', 'excluded'] },
);
const leaseArb: fc.Arbitrary<LeaseSpec> = fc.record({ fresh: fc.constantFrom(true, true, true, true, false), fwd4: fc.constantFrom(true, true, true, true, true, false), fwd6: fc.boolean() });
const portArb = fc.record(
  {
    port: fc.constantFrom(80, 80, 443, 22, 40000, 40001, 8080),
    protocol: fc.constantFrom('TCP', 'TCP', 'UDP'),
    nodePort: fc.option(fc.constantFrom(40000, 40001, 31000), { freq: 6 }),
  },
  { requiredKeys: ['port', 'protocol'] },
);
const serviceArb: fc.Arbitrary<ServiceSpec> = fc.record(
  {
    ports: fc.uniqueArray(portArb, { selector: (p) => `${p.port}/${p.protocol}`, minLength: 0, maxLength: 3 }),
    families: fc.constantFrom(['IPv4'], ['IPv4'], ['IPv4'], ['IPv6'], ['IPv4', 'IPv6']),
    local: fc.constantFrom(false, false, true),
    pool: fc.constantFrom(undefined, undefined, undefined, undefined, 'b'),
    mode: fc.constantFrom(undefined, undefined, 'allocate', 'bogus'),
    max: fc.constantFrom(undefined, undefined, undefined, '1', '3', 'all', 'x'),
    lbIP: fc.constantFrom(undefined, undefined, undefined, undefined, undefined, undefined, '192.0.2.3', '203.0.113.1'),
    created: fc.integer({ min: 0, max: 3 }),
    cls: fc.constantFrom(undefined, undefined, undefined, undefined, 'other.example/lb', ''),
  },
  { requiredKeys: ['ports', 'families', 'local', 'created'] },
);
const endpointsArb = fc.array(fc.record({ node: fc.integer({ min: 0, max: NODE_COUNT - 1 }), ready: fc.constantFrom(true, true, false), v6: fc.constantFrom(false, false, true) }), { maxLength: 4 });

type Op =
  | { kind: 'addNode'; i: number; node: NodeSpec; lease: LeaseSpec | null }
  | { kind: 'removeNode'; i: number }
  | { kind: 'ready'; i: number; ready: boolean }
  | { kind: 'node'; i: number; node: NodeSpec }
  | { kind: 'lease'; i: number; lease: LeaseSpec | null }
  | { kind: 'expire'; i: number }
  | { kind: 'putService'; name: string; svc: ServiceSpec }
  | { kind: 'deleteService'; name: string }
  | { kind: 'slices'; name: string; endpoints: { node: number; ready: boolean; v6: boolean }[] }
  | { kind: 'writeBack' }
  | { kind: 'noop' };

const nodeIndex = fc.integer({ min: 0, max: NODE_COUNT - 1 });
const serviceName = fc.constantFrom(...SERVICE_NAMES);
const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 3, arbitrary: fc.record({ kind: fc.constant('addNode' as const), i: nodeIndex, node: nodeArb, lease: fc.option(leaseArb, { freq: 8 }) }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('removeNode' as const), i: nodeIndex }) },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant('ready' as const), i: nodeIndex, ready: fc.boolean() }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('node' as const), i: nodeIndex, node: nodeArb }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('lease' as const), i: nodeIndex, lease: fc.option(leaseArb, { freq: 6 }) }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('expire' as const), i: nodeIndex }) },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant('putService' as const), name: serviceName, svc: serviceArb }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('deleteService' as const), name: serviceName }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('slices' as const), name: serviceName, endpoints: endpointsArb }) },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant('writeBack' as const) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('noop' as const) }) },
);

const specs = new WeakMap<V1Node, NodeSpec>();
const leaseSpecs = new WeakMap<V1Lease, LeaseSpec>();

function addNode(w: World, i: number, node: NodeSpec, lease: LeaseSpec | null): void {
  const n = nodeObject(i, node);
  specs.set(n, node);
  w.nodes.set(i, n);
  if (lease) setLease(w, i, lease);
}

function setLease(w: World, i: number, lease: LeaseSpec | null): void {
  if (!lease) {
    w.leases.delete(i);
    return;
  }
  const l = leaseObject(i, lease);
  leaseSpecs.set(l, lease);
  w.leases.set(i, { lease: l, fresh: lease.fresh });
}

/** RFC 7386, as the API server applies the controller's merge patches. */
function mergePatch(target: unknown, patch: unknown): unknown {
  if (typeof patch !== 'object' || patch === null || Array.isArray(patch)) return patch;
  const out: Record<string, unknown> = typeof target === 'object' && target !== null && !Array.isArray(target) ? { ...(target as Record<string, unknown>) } : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

/** The Services as the controller's writes leave them: each patched only where it differs. */
function writeBack(w: World, a: Allocation): void {
  for (const [name, svc] of w.services) {
    const work = serviceWork(svc, a.services.get(`ns/${name}`), { ipModeDropped: false, now: new Date(CREATED) });
    if (!hasWrites(work)) continue;
    w.services.set(name, mergePatch(mergePatch(svc, work.status ?? {}), work.annotation ?? {}) as V1Service);
  }
}

function apply(w: World, op: Op, last: Allocation): void {
  switch (op.kind) {
    case 'addNode':
      if (!w.nodes.has(op.i)) addNode(w, op.i, op.node, op.lease);
      return;
    case 'removeNode':
      w.nodes.delete(op.i);
      w.leases.delete(op.i);
      return;
    case 'ready': {
      const n = w.nodes.get(op.i);
      if (n) addNode(w, op.i, { ...specs.get(n)!, ready: op.ready }, null);
      return;
    }
    case 'node':
      if (w.nodes.has(op.i)) addNode(w, op.i, op.node, null);
      return;
    case 'lease':
      if (w.nodes.has(op.i)) setLease(w, op.i, op.lease);
      return;
    case 'expire': {
      // The same Lease object, judged expired: no object changes, only the time.
      const l = w.leases.get(op.i);
      if (l) w.leases.set(op.i, { ...l, fresh: false });
      return;
    }
    case 'putService': {
      const before = w.services.get(op.name);
      w.services.set(op.name, serviceObject(op.name, op.svc, before?.status));
      return;
    }
    case 'deleteService':
      w.services.delete(op.name);
      w.slices.delete(op.name);
      w.slices.delete(`${op.name}/6`);
      return;
    case 'slices':
      w.slices.set(op.name, sliceObject(op.name, op.endpoints));
      w.slices.set(`${op.name}/6`, slice6Object(op.name, op.endpoints));
      return;
    case 'writeBack':
      writeBack(w, last);
      return;
    case 'noop':
      return;
  }
}

function emptyWorld(): World {
  return { nodes: new Map(), leases: new Map(), services: new Map(), slices: new Map() };
}

function expectSame(got: Allocation, want: Allocation): void {
  expect([...got.services.keys()]).toEqual([...want.services.keys()]);
  expect(got.services).toEqual(want.services);
}

// ---------------------------------------------------------------------------

describe('reallocate: equal to allocate() from scratch', () => {
  it('after every step of any sequence of node, Lease, Service, slice and status changes', () => {
    fc.assert(
      fc.property(
        fc.record({
          k: fc.constantFrom(1, 2, 3, Number.POSITIVE_INFINITY),
          initialNodes: fc.array(fc.tuple(nodeArb, fc.option(leaseArb, { freq: 8 })), { minLength: 0, maxLength: NODE_COUNT }),
          initialServices: fc.array(fc.tuple(serviceName, serviceArb), { maxLength: 6 }),
          ops: fc.array(opArb, { minLength: 1, maxLength: 30 }),
        }),
        ({ k, initialNodes, initialServices, ops }) => {
          const config = defaultAllocatorConfig({ maxAddresses: k, reservedPorts: [{ from: 22, to: 22 }], allocateRange: { from: 40000, to: 40003 } });
          const w = emptyWorld();
          initialNodes.forEach(([n, l], i) => addNode(w, i, n, l));
          for (const [name, s] of initialServices) w.services.set(name, serviceObject(name, s));
          let state: AllocatorState | undefined;
          let last: Allocation = { services: new Map() };
          for (const op of [{ kind: 'noop' } as Op, ...ops]) {
            apply(w, op, last);
            const inp = input(w, config);
            const want = allocate(inp);
            const got = reallocate(inp, state);
            expectSame(got, want);
            state = got.state;
            last = want;
          }
          // Nothing changed: nothing re-judged, and the very same results.
          const again = reallocate(input(w, config), state);
          expect(again.rejudged).toBe(0);
          for (const [key, a] of again.services) expect(a).toBe(state!.services.get(key)?.result ?? state!.services.get(key)?.invalid);
        },
      ),
      { numRuns: 1000 },
    );
  });
});

// ---------------------------------------------------------------------------
// nodeReading(): the controller skips a Node update whose reading is unchanged.

/** What a kubelet's write changes besides what allocation reads: heartbeat times, other conditions, labels, annotations, its Hostname. */
interface NodeNoise {
  heartbeat: number;
  version: number;
  pressure: boolean;
  label?: string;
  annotation?: string;
  hostname: boolean;
}
const noiseArb: fc.Arbitrary<NodeNoise> = fc.record(
  { heartbeat: fc.integer({ min: 0, max: 1e6 }), version: fc.nat(), pressure: fc.boolean(), label: fc.constantFrom('a', 'b'), annotation: fc.constantFrom('x', 'y'), hostname: fc.boolean() },
  { requiredKeys: ['heartbeat', 'version', 'pressure', 'hostname'] },
);

function noisyNode(i: number, n: NodeSpec, noise: NodeNoise): V1Node {
  const base = nodeObject(i, n);
  const at = new Date(CREATED + noise.heartbeat * 1000);
  return {
    metadata: {
      ...base.metadata,
      resourceVersion: String(noise.version),
      labels: { ...base.metadata!.labels, ...(noise.label ? { 'example.com/rack': noise.label } : {}) },
      ...(noise.annotation ? { annotations: { 'example.com/note': noise.annotation } } : {}),
    },
    status: {
      addresses: [...base.status!.addresses!, ...(noise.hostname ? [{ type: 'Hostname', address: nodeName(i) }] : [])],
      conditions: [
        ...(noise.pressure ? [{ type: 'MemoryPressure', status: 'False', lastHeartbeatTime: at }] : []),
        ...base.status!.conditions!.map((c) => ({ ...c, lastHeartbeatTime: at, reason: 'KubeletReady' })),
      ],
    },
  };
}

describe('nodeReading: what a Node update must change to cost an allocation', () => {
  it('a write that changes only what allocation does not read reads the same; two Nodes that read the same allocate the same', () => {
    fc.assert(
      fc.property(
        fc.record({
          k: fc.constantFrom(1, 2, Number.POSITIVE_INFINITY),
          nodes: fc.array(fc.tuple(nodeArb, fc.option(leaseArb, { freq: 8 })), { minLength: 1, maxLength: 6 }),
          services: fc.array(fc.tuple(serviceName, serviceArb), { maxLength: 4 }),
          a: fc.tuple(nodeArb, noiseArb),
          b: fc.tuple(fc.option(nodeArb, { freq: 2 }), noiseArb),
        }),
        ({ k, nodes, services, a, b }) => {
          const config = defaultAllocatorConfig({ maxAddresses: k });
          const w = emptyWorld();
          nodes.forEach(([n, l], i) => addNode(w, i, n, l));
          for (const [name, svc] of services) w.services.set(name, serviceObject(name, svc));
          // Node 0 as written twice: by a heartbeat only (b's spec is null), or changed.
          const first = noisyNode(0, a[0], a[1]);
          const second = noisyNode(0, b[0] ?? a[0], b[1]);
          if (b[0] === null) expect(nodeReading(second, config)).toBe(nodeReading(first, config));
          if (nodeReading(second, config) !== nodeReading(first, config)) return;
          w.nodes.set(0, first);
          const before = allocate(input(w, config));
          w.nodes.set(0, second);
          expectSame(allocate(input(w, config)), before);
        },
      ),
      { numRuns: 500 },
    );
  });

  it('reads a change of readiness, pool, exclusion or addresses', () => {
    const config = defaultAllocatorConfig();
    const spec: NodeSpec = { ready: true, excluded: false, v4: 1 };
    const read = (n: NodeSpec) => nodeReading(nodeObject(0, n), config);
    const changes: NodeSpec[] = [{ ...spec, ready: false }, { ...spec, pool: 'b' }, { ...spec, excluded: true }, { ...spec, v4: 2 }, { ...spec, external4: 1 }, { ...spec, v6: 1 }];
    for (const c of changes) expect(read(c)).not.toBe(read(spec));
  });
});

// ---------------------------------------------------------------------------
// Examples at a scale where only K of the nodes are listed.

function bigWorld(nodes: number, services: number): World {
  const w = emptyWorld();
  for (let i = 0; i < nodes; i++) addNode(w, i, { ready: true, excluded: false, v4: undefined }, { fresh: true, fwd4: true, fwd6: true });
  // Addresses unique per node: 198.18.0.0/15.
  for (let i = 0; i < nodes; i++) w.nodes.set(i, { ...w.nodes.get(i)!, status: { ...w.nodes.get(i)!.status, addresses: [{ type: 'InternalIP', address: `198.18.${i >> 8}.${i & 255}` }] } });
  for (let i = 0; i < services; i++) {
    const name = `svc-${i}`;
    w.services.set(name, serviceObject(name, { ports: [{ port: 1024 + i, protocol: 'TCP' }], families: ['IPv4'], local: false, created: i }));
  }
  return w;
}

function setReady(w: World, i: number, ready: boolean): void {
  const n = w.nodes.get(i)!;
  w.nodes.set(i, { ...n, status: { ...n.status, conditions: [{ type: 'Ready', status: ready ? 'True' : 'False' }] } });
}

describe('reallocate: what a change re-judges', () => {
  const config = defaultAllocatorConfig({ maxAddresses: 3 });

  it("a node's loss re-judges and changes only the Services that listed it; its return moves nothing back", () => {
    const w = bigWorld(60, 300);
    const first = reallocate(input(w, config));
    expect(first.rejudged).toBe(300);
    writeBack(w, first);
    const settled = reallocate(input(w, config), first.state);
    const victim = '198.18.0.7';
    const listing = [...settled.services].filter(([, a]) => a.ingress.some((x) => x.ip === victim)).map(([k]) => k);
    expect(listing.length).toBeGreaterThan(0);

    setReady(w, 7, false);
    const lost = reallocate(input(w, config), settled.state);
    expectSame(lost, allocate(input(w, config)));
    // Those that listed it, and those whose ranked window held it: a handful beyond the listing.
    expect(lost.rejudged).toBeGreaterThanOrEqual(listing.length);
    expect(lost.rejudged).toBeLessThan(300 / 4);
    const changed = [...lost.services].filter(([k, a]) => JSON.stringify(a) !== JSON.stringify(settled.services.get(k))).map(([k]) => k);
    expect(changed.sort()).toEqual([...listing].sort());

    writeBack(w, lost);
    setReady(w, 7, true);
    const back = reallocate(input(w, config), reallocate(input(w, config), lost.state).state);
    expectSame(back, allocate(input(w, config)));
    // Statuses keep what they list while it stays valid: nothing has a status to rewrite.
    for (const svc of w.services.values()) expect(hasWrites(serviceWork(svc, back.services.get(`ns/${svc.metadata!.name}`), { ipModeDropped: false }))).toBe(false);
  });

  it('one new Service is the only one judged; one deleted judges none', () => {
    const w = bigWorld(60, 300);
    const first = reallocate(input(w, config));
    w.services.set('new', serviceObject('new', { ports: [{ port: 9999, protocol: 'TCP' }], families: ['IPv4'], local: false, created: 999 }));
    const added = reallocate(input(w, config), first.state);
    expect(added.rejudged).toBe(1);
    expectSame(added, allocate(input(w, config)));
    w.services.delete('svc-5');
    const deleted = reallocate(input(w, config), added.state);
    expect(deleted.rejudged).toBe(0);
    expectSame(deleted, allocate(input(w, config)));
  });

  it('a restarted controller, fed the statuses it wrote, rewrites nothing', () => {
    const w = bigWorld(60, 300);
    const first = reallocate(input(w, config));
    writeBack(w, first);
    // A new process: no state at all.
    const restarted = reallocate(input(w, config));
    expectSame(restarted, allocate(input(w, config)));
    for (const svc of w.services.values()) expect(hasWrites(serviceWork(svc, restarted.services.get(`ns/${svc.metadata!.name}`), { ipModeDropped: false }))).toBe(false);
  });

  it('keeps reporting a Service it cannot read, run after run, as allocate() does', () => {
    const w = bigWorld(20, 5);
    const bad = serviceObject('bad', { ports: [{ port: 81, protocol: 'TCP' }], families: ['IPv4'], local: false, created: 0 });
    Object.defineProperty(bad.spec, 'ports', { get: () => { throw new Error('no ports today'); } });
    w.services.set('bad', bad);
    let state: AllocatorState | undefined;
    for (const step of [() => {}, () => setReady(w, 3, false), () => {}]) {
      step();
      const out = reallocate(input(w, config), state);
      expectSame(out, allocate(input(w, config)));
      expect(out.services.get('ns/bad')!.condition.reason).toBe('InvalidService');
      state = out.state;
    }
  });

  it('another configuration judges everything again', () => {
    const w = bigWorld(20, 30);
    const first = reallocate(input(w, config));
    const other = defaultAllocatorConfig({ maxAddresses: 5 });
    const second = reallocate(input(w, other), first.state);
    expect(second.rejudged).toBe(30);
    expectSame(second, allocate(input(w, other)));
  });
});
