// From one family's model to pier's nftables table, and the transactions
// that move the kernel from one such table to the next. Pure: NftApplier
// (nft-applier.ts) runs what this returns.
//
// One table per family, `ip pier` and `ip6 pier`, not one `inet pier`: the
// model, the forwarding checks and the applies are per family (a node without
// IPv6 nat still serves IPv4), and every set's key type names one family's
// addresses anyway.
//
// Every Service port is data, not rules: a handful of chains serve them all.
//
//   map services      frontend (daddr . l4proto . dport) : goto spread-<n>, n its endpoints
//   chain spread-<n>  mark for masquerade (set masquerading: Cluster policy;
//                     set hairpin: Local, a pod reaching itself), then
//                     `numgen random mod n` picks one of pick-0 .. pick-<n-1>
//   chain pick-<i>    DNAT through map endpoints-<i>: frontend : its i-th endpoint
//                     (a map per index, not one keyed by frontend . index:
//                     nft 1.0 cannot read back the typeof such a key needs)
//   set no-endpoints  frontends without a usable endpoint: rejected (input, output)
//   set restricted    frontends with source ranges; set allowed: frontend . range
//   chains on hooks   filter prerouting and output at -110 (before DNAT, so the
//                     packet still shows the frontend: source ranges hold for
//                     forwarded, host-network and node-local clients alike,
//                     for every packet of a connection); nat prerouting and
//                     output at dstnat; masquerade at srcnat; reject at input
//
// Why no chain per Service port: nft reads every chain of the table (with its
// rules) into its cache before each command, so at 10,000 ports a chain each
// made every change, however small, cost seconds (bench/README.md). With
// sets, a change is a few element edits in one `nft -f` transaction. A whole
// table is replaced atomically (add, delete, define), so a restart never
// leaves a moment without rules.
//
// What nftables cannot do: an accept in pier's table does not override a drop
// in another table (every base chain on a hook sees the packet, and any drop
// is final), so pier cannot open a host's FORWARD policy DROP as its iptables
// backend does. The agent reports such a policy instead.
import type { Family } from '../lib/contract.ts';
import { parseCidr } from '../lib/address.ts';
import { compareText, type FamilyModel, type Protocol, type ServedPort } from './model.ts';

export const NFT_TABLE = 'pier';
export const NFT_FAMILY: Record<Family, 'ip' | 'ip6'> = { ipv4: 'ip', ipv6: 'ip6' };

/** The chains on hooks, with how many rules each holds. */
export const FIXED_RULES = {
  'filter-prerouting': 1,
  'filter-input': 1,
  'filter-output': 2,
  'nat-prerouting': 1,
  'nat-output': 1,
  'nat-postrouting': 1,
} as const;
export const FIXED_CHAINS = Object.keys(FIXED_RULES) as (keyof typeof FIXED_RULES)[];
/** Rules of each spread-<n> and pick-<i> chain. */
export const SPREAD_RULES = 3;
export const PICK_RULES = 1;
/** The sets every table has; maps endpoints-<i> come and go with the largest endpoint count. */
export const FIXED_SETS = ['services', 'masquerading', 'hairpin', 'no-endpoints', 'restricted', 'allowed'] as const;

/** nft's user-data comments hold 128 bytes. */
const MAX_NFT_COMMENT = 127;

export interface NftRuleset {
  family: Family;
  markBit: number;
  /**
   * Each set's elements, by set name (FIXED_SETS, then endpoints-0 ..
   * endpoints-<width-1>): key as nft prints it, to what follows the key (a
   * comment, and for maps ` : value`; '' for a plain set's element).
   */
  sets: Map<string, Map<string, string>>;
  /** The endpoint counts that have a spread-<n> chain, with how many frontends go there. */
  spreads: Map<number, number>;
}

/** How many endpoints-<i> maps and pick-<i> chains the table has: its largest endpoint count. */
export function width(r: NftRuleset): number {
  let n = 0;
  for (const s of r.spreads.keys()) if (s > n) n = s;
  return n;
}

