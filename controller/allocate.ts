// The controller's pure core (docs/architecture.md, section 2): which node addresses and
// external ports each of pier's Services gets, and what its status says.
//
// allocate() is a pure, total function of plain objects. Nothing in it may
// depend on the order objects arrive in, and nothing may throw: a malformed
// Service costs at most its own status, never another Service's.
//
// How conflicts and stability fit together:
//  - In port-mode `service` the external port is the spec port, so a
//    Service's claims follow from its spec and the cluster alone. Who keeps a
//    contested (address, protocol, port) follows from creationTimestamp, then
//    namespace/name, which no status can change. Rebuilding from statuses
//    therefore moves nothing, because statuses were never an input.
//  - In port-mode `allocate` the external port is a choice, and the choice is
//    remembered in the Service's own status (and in the mapping annotation,
//    which survives while the Service has no ingress). A remembered port is
//    kept while it is valid; ports are drawn only for what holds nothing, so
//    that feeding this function its own output returns the same output.
//
// How addresses are chosen (chooseAddresses): every eligible node's address
// while a family has at most `maxAddresses` (K) eligible nodes, which is how
// small clusters have always been served; beyond that K per family, by
// rendezvous hashing of the Service's namespace/name and the node's name,
// keeping what the status already lists while it stays eligible and ranked
// within the Service's best 2K nodes. A node's loss therefore rewrites only
// the Services that listed it, and a restart moves nothing.
import type { V1EndpointConditions, V1EndpointSlice, V1Lease, V1Node, V1Service, V1ServicePort } from '@kubernetes/client-node';
import { compareText, parseAddress, type ParsedAddress as Address } from '../lib/address.ts';

import {
  DEFAULT_MAX_ADDRESSES,
  EXCLUDE_FROM_LB_LABEL,
  LEASE_FORWARDING_IPV4,
  LEASE_FORWARDING_IPV6,
  MAX_ADDRESSES,
  POOL,
  PORT_MAPPING_ANNOTATION,
  PORT_MODE,
  agentLeaseName,
  formatMaxAddresses,
  type Family,
  isPierService,
  parseMaxAddresses,
} from '../lib/contract.ts';
import { leaseIsFresh } from '../lib/lease.ts';
import { SERVICE_NAME_LABEL, safely, serviceKey, timestamp } from '../lib/objects.ts';
import type { Problem } from '../lib/problem.ts';
import { isProtocol } from '../lib/protocols.ts';

export type { Family };

// ---------------------------------------------------------------------------
// Configuration

/** Inclusive; applies to every protocol. */
export interface PortRange {
  from: number;
  to: number;
}

export interface AllocatorConfig {
  loadBalancerClass: string;
  /** Also take LoadBalancer Services that name no class. */
  defaultClass: boolean;
  /** Pool of Services without the pool annotation and of nodes without the pool label. */
  defaultPool: string;
  /** Where agent Leases live. */
  agentNamespace: string;
  /** External ports no Service may have: they belong to the node itself. */
  reservedPorts: readonly PortRange[];
  /** Where `port-mode: allocate` draws external ports from. */
  allocateRange: PortRange;
  /** Services with more ports are not served at all; agents refuse them too. */
  maxPortsPerService?: number;
  /**
   * Per Service and family, at most this many node addresses (K); Infinity
   * lists every eligible node. A Service's MAX_ADDRESSES annotation overrides
   * it. Default DEFAULT_MAX_ADDRESSES.
   */
  maxAddresses?: number;
}

// K's default and spelling are part of the contract (lib/contract.ts): pier status reads them too.
export { DEFAULT_MAX_ADDRESSES, formatMaxAddresses, parseMaxAddresses } from '../lib/contract.ts';

export const DEFAULT_RESERVED_PORTS: readonly PortRange[] = [
  { from: 22, to: 22 }, // ssh
  { from: 2379, to: 2380 }, // etcd client and peer
  { from: 6443, to: 6443 }, // kube-apiserver
  { from: 10250, to: 10250 }, // kubelet
  { from: 10256, to: 10256 }, // kube-proxy health
  { from: 10257, to: 10257 }, // kube-controller-manager
  { from: 10259, to: 10259 }, // kube-scheduler
];

/** Clear of the default NodePort range (30000-32767), so defaults never need to skip anything. */
export const DEFAULT_ALLOCATE_RANGE: PortRange = { from: 40000, to: 49999 };

/**
 * Service annotation the writer keeps in step with `portMapping`: the
 * external port of each spec port (`{"80/TCP":40000}`), for people, and as
 * the memory of allocated ports while a Service has no ingress to hold them.
 */
export { PORT_MAPPING_ANNOTATION };

/** Reasons used in port errors, in the condition and in problems (Events). */
export const REASONS = {
  serving: 'Serving',
  partiallyServed: 'PartiallyServed',
  noPorts: 'NoPorts',
  tooManyPorts: 'TooManyPorts',
  noEligibleNodes: 'NoEligibleNodes',
  noEndpoints: 'NoEndpoints',
  addressUnavailable: 'AddressUnavailable',
  portConflict: 'PortConflict',
  portReserved: 'PortReserved',
  portRangeExhausted: 'PortRangeExhausted',
  invalidPort: 'InvalidPort',
  unsupportedProtocol: 'UnsupportedProtocol',
  invalidPortMode: 'InvalidPortMode',
  invalidMaxAddresses: 'InvalidMaxAddresses',
  invalidIPFamily: 'InvalidIPFamily',
  invalidService: 'InvalidService',
} as const;

export function defaultAllocatorConfig(overrides: Partial<AllocatorConfig> = {}): AllocatorConfig {
  return {
    loadBalancerClass: 'pier.dev/lb',
    defaultClass: false,
    defaultPool: 'default',
    agentNamespace: 'pier-system',
    reservedPorts: DEFAULT_RESERVED_PORTS,
    allocateRange: DEFAULT_ALLOCATE_RANGE,
    maxAddresses: DEFAULT_MAX_ADDRESSES,
    ...overrides,
  };
}

// ---------------------------------------------------------------------------
// Input and output

export interface AllocateInput {
  services: V1Service[];
  nodes: V1Node[];
  slices: V1EndpointSlice[];
  leases: V1Lease[];
  /**
   * Per agent Lease name: until when its agent counts as alive, as its
   * observer judged (lib/lease.ts sightedFreshUntil), on the clock of `now`.
   * A Lease without an entry counts as expired. Without the map, each Lease
   * is judged by its own renewTime + leaseDurationSeconds against `now`.
   */
  leaseFreshUntil?: ReadonlyMap<string, number>;
  /** Lease freshness is judged against it: the clock of leaseFreshUntil, else milliseconds since the epoch. */
  now: number;
  config: AllocatorConfig;
}

export interface PortAssignment {
  /** The external port clients connect to. */
  port: number;
  protocol: string;
  /** Set when this port is not served on this address. */
  error?: string;
}

export interface IngressAssignment {
  ip: string;
  ipMode: 'Proxy';
  /** One per spec port, in spec order. */
  ports: PortAssignment[];
}

export interface ReadyCondition {
  status: 'True' | 'False';
  reason: string;
  message: string;
}

export type { Problem };

export interface ServiceAllocation {
  ingress: IngressAssignment[];
  /** The `pier.dev/Ready` condition. */
  condition: ReadyCondition;
  /** Everything worth an Event: every failure in the condition, and warnings that do not stop serving. */
  problems: Problem[];
  /** Value of PORT_MAPPING_ANNOTATION; only in port-mode allocate. */
  portMapping?: string;
}

export interface Allocation {
  /** Keyed `namespace/name`, in key order; only pier's Services. */
  services: Map<string, ServiceAllocation>;
}

// ---------------------------------------------------------------------------
// Which Services

export { serviceKey };


// ---------------------------------------------------------------------------
// Addresses

const FAMILY_NAME: Record<Family, string> = { ipv4: 'IPv4', ipv6: 'IPv6' };

/** Numeric order within a family. */
function compareAddresses(a: Address, b: Address): number {
  return a.value < b.value ? -1 : a.value > b.value ? 1 : 0;
}

// ---------------------------------------------------------------------------
// Reading the cluster

interface NodeView {
  name: string;
  ready: boolean;
  excluded: boolean;
  pool: string;
  agent: 'missing' | 'stale' | 'fresh';
  forwarding: Record<Family, boolean>;
  /** The address advertised for this node: ExternalIP of the family, else InternalIP. */
  chosen: Partial<Record<Family, Address>>;
  /** Every InternalIP and ExternalIP, which a Service may ask for by loadBalancerIP. */
  all: Record<Family, Set<string>>;
}

