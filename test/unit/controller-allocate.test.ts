// The controller's allocation as a pure function: generated clusters checked
// against properties (and against a small independent oracle for which nodes
// may serve a Service), then readable examples of each rule.
import type { V1EndpointSlice, V1Lease, V1Node, V1Service } from '@kubernetes/client-node';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';

import {
  DEFAULT_RESERVED_PORTS,
  PORT_MAPPING_ANNOTATION,
  allocate,
  defaultAllocatorConfig,
  hashText,
  judgeNodes,
  parseMaxAddresses,
  rendezvousScore,
  type AllocateInput,
  type Allocation,
  type AllocatorConfig,
  type ServiceAllocation,
} from '../../controller/allocate.ts';
import { hasWrites, newProblems, problemKey, serviceWork } from '../../controller/writes.ts';
import { LEASE_FORWARDING_IPV4, LEASE_FORWARDING_IPV6, PORT_MODE, POOL } from '../../lib/contract.ts';

const CLASS = 'pier.dev/lb';
const NS = 'pier-system';
const NOW = Date.parse('2025-06-01T12:00:00Z');
const BASE = Date.parse('2025-01-01T00:00:00Z');
const EXCLUDE = 'node.kubernetes.io/exclude-from-external-load-balancers';

// ---------------------------------------------------------------------------
// Builders

interface NodeSpec {
  name: string;
  /** In the order the kubelet would list them. */
  addresses: { type: 'InternalIP' | 'ExternalIP'; address: string }[];
  ready: boolean;
  excluded: boolean;
  pool: string | undefined;
  lease: 'fresh' | 'stale' | 'missing';
  forward: { ipv4: boolean; ipv6: boolean };
}

function nodeObject(n: NodeSpec): V1Node {
  return {
    metadata: { name: n.name, labels: { 'kubernetes.io/hostname': n.name, ...(n.excluded ? { [EXCLUDE]: '' } : {}), ...(n.pool !== undefined ? { [POOL]: n.pool } : {}) } },
    status: {
      addresses: [...n.addresses, { type: 'Hostname', address: n.name }],
      conditions: [{ type: 'Ready', status: n.ready ? 'True' : 'False' }],
    },
  };
}

function leaseObject(n: NodeSpec): V1Lease | undefined {
  if (n.lease === 'missing') return undefined;
  return {
    metadata: {
      name: `pier-agent-${n.name}`,
      namespace: NS,
      annotations: { [LEASE_FORWARDING_IPV4]: String(n.forward.ipv4), [LEASE_FORWARDING_IPV6]: String(n.forward.ipv6) },
    },
    spec: { holderIdentity: n.name, leaseDurationSeconds: 15, renewTime: new Date(n.lease === 'fresh' ? NOW - 5_000 : NOW - 60_000) as never },
  };
}

interface PortSpec {
  port: number;
  protocol: 'TCP' | 'UDP' | 'SCTP';
  nodePort?: number;
  name?: string;
}

interface Endpoint {
  node: string;
  v6: boolean;
  ready: boolean | undefined;
  /** Absent unless set, as from an EndpointSlice controller older than 1.22. */
  serving?: boolean;
  terminating?: boolean;
}

interface ServiceSpec {
  namespace: string;
  name: string;
  type: string;
  cls: string | undefined;
  ports: PortSpec[];
  families: string[] | undefined;
  local: boolean;
  pool: string | undefined;
  mode: string | undefined;
  lbIP: string | undefined;
  created: number;
  endpoints: Endpoint[];
  /** Whatever a previous controller (or a person) left in the status. */
  status: { ip: string; ports: { port: number; protocol: string; error?: string }[] }[];
  /** Any other annotations (pier.dev/max-addresses). */
  annotations?: Record<string, string>;
}

function serviceObject(s: ServiceSpec): V1Service {
  const annotations: Record<string, string> = { ...s.annotations };
  if (s.pool !== undefined) annotations[POOL] = s.pool;
  if (s.mode !== undefined) annotations[PORT_MODE] = s.mode;
  return {
    metadata: { namespace: s.namespace, name: s.name, creationTimestamp: new Date(BASE + s.created * 1000), annotations },
    spec: {
      type: s.type,
      ...(s.cls !== undefined ? { loadBalancerClass: s.cls } : {}),
      ports: s.ports.map((p, i) => ({ name: p.name ?? `p${i}`, port: p.port, protocol: p.protocol, targetPort: p.port as never, ...(p.nodePort ? { nodePort: p.nodePort } : {}) })),
      ...(s.families ? { ipFamilies: s.families } : {}),
      externalTrafficPolicy: s.local ? 'Local' : 'Cluster',
      ...(s.lbIP !== undefined ? { loadBalancerIP: s.lbIP } : {}),
    },
    status: { loadBalancer: { ingress: s.status.map((i) => ({ ip: i.ip, ipMode: 'Proxy', ports: i.ports })) } },
  };
}

function sliceObjects(s: ServiceSpec): V1EndpointSlice[] {
  return (['IPv4', 'IPv6'] as const).map((addressType) => ({
    addressType,
    metadata: { namespace: s.namespace, name: `${s.name}-${addressType.toLowerCase()}`, labels: { 'kubernetes.io/service-name': s.name } },
    endpoints: s.endpoints
      .filter((e) => e.v6 === (addressType === 'IPv6'))
      .map((e, i) => ({ addresses: [e.v6 ? `2001:db8:99::${i + 1}` : `203.0.113.${i + 1}`], nodeName: e.node, conditions: conditionsOf(e) })),
    ports: s.ports.map((p, i) => ({ name: p.name ?? `p${i}`, port: p.port, protocol: p.protocol })),
  }));
}

function conditionsOf(e: Endpoint): { ready?: boolean; serving?: boolean; terminating?: boolean } {
  return {
    ...(e.ready !== undefined ? { ready: e.ready } : {}),
    ...(e.serving !== undefined ? { serving: e.serving } : {}),
    ...(e.terminating !== undefined ? { terminating: e.terminating } : {}),
  };
}

interface World {
  nodes: NodeSpec[];
  services: ServiceSpec[];
  config: AllocatorConfig;
}

function input(w: World, services: V1Service[] = w.services.map(serviceObject)): AllocateInput {
  return {
    services,
    nodes: w.nodes.map(nodeObject),
    slices: w.services.flatMap(sliceObjects),
    leases: w.nodes.map(leaseObject).filter((l): l is V1Lease => l !== undefined),
    now: NOW,
    config: w.config,
  };
}

/** The Services as the writer would leave them: status and mapping annotation set from the allocation. */
function feedBack(services: V1Service[], allocation: Allocation, annotations = true): V1Service[] {
  return services.map((svc) => {
    const a = allocation.services.get(`${svc.metadata!.namespace}/${svc.metadata!.name}`);
    if (!a) return svc;
    const out = structuredClone(svc);
    out.status = {
      loadBalancer: { ingress: a.ingress.map((i) => ({ ip: i.ip, ipMode: i.ipMode, ports: i.ports.map((p) => ({ ...p })) })) },
      conditions: [{ type: 'pier.dev/Ready', ...a.condition, lastTransitionTime: new Date(NOW) }],
    };
    const ann = { ...out.metadata!.annotations };
    delete ann[PORT_MAPPING_ANNOTATION];
    if (annotations && a.portMapping !== undefined) ann[PORT_MAPPING_ANNOTATION] = a.portMapping;
    out.metadata!.annotations = ann;
    return out;
  });
}

// ---------------------------------------------------------------------------
// Generators

const NODE_NAMES = ['n0', 'n1', 'n2', 'n3', 'n4'];

/** `arb` `percent` of the time, else undefined. */
const maybe = <T,>(arb: fc.Arbitrary<T>, percent: number): fc.Arbitrary<T | undefined> =>
  fc.oneof({ arbitrary: arb, weight: percent }, { arbitrary: fc.constant(undefined), weight: 100 - percent });

const nodeArb = (name: string) =>
  fc
    .record({
      internal4: maybe(fc.integer({ min: 1, max: 6 }), 85),
      external4: maybe(fc.integer({ min: 1, max: 12 }), 30),
      internal6: maybe(fc.integer({ min: 1, max: 12 }), 50),
      external6: maybe(fc.integer({ min: 1, max: 12 }), 20),
      externalFirst: fc.boolean(),
      // Each way of being ineligible is rare on its own, so that most clusters serve something.
      notReady: fc.integer({ min: 0, max: 9 }),
      excluded: fc.integer({ min: 0, max: 11 }),
      pool: fc.oneof({ arbitrary: fc.constant(undefined), weight: 14 }, { arbitrary: fc.constantFrom('a', 'a', 'a', 'a', 'b', ''), weight: 6 }),
      lease: fc.constantFrom('fresh', 'fresh', 'fresh', 'fresh', 'fresh', 'fresh', 'fresh', 'stale', 'missing') as fc.Arbitrary<NodeSpec['lease']>,
      fwd4: fc.integer({ min: 0, max: 9 }),
      fwd6: fc.integer({ min: 0, max: 5 }),
    })
    .map((r): NodeSpec => {
      const internal: NodeSpec['addresses'] = [];
      const external: NodeSpec['addresses'] = [];
      if (r.internal4 !== undefined) internal.push({ type: 'InternalIP', address: `192.0.2.${r.internal4}` });
      if (r.internal6 !== undefined) internal.push({ type: 'InternalIP', address: `2001:db8::${r.internal6.toString(16)}` });
      if (r.external4 !== undefined) external.push({ type: 'ExternalIP', address: `198.51.100.${r.external4}` });
      if (r.external6 !== undefined) external.push({ type: 'ExternalIP', address: `2001:db8:1:0::${r.external6.toString(16)}` });
      return {
        name,
        addresses: r.externalFirst ? [...external, ...internal] : [...internal, ...external],
        ready: r.notReady !== 0,
        excluded: r.excluded === 0,
        pool: r.pool,
        lease: r.lease,
        forward: { ipv4: r.fwd4 !== 0, ipv6: r.fwd6 !== 0 },
      };
    });

const portArb: fc.Arbitrary<PortSpec> = fc.record({
  // Few values, so that Services collide; some reserved, some inside the allocation range, one a NodePort.
  port: fc.constantFrom(80, 22, 53, 80, 443, 80, 6443, 8080, 40000, 40001, 40002, 31000),
  protocol: fc.constantFrom('TCP', 'TCP', 'UDP', 'SCTP') as fc.Arbitrary<PortSpec['protocol']>,
  nodePort: maybe(fc.constantFrom(31000, 30080, 40000, 40001, 40003), 30),
});

const statusArb = fc.array(
  fc.record({
    ip: fc.constantFrom('192.0.2.1', '192.0.2.2', '198.51.100.3', '2001:db8::1', '203.0.113.200'),
    // Mostly ports the allocation range could hold, so that remembering them matters.
    ports: fc.array(fc.record({ port: fc.integer({ min: 39999, max: 40004 }), protocol: fc.constantFrom('TCP', 'TCP', 'TCP', 'UDP', 'SCTP') }), { maxLength: 4 }),
  }),
  { maxLength: 3 },
);

