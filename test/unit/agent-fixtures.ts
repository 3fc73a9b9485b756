// Shared by the agent's unit and e2e tests: generated Kubernetes worlds (valid
// ones, and ones with a single corruption aimed at one Service), and a small
// interpreter for the subset of iptables that pier renders (agent/interp.ts),
// so properties can ask "where does this packet go?" instead of matching rule text.
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import fc from 'fast-check';
import type { Model, ModelConfig, ModelInput } from '../../agent/engine/model.ts';
import { walk as interpWalk, type Packet, type WalkResult } from '../../agent/iptables/interp.ts';
import { buildModel } from '../support/oracle.ts';
import { PROTOCOL, PROTOCOLS } from '../../lib/protocols.ts';

export const NODE = 'n1';
export const CLASS = 'pier.dev/lb';
export const NODE_V4 = ['192.0.2.11', '192.0.2.12'];
export const NODE_V6 = ['2001:db8::11', '2001:db8:0:0:0:0:0:12'];
/** Addresses of another node: a Service advertised there is none of this agent's business. */
export const OTHER_NODE = ['192.0.2.21', '2001:db8::21'];
export const CONFIG: ModelConfig = { loadBalancerClass: CLASS, defaultClass: false, maxPortsPerService: 6 };
/** The agent's default connection-mark bits. */
export const MARKS = { accept: 0x2000, masquerade: 0x1000 };
/** A client outside every source range the generators produce (short of a /0). */
export const CLIENT = { ipv4: '192.0.2.250', ipv6: '2001:db8:ffff::50' } as const;

export interface PortSpec {
  name: string;
  protocol: string;
  port: number;
  targetPort: number;
}

export interface EndpointSpec {
  v6: boolean;
  host: number;
  node: string;
  ready: boolean | undefined;
  serving: boolean | undefined;
  terminating: boolean | undefined;
}

export interface ServiceSpec {
  name: string;
  namespace: string;
  cls: string | undefined;
  local: boolean;
  ports: PortSpec[];
  ingress: string[];
  /** Per ingress entry, per port: an error means the controller could not serve it. */
  errors: boolean[][];
  external: number[];
  ranges: string[];
  rangesInAnnotation: boolean;
  endpoints: EndpointSpec[];
  slices: number;
  created: number;
  /** sessionAffinity ClientIP with this timeoutSeconds ('default': none given); undefined: no affinity. */
  affinity: number | 'default' | undefined;
}

export interface World {
  services: ServiceSpec[];
}

const protocols = fc.constantFrom('TCP', 'UDP', 'SCTP');
const v4Range = fc.tuple(fc.constantFrom('198.51.100', '203.0.113'), fc.integer({ min: 0, max: 255 }), fc.constantFrom(24, 25, 28, 32, 16, 0)).map(([n, h, p]) => `${n}.${h}/${p}`);
const v6Range = fc.tuple(fc.integer({ min: 0, max: 0xfffe }), fc.constantFrom(48, 64, 128, 0)).map(([h, p]) => `2001:db8:${h.toString(16)}::${h % 7}/${p}`);
const bareAddress = fc.oneof(fc.integer({ min: 1, max: 254 }).map((h) => `198.51.100.${h}`), fc.integer({ min: 1, max: 0xffff }).map((h) => `2001:db8:1::${h.toString(16)}`));

const portName = fc.constantFrom('http', 'https', 'dns', 'metrics', 'x-1', '');

const endpointArb: fc.Arbitrary<EndpointSpec> = fc.record({
  v6: fc.boolean(),
  host: fc.integer({ min: 1, max: 12 }),
  node: fc.constantFrom(NODE, 'n2'),
  ready: fc.constantFrom(true, false, undefined, undefined),
  serving: fc.constantFrom(true, false, undefined),
  terminating: fc.constantFrom(true, false, undefined),
});

