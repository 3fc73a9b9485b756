// From Kubernetes objects to the plain data the agent programs: for each
// address family, the service ports this node serves, with their frontends
// (node address and external port), endpoints and allowed sources.
//
// Everything here is pure and total: a malformed object costs at most its own
// Service (or one port, or one endpoint) and becomes a Problem, never an
// exception, so one bad manifest cannot stop a node from serving the rest.
// Addresses leave this module in the canonical text iptables-save prints, so
// the renderer can compare its output with the kernel's by string equality.
import type { DiscoveryV1EndpointPort, V1EndpointSlice, V1LoadBalancerIngress, V1Node, V1Service, V1ServicePort } from '@kubernetes/client-node';

import { addressInfo, compareAddresses, compareText, parseCidr, type AddressInfo } from '../../lib/address.ts';
import { FAMILIES, SOURCE_RANGES_ANNOTATION, isPierService, type Family } from '../../lib/contract.ts';
import { SERVICE_NAME_LABEL, safely, serviceKey, timestamp } from '../../lib/objects.ts';
import { problemKey, type Problem as ReportedProblem } from '../../lib/problem.ts';
import { isProtocol, PROTOCOL, type Protocol } from '../../lib/protocols.ts';

export type { Family };
export { isPierService };
export { compareAddresses, compareText, formatAddress, parseAddress, parseCidr, type ParsedAddress, type ParsedCidr } from '../../lib/address.ts';
export { PROTOCOLS, type Protocol } from '../../lib/protocols.ts';

export interface Frontend {
  address: string;
  port: number;
}

export interface Endpoint {
  address: string;
  port: number;
  local: boolean;
}

/**
 * One port of one Service as this node serves it in one family: where
 * clients reach it (frontends), where it sends them (endpoints), and how.
 * ("plan" is only `pier plan`; the controller's, per Service, is a ServiceRequest.)
 */
export interface ServedPort {
  /** Stable unique id, `<family>/<ns>/<name>/<port name or index>/<protocol>`; chain names are hashed from it. */
  key: string;
  /** `ns/name:port`, sanitised for an iptables comment. */
  comment: string;
  protocol: Protocol;
  frontends: Frontend[];
  endpoints: Endpoint[];
  /**
   * Endpoints the slices list that the rules send no new connection to (not
   * ready, draining while others are ready, on other nodes under Local):
   * TCP flows already made to them are theirs to end, not the agent's
   * (conntrack.ts deletes only flows to endpoints that left the slices).
   */
  retained: Endpoint[];
  /** Allowed client networks of this family (canonical CIDRs); only meaningful when restrictSources. */
  sourceRanges: string[];
  /**
   * The Service limits its clients. With no range of this family listed, no
   * client of this family may connect: a v4-only allow list must not leave
   * the v6 frontends open to everyone.
   */
  restrictSources: boolean;
  /** externalTrafficPolicy Cluster: replies must come back through this node. */
  masquerade: boolean;
  /**
   * sessionAffinity ClientIP: how many seconds a client stays with the
   * endpoint it last used; 0 without affinity.
   */
  affinity: number;
}

export interface FamilyModel {
  family: Family;
  ports: ServedPort[];
}

/** Served ports that went and came between two sorted lists, each in key order. */
export interface PortChanges {
  since: readonly ServedPort[];
  removed: ServedPort[];
  added: ServedPort[];
}

/** The agent's problems always name their Service. */
export interface Problem extends ReportedProblem {
  service: string;
}
export { problemKey };

export interface ModelConfig {
  loadBalancerClass: string;
  /** Also serve LoadBalancer Services that name no class. */
  defaultClass: boolean;
  maxPortsPerService: number;
}

export interface ModelInput {
  nodeName: string;
  /** This node's addresses, both families. */
  nodeAddresses: string[];
  services: V1Service[];
  slices: V1EndpointSlice[];
  config: ModelConfig;
}

export interface Model {
  ipv4: FamilyModel;
  ipv6: FamilyModel;
  problems: Problem[];
}

export { SERVICE_NAME_LABEL };

// ---------------------------------------------------------------------------
// Addresses (lib/address.ts), and the order of frontends