const serviceArb: fc.Arbitrary<ServiceSpec> = fc.record({
  namespace: fc.constantFrom('ns1', 'ns2'),
  name: fc.constantFrom('a', 'b', 'c', 'd', 'e', 'f', 'g'),
  type: fc.constantFrom('LoadBalancer', 'LoadBalancer', 'LoadBalancer', 'LoadBalancer', 'LoadBalancer', 'LoadBalancer', 'NodePort', 'ClusterIP'),
  cls: fc.constantFrom(CLASS, CLASS, CLASS, CLASS, CLASS, undefined, 'other.example/lb'),
  // Unique by port and protocol, as the API server requires.
  ports: fc.oneof(
    { arbitrary: fc.uniqueArray(portArb, { selector: (p) => `${p.port}/${p.protocol}`, minLength: 1, maxLength: 4 }), weight: 19 },
    { arbitrary: fc.constant<PortSpec[]>([]), weight: 1 },
  ),
  families: fc.constantFrom(undefined, ['IPv4'], ['IPv4'], ['IPv6'], ['IPv4', 'IPv6'], ['IPv6', 'IPv4']),
  local: fc.oneof({ arbitrary: fc.constant(false), weight: 3 }, { arbitrary: fc.constant(true), weight: 1 }),
  pool: fc.oneof({ arbitrary: fc.constant(undefined), weight: 9 }, { arbitrary: fc.constantFrom('a', 'a', 'b'), weight: 1 }),
  mode: fc.constantFrom(undefined, undefined, 'service', 'allocate', 'allocate', 'Allocate!'),
  lbIP: maybe(fc.constantFrom('192.0.2.1', '192.0.2.2', '192.0.2.3', '198.51.100.1', '2001:db8::1', '2001:db8:0::2', '203.0.113.99', 'not-an-ip'), 10),
  created: fc.integer({ min: 0, max: 4 }),
  endpoints: fc.array(
    fc.record({
      node: fc.constantFrom(...NODE_NAMES, 'gone'),
      v6: fc.boolean(),
      // Ready, not ready, nil, and a terminating pod that still serves or no longer does.
      conditions: fc.constantFrom<Omit<Endpoint, 'node' | 'v6'>[]>(
        { ready: true },
        { ready: true, serving: true, terminating: false },
        { ready: false },
        { ready: undefined },
        { ready: false, serving: true, terminating: true },
        { ready: false, serving: false, terminating: true },
      ),
    }).map(({ conditions, ...e }): Endpoint => ({ ...e, ...conditions })),
    { maxLength: 6 },
  ),
  status: statusArb,
});

const configArb: fc.Arbitrary<AllocatorConfig> = fc.record({
  defaultClass: fc.boolean(),
  size: fc.integer({ min: 0, max: 8 }),
  reserveOne: fc.boolean(),
}).map(({ defaultClass, size, reserveOne }) =>
  defaultAllocatorConfig({
    defaultClass,
    // Small, and overlapping the generated NodePorts, so exhaustion and avoidance both happen.
    allocateRange: { from: 40000, to: 40000 + size },
    reservedPorts: reserveOne ? [...DEFAULT_RESERVED_PORTS, { from: 40002, to: 40002 }] : DEFAULT_RESERVED_PORTS,
  }),
);

/** Unique Service names, and NodePorts unique across Services (both as the API server enforces). */
function apiValid(services: ServiceSpec[]): ServiceSpec[] {
  const seen = new Set<string>();
  const nodePorts = new Set<number>();
  const out: ServiceSpec[] = [];
  for (const s of services) {
    const key = `${s.namespace}/${s.name}`;
    if (seen.has(key)) continue;
    seen.add(key);
    const ports = s.ports.map((p) => {
      if (p.nodePort === undefined) return p;
      if (s.type === 'ClusterIP' || nodePorts.has(p.nodePort)) return { ...p, nodePort: undefined };
      nodePorts.add(p.nodePort);
      return p;
    });
    out.push({ ...s, ports });
  }
  return out;
}

const worldArb: fc.Arbitrary<World> = fc.record({
  nodeCount: fc.constantFrom(3, 2, 4, 5, 1, 3, 2, 4, 5, 0),
  nodes: fc.tuple(...NODE_NAMES.map(nodeArb)),
  services: fc.array(serviceArb, { minLength: 1, maxLength: 7 }),
  config: configArb,
}).map(({ nodeCount, nodes, services, config }) => ({ nodes: nodes.slice(0, nodeCount), services: apiValid(services), config }));

// ---------------------------------------------------------------------------
// An independent reading of the rules, for properties to compare against

type Fam = 'ipv4' | 'ipv6';
const famOf = (ip: string): Fam => (ip.includes(':') ? 'ipv6' : 'ipv4');

function isPier(s: ServiceSpec, config: AllocatorConfig): boolean {
  return s.type === 'LoadBalancer' && (s.cls === CLASS || (s.cls === undefined && config.defaultClass));
}

function familiesOf(s: ServiceSpec): Fam[] {
  return (s.families ?? ['IPv4']).map((f) => (f === 'IPv6' ? 'ipv6' : 'ipv4'));
}

const inPool = (n: NodeSpec, s: ServiceSpec, config: AllocatorConfig) => (n.pool || config.defaultPool) === (s.pool || config.defaultPool);

/** Ready (nil too), or serving while terminating; `serving` absent says nothing more than `ready`. */
function hasServingEndpoint(s: ServiceSpec, node: string, family: Fam): boolean {
  return s.endpoints.some((e) => e.node === node && e.v6 === (family === 'ipv6') && (e.ready !== false || e.serving === true));
}

/**
 * A Local Service's family that no otherwise eligible node backs with a serving
 * endpoint: endpoints on nodes that cannot serve (another pool, not Ready,
 * excluded, no fresh agent, not forwarding, no address) count for nothing.
 * Every otherwise eligible node then gets it, and refuses.
 */
function noServingNode(w: World, s: ServiceSpec, family: Fam): boolean {
  return s.local && !w.nodes.some((n) => eligibleAsCluster(n, s, family, w.config) && hasServingEndpoint(s, n.name, family));
}

/** Eligible but for endpoints, as a Cluster Service would be: in the pool, Ready, not excluded, a fresh agent forwarding the family, an address of it. */
function eligibleAsCluster(n: NodeSpec, s: ServiceSpec, family: Fam, config: AllocatorConfig): boolean {
  return inPool(n, s, config) && n.ready && !n.excluded && n.lease === 'fresh' && n.forward[family] && chosenAddress(n, family) !== undefined;
}

function eligible(w: World, n: NodeSpec, s: ServiceSpec, family: Fam): boolean {
  if (!eligibleAsCluster(n, s, family, w.config)) return false;
  if (s.local && !noServingNode(w, s, family) && !hasServingEndpoint(s, n.name, family)) return false;
  return true;
}

function chosenAddress(n: NodeSpec, family: Fam): string | undefined {
  const of = (type: string) => n.addresses.find((a) => a.type === type && famOf(a.address) === family)?.address;
  const a = of('ExternalIP') ?? of('InternalIP');
  return a === undefined ? undefined : canonical(a);
}

/** The WHATWG URL parser prints IPv6 hosts in RFC 5952 form: an implementation independent of pier's. */
function canonical(ip: string): string {
  return ip.includes(':') ? new URL(`http://[${ip}]/`).hostname.slice(1, -1) : ip;
}

function expectedAddresses(w: World, s: ServiceSpec): Set<string> {
  const out = new Set<string>();
  for (const family of familiesOf(s)) {
    for (const n of w.nodes) {
      const a = chosenAddress(n, family);
      if (a && eligible(w, n, s, family)) out.add(a);
    }
  }
  return out;
}

const reserved = (port: number, config: AllocatorConfig) => config.reservedPorts.some((r) => port >= r.from && port <= r.to);

const key = (s: ServiceSpec) => `${s.namespace}/${s.name}`;

function rank(a: ServiceSpec, b: ServiceSpec): number {
  return a.created - b.created || (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0);
}

function mappingOf(a: ServiceAllocation | undefined): Record<string, number> {
  return a?.portMapping === undefined ? {} : (JSON.parse(a.portMapping) as Record<string, number>);
}

function shuffled<T>(items: T[], seed: number[]): T[] {
  return items
    .map((item, i) => ({ item, k: seed[i % Math.max(seed.length, 1)] ?? 0, i }))
    .sort((a, b) => a.k - b.k || a.i - b.i)
    .map((x) => x.item);
}

const RUNS = { numRuns: 400 };

// ---------------------------------------------------------------------------
// Properties