const serviceArb: fc.Arbitrary<Omit<ServiceSpec, 'name' | 'external' | 'created'>> = fc
  .record({
    namespace: fc.constantFrom('default', 'shop', 'kube-system'),
    cls: fc.constantFrom<string | undefined>(CLASS, CLASS, CLASS, undefined, 'other.dev/lb'),
    local: fc.boolean(),
    ports: fc.array(fc.record({ name: portName, protocol: protocols, port: fc.integer({ min: 1, max: 65535 }), targetPort: fc.integer({ min: 1, max: 65535 }) }), { minLength: 1, maxLength: 3 }),
    ingress: fc.subarray([...NODE_V4, ...NODE_V6, ...OTHER_NODE], { minLength: 1 }),
    errorSeed: fc.array(fc.array(fc.boolean(), { minLength: 3, maxLength: 3 }), { minLength: 6, maxLength: 6 }),
    errorRate: fc.constantFrom(0, 0, 0.3),
    ranges: fc.oneof(fc.constant([] as string[]), fc.array(fc.oneof(v4Range, v6Range, bareAddress), { minLength: 1, maxLength: 6 })),
    rangesInAnnotation: fc.boolean(),
    endpoints: fc.array(endpointArb, { maxLength: 10 }),
    slices: fc.integer({ min: 1, max: 3 }),
    affinity: fc.constantFrom<ServiceSpec['affinity']>(undefined, undefined, 'default', 60, 86400),
  })
  .map(({ errorSeed, errorRate, ports, ...rest }) => {
    // Port names must be unique within a Service, and an unnamed one is alone.
    const named = ports.length === 1 ? ports : ports.map((p, i) => ({ ...p, name: `${p.name || 'p'}${i}` }));
    return { ...rest, ports: named, errors: errorSeed.map((row) => row.map((b, i) => errorRate > 0 && b && i % 2 === 0)) };
  });

/** Services with distinct names and distinct external ports, so a valid world has no conflicts. */
export const worldArb: fc.Arbitrary<World> = fc
  .tuple(fc.array(serviceArb, { minLength: 1, maxLength: 6 }), fc.uniqueArray(fc.integer({ min: 1, max: 65535 }), { minLength: 18, maxLength: 18 }), fc.array(fc.integer({ min: 0, max: 1e6 }), { minLength: 6, maxLength: 6 }))
  .map(([services, ports, created]) => {
    let next = 0;
    return {
      services: services.map((s, i) => ({
        ...s,
        name: `svc-${i}`,
        external: s.ports.map(() => ports[next++]!),
        created: created[i]!,
      })),
    };
  });

export function endpointAddress(e: EndpointSpec): string {
  return e.v6 ? `2001:db8:1::${e.host.toString(16)}` : `198.18.0.${e.host}`;
}

/** The world as Kubernetes objects: what the agent reads from its informers. */
export function toInput(world: World, overrides: Partial<ModelInput> = {}): ModelInput {
  const services: V1Service[] = [];
  const slices: V1EndpointSlice[] = [];
  for (const s of world.services) {
    services.push({
      apiVersion: 'v1',
      kind: 'Service',
      metadata: {
        namespace: s.namespace,
        name: s.name,
        uid: `uid-${s.namespace}-${s.name}`,
        creationTimestamp: new Date(Date.UTC(2024, 0, 1) + s.created * 1000),
        ...(s.ranges.length > 0 && s.rangesInAnnotation ? { annotations: { 'service.beta.kubernetes.io/load-balancer-source-ranges': s.ranges.join(', ') } } : {}),
      },
      spec: {
        type: 'LoadBalancer',
        ...(s.cls ? { loadBalancerClass: s.cls } : {}),
        externalTrafficPolicy: s.local ? 'Local' : 'Cluster',
        ports: s.ports.map((p) => ({ ...(p.name ? { name: p.name } : {}), protocol: p.protocol, port: p.port, targetPort: p.targetPort as never })),
        ...(s.ranges.length > 0 && !s.rangesInAnnotation ? { loadBalancerSourceRanges: s.ranges } : {}),
        ...(s.affinity !== undefined ? { sessionAffinity: 'ClientIP' } : {}),
        ...(typeof s.affinity === 'number' ? { sessionAffinityConfig: { clientIP: { timeoutSeconds: s.affinity } } } : {}),
      },
      status: {
        loadBalancer: {
          ingress: s.ingress.map((ip, i) => ({
            ip,
            ipMode: 'Proxy',
            ports: s.ports.map((p, j) => ({ port: s.external[j]!, protocol: p.protocol, ...(s.errors[i]?.[j] ? { error: 'PortConflict' } : {}) })),
          })),
        },
      },
    });
    // Endpoints are dealt round-robin over the slices and both families; a
    // slice of the wrong family or an FQDN slice must not matter.
    for (let k = 0; k < s.slices; k++) {
      for (const v6 of [false, true]) {
        const eps = s.endpoints.filter((e, i) => e.v6 === v6 && i % s.slices === k);
        slices.push({
          apiVersion: 'discovery.k8s.io/v1',
          kind: 'EndpointSlice',
          metadata: { namespace: s.namespace, name: `${s.name}-${v6 ? 'v6' : 'v4'}-${k}`, labels: { 'kubernetes.io/service-name': s.name } },
          addressType: v6 ? 'IPv6' : 'IPv4',
          ports: s.ports.map((p) => ({ ...(p.name ? { name: p.name } : {}), protocol: p.protocol, port: p.targetPort })),
          endpoints: eps.map((e) => ({
            addresses: [endpointAddress(e)],
            nodeName: e.node,
            conditions: { ...(e.ready !== undefined ? { ready: e.ready } : {}), ...(e.serving !== undefined ? { serving: e.serving } : {}), ...(e.terminating !== undefined ? { terminating: e.terminating } : {}) },
          })),
        });
      }
    }
    slices.push({
      metadata: { namespace: s.namespace, name: `${s.name}-fqdn`, labels: { 'kubernetes.io/service-name': s.name } },
      addressType: 'FQDN',
      ports: s.ports.map((p) => ({ ...(p.name ? { name: p.name } : {}), protocol: p.protocol, port: p.targetPort })),
      endpoints: [{ addresses: ['db.example.com'] }],
    });
  }
  return { nodeName: NODE, nodeAddresses: [...NODE_V4, ...NODE_V6], services, slices, config: CONFIG, ...overrides };
}

