// Conntrack clean-up. Every packet of a flow follows its conntrack entry,
// not the rules, so entries can outlive what the rules now say:
//  - UDP and SCTP: a flow keeps its entry for as long as the client keeps
//    sending. One begun before its frontend's DNAT existed stays un-NATed,
//    one DNATed to an endpoint the rules dropped keeps going there. After a
//    sync that changed what a frontend DNATs to, its entries that do not
//    lead to a current endpoint are deleted; the next packet meets the rules.
//  - TCP: a connection stays with its endpoint while the slices list it
//    (ready, draining, not ready): it is the pod's to end. But once the
//    endpoint has left the slices its pod is gone, and an entry still open
//    to it (unanswered SYN, established, closing) captures the next
//    connection that reuses the client's source port: conntrack takes that
//    SYN for part of the old flow and sends it to the gone address, where
//    it is never answered. On real nodes: one connection in ~2,000 timed
//    out a minute after a rolling restart. So after a sync in which an
//    endpoint left a TCP frontend's slices, that frontend's entries DNATed
//    to an endpoint no longer listed are deleted.
// Entries that lead to a current (or, TCP, listed) endpoint are never
// touched, so a restart that changes nothing deletes nothing (a table-wide
// flush breaks healthy flows, QUIC's first: kubernetes #122740).
//
// The decisions are pure functions of plain data (frontends, parsed
// entries); the Conntrack class is the adapter that runs `conntrack`.
import type { Family } from '../lib/contract.ts';
import { addressInfo } from '../lib/address.ts';
import type { Endpoint, FamilyModel, ServedPort } from './engine/model.ts';
import { PROTOCOL, protocolOfWord, type Protocol } from '../lib/protocols.ts';
import type { Runner } from '../lib/run.ts';

/** One frontend as conntrack sees it, and the endpoints whose flows stay. */
export interface FlowFrontend {
  protocol: Protocol;
  address: string;
  port: number;
  /** `address|port` of each endpoint the rules DNAT to, sorted; empty when they reject. */
  endpoints: string[];
  /** TCP: `address|port` of the other endpoints the slices list, sorted; empty for UDP and SCTP. */
  retained: string[];
}

/** UDP and SCTP frontends by `protocol address port`. */
export type FlowFrontends = Map<string, FlowFrontend>;

/** A conntrack entry, as far as the clean-up needs it. */
export interface FlowEntry {
  protocol: Protocol;
  origSrc: string;
  origDst: string;
  origSport: number;
  origDport: number;
  /** Where replies come from: the endpoint it was DNATed to, or origDst when it was not. */
  replySrc: string;
  replySport: number;
}

/** One deletion: every entry of a frontend whose replies come from one source. */
export interface FlowDeletion {
  protocol: Protocol;
  address: string;
  port: number;
  replySrc: string;
  replySport: number;
  /** The entries it deletes, as listed. */
  entries: number;
}

const frontendKey = (protocol: string, address: string, port: number) => `${protocol} ${address} ${port}`;
const endpointKey = (address: string, port: number) => `${address}|${port}`;
const keys = (endpoints: readonly Endpoint[]) => endpoints.map((e) => endpointKey(e.address, e.port)).sort();
const NONE: string[] = [];

/**
 * What the clean-up compares from sync to sync: the UDP and SCTP frontends,
 * and the TCP served ports by key. Those are the model's own objects, so
 * keeping them costs a map entry each: a frontend object per TCP port cost
 * the agent 13 MB at 10,000 Services (`npm run bench:agent-rss`).
 */
export interface FlowBaseline {
  flows: FlowFrontends;
  tcp: Map<string, ServedPort>;
}

// The engine hands back the very FamilyModel of a family nothing changed in
// (a resync, a change in the other family only), so its baseline is made
// once: ~7 ms per family per sync at 10,000 TCP ports.
const baselines = new WeakMap<FamilyModel, FlowBaseline>();

/** One family's model as the clean-up's baseline. Pure (memoised by model). */
export function flowBaseline(model: FamilyModel): FlowBaseline {
  const cached = baselines.get(model);
  if (cached) return cached;
  const baseline = readBaseline(model);
  baselines.set(model, baseline);
  return baseline;
}

function readBaseline(model: FamilyModel): FlowBaseline {
  const flows: FlowFrontends = new Map();
  const tcp = new Map<string, ServedPort>();
  for (const served of model.ports) {
    if (served.protocol === 'TCP') tcp.set(served.key, served);
    else for (const f of frontendsOf(served)) flows.set(frontendKey(f.protocol, f.address, f.port), f);
  }
  return { flows, tcp };
}