/** Rules and chains in the table, for the agent's metrics (the elements are its Service ports). */
export function nftCounts(r: NftRuleset): { rules: number; chains: number } {
  const picks = width(r);
  const fixed = Object.values(FIXED_RULES).reduce((a, b) => a + b, 0);
  return { rules: fixed + r.spreads.size * SPREAD_RULES + picks * PICK_RULES, chains: FIXED_CHAINS.length + r.spreads.size + picks };
}

const endpointsMap = (i: number) => `endpoints-${i}`;

/** What one served port adds to its family's table. */
interface ServedNft {
  items: [string, string, string][];
  spread: number;
}

const PROTO: Record<Protocol, string> = { TCP: 'tcp', UDP: 'udp', SCTP: 'sctp' };

export function emptyNft(family: Family, markBit: number): NftRuleset {
  return { family, markBit, sets: new Map(FIXED_SETS.map((s) => [s, new Map<string, string>()])), spreads: new Map() };
}

/** What NftRenderer.update gives: the table now, and the transaction to it from the table of version `since`. */
export interface NftUpdate {
  state: NftRuleset;
  version: number;
  since: number;
  /** `nft -f` input from version `since` to `version`; '' when nothing changed. */
  delta: string;
}

/**
 * The table as changes: each update takes the model's served ports, compares them
 * by identity with the last update's (the pipeline hands out the same served port
 * object while its Service and slices do not change), and edits the state
 * and the transaction for only the served ports that came or went. A new renderer's
 * first update is the whole table, added to an empty one. At 10,000 ports
 * rebuilding the sets and comparing them whole cost ~65 ms per sync
 * (bench/agent.ts, "nftables ... no-op sync"), more than nft itself.
 *
 * `state` is the renderer's own, changed by the next update: read it, keep
 * the version, never change it.
 */
export class NftRenderer {
  private readonly state: NftRuleset;
  private servedPorts = new Map<ServedPort, ServedNft>();
  private model: FamilyModel | undefined;
  private version = 0;

  constructor(family: Family, markBit: number) {
    this.state = emptyNft(family, markBit);
  }

  update(model: FamilyModel): NftUpdate {
    const since = this.version;
    if (model === this.model) return { state: this.state, version: since, since, delta: '' };
    if (model.family !== this.state.family) throw new Error(`an ${this.state.family} renderer was given an ${model.family} model`);
    this.model = model;
    const next = new Map<ServedPort, ServedNft>();
    for (const served of model.ports) next.set(served, this.servedPorts.get(served) ?? servedNft(served, model.family));
    const edit = new Edit(this.state);
    for (const [served, p] of this.servedPorts) if (!next.has(served)) edit.apply(p, -1);
    for (const [served, p] of next) if (!this.servedPorts.has(served)) edit.apply(p, +1);
    this.servedPorts = next;
    const delta = edit.script();
    if (delta !== '') this.version++;
    return { state: this.state, version: this.version, since, delta };
  }
}

/** One update's changes to a state: made at once, remembered as before and after for the transaction. */
class Edit {
  private readonly r: NftRuleset;
  /** Per set, each touched key's value before the edit (undefined: absent). */
  private readonly before = new Map<string, Map<string, string | undefined>>();
  private readonly spreadsBefore = new Map<number, boolean>();
  private readonly widthBefore: number;

  constructor(r: NftRuleset) {
    this.r = r;
    this.widthBefore = width(r);
  }

  /** Adds (+1) or removes (-1) one served port's elements. Removals come first: a key may pass from one served port to another. */
  apply(p: ServedNft, sign: 1 | -1): void {
    for (const [set, key, rest] of p.items) {
      let was = this.before.get(set);
      if (!was) this.before.set(set, (was = new Map()));
      let items = this.r.sets.get(set);
      if (!items) this.r.sets.set(set, (items = new Map()));
      if (!was.has(key)) was.set(key, items.get(key));
      if (sign > 0) items.set(key, rest);
      else items.delete(key);
    }
    if (p.spread === 0) return;
    const n = this.r.spreads.get(p.spread) ?? 0;
    if (!this.spreadsBefore.has(p.spread)) this.spreadsBefore.set(p.spread, n > 0);
    const frontends = p.items.filter(([set]) => set === 'services').length;
    if (n + sign * frontends > 0) this.r.spreads.set(p.spread, n + sign * frontends);
    else this.r.spreads.delete(p.spread);
  }