// ---------------------------------------------------------------------------
// Corruptions: each breaks one Service in one way the agent must survive.

export type CorruptionKind =
  | 'InvalidSourceRange'
  | 'InvalidEndpointAddress'
  | 'UnsupportedProtocol'
  | 'TooManyPorts'
  | 'StatusPortMissing'
  | 'StatusPortInvalid'
  | 'FrontendConflict';

export interface Corruption {
  kind: CorruptionKind;
  victim: number;
  value: string;
}

export const corruptionArb: fc.Arbitrary<Corruption> = fc.oneof(
  fc.record({ kind: fc.constant<CorruptionKind>('InvalidSourceRange'), victim: fc.nat(), value: fc.constantFrom('not-a-cidr', '192.0.2.0/33', '2001:db8::/129', '300.1.1.1/8', '192.0.2.1/', '::/-1', '10.0.0.0/8/8') }),
  fc.record({ kind: fc.constant<CorruptionKind>('InvalidEndpointAddress'), victim: fc.nat(), value: fc.constantFrom('bogus', '999.1.1.1', 'fe80::1%eth0', '', '198.18.0.1/32', '1.2.3') }),
  fc.record({ kind: fc.constant<CorruptionKind>('UnsupportedProtocol'), victim: fc.nat(), value: fc.constantFrom('ICMP', 'tcp', 'HTTP', '') }),
  fc.record({ kind: fc.constant<CorruptionKind>('TooManyPorts'), victim: fc.nat(), value: fc.constant('') }),
  fc.record({ kind: fc.constant<CorruptionKind>('StatusPortMissing'), victim: fc.nat(), value: fc.constant('') }),
  fc.record({ kind: fc.constant<CorruptionKind>('StatusPortInvalid'), victim: fc.nat(), value: fc.constantFrom('0', '65536', '-1', '1.5', 'NaN') }),
  fc.record({ kind: fc.constant<CorruptionKind>('FrontendConflict'), victim: fc.nat(), value: fc.constant('') }),
);

const here = (ip: string | undefined) => ip !== undefined && [...NODE_V4, ...NODE_V6].includes(ip);

