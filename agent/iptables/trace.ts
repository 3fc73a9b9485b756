// `pier trace`: what one new connection from a client to a frontend meets on
// a node. The decision walks the *rendered* ruleset (render.ts) with the rule
// interpreter (interp.ts), so it cannot disagree with the rules the agent
// installs; the model and the Service objects only explain what the rules
// leave unsaid (why there is no rule, which endpoint is on which node).
//
// The path is the kernel's for a new connection:
//   nat PREROUTING (OUTPUT for a client on the node) -> DNAT, maybe marked
//   filter FORWARD (INPUT when the endpoint is the node itself; OUTPUT, and
//   INPUT for a host endpoint, for a client on the node)
//   nat POSTROUTING -> MASQUERADE when marked
// and, without a DNAT, filter INPUT (OUTPUT) for the frontend itself.
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import type { Family } from '../../lib/contract.ts';
import { isProtocol, PROTOCOL } from '../../lib/protocols.ts';
import { branches, walk, type Hop, type Packet, type WalkResult } from './interp.ts';
import { isPierService, parseAddress, servicePortLabel, type Endpoint, type Model, type ModelConfig, type Problem, type Protocol, type ServedPort } from '../engine/model.ts';
import { Engine } from '../engine/engine.ts';
import { IptablesRenderer } from './renderer.ts';
import type { MarkBits, Ruleset, TableName } from './render.ts';
import { jumpTarget } from './restore.ts';

export class TraceUsageError extends Error {
  override name = 'TraceUsageError';
}

export interface TracePacket {
  client: string;
  address: string;
  port: number;
  protocol: Protocol;
  /** The client is a process on the node (its packets take nat OUTPUT); also assumed when `client` is a node address. */
  fromNode?: boolean;
}

/** Everything trace decides from: one node's rules and what they were made of. */
export interface TraceWorld {
  nodeName: string;
  nodeAddresses: string[];
  marks: MarkBits;
  config: ModelConfig;
  model: Model;
  rulesets: Record<Family, Ruleset>;
  /** Every Service, pier's or not: the reasons a frontend has no rule are in them. */
  services: V1Service[];
}

export interface TraceInput {
  nodeName: string;
  nodeAddresses: string[];
  services: V1Service[];
  slices: V1EndpointSlice[];
  config: ModelConfig;
  marks: MarkBits;
}

export function traceWorld(input: TraceInput): TraceWorld {
  // The agent's own engine, from an empty state.
  const model = new Engine({ nodeName: input.nodeName, model: input.config }).model(input);
  const render = (f: Family) => new IptablesRenderer(f, { marks: input.marks }).render(model[f]);
  return {
    nodeName: input.nodeName,
    nodeAddresses: input.nodeAddresses.map((a) => parseAddress(a)?.text ?? a),
    marks: input.marks,
    config: input.config,
    model,
    rulesets: { ipv4: render('ipv4'), ipv6: render('ipv6') },
    services: input.services,
  };
}

export interface TraceHop extends Hop {
  table: TableName;
}

export type Outcome = 'delivered' | 'rejected' | 'dropped' | 'unserved';

export interface EndpointTrace {
  address: string;
  port: number;
  /** The chance a new connection is DNATed here (the statistic rules' effective probability). */
  probability: number;
  /** Whether the endpoint is on this node (from the EndpointSlice), when the model knows it. */
  local?: boolean;
  outcome: 'delivered' | 'dropped' | 'rejected';
  /** The filter chain the DNATed connection crosses. */
  via: 'FORWARD' | 'INPUT' | 'OUTPUT';
  masqueraded: boolean;
  /** The source address the endpoint sees: the client's, or (masqueraded) one of this node's. */
  sourceSeen: { kind: 'client'; address: string } | { kind: 'node'; node: string };
  /** The rules met after the common ones (Verdict.hops): the DNAT, the filter and the masquerade. */
  hops: TraceHop[];
}