/** Frontends in the order a served port lists them. */
export function compareFrontends(a: Frontend, b: Frontend): number {
  return compareAddresses(a.address, b.address) || a.port - b.port;
}

// ---------------------------------------------------------------------------
// Comments

/** iptables' comment match holds 255 characters. */
export const MAX_COMMENT = 255;

const COMMENT_SAFE = /^[A-Za-z0-9._:/-]*$/;

export function sanitizeComment(text: string): string {
  const safe = COMMENT_SAFE.test(text) ? text : text.replace(/[^A-Za-z0-9._:/-]/g, '_');
  return safe.length > MAX_COMMENT ? safe.slice(0, MAX_COMMENT) : safe;
}

// ---------------------------------------------------------------------------
// The model
//
// In two steps, so that an incremental caller (pipeline.ts) can keep the
// first one per Service and redo only the second:
//  1. serviceResult: one Service and its slices -> its served ports, with every
//     frontend they claim, and its problems. Depends on nothing else but the
//     node and the config (ModelContext).
//  2. across Services: each claimed frontend goes to the oldest claimant
//     (rankClaims); a served port that loses a frontend is replaced by a copy
//     without it, and one that loses all is dropped; served ports are ordered by
//     key, problems deduplicated.

export interface ServiceIdentity {
  /** `namespace/name` */
  id: string;
  created: number;
}

/** A served port's wish to serve one frontend; conflicts between Services are settled per `key`. */
export interface Claim {
  served: ServedPort;
  owner: ServiceIdentity;
  portLabel: string;
  frontend: Frontend;
  /** The frontend as conflicts see it: address, protocol and port in one number (frontendKey). */
  key: number;
}

/** What one Service contributes, before conflicts between Services are settled. */
export interface ServiceResult {
  owner: ServiceIdentity;
  /** Served ports with every frontend they claim, sorted; never changed once made. */
  servedPorts: ServedPort[];
  /** Port by port, in the order of `servedPorts`; each served port's claims in the order of its frontends. */
  claims: Claim[];
  problems: Problem[];
}

/** Everything a ServiceResult depends on besides the Service and its slices. */
export interface ModelContext {
  nodeName: string;
  /** This node's addresses, canonical, each with its index: frontends are only ever on these. */
  nodeAddresses: ReadonlyMap<string, number>;
  config: ModelConfig;
}

/** A frontend as one number, so that conflicts are found without a string per claim. */
function frontendKey(ctx: ModelContext, address: string, protocol: Protocol, port: number): number {
  return (ctx.nodeAddresses.get(address)! * 4 + PROTOCOL[protocol].index) * 65536 + port;
}


export function modelContext(input: Pick<ModelInput, 'nodeName' | 'nodeAddresses' | 'config'>): ModelContext {
  const nodeAddresses = new Map<string, number>();
  for (const a of input.nodeAddresses ?? []) {
    const p = addressInfo(a);
    if (p && !nodeAddresses.has(p.text)) nodeAddresses.set(p.text, nodeAddresses.size);
  }
  return { nodeName: input.nodeName, nodeAddresses, config: input.config };
}

/** `namespace/service` a slice belongs to, or undefined when it names none. */
export function sliceServiceId(slice: V1EndpointSlice): string | undefined {
  const svcName = slice?.metadata?.labels?.[SERVICE_NAME_LABEL];
  if (!svcName) return undefined;
  return [slice.metadata?.namespace ?? '', '/', svcName].join('');
}

/** `namespace/name` of a Service: the id sliceServiceId gives its slices. */
export const serviceId = serviceKey;

export function serviceOwner(svc: V1Service): ServiceIdentity {
  try {
    return { id: serviceId(svc), created: timestamp(svc.metadata?.creationTimestamp) };
  } catch {
    return { id: '/', created: Number.POSITIVE_INFINITY };
  }
}

/**
 * One pier Service (isPierService) with the slices labelled for it. Never
 * throws, and keeps nothing of a Service it could not read to the end: a
 * Service is served completely or not at all.
 */