describe('allocate: properties over generated clusters', () => {
  it('never lets two Service ports serve one (address, protocol, port), a reserved port or another port\'s NodePort', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        const a = allocate(input(w));
        const owner = new Map<string, string>();
        for (const [k, svc] of a.services) {
          for (const ing of svc.ingress) {
            ing.ports.forEach((p, i) => {
              if (p.error) return;
              const frontend = `${ing.ip}|${p.protocol}|${p.port}`;
              expect(owner.get(frontend), frontend).toBeUndefined();
              owner.set(frontend, `${k}#${i}`);
              expect(reserved(p.port, w.config)).toBe(false);
              // Only a port's own NodePort may share its number and protocol.
              const nodePortOwners = w.services.filter((o) => o.ports.some((op, j) => (key(o) !== k || j !== i) && op.nodePort === p.port && op.protocol === p.protocol));
              expect(nodePortOwners).toEqual([]);
            });
          }
        }
      }),
      RUNS,
    );
  });

  it('gives the oldest Service a contested port: whoever errs lost to an older claimant', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        const a = allocate(input(w));
        const served = new Map<string, ServiceSpec>();
        for (const [k, svc] of a.services) for (const ing of svc.ingress) for (const p of ing.ports) if (!p.error) served.set(`${ing.ip}|${p.protocol}|${p.port}`, w.services.find((s) => key(s) === k)!);
        for (const [k, svc] of a.services) {
          const me = w.services.find((s) => key(s) === k)!;
          for (const ing of svc.ingress) {
            for (const [i, p] of ing.ports.entries()) {
              if (p.error !== 'PortConflict') continue;
              // Either another Service's NodePort has it (and that Service may serve it too: the same
              // backends either way), or an older Service (or an earlier port of this one) serves it.
              const nodePort = w.services.some((o) => o.ports.some((op, j) => (o !== me || j !== i) && op.nodePort === p.port && op.protocol === p.protocol));
              const holder = served.get(`${ing.ip}|${p.protocol}|${p.port}`);
              if (!nodePort) expect(holder !== undefined && (holder === me || rank(holder, me) < 0)).toBe(true);
            }
          }
        }
      }),
      RUNS,
    );
  });

  it('reports exactly pier\'s Services, with one port entry per spec port, in order, on every ingress', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        const a = allocate(input(w));
        const pier = w.services.filter((s) => isPier(s, w.config)).map(key).sort();
        expect([...a.services.keys()]).toEqual(pier);
        for (const [k, svc] of a.services) {
          const spec = w.services.find((s) => key(s) === k)!;
          for (const ing of svc.ingress) {
            expect(ing.ipMode).toBe('Proxy');
            expect(ing.ports.map((p) => p.protocol)).toEqual(spec.ports.map((p) => p.protocol));
          }
          // An address no endpoint backs is refused there, whatever its ports say.
          const refused = svc.ingress.some((i) => noServingNode(w, spec, famOf(i.ip)));
          const allServed = !refused && svc.ingress.length > 0 && svc.ingress.every((i) => i.ports.length > 0 && i.ports.every((p) => !p.error));
          // An asked-for address narrows the families; otherwise each family must be served somewhere.
          const everyFamily = spec.lbIP !== undefined || familiesOf(spec).every((f) => svc.ingress.some((i) => famOf(i.ip) === f));
          expect(svc.condition.status === 'True').toBe(allServed && everyFamily);
          if (svc.condition.status === 'True') expect(svc.condition.reason).toBe('Serving');
          expect(svc.condition.message.length).toBeGreaterThan(0);
        }
      }),
      RUNS,
    );
  });

  it('advertises exactly the eligible nodes: Ready, not excluded, fresh agent forwarding the family, in the pool, and under Local with a serving endpoint unless no otherwise eligible node has one', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        const a = allocate(input(w));
        for (const s of w.services) {
          const svc = a.services.get(key(s));
          if (!svc || s.ports.length === 0) continue;
          const got = new Set(svc.ingress.map((i) => i.ip));
          const expected = expectedAddresses(w, s);
          if (s.lbIP === undefined) {
            expect(got).toEqual(expected);
          } else {
            // Asked-for addresses: only those an eligible node has (any of its addresses).
            const servable = s.lbIP !== 'not-an-ip' && familiesOf(s).includes(famOf(s.lbIP)) &&
              w.nodes.some((n) => eligible(w, n, s, famOf(s.lbIP!)) && n.addresses.some((x) => canonical(x.address) === canonical(s.lbIP!)));
            expect([...got]).toEqual(servable ? [canonical(s.lbIP)] : []);
            if (!servable) expect(svc.condition).toMatchObject({ status: 'False', reason: 'AddressUnavailable' });
          }
        }
      }),
      RUNS,
    );
  });

  it('gives a Local Service exactly the otherwise eligible nodes with a serving endpoint when any has one, else every otherwise eligible node, refusing', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        const a = allocate(input(w));
        for (const s of w.services) {
          const svc = a.services.get(key(s));
          if (!svc || !s.local || s.lbIP !== undefined || s.ports.length === 0) continue;
          const refusing: Fam[] = [];
          for (const family of familiesOf(s)) {
            const got = new Set(svc.ingress.map((i) => i.ip).filter((ip) => famOf(ip) === family));
            // An endpoint on a node that cannot serve backs nothing.
            const backed = !noServingNode(w, s, family);
            const want = new Set(
              w.nodes
                .filter((n) => eligibleAsCluster(n, s, family, w.config) && (!backed || hasServingEndpoint(s, n.name, family)))
                .map((n) => chosenAddress(n, family))
                .filter((x) => x !== undefined),
            );
            expect(got).toEqual(want);
            if (!backed && got.size > 0) refusing.push(family);
          }
          // Said once, as a problem; never a port error, or the agents would not refuse there.
          const said = svc.problems.filter((p) => p.reason === 'NoEndpoints');
          expect(said).toHaveLength(refusing.length > 0 ? 1 : 0);
          if (refusing.length > 0) {
            const which = refusing.length === familiesOf(s).length ? '' : `${refusing.map((f) => (f === 'ipv6' ? 'IPv6' : 'IPv4')).join(' and ')} `;
            const pool = s.pool || w.config.defaultPool;
            expect(said[0]!.message).toBe(`no node that can serve pool "${pool}" has a serving ${which}endpoint of the Service (externalTrafficPolicy: Local), so ${which}connections to it are refused until one has`);
          }
          for (const ing of svc.ingress) for (const p of ing.ports) expect(p.error).not.toBe('NoEndpoints');
          if (svc.condition.reason === 'NoEndpoints') expect(refusing.length).toBeGreaterThan(0);
        }
      }),
      RUNS,
    );
  });

  it('judges nodes as allocate() does: the nodes judgeNodes() leaves in are the ones advertised', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        const i = input(w);
        const a = allocate(i);
        const judged = judgeNodes(i);
        expect([...judged.keys()].sort()).toEqual([...a.services.keys()]);
        for (const s of w.services) {
          const svc = a.services.get(key(s));
          if (!svc) continue;
          const judgements = judged.get(key(s))!;
          for (const j of judgements) {
            if (j.excluded?.kind === 'noEndpoint') expect(noServingNode(w, s, j.family)).toBe(false);
          }
          if (s.lbIP !== undefined || s.ports.length === 0) continue;
          const left = new Set(judgements.filter((j) => !j.excluded).map((j) => chosenAddress(w.nodes.find((n) => n.name === j.node)!, j.family)));
          expect(left).toEqual(new Set(svc.ingress.map((x) => x.ip)));
        }
      }),
      RUNS,
    );
  });

  it('orders ingress by the Service\'s ipFamilies, then (Local) the nodes with the most ready endpoints first, then numerically', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        const i = input(w);
        const a = allocate(i);
        const judged = judgeNodes(i);
        for (const s of w.services) {
          const svc = a.services.get(key(s));
          if (!svc) continue;
          const families = familiesOf(s);
          const ips = svc.ingress.map((x) => x.ip);
          for (const ip of ips) expect(families).toContain(famOf(ip));
          // A node's ready endpoints of the Service, for the address it is advertised by (the most, where nodes share one).
          const ready = new Map<string, number>();
          for (const j of judged.get(key(s))!.filter((x) => !x.excluded)) {
            const ip = chosenAddress(w.nodes.find((n) => n.name === j.node)!, j.family)!;
            const count = s.local ? s.endpoints.filter((e) => e.node === j.node && e.v6 === (j.family === 'ipv6') && e.ready !== false).length : 0;
            ready.set(ip, Math.max(ready.get(ip) ?? 0, count));
          }
          const readyAt = (ip: string) => ready.get(ip) ?? 0;
          const sorted = [...ips].sort((x, y) => families.indexOf(famOf(x)) - families.indexOf(famOf(y)) || readyAt(y) - readyAt(x) || numeric(x, y));
          expect(ips).toEqual(sorted);
        }
      }),
      RUNS,
    );
  });

  it('marks every reserved service-mode port PortReserved on every address', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        const a = allocate(input(w));
        for (const s of w.services) {
          const svc = a.services.get(key(s));
          if (!svc || s.mode === 'allocate') continue;
          s.ports.forEach((p, i) => {
            if (!reserved(p.port, w.config)) return;
            for (const ing of svc.ingress) expect(ing.ports[i]).toEqual({ port: p.port, protocol: p.protocol, error: 'PortReserved' });
          });
        }
      }),
      RUNS,
    );
  });

  it('allocates external ports inside the range, off every NodePort and reserved port, unique per protocol, clear of older service-mode ports', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        const a = allocate(input(w));
        const nodePorts = new Set(w.services.flatMap((s) => s.ports.map((p) => p.nodePort)).filter((p) => p !== undefined));
        const used = new Map<string, string>();
        for (const s of w.services) {
          const svc = a.services.get(key(s));
          if (!svc) continue;
          if (s.mode !== 'allocate') {
            expect(svc.portMapping).toBeUndefined();
            continue;
          }
          if (s.ports.length === 0) continue;
          const mapping = mappingOf(svc);
          s.ports.forEach((p, i) => {
            const ext = mapping[`${p.port}/${p.protocol}`];
            for (const ing of svc.ingress) {
              if (ext === undefined) expect(ing.ports[i]!.error).toBe('PortRangeExhausted');
              else expect(ing.ports[i]!.port).toBe(ext);
            }
            if (ext === undefined) return;
            expect(ext).toBeGreaterThanOrEqual(w.config.allocateRange.from);
            expect(ext).toBeLessThanOrEqual(w.config.allocateRange.to);
            expect(nodePorts.has(ext)).toBe(false);
            expect(reserved(ext, w.config)).toBe(false);
            const k = `${p.protocol}/${ext}`;
            expect(used.get(k), k).toBeUndefined();
            used.set(k, key(s));
            const olderServiceMode = w.services.filter((o) => isPier(o, w.config) && o.mode !== 'allocate' && rank(o, s) < 0 && o.ports.some((op) => op.port === ext && op.protocol === p.protocol));
            expect(olderServiceMode).toEqual([]);
          });
        }
      }),
      RUNS,
    );
  });

  it('does not depend on the order of its inputs', () => {
    fc.assert(
      fc.property(worldArb, fc.array(fc.integer(), { minLength: 1, maxLength: 12 }), (w, seed) => {
        const i = input(w);
        const shuffledInput: AllocateInput = {
          ...i,
          services: shuffled(i.services, seed),
          nodes: shuffled(i.nodes, [...seed].reverse()),
          slices: shuffled(i.slices, seed.map((x) => -x)),
          leases: shuffled(i.leases, seed.map((x) => x * 7)),
        };
        expect([...allocate(shuffledInput).services]).toEqual([...allocate(i).services]);
      }),
      RUNS,
    );
  });

  it('returns the same allocation when fed the statuses and annotations it produced (a restarted controller moves nothing)', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        const services = w.services.map(serviceObject);
        const first = allocate(input(w, services));
        const restarted = feedBack(services, first);
        const second = allocate(input(w, restarted));
        expect([...second.services]).toEqual([...first.services]);
        // And again, in reverse order, as a fresh informer cache might list them.
        expect([...allocate(input(w, feedBack([...restarted].reverse(), second))).services]).toEqual([...first.services]);
      }),
      RUNS,
    );
  });

  it('needs no annotation to stay put while every allocated port is in some ingress', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        const services = w.services.map(serviceObject);
        const first = allocate(input(w, services));
        // Without ingress a status cannot say anything; that is what the annotation is for.
        const statusCanHoldIt = [...first.services.values()].every((s) => s.ingress.length > 0 || Object.keys(mappingOf(s)).length === 0);
        const second = allocate(input(w, feedBack(services, first, false)));
        if (statusCanHoldIt) expect([...second.services]).toEqual([...first.services]);
        else expect([...second.services.keys()]).toEqual([...first.services.keys()]);
      }),
      RUNS,
    );
  });

  it('keeps allocated ports when another Service is deleted', () => {
    fc.assert(
      fc.property(worldArb, fc.nat(), (w, pick) => {
        fc.pre(w.services.length > 1);
        const services = feedBack(w.services.map(serviceObject), allocate(input(w)));
        const before = allocate(input(w, services));
        const gone = pick % services.length;
        const after = allocate(input({ ...w, services: w.services.filter((_, i) => i !== gone) }, services.filter((_, i) => i !== gone)));
        for (const [k, svc] of after.services) expect(mappingOf(svc)).toMatchObject(mappingOf(before.services.get(k)));
      }),
      RUNS,
    );
  });

  it('changes nothing for existing Services when a younger one arrives', () => {
    fc.assert(
      fc.property(worldArb, serviceArb, (w, extra) => {
        const services = feedBack(w.services.map(serviceObject), allocate(input(w)));
        const before = allocate(input(w, services));
        // Younger than everything, with no NodePorts (those would be the API server's choice, not a Service's).
        const newcomer: ServiceSpec = { ...extra, namespace: 'ns-new', created: 100, ports: extra.ports.map((p) => ({ ...p, nodePort: undefined })), status: [] };
        const w2 = { ...w, services: [...w.services, newcomer] };
        const after = allocate(input(w2, [...services, serviceObject(newcomer)]));
        for (const [k, svc] of before.services) expect(after.services.get(k)).toEqual(svc);
      }),
      RUNS,
    );
  });

  it('never throws, and keeps its promises for the others, when one Service is malformed', () => {
    const junk = fc.oneof(fc.anything(), fc.constant(null), fc.constant('x'), fc.constant(-1), fc.constant([{ port: 'x' }]));
    const corruptions: ((svc: V1Service, v: unknown) => void)[] = [
      (s, v) => ((s.spec as Record<string, unknown>).ports = v),
      (s, v) => ((s.spec as Record<string, unknown>).ipFamilies = v),
      (s, v) => ((s.metadata as Record<string, unknown>).annotations = v),
      (s, v) => ((s.metadata as Record<string, unknown>).creationTimestamp = v),
      (s, v) => ((s.spec as Record<string, unknown>).loadBalancerIP = v),
      (s, v) => ((s.status as Record<string, unknown>).loadBalancer = v),
      (s, v) => ((s.spec!.ports as unknown[])[0] = v),
      (s) => Object.defineProperty(s.spec, 'ports', { get: () => { throw new Error('boom'); }, enumerable: false }),
      (s) => Object.defineProperty(s, 'metadata', { get: () => { throw new Error('boom'); }, enumerable: false }),
    ];
    fc.assert(
      fc.property(worldArb, fc.nat(), fc.nat({ max: corruptions.length - 1 }), junk, (w, pick, which, value) => {
        fc.pre(w.services.length > 0);
        const services = w.services.map(serviceObject);
        const victim = pick % services.length;
        corruptions[which]!(services[victim]!, value);
        const a = allocate(input(w, services));
        // Every other pier Service is still reported, with well-formed entries.
        for (const [i, s] of w.services.entries()) {
          if (i === victim || !isPier(s, w.config)) continue;
          const svc = a.services.get(key(s))!;
          expect(svc).toBeDefined();
          for (const ing of svc.ingress) expect(ing.ports).toHaveLength(s.ports.length);
        }
      }),
      { numRuns: 500 },
    );
  });

  it('never throws, and still reports every pier Service, when a Node, Lease or EndpointSlice is malformed', () => {
    const junk = fc.oneof(fc.anything(), fc.constant(null), fc.constant('x'), fc.constant([null]), fc.constant({ renewTime: 'soon' }));
    const targets = ['nodes', 'leases', 'slices'] as const;
    const fields = ['metadata', 'status', 'spec', 'endpoints', 'addressType', 'conditions'];
    fc.assert(
      fc.property(worldArb, fc.constantFrom(...targets), fc.nat(), fc.constantFrom(...fields), junk, fc.boolean(), (w, target, pick, field, value, throwing) => {
        const i = input(w);
        const list = i[target] as unknown as Record<string, unknown>[];
        fc.pre(list.length > 0);
        const victim = list[pick % list.length]!;
        if (throwing) Object.defineProperty(victim, field, { get: () => { throw new Error('boom'); }, enumerable: false });
        else victim[field] = value;
        const a = allocate(i);
        expect([...a.services.keys()]).toEqual(w.services.filter((s) => isPier(s, w.config)).map(key).sort());
      }),
      RUNS,
    );
  });
});