// Plans of unchanged Services are the same objects from sync to sync
// (engine.ts), so their UDP and SCTP frontends are computed once.
const servedFlows = new WeakMap<ServedPort, FlowFrontend[]>();

/** A served port's frontends, with the endpoints its flows may keep; TCP ones, wanted only when checked, are not kept. */
function frontendsOf(served: ServedPort): FlowFrontend[] {
  const cached = servedFlows.get(served);
  if (cached) return cached;
  const protocol = served.protocol;
  const endpoints = keys(served.endpoints);
  const retained = protocol === 'TCP' && served.retained.length > 0 ? keys(served.retained) : NONE;
  const flows = served.frontends.map((f) => ({ protocol, address: f.address, port: f.port, endpoints, retained }));
  if (protocol !== 'TCP') servedFlows.set(served, flows);
  return flows;
}

/**
 * The frontends whose flows must be checked after moving from `before` to
 * `after`. UDP and SCTP: new ones, ones whose endpoints changed, and gone
 * ones (with no endpoints: nothing of theirs is current). TCP: those of a
 * port an endpoint left the slices of; a gone TCP port's connections are
 * left alone (its Service or address may have moved, its pods not). With no
 * `before` (the agent just started and does not know what the kernel's
 * rules did) every frontend is checked. Pure.
 */
export function frontendsToCheck(before: FlowBaseline | undefined, after: FlowBaseline): FlowFrontend[] {
  if (before === after) return [];
  if (!before) return [...after.flows.values(), ...[...after.tcp.values()].flatMap(frontendsOf)];
  const out: FlowFrontend[] = [];
  for (const [key, f] of after.flows) {
    const old = before.flows.get(key);
    if (!old || !sameEndpoints(old.endpoints, f.endpoints)) out.push(f);
  }
  for (const [key, f] of before.flows) if (!after.flows.has(key)) out.push({ ...f, endpoints: [] });
  for (const [key, served] of after.tcp) {
    const old = before.tcp.get(key);
    if (old && old !== served && listedLost(old, served)) out.push(...frontendsOf(served));
  }
  return out;
}

function sameEndpoints(a: string[], b: string[]): boolean {
  return a === b || (a.length === b.length && a.every((e, i) => e === b[i]));
}

/** Whether an endpoint `old` listed (in its rules or retained) is listed by `now` no more. */
function listedLost(old: ServedPort, now: ServedPort): boolean {
  if (old.endpoints === now.endpoints && old.retained === now.retained) return false;
  const listed = new Set(keys(now.endpoints).concat(keys(now.retained)));
  return old.endpoints.some((e) => !listed.has(endpointKey(e.address, e.port))) || old.retained.some((e) => !listed.has(endpointKey(e.address, e.port)));
}

/**
 * The deletions that leave each checked frontend with only entries that
 * lead to one of its current endpoints (TCP: one its slices list, or none:
 * an un-NATed TCP flow is the node's own), grouped so that one `conntrack
 * -D` takes every client of a stale reply source at once. Pure.
 */
export function staleFlows(entries: readonly FlowEntry[], checks: readonly FlowFrontend[]): FlowDeletion[] {
  const byFrontend = new Map<string, Set<string>>();
  for (const c of checks) byFrontend.set(frontendKey(c.protocol, c.address, c.port), new Set([...c.endpoints, ...c.retained]));
  const out = new Map<string, FlowDeletion>();
  for (const e of entries) {
    const kept = byFrontend.get(frontendKey(e.protocol, e.origDst, e.origDport));
    if (!kept || kept.has(endpointKey(e.replySrc, e.replySport))) continue;
    if (e.protocol === 'TCP' && e.replySrc === e.origDst && e.replySport === e.origDport) continue;
    const key = `${frontendKey(e.protocol, e.origDst, e.origDport)} ${e.replySrc} ${e.replySport}`;
    const d = out.get(key);
    if (d) d.entries++;
    else out.set(key, { protocol: e.protocol, address: e.origDst, port: e.origDport, replySrc: e.replySrc, replySport: e.replySport, entries: 1 });
  }
  return [...out.values()];
}

/**
 * Parses `conntrack -L` output (one entry per line: the original tuple's
 * src=, dst=, sport=, dport=, then the reply tuple's). Lines that do not
 * parse are skipped. Pure.
 */