export function serviceResult(svc: V1Service, owner: ServiceIdentity, slices: readonly V1EndpointSlice[], ctx: ModelContext): ServiceResult {
  const mine: ServiceResult = { owner, servedPorts: NONE, claims: NONE, problems: NONE };
  try {
    serviceModel(svc, owner, ctx, slices, mine);
    // Kept as long as the Service is: without the room arrays leave to grow.
    if (mine.servedPorts.length > 1) mine.servedPorts = mine.servedPorts.slice();
    if (mine.claims.length > 1) mine.claims = mine.claims.slice();
    if (mine.problems.length > 1) mine.problems = mine.problems.slice();
    return mine;
  } catch (err) {
    // A shape no check anticipated (a hand-written object with wrong types):
    // this Service is skipped, the others are not.
    return { owner, servedPorts: NONE, claims: NONE, problems: [{ service: owner.id, reason: 'InvalidService', message: `cannot read Service ${owner.id}: ${(err as Error).message}` }] };
  }
}

export function compareServedPorts(a: ServedPort, b: ServedPort): number {
  return compareText(a.key, b.key);
}

/**
 * The served ports that went and came from one family model to the next,
 * found by identity: the pipeline hands out the same object while a
 * Service and its slices do not change, so an unchanged port costs one
 * comparison. Both lists sorted by key, as models are; undefined when
 * `after` is not.
 */
export function diffServedPorts(before: readonly ServedPort[], after: readonly ServedPort[]): { removed: ServedPort[]; added: ServedPort[] } | undefined {
  for (let i = 1; i < after.length; i++) if (!(after[i - 1]!.key < after[i]!.key)) return undefined;
  const removed: ServedPort[] = [];
  const added: ServedPort[] = [];
  let i = 0;
  let j = 0;
  while (i < before.length || j < after.length) {
    const a = before[i];
    const b = after[j];
    if (a && a === b) {
      i++;
      j++;
    } else if (a && (!b || a.key <= b.key)) {
      removed.push(a);
      i++;
      if (b && a.key === b.key) {
        added.push(b);
        j++;
      }
    } else {
      added.push(b!);
      j++;
    }
  }
  return { removed, added };
}

/**
 * The served ports that went and came from `before` to `after`: the
 * engine's own record (`changes`, EngineResult) when it made `after` from
 * `before`, so that one change costs no pass over 10,000 ports (bench:agent,
 * "nftables ... one Service changed"); else diffServedPorts.
 */
export function portChanges(before: readonly ServedPort[], after: FamilyModel, changes: PortChanges | undefined): { removed: ServedPort[]; added: ServedPort[] } | undefined {
  return changes && changes.since === before ? changes : diffServedPorts(before, after.ports);
}

/**
 * isPierService, false for an object it cannot read. A function of its own,
 * not a closure inside the engine's loop over the Services: a closure in a
 * loop body makes V8 allocate that body's scope on every pass, even when the
 * closure is not made (40 bytes per Service and sync, 400 KB at 10,000
 * Services; bench:agent, "no-op sync").
 */
export function pierService(svc: V1Service, config: ModelConfig): boolean {
  return safely(() => isPierService(svc, config), false);
}

export function servedFamily(served: ServedPort): Family {
  return served.key.startsWith('ipv4/') ? 'ipv4' : 'ipv6';
}

/** Shared by every served port without source ranges; nothing changes model arrays. */
const NONE: never[] = Object.freeze([]) as never[];

/** Appends to a list that starts as NONE: most lists here hold one item, and a literal of one is exactly its size. */
function append<T>(list: T[], item: T): T[] {
  if (list === NONE) return [item];
  list.push(item);
  return list;
}

/**
 * How problems, Events and traces name a Service port: by its name, else
 * (Kubernetes leaves only a Service's single port unnamed) as users write
 * it, `80/TCP`; its index in spec.ports means nothing to a reader.
 */
export function servicePortLabel(sp: V1ServicePort | undefined, index: number): string {
  if (typeof sp?.name === 'string' && sp.name !== '') return sp.name;
  return Number.isInteger(sp?.port) ? `${sp!.port}/${sp!.protocol ?? 'TCP'}` : `index ${index}`;
}

function problem(out: ServiceResult, p: Problem): void {
  out.problems = append(out.problems, p);
}