export interface Verdict {
  node: string;
  family: Family;
  client: string;
  frontend: string;
  fromNode: boolean;
  outcome: Outcome;
  /** One sentence: why. */
  reason: string;
  /** `namespace/name:port`, when a Service is involved. */
  service?: string;
  /** The rules every connection meets before the endpoints' paths part. */
  hops: TraceHop[];
  endpoints: EndpointTrace[];
  /** The agent's problems with the Service(s) that claim this frontend. */
  problems: Problem[];
  /** sessionAffinity ClientIP's timeout in seconds; the endpoints' chances are a new client's. */
  affinity?: number;
}

/** `<address>:<port>/<proto>`, IPv6 bracketed. */
export function parseFrontend(text: string): { address: string; port: number; protocol: Protocol } {
  const m = /^(?:\[([^\]]+)\]|([^:/[\]]+)):(\d+)(?:\/([A-Za-z]+))?$/.exec(text.trim());
  if (!m) throw new TraceUsageError(`frontend ${JSON.stringify(text)} is not <address>:<port>/<tcp|udp|sctp> (IPv6 in brackets: [2001:db8::1]:443/tcp)`);
  const addr = parseAddress(m[1] ?? m[2]);
  if (!addr) throw new TraceUsageError(`frontend ${JSON.stringify(text)}: ${m[1] ?? m[2]} is not an IP address`);
  if (m[1] !== undefined && addr.family !== 'ipv6') throw new TraceUsageError(`frontend ${JSON.stringify(text)}: only IPv6 addresses go in brackets`);
  const port = Number(m[3]);
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new TraceUsageError(`frontend ${JSON.stringify(text)}: port ${m[3]} is not in 1-65535`);
  const protocol = (m[4] ?? 'TCP').toUpperCase();
  if (!isProtocol(protocol)) throw new TraceUsageError(`frontend ${JSON.stringify(text)}: protocol ${m[4]} is not tcp, udp or sctp`);
  return { address: addr.text, port, protocol };
}

const bracket = (address: string, port: number) => (address.includes(':') ? `[${address}]:${port}` : `${address}:${port}`);

const BUILT_IN = new Set(['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING']);

/** A table's pier chains together with the built-in chains holding pier's jumps. */
function tableChains(ruleset: Ruleset, table: TableName): Map<string, string[]> {
  const t = ruleset.tables[table];
  const chains = new Map<string, string[]>(t.chains);
  for (const name of BUILT_IN) chains.set(name, []);
  for (const j of t.jumps) chains.get(j.chain)!.push(j.rule);
  return chains;
}

const hopsIn = (table: TableName, w: WalkResult): TraceHop[] => w.hops.map((h) => ({ table, ...h }));

/** `1.2.3.4:80` or `[2001:db8::1]:80`, as DNAT's --to-destination prints it. */
function parseDnat(to: string): { address: string; port: number } {
  const m = /^(?:\[(.+)\]|([^:]+)):(\d+)$/.exec(to);
  if (!m) throw new Error(`DNAT target ${to} not understood`);
  return { address: m[1] ?? m[2]!, port: Number(m[3]) };
}