function readNodes(input: AllocateInput): NodeView[] {
  const { config } = input;
  const leases = new Map<string, V1Lease[]>();
  for (const lease of input.leases ?? []) {
    safely(() => {
      if (lease?.metadata?.namespace !== config.agentNamespace) return;
      const name = lease.metadata.name ?? '';
      leases.set(name, [...(leases.get(name) ?? []), lease]);
    }, undefined);
  }
  const until = input.leaseFreshUntil;
  const isFresh = (l: V1Lease) => (until ? (until.get(l.metadata?.name ?? '') ?? Number.NEGATIVE_INFINITY) > input.now : leaseIsFresh(l, input.now));
  const views: NodeView[] = [];
  for (const node of uniqueBy(input.nodes ?? [], (n) => n?.metadata?.name ?? '')) {
    const view = safely(() => readNode(node, leases, isFresh, config), undefined);
    if (view) views.push(view);
  }
  return views.sort((a, b) => compareText(a.name, b.name));
}

function readNode(node: V1Node, leases: Map<string, V1Lease[]>, isFresh: (l: V1Lease) => boolean, config: AllocatorConfig): NodeView | undefined {
  const name = node.metadata?.name;
  if (typeof name !== 'string' || name === '') return undefined;
  const labels = node.metadata?.labels ?? {};
  const pool = typeof labels[POOL] === 'string' && labels[POOL] !== '' ? labels[POOL] : config.defaultPool;
  // Several Leases of one name cannot come from one API server; if a caller
  // passes them anyway, any healthy one counts, which no order can change.
  const mine = leases.get(agentLeaseName(name)) ?? [];
  const fresh = mine.filter((l) => safely(() => isFresh(l), false));
  const forwards = (annotation: string) => fresh.some((l) => l.metadata?.annotations?.[annotation] === 'true');
  const view: NodeView = {
    name,
    ready: (node.status?.conditions ?? []).some((c) => c?.type === 'Ready' && c.status === 'True'),
    excluded: Object.hasOwn(labels, EXCLUDE_FROM_LB_LABEL),
    pool,
    agent: mine.length === 0 ? 'missing' : fresh.length === 0 ? 'stale' : 'fresh',
    forwarding: { ipv4: forwards(LEASE_FORWARDING_IPV4), ipv6: forwards(LEASE_FORWARDING_IPV6) },
    chosen: {},
    all: { ipv4: new Set(), ipv6: new Set() },
  };
  const internal: Partial<Record<Family, Address>> = {};
  const external: Partial<Record<Family, Address>> = {};
  for (const a of node.status?.addresses ?? []) {
    if (a?.type !== 'InternalIP' && a?.type !== 'ExternalIP') continue;
    const addr = parseAddress(a.address);
    if (!addr) continue;
    view.all[addr.family].add(addr.text);
    // The first of each kind, as the kubelet lists its preferred one first.
    const kind = a.type === 'ExternalIP' ? external : internal;
    kind[addr.family] ??= addr;
  }
  for (const f of ['ipv4', 'ipv6'] as const) {
    const pick = external[f] ?? internal[f];
    if (pick) view.chosen[f] = pick;
  }
  return view;
}

/**
 * What allocate() reads of a Node object, its agent's Lease aside, as a
 * string: an update that leaves it equal (a kubelet's heartbeat, most Node
 * writes) cannot change any allocation. '' for a Node that is not read.
 */
export function nodeReading(node: V1Node, config: AllocatorConfig): string {
  const view = safely(() => readNode(node, new Map(), () => false, config), undefined);
  return view ? nodeSignature(view) : '';
}

/** Per family, each node with a serving endpoint of a Service, and how many of its endpoints are ready. */
type Serving = Record<Family, Map<string, number>>;

/** Per Service key: its Serving. */
function servingNodes(slices: V1EndpointSlice[]): Map<string, Serving> {
  const out = new Map<string, Serving>();
  for (const slice of slices ?? []) {
    safely(() => {
      const svc = slice?.metadata?.labels?.[SERVICE_NAME_LABEL];
      const family = slice.addressType === 'IPv4' ? 'ipv4' : slice.addressType === 'IPv6' ? 'ipv6' : undefined;
      if (!svc || !family) return;
      const key = `${slice.metadata?.namespace ?? ''}/${svc}`;
      let entry = out.get(key);
      if (!entry) out.set(key, (entry = { ipv4: new Map(), ipv6: new Map() }));
      for (const ep of slice.endpoints ?? []) {
        if (typeof ep?.nodeName !== 'string' || !isServing(ep.conditions)) continue;
        entry[family].set(ep.nodeName, (entry[family].get(ep.nodeName) ?? 0) + (ep.conditions?.ready !== false ? 1 : 0));
      }
    }, undefined);
  }
  return out;
}

/**
 * Ready (nil is ready, per the API), or terminating and still serving: a node
 * whose last pod drains uses that one, as kube-proxy (KEP-1669) and the agent
 * do, so a rolling update must not take its address away. Without `serving`,
 * `ready` is all there is.
 */
function isServing(c: V1EndpointConditions | undefined): boolean {
  return c?.ready !== false || c.serving === true;
}

/** NodePorts (and health-check NodePorts) of every Service, pier's or not: kube-proxy listens on them on every node. */
interface NodePorts {
  /** By number, any protocol: what allocation avoids. */
  numbers: Set<number>;
  /** `PROTO/port` -> the Service ports (`key#index`, `#health` for the health check) that have it. */
  owners: Map<string, string[]>;
}