function numeric(x: string, y: string): number {
  const value = (ip: string) => {
    if (!ip.includes(':')) return ip.split('.').reduce((acc, o) => acc * 256n + BigInt(o), 0n);
    const [head = '', tail = ''] = ip.split('::');
    const h = head ? head.split(':') : [];
    const t = tail ? tail.split(':') : [];
    const words = ip.includes('::') ? [...h, ...Array(8 - h.length - t.length).fill('0'), ...t] : h;
    return words.reduce((acc, w) => acc * 65536n + BigInt(parseInt(w, 16)), 0n);
  };
  const a = value(x);
  const b = value(y);
  return a < b ? -1 : a > b ? 1 : 0;
}

// ---------------------------------------------------------------------------
// Examples

function node(name: string, addresses: string[], extra: Partial<NodeSpec> = {}): NodeSpec {
  return {
    name,
    addresses: addresses.map((a) => (a.startsWith('ext:') ? { type: 'ExternalIP', address: a.slice(4) } : { type: 'InternalIP', address: a })),
    ready: true,
    excluded: false,
    pool: undefined,
    lease: 'fresh',
    forward: { ipv4: true, ipv6: true },
    ...extra,
  };
}

function svc(name: string, ports: PortSpec[], extra: Partial<ServiceSpec> = {}): ServiceSpec {
  return {
    namespace: 'default',
    name,
    type: 'LoadBalancer',
    cls: CLASS,
    ports,
    families: undefined,
    local: false,
    pool: undefined,
    mode: undefined,
    lbIP: undefined,
    created: 0,
    endpoints: [],
    status: [],
    ...extra,
  };
}

const tcp = (port: number, nodePort?: number): PortSpec => ({ port, protocol: 'TCP', ...(nodePort ? { nodePort } : {}) });
const config = defaultAllocatorConfig();

function run(nodes: NodeSpec[], services: ServiceSpec[], cfg: AllocatorConfig = config) {
  return allocate(input({ nodes, services, config: cfg })).services;
}