/** Decides what a new connection from packet.client to the frontend meets on world's node. Pure. */
export function trace(world: TraceWorld, packet: TracePacket): Verdict {
  const client = parseAddress(packet.client);
  const dst = parseAddress(packet.address);
  if (!client) throw new TraceUsageError(`client ${JSON.stringify(packet.client)} is not an IP address`);
  if (!dst) throw new TraceUsageError(`frontend address ${JSON.stringify(packet.address)} is not an IP address`);
  if (client.family !== dst.family) throw new TraceUsageError(`client ${client.text} and frontend ${dst.text} are of different address families`);
  const family = dst.family;
  const onNode = (a: string) => world.nodeAddresses.includes(a);
  const fromNode = packet.fromNode === true || onNode(client.text);
  const ruleset = world.rulesets[family];
  const nat = tableChains(ruleset, 'nat');
  const filter = tableChains(ruleset, 'filter');
  const { word: proto, number: protoNumber } = PROTOCOL[packet.protocol];
  const pkt: Packet = { src: client.text, dst: dst.text, proto, dport: packet.port };
  const ct = (dnat: boolean) => ({ new: true, dnat, proto: protoNumber, origsrc: client.text, origdst: dst.text, origdport: packet.port });
  const served = world.model[family].ports.find((p) => p.protocol === packet.protocol && p.frontends.some((f) => f.address === dst.text && f.port === packet.port));
  const base = {
    node: world.nodeName,
    family,
    client: client.text,
    frontend: `${bracket(dst.text, packet.port)}/${packet.protocol}`,
    fromNode,
    ...(served ? { service: served.comment } : {}),
    ...(served && served.affinity > 0 ? { affinity: served.affinity } : {}),
    problems: relatedProblems(world, dst.text, packet.port, packet.protocol, served),
  };

  const natEntry = fromNode ? 'OUTPUT' : 'PREROUTING';
  const paths = branches(nat, natEntry, pkt);
  if (paths[0]!.verdict !== 'DNAT') {
    // Not DNATed: the frontend itself is the destination, through INPUT (or OUTPUT).
    const entry = fromNode ? 'OUTPUT' : onNode(dst.text) ? 'INPUT' : 'FORWARD';
    const f = walk(filter, entry, { ...pkt, ct: ct(false) });
    const hops = [...hopsIn('nat', paths[0]!), ...hopsIn('filter', f)];
    if (f.verdict === 'REJECT') {
      return { ...base, outcome: 'rejected', reason: `${served?.comment ?? 'the port'} has no usable endpoint: REJECT in ${whereIn(hopsIn('filter', f))} (the client sees "connection refused")`, hops, endpoints: [] };
    }
    if (f.verdict === 'DROP') return { ...base, outcome: 'dropped', reason: `dropped in ${whereIn(hopsIn('filter', f))}`, hops, endpoints: [] };
    return { ...base, outcome: 'unserved', reason: unservedReason(world, family, dst.text, packet.port, packet.protocol), hops, endpoints: [] };
  }

  const common = commonPrefix(paths.map((p) => p.hops));
  const along: SpreadContext = { nat, filter, pkt, ct, onNode, fromNode, common, served, nodeName: world.nodeName, client: client.text };
  const endpoints = paths.map((w) => endpointTrace(w, along));
  const hops = hopsIn('nat', paths[0]!).slice(0, common);
  const what = served?.comment ?? 'the frontend';
  const delivered = endpoints.filter((e) => e.outcome === 'delivered');
  if (delivered.length > 0) {
    const masq = delivered.every((e) => e.masqueraded) ? 'masqueraded: the endpoint sees an address of this node' : delivered.some((e) => e.masqueraded) ? 'masqueraded for some endpoints' : `not masqueraded: the endpoint sees the client ${client.text}`;
    return { ...base, outcome: 'delivered', reason: `${what}: DNAT to ${endpoints.length === 1 ? 'its endpoint' : `one of ${endpoints.length} endpoints`}, ${masq}`, hops, endpoints };
  }
  const dropped = endpoints[0]!.outcome;
  const ranged = served?.restrictSources ? `: ${client.text} is not in the Service's source ranges (${served.sourceRanges.join(', ') || `none of ${family}`})` : '';
  return { ...base, outcome: dropped === 'rejected' ? 'rejected' : 'dropped', reason: `${what}: ${dropped} in ${whereIn(endpoints[0]!.hops)}${ranged}`, hops, endpoints };
}

/** What every endpoint of one spread is traced against (trace). */
interface SpreadContext {
  nat: ReturnType<typeof tableChains>;
  filter: ReturnType<typeof tableChains>;
  pkt: Packet;
  /** The connection as conntrack knows it, DNATed or not. */
  ct: (dnat: boolean) => NonNullable<Packet['ct']>;
  onNode: (address: string) => boolean;
  fromNode: boolean;
  /** Hops all of the spread's paths share, reported once. */
  common: number;
  served: ServedPort | undefined;
  nodeName: string;
  client: string;
}