function readNodePorts(services: V1Service[]): NodePorts {
  const out: NodePorts = { numbers: new Set(), owners: new Map() };
  const add = (port: unknown, protocol: string, owner: string, index: number | 'health') => {
    if (!isPort(port)) return;
    out.numbers.add(port);
    const k = `${protocol}/${port}`;
    const list = out.owners.get(k) ?? [];
    const id = `${owner}#${index}`;
    if (!list.includes(id)) out.owners.set(k, [...list, id].sort(compareText));
  };
  for (const svc of services) {
    safely(() => {
      const owner = serviceKey(svc);
      (svc.spec?.ports ?? []).forEach((p, index) => add(p?.nodePort, p?.protocol ?? 'TCP', owner, index));
      add(svc.spec?.healthCheckNodePort, 'TCP', owner, 'health');
    }, undefined);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Reading a Service

interface SpecPort {
  index: number;
  /** The spec port; 0 when the spec has none that is valid. */
  port: number;
  protocol: string;
  name: string;
  /** A spec this port cannot be served from. */
  error?: string;
}

/** What one Service asks of the allocation, read from its spec, and what it gets. */
interface ServiceRequest {
  key: string;
  created: number;
  /** Position in (creationTimestamp, namespace/name) order: lower is older. */
  rank: number;
  ports: SpecPort[];
  families: Family[];
  local: boolean;
  pool: string;
  allocateMode: boolean;
  requested: unknown[];
  /** Per family, at most this many addresses (K); Infinity for all. */
  maxAddresses: number;
  /** status.loadBalancer.ingress as it is now, unread. */
  statusIngress: unknown;
  /** The canonical addresses statusIngress lists, read once a family has more than K eligible nodes. */
  listed?: Set<string>;
  /** hashText(key), once a family has more than K eligible nodes. */
  hash?: number;
  /** Set by reallocate() before choosing addresses: chooseAddresses records there what its choice read. */
  deps?: AddressDeps;
  /** Per spec port, the external ports its status and annotation remember, best first. */
  remembered: number[][];
  warnings: Problem[];
  /** Set when the Service cannot be served at all, before looking at nodes. */
  blocked?: Problem;
  // Filled in as allocation proceeds.
  addresses: Address[];
  addressCauses: Problem[];
  /** Families whose addresses no node backs with a serving endpoint (Local): the agents refuse there. */
  noEndpoints: Family[];
  external: (number | undefined)[];
  /** Per spec index: why that port is served on none of the addresses. */
  portErrors: Map<number, PortError>;
  /** Per spec index, per address: which older claimant holds it there. */
  conflicts: Map<number, Map<string, PortError>>;
}

interface PortError {
  reason: string;
  detail: string;
}

function readService(svc: V1Service, config: AllocatorConfig): Omit<ServiceRequest, 'rank'> {
  const key = serviceKey(svc);
  const annotations: Record<string, unknown> = svc.metadata?.annotations ?? {};
  const warnings: Problem[] = [];

  const poolAnnotation = annotations[POOL];
  const pool = typeof poolAnnotation === 'string' && poolAnnotation !== '' ? poolAnnotation : config.defaultPool;

  const mode = annotations[PORT_MODE];
  const allocateMode = mode === 'allocate';
  if (mode !== undefined && mode !== '' && mode !== 'service' && mode !== 'allocate') {
    warnings.push({
      reason: REASONS.invalidPortMode,
      message: `annotation ${PORT_MODE}=${JSON.stringify(mode)} is neither "service" nor "allocate"; using "service" (external port = spec port)`,
    });
  }

  const maxAnnotation = annotations[MAX_ADDRESSES];
  const defaultMax = config.maxAddresses ?? DEFAULT_MAX_ADDRESSES;
  let maxAddresses = defaultMax;
  if (maxAnnotation !== undefined && maxAnnotation !== '') {
    const parsed = parseMaxAddresses(maxAnnotation);
    if (parsed !== undefined) maxAddresses = parsed;
    else {
      warnings.push({
        reason: REASONS.invalidMaxAddresses,
        message: `annotation ${MAX_ADDRESSES}=${JSON.stringify(maxAnnotation)} is neither a positive integer nor "all"; using ${formatMaxAddresses(defaultMax)} (the controller's --max-addresses) addresses per family`,
      });
    }
  }

  const families: Family[] = [];
  const rawFamilies: unknown[] = Array.isArray(svc.spec?.ipFamilies) ? svc.spec.ipFamilies : [];
  for (const f of rawFamilies) {
    const family = f === 'IPv4' ? 'ipv4' : f === 'IPv6' ? 'ipv6' : undefined;
    if (!family) warnings.push({ reason: REASONS.invalidIPFamily, message: `spec.ipFamilies has ${JSON.stringify(f)}, which is neither IPv4 nor IPv6; ignored` });
    else if (!families.includes(family)) families.push(family);
  }
  // The API server always fills ipFamilies; without it, IPv4 is what a single-stack cluster would have chosen.
  if (families.length === 0) families.push('ipv4');

  const specPorts: V1ServicePort[] = Array.isArray(svc.spec?.ports) ? svc.spec.ports : [];
  const ports: SpecPort[] = specPorts.map((sp, index) => {
    const protocol = typeof sp?.protocol === 'string' && sp.protocol !== '' ? sp.protocol : 'TCP';
    const name = typeof sp?.name === 'string' ? sp.name : '';
    const port = isPort(sp?.port) ? sp.port : 0;
    const out: SpecPort = { index, port, protocol, name };
    if (!isProtocol(protocol)) out.error = REASONS.unsupportedProtocol;
    else if (port === 0) out.error = REASONS.invalidPort;
    return out;
  });

  let blocked: Problem | undefined;
  if (ports.length === 0) {
    blocked = { reason: REASONS.noPorts, message: 'the Service has no ports, so there is nothing to serve' };
  } else if (config.maxPortsPerService !== undefined && ports.length > config.maxPortsPerService) {
    blocked = {
      reason: REASONS.tooManyPorts,
      message: `the Service has ${ports.length} ports; pier serves at most ${config.maxPortsPerService} per Service, so it serves none of them`,
    };
  }

  const lbIP = svc.spec?.loadBalancerIP;
  return {
    key,
    created: timestamp(svc.metadata?.creationTimestamp),
    ports,
    families,
    local: svc.spec?.externalTrafficPolicy === 'Local',
    pool,
    allocateMode,
    requested: lbIP === undefined || lbIP === null || lbIP === '' ? [] : [lbIP],
    maxAddresses,
    statusIngress: statusIngressOf(svc),
    remembered: allocateMode ? rememberedPorts(svc, ports, annotations[PORT_MAPPING_ANNOTATION]) : ports.map(() => []),
    warnings,
    ...(blocked ? { blocked } : {}),
    addresses: [],
    addressCauses: [],
    noEndpoints: [],
    external: [],
    portErrors: new Map(),
    conflicts: new Map(),
  };
}

function statusIngressOf(svc: V1Service): unknown {
  return safely(() => svc.status?.loadBalancer?.ingress, undefined);
}

/**
 * External ports a Service already had, per spec port, best first. Status
 * ports are positional, so a reordered spec would hand one port's number to
 * another; the annotation names spec ports, so where the status confirms
 * that the annotated number is this Service's, the annotation decides. It
 * also remembers ports while the Service has no ingress at all.
 */
function rememberedPorts(svc: V1Service, ports: SpecPort[], mappingText: unknown): number[][] {
  let mapping: Record<string, unknown> = {};
  if (typeof mappingText === 'string') {
    const parsed = safely(() => JSON.parse(mappingText) as unknown, undefined);
    if (parsed && typeof parsed === 'object' && !Array.isArray(parsed)) mapping = parsed as Record<string, unknown>;
  }
  const ingress: unknown[] = Array.isArray(svc.status?.loadBalancer?.ingress) ? svc.status.loadBalancer.ingress : [];
  const statusPorts = (index: number | undefined, protocol: string): number[] => {
    const found = new Set<number>();
    for (const ing of ingress) {
      const list: unknown = (ing as { ports?: unknown })?.ports;
      if (!Array.isArray(list)) continue;
      const entries = index === undefined ? list : [list[index]];
      for (const e of entries) {
        const { port, protocol: p, error } = (e ?? {}) as { port?: unknown; protocol?: unknown; error?: unknown };
        // An entry with an error records no assignment: an exhausted port carries its spec port.
        if (isPort(port) && (p ?? 'TCP') === protocol && !error) found.add(port);
      }
    }
    return [...found].sort((a, b) => a - b);
  };
  return ports.map((sp) => {
    const annotated = mapping[mappingKey(sp)];
    const fromAnnotation = isPort(annotated) ? [annotated] : [];
    const confirmed = fromAnnotation.filter((p) => statusPorts(undefined, sp.protocol).includes(p));
    return [...new Set([...confirmed, ...statusPorts(sp.index, sp.protocol), ...fromAnnotation])];
  });
}

function mappingKey(sp: SpecPort): string {
  return `${sp.port}/${sp.protocol}`;
}

// ---------------------------------------------------------------------------
// Choosing addresses

/** Why a node does not serve a Service in a family, in the order they are checked. */
const EXCLUSIONS = ['pool', 'notReady', 'excluded', 'noAgent', 'agentStale', 'notForwarding', 'noAddress', 'noEndpoint', 'notChosen'] as const;
export type Exclusion = (typeof EXCLUSIONS)[number];

/** Per family, the only nodes that may serve a Service, with their ready endpoints: set for Local Services (localNodes). */
type Only = Partial<Serving>;

/** The nodes of one pool that could serve one family, before any Service's endpoints count. */
interface PoolView {
  /** In name order. */
  nodes: NodeView[];
  names: Set<string>;
  /** How many nodes each exclusion keeps out. */
  tally: Map<Exclusion, number>;
  /** hashText() of each node's name, in `nodes` order, once a Service of the pool needs them. */
  hashes?: Uint32Array;
}

/**
 * The nodes as every Service sees them. What a Cluster Service may use
 * depends only on its pool and family, so it is judged once per allocation
 * and pool, not once per Service: at thousands of nodes and Services the
 * per-Service walk over every node was most of the work.
 */
interface Cluster {
  /** In name order. */
  nodes: NodeView[];
  byName: Map<string, NodeView>;
  /** Per pool name, per family. */
  pools: Map<string, Partial<Record<Family, PoolView>>>;
}

function clusterView(nodes: NodeView[]): Cluster {
  return { nodes, byName: new Map(nodes.map((n) => [n.name, n])), pools: new Map() };
}

function poolView(cluster: Cluster, pool: string, family: Family): PoolView {
  let views = cluster.pools.get(pool);
  if (!views) cluster.pools.set(pool, (views = {}));
  let view = views[family];
  if (view) return view;
  view = views[family] = { nodes: [], names: new Set(), tally: new Map() };
  for (const node of cluster.nodes) {
    const why = exclusion(node, { pool }, family, {});
    if (why) view.tally.set(why, (view.tally.get(why) ?? 0) + 1);
    else {
      view.nodes.push(node);
      view.names.add(node.name);
    }
  }
  return view;
}

/**
 * For a Local Service, per family, the nodes with a serving endpoint of it.
 * None where no node that could serve it has one (no pod yet, scaled to 0,
 * its pods' nodes not Ready or without an agent): the Service then gets the
 * addresses Cluster policy would, and the agents refuse connections there,
 * so that it neither shows <pending> nor moves when it scales from 0 to 1.
 */
function localNodes(request: Pick<ServiceRequest, 'pool' | 'local' | 'families'>, cluster: Cluster, serving: Serving | undefined): Only {
  const only: Only = {};
  if (!request.local || !serving) return only;
  for (const family of request.families) {
    const { names } = poolView(cluster, request.pool, family);
    for (const name of serving[family].keys()) {
      if (!names.has(name)) continue;
      only[family] = serving[family];
      break;
    }
  }
  return only;
}

function exclusion(node: NodeView, request: Pick<ServiceRequest, 'pool'>, family: Family, only: Only): Exclusion | undefined {
  if (node.pool !== request.pool) return 'pool';
  if (!node.ready) return 'notReady';
  if (node.excluded) return 'excluded';
  if (node.agent === 'missing') return 'noAgent';
  if (node.agent === 'stale') return 'agentStale';
  if (!node.forwarding[family]) return 'notForwarding';
  if (!node.chosen[family]) return 'noAddress';
  if (only[family] && !only[family].has(node.name)) return 'noEndpoint';
  return undefined;
}

/** How a count of nodes excluded for `why` reads: "2 not Ready". */
function describeExclusion(why: Exclusion, family: Family, request: ServiceRequest): string {
  const f = FAMILY_NAME[family];
  switch (why) {
    case 'pool':
      return `in another pool than ${JSON.stringify(request.pool)}`;
    case 'notReady':
      return 'not Ready';
    case 'excluded':
      return `labelled ${EXCLUDE_FROM_LB_LABEL}`;
    case 'noAgent':
      return 'without a pier agent Lease';
    case 'agentStale':
      return 'whose pier agent Lease has expired';
    case 'notForwarding':
      return `whose pier agent cannot forward ${f}`;
    case 'noAddress':
      return `without an ${f} address`;
    case 'noEndpoint':
      return 'without a serving endpoint of the Service (externalTrafficPolicy: Local)';
    case 'notChosen':
      return `eligible beyond the Service's ${formatMaxAddresses(request.maxAddresses)} ${f} addresses`;
  }
}

/** Why one node is excluded: "its pier agent Lease has expired". */
function explainNode(node: NodeView, why: Exclusion, family: Family, request: Pick<ServiceRequest, 'pool' | 'maxAddresses'>): string {
  switch (why) {
    case 'pool':
      return `it is in pool ${JSON.stringify(node.pool)}, not ${JSON.stringify(request.pool)}`;
    case 'notReady':
      return 'it is not Ready';
    case 'excluded':
      return `it is labelled ${EXCLUDE_FROM_LB_LABEL}`;
    case 'noAgent':
      return 'it has no pier agent Lease';
    case 'agentStale':
      return 'its pier agent Lease has expired';
    case 'notForwarding':
      return `its pier agent cannot forward ${FAMILY_NAME[family]}`;
    case 'noAddress':
      return `it has no ${FAMILY_NAME[family]} address`;
    case 'noEndpoint':
      return 'it has no serving endpoint of the Service (externalTrafficPolicy: Local)';
    case 'notChosen':
      return `it is eligible, but the Service lists at most ${formatMaxAddresses(request.maxAddresses)} ${FAMILY_NAME[family]} addresses (${MAX_ADDRESSES}, --max-addresses) and this node's is not among them`;
  }
}

/**
 * What one Service's addresses were chosen from, so that reallocate() can
 * tell which node changes may change them (see there). Over-approximate
 * where exactness would cost: `anyNode` for small pools (every eligible node
 * listed), Services that ask for addresses, and families without eligible
 * nodes (whose message counts the whole cluster).
 */
interface AddressDeps {
  anyNode: boolean;
  /** For Local, every node with a serving endpoint: its change may change the choice. Made only then (kept per Service). */
  nodes?: Set<string>;
  /**
   * Per family ranked over its whole pool: the window is the nodes that were
   * eligible and rank at or above the floor, and a change of one of them may
   * change the choice (affectedBy() tells them apart by rank rather than
   * keeping up to 2K names per family and Service). A node newly eligible
   * there changes the choice if the window is not full or it ranks above the floor.
   */
  windows: { family: Family; full: boolean; floorKey: number; floorName: string }[];
}

function chooseAddresses(request: ServiceRequest, cluster: Cluster, serving: Serving | undefined): void {
  const only = localNodes(request, cluster, serving);
  const deps = request.deps;
  // A serving node that becomes eligible (or stops) may switch Local's rule on or off in its family.
  if (deps && request.local && serving) for (const family of request.families) for (const name of serving[family].keys()) (deps.nodes ??= new Set()).add(name);
  if (deps && request.requested.length > 0) deps.anyNode = true;
  const eligible: Record<Family, readonly NodeView[]> = { ipv4: [], ipv6: [] };
  const tally: Record<Family, ReadonlyMap<Exclusion, number>> = { ipv4: new Map(), ipv6: new Map() };
  /** Where eligible[family] is a pool's whole list: its hashes are kept there, for every Service of the pool. */
  const pools: Partial<Record<Family, PoolView>> = {};
  for (const family of request.families) {
    const base = poolView(cluster, request.pool, family);
    const within = only[family];
    if (!within) {
      eligible[family] = base.nodes;
      tally[family] = base.tally;
      pools[family] = base;
      continue;
    }
    // Local, with endpoints: the pool's eligible nodes among those with a serving endpoint.
    const local: NodeView[] = [];
    for (const name of within.keys()) if (base.names.has(name)) local.push(cluster.byName.get(name)!);
    local.sort((a, b) => compareText(a.name, b.name));
    eligible[family] = local;
    const counts = new Map(base.tally);
    if (base.nodes.length > local.length) counts.set('noEndpoint', base.nodes.length - local.length);
    tally[family] = counts;
  }
  const nodes = cluster.nodes;
  const explain = (family: Family) => {
    if (nodes.length === 0) return 'the cluster has no nodes';
    const parts = EXCLUSIONS.filter((w) => tally[family].has(w)).map((w) => `${tally[family].get(w)} ${describeExclusion(w, family, request)}`);
    return `of ${nodes.length} ${plural(nodes.length, 'node')}: ${parts.join(', ')}`;
  };

  const chosen = new Map<string, Address>();
  if (request.requested.length > 0) {
    // The Service asked for addresses: serve those pier can, and say which it cannot.
    for (const raw of request.requested) {
      const addr = parseAddress(raw);
      if (!addr) {
        request.addressCauses.push({ reason: REASONS.addressUnavailable, message: `spec.loadBalancerIP ${JSON.stringify(raw)} is not an IP address` });
      } else if (!request.families.includes(addr.family)) {
        request.addressCauses.push({
          reason: REASONS.addressUnavailable,
          message: `spec.loadBalancerIP ${addr.text} is ${FAMILY_NAME[addr.family]}, but the Service's ipFamilies are ${request.families.map((f) => FAMILY_NAME[f]).join(', ')}`,
        });
      } else if (eligible[addr.family].some((n) => n.all[addr.family].has(addr.text))) {
        chosen.set(addr.text, addr);
      } else {
        const owners = nodes.filter((n) => n.all[addr.family].has(addr.text));
        const why = owners.length === 0
          ? 'no node has this address'
          : owners.map((n) => `node ${n.name} has it, but ${explainNode(n, exclusion(n, request, addr.family, only)!, addr.family, request)}`).join('; ');
        request.addressCauses.push({ reason: REASONS.addressUnavailable, message: `spec.loadBalancerIP ${addr.text} cannot be served: ${why}` });
      }
    }
  } else {
    for (const family of request.families) {
      for (const addr of chooseInFamily(request, family, eligible[family], pools[family], only[family])) chosen.set(addr.text, addr);
      if (eligible[family].length === 0) {
        if (deps) deps.anyNode = true;
        request.addressCauses.push({ reason: REASONS.noEligibleNodes, message: `no node can serve ${FAMILY_NAME[family]} in pool ${JSON.stringify(request.pool)}, ${explain(family)}` });
      }
    }
  }
  // Families in ipFamilies order; for Local, the node with the most ready
  // endpoints first (a client that takes the first address reaches the most
  // pods); numeric otherwise.
  const ready = new Map<string, number>();
  for (const family of request.local ? request.families : []) {
    const counts = only[family];
    if (!counts) continue;
    for (const node of eligible[family]) {
      const text = node.chosen[family]!.text;
      ready.set(text, Math.max(ready.get(text) ?? 0, counts.get(node.name) ?? 0));
    }
  }
  const readyAt = (a: Address) => ready.get(a.text) ?? 0;
  request.addresses = [...chosen.values()].sort(
    (a, b) => request.families.indexOf(a.family) - request.families.indexOf(b.family) || readyAt(b) - readyAt(a) || compareAddresses(a, b),
  );

  if (!request.local) return;
  request.noEndpoints = request.families.filter((f) => !only[f] && request.addresses.some((a) => a.family === f));
  if (request.noEndpoints.length === 0) return;
  // No addresses in it, so that nodes coming and going do not make it a new problem (and Event).
  const which = request.noEndpoints.length === request.families.length ? '' : `${request.noEndpoints.map((f) => FAMILY_NAME[f]).join(' and ')} `;
  request.addressCauses.push({
    reason: REASONS.noEndpoints,
    message: `no node that can serve pool ${JSON.stringify(request.pool)} has a serving ${which}endpoint of the Service (externalTrafficPolicy: Local), so ${which}connections to it are refused until one has`,
  });
}

/**
 * The addresses a Service lists in one family. While the family has at most
 * K eligible nodes, every one's address, as before there was a bound (and no
 * hashing at all). Beyond that, K of them, so that a status does not grow
 * with the cluster:
 *
 *  - Nodes are ranked per Service by rendezvous hashing (score of the
 *    Service's namespace/name and the node's name, highest first; for Local
 *    Services nodes with a ready endpoint before those whose endpoints all
 *    terminate). Each Service gets its own random-looking order of the nodes,
 *    so K of N nodes are spread evenly over the nodes, and a node leaving
 *    moves up only the nodes ranked below it: it costs a new address only to
 *    the Services that listed it.
 *  - Addresses the status already lists are kept while their node is
 *    eligible and among the Service's best 2K: a restarted controller, or a
 *    node coming back after a Service moved off it, moves nothing. The window
 *    is what lets a growing cluster rebalance: without it, a cluster that
 *    grew past K would keep every existing Service on its first K nodes for
 *    ever; with it, a listed node falls out only once 2K others rank above
 *    it, so a listed node carries at most about twice its fair share.
 *  - The rest is filled from the top of the ranking up to K. K counts
 *    addresses: each node has one per family (ExternalIP, else InternalIP),
 *    and nodes that share one count once.
 *
 * The score is part of what a Service's status is: changing rendezvous()
 * would move Services on an upgrade (only those beyond their window).
 */
function chooseInFamily(
  request: ServiceRequest,
  family: Family,
  eligible: readonly NodeView[],
  pool: PoolView | undefined,
  ready: ReadonlyMap<string, number> | undefined,
): Address[] {
  const k = request.maxAddresses;
  const deps = request.deps;
  if (eligible.length <= k) {
    // Every eligible node of the pool is listed: any node may join. (Local's list is its serving nodes, already watched.)
    if (deps && pool) deps.anyNode = true;
    return eligible.map((n) => n.chosen[family]!);
  }
  request.hash ??= hashText(request.key);
  const hashes = pool ? (pool.hashes ??= nameHashes(pool.nodes)) : nameHashes(eligible);
  const ranked = rankNodes(request.hash, eligible, hashes, Math.min(2 * k, eligible.length), ready);
  // A pool's window is known by its floor (see AddressDeps); Local's ranked nodes serve it, so deps.nodes has them.
  if (deps && pool) {
    const last = ranked[ranked.length - 1]!;
    deps.windows.push({ family, full: ranked.length >= 2 * k, floorKey: rendezvous(request.hash, hashText(last.name)), floorName: last.name });
  }
  const listed = (request.listed ??= readListed(request.statusIngress));
  const out = new Map<string, Address>();
  for (const node of ranked) {
    if (out.size >= k) break;
    const addr = node.chosen[family]!;
    if (listed.has(addr.text)) out.set(addr.text, addr);
  }
  for (const node of ranked) {
    if (out.size >= k) break;
    const addr = node.chosen[family]!;
    if (!out.has(addr.text)) out.set(addr.text, addr);
  }
  return [...out.values()];
}

/**
 * The `width` best-ranked nodes, best first, in one pass: rendezvous score
 * (plus 2^32 for a node with a ready endpoint, for Local Services), then
 * name. The loop runs once per node and Service at scale, hence typed arrays
 * and indices: it reads no node object unless a node makes the cut.
 */
function rankNodes(serviceHash: number, nodes: readonly NodeView[], hashes: Uint32Array, width: number, ready: ReadonlyMap<string, number> | undefined): NodeView[] {
  const keys = new Float64Array(width);
  const top = new Int32Array(width);
  let size = 0;
  /** The worst key kept, once `width` are kept. */
  let floor = -1;
  const before = (key: number, i: number, j: number) => key > keys[j]! || (key === keys[j]! && nodes[i]!.name < nodes[top[j]!]!.name);
  for (let i = 0; i < hashes.length; i++) {
    let key = rendezvous(serviceHash, hashes[i]!);
    if (ready !== undefined && (ready.get(nodes[i]!.name) ?? 0) > 0) key += 2 ** 32;
    if (size === width && (key < floor || (key === floor && !before(key, i, width - 1)))) continue;
    let j = size === width ? width - 1 : size++;
    while (j > 0 && before(key, i, j - 1)) {
      keys[j] = keys[j - 1]!;
      top[j] = top[j - 1]!;
      j--;
    }
    keys[j] = key;
    top[j] = i;
    floor = keys[width - 1]!;
  }
  const out: NodeView[] = [];
  for (let j = 0; j < size; j++) out.push(nodes[top[j]!]!);
  return out;
}

function nameHashes(nodes: readonly NodeView[]): Uint32Array {
  const out = new Uint32Array(nodes.length);
  for (let i = 0; i < nodes.length; i++) out[i] = hashText(nodes[i]!.name);
  return out;
}

/**
 * The addresses a status lists, as they are compared with node addresses
 * (canonical text); whatever is malformed in it lists nothing. A dotted quad
 * that parses is canonical already, so only IPv6 text is read.
 */
function readListed(ingress: unknown): Set<string> {
  const out = new Set<string>();
  if (!Array.isArray(ingress)) return out;
  for (const entry of ingress) {
    const ip = safely(() => (entry as { ip?: unknown } | undefined)?.ip, undefined);
    if (typeof ip !== 'string') continue;
    if (!ip.includes(':')) out.add(ip);
    else {
      const addr = parseAddress(ip);
      if (addr) out.add(addr.text);
    }
  }
  return out;
}

// Rendezvous scores. MurmurHash3 (x86, 32 bit) rather than node:crypto: an
// allocation scores every eligible node for every Service with more eligible
// nodes than it may list (50 million pairs at 10,000 Services and 5,000
// nodes), so each name is hashed once per allocation and a pair costs one
// integer mix. Nothing here needs to resist an adversary: a Service's owner
// who picked a name to rank some node first could as well ask for that
// node's address with spec.loadBalancerIP.

/** MurmurHash3's finaliser: every input bit moves about half the output bits. */
function fmix32(x: number): number {
  x ^= x >>> 16;
  x = Math.imul(x, 0x85ebca6b);
  x ^= x >>> 13;
  x = Math.imul(x, 0xc2b2ae35);
  x ^= x >>> 16;
  return x >>> 0;
}

/** MurmurHash3 (x86, 32 bit, seed 0) of a string's UTF-16 code units, two to a block. */
export function hashText(text: string): number {
  let h = 0;
  const n = text.length;
  let i = 0;
  for (; i + 1 < n; i += 2) {
    let k = text.charCodeAt(i) | (text.charCodeAt(i + 1) << 16);
    k = Math.imul(k, 0xcc9e2d51);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, 0x1b873593);
    h ^= k;
    h = (h << 13) | (h >>> 19);
    h = (Math.imul(h, 5) + 0xe6546b64) | 0;
  }
  if (i < n) {
    let k = text.charCodeAt(i);
    k = Math.imul(k, 0xcc9e2d51);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, 0x1b873593);
    h ^= k;
  }
  return fmix32(h ^ (n * 2));
}