// Indexed loops rather than for...of below: this runs per Service on a cold
// sync, and with the agent's Node flags (no optimising compiler) every
// iterator step allocates.
function serviceModel(svc: V1Service, owner: ServiceIdentity, ctx: ModelContext, slices: readonly V1EndpointSlice[], out: ServiceResult): void {
  const service = owner.id;
  const here = ingressHere(svc, ctx);
  if (!here) return;
  const { ingresses, ips } = here;

  const specPorts: V1ServicePort[] = svc.spec?.ports ?? NONE;
  const max = ctx.config.maxPortsPerService;
  if (specPorts.length > max) {
    problem(out, { service, reason: 'TooManyPorts', message: `Service ${service} has ${specPorts.length} ports, more than the ${max} this agent serves per Service; none is served` });
    return;
  }

  const ranges = sourceRanges(svc);
  if ('bad' in ranges) {
    problem(out, {
      service,
      reason: 'InvalidSourceRange',
      message: `Service ${service}: source range ${JSON.stringify(ranges.bad)} is not a CIDR or an address; the Service is not served rather than served to everyone`,
    });
    return;
  }

  if (!Array.isArray(specPorts)) throw new TypeError('spec.ports is not a list');
  const local = svc.spec?.externalTrafficPolicy === 'Local';
  const affinity = affinitySeconds(svc, out);
  const keys = specPorts.length > 1 ? new Set<string>() : undefined;
  for (let index = 0; index < specPorts.length; index++) {
    const sp = specPorts[index]!;
    const portName = typeof sp?.name === 'string' ? sp.name : '';
    // The key names chains (render.ts): it stays the name or index, so that no chain is renamed.
    const portKey = portName || String(index);
    const portLabel = servicePortLabel(sp, index);
    const proto = specProtocol(sp, service, portLabel, portKey, portName, keys, out);
    if (proto === undefined) continue;

    const frontends = portFrontends(here, index, proto, portLabel, out);
    if (!frontends) continue;

    const endpoints = portEndpoints(service, portLabel, portName, proto, local, ctx.nodeName, slices, out);
    const comment = sanitizeComment([service, ':', portName || (Number.isInteger(sp.port) ? sp.port : index)].join(''));
    for (let f = 0; f < FAMILIES.length; f++) {
      const family = FAMILIES[f]!;
      const inFamily = frontends[family];
      if (!inFamily) continue;
      insertionSort(inFamily, compareFrontends);
      const restrictSources = ranges.restrict && !ranges.open[family];
      const served: ServedPort = {
        key: [family, '/', service, '/', portKey, '/', proto].join(''),
        comment,
        protocol: proto,
        frontends: inFamily,
        endpoints: endpoints[family],
        retained: endpoints.retained[family],
        sourceRanges: restrictSources ? ranges[family] : NONE,
        restrictSources,
        masquerade: !local,
        affinity,
      };
      out.servedPorts = append(out.servedPorts, served);
      for (let k = 0; k < inFamily.length; k++) {
        const frontend = inFamily[k]!;
        out.claims = append(out.claims, { served, owner, portLabel, frontend, key: frontendKey(ctx, frontend.address, proto, frontend.port) });
      }
    }
  }
}

/** A Service's ingress entries that are this node's addresses, with those addresses parsed. */
interface IngressHere {
  ingresses: V1LoadBalancerIngress[];
  ips: AddressInfo[];
}

/**
 * The Service's ingress entries on this node, or undefined when it has none:
 * only Services advertised on this node concern this agent; reporting the
 * others would make every node raise the same Event.
 */
function ingressHere(svc: V1Service, ctx: ModelContext): IngressHere | undefined {
  let ingresses: V1LoadBalancerIngress[] = NONE;
  let ips: AddressInfo[] = NONE;
  const allIngress = svc.status?.loadBalancer?.ingress ?? NONE;
  if (!Array.isArray(allIngress)) throw new TypeError('status.loadBalancer.ingress is not a list');
  for (let i = 0; i < allIngress.length; i++) {
    const ing = allIngress[i]!;
    const ip = addressInfo(ing?.ip);
    if (ip !== undefined && ctx.nodeAddresses.has(ip.text)) {
      ingresses = append(ingresses, ing);
      ips = append(ips, ip);
    }
  }
  return ingresses.length === 0 ? undefined : { ingresses, ips };
}