  /** The transaction; maps endpoints-<i> past the new width are dropped from the state too. */
  script(): string {
    const r = this.r;
    const t = `${NFT_FAMILY[r.family]} ${NFT_TABLE}`;
    const [wb, wa] = [this.widthBefore, width(r)];
    let block = '';
    for (let i = wb; i < wa; i++) block += pick(r.family, i);
    for (const [n, had] of this.spreadsBefore) if (!had && r.spreads.has(n)) block += spread(r.family, r.markBit, n);
    let dels = '';
    let adds = '';
    for (const [set, was] of this.before) {
      const items = r.sets.get(set)!;
      const gone: string[] = [];
      const come: string[] = [];
      for (const [k, v] of was) {
        const now = items.get(k);
        if (now === v) continue;
        if (v !== undefined) gone.push(k);
        if (now !== undefined) come.push(k);
      }
      const dropped = set.startsWith('endpoints-') && Number(set.slice(10)) >= wa;
      if (gone.length && !dropped) dels += `delete element ${t} ${set} { ${gone.join(', ')} }\n`;
      if (come.length) adds += `add element ${t} ${set} { ${elementList(items, come)} }\n`;
    }
    // What goes, once nothing names it: spread chains, then the pick chains
    // they jump to, then the maps those read (with their elements).
    let drops = '';
    for (const [n, had] of this.spreadsBefore) if (had && !r.spreads.has(n)) drops += `delete chain ${t} spread-${n}\n`;
    for (let i = wa; i < wb; i++) drops += `delete chain ${t} pick-${i}\n`;
    for (let i = wa; i < wb; i++) {
      drops += `delete map ${t} ${endpointsMap(i)}\n`;
      r.sets.delete(endpointsMap(i));
    }
    // New maps and chains first (elements name them), elements out before in
    // (a key may change its value), the rest last.
    return (block ? `table ${t} {\n${block}}\n` : '') + dels + adds + drops;
  }
}

/** The whole table for a model, from scratch: `pier plan`, and the oracle of the tests. */
export function renderNft(model: FamilyModel, markBit: number): NftRuleset {
  return new NftRenderer(model.family, markBit).update(model).state;
}

function servedNft(served: ServedPort, family: Family): ServedNft {
  const proto = PROTO[served.protocol];
  const keys = served.frontends.map((f) => `${f.address} . ${proto} . ${f.port}`);
  const items: ServedNft['items'] = [];
  if (served.endpoints.length === 0) {
    for (const k of keys) items.push(['no-endpoints', k, '']);
    return { items, spread: 0 };
  }
  const eps = [...served.endpoints].sort((a, b) => compareText(a.address, b.address) || a.port - b.port);
  const comment = ` comment "${served.comment.slice(0, MAX_NFT_COMMENT)}"`;
  for (const k of keys) {
    items.push(['services', k, `${comment} : goto spread-${eps.length}`]);
    eps.forEach((e, i) => items.push([endpointsMap(i), k, ` : ${e.address} . ${e.port}`]));
    if (served.masquerade) items.push(['masquerading', k, '']);
    // Local keeps the client's address, except for a pod reaching itself
    // through the frontend: its reply must come back through this node.
    else for (const a of new Set(eps.map((e) => e.address))) items.push(['hairpin', `${k} . ${a}`, '']);
    if (served.restrictSources) {
      items.push(['restricted', k, '']);
      for (const r of outermost(served.sourceRanges, family)) items.push(['allowed', `${k} . ${r}`, '']);
    }
  }
  return { items, spread: eps.length };
}

/**
 * The ranges not inside another, as nft prints them (a host without its
 * prefix): the kernel refuses overlapping elements in an interval set, and
 * CIDRs either nest or are apart.
 */