/** A node's score for a Service, from both hashes: an unsigned 32-bit integer. */
function rendezvous(serviceHash: number, nodeHash: number): number {
  return fmix32(serviceHash ^ nodeHash);
}

/** The rendezvous score of a Service (`namespace/name`) and a node name, as chooseInFamily ranks them. */
export function rendezvousScore(service: string, node: string): number {
  return rendezvous(hashText(service), hashText(node));
}

/** One node in one family of a Service, as allocate() judges it. */
export interface NodeJudgement {
  node: string;
  family: Family;
  /** Every InternalIP and ExternalIP of this family, any of which a status may list. */
  addresses: string[];
  /** Why the node does not serve, in the words the condition uses: "its pier agent Lease has expired". */
  excluded?: { kind: Exclusion; why: string };
}

/**
 * Per pier Service (`namespace/name`), every node in each of its families,
 * judged by the same rules allocate() applies, so that `pier status` gives
 * the controller's reasons rather than its own. Pure and total, like allocate().
 * An eligible node the Service does not list (beyond its K addresses per
 * family) is `notChosen`, judged from the Service's status as allocate() does.
 */
export function judgeNodes(input: AllocateInput): Map<string, NodeJudgement[]> {
  const cluster = clusterView(readNodes(input));
  const serving = servingNodes(input.slices);
  const out = new Map<string, NodeJudgement[]>();
  for (const svc of uniqueBy(input.services ?? [], serviceKey)) {
    if (!safely(() => isPierService(svc, input.config), false)) continue;
    const request = safely(() => readService(svc, input.config), undefined);
    if (!request) continue;
    const only = localNodes(request, cluster, serving.get(request.key));
    // Which addresses the Service lists: needed only where a family has more eligible nodes than it may list.
    let listed: Set<string> | undefined;
    if (!request.blocked && request.requested.length === 0 && request.maxAddresses !== Number.POSITIVE_INFINITY) {
      const full = { ...request, rank: 0 };
      safely(() => chooseAddresses(full, cluster, serving.get(request.key)), undefined);
      listed = new Set(full.addresses.map((a) => a.text));
    }
    const judged: NodeJudgement[] = [];
    for (const family of request.families) {
      for (const node of cluster.nodes) {
        let kind = exclusion(node, request, family, only);
        if (!kind && listed && !listed.has(node.chosen[family]!.text)) kind = 'notChosen';
        const j: NodeJudgement = { node: node.name, family, addresses: [...node.all[family]] };
        if (kind) j.excluded = { kind, why: explainNode(node, kind, family, request) };
        judged.push(j);
      }
    }
    out.set(request.key, judged);
  }
  return out;
}

