// From Kubernetes objects to the plain data the agent programs: for each
// address family, the service ports this node serves, with their frontends
// (node address and external port), endpoints and allowed sources.
//
// Everything here is pure and total: a malformed object costs at most its own
// Service (or one port, or one endpoint) and becomes a Problem, never an
// exception, so one bad manifest cannot stop a node from serving the rest.
// Addresses leave this module in the canonical text iptables-save prints, so
// the renderer can compare its output with the kernel's by string equality.
import type { V1EndpointSlice, V1Service, V1ServicePort } from '@kubernetes/client-node';
import { IPv4, IPv6, Validator } from 'ip-num';

import { FAMILIES, SOURCE_RANGES_ANNOTATION, type Family } from '../lib/contract.ts';

export type { Family };
export type Protocol = 'TCP' | 'UDP' | 'SCTP';

export const PROTOCOLS: readonly Protocol[] = ['TCP', 'UDP', 'SCTP'];

export interface Frontend {
  address: string;
  port: number;
}

export interface Endpoint {
  address: string;
  port: number;
  local: boolean;
}

export interface ServicePortPlan {
  /** Stable unique id, `<family>/<ns>/<name>/<port name or index>/<protocol>`; chain names are hashed from it. */
  key: string;
  /** `ns/name:port`, sanitised for an iptables comment. */
  comment: string;
  protocol: Protocol;
  frontends: Frontend[];
  endpoints: Endpoint[];
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
}

export interface FamilyModel {
  family: Family;
  ports: ServicePortPlan[];
}

export interface Problem {
  /** `namespace/name` */
  service: string;
  /** The Service port's name, or its index when unnamed. */
  port?: string;
  /** CamelCase, usable as an Event reason. */
  reason: string;
  message: string;
}

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

export const SERVICE_NAME_LABEL = 'kubernetes.io/service-name';

// ---------------------------------------------------------------------------
// Addresses

export interface ParsedAddress {
  family: Family;
  value: bigint;
  /** As inet_ntop prints it, which is what iptables-save shows. */
  text: string;
}

export interface ParsedCidr {
  family: Family;
  /** Network address (host bits zeroed). */
  value: bigint;
  prefix: number;
  /** `network/prefix`, canonical. */
  text: string;
}

const BITS: Record<Family, number> = { ipv4: 32, ipv6: 128 };

export function parseAddress(text: unknown): ParsedAddress | undefined {
  if (typeof text !== 'string' || text.length === 0 || text.length > 64) return undefined;
  try {
    if (text.includes(':')) {
      // ip-num accepts zone ids; a scoped address is never a service address.
      if (text.includes('%') || !Validator.isValidIPv6String(text)[0]) return undefined;
      const value = IPv6.fromString(text).getValue();
      return { family: 'ipv6', value, text: formatAddress('ipv6', value) };
    }
    if (!Validator.isValidIPv4String(text)[0]) return undefined;
    const value = IPv4.fromString(text).getValue();
    return { family: 'ipv4', value, text: formatAddress('ipv4', value) };
  } catch {
    return undefined;
  }
}

/** Accepts `addr/prefix` or a bare address (a host route); host bits are zeroed. */
export function parseCidr(text: unknown): ParsedCidr | undefined {
  if (typeof text !== 'string') return undefined;
  const slash = text.indexOf('/');
  const addr = parseAddress(slash < 0 ? text : text.slice(0, slash));
  if (!addr) return undefined;
  const bits = BITS[addr.family];
  let prefix = bits;
  if (slash >= 0) {
    const p = text.slice(slash + 1);
    if (!/^\d{1,3}$/.test(p)) return undefined;
    prefix = Number(p);
    if (prefix > bits) return undefined;
  }
  const hostBits = BigInt(bits - prefix);
  const value = (addr.value >> hostBits) << hostBits;
  return { family: addr.family, value, prefix, text: `${formatAddress(addr.family, value)}/${prefix}` };
}

