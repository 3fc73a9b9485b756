// Conntrack clean-up for connectionless flows. A UDP (or SCTP) flow keeps
// its conntrack entry for as long as the client keeps sending, and every
// packet of it follows that entry, not the rules: a flow that began before
// its frontend's DNAT existed stays un-NATed, and one DNATed to an endpoint
// that is gone keeps going there. So after a sync that changed what a
// frontend DNATs to (it appeared, its endpoints changed, or it went away),
// the entries of that frontend that do not lead to one of its current
// endpoints are deleted, and only those: the next packet then meets the
// rules. Entries that lead to a current endpoint are never touched, so a
// restart that changes nothing deletes nothing (a table-wide flush breaks
// healthy flows, QUIC's first: kubernetes #122740). TCP needs none of this:
// a TCP flow to a gone endpoint is reset, and a new one is a new entry.
//
// The decisions are pure functions of plain data (frontends, parsed
// entries); the Conntrack class is the adapter that runs `conntrack`.
import type { Family } from '../lib/contract.ts';
import { addressInfo } from '../lib/address.ts';
import type { FamilyModel, Protocol, ServedPort } from './engine/model.ts';
import { PROTOCOL, protocolOfWord } from '../lib/protocols.ts';
import type { Runner } from '../lib/run.ts';

/** The protocols whose flows outlive rule changes. */
export type FlowProtocol = 'UDP' | 'SCTP';

/** One frontend as conntrack sees it, and where its rules send new flows. */
export interface FlowFrontend {
  protocol: FlowProtocol;
  address: string;
  port: number;
  /** `address|port` of each endpoint the rules DNAT to, sorted; empty when they reject. */
  endpoints: string[];
}

/** Frontends by `protocol address port`. */
export type FlowFrontends = Map<string, FlowFrontend>;

/** A conntrack entry, as far as the clean-up needs it. */
export interface FlowEntry {
  protocol: FlowProtocol;
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
  protocol: FlowProtocol;
  address: string;
  port: number;
  replySrc: string;
  replySport: number;
  /** The entries it deletes, as listed. */
  entries: number;
}

const frontendKey = (protocol: string, address: string, port: number) => `${protocol} ${address} ${port}`;
const endpointKey = (address: string, port: number) => `${address}|${port}`;

// Plans of unchanged Services are the same objects from sync to sync
// (pipeline.ts), so their frontends are computed once.
const servedFlows = new WeakMap<ServedPort, FlowFrontend[]>();

/** The UDP and SCTP frontends of one family's model, with the endpoints their rules DNAT to. Pure. */
export function flowFrontends(model: FamilyModel): FlowFrontends {
  const out: FlowFrontends = new Map();
  for (const served of model.ports) {
    if (!isFlowProtocol(served.protocol)) continue;
    let flows = servedFlows.get(served);
    if (!flows) {
      const protocol = served.protocol;
      const endpoints = served.endpoints.map((e) => endpointKey(e.address, e.port)).sort();
      flows = served.frontends.map((f) => ({ protocol, address: f.address, port: f.port, endpoints }));
      servedFlows.set(served, flows);
    }
    for (const f of flows) out.set(frontendKey(f.protocol, f.address, f.port), f);
  }
  return out;
}

function isFlowProtocol(p: Protocol): p is FlowProtocol {
  return p === 'UDP' || p === 'SCTP';
}

/**
 * The frontends whose flows must be checked after moving from `before` to
 * `after`: new ones, ones whose endpoints changed, and gone ones (with no
 * endpoints: nothing of theirs is current). With no `before` (the agent
 * just started and does not know what the kernel's rules did) every
 * frontend is checked; only entries that miss a current endpoint go. Pure.
 */
export function frontendsToCheck(before: FlowFrontends | undefined, after: FlowFrontends): FlowFrontend[] {
  if (!before) return [...after.values()];
  const out: FlowFrontend[] = [];
  for (const [key, f] of after) {
    const old = before.get(key);
    if (!old || !sameEndpoints(old.endpoints, f.endpoints)) out.push(f);
  }
  for (const [key, f] of before) if (!after.has(key)) out.push({ ...f, endpoints: [] });
  return out;
}

function sameEndpoints(a: string[], b: string[]): boolean {
  return a === b || (a.length === b.length && a.every((e, i) => e === b[i]));
}

/**
 * The deletions that leave each checked frontend with only entries that
 * lead to one of its current endpoints, grouped so that one `conntrack -D`
 * takes every client of a stale reply source at once. Pure.
 */
export function staleFlows(entries: readonly FlowEntry[], checks: readonly FlowFrontend[]): FlowDeletion[] {
  const byFrontend = new Map<string, Set<string>>();
  for (const c of checks) byFrontend.set(frontendKey(c.protocol, c.address, c.port), new Set(c.endpoints));
  const out = new Map<string, FlowDeletion>();
  for (const e of entries) {
    const current = byFrontend.get(frontendKey(e.protocol, e.origDst, e.origDport));
    if (!current || current.has(endpointKey(e.replySrc, e.replySport))) continue;
    const key = `${frontendKey(e.protocol, e.origDst, e.origDport)} ${e.replySrc} ${e.replySport}`;
    const d = out.get(key);
    if (d) d.entries++;
    else out.set(key, { protocol: e.protocol, address: e.origDst, port: e.origDport, replySrc: e.replySrc, replySport: e.replySport, entries: 1 });
  }
  return [...out.values()];
}

/**
 * Parses `conntrack -L` output (one entry per line: the original tuple's
 * src=, dst=, sport=, dport=, then the reply tuple's). Lines of other
 * protocols, or that do not parse, are skipped. Pure.
 */
export function parseFlows(text: string): FlowEntry[] {
  const out: FlowEntry[] = [];
  for (const line of text.split('\n')) {
    const words = line.trim().split(/\s+/);
    const protocol = protocolOfWord(words[0]);
    if (!protocol || !isFlowProtocol(protocol)) continue;
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
  const kept = f.endpoints.length === 0 ? 'every one of them (the frontend has no endpoint)' : `those not DNATed to ${f.endpoints.map((e) => bracket(e)).join(', ')}`;
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
  async list(protocol: FlowProtocol, address: string): Promise<FlowEntry[]> {
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
    const lists = new Map<string, { protocol: FlowProtocol; address: string }>();
    for (const c of checks) lists.set(`${c.protocol} ${c.address}`, c);
    const entries: FlowEntry[] = [];
    for (const { protocol, address } of lists.values()) entries.push(...(await this.list(protocol, address)));
    const deletions = staleFlows(entries, checks);
    let deleted = 0;
    for (const d of deletions) deleted += await this.delete(d);
    return { deletions, deleted };
  }
}