// ---------------------------------------------------------------------------
// External ports

function assignExternalPorts(requests: ServiceRequest[], nodePorts: NodePorts, config: AllocatorConfig): void {
  const active = requests.filter((p) => !p.blocked);
  for (const request of requests) request.external = request.ports.map((sp) => (sp.error || request.allocateMode || request.blocked ? undefined : sp.port));

  // The oldest service-mode Service per PROTO/port: an allocated port must not sit on one of those.
  const serviceMode = new Map<string, number>();
  for (const request of active) {
    if (request.allocateMode) continue;
    for (const sp of request.ports) {
      const k = `${sp.protocol}/${sp.port}`;
      if (!sp.error && !serviceMode.has(k)) serviceMode.set(k, request.rank);
    }
  }

  const range = clampRange(config.allocateRange);
  const reserved = (port: number) => isReserved(port, config.reservedPorts);
  const usable = (port: number) => port >= range.from && port <= range.to && !nodePorts.numbers.has(port) && !reserved(port);
  const taken = new Set<string>();
  const allocating = active.filter((p) => p.allocateMode);

  // First what Services remember, oldest first, so an older claim on a
  // remembered port wins over a younger one however the input is ordered.
  for (const request of allocating) {
    for (const sp of request.ports) {
      if (sp.error) continue;
      const keep = request.remembered[sp.index]!.find((port) => {
        const k = `${sp.protocol}/${port}`;
        const olderServiceMode = (serviceMode.get(k) ?? Infinity) < request.rank;
        return usable(port) && !taken.has(k) && !olderServiceMode;
      });
      if (keep === undefined) continue;
      request.external[sp.index] = keep;
      taken.add(`${sp.protocol}/${keep}`);
    }
  }

  // Then draw, lowest free first, for what remembers nothing valid. Draws
  // avoid every service-mode port too, so they never start a conflict.
  const cursor = new Map<string, number>();
  for (const request of allocating) {
    for (const sp of request.ports) {
      if (sp.error || request.external[sp.index] !== undefined) continue;
      // Availability only shrinks while drawing, so the search can resume where it stopped.
      let port = cursor.get(sp.protocol) ?? range.from;
      while (port <= range.to && (!usable(port) || taken.has(`${sp.protocol}/${port}`) || serviceMode.has(`${sp.protocol}/${port}`))) port++;
      cursor.set(sp.protocol, port);
      if (port > range.to) continue;
      request.external[sp.index] = port;
      taken.add(`${sp.protocol}/${port}`);
    }
  }
}