export function outermost(cidrs: readonly string[], family: Family): string[] {
  const parsed = cidrs.map(parseCidr).filter((c) => c !== undefined && c.family === family).sort((a, b) => a!.prefix - b!.prefix);
  const kept: NonNullable<(typeof parsed)[number]>[] = [];
  const bits = family === 'ipv4' ? 32 : 128;
  for (const c of parsed) {
    const inside = kept.some((k) => k.prefix <= c!.prefix && c!.value >> BigInt(bits - k.prefix) === k.value >> BigInt(bits - k.prefix));
    if (!inside) kept.push(c!);
  }
  return kept.map((c) => (c.prefix === bits ? c.text.slice(0, c.text.indexOf('/')) : c.text)).sort(compareText);
}

function hex(n: number): string {
  return `0x${(n >>> 0).toString(16).padStart(8, '0')}`;
}

/** The set declarations and the chains on hooks, which do not depend on the model. */
function skeleton(family: Family, markBit: number): string {
  const addr = family === 'ipv4' ? 'ipv4_addr' : 'ipv6_addr';
  const ip = NFT_FAMILY[family];
  const key = `${addr} . inet_proto . inet_service`;
  const frontend = `${ip} daddr . meta l4proto . th dport`;
  const sources = `${frontend} @restricted ${frontend} . ${ip} saddr != @allowed drop`;
  const reject = `ct state new ${frontend} @no-endpoints reject`;
  const clear = hex(~markBit >>> 0);
  return [
    `\tmap services { type ${key} : verdict; }`,
    `\tset masquerading { type ${key}; }`,
    `\tset hairpin { type ${key} . ${addr}; }`,
    `\tset no-endpoints { type ${key}; }`,
    `\tset restricted { type ${key}; }`,
    `\tset allowed { type ${key} . ${addr}; flags interval; }`,
    // Numbers, not names: nft 1.0 knows "dstnat" for prerouting only.
    `\tchain filter-prerouting { type filter hook prerouting priority -110; policy accept; ${sources}; }`,
    `\tchain filter-input { type filter hook input priority -10; policy accept; ${reject}; }`,
    `\tchain filter-output { type filter hook output priority -110; policy accept; ${sources}; ${reject}; }`,
    `\tchain nat-prerouting { type nat hook prerouting priority -100; policy accept; ${frontend} vmap @services; }`,
    `\tchain nat-output { type nat hook output priority -100; policy accept; ${frontend} vmap @services; }`,
    `\tchain nat-postrouting { type nat hook postrouting priority 100; policy accept; meta mark & ${hex(markBit)} != 0 meta mark set meta mark & ${clear} masquerade; }`,
    '',
  ].join('\n');
}

/** Map endpoints-<i> and chain pick-<i>, which DNATs a frontend to its i-th endpoint. */
function pick(family: Family, i: number): string {
  const addr = family === 'ipv4' ? 'ipv4_addr' : 'ipv6_addr';
  const frontend = `${NFT_FAMILY[family]} daddr . meta l4proto . th dport`;
  return (
    `\tmap ${endpointsMap(i)} { type ${addr} . inet_proto . inet_service : ${addr} . inet_service; }\n` +
    `\tchain pick-${i} { meta l4proto { tcp, udp, sctp } dnat to ${frontend} map @${endpointsMap(i)}; }\n`
  );
}

/** The chain for frontends with `n` endpoints: marks what must be masqueraded, then picks one endpoint at random. */
function spread(family: Family, markBit: number, n: number): string {
  const ip = NFT_FAMILY[family];
  const frontend = `${ip} daddr . meta l4proto . th dport`;
  const mark = `meta mark set meta mark | ${hex(markBit)}`;
  const choose = n === 1 ? 'goto pick-0' : `numgen random mod ${n} vmap { ${Array.from({ length: n }, (_, i) => `${i} : goto pick-${i}`).join(', ')} }`;
  return `\tchain spread-${n} { ${frontend} @masquerading ${mark}; ${frontend} . ${ip} saddr @hairpin ${mark}; ${choose}; }\n`;
}

function elementList(m: ReadonlyMap<string, string>, keys?: readonly string[]): string {
  let out = '';
  for (const k of keys ?? m.keys()) out += `${out ? ', ' : ''}${k}${m.get(k)}`;
  return out;
}