/** One path of a spread: the endpoint it DNATs to, then the filter chains and POSTROUTING the connection meets on its way there. */
function endpointTrace(w: WalkResult, c: SpreadContext): EndpointTrace {
  if (w.verdict !== 'DNAT') throw new Error(`a spread ends in ${w.verdict}, not DNAT`);
  const { nat, filter, onNode, fromNode, served } = c;
  const to = parseDnat(w.to!);
  const ep = { ...c.pkt, dst: to.address, dport: to.port, mark: w.mark, ctmark: w.ctmark, ct: c.ct(true) };
  const hostEndpoint = onNode(to.address);
  const chains: ('FORWARD' | 'INPUT' | 'OUTPUT')[] = fromNode ? (hostEndpoint ? ['OUTPUT', 'INPUT'] : ['OUTPUT']) : hostEndpoint ? ['INPUT'] : ['FORWARD'];
  const hops = hopsIn('nat', w).slice(c.common);
  let outcome: EndpointTrace['outcome'] = 'delivered';
  for (const chain of chains) {
    const f = walk(filter, chain, ep);
    hops.push(...hopsIn('filter', f));
    if (f.verdict === 'DROP' || f.verdict === 'REJECT') {
      outcome = f.verdict === 'DROP' ? 'dropped' : 'rejected';
      break;
    }
  }
  let masqueraded = false;
  if (outcome === 'delivered') {
    const post = walk(nat, 'POSTROUTING', ep);
    hops.push(...hopsIn('nat', post));
    masqueraded = post.verdict === 'MASQUERADE';
  }
  const known = served?.endpoints.find((e: Endpoint) => e.address === to.address && e.port === to.port);
  return {
    address: to.address,
    port: to.port,
    probability: w.chance,
    ...(known ? { local: known.local } : {}),
    outcome,
    via: chains[0]!,
    masqueraded,
    sourceSeen: masqueraded ? { kind: 'node', node: c.nodeName } : { kind: 'client', address: c.client },
    hops,
  };
}

/** The chain of the last filter rule met, and the pier chain the built-in chain jumped to when that is another. */
function whereIn(hops: readonly TraceHop[]): string {
  const filter = hops.filter((h) => h.table === 'filter');
  const last = filter.at(-1);
  if (!last) return 'filter';
  const jump = filter.filter((h) => BUILT_IN.has(h.chain)).at(-1);
  const root = jump && jumpTarget(jump.rule);
  return root && root !== last.chain ? `${last.chain} (from ${root})` : last.chain;
}

function commonPrefix(lists: readonly (readonly Hop[])[]): number {
  const first = lists[0]!;
  let n = 0;
  while (n < first.length && lists.every((l) => l[n] && l[n]!.chain === first[n]!.chain && l[n]!.rule === first[n]!.rule)) n++;
  return n;
}

/** A Service's status ports that name this frontend: (Service, port index, status entry). */
function claimsOf(world: TraceWorld, address: string, port: number, protocol: Protocol) {
  const out: { svc: V1Service; id: string; index: number; label: string; error?: string }[] = [];
  for (const svc of world.services) {
    const id = `${svc.metadata?.namespace ?? ''}/${svc.metadata?.name ?? ''}`;
    for (const ing of svc.status?.loadBalancer?.ingress ?? []) {
      if (parseAddress(ing?.ip)?.text !== address) continue;
      (ing.ports ?? []).forEach((st, index) => {
        const spec = svc.spec?.ports?.[index];
        if (st?.port !== port || (st.protocol ?? spec?.protocol ?? 'TCP') !== protocol) return;
        out.push({ svc, id, index, label: servicePortLabel(spec, index), ...(st.error ? { error: st.error } : {}) });
      });
    }
  }
  return out;
}

function relatedProblems(world: TraceWorld, address: string, port: number, protocol: Protocol, served: ServedPort | undefined): Problem[] {
  const ids = new Set(claimsOf(world, address, port, protocol).map((c) => c.id));
  if (served) ids.add(served.key.split('/').slice(1, 3).join('/'));
  return world.model.problems.filter((p) => ids.has(p.service));
}