/**
 * Where spec port `index` is served on this node, per family, from the
 * status the controller wrote; undefined when nowhere. A status entry that
 * is missing or does not fit the spec is a Problem, and not served.
 */
function portFrontends(here: IngressHere, index: number, proto: Protocol, portLabel: string, out: ServiceResult): Partial<Record<Family, Frontend[]>> | undefined {
  const service = out.owner.id;
  const { ingresses, ips } = here;
  let v4: Frontend[] | undefined;
  let v6: Frontend[] | undefined;
  const seenFrontends = ingresses.length > 1 ? new Set<string>() : undefined;
  for (let k = 0; k < ingresses.length; k++) {
    const ing = ingresses[k]!;
    const ip = ips[k]!;
    const st = ing.ports?.[index];
    if (!st) {
      problem(out, { service, port: portLabel, reason: 'StatusPortMissing', message: `Service ${service} port ${portLabel}: status for ${ip.text} has no entry ${index}; the port is not served there` });
      continue;
    }
    if (st.error) continue;
    if (!Number.isInteger(st.port) || st.port < 1 || st.port > 65535) {
      problem(out, { service, port: portLabel, reason: 'StatusPortInvalid', message: `Service ${service} port ${portLabel}: status port ${JSON.stringify(st.port)} for ${ip.text} is not in 1-65535` });
      continue;
    }
    if (st.protocol !== undefined && st.protocol !== proto) {
      problem(out, { service, port: portLabel, reason: 'StatusPortMismatch', message: `Service ${service} port ${portLabel}: status protocol ${JSON.stringify(st.protocol)} for ${ip.text} does not match ${proto}` });
      continue;
    }
    if (seenFrontends) {
      const fk = `${ip.text}|${st.port}`;
      if (seenFrontends.has(fk)) continue;
      seenFrontends.add(fk);
    }
    const frontend: Frontend = { address: ip.text, port: st.port };
    if (ip.family === 'ipv4') v4 = v4 ? [...v4, frontend] : [frontend];
    else v6 = v6 ? [...v6, frontend] : [frontend];
  }
  if (!v4 && !v6) return undefined;
  return { ipv4: v4, ipv6: v6 };
}

/**
 * A spec port's protocol, or undefined (and a Problem) when the port is not
 * served: a protocol pier does not serve, or the second port of one name
 * (or index) and protocol. `keys` holds those seen, undefined for a Service
 * of one port.
 */
function specProtocol(sp: V1ServicePort, service: string, portLabel: string, portKey: string, portName: string, keys: Set<string> | undefined, out: ServiceResult): Protocol | undefined {
  const protocol = sp?.protocol ?? 'TCP';
  if (!isProtocol(protocol)) {
    problem(out, { service, port: portLabel, reason: 'UnsupportedProtocol', message: `Service ${service} port ${portLabel}: protocol ${JSON.stringify(protocol)} is not TCP, UDP or SCTP; the port is not served` });
    return undefined;
  }
  if (keys) {
    const id = `${portKey}/${protocol}`;
    if (keys.has(id)) {
      problem(out, { service, port: portLabel, reason: 'DuplicatePort', message: `Service ${service}: port ${portName ? id : portLabel} appears twice; only the first is served` });
      return undefined;
    }
    keys.add(id);
  }
  return protocol;
}

/** kube-proxy's default and the API server's bound for sessionAffinityConfig.clientIP.timeoutSeconds. */
export const DEFAULT_AFFINITY_SECONDS = 10800;
const MAX_AFFINITY_SECONDS = 86400;