/** inet_ntop's output: glibc compresses the first longest run of two or more zero groups and prints v4-mapped/compatible tails dotted. */
export function formatAddress(family: Family, value: bigint): string {
  if (family === 'ipv4') {
    const n = Number(value);
    return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
  }
  const words: number[] = [];
  for (let i = 7; i >= 0; i--) words.push(Number((value >> BigInt(i * 16)) & 0xffffn));
  let bestBase = -1;
  let bestLen = 0;
  let curBase = -1;
  let curLen = 0;
  for (let i = 0; i < 8; i++) {
    if (words[i] === 0) {
      if (curBase < 0) {
        curBase = i;
        curLen = 1;
      } else curLen++;
      if (curLen > bestLen) {
        bestBase = curBase;
        bestLen = curLen;
      }
    } else curBase = -1;
  }
  if (bestLen < 2) bestBase = -1;
  let out = '';
  for (let i = 0; i < 8; i++) {
    if (bestBase >= 0 && i >= bestBase && i < bestBase + bestLen) {
      if (i === bestBase) out += ':';
      continue;
    }
    if (i !== 0) out += ':';
    if (i === 6 && bestBase === 0 && (bestLen === 6 || (bestLen === 5 && words[5] === 0xffff))) {
      const low = Number(value & 0xffffffffn);
      out += formatAddress('ipv4', BigInt(low));
      break;
    }
    out += words[i]!.toString(16);
  }
  if (bestBase >= 0 && bestBase + bestLen === 8) out += ':';
  return out;
}

/** Numeric order within a family, IPv4 before IPv6; unparseable text last, by text. */
export function compareAddresses(a: string, b: string): number {
  const pa = parseAddressCached(a);
  const pb = parseAddressCached(b);
  if (pa && pb) {
    if (pa.family !== pb.family) return pa.family === 'ipv4' ? -1 : 1;
    return pa.value < pb.value ? -1 : pa.value > pb.value ? 1 : 0;
  }
  if (pa) return -1;
  if (pb) return 1;
  return compareText(a, b);
}

const addressCache = new Map<string, ParsedAddress | undefined>();
function parseAddressCached(text: unknown): ParsedAddress | undefined {
  if (typeof text !== 'string') return undefined;
  if (addressCache.has(text)) return addressCache.get(text);
  const parsed = parseAddress(text);
  if (addressCache.size > 100_000) addressCache.clear();
  addressCache.set(text, parsed);
  return parsed;
}