/** Why pier has no rule for a frontend, from the objects it was rendered from. */
function unservedReason(world: TraceWorld, family: Family, address: string, port: number, protocol: Protocol): string {
  const claims = claimsOf(world, address, port, protocol);
  const reasons: string[] = [];
  for (const c of claims) {
    const where = `Service ${c.id} port ${c.label}`;
    if (!isPierService(c.svc, world.config)) {
      const cls = c.svc.spec?.loadBalancerClass;
      if (c.svc.spec?.type !== 'LoadBalancer') reasons.push(`${where} is of type ${c.svc.spec?.type ?? 'ClusterIP'}, not LoadBalancer`);
      else if (cls) reasons.push(`${where} has loadBalancerClass ${JSON.stringify(cls)}, not pier's (${world.config.loadBalancerClass}): another implementation serves it`);
      else reasons.push(`${where} names no loadBalancerClass, and pier serves those only with --default-class`);
    } else if (c.error !== undefined) {
      reasons.push(`${where} has the error ${JSON.stringify(c.error)} in its status for ${address}: the controller could not serve it here`);
    } else {
      const problems = world.model.problems.filter((p) => p.service === c.id && (p.port === undefined || p.port === c.label));
      for (const p of problems) reasons.push(`${p.reason}: ${p.message}`);
    }
  }
  if (reasons.length > 0) return `pier has no rule for this: ${reasons.join('; ')}; the packet goes to the host`;
  if (!world.nodeAddresses.includes(address)) {
    const mine = world.nodeAddresses.filter((a) => (parseAddress(a)?.family ?? family) === family);
    return `pier has no rule for this: ${address} is not an address of node ${world.nodeName} (${mine.join(', ') || `no ${family} address`})`;
  }
  return 'pier has no rule for this; the packet goes to the host';
}

// ---------------------------------------------------------------------------
// Text

export function verdictText(v: Verdict): string {
  const lines: string[] = [];
  const hop = (h: TraceHop, indent: string) => `${indent}${h.table} ${h.chain}: ${h.rule}`;
  lines.push(`${v.client} -> ${v.frontend} on node ${v.node}${v.fromNode ? ' (a client on the node: nat OUTPUT)' : ''}`);
  for (const h of v.hops) lines.push(hop(h, '  '));
  // The rules after the DNAT are usually the same for every endpoint: printed once then.
  const after = (e: EndpointTrace) => e.hops.slice(e.hops.findIndex((h) => / -j DNAT /.test(h.rule)) + 1);
  const key = (e: EndpointTrace) => JSON.stringify([after(e), e.outcome, e.masqueraded]);
  const shared = v.endpoints.length > 0 && v.endpoints.every((e) => key(e) === key(v.endpoints[0]!));
  const seen = (e: EndpointTrace) =>
    e.outcome !== 'delivered' ? `${e.outcome} via ${e.via}` : `delivered via ${e.via}, ${e.sourceSeen.kind === 'client' ? `source kept: the endpoint sees ${e.sourceSeen.address}` : `masqueraded: the endpoint sees an address of ${e.sourceSeen.node}`}`;
  if (v.endpoints.length > 0) lines.push(`  DNAT to ${v.endpoints.length === 1 ? 'its endpoint' : `one of ${v.endpoints.length} endpoints`}:`);
  if (v.affinity !== undefined && v.endpoints.length > 0) {
    lines.push(`  session affinity ClientIP: a client seen within ${v.affinity} s goes back to the endpoint it used last; the chances are a new client's`);
  }
  for (const e of v.endpoints) {
    const where = e.local === undefined ? '' : e.local ? ', on this node' : ', on another node';
    lines.push(`    ${(e.probability * 100).toFixed(1).padStart(5)}%  ${bracket(e.address, e.port)}${where}${shared ? '' : `: ${seen(e)}`}`);
    const dnat = e.hops.slice(0, e.hops.length - after(e).length);
    for (const h of dnat) lines.push(hop(h, '            '));
    if (!shared) for (const h of after(e)) lines.push(hop(h, '            '));
  }
  if (shared) {
    const e = v.endpoints[0]!;
    lines.push(`  then, whichever endpoint: ${seen(e)}`);
    for (const h of after(e)) lines.push(hop(h, '    '));
  }
  for (const p of v.problems) lines.push(`  note: ${p.service}${p.port ? ` port ${p.port}` : ''}: ${p.reason}: ${p.message}`);
  lines.push(`${v.outcome}: ${v.reason}`);
  return `${lines.join('\n')}\n`;
}