/** The Service's ClientIP affinity timeout in seconds, 0 for none; a timeout out of bounds gets the default, and a Problem. */
function affinitySeconds(svc: V1Service, out: ServiceResult): number {
  if (svc.spec?.sessionAffinity !== 'ClientIP') return 0;
  const t = svc.spec.sessionAffinityConfig?.clientIP?.timeoutSeconds;
  if (t === undefined || t === null) return DEFAULT_AFFINITY_SECONDS;
  if (Number.isInteger(t) && t > 0 && t <= MAX_AFFINITY_SECONDS) return t;
  problem(out, {
    service: out.owner.id,
    reason: 'InvalidSessionAffinity',
    message: `Service ${out.owner.id}: sessionAffinityConfig.clientIP.timeoutSeconds ${JSON.stringify(t)} is not in 1-${MAX_AFFINITY_SECONDS}; using ${DEFAULT_AFFINITY_SECONDS}`,
  });
  return DEFAULT_AFFINITY_SECONDS;
}

type Ranges = Record<Family, string[]> & { restrict: boolean; open: Record<Family, boolean> };

/** Shared by every Service without ranges; served ports never hand its arrays out (they are not restricted). */
const NO_RANGES: Ranges = Object.freeze({ ipv4: NONE, ipv6: NONE, restrict: false, open: { ipv4: false, ipv6: false } });

function sourceRanges(svc: V1Service): Ranges | { bad: string } {
  let raw: unknown[] = Array.isArray(svc.spec?.loadBalancerSourceRanges) ? svc.spec.loadBalancerSourceRanges : [];
  if (raw.length === 0) {
    const ann = svc.metadata?.annotations?.[SOURCE_RANGES_ANNOTATION];
    raw = typeof ann === 'string' ? ann.split(',') : [];
  }
  if (raw.length === 0) return NO_RANGES;
  const out: Ranges = { ipv4: [], ipv6: [], restrict: false, open: { ipv4: false, ipv6: false } };
  for (const entry of raw) {
    const text = typeof entry === 'string' ? entry.trim() : entry;
    if (text === '') continue;
    const cidr = parseCidr(text);
    if (!cidr) return { bad: String(text) };
    out.restrict = true;
    // A /0 admits everyone of its family; saying so without a rule keeps the
    // rendered form free of matches iptables would print differently.
    if (cidr.prefix === 0) out.open[cidr.family] = true;
    if (!out[cidr.family].includes(cidr.text)) out[cidr.family].push(cidr.text);
  }
  for (const family of FAMILIES) out[family].sort((a, b) => compareCidrs(a, b));
  return out;
}

function compareCidrs(a: string, b: string): number {
  const [aa = '', ap = ''] = a.split('/');
  const [ba = '', bp = ''] = b.split('/');
  return compareAddresses(aa, ba) || Number(ap) - Number(bp);
}

function compareEndpoints(a: Endpoint, b: Endpoint): number {
  return compareAddresses(a.address, b.address) || a.port - b.port;
}

/** A port's endpoints per family, sorted, and the others its slices list (ServedPort.retained). */
interface PortEndpoints {
  ipv4: Endpoint[];
  ipv6: Endpoint[];
  retained: { ipv4: Endpoint[]; ipv6: Endpoint[] };
}