export function compareText(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

// ---------------------------------------------------------------------------
// Comments

/** iptables' comment match holds 255 characters. */
export const MAX_COMMENT = 255;

export function sanitizeComment(text: string): string {
  return text.replace(/[^A-Za-z0-9._:/-]/g, '_').slice(0, MAX_COMMENT);
}

// ---------------------------------------------------------------------------
// The model

interface ServiceIdentity {
  id: string;
  created: number;
}

interface Claim {
  plan: ServicePortPlan;
  owner: ServiceIdentity;
  portLabel: string;
  frontend: Frontend;
}

export function isPierService(svc: V1Service, config: ModelConfig): boolean {
  if (svc?.spec?.type !== 'LoadBalancer') return false;
  const cls = svc.spec.loadBalancerClass;
  if (cls === undefined || cls === null || cls === '') return config.defaultClass;
  return cls === config.loadBalancerClass;
}

export function buildModel(input: ModelInput): Model {
  const problems: Problem[] = [];
  const nodeAddresses = new Set<string>();
  for (const a of input.nodeAddresses ?? []) {
    const p = parseAddress(a);
    if (p) nodeAddresses.add(p.text);
  }

  const slicesByService = new Map<string, V1EndpointSlice[]>();
  for (const slice of input.slices ?? []) {
    const svcName = slice?.metadata?.labels?.[SERVICE_NAME_LABEL];
    if (!svcName) continue;
    const id = `${slice.metadata?.namespace ?? ''}/${svcName}`;
    let list = slicesByService.get(id);
    if (!list) slicesByService.set(id, (list = []));
    list.push(slice);
  }

  const plans: ServicePortPlan[] = [];
  const claims: Claim[] = [];
  // Sorted so that nothing depends on the order objects arrive in, not even
  // which of two objects with one name wins.
  const services = (input.services ?? [])
    .filter((s) => s && safely(() => isPierService(s, input.config), false))
    .map((svc) => ({ svc, sortKey: serviceSortKey(svc) }))
    .sort((a, b) => compareText(a.sortKey, b.sortKey))
    .map((s) => s.svc);
  for (const svc of services) {
    const owner: ServiceIdentity = safely(
      () => ({ id: `${svc.metadata?.namespace ?? ''}/${svc.metadata?.name ?? ''}`, created: timestamp(svc.metadata?.creationTimestamp) }),
      { id: '/', created: Number.POSITIVE_INFINITY },
    );
    // Collected apart and kept only when the whole Service was read: a
    // Service is served completely or not at all.
    const mine = { plans: [] as ServicePortPlan[], claims: [] as Claim[], problems: [] as Problem[] };
    try {
      serviceModel(svc, owner, input, nodeAddresses, slicesByService.get(owner.id) ?? [], mine.plans, mine.claims, mine.problems);
      plans.push(...mine.plans);
      claims.push(...mine.claims);
      problems.push(...mine.problems);
    } catch (err) {
      // A shape no check above anticipated (a hand-written object with
      // wrong types): this Service is skipped, the others are not.
      problems.push({ service: owner.id, reason: 'InvalidService', message: `cannot read Service ${owner.id}: ${(err as Error).message}` });
    }
  }

  resolveConflicts(claims, problems);

  const byFamily: Record<Family, ServicePortPlan[]> = { ipv4: [], ipv6: [] };
  const seen = new Set<string>();
  for (const plan of plans.sort((a, b) => compareText(a.key, b.key))) {
    if (plan.frontends.length === 0 || seen.has(plan.key)) continue;
    seen.add(plan.key);
    plan.frontends.sort((a, b) => compareAddresses(a.address, b.address) || a.port - b.port);
    byFamily[plan.key.startsWith('ipv4/') ? 'ipv4' : 'ipv6'].push(plan);
  }

  return {
    ipv4: { family: 'ipv4', ports: byFamily.ipv4 },
    ipv6: { family: 'ipv6', ports: byFamily.ipv6 },
    problems: dedupeProblems(problems),
  };
}

function serviceModel(
  svc: V1Service,
  owner: ServiceIdentity,
  input: ModelInput,
  nodeAddresses: Set<string>,
  slices: V1EndpointSlice[],
  plans: ServicePortPlan[],
  claims: Claim[],
  problems: Problem[],
): void {
  const service = owner.id;
  // Only Services advertised on this node concern this agent; reporting the
  // others would make every node raise the same Event.
  const ingresses = (svc.status?.loadBalancer?.ingress ?? []).filter((ing) => {
    const ip = parseAddressCached(ing?.ip);
    return ip !== undefined && nodeAddresses.has(ip.text);
  });
  if (ingresses.length === 0) return;

  const specPorts: V1ServicePort[] = svc.spec?.ports ?? [];
  const max = input.config.maxPortsPerService;
  if (specPorts.length > max) {
    problems.push({ service, reason: 'TooManyPorts', message: `Service ${service} has ${specPorts.length} ports, more than the ${max} this agent serves per Service; none is served` });
    return;
  }

  const ranges = sourceRanges(svc);
  if ('bad' in ranges) {
    problems.push({
      service,
      reason: 'InvalidSourceRange',
      message: `Service ${service}: source range ${JSON.stringify(ranges.bad)} is not a CIDR or an address; the Service is not served rather than served to everyone`,
    });
    return;
  }

  const local = svc.spec?.externalTrafficPolicy === 'Local';
  const keys = new Set<string>();
  specPorts.forEach((sp, index) => {
    const portName = typeof sp?.name === 'string' ? sp.name : '';
    const portLabel = portName || String(index);
    const protocol = sp?.protocol ?? 'TCP';
    if (!(PROTOCOLS as readonly string[]).includes(protocol)) {
      problems.push({ service, port: portLabel, reason: 'UnsupportedProtocol', message: `Service ${service} port ${portLabel}: protocol ${JSON.stringify(protocol)} is not TCP, UDP or SCTP; the port is not served` });
      return;
    }
    const proto = protocol as Protocol;
    const id = `${portLabel}/${proto}`;
    if (keys.has(id)) {
      problems.push({ service, port: portLabel, reason: 'DuplicatePort', message: `Service ${service}: port ${portLabel}/${proto} appears twice; only the first is served` });
      return;
    }
    keys.add(id);

    const frontends: Record<Family, Frontend[]> = { ipv4: [], ipv6: [] };
    const seenFrontends = new Set<string>();
    for (const ing of ingresses) {
      const ip = parseAddressCached(ing.ip)!;
      const st = ing.ports?.[index];
      if (!st) {
        problems.push({ service, port: portLabel, reason: 'StatusPortMissing', message: `Service ${service} port ${portLabel}: status for ${ip.text} has no entry ${index}; the port is not served there` });
        continue;
      }
      if (st.error) continue;
      if (!Number.isInteger(st.port) || st.port < 1 || st.port > 65535) {
        problems.push({ service, port: portLabel, reason: 'StatusPortInvalid', message: `Service ${service} port ${portLabel}: status port ${JSON.stringify(st.port)} for ${ip.text} is not in 1-65535` });
        continue;
      }
      if (st.protocol !== undefined && st.protocol !== proto) {
        problems.push({ service, port: portLabel, reason: 'StatusPortMismatch', message: `Service ${service} port ${portLabel}: status protocol ${JSON.stringify(st.protocol)} for ${ip.text} does not match ${proto}` });
        continue;
      }
      const fk = `${ip.text}|${st.port}`;
      if (seenFrontends.has(fk)) continue;
      seenFrontends.add(fk);
      frontends[ip.family].push({ address: ip.text, port: st.port });
    }
    if (frontends.ipv4.length === 0 && frontends.ipv6.length === 0) return;

    const endpoints = portEndpoints(service, portLabel, portName, proto, local, input.nodeName, slices, problems);
    for (const family of FAMILIES) {
      if (frontends[family].length === 0) continue;
      const plan: ServicePortPlan = {
        key: `${family}/${service}/${portLabel}/${proto}`,
        comment: sanitizeComment(`${service}:${portName || (Number.isInteger(sp.port) ? sp.port : index)}`),
        protocol: proto,
        frontends: [],
        endpoints: endpoints[family],
        sourceRanges: ranges[family],
        restrictSources: ranges.restrict && !ranges.open[family],
        masquerade: !local,
      };
      if (!plan.restrictSources) plan.sourceRanges = [];
      plans.push(plan);
      for (const frontend of frontends[family]) claims.push({ plan, owner, portLabel, frontend });
    }
  });
}

type Ranges = Record<Family, string[]> & { restrict: boolean; open: Record<Family, boolean> };

function sourceRanges(svc: V1Service): Ranges | { bad: string } {
  let raw: unknown[] = Array.isArray(svc.spec?.loadBalancerSourceRanges) ? svc.spec.loadBalancerSourceRanges : [];
  if (raw.length === 0) {
    const ann = svc.metadata?.annotations?.[SOURCE_RANGES_ANNOTATION];
    raw = typeof ann === 'string' ? ann.split(',') : [];
  }
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

function portEndpoints(
  service: string,
  portLabel: string,
  portName: string,
  protocol: Protocol,
  local: boolean,
  nodeName: string,
  slices: V1EndpointSlice[],
  problems: Problem[],
): Record<Family, Endpoint[]> {
  const ready: Record<Family, Endpoint[]> = { ipv4: [], ipv6: [] };
  const fallback: Record<Family, Endpoint[]> = { ipv4: [], ipv6: [] };
  for (const slice of slices) {
    if (slice.addressType !== 'IPv4' && slice.addressType !== 'IPv6') continue;
    const sp = (slice.ports ?? []).find((p) => (p?.name ?? '') === portName && (p?.protocol ?? 'TCP') === protocol);
    // No port means "unrestricted" in the API; there is nothing to DNAT to.
    if (!sp || sp.port === undefined || sp.port === null) continue;
    if (!Number.isInteger(sp.port) || sp.port < 1 || sp.port > 65535) {
      problems.push({ service, port: portLabel, reason: 'InvalidEndpointPort', message: `Service ${service} port ${portLabel}: EndpointSlice ${slice.metadata?.name ?? ''} has port ${JSON.stringify(sp.port)}, not in 1-65535; its endpoints are skipped` });
      continue;
    }
    for (const ep of slice.endpoints ?? []) {
      const rawAddress = ep?.addresses?.[0];
      const addr = parseAddressCached(rawAddress);
      if (!addr) {
        problems.push({ service, port: portLabel, reason: 'InvalidEndpointAddress', message: `Service ${service} port ${portLabel}: endpoint address ${JSON.stringify(rawAddress)} in EndpointSlice ${slice.metadata?.name ?? ''} is not an IP address; it is skipped` });
        continue;
      }
      const isLocal = ep.nodeName === nodeName;
      if (local && !isLocal) continue;
      const endpoint: Endpoint = { address: addr.text, port: sp.port, local: isLocal };
      const c = ep.conditions;
      if (c?.ready !== false) ready[addr.family].push(endpoint);
      else if (c.serving === true && c.terminating === true) fallback[addr.family].push(endpoint);
    }
  }
  const out: Record<Family, Endpoint[]> = { ipv4: [], ipv6: [] };
  for (const family of FAMILIES) {
    // Terminating-but-serving endpoints only when nothing is ready: better a
    // draining pod than a refused connection.
    const chosen = ready[family].length > 0 ? ready[family] : fallback[family];
    const byKey = new Map<string, Endpoint>();
    for (const e of chosen) {
      const k = `${e.address}|${e.port}`;
      const prev = byKey.get(k);
      byKey.set(k, prev ? { ...prev, local: prev.local || e.local } : e);
    }
    out[family] = [...byKey.values()].sort((a, b) => compareAddresses(a.address, b.address) || a.port - b.port);
  }
  return out;
}

/** An address, protocol and port is served by one Service port: the oldest, as the controller decides. */
function resolveConflicts(claims: Claim[], problems: Problem[]): void {
  const byFrontend = new Map<string, Claim[]>();
  for (const c of claims) {
    const k = `${c.frontend.address}|${c.plan.protocol}|${c.frontend.port}`;
    let list = byFrontend.get(k);
    if (!list) byFrontend.set(k, (list = []));
    list.push(c);
  }
  for (const list of byFrontend.values()) {
    list.sort((a, b) => a.owner.created - b.owner.created || compareText(a.owner.id, b.owner.id) || compareText(a.plan.key, b.plan.key));
    const [winner, ...losers] = list;
    winner!.plan.frontends.push(winner!.frontend);
    for (const l of losers) {
      if (l.owner.id === winner!.owner.id && l.plan.key === winner!.plan.key) continue;
      problems.push({
        service: l.owner.id,
        port: l.portLabel,
        reason: 'FrontendConflict',
        message: `Service ${l.owner.id} port ${l.portLabel}: ${l.frontend.address} ${l.plan.protocol} ${l.frontend.port} is already served for ${winner!.owner.id}; not served here`,
      });
    }
  }
}

function serviceSortKey(svc: V1Service): string {
  return safely(() => {
    const m = svc.metadata;
    return [m?.namespace ?? '', m?.name ?? '', m?.uid ?? '', m?.resourceVersion ?? '', safely(() => JSON.stringify(svc), '')].join('\0');
  }, '');
}

function safely<T>(read: () => T, fallback: T): T {
  try {
    return read();
  } catch {
    return fallback;
  }
}

function timestamp(t: unknown): number {
  if (t === undefined || t === null) return Number.POSITIVE_INFINITY;
  const ms = new Date(t as string | Date).getTime();
  return Number.isNaN(ms) ? Number.POSITIVE_INFINITY : ms;
}

function dedupeProblems(problems: Problem[]): Problem[] {
  const byKey = new Map<string, Problem>();
  for (const p of problems) byKey.set(`${p.service}\0${p.port ?? ''}\0${p.reason}\0${p.message}`, p);
  return [...byKey.entries()].sort(([a], [b]) => compareText(a, b)).map(([, p]) => p);
}