/** Applies `c` to the input built from `world`, returning the victim's `ns/name`, or undefined when the world offers no target for it. */
export function corrupt(world: World, input: ModelInput, c: Corruption): string | undefined {
  // The victim must be served here, or the agent rightly says nothing about it.
  const served = world.services
    .map((s, i) => ({ s, i }))
    .filter(({ s }) => s.cls === CLASS && s.ingress.some(here));
  if (served.length === 0) return undefined;
  const { s, i } = served[c.victim % served.length]!;
  const svc = input.services[i]!;
  const id = `${s.namespace}/${s.name}`;
  const ingress = svc.status!.loadBalancer!.ingress!;
  const localIngress = ingress.filter((ing) => here(ing.ip));
  switch (c.kind) {
    case 'InvalidSourceRange':
      svc.spec!.loadBalancerSourceRanges = [...(svc.spec!.loadBalancerSourceRanges ?? ['203.0.113.0/24']), c.value];
      return id;
    case 'InvalidEndpointAddress': {
      // Served somewhere: a port without an error on a local ingress.
      const slice = input.slices.find((sl) => sl.metadata?.labels?.['kubernetes.io/service-name'] === s.name && sl.metadata?.namespace === s.namespace && sl.addressType === 'IPv4');
      if (!slice || !localIngress.some((ing) => ing.ports?.some((p) => !p.error))) return undefined;
      slice.endpoints = [...(slice.endpoints ?? []), { addresses: [c.value], nodeName: NODE, conditions: { ready: true } }];
      return id;
    }
    case 'UnsupportedProtocol':
      svc.spec!.ports![0]!.protocol = c.value;
      return id;
    case 'TooManyPorts':
      svc.spec!.ports = Array.from({ length: CONFIG.maxPortsPerService + 1 }, (_, k) => ({ name: `p${k}`, port: 1000 + k, protocol: 'TCP' }));
      return id;
    case 'StatusPortMissing':
      for (const ing of localIngress) ing.ports = [];
      return id;
    case 'StatusPortInvalid':
      for (const ing of localIngress) ing.ports = ing.ports!.map((p) => ({ ...p, error: undefined, port: Number(c.value) }));
      return id;
    case 'FrontendConflict': {
      // The victim, younger than everyone, claims a frontend another Service serves here.
      const taken = input.services
        .filter((o, k) => k !== i && world.services[k]!.cls === CLASS)
        .flatMap((o) => (o.status?.loadBalancer?.ingress ?? []).filter((ing) => here(ing.ip)).flatMap((ing) => (ing.ports ?? []).filter((p) => !p.error).map((p) => ({ ip: ing.ip!, p }))))[0];
      if (!taken) return undefined;
      svc.metadata!.creationTimestamp = new Date(Date.UTC(2030, 0, 1));
      svc.spec!.ports = [{ name: 'stolen', port: 1, protocol: taken.p.protocol }];
      svc.status!.loadBalancer!.ingress = [{ ip: taken.ip, ipMode: 'Proxy', ports: [{ port: taken.p.port, protocol: taken.p.protocol }] }];
      return id;
    }
  }
}

// ---------------------------------------------------------------------------
// A packet walk through rendered chains: agent/interp.ts, with the connection
// mark read as MARKS' masquerade bit.

export type { Packet };
/** IP protocol numbers by the lower-case word iptables uses. */
export const PROTO_NUMBERS: Record<string, number> = Object.fromEntries(PROTOCOLS.map((p) => [PROTOCOL[p].word, PROTOCOL[p].number]));

export interface Walk extends Omit<WalkResult, 'hops' | 'mark'> {
  marked: boolean;
}

export function walk(chains: Map<string, string[]>, chain: string, pkt: Packet, choice = -1): Walk {
  const { hops: _hops, mark: _mark, ...rest } = interpWalk(chains, chain, pkt, choice);
  return { ...rest, marked: (rest.ctmark & MARKS.masquerade) !== 0 };
}

/** Every DNAT destination a new connection can reach (one walk per branch), and whether each is marked. */
export function destinations(chains: Map<string, string[]>, pkt: Packet): { to: string; marked: boolean; ctmark: number; chance: number }[] {
  const out: { to: string; marked: boolean; ctmark: number; chance: number }[] = [];
  const first = walk(chains, 'PIER-SERVICES', pkt, -1);
  const branches = first.randomPoints;
  for (let k = 0; k <= branches; k++) {
    const w = walk(chains, 'PIER-SERVICES', pkt, k);
    if (w.verdict === 'DNAT') out.push({ to: w.to!, marked: w.marked, ctmark: w.ctmark, chance: w.chance });
    else if (w.verdict !== 'CONTINUE') throw new Error(`nat verdict ${w.verdict}`);
  }
  return out;
}

export function dnatText(address: string, port: number): string {
  return address.includes(':') ? `[${address}]:${port}` : `${address}:${port}`;
}

/** Models of worlds, sometimes with one broken Service, sometimes with names only a sanitiser can print. */
export const modelArb: fc.Arbitrary<Model> = fc
  .tuple(worldArb, fc.option(corruptionArb, { freq: 2 }), fc.option(fc.array(fc.string({ unit: 'binary', minLength: 1, maxLength: 300 }), { minLength: 6, maxLength: 6 }), { freq: 3 }))
  .map(([world, corruption, names]) => {
    const w: World = names ? { services: world.services.map((s, i) => ({ ...s, name: `${names[i]}-${i}` })) } : world;
    const input = toInput(w);
    if (corruption) corrupt(w, input, corruption);
    return buildModel(input);
  });