function portEndpoints(
  service: string,
  portLabel: string,
  portName: string,
  protocol: Protocol,
  local: boolean,
  nodeName: string,
  slices: readonly V1EndpointSlice[],
  out: ServiceResult,
): PortEndpoints {
  // Sized for every endpoint listed, so the common case (one slice, all
  // ready, one family) ends with a list of exactly its size and no copy.
  let room = 0;
  for (let s = 0; s < slices.length; s++) room += slices[s]?.endpoints?.length ?? 0;
  let ready: Endpoint[] | undefined;
  let nReady = 0;
  let fallback: Endpoint[] | undefined;
  let nFallback = 0;
  let others: Endpoint[] | undefined;
  // A slice port of this name under another protocol only: the Service port gets no endpoints, and says why.
  let matched = false;
  let otherProtocol: string | undefined;
  for (let s = 0; s < slices.length; s++) {
    const slice = slices[s]!;
    if (slice.addressType !== 'IPv4' && slice.addressType !== 'IPv6') continue;
    let sp: DiscoveryV1EndpointPort | undefined;
    const ports = slice.ports ?? NONE;
    if (!Array.isArray(ports)) throw new TypeError(`EndpointSlice ${slice.metadata?.name ?? ''}: ports is not a list`);
    for (let i = 0; i < ports.length; i++) {
      const p = ports[i];
      if ((p?.name ?? '') !== portName) continue;
      if ((p?.protocol ?? 'TCP') === protocol) {
        sp = p;
        matched = true;
        break;
      }
      otherProtocol ??= String(p?.protocol ?? 'TCP');
    }
    // No port means "unrestricted" in the API; there is nothing to DNAT to.
    if (!sp || sp.port === undefined || sp.port === null) continue;
    if (!Number.isInteger(sp.port) || sp.port < 1 || sp.port > 65535) {
      problem(out, { service, port: portLabel, reason: 'InvalidEndpointPort', message: `Service ${service} port ${portLabel}: EndpointSlice ${slice.metadata?.name ?? ''} has port ${JSON.stringify(sp.port)}, not in 1-65535; its endpoints are skipped` });
      continue;
    }
    const eps = slice.endpoints ?? NONE;
    if (!Array.isArray(eps)) throw new TypeError(`EndpointSlice ${slice.metadata?.name ?? ''}: endpoints is not a list`);
    for (let i = 0; i < eps.length; i++) {
      const ep = eps[i];
      const rawAddress = ep?.addresses?.[0];
      const addr = addressInfo(rawAddress);
      if (!addr) {
        problem(out, { service, port: portLabel, reason: 'InvalidEndpointAddress', message: `Service ${service} port ${portLabel}: endpoint address ${JSON.stringify(rawAddress)} in EndpointSlice ${slice.metadata?.name ?? ''} is not an IP address; it is skipped` });
        continue;
      }
      const isLocal = ep!.nodeName === nodeName;
      const endpoint: Endpoint = { address: addr.text, port: sp.port, local: isLocal };
      const c = ep!.conditions;
      if (local && !isLocal) (others ??= []).push(endpoint);
      else if (c?.ready !== false) (ready ??= new Array<Endpoint>(room))[nReady++] = endpoint;
      else if (c.serving === true && c.terminating === true) (fallback ??= new Array<Endpoint>(room))[nFallback++] = endpoint;
      else (others ??= []).push(endpoint);
    }
  }
  if (!matched && otherProtocol !== undefined) {
    problem(out, {
      service,
      port: portLabel,
      reason: 'EndpointProtocolMismatch',
      message: `Service ${service} port ${portLabel}: its EndpointSlices list port ${JSON.stringify(portName)} as ${otherProtocol}, not ${protocol}; the port has no endpoints, so connections to it are rejected`,
    });
  }
  return familyEndpoints(ready, nReady, fallback, nFallback, others);
}

/**
 * Each family's endpoints from the first `nReady` of `ready` and `nFallback`
 * of `fallback` (serving but terminating): those only when nothing of the
 * family is ready, since a draining pod is better than a refused connection.
 */
function familyEndpoints(ready: Endpoint[] | undefined, nReady: number, fallback: Endpoint[] | undefined, nFallback: number, others: Endpoint[] | undefined): PortEndpoints {
  const result: PortEndpoints = { ipv4: NONE, ipv6: NONE, retained: RETAINED_NONE };
  if (ready) {
    ready.length = nReady;
    insertionSort(ready, compareEndpoints);
  }
  if (fallback) {
    fallback.length = nFallback;
    insertionSort(fallback, compareEndpoints);
  }
  const readyV4 = ready ? ipv4Run(ready) : 0;
  const fallbackV4 = fallback ? ipv4Run(fallback) : 0;
  if (readyV4 > 0) result.ipv4 = distinct(ready!, 0, readyV4);
  else if (fallbackV4 > 0) result.ipv4 = distinct(fallback!, 0, fallbackV4);
  if (ready && nReady > readyV4) result.ipv6 = distinct(ready, readyV4, nReady);
  else if (fallback && nFallback > fallbackV4) result.ipv6 = distinct(fallback, fallbackV4, nFallback);
  // The rest the slices list: draining ones passed over for ready ones, not ready ones, other nodes' under Local.
  if (others || fallback) {
    const rest = [...(others ?? NONE), ...(fallback ?? NONE)];
    insertionSort(rest, compareEndpoints);
    const chosen = new Set<string>();
    for (const e of result.ipv4) chosen.add(`${e.address}|${e.port}`);
    for (const e of result.ipv6) chosen.add(`${e.address}|${e.port}`);
    const retained = distinct(rest, 0, rest.length).filter((e) => !chosen.has(`${e.address}|${e.port}`));
    const v4 = ipv4Run(retained);
    if (retained.length > 0) result.retained = { ipv4: v4 > 0 ? retained.slice(0, v4) : NONE, ipv6: retained.length > v4 ? retained.slice(v4) : NONE };
  }
  return result;
}