function clampRange(r: PortRange): PortRange {
  const from = Math.max(1, Number.isInteger(r?.from) ? r.from : 1);
  const to = Math.min(65535, Number.isInteger(r?.to) ? r.to : 0);
  return { from, to };
}

function isReserved(port: number, reserved: readonly PortRange[]): boolean {
  return (reserved ?? []).some((r) => port >= r.from && port <= r.to);
}

// ---------------------------------------------------------------------------
// Claims and conflicts

/**
 * Why each port is not served. Everything but a claim conflict holds on
 * every address alone, so only ports that two claimants share are looked at
 * address by address: that keeps a cluster of thousands of Services on
 * hundreds of nodes from costing a map entry per (address, port).
 */
function resolveClaims(requests: ServiceRequest[], nodePorts: NodePorts, config: AllocatorConfig): void {
  const claims = new Map<string, { request: ServiceRequest; index: number }[]>();
  for (const request of requests) {
    if (request.blocked) continue;
    for (const sp of request.ports) {
      const ext = request.external[sp.index];
      if (sp.error) {
        request.portErrors.set(sp.index, { reason: sp.error, detail: sp.error === REASONS.invalidPort ? 'the spec port is not in 1-65535' : `protocol ${JSON.stringify(sp.protocol)} is not TCP, UDP or SCTP` });
        continue;
      }
      if (ext === undefined) {
        const r = config.allocateRange;
        request.portErrors.set(sp.index, { reason: REASONS.portRangeExhausted, detail: `no free ${sp.protocol} port is left in the allocation range ${r?.from}-${r?.to}` });
        continue;
      }
      if (isReserved(ext, config.reservedPorts)) {
        request.portErrors.set(sp.index, { reason: REASONS.portReserved, detail: `${ext} is reserved for the node itself` });
        continue;
      }
      // A port's own NodePort leads to the same endpoints; any other NodePort does not.
      const nodePortOwners = (nodePorts.owners.get(`${sp.protocol}/${ext}`) ?? []).filter((o) => o !== `${request.key}#${sp.index}`);
      if (nodePortOwners.length > 0) {
        const names = [...new Set(nodePortOwners.map((o) => o.slice(0, o.lastIndexOf('#'))))].map((o) => (o === request.key ? 'another port of this Service' : o));
        request.portErrors.set(sp.index, { reason: REASONS.portConflict, detail: `${ext}/${sp.protocol} is a NodePort of ${names.join(', ')} on every node` });
        continue;
      }
      if (request.addresses.length === 0) continue;
      const k = `${sp.protocol}/${ext}`;
      const list = claims.get(k) ?? [];
      list.push({ request, index: sp.index });
      claims.set(k, list);
    }
  }
  // The oldest Service keeps an (address, protocol, port); the rest are told who has it.
  for (const list of claims.values()) {
    if (list.length < 2) continue;
    list.sort((a, b) => a.request.rank - b.request.rank || a.index - b.index);
    const holders = new Map<string, { request: ServiceRequest; index: number }>();
    for (const claim of list) {
      for (const addr of claim.request.addresses) {
        const winner = holders.get(addr.text);
        if (!winner) {
          holders.set(addr.text, claim);
          continue;
        }
        const holder = winner.request === claim.request ? `port ${portLabel(claim.request.ports[winner.index]!)} of this Service` : `${winner.request.key}, which is older`;
        let conflicts = claim.request.conflicts.get(claim.index);
        if (!conflicts) claim.request.conflicts.set(claim.index, (conflicts = new Map()));
        conflicts.set(addr.text, { reason: REASONS.portConflict, detail: `held by ${holder}` });
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Results

function portLabel(sp: SpecPort): string {
  return `${sp.port}/${sp.protocol}${sp.name ? ` (${sp.name})` : ''}`;
}

function result(request: ServiceRequest): ServiceAllocation {
  if (request.blocked) {
    return { ingress: [], condition: { status: 'False', ...request.blocked }, problems: dedupe([...request.warnings, request.blocked]) };
  }
  // Ports without an error where no endpoint backs them are refused, not served; they carry no error, or agents would not refuse them.
  let served = 0;
  let refused = 0;
  const errorAt = (sp: SpecPort, addr: string) => request.portErrors.get(sp.index) ?? request.conflicts.get(sp.index)?.get(addr);
  const portsAt = (addr: string) =>
    request.ports.map((sp) => {
      const err = errorAt(sp, addr);
      const out: PortAssignment = { port: request.external[sp.index] ?? sp.port, protocol: sp.protocol };
      if (err) out.error = err.reason;
      return out;
    });
  // Without conflicts every address has the same ports: one array for them all, not one per
  // address (at 2K addresses a Service, most of what an allocation holds). Nothing writes to it.
  const same = request.conflicts.size === 0 ? portsAt('') : undefined;
  const ingress: IngressAssignment[] = request.addresses.map((addr) => {
    for (const sp of request.ports) {
      if (errorAt(sp, addr.text)) continue;
      if (request.noEndpoints.includes(addr.family)) refused++;
      else served++;
    }
    return { ip: addr.text, ipMode: 'Proxy', ports: same ?? portsAt(addr.text) };
  });

  // One cause per spec port and reason, naming the addresses it applies to.
  const portCauses: Problem[] = [];
  for (const sp of request.ports) {
    const ext = request.external[sp.index];
    const label = request.allocateMode && ext !== undefined ? `${portLabel(sp)} -> ${ext}` : portLabel(sp);
    const cause = (err: PortError, addresses: string[]) => portCauses.push({ reason: err.reason, message: `port ${label} is not served on ${list(addresses)}: ${err.detail}` });
    const everywhere = request.portErrors.get(sp.index);
    if (everywhere) {
      if (request.addresses.length > 0) cause(everywhere, request.addresses.map((a) => a.text));
      continue;
    }
    const byDetail = new Map<string, { err: PortError; addresses: string[] }>();
    for (const [addr, err] of request.conflicts.get(sp.index) ?? []) {
      const k = `${err.reason}\0${err.detail}`;
      const entry = byDetail.get(k) ?? { err, addresses: [] };
      entry.addresses.push(addr);
      byDetail.set(k, entry);
    }
    for (const { err, addresses } of byDetail.values()) cause(err, addresses);
  }

  const causes = [...request.addressCauses, ...portCauses];
  let condition: ReadyCondition;
  if (causes.length === 0) {
    const ports = request.ports.map((sp) => (request.allocateMode ? `${request.external[sp.index]}/${sp.protocol} -> ${sp.port}` : `${sp.port}/${sp.protocol}`));
    condition = { status: 'True', reason: REASONS.serving, message: clip(`served on ${list(ingress.map((i) => i.ip))}, ${plural(ports.length, 'port')} ${list(ports)}`) };
  } else {
    // When nothing is served, the first cause is why: addresses before ports;
    // missing endpoints only when a port would be served but for them.
    const reason = served > 0 ? REASONS.partiallyServed : refused > 0 ? REASONS.noEndpoints : ingress.length === 0 ? causes[0]!.reason : (portCauses[0] ?? causes[0]!).reason;
    const backed = request.addresses.filter((a) => !request.noEndpoints.includes(a.family)).map((a) => a.text);
    const prefix = served > 0 ? `served on ${list(backed)} except: ` : '';
    condition = { status: 'False', reason, message: clip(prefix + causes.map((c) => c.message).join('; ')) };
  }

  const out: ServiceAllocation = { ingress, condition, problems: dedupe([...request.warnings, ...causes]) };
  if (request.allocateMode) {
    const mapping: Record<string, number> = {};
    for (const sp of request.ports) {
      const ext = request.external[sp.index];
      if (ext !== undefined && !sp.error) mapping[mappingKey(sp)] = ext;
    }
    out.portMapping = JSON.stringify(mapping);
  }
  return out;
}

// ---------------------------------------------------------------------------
// The function

export function allocate(input: AllocateInput): Allocation {
  const config = input.config;
  // One object per name, whatever the caller passed: the most recent by resourceVersion would be
  // a guess, the smallest serialisation is at least independent of order.
  const services = uniqueBy(input.services ?? [], serviceKey);
  const cluster = clusterView(readNodes(input));
  const serving = servingNodes(input.slices);
  const nodePorts = readNodePorts(services);

  const invalid = new Map<string, ServiceAllocation>();
  const read: Omit<ServiceRequest, 'rank'>[] = [];
  for (const svc of services) {
    if (!safely(() => isPierService(svc, config), false)) continue;
    try {
      read.push(readService(svc, config));
    } catch (err) {
      const problem = { reason: REASONS.invalidService, message: `cannot read the Service: ${safely(() => String((err as Error)?.message ?? err), 'unknown error')}` };
      invalid.set(safely(() => serviceKey(svc), '/'), { ingress: [], condition: { status: 'False', ...problem }, problems: [problem] });
    }
  }
  const requests: ServiceRequest[] = read
    .sort((a, b) => (a.created < b.created ? -1 : a.created > b.created ? 1 : compareText(a.key, b.key)))
    .map((p, rank) => ({ ...p, rank }));

  for (const request of requests) if (!request.blocked) chooseAddresses(request, cluster, serving.get(request.key));
  assignExternalPorts(requests, nodePorts, config);
  resolveClaims(requests, nodePorts, config);

  const byKey = new Map<string, ServiceAllocation>(invalid);
  for (const request of requests) byKey.set(request.key, result(request));
  return { services: new Map([...byKey].sort(([a], [b]) => compareText(a, b))) };
}

// ---------------------------------------------------------------------------
// Re-judging only what changed

/**
 * What reallocate() keeps between runs: per Service what it last decided and
 * from what, and how each node read. Plain data, never changed once made;
 * each run returns a new one.
 */
export interface AllocatorState {
  readonly config: AllocatorConfig;
  /** Per node name, nodeSignature() of its view. */
  readonly nodes: ReadonlyMap<string, string>;
  /** Per pier Service key (and each that could not be read). */
  readonly services: ReadonlyMap<string, Judged>;
  /** Keys of `services` that were read, in (creationTimestamp, namespace/name) order. */
  readonly ranked: readonly string[];
  /** Keys of the allocation, in key order. */
  readonly keys: readonly string[];
}

/**
 * What the state keeps of a read Service: its spec's reading alone. The
 * per-run fields would be empty Maps and arrays per Service, and the status
 * (statusIngress, listed) is read again from the same object when its
 * addresses are chosen again.
 */
type ServiceRead = Omit<ServiceRequest, 'rank' | 'statusIngress' | 'listed' | 'hash' | 'deps' | 'addresses' | 'addressCauses' | 'noEndpoints' | 'external' | 'portErrors' | 'conflicts'>;

function keptRead(r: Omit<ServiceRequest, 'rank'>): ServiceRead {
  const { key, created, ports, families, local, pool, allocateMode, requested, maxAddresses, remembered, warnings, blocked } = r;
  // families.slice(): built by push(), the array has room for 17.
  return { key, created, ports, families: families.slice(), local, pool, allocateMode, requested, maxAddresses, remembered, warnings, ...(blocked ? { blocked } : {}) };
}

/** The deps of every Service whose addresses any node's change may change, shared. */
const ANY_NODE: AddressDeps = { anyNode: true, windows: [] };

/** What the state keeps of a Service's AddressDeps: nothing of its own when any node counts, and windows without push()'s spare room. */
function keptDeps(d: AddressDeps | undefined): AddressDeps | undefined {
  if (!d) return undefined;
  if (d.anyNode) return ANY_NODE;
  return d.nodes ? { anyNode: false, nodes: d.nodes, windows: d.windows.slice() } : { anyNode: false, windows: d.windows.slice() };
}

/** One Service as reallocate() last judged it. */
interface Judged {
  /**
   * The object judged: another object (informer caches make one per change)
   * is read again. Weakly held, so that the state keeps no replaced object
   * alive (at 10,000 Services a backlog of writes replaces most of them
   * before the next allocation); a collected one was replaced.
   */
  readonly svc: WeakRef<V1Service>;
  readonly read?: ServiceRead;
  /** When the Service could not be read: its whole allocation. */
  readonly invalid?: ServiceAllocation;
  /** servingSignature() of its EndpointSlices, for Local Services. */
  readonly serving: string;
  readonly addresses: Address[];
  readonly addressCauses: Problem[];
  readonly noEndpoints: Family[];
  readonly hash?: number;
  readonly deps?: AddressDeps;
  /** portSignature() of the last run, and the result made with it. */
  readonly ports: string;
  readonly result?: ServiceAllocation;
}

export interface Reallocation extends Allocation {
  state: AllocatorState;
  /** Services whose addresses were chosen anew (the rest kept theirs unchanged). */
  rejudged: number;
}

/**
 * Beyond this many changed nodes in one run, every Service is re-judged:
 * checking each changed node against every Service costs about 1/100 of
 * judging every Service afresh.
 */
const MAX_CHANGED_NODES = 64;

/**
 * allocate(), re-judging only the Services a change can affect: equal to
 * allocate(input) for any `previous` (the property tests hold it to that),
 * and without one it judges everything. A Service's addresses are chosen
 * again when the Service object or (Local) its serving endpoints changed, or
 * a node it watched changed (AddressDeps: listed, in its ranked window of
 * 2K, or a serving node), or a node became eligible in its pool and family
 * with a rendezvous score above its window's floor (one score per Service
 * and changed node, instead of ranking every node for every Service). Ports
 * and conflicts are cross-Service and cheap: decided globally every run,
 * exactly as allocate() does; a Service's result is made again only when its
 * addresses or its ports' outcome changed, else the previous object is
 * returned, so that callers can compare by identity.
 */
export function reallocate(input: AllocateInput, previous?: AllocatorState): Reallocation {
  const config = input.config;
  const prev = previous?.config === config ? previous : undefined;
  const services = uniqueBy(input.services ?? [], serviceKey);
  const cluster = clusterView(readNodes(input));
  const serving = servingNodes(input.slices);
  const nodePorts = readNodePorts(services);

  const nodes = new Map(cluster.nodes.map((n) => [n.name, nodeSignature(n)]));
  const changed: ChangedNode[] = [];
  if (prev) {
    for (const [name, sig] of nodes) if (prev.nodes.get(name) !== sig) changed.push({ name, view: cluster.byName.get(name), before: undefined, hash: hashText(name) });
    for (const name of prev.nodes.keys()) if (!nodes.has(name)) changed.push({ name, view: undefined, before: undefined, hash: hashText(name) });
  }
  const everything = !prev || changed.length > MAX_CHANGED_NODES;
  if (!everything) for (const c of changed) c.before = viewOfSignature(c.name, prev.nodes.get(c.name));

  const judged = new Map<string, Judged>();
  const requests: ServiceRequest[] = [];
  const rechosen = new Set<ServiceRequest>();
  let reread = false;
  for (const svc of services) {
    if (!safely(() => isPierService(svc, config), false)) continue;
    const key = safely(() => serviceKey(svc), '/');
    const before = prev?.services.get(key);
    let base: Judged | undefined = before?.svc.deref() === svc ? before : undefined;
    if (base?.invalid) {
      judged.set(key, base);
      continue;
    }
    if (!base) {
      reread = true;
      try {
        // Every field of Judged, so that the copies below keep them all in the object.
        base = { svc: new WeakRef(svc), read: keptRead(readService(svc, config)), serving: '', addresses: [], addressCauses: [], noEndpoints: [], hash: undefined, deps: undefined, ports: '', result: undefined };
      } catch (err) {
        const problem = { reason: REASONS.invalidService, message: `cannot read the Service: ${safely(() => String((err as Error)?.message ?? err), 'unknown error')}` };
        judged.set(key, { svc: new WeakRef(svc), invalid: { ingress: [], condition: { status: 'False', ...problem }, problems: [problem] }, serving: '', addresses: [], addressCauses: [], noEndpoints: [], ports: '' });
        continue;
      }
    }
    const read = base.read!;
    const servingNow = read.local ? servingSignature(serving.get(read.key)) : '';
    const keep = base === before && !everything && !read.blocked && servingNow === base.serving && !affectedBy(base, changed);
    const request: ServiceRequest = {
      ...read,
      rank: 0,
      statusIngress: undefined,
      addresses: keep || read.blocked ? base.addresses : [],
      addressCauses: keep || read.blocked ? base.addressCauses : [],
      noEndpoints: keep || read.blocked ? base.noEndpoints : [],
      external: [],
      portErrors: new Map(),
      conflicts: new Map(),
    };
    if (!keep && !read.blocked) {
      // `svc` is the object `read` was read from (base.svc): its status as readService() reads it.
      request.statusIngress = statusIngressOf(svc);
      request.deps = { anyNode: false, windows: [] };
      chooseAddresses(request, cluster, serving.get(read.key));
      rechosen.add(request);
    }
    requests.push(request);
    // Keyed by read.key, the string the state keeps anyway: `key` is made anew on every run.
    judged.set(read.key, rechosen.has(request) ? { ...base, serving: servingNow, addresses: request.addresses, addressCauses: request.addressCauses, noEndpoints: request.noEndpoints, hash: request.hash, deps: keptDeps(request.deps) } : base);
  }

  // Ranks: the previous order while no Service was added, removed or read again.
  const byKey = new Map(requests.map((r) => [r.key, r]));
  let ranked: string[];
  if (prev && !reread && prev.ranked.length === requests.length && prev.ranked.every((k) => byKey.has(k))) ranked = [...prev.ranked];
  else ranked = requests.sort((a, b) => (a.created < b.created ? -1 : a.created > b.created ? 1 : compareText(a.key, b.key))).map((r) => r.key);
  const ordered = ranked.map((k, rank) => Object.assign(byKey.get(k)!, { rank }));

  assignExternalPorts(ordered, nodePorts, config);
  resolveClaims(ordered, nodePorts, config);

  const results = new Map<string, ServiceAllocation>();
  for (const request of ordered) {
    const j = judged.get(request.key)!;
    const ports = portSignature(request);
    const before = prev?.services.get(request.key);
    const same = !rechosen.has(request) && before !== undefined && j.read === before.read && before.ports === ports && before.result !== undefined;
    const out = same ? before.result! : result(request);
    results.set(request.key, out);
    if (!same) judged.set(request.key, { ...j, ports, result: out });
  }
  for (const [key, j] of judged) if (j.invalid) results.set(key, j.invalid);

  const keys = prev && prev.keys.length === results.size && prev.keys.every((k) => results.has(k)) ? prev.keys : [...results.keys()].sort(compareText);
  return {
    services: new Map(keys.map((k) => [k, results.get(k)!])),
    state: { config, nodes, services: judged, ranked, keys },
    rejudged: rechosen.size,
  };
}

/** Whether a change of these nodes may change the addresses `j` was given (see AddressDeps). */
function affectedBy(j: Judged, changed: readonly ChangedNode[]): boolean {
  const deps = j.deps;
  if (!deps || changed.length === 0) return false;
  if (deps.anyNode) return true;
  for (const node of changed) {
    if (deps.nodes?.has(node.name)) return true;
    for (const w of deps.windows) {
      const key = rendezvous(j.hash!, node.hash);
      const above = key > w.floorKey || (key === w.floorKey && node.name < w.floorName);
      // In the window: eligible in the previous run and ranked at or above its floor. Exact, because
      // since the window was made its nodes have not changed, and no node ranked above its floor has
      // become eligible: either would have re-judged the Service (this check, and the one below).
      if ((above || node.name === w.floorName) && node.before && exclusion(node.before, j.read!, w.family, {}) === undefined) return true;
      if (!node.view || exclusion(node.view, j.read!, w.family, {}) !== undefined) continue;
      if (!w.full || above) return true;
    }
  }
  return false;
}

/** A node whose view differs from the previous run's: now, and as the previous run read it. */
interface ChangedNode {
  name: string;
  view: NodeView | undefined;
  before: NodeView | undefined;
  hash: number;
}

/** The view nodeSignature() was made from, as far as exclusion() reads it. */
function viewOfSignature(name: string, signature: string | undefined): NodeView | undefined {
  if (signature === undefined) return undefined;
  const [pool, ready, excluded, agent, ipv4, ipv6, chosen4, chosen6, all4, all6] = JSON.parse(signature) as [string, boolean, boolean, NodeView['agent'], boolean, boolean, string | null, string | null, string[], string[]];
  const chosen: NodeView['chosen'] = {};
  const a4 = parseAddress(chosen4);
  const a6 = parseAddress(chosen6);
  if (a4) chosen.ipv4 = a4;
  if (a6) chosen.ipv6 = a6;
  return { name, pool, ready, excluded, agent, forwarding: { ipv4, ipv6 }, chosen, all: { ipv4: new Set(all4), ipv6: new Set(all6) } };
}

/** Everything allocate() reads from a node's view. */
function nodeSignature(n: NodeView): string {
  return JSON.stringify([n.pool, n.ready, n.excluded, n.agent, n.forwarding.ipv4, n.forwarding.ipv6, n.chosen.ipv4?.text, n.chosen.ipv6?.text, [...n.all.ipv4], [...n.all.ipv6]]);
}

function servingSignature(s: Serving | undefined): string {
  return s ? JSON.stringify([[...s.ipv4], [...s.ipv6]]) : '';
}

/** What result() reads from the cross-Service steps. */
function portSignature(r: ServiceRequest): string {
  const external = r.external.join(',');
  if (r.portErrors.size === 0 && r.conflicts.size === 0) return external;
  return JSON.stringify([external, [...r.portErrors], [...r.conflicts].map(([i, m]) => [i, [...m]])]);
}

// ---------------------------------------------------------------------------
// Small helpers

function isPort(p: unknown): p is number {
  return typeof p === 'number' && Number.isInteger(p) && p >= 1 && p <= 65535;
}



function uniqueBy<T>(items: readonly T[], keyOf: (item: T) => string): T[] {
  // Serialised only when a key repeats: informer caches never repeat one,
  // and serialising thousands of Services on every allocation was most of its time.
  const chosen = new Map<string, { item: T; text?: string }>();
  const text = (c: { item: T; text?: string }) => (c.text ??= safely(() => JSON.stringify(c.item) ?? '', ''));
  for (const item of items) {
    const key = safely(() => keyOf(item), '');
    const prev = chosen.get(key);
    const next = { item };
    if (!prev || text(next) < text(prev)) chosen.set(key, next);
  }
  return [...chosen.values()].map((c) => c.item);
}

function dedupe(problems: Problem[]): Problem[] {
  const seen = new Set<string>();
  return problems.filter((p) => {
    const k = `${p.reason}\0${p.message}`;
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });
}

function plural(n: number, word: string): string {
  return n === 1 ? word : `${word}s`;
}

/** Conditions hold 32768 characters; a person reads far fewer. */
const MAX_MESSAGE = 4096;
function clip(text: string): string {
  return text.length <= MAX_MESSAGE ? text : `${text.slice(0, MAX_MESSAGE - 1)}…`;
}

/** A readable list that stays short for Services with a hundred ports. */
function list(items: string[], max = 6): string {
  if (items.length <= max) return items.join(', ');
  return `${items.slice(0, max).join(', ')} and ${items.length - max} more`;
}