/** The whole table, replacing whatever pier's table held, in one transaction (`nft -f`). */
export function nftScript(r: NftRuleset): string {
  const t = `${NFT_FAMILY[r.family]} ${NFT_TABLE}`;
  let out = `add table ${t}\ndelete table ${t}\ntable ${t} {\n\tcomment "pier: LoadBalancer frontends of this node; managed by pier agent"\n`;
  out += skeleton(r.family, r.markBit);
  for (let i = 0; i < width(r); i++) out += pick(r.family, i);
  for (const n of [...r.spreads.keys()].sort((a, b) => a - b)) out += spread(r.family, r.markBit, n);
  out += '}\n';
  for (const [set, items] of r.sets) if (items.size > 0) out += `add element ${t} ${set} { ${elementList(items)} }\n`;
  return out;
}

// ---------------------------------------------------------------------------
// What the kernel holds: `nft -j list table`, reduced to what drift is judged by

/** Elements exactly (as nft prints them), chains by name and number of rules. */
export interface NftObserved {
  chains: Map<string, number>;
  /** Each set's elements, as key + what follows it (see NftRuleset.sets). */
  sets: Map<string, Set<string>>;
}

type JsonExpr =
  | string
  | number
  | { concat?: JsonExpr[]; prefix?: { addr: string; len: number }; goto?: { target: string }; elem?: { val: JsonExpr; comment?: string } };

function exprText(e: JsonExpr): string {
  if (typeof e === 'string' || typeof e === 'number') return String(e);
  if (e.concat) return e.concat.map(exprText).join(' . ');
  if (e.prefix) return `${e.prefix.addr}/${e.prefix.len}`;
  if (e.goto) return `goto ${e.goto.target}`;
  if (e.elem) return `${exprText(e.elem.val)}${e.elem.comment !== undefined ? ` comment "${e.elem.comment}"` : ''}`;
  return JSON.stringify(e);
}

/** From `nft -j list table <family> pier`. */
export function parseNftJson(text: string): NftObserved {
  const out: NftObserved = { chains: new Map(), sets: new Map() };
  const items = (JSON.parse(text) as { nftables: Record<string, Record<string, unknown>>[] }).nftables;
  for (const item of items) {
    if (item.chain) out.chains.set(item.chain.name as string, 0);
    const set = item.set ?? item.map;
    if (!set) continue;
    const elems = (set.elem as (JsonExpr | [JsonExpr, JsonExpr])[] | undefined) ?? [];
    out.sets.set(set.name as string, new Set(elems.map((el) => (Array.isArray(el) ? `${exprText(el[0])} : ${exprText(el[1])}` : exprText(el)))));
  }
  for (const item of items) {
    if (!item.rule) continue;
    const chain = item.rule.chain as string;
    out.chains.set(chain, (out.chains.get(chain) ?? 0) + 1);
  }
  return out;
}

/** How `observed` differs from what pier wrote; empty when it does not. */
export function nftDrift(applied: NftRuleset, observed: NftObserved): string[] {
  const found: string[] = [];
  const want = new Map<string, number>(Object.entries(FIXED_RULES));
  for (const n of applied.spreads.keys()) want.set(`spread-${n}`, SPREAD_RULES);
  for (let i = 0; i < width(applied); i++) want.set(`pick-${i}`, PICK_RULES);
  for (const [name, n] of want) {
    const have = observed.chains.get(name);
    if (have === undefined) found.push(`chain ${name}: missing`);
    else if (have !== n) found.push(`chain ${name}: ${have} rules, wrote ${n}`);
  }
  for (const name of observed.chains.keys()) if (!want.has(name)) found.push(`chain ${name}: not pier's`);
  for (const [set, items] of applied.sets) {
    const have = observed.sets.get(set);
    if (!have) {
      found.push(`set ${set}: missing`);
      continue;
    }
    let missing = 0;
    for (const [k, rest] of items) if (!have.has(k + rest)) missing++;
    const unwanted = have.size - (items.size - missing);
    if (missing || unwanted) found.push(`set ${set}: ${missing} missing, ${unwanted} unwanted`);
  }
  for (const set of observed.sets.keys()) if (!applied.sets.has(set)) found.push(`set ${set}: not pier's`);
  return found;
}