export function parseFlows(text: string): FlowEntry[] {
  const out: FlowEntry[] = [];
  for (const line of text.split('\n')) {
    const words = line.trim().split(/\s+/);
    const protocol = protocolOfWord(words[0]);
    if (!protocol) continue;
    const seen: Record<string, string[]> = {};
    for (const w of words) {
      const eq = w.indexOf('=');
      if (eq > 0) (seen[w.slice(0, eq)] ??= []).push(w.slice(eq + 1));
    }
    const origSrc = addressInfo(seen['src']?.[0])?.text;
    const origDst = addressInfo(seen['dst']?.[0])?.text;
    const replySrc = addressInfo(seen['src']?.[1])?.text;
    const origSport = Number(seen['sport']?.[0]);
    const origDport = Number(seen['dport']?.[0]);
    const replySport = Number(seen['sport']?.[1]);
    if (!origSrc || !origDst || !replySrc || !Number.isInteger(origSport) || !Number.isInteger(origDport) || !Number.isInteger(replySport)) continue;
    out.push({ protocol, origSrc, origDst, origSport, origDport, replySrc, replySport });
  }
  return out;
}

/** The conntrack arguments that delete one FlowDeletion's entries. */
export function deletionArgs(family: Family, d: FlowDeletion): string[] {
  return [
    '-D', '-f', family, '-p', PROTOCOL[d.protocol].word,
    '--orig-dst', d.address, '--orig-port-dst', String(d.port),
    '--reply-src', d.replySrc, '--reply-port-src', String(d.replySport),
  ];
}

/**
 * What a check means, for dry runs and `pier plan`: the deletion the agent
 * makes after the rules are in place, as a comment iptables-restore ignores.
 */
export function describeCheck(f: FlowFrontend): string {
  const listed = [...f.endpoints, ...f.retained].map((e) => bracket(e)).join(', ');
  const kept =
    f.protocol === 'TCP'
      ? `those DNATed to an endpoint its slices no longer list${listed ? ` (kept: those to ${listed})` : ''}`
      : f.endpoints.length === 0
        ? 'every one of them (the frontend has no endpoint)'
        : `those not DNATed to ${f.endpoints.map((e) => bracket(e)).join(', ')}`;
  return `# conntrack: delete the ${PROTOCOL[f.protocol].word} flows to ${bracket(endpointKey(f.address, f.port))}: ${kept}\n`;
}

function bracket(key: string): string {
  const [address, port] = key.split('|') as [string, string];
  return address.includes(':') ? `[${address}]:${port}` : `${address}:${port}`;
}

export class ConntrackError extends Error {
  override name = 'ConntrackError';
}

/** Runs `conntrack` (the Debian package of that name) for one family. */
export class Conntrack {
  readonly family: Family;
  private readonly run: Runner;

  constructor(family: Family, run: Runner) {
    this.family = family;
    this.run = run;
  }

  /** The entries of one protocol whose original destination is `address`. */
  async list(protocol: Protocol, address: string): Promise<FlowEntry[]> {
    const args = ['-L', '-f', this.family, '-p', PROTOCOL[protocol].word, '--orig-dst', address];
    const r = await this.run('conntrack', args);
    if (r.exitCode !== 0) throw new ConntrackError(`conntrack ${args.join(' ')} failed: ${r.stderr.trim() || `exit code ${r.exitCode}`}`);
    return parseFlows(r.stdout);
  }

  /** Deletes one group of entries; how many the kernel deleted (0 when the flows ended meanwhile). */
  async delete(d: FlowDeletion): Promise<number> {
    const args = deletionArgs(this.family, d);
    const r = await this.run('conntrack', args);
    // conntrack exits 1 when nothing matched, saying so on stderr.
    const m = /(\d+) flow entries have been deleted/.exec(r.stderr);
    if (m && (r.exitCode === 0 || m[1] === '0')) return Number(m[1]);
    throw new ConntrackError(`conntrack ${args.join(' ')} failed: ${r.stderr.trim() || `exit code ${r.exitCode}`}`);
  }

  /** Lists the checked frontends' entries (once per protocol and address) and deletes the stale ones. */
  async clean(checks: readonly FlowFrontend[]): Promise<{ deletions: FlowDeletion[]; deleted: number }> {
    const lists = new Map<string, { protocol: Protocol; address: string }>();
    for (const c of checks) lists.set(`${c.protocol} ${c.address}`, c);
    const entries: FlowEntry[] = [];
    for (const { protocol, address } of lists.values()) entries.push(...(await this.list(protocol, address)));
    const deletions = staleFlows(entries, checks);
    let deleted = 0;
    for (const d of deletions) deleted += await this.delete(d);
    return { deletions, deleted };
  }
}