describe('allocate: examples', () => {
  it('serves a Service on every eligible node, preferring each node\'s ExternalIP', () => {
    const out = run([node('n1', ['192.0.2.10', 'ext:198.51.100.10']), node('n2', ['192.0.2.2'])], [svc('web', [tcp(80), tcp(443)])]);
    expect(out.get('default/web')).toEqual({
      ingress: [
        { ip: '192.0.2.2', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }, { port: 443, protocol: 'TCP' }] },
        { ip: '198.51.100.10', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }, { port: 443, protocol: 'TCP' }] },
      ],
      condition: { status: 'True', reason: 'Serving', message: 'served on 192.0.2.2, 198.51.100.10, ports 80/TCP, 443/TCP' },
      problems: [],
    });
  });

  it('lets the oldest Service keep a contested port, then namespace/name', () => {
    const nodes = [node('n1', ['192.0.2.10'])];
    const out = run(nodes, [svc('young', [tcp(80), tcp(81)], { created: 5 }), svc('old', [tcp(80)], { created: 1 })]);
    expect(out.get('default/old')!.condition.status).toBe('True');
    expect(out.get('default/young')!.ingress[0]!.ports).toEqual([{ port: 80, protocol: 'TCP', error: 'PortConflict' }, { port: 81, protocol: 'TCP' }]);
    expect(out.get('default/young')!.condition).toEqual({
      status: 'False',
      reason: 'PartiallyServed',
      message: 'served on 192.0.2.10 except: port 80/TCP (p0) is not served on 192.0.2.10: held by default/old, which is older',
    });
    // Same creation time: namespace/name decides.
    const tie = run(nodes, [svc('b', [tcp(80)]), svc('a', [tcp(80)])]);
    expect(tie.get('default/a')!.condition.reason).toBe('Serving');
    expect(tie.get('default/b')!.condition.reason).toBe('PortConflict');
  });

  it('does not serve a port that is another Service\'s NodePort: kube-proxy answers there on every node', () => {
    const out = run([node('n1', ['192.0.2.10'])], [svc('web', [tcp(30080)]), svc('np', [tcp(8080, 30080)], { type: 'NodePort', cls: undefined, created: 9 })]);
    expect(out.get('default/web')!.condition).toEqual({
      status: 'False',
      reason: 'PortConflict',
      message: 'port 30080/TCP (p0) is not served on 192.0.2.10: 30080/TCP is a NodePort of default/np on every node',
    });
  });

  it('does not see a conflict between TCP and UDP on one port, and serves SCTP', () => {
    const out = run([node('n1', ['192.0.2.10'])], [
      svc('dns-tcp', [tcp(53)]),
      svc('dns-udp', [{ port: 53, protocol: 'UDP' }, { port: 53, protocol: 'SCTP' }], { created: 9 }),
    ]);
    expect(out.get('default/dns-tcp')!.condition.status).toBe('True');
    expect(out.get('default/dns-udp')!.condition.status).toBe('True');
  });

  it('says why an IPv6-only Service gets nothing from IPv4-only nodes', () => {
    const out = run([node('n1', ['192.0.2.10']), node('n2', ['192.0.2.11'])], [svc('v6', [tcp(80)], { families: ['IPv6'] })]);
    expect(out.get('default/v6')).toMatchObject({
      ingress: [],
      condition: { status: 'False', reason: 'NoEligibleNodes', message: 'no node can serve IPv6 in pool "default", of 2 nodes: 2 without an IPv6 address' },
    });
  });

  it('orders a dual-stack Service by its ipFamilies and reports the family it cannot serve', () => {
    const nodes = [node('n1', ['192.0.2.10', '2001:db8::10']), node('n2', ['192.0.2.9', '2001:db8::9'], { forward: { ipv4: true, ipv6: false } })];
    const out = run(nodes, [svc('both', [tcp(80)], { families: ['IPv6', 'IPv4'] })]);
    expect(out.get('default/both')!.ingress.map((i) => i.ip)).toEqual(['2001:db8::10', '192.0.2.9', '192.0.2.10']);
    const v6only = run([node('n1', ['192.0.2.10'])], [svc('both', [tcp(80)], { families: ['IPv4', 'IPv6'] })]).get('default/both')!;
    expect(v6only.condition.reason).toBe('PartiallyServed');
    expect(v6only.condition.message).toContain('no node can serve IPv6');
  });

  it('drops nodes that are not Ready, excluded, without a fresh agent, not forwarding, or in another pool', () => {
    const nodes = [
      node('ok', ['192.0.2.1']),
      node('down', ['192.0.2.2'], { ready: false }),
      node('excluded', ['192.0.2.3'], { excluded: true }),
      node('stale', ['192.0.2.4'], { lease: 'stale' }),
      node('agentless', ['192.0.2.5'], { lease: 'missing' }),
      node('noforward', ['192.0.2.6'], { forward: { ipv4: false, ipv6: true } }),
      node('elsewhere', ['192.0.2.7'], { pool: 'edge' }),
    ];
    expect(run(nodes, [svc('web', [tcp(80)])]).get('default/web')!.ingress.map((i) => i.ip)).toEqual(['192.0.2.1']);
    expect(run(nodes, [svc('web', [tcp(80)], { pool: 'edge' })]).get('default/web')!.ingress.map((i) => i.ip)).toEqual(['192.0.2.7']);
    const none = run(nodes.slice(1, 6), [svc('web', [tcp(80)])]).get('default/web')!;
    expect(none.condition.message).toBe(
      'no node can serve IPv4 in pool "default", of 5 nodes: 1 not Ready, 1 labelled node.kubernetes.io/exclude-from-external-load-balancers, 1 without a pier agent Lease, 1 whose pier agent Lease has expired, 1 whose pier agent cannot forward IPv4',
    );
  });

  it('judges agent Leases by leaseFreshUntil, not their renewTime, when the caller observed them', () => {
    // n1's renewTime is long past (the controller's clock, or an outage, says so), but it was seen to change recently;
    // n2's renewTime looks fresh, but nothing saw it change within its duration; n3 has no entry.
    const nodes = [node('n1', ['192.0.2.1'], { lease: 'stale' }), node('n2', ['192.0.2.2']), node('n3', ['192.0.2.3'])];
    const base = input({ nodes, services: [svc('web', [tcp(80)])], config });
    const observed = allocate({ ...base, now: 1000, leaseFreshUntil: new Map([['pier-agent-n1', 1001], ['pier-agent-n2', 1000]]) }).services.get('default/web')!;
    expect(observed.ingress.map((i) => i.ip)).toEqual(['192.0.2.1']);
    expect(observed.condition.message).toBe('served on 192.0.2.1, port 80/TCP');
    const none = allocate({ ...base, now: 1000, leaseFreshUntil: new Map() }).services.get('default/web')!;
    expect(none.condition.message).toBe('no node can serve IPv4 in pool "default", of 3 nodes: 3 whose pier agent Lease has expired');
    // Without the map, the Leases' own times against `now`, as before.
    expect(allocate(base).services.get('default/web')!.ingress.map((i) => i.ip)).toEqual(['192.0.2.2', '192.0.2.3']);
  });

  it('with externalTrafficPolicy Local, serves only on nodes with a serving endpoint', () => {
    const nodes = [node('n1', ['192.0.2.1']), node('n2', ['192.0.2.2']), node('n3', ['192.0.2.3'])];
    const local = svc('web', [tcp(80)], { local: true, endpoints: [{ node: 'n2', v6: false, ready: true }, { node: 'n3', v6: false, ready: false }, { node: 'n1', v6: true, ready: true }] });
    const out = run(nodes, [local]).get('default/web')!;
    expect(out.ingress.map((i) => i.ip)).toEqual(['192.0.2.2']);
    expect(out.condition).toEqual({ status: 'True', reason: 'Serving', message: 'served on 192.0.2.2, port 80/TCP' });
    expect(out.problems).toEqual([]);
  });

  describe('externalTrafficPolicy Local through rolling updates and scaling to 0', () => {
    const nodes = [node('n1', ['192.0.2.1']), node('n2', ['192.0.2.2']), node('n3', ['192.0.2.3']), node('down', ['192.0.2.4'], { ready: false })];
    const terminating = (n: string, serving: boolean): Endpoint => ({ node: n, v6: false, ready: false, serving, terminating: true });
    const ips = (a: ServiceAllocation) => a.ingress.map((i) => i.ip);
    const refusing = 'no node that can serve pool "default" has a serving endpoint of the Service (externalTrafficPolicy: Local), so connections to it are refused until one has';
    const refusedOn = (addresses: string[], ports: number[]): ServiceAllocation => ({
      ingress: addresses.map((ip) => ({ ip, ipMode: 'Proxy', ports: ports.map((port) => ({ port, protocol: 'TCP' })) })),
      condition: { status: 'False', reason: 'NoEndpoints', message: refusing },
      problems: [{ reason: 'NoEndpoints', message: refusing }],
    });

    it('keeps a node whose old pod terminates but still serves', () => {
      // Mid rollout: the new pod is ready on n1, n2's old pod drains.
      const web = svc('web', [tcp(80)], { local: true, endpoints: [{ node: 'n1', v6: false, ready: true }, terminating('n2', true)] });
      expect(ips(run(nodes, [web]).get('default/web')!)).toEqual(['192.0.2.1', '192.0.2.2']);
      // Its only pod draining, n2 alone still serves.
      expect(ips(run(nodes, [{ ...web, endpoints: [terminating('n2', true)] }]).get('default/web')!)).toEqual(['192.0.2.2']);
      // `serving` absent: `ready` decides, and false is false.
      expect(ips(run(nodes, [{ ...web, endpoints: [{ node: 'n1', v6: false, ready: true }, { node: 'n2', v6: false, ready: false, terminating: true }] }]).get('default/web')!)).toEqual(['192.0.2.1']);
    });

    it('lists first the node with the most ready endpoints, a draining one after them', () => {
      // A client that takes the first address reaches the most pods (upstream's Local affinity specs do).
      const ready = (n: string): Endpoint => ({ node: n, v6: false, ready: true });
      const web = svc('web', [tcp(80)], { local: true, endpoints: [ready('n1'), ready('n3'), ready('n3'), terminating('n2', true)] });
      expect(ips(run(nodes, [web]).get('default/web')!)).toEqual(['192.0.2.3', '192.0.2.1', '192.0.2.2']);
      // Alike: numeric order.
      expect(ips(run(nodes, [{ ...web, endpoints: [ready('n3'), ready('n1')] }]).get('default/web')!)).toEqual(['192.0.2.1', '192.0.2.3']);
    });

    it('drops a node whose only pod terminates and no longer serves, while another node serves', () => {
      const web = svc('web', [tcp(80)], { local: true, endpoints: [{ node: 'n1', v6: false, ready: true }, terminating('n2', false)] });
      const out = run(nodes, [web]).get('default/web')!;
      expect(ips(out)).toEqual(['192.0.2.1']);
      expect(out.condition.status).toBe('True');
    });

    it('without a serving endpoint on a node that can serve, keeps every otherwise eligible node\'s address and says connections are refused', () => {
      const cases: Endpoint[][] = [
        [],
        [terminating('n1', false), { node: 'n2', v6: false, ready: false }],
        [{ node: 'n2', v6: true, ready: true }],
        [{ node: 'gone', v6: false, ready: true }],
        // Ready, but on the NotReady node: it backs nothing.
        [{ node: 'down', v6: false, ready: true }],
      ];
      for (const endpoints of cases) {
        const out = run(nodes, [svc('web', [tcp(80), tcp(443)], { local: true, endpoints })]).get('default/web')!;
        expect(out).toEqual(refusedOn(['192.0.2.1', '192.0.2.2', '192.0.2.3'], [80, 443]));
      }
    });

    it('moves the addresses to the nodes with endpoints once there are some, and back when they are gone', () => {
      const empty = svc('web', [tcp(80)], { local: true });
      expect(ips(run(nodes, [empty]).get('default/web')!)).toEqual(['192.0.2.1', '192.0.2.2', '192.0.2.3']);
      const one = run(nodes, [{ ...empty, endpoints: [{ node: 'n3', v6: false, ready: undefined }] }]).get('default/web')!;
      expect(ips(one)).toEqual(['192.0.2.3']);
      expect(one.condition.reason).toBe('Serving');
      // Scaled down to 0 again: the addresses stay where a node can take them.
      expect(ips(run(nodes, [{ ...empty, endpoints: [terminating('n3', false)] }]).get('default/web')!)).toEqual(['192.0.2.1', '192.0.2.2', '192.0.2.3']);
    });

    it('goes pending only when no node is otherwise eligible at all; an endpoint on a node that cannot serve backs nothing', () => {
      const pending = { ingress: [], condition: { status: 'False', reason: 'NoEligibleNodes', message: 'no node can serve IPv4 in pool "default", of 1 node: 1 not Ready' } };
      expect(run([nodes[3]!], [svc('web', [tcp(80)], { local: true })]).get('default/web')!).toMatchObject(pending);
      // Its endpoint on the one node, which cannot serve: still nothing to refuse on.
      expect(run([nodes[3]!], [svc('web', [tcp(80)], { local: true, endpoints: [{ node: 'down', v6: false, ready: true }] })]).get('default/web')!).toMatchObject(pending);
      // The only serving endpoint is on a node that fails some other test: the Service gets the eligible nodes, refusing.
      const others = [
        node('edge', ['192.0.2.9'], { pool: 'edge' }),
        node('stale', ['192.0.2.5'], { lease: 'stale' }),
        node('agentless', ['192.0.2.6'], { lease: 'missing' }),
        node('off', ['192.0.2.7'], { excluded: true }),
        node('still', ['192.0.2.8'], { forward: { ipv4: false, ipv6: true } }),
        node('v6only', ['2001:db8::6']),
      ];
      for (const where of ['down', ...others.map((n) => n.name)]) {
        const out = run([...nodes, ...others], [svc('web', [tcp(80)], { local: true, endpoints: [{ node: where, v6: false, ready: true }] })]).get('default/web')!;
        expect(out, where).toEqual(refusedOn(['192.0.2.1', '192.0.2.2', '192.0.2.3'], [80]));
        // Beside an endpoint on a node that can serve, it changes nothing: that node alone serves.
        const beside = run([...nodes, ...others], [svc('web', [tcp(80)], { local: true, endpoints: [{ node: where, v6: false, ready: true }, terminating('n2', true)] })]).get('default/web')!;
        expect(ips(beside), where).toEqual(['192.0.2.2']);
        expect(beside.condition.reason, where).toBe('Serving');
      }
    });

    it('says which family is refused when the other is served', () => {
      const dual = [node('n1', ['192.0.2.1', '2001:db8::1']), node('n2', ['192.0.2.2', '2001:db8::2'])];
      const out = run(dual, [svc('web', [tcp(80)], { local: true, families: ['IPv4', 'IPv6'], endpoints: [{ node: 'n1', v6: false, ready: true }] })]).get('default/web')!;
      expect(ips(out)).toEqual(['192.0.2.1', '2001:db8::1', '2001:db8::2']);
      expect(out.condition).toEqual({
        status: 'False',
        reason: 'PartiallyServed',
        message: 'served on 192.0.2.1 except: no node that can serve pool "default" has a serving IPv6 endpoint of the Service (externalTrafficPolicy: Local), so IPv6 connections to it are refused until one has',
      });
    });

    it('names a port error first only when no port would be served even with endpoints', () => {
      const out = run(nodes.slice(0, 1), [svc('ssh', [tcp(22)], { local: true })]).get('default/ssh')!;
      expect(out.condition.reason).toBe('PortReserved');
      expect(out.problems.map((p) => p.reason)).toEqual(['NoEndpoints', 'PortReserved']);
      expect(run(nodes.slice(0, 1), [svc('ssh', [tcp(22), tcp(2222)], { local: true })]).get('default/ssh')!.condition.reason).toBe('NoEndpoints');
    });

    it('serves a requested loadBalancerIP on a node without endpoints only while no node that can serve has one', () => {
      const asked = svc('web', [tcp(80)], { local: true, lbIP: '192.0.2.2' });
      const refused = run(nodes, [asked]).get('default/web')!;
      expect(ips(refused)).toEqual(['192.0.2.2']);
      expect(refused.condition).toEqual({ status: 'False', reason: 'NoEndpoints', message: refusing });
      // An endpoint on the NotReady node changes nothing: still refused there.
      expect(run(nodes, [{ ...asked, endpoints: [{ node: 'down', v6: false, ready: true }] }]).get('default/web')!).toEqual(refusedOn(['192.0.2.2'], [80]));
      const elsewhere = run(nodes, [{ ...asked, endpoints: [{ node: 'n1', v6: false, ready: true }] }]).get('default/web')!;
      expect(elsewhere).toMatchObject({
        ingress: [],
        condition: { reason: 'AddressUnavailable', message: 'spec.loadBalancerIP 192.0.2.2 cannot be served: node n2 has it, but it has no serving endpoint of the Service (externalTrafficPolicy: Local)' },
      });
      expect(ips(run(nodes, [{ ...asked, endpoints: [terminating('n2', true)] }]).get('default/web')!)).toEqual(['192.0.2.2']);
    });

    it('changes nothing for Cluster Services: endpoints do not matter', () => {
      for (const endpoints of [[], [{ node: 'n1', v6: false, ready: true }], [terminating('n2', false)]]) {
        const out = run(nodes, [svc('web', [tcp(80)], { endpoints })]).get('default/web')!;
        expect(ips(out)).toEqual(['192.0.2.1', '192.0.2.2', '192.0.2.3']);
        expect(out.condition).toEqual({ status: 'True', reason: 'Serving', message: 'served on 192.0.2.1, 192.0.2.2, 192.0.2.3, port 80/TCP' });
      }
    });

    it('judges each node as allocate() does, for pier status', () => {
      const cases: Endpoint[][] = [
        [],
        [{ node: 'n1', v6: false, ready: true }, terminating('n2', true)],
        [{ node: 'n1', v6: false, ready: true }, terminating('n2', false)],
        [{ node: 'down', v6: false, ready: true }],
      ];
      for (const endpoints of cases) {
        const w: World = { nodes, services: [svc('web', [tcp(80)], { local: true, endpoints })], config };
        const judged = judgeNodes(input(w)).get('default/web')!;
        const left = judged.filter((j) => !j.excluded).map((j) => j.addresses[0]);
        expect(left).toEqual(ips(allocate(input(w)).services.get('default/web')!));
        expect(judged.find((j) => j.node === 'down')!.excluded).toEqual({ kind: 'notReady', why: 'it is not Ready' });
      }
      // The only endpoint on the NotReady node: no node is left out for want of one.
      const stranded: World = { nodes, services: [svc('web', [tcp(80)], { local: true, endpoints: [{ node: 'down', v6: false, ready: true }] })], config };
      expect(judgeNodes(input(stranded)).get('default/web')!.filter((j) => !j.excluded).map((j) => j.node)).toEqual(['n1', 'n2', 'n3']);
      const w: World = { nodes, services: [svc('web', [tcp(80)], { local: true, endpoints: [{ node: 'n1', v6: false, ready: true }, terminating('n2', false)] })], config };
      expect(judgeNodes(input(w)).get('default/web')!.find((j) => j.node === 'n2')!.excluded).toEqual({
        kind: 'noEndpoint',
        why: 'it has no serving endpoint of the Service (externalTrafficPolicy: Local)',
      });
    });

    it('asks for no write and no new Event while an unchanged Service has no endpoints', () => {
      const w: World = { nodes, services: [svc('web', [tcp(80)], { local: true })], config };
      const services = w.services.map(serviceObject);
      const first = allocate(input(w, services));
      const desired = first.services.get('default/web')!;
      expect(hasWrites(serviceWork(services[0]!, desired, { ipModeDropped: false }))).toBe(true);
      expect(newProblems(undefined, desired.problems).map((p) => p.reason)).toEqual(['NoEndpoints']);
      // Written, and its Event reported: allocating again finds nothing to do.
      const written = feedBack(services, first);
      const again = allocate(input(w, written)).services.get('default/web')!;
      expect(again).toEqual(desired);
      expect(hasWrites(serviceWork(written[0]!, again, { ipModeDropped: false }))).toBe(false);
      expect(newProblems(new Set(desired.problems.map(problemKey)), again.problems)).toEqual([]);
    });
  });

  it('marks reserved ports, and tells a Service with no ports or too many', () => {
    const nodes = [node('n1', ['192.0.2.1'])];
    const out = run(nodes, [svc('ssh', [tcp(22), tcp(2222)]), svc('empty', []), svc('wide', Array.from({ length: 100 }, (_, i) => tcp(1000 + i)))]);
    expect(out.get('default/ssh')!.ingress[0]!.ports).toEqual([{ port: 22, protocol: 'TCP', error: 'PortReserved' }, { port: 2222, protocol: 'TCP' }]);
    expect(out.get('default/empty')).toMatchObject({ ingress: [], condition: { status: 'False', reason: 'NoPorts' } });
    expect(out.get('default/wide')!.ingress[0]!.ports).toHaveLength(100);
    expect(out.get('default/wide')!.condition).toMatchObject({ status: 'True', message: expect.stringContaining('and 94 more') });
    const capped = run(nodes, [svc('wide', Array.from({ length: 100 }, (_, i) => tcp(1000 + i)))], { ...config, maxPortsPerService: 64 });
    expect(capped.get('default/wide')).toMatchObject({ ingress: [], condition: { status: 'False', reason: 'TooManyPorts' } });
  });

  it('allocates ports from the range around NodePorts, and reuses what the status remembers', () => {
    const nodes = [node('n1', ['192.0.2.1'])];
    const cfg = { ...config, allocateRange: { from: 40000, to: 40010 } };
    const seeds = [svc('nodeports', [tcp(9000, 40000)], { type: 'NodePort', cls: undefined }), svc('seed', [tcp(80), { port: 80, protocol: 'UDP' }], { mode: 'allocate' })];
    const out = run(nodes, seeds, cfg).get('default/seed')!;
    // 40000 is a NodePort (of any protocol, to keep it simple); TCP and UDP each have their own 40001.
    expect(out.ingress[0]!.ports).toEqual([{ port: 40001, protocol: 'TCP' }, { port: 40001, protocol: 'UDP' }]);
    expect(out.portMapping).toBe('{"80/TCP":40001,"80/UDP":40001}');
    // A status from before (say, before a restart) holds 40007 for TCP 80: it stays.
    const remembered = run(nodes, [seeds[0]!, { ...seeds[1]!, status: [{ ip: '192.0.2.1', ports: [{ port: 40007, protocol: 'TCP' }, { port: 40001, protocol: 'UDP' }] }] }], cfg);
    expect(remembered.get('default/seed')!.portMapping).toBe('{"80/TCP":40007,"80/UDP":40001}');
    // With no ingress to hold it, the annotation remembers.
    const annotated = serviceObject(seeds[1]!);
    annotated.metadata!.annotations![PORT_MAPPING_ANNOTATION] = '{"80/TCP":40009,"80/UDP":40003}';
    const fromAnnotation = allocate({ ...input({ nodes: [], services: seeds, config: cfg }), services: [serviceObject(seeds[0]!), annotated] });
    expect(fromAnnotation.services.get('default/seed')!.portMapping).toBe('{"80/TCP":40009,"80/UDP":40003}');
  });

  it('does not take the spec port an exhausted range leaves in the status for an allocation', () => {
    const cfg = { ...config, allocateRange: { from: 40000, to: 40000 } };
    const w: World = {
      nodes: [node('n1', ['192.0.2.1'])],
      // The range's only port is a younger Service's own port, which draws avoid.
      services: [svc('seed', [tcp(40000)], { created: 1, mode: 'allocate' }), svc('plain', [tcp(40000)], { created: 2 })],
      config: cfg,
    };
    const first = allocate(input(w));
    expect(first.services.get('default/seed')!.ingress[0]!.ports).toEqual([{ port: 40000, protocol: 'TCP', error: 'PortRangeExhausted' }]);
    const again = allocate(input(w, feedBack(w.services.map(serviceObject), first)));
    expect([...again.services]).toEqual([...first.services]);
  });

  it('gives up a remembered allocated port that an older service-mode Service uses', () => {
    const nodes = [node('n1', ['192.0.2.1'])];
    const cfg = { ...config, allocateRange: { from: 40000, to: 40010 } };
    const old = svc('old', [tcp(40004)], { created: 1 });
    const seed = svc('seed', [tcp(80)], { created: 2, mode: 'allocate', status: [{ ip: '192.0.2.1', ports: [{ port: 40004, protocol: 'TCP' }] }] });
    const out = run(nodes, [old, seed], cfg);
    expect(out.get('default/old')!.condition.status).toBe('True');
    expect(out.get('default/seed')!.portMapping).toBe('{"80/TCP":40000}');
    // A younger service-mode Service is the one told about the conflict.
    const young = run(nodes, [{ ...old, created: 3 }, seed], cfg);
    expect(young.get('default/seed')!.portMapping).toBe('{"80/TCP":40004}');
    expect(young.get('default/old')!.condition.reason).toBe('PortConflict');
  });

  it('serves the loadBalancerIP a Service asks for, and says when it cannot', () => {
    const nodes = [node('n1', ['192.0.2.1', 'ext:198.51.100.1']), node('n2', ['192.0.2.2'])];
    const internal = run(nodes, [svc('web', [tcp(80)], { lbIP: '192.0.2.1' })]).get('default/web')!;
    expect(internal.ingress.map((i) => i.ip)).toEqual(['192.0.2.1']);
    expect(internal.condition.status).toBe('True');
    const elsewhere = run(nodes, [svc('web', [tcp(80)], { lbIP: '203.0.113.7' })]).get('default/web')!;
    expect(elsewhere).toMatchObject({
      ingress: [],
      condition: { status: 'False', reason: 'AddressUnavailable', message: 'spec.loadBalancerIP 203.0.113.7 cannot be served: no node has this address' },
    });
    expect(elsewhere.problems.map((p) => p.reason)).toEqual(['AddressUnavailable']);
    const down = run([{ ...nodes[1]!, lease: 'stale' }], [svc('web', [tcp(80)], { lbIP: '192.0.2.2' })]).get('default/web')!;
    expect(down.condition.message).toBe('spec.loadBalancerIP 192.0.2.2 cannot be served: node n2 has it, but its pier agent Lease has expired');
  });

  it('treats an unknown port-mode as service, and says so', () => {
    const out = run([node('n1', ['192.0.2.1'])], [svc('web', [tcp(80)], { mode: 'random' })]).get('default/web')!;
    expect(out.condition.status).toBe('True');
    expect(out.ingress[0]!.ports).toEqual([{ port: 80, protocol: 'TCP' }]);
    expect(out.problems).toEqual([{ reason: 'InvalidPortMode', message: 'annotation pier.dev/port-mode="random" is neither "service" nor "allocate"; using "service" (external port = spec port)' }]);
  });

  it('leaves other classes alone, and takes unclassed Services only as the default', () => {
    const services = [svc('mine', [tcp(80)]), svc('theirs', [tcp(81)], { cls: 'other.example/lb' }), svc('unclassed', [tcp(82)], { cls: undefined }), svc('internal', [tcp(83)], { type: 'ClusterIP' })];
    expect([...run([], services).keys()]).toEqual(['default/mine']);
    expect([...run([], services, { ...config, defaultClass: true }).keys()]).toEqual(['default/mine', 'default/unclassed']);
  });

  it('reports a Service it cannot read, and serves the rest', () => {
    const w: World = { nodes: [node('n1', ['192.0.2.1'])], services: [svc('good', [tcp(80)]), svc('bad', [tcp(81)])], config };
    const services = w.services.map(serviceObject);
    Object.defineProperty(services[1]!.spec, 'ports', { get: () => { throw new Error('no ports today'); } });
    const out = allocate(input(w, services)).services;
    expect(out.get('default/good')!.condition.status).toBe('True');
    expect(out.get('default/bad')!.condition).toEqual({ status: 'False', reason: 'InvalidService', message: 'cannot read the Service: no ports today' });
  });
});