const RETAINED_NONE: PortEndpoints['retained'] = Object.freeze({ ipv4: NONE, ipv6: NONE }) as PortEndpoints['retained'];

/** How many of a sorted list are IPv4: they sort first. */
function ipv4Run(sorted: readonly Endpoint[]): number {
  let i = 0;
  while (i < sorted.length && !sorted[i]!.address.includes(':')) i++;
  return i;
}

/**
 * sorted[from, to) with each endpoint once. Sorted, so one endpoint listed
 * twice (two slices) is adjacent: merged, it is local when either listing
 * says so. The list itself when it is all of it and has no duplicate.
 */
function distinct(sorted: Endpoint[], from: number, to: number): Endpoint[] {
  let dup = false;
  for (let i = from + 1; i < to && !dup; i++) dup = sorted[i - 1]!.address === sorted[i]!.address && sorted[i - 1]!.port === sorted[i]!.port;
  if (!dup) return from === 0 && to === sorted.length ? sorted : sorted.slice(from, to);
  const list: Endpoint[] = [];
  for (let i = from; i < to; i++) {
    const endpoint = sorted[i]!;
    const prev = list[list.length - 1];
    if (prev && prev.address === endpoint.address && prev.port === endpoint.port) {
      if (endpoint.local && !prev.local) list[list.length - 1] = { ...prev, local: true };
    } else list.push(endpoint);
  }
  return list.slice();
}

/** Lists here are short (a Service's endpoints, a served port's frontends), where the built-in sort's setup costs more than the sorting. */
function insertionSort<T>(list: T[], compare: (a: T, b: T) => number): void {
  if (list.length > 32) {
    list.sort(compare);
    return;
  }
  for (let i = 1; i < list.length; i++) {
    const item = list[i]!;
    let j = i - 1;
    while (j >= 0 && compare(list[j]!, item) > 0) {
      list[j + 1] = list[j]!;
      j--;
    }
    list[j + 1] = item;
  }
}

/**
 * Orders the claims on one frontend, best first, and returns the winner: the
 * oldest Service, as the controller decides (then by name and served port key).
 */
export function rankClaims(list: Claim[]): Claim {
  if (list.length > 1) list.sort((a, b) => a.owner.created - b.owner.created || compareText(a.owner.id, b.owner.id) || compareText(a.served.key, b.served.key));
  return list[0]!;
}

/** The losers of a ranked list, as Problems. */
export function conflictProblems(ranked: readonly Claim[]): Problem[] {
  const out: Problem[] = [];
  const winner = ranked[0]!;
  for (let i = 1; i < ranked.length; i++) {
    const l = ranked[i]!;
    if (l.owner.id === winner.owner.id && l.served.key === winner.served.key) continue;
    out.push({
      service: l.owner.id,
      port: l.portLabel,
      reason: 'FrontendConflict',
      message: `Service ${l.owner.id} port ${l.portLabel}: ${l.frontend.address} ${l.served.protocol} ${l.frontend.port} is already served for ${winner.owner.id}; not served here`,
    });
  }
  return out;
}

export function dedupeProblems(problems: readonly Problem[]): Problem[] {
  if (problems.length === 0) return [];
  const byKey = new Map<string, Problem>();
  for (const p of problems) byKey.set(problemKey(p), p);
  return [...byKey.entries()].sort(([a], [b]) => compareText(a, b)).map(([, p]) => p);
}

/** The addresses the controller may advertise for this node: InternalIP and ExternalIP. */
export function nodeAddresses(node: V1Node): string[] {
  return (node.status?.addresses ?? [])
    .filter((a) => a.type === 'InternalIP' || a.type === 'ExternalIP')
    .map((a) => a.address);
}