// ---------------------------------------------------------------------------
// A bounded, stable address set per Service (issue 29)

/** Node i of a large cluster: IPv4 in 198.18.0.0/15 (the benchmarking range), IPv6 in 2001:db8:1::/64. */
function bigNode(i: number, extra: Partial<NodeSpec> = {}, v6 = true): NodeSpec {
  return node(`node-${String(i).padStart(4, '0')}`, [`198.18.${i >> 8}.${i & 255}`, ...(v6 ? [`2001:db8:1::${(i + 1).toString(16)}`] : [])], extra);
}

const MAX = 'pier.dev/max-addresses';

/** What a Service's K is, read independently: the annotation when it is a positive integer or `all`, else the configured one. */
function boundOf(s: ServiceSpec, cfg: AllocatorConfig): number {
  const a = s.annotations?.[MAX]?.trim();
  if (a === 'all') return Infinity;
  if (a !== undefined && /^\d+$/.test(a) && Number(a) >= 1) return Number(a);
  return cfg.maxAddresses ?? 16;
}

const ipsOf = (a: ServiceAllocation | undefined) => (a?.ingress ?? []).map((i) => i.ip);
const ofFamily = (ips: Iterable<string>, family: Fam) => [...ips].filter((ip) => famOf(ip) === family);

/**
 * Clusters larger than a Service's K: up to 28 nodes, some ineligible in each
 * way, two pools; Services of both policies, some with endpoints, some with
 * a status from before (addresses of nodes that exist or not), some with the
 * annotation (valid or not). Ports are unique per Service unless `shared`.
 */
const boundWorldArb: fc.Arbitrary<World & { shared: boolean }> = fc
  .record({
    nodes: fc.array(fc.record({ v6: fc.integer({ min: 0, max: 3 }), flaw: fc.integer({ min: 0, max: 14 }), pool: fc.integer({ min: 0, max: 9 }) }), { maxLength: 28 }),
    k: fc.integer({ min: 1, max: 5 }),
    shared: fc.boolean(),
    services: fc.array(
      fc.record({
        families: fc.constantFrom(['IPv4'], ['IPv4'], ['IPv6'], ['IPv4', 'IPv6'], ['IPv6', 'IPv4']),
        local: fc.integer({ min: 0, max: 2 }),
        pool: fc.integer({ min: 0, max: 9 }),
        max: fc.constantFrom(undefined, undefined, undefined, undefined, '2', '7', 'all', '0', 'lots'),
        endpoints: fc.array(fc.record({ node: fc.nat(32), v6: fc.boolean(), kind: fc.constantFrom('ready', 'ready', 'ready', 'terminating', 'notReady') }), { maxLength: 10 }),
        status: fc.array(fc.record({ node: fc.nat(32), v6: fc.boolean() }), { maxLength: 8 }),
      }),
      { minLength: 1, maxLength: 10 },
    ),
  })
  .map(({ nodes, k, shared, services }) => {
    const nodeSpecs = nodes.map((n, i) =>
      bigNode(
        i,
        {
          ready: n.flaw !== 1,
          lease: n.flaw === 2 ? 'stale' : n.flaw === 3 ? 'missing' : 'fresh',
          excluded: n.flaw === 4,
          forward: { ipv4: n.flaw !== 5, ipv6: n.flaw !== 6 },
          pool: n.pool === 0 ? 'b' : undefined,
        },
        n.v6 !== 0,
      ),
    );
    const addressOf = (i: number, v6: boolean) => (v6 ? `2001:db8:1::${(i + 1).toString(16)}` : `198.18.${i >> 8}.${i & 255}`);
    const port = (i: number) => (shared ? 80 : 1000 + i);
    const serviceSpecs = services.map((s, i) =>
      svc(`s${i}`, [tcp(port(i))], {
        created: i,
        families: [...s.families],
        local: s.local === 0,
        pool: s.pool === 0 ? 'b' : undefined,
        ...(s.max !== undefined ? { annotations: { [MAX]: s.max } } : {}),
        endpoints: s.endpoints.map((e) => ({
          node: bigNode(e.node).name,
          v6: e.v6,
          ...(e.kind === 'ready' ? { ready: true } : e.kind === 'notReady' ? { ready: false } : { ready: false, serving: true, terminating: true }),
        })),
        status: s.status.map((x) => ({ ip: addressOf(x.node, x.v6), ports: [{ port: port(i), protocol: 'TCP' }] })),
      }),
    );
    return { nodes: nodeSpecs, services: serviceSpecs, config: defaultAllocatorConfig({ maxAddresses: k }), shared };
  });

/** Ways a node stops serving, and what it still serves afterwards. */
const LOSSES: { name: string; apply: (n: NodeSpec) => NodeSpec | undefined }[] = [
  { name: 'deleted', apply: () => undefined },
  { name: 'NotReady', apply: (n) => ({ ...n, ready: false }) },
  { name: 'Lease expired', apply: (n) => ({ ...n, lease: 'stale' }) },
  { name: 'excluded', apply: (n) => ({ ...n, excluded: true }) },
  { name: 'IPv6 forwarding off', apply: (n) => ({ ...n, forward: { ...n.forward, ipv6: false } }) },
];

/** Node counts: how many Services list each node (by its address), per family. */
function loads(allocation: Allocation, nodes: NodeSpec[], family: Fam): Map<string, number> {
  const byAddress = new Map(nodes.map((n) => [chosenAddress(n, family), n.name]));
  const out = new Map(nodes.map((n) => [n.name, 0]));
  for (const a of allocation.services.values()) for (const ip of ofFamily(ipsOf(a), family)) out.set(byAddress.get(ip)!, out.get(byAddress.get(ip)!)! + 1);
  return out;
}

/**
 * MurmurHash3 x86 32-bit over bytes, written from the reference (smhasher),
 * byte by byte, to check pier's string version against.
 */
function murmur3Bytes(bytes: Uint8Array, seed = 0): number {
  const c1 = 0xcc9e2d51;
  const c2 = 0x1b873593;
  let h = seed >>> 0;
  const blocks = Math.floor(bytes.length / 4);
  for (let b = 0; b < blocks; b++) {
    let k = bytes[4 * b]! | (bytes[4 * b + 1]! << 8) | (bytes[4 * b + 2]! << 16) | (bytes[4 * b + 3]! << 24);
    k = Math.imul(k, c1);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, c2);
    h ^= k;
    h = (h << 13) | (h >>> 19);
    h = (Math.imul(h, 5) + 0xe6546b64) | 0;
  }
  const tail = bytes.length & 3;
  let k = 0;
  if (tail >= 3) k ^= bytes[4 * blocks + 2]! << 16;
  if (tail >= 2) k ^= bytes[4 * blocks + 1]! << 8;
  if (tail >= 1) {
    k ^= bytes[4 * blocks]!;
    k = Math.imul(k, c1);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, c2);
    h ^= k;
  }
  h ^= bytes.length;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

describe('allocate: at most K addresses per family, stable and spread', () => {
  it('lists min(K, eligible) addresses per family, all of them eligible, K from the annotation when valid', () => {
    fc.assert(
      fc.property(boundWorldArb, (w) => {
        const a = allocate(input(w));
        for (const s of w.services) {
          const got = ipsOf(a.services.get(key(s)));
          const expected = expectedAddresses(w, s);
          for (const ip of got) expect(expected.has(ip), ip).toBe(true);
          const k = boundOf(s, w.config);
          for (const family of familiesOf(s)) expect(ofFamily(got, family)).toHaveLength(Math.min(k, ofFamily(expected, family).length));
          const invalid = s.annotations?.[MAX] === '0' || s.annotations?.[MAX] === 'lots';
          expect(a.services.get(key(s))!.problems.some((p) => p.reason === 'InvalidMaxAddresses')).toBe(invalid);
        }
      }),
      RUNS,
    );
  });

  it('returns what it was fed back: a restarted controller keeps every status', () => {
    fc.assert(
      fc.property(boundWorldArb, (w) => {
        const services = w.services.map(serviceObject);
        const first = allocate(input(w, services));
        const second = allocate(input(w, feedBack(services, first)));
        expect([...second.services]).toEqual([...first.services]);
      }),
      RUNS,
    );
  });

  it('when a node stops serving, changes only the Services that listed it, and those only by its address', () => {
    fc.assert(
      fc.property(boundWorldArb, fc.nat(), fc.nat({ max: LOSSES.length - 1 }), (w, pick, how) => {
        fc.pre(w.nodes.length > 0);
        const steady = feedBack(w.services.map(serviceObject), allocate(input(w)));
        const before = allocate(input(w, steady));
        const victim = w.nodes[pick % w.nodes.length]!;
        const after = allocate(input({ ...w, nodes: w.nodes.flatMap((n) => (n === victim ? (LOSSES[how]!.apply(n) ?? []) : [n])) }, steady));
        const gone = new Set(victim.addresses.map((a) => canonical(a.address)));
        for (const [k, was] of before.services) {
          const now = after.services.get(k)!;
          const listed = ipsOf(was).some((ip) => gone.has(ip));
          if (!listed) {
            // A family no node could serve names a count of all nodes; a shared port may now meet an older Service elsewhere.
            const countsNodes = was.problems.some((p) => p.reason === 'NoEligibleNodes');
            if (w.shared || countsNodes) expect(ipsOf(now), k).toEqual(ipsOf(was));
            else expect(now, k).toEqual(was);
          } else {
            // Every other address stays; only the lost node's may go (and be replaced).
            for (const ip of ipsOf(was)) if (!gone.has(ip)) expect(ipsOf(now), k).toContain(ip);
          }
        }
      }),
      RUNS,
    );
  });

  it('keeps the old addresses when K is raised, and lists a subset of them when it is lowered', () => {
    fc.assert(
      fc.property(boundWorldArb, fc.integer({ min: 1, max: 6 }), (w, k2) => {
        // No statuses from before and no annotations: the bound is the flag's.
        const plain = { ...w, services: w.services.map((s) => ({ ...s, status: [], annotations: {} })) };
        const first = allocate(input(plain));
        const restarted = feedBack(plain.services.map(serviceObject), first);
        const second = allocate(input({ ...plain, config: { ...plain.config, maxAddresses: k2 } }, restarted));
        const k1 = plain.config.maxAddresses!;
        for (const [k, was] of first.services) {
          const now = ipsOf(second.services.get(k));
          if (k2 >= k1) for (const ip of ipsOf(was)) expect(now, k).toContain(ip);
          else for (const ip of now) expect(ipsOf(was), k).toContain(ip);
        }
      }),
      RUNS,
    );
  });

  it('keeps what the status lists among the Service\'s best 2K nodes by score, up to K, and fills from the best', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 2, max: 30 }),
        fc.integer({ min: 1, max: 5 }),
        fc.string({ minLength: 1, maxLength: 10 }),
        fc.array(fc.boolean(), { minLength: 30, maxLength: 30 }),
        (count, k, name, inStatus) => {
          fc.pre(count > k);
          const nodes = Array.from({ length: count }, (_, i) => bigNode(i, {}, false));
          const web = svc(name, [tcp(80)]);
          // The rule, from the exported score alone: best first, ties by name.
          const score = (n: NodeSpec) => rendezvousScore(`default/${name}`, n.name);
          const ranked = [...nodes].sort((x, y) => score(y) - score(x) || (x.name < y.name ? -1 : 1));
          const listed = nodes.filter((_, i) => inStatus[i]);
          const kept = ranked.slice(0, 2 * k).filter((n) => listed.includes(n)).slice(0, k);
          const expected = [...kept, ...ranked.filter((n) => !kept.includes(n))].slice(0, k);
          const status = listed.map((n) => ({ ip: chosenAddress(n, 'ipv4')!, ports: [{ port: 80, protocol: 'TCP' }] }));
          const got = ipsOf(run(nodes, [{ ...web, status }], defaultAllocatorConfig({ maxAddresses: k })).get(`default/${name}`));
          expect(new Set(got)).toEqual(new Set(expected.map((n) => chosenAddress(n, 'ipv4'))));
        },
      ),
      RUNS,
    );
  });

  it('never lets two Services serve one (address, protocol, port) when they list different nodes', () => {
    fc.assert(
      fc.property(boundWorldArb, (w) => {
        const a = allocate(input(w));
        const owner = new Map<string, string>();
        for (const [k, svc] of a.services) {
          for (const ing of svc.ingress) {
            for (const p of ing.ports) {
              if (p.error) continue;
              const frontend = `${ing.ip}|${p.protocol}|${p.port}`;
              expect(owner.get(frontend), frontend).toBeUndefined();
              owner.set(frontend, k);
            }
          }
        }
      }),
      RUNS,
    );
  });

  it('judges an eligible node the Service does not list as notChosen, and every listed one as serving', () => {
    fc.assert(
      fc.property(boundWorldArb, (w) => {
        const i = input(w);
        const a = allocate(i);
        for (const [k, judged] of judgeNodes(i)) {
          const s = w.services.find((x) => key(x) === k)!;
          const listed = new Set(ipsOf(a.services.get(k)));
          for (const j of judged) {
            const n = w.nodes.find((x) => x.name === j.node)!;
            const addr = chosenAddress(n, j.family);
            if (!j.excluded) expect(listed.has(addr!), `${k} ${j.node}`).toBe(true);
            else if (j.excluded.kind === 'notChosen') {
              expect(eligible(w, n, s, j.family)).toBe(true);
              expect(listed.has(addr!)).toBe(false);
            } else expect(listed.has(addr ?? '')).toBe(false);
          }
        }
      }),
      RUNS,
    );
  });

  it('keeps every eligible node while there are at most K, then lists the K best-scoring', () => {
    const cfg = defaultAllocatorConfig({ maxAddresses: 3 });
    const nodes = [0, 1, 2, 3, 4, 5].map((i) => bigNode(i, {}, false));
    const web = svc('web', [tcp(80)]);
    expect(ipsOf(run(nodes.slice(0, 3), [web], cfg).get('default/web'))).toEqual(['198.18.0.0', '198.18.0.1', '198.18.0.2']);
    const best = [...nodes].sort((x, y) => rendezvousScore('default/web', y.name) - rendezvousScore('default/web', x.name)).slice(0, 3);
    expect(ipsOf(run(nodes, [web], cfg).get('default/web'))).toEqual(best.map((n) => chosenAddress(n, 'ipv4')!).sort(numeric));
    // The default is 16: a cluster of 16 nodes is served as before, the 17th is where the bound begins.
    const sixteen = Array.from({ length: 17 }, (_, i) => bigNode(i, {}, false));
    expect(ipsOf(run(sixteen.slice(0, 16), [web]).get('default/web'))).toHaveLength(16);
    expect(ipsOf(run(sixteen, [web]).get('default/web'))).toHaveLength(16);
  });

  it('takes K per Service from pier.dev/max-addresses, and says so when the value is bad', () => {
    const nodes = Array.from({ length: 6 }, (_, i) => bigNode(i));
    const cfg = defaultAllocatorConfig({ maxAddresses: 2 });
    const dual = (max?: string) => svc('web', [tcp(80)], { families: ['IPv4', 'IPv6'], ...(max !== undefined ? { annotations: { [MAX]: max } } : {}) });
    const count = (max?: string) => run(nodes, [dual(max)], cfg).get('default/web')!;
    expect(ipsOf(count())).toHaveLength(4);
    expect(ipsOf(count('1'))).toHaveLength(2);
    expect(ipsOf(count(' 5 '))).toHaveLength(10);
    expect(ipsOf(count('all'))).toHaveLength(12);
    for (const bad of ['0', '-1', 'ALL', 'two', '1.5']) {
      const out = count(bad);
      expect(ipsOf(out), bad).toHaveLength(4);
      expect(out.condition.status).toBe('True');
      expect(out.problems).toEqual([
        { reason: 'InvalidMaxAddresses', message: `annotation pier.dev/max-addresses=${JSON.stringify(bad)} is neither a positive integer nor "all"; using 2 (the controller's --max-addresses) addresses per family` },
      ]);
    }
    // The flag may be `all`: every eligible node, as before there was a bound.
    expect(ipsOf(run(nodes, [dual()], defaultAllocatorConfig({ maxAddresses: Infinity })).get('default/web'))).toHaveLength(12);
  });

  it('does not move a Service back to a node that returns, and a status that lists every node keeps the best-scoring', () => {
    const cfg = defaultAllocatorConfig({ maxAddresses: 2 });
    const nodes = Array.from({ length: 8 }, (_, i) => bigNode(i, {}, false));
    const w: World = { nodes, services: [svc('web', [tcp(80)])], config: cfg };
    const fresh = allocate(input(w));
    const top = ipsOf(fresh.services.get('default/web'));
    // Its first node goes down: one replacement.
    const down = nodes.find((n) => chosenAddress(n, 'ipv4') === top[0])!;
    const without = { ...w, nodes: nodes.map((n) => (n === down ? { ...n, ready: false } : n)) };
    const moved = allocate(input(without, feedBack(w.services.map(serviceObject), fresh)));
    const replaced = ipsOf(moved.services.get('default/web'));
    expect(replaced).toContain(top[1]);
    expect(replaced).not.toContain(top[0]);
    // It comes back: the status stays as it is (a fresh allocation would list it again).
    const back = allocate(input(w, feedBack(w.services.map(serviceObject), moved)));
    expect(ipsOf(back.services.get('default/web'))).toEqual(replaced);
    expect(ipsOf(allocate(input(w)).services.get('default/web'))).toEqual(top);
    // A status from before the bound, listing all eight, keeps the two a fresh allocation picks.
    const everything = svc('web', [tcp(80)], { status: nodes.map((n) => ({ ip: chosenAddress(n, 'ipv4')!, ports: [{ port: 80, protocol: 'TCP' }] })) });
    expect(ipsOf(run(nodes, [everything], cfg).get('default/web'))).toEqual(top);
  });

  it('lets a growing cluster rebalance: a status keeps a node only while it ranks among the Service\'s best 2K', () => {
    // 8 nodes and K = 8: every Service lists all of them. Then 24 more join.
    const k = 8;
    const cfg = defaultAllocatorConfig({ maxAddresses: k });
    const services = Array.from({ length: 1200 }, (_, i) => svc(`grow-${i}`, [tcp(1000 + (i % 60000))]));
    const small = Array.from({ length: 8 }, (_, i) => bigNode(i, {}, false));
    const first = allocate(input({ nodes: small, services, config: cfg }));
    for (const a of first.services.values()) expect(a.ingress).toHaveLength(8);
    const grown = Array.from({ length: 32 }, (_, i) => bigNode(i, {}, false));
    const after = allocate(input({ nodes: grown, services, config: cfg }, feedBack(services.map(serviceObject), first)));
    const mean = (services.length * k) / grown.length;
    const sigma = Math.sqrt(mean);
    const counts = [...loads(after, grown, 'ipv4').values()];
    // Each old node is kept by the Services that rank it in their best 16 of 32 (about half), so at most about twice its share;
    // each new node gets a share of the places they free. Without the window new nodes would get nothing.
    expect(Math.max(...counts)).toBeLessThanOrEqual(2 * mean + 5 * sigma);
    expect(Math.min(...counts)).toBeGreaterThanOrEqual(mean / 4);
    // And fed back once more, nothing moves.
    const again = allocate(input({ nodes: grown, services, config: cfg }, feedBack(services.map(serviceObject), after)));
    expect([...again.services]).toEqual([...after.services]);
  });

  it('spreads Services evenly: each node\'s count within 5 standard deviations of K/N of them, in both families', () => {
    fc.assert(
      fc.property(fc.string({ minLength: 1, maxLength: 8 }), fc.constantFrom('default', 'shop', 'kube-system'), (prefix, namespace) => {
        const k = 8;
        const nodes = Array.from({ length: 50 }, (_, i) => bigNode(i));
        const services = Array.from({ length: 1500 }, (_, i) => ({ ...svc(`${prefix}-${i}`, [tcp(1000 + i)], { families: ['IPv4', 'IPv6'] }), namespace }));
        const a = allocate(input({ nodes, services, config: defaultAllocatorConfig({ maxAddresses: k }) }));
        // Each Service picks K of N: a node's count is Binomial(S, K/N).
        const p = k / nodes.length;
        const mean = services.length * p;
        const sigma = Math.sqrt(mean * (1 - p));
        for (const family of ['ipv4', 'ipv6'] as const) {
          const counts = [...loads(a, nodes, family).values()];
          expect(counts.reduce((x, y) => x + y, 0)).toBe(services.length * k);
          expect(Math.max(...counts)).toBeLessThanOrEqual(mean + 5 * sigma);
          expect(Math.min(...counts)).toBeGreaterThanOrEqual(mean - 5 * sigma);
        }
        // The families are ranked alike: the same nodes serve both.
        for (const alloc of a.services.values()) {
          const v4 = ofFamily(ipsOf(alloc), 'ipv4').map((ip) => nodes.find((n) => chosenAddress(n, 'ipv4') === ip)!.name).sort();
          const v6 = ofFamily(ipsOf(alloc), 'ipv6').map((ip) => nodes.find((n) => chosenAddress(n, 'ipv6') === ip)!.name).sort();
          expect(v6).toEqual(v4);
        }
      }),
      { numRuns: 4 },
    );
  });

  it('at scale, a node\'s loss rewrites exactly the Services that listed it, one address each', () => {
    const cfg = defaultAllocatorConfig({ maxAddresses: 4 });
    const nodes = Array.from({ length: 40 }, (_, i) => bigNode(i, {}, false));
    const services = Array.from({ length: 400 }, (_, i) => svc(`app-${i}`, [tcp(1000 + i)]));
    const w: World = { nodes, services, config: cfg };
    const steady = feedBack(services.map(serviceObject), allocate(input(w)));
    const before = allocate(input(w, steady));
    const victim = nodes[17]!;
    const after = allocate(input({ ...w, nodes: nodes.map((n) => (n === victim ? { ...n, lease: 'stale' } : n)) }, steady));
    const address = chosenAddress(victim, 'ipv4')!;
    let changed = 0;
    let listed = 0;
    for (const [k, was] of before.services) {
      const now = after.services.get(k)!;
      if (ipsOf(was).includes(address)) listed++;
      if (JSON.stringify(now) === JSON.stringify(was)) continue;
      changed++;
      expect(ipsOf(was)).toContain(address);
      expect(ipsOf(now)).not.toContain(address);
      expect(ipsOf(now).filter((ip) => !ipsOf(was).includes(ip))).toHaveLength(1);
    }
    expect(listed).toBeGreaterThan(0);
    expect(changed).toBe(listed);
  });

  it('caps a Local Service too: nodes with a ready endpoint before draining ones, most ready endpoints first in the list, and keeps a listed node while it still serves', () => {
    const cfg = defaultAllocatorConfig({ maxAddresses: 3 });
    const nodes = Array.from({ length: 8 }, (_, i) => bigNode(i, {}, false));
    const ready = (i: number): Endpoint => ({ node: nodes[i]!.name, v6: false, ready: true });
    const draining = (i: number): Endpoint => ({ node: nodes[i]!.name, v6: false, ready: false, serving: true, terminating: true });
    // Ready endpoints on 0, 1, 2 (two on 2) and 4; 5, 6, 7 only draining.
    const web = svc('web', [tcp(80)], { local: true, endpoints: [ready(0), ready(1), ready(2), ready(2), ready(4), draining(5), draining(6), draining(7)] });
    const w: World = { nodes, services: [web], config: cfg };
    const first = allocate(input(w)).services.get('default/web')!;
    const listed = ipsOf(first);
    expect(listed).toHaveLength(3);
    const readyAddresses = [0, 1, 2, 4].map((i) => chosenAddress(nodes[i]!, 'ipv4')!);
    for (const ip of listed) expect(readyAddresses).toContain(ip);
    // In the list, the node with two ready endpoints first if it is listed, then numeric.
    const readyCount = (ip: string) => (ip === chosenAddress(nodes[2]!, 'ipv4') ? 2 : 1);
    expect(listed).toEqual([...listed].sort((x, y) => readyCount(y) - readyCount(x) || numeric(x, y)));
    // A listed node's pod starts draining: it still serves, so it stays listed.
    const drained = nodes.findIndex((n) => chosenAddress(n, 'ipv4') === listed[listed.length - 1]);
    const rolling = { ...web, endpoints: web.endpoints.map((e) => (e.node === nodes[drained]!.name ? draining(drained) : e)) };
    const restarted = feedBack([serviceObject(web)], allocate(input(w)));
    const during = allocate(input({ ...w, services: [rolling] }, [{ ...serviceObject(rolling), status: restarted[0]!.status }])).services.get('default/web')!;
    expect(new Set(ipsOf(during))).toEqual(new Set(listed));
    // Once it no longer serves there, another node with a ready endpoint takes its place.
    const gone = { ...web, endpoints: web.endpoints.filter((e) => e.node !== nodes[drained]!.name) };
    const after = allocate(input({ ...w, services: [gone] }, [{ ...serviceObject(gone), status: restarted[0]!.status }])).services.get('default/web')!;
    expect(ipsOf(after)).toHaveLength(3);
    expect(ipsOf(after)).not.toContain(listed[listed.length - 1]);
    for (const ip of ipsOf(after)) expect(readyAddresses).toContain(ip);
  });

  it('judges conflicts per address: a shared port conflicts only where both Services list a node', () => {
    const cfg = defaultAllocatorConfig({ maxAddresses: 2 });
    const nodes = Array.from({ length: 4 }, (_, i) => bigNode(i, {}, false));
    const at = (...is: number[]) => is.map((i) => ({ ip: chosenAddress(nodes[i]!, 'ipv4')!, ports: [{ port: 80, protocol: 'TCP' }] }));
    // Statuses from before pin the nodes: old on 0 and 1, young on 1 and 2.
    const out = run(nodes, [svc('old', [tcp(80)], { created: 1, status: at(0, 1) }), svc('young', [tcp(80)], { created: 2, status: at(1, 2) })], cfg);
    expect(out.get('default/old')!.condition.reason).toBe('Serving');
    const young = out.get('default/young')!;
    expect(young.ingress).toEqual([
      { ip: '198.18.0.1', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP', error: 'PortConflict' }] },
      { ip: '198.18.0.2', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }] },
    ]);
    expect(young.condition.reason).toBe('PartiallyServed');
    // Allocated ports stay unique per protocol across the cluster, whichever nodes each Service lists.
    const seeds = run(nodes, [svc('a', [tcp(80)], { mode: 'allocate', status: at(0) }), svc('b', [tcp(80)], { mode: 'allocate', status: at(3), created: 1 })], cfg);
    expect(seeds.get('default/a')!.portMapping).toBe('{"80/TCP":40000}');
    expect(seeds.get('default/b')!.portMapping).toBe('{"80/TCP":40001}');
  });

  it('explains a node it does not list, for pier status', () => {
    const cfg = defaultAllocatorConfig({ maxAddresses: 1 });
    const nodes = [bigNode(0, {}, false), bigNode(1, {}, false)];
    const w: World = { nodes, services: [svc('web', [tcp(80)])], config: cfg };
    const listed = ipsOf(allocate(input(w)).services.get('default/web'));
    const judged = judgeNodes(input(w)).get('default/web')!;
    const other = judged.find((j) => !listed.includes(j.addresses[0]!))!;
    expect(other.excluded).toEqual({
      kind: 'notChosen',
      why: "it is eligible, but the Service lists at most 1 IPv4 addresses (pier.dev/max-addresses, --max-addresses) and this node's is not among them",
    });
    expect(judged.filter((j) => !j.excluded)).toHaveLength(1);
  });

  it('hashes as MurmurHash3 (x86, 32 bit) of the name\'s UTF-16LE bytes, which its reference vectors pin', () => {
    // smhasher's verification values for the byte-wise reference written above.
    expect(murmur3Bytes(new Uint8Array(0), 0)).toBe(0);
    expect(murmur3Bytes(new Uint8Array(0), 1)).toBe(0x514e28b7);
    expect(murmur3Bytes(new Uint8Array([0x21, 0x43, 0x65, 0x87]), 0)).toBe(0xf55b516b);
    expect(murmur3Bytes(new Uint8Array([0x21, 0x43, 0x65]), 0)).toBe(0x7e4a8634);
    expect(murmur3Bytes(new Uint8Array([0x21, 0x43]), 0)).toBe(0xa0f7b07a);
    expect(murmur3Bytes(new Uint8Array([0x21]), 0)).toBe(0x72661cf4);
    expect(murmur3Bytes(new Uint8Array([0, 0, 0, 0]), 0)).toBe(0x2362f9de);
    expect(murmur3Bytes(new Uint8Array(0), 0xffffffff)).toBe(0x81f16f39);
    expect(murmur3Bytes(new TextEncoder().encode('The quick brown fox jumps over the lazy dog'), 0)).toBe(0x2e4ff723);
    fc.assert(
      fc.property(fc.string({ unit: 'binary', maxLength: 40 }), (text) => {
        expect(hashText(text)).toBe(murmur3Bytes(new Uint8Array(Buffer.from(text, 'utf16le'))));
      }),
      { numRuns: 500 },
    );
    // The score is part of what statuses say (a change would move Services on an upgrade):
    // MurmurHash3's finaliser of both names' hashes, XORed.
    const fmix = (x: number) => {
      x ^= x >>> 16;
      x = Math.imul(x, 0x85ebca6b);
      x ^= x >>> 13;
      x = Math.imul(x, 0xc2b2ae35);
      x ^= x >>> 16;
      return x >>> 0;
    };
    const utf16 = (t: string) => new Uint8Array(Buffer.from(t, 'utf16le'));
    fc.assert(
      fc.property(fc.string({ maxLength: 30 }), fc.string({ maxLength: 30 }), (service, nodeName) => {
        expect(rendezvousScore(service, nodeName)).toBe(fmix(murmur3Bytes(utf16(service)) ^ murmur3Bytes(utf16(nodeName))));
      }),
      { numRuns: 200 },
    );
  });

  it('reads the flag and the annotation alike: a positive integer or all', () => {
    expect(parseMaxAddresses('16')).toBe(16);
    expect(parseMaxAddresses(' 1 ')).toBe(1);
    expect(parseMaxAddresses('all')).toBe(Infinity);
    expect(parseMaxAddresses('99999999999999999999')).toBe(Infinity);
    for (const bad of ['0', '', '-3', 'All', '2.0', '0x10', undefined, 3]) expect(parseMaxAddresses(bad), String(bad)).toBeUndefined();
  });
});
