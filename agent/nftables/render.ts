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
//   map services      frontend (daddr . l4proto . dport) : goto spread-<n>
//                     (Cluster policy) or local-<n> (Local), n its endpoints
//   chain spread-<n>  mark for masquerade, then `numgen random mod n` picks
//                     one of pick-0 .. pick-<n-1>
//   chain local-<n>   the same, marking only a pod that reaches itself (set
//                     hairpin); the policy is in the verdict, not in a set of
//                     every Cluster frontend, which cost ~20 % of a cold
//                     `nft -f` at 10,000 ports (bench:agent)
//   chain pick-<i>    DNAT through map endpoints-<i>: frontend : its i-th endpoint
//                     (a map per index, not one keyed by frontend . index:
//                     nft 1.0 cannot read back the typeof such a key needs)
//   chain affinity-<h> a port with sessionAffinity ClientIP (its frontends go here
//                     instead): a client in an endpoint's set clients-<g> goes
//                     back to it (sticky-<g>, which refreshes the client's entry and
//                     DNATs); a new one is spread over the sticky chains. Chains
//                     and dynamic sets of the port's own, as kube-proxy's nftables
//                     mode has: the timeout is the port's, and a port without
//                     affinity pays nothing for it
//   set no-endpoints  frontends without a usable endpoint: rejected (input, output;
//                     TCP with a reset)
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
import type { Family } from '../../lib/contract.ts';
import { parseCidr } from '../../lib/address.ts';
import { compareText, portChanges, type PortChanges, type Endpoint, type FamilyModel, type ServedPort } from '../engine/model.ts';
import { PROTOCOL } from '../../lib/protocols.ts';
import { CHAIN, endpointsMap, endpointsMapIndex, FIXED_SETS, OWN_ORDER, ownName, pickChain, SET, spreadChain, spreadChainMasquerades, spreadChainWidth } from './names.ts';

export const NFT_TABLE = 'pier';
export const NFT_FAMILY: Record<Family, 'ip' | 'ip6'> = { ipv4: 'ip', ipv6: 'ip6' };

/** The chains on hooks, with how many rules each holds. */
export const FIXED_RULES = {
  [CHAIN.filterPrerouting]: 1,
  [CHAIN.filterInput]: 2,
  [CHAIN.filterOutput]: 3,
  [CHAIN.natPrerouting]: 1,
  [CHAIN.natOutput]: 1,
  [CHAIN.natPostrouting]: 1,
} as const;
export const FIXED_CHAINS = Object.keys(FIXED_RULES) as (keyof typeof FIXED_RULES)[];
/** Rules of each spread-<n>, local-<n> and pick-<i> chain. */
export const SPREAD_RULES = 2;
export const PICK_RULES = 1;
// The sets every table has are FIXED_SETS (names.ts); maps endpoints-<i> come and go with the largest endpoint count.

const TABLE_COMMENT = '"pier: LoadBalancer frontends of this node; managed by pier agent"';

/** nft's user-data comments hold 128 bytes. */
const MAX_NFT_COMMENT = 127;

export interface NftRuleset {
  family: Family;
  /** The connection-mark bit that asks nat-postrouting to masquerade (the iptables backend's, MarkBits.masquerade). */
  masqueradeBit: number;
  /**
   * Each set's elements, by set name (FIXED_SETS, then endpoints-0 ..
   * endpoints-<width-1>): key as nft prints it, to what follows the key (a
   * comment, and for maps ` : value`; '' for a plain set's element).
   */
  sets: Map<string, Map<string, string>>;
  /** The spread-<n> and local-<n> chains the table has, with how many frontends go there. */
  spreads: Map<string, number>;
  /** Sets and chains of served ports' own (session affinity), by ownKey. */
  own: Map<string, OwnObject>;
}

/** A set or chain one served port has to itself. */
export interface OwnObject {
  kind: 'set' | 'chain';
  name: string;
  /** Its declaration in a table block. */
  text: string;
  /** Rules, of a chain. */
  rules: number;
  /** Declared in this order, deleted in the reverse: what a rule names exists before it and goes after it. */
  order: number;
}

const ownKey = (o: OwnObject) => `${o.kind} ${o.name}`;

/** How many endpoints-<i> maps and pick-<i> chains the table has: its largest endpoint count. */
export function width(r: NftRuleset): number {
  let n = 0;
  for (const s of r.spreads.keys()) n = Math.max(n, spreadChainWidth(s));
  return n;
}

/** Rules and chains in the table, for the agent's metrics (the elements are its Service ports). */
export function nftCounts(r: NftRuleset): { rules: number; chains: number } {
  const picks = width(r);
  const fixed = Object.values(FIXED_RULES).reduce((a, b) => a + b, 0);
  let ownRules = 0;
  let ownChains = 0;
  for (const o of r.own.values()) {
    if (o.kind !== 'chain') continue;
    ownChains++;
    ownRules += o.rules;
  }
  return { rules: fixed + r.spreads.size * SPREAD_RULES + picks * PICK_RULES + ownRules, chains: FIXED_CHAINS.length + r.spreads.size + picks + ownChains };
}

/** What one served port adds to its family's table. */
interface ServedNft {
  /** set, key, what follows the key. */
  items: [string, string, string][];
  /** Its spread chain; '' without endpoints. */
  spread: string;
  /** How many frontends go to that chain. */
  frontends: number;
  /** Its own sets and chains (session affinity); none without. */
  own: readonly OwnObject[];
}


export function emptyNft(family: Family, masqueradeBit: number): NftRuleset {
  return { family, masqueradeBit, sets: new Map(FIXED_SETS.map((s) => [s, new Map<string, string>()])), spreads: new Map(), own: new Map() };
}

/** What NftRenderer.update gives: the table now, and the transaction to it from the table of version `since`. */
export interface NftUpdate {
  state: NftRuleset;
  version: number;
  since: number;
  /**
   * `nft -f` input from version `since` to `version`; '' when nothing
   * changed; undefined when something did but no transaction was asked for.
   */
  delta: string | undefined;
}

/**
 * The table as changes: each update takes the model's served ports, compares them
 * by identity with the last update's (the pipeline hands out the same served port
 * object while its Service and slices do not change), and edits the state
 * and the transaction for only the served ports that came or went. A new renderer's
 * first update is the whole table, added to an empty one. Rebuilding the
 * sets and comparing them whole would cost more than nft itself (~65 ms a
 * sync at 10,000 ports).
 *
 * `state` is the renderer's own, changed by the next update: read it, keep
 * the version, never change it.
 */
export class NftRenderer {
  private readonly state: NftRuleset;
  private servedPorts = new Map<ServedPort, ServedNft>();
  private model: FamilyModel | undefined;
  private version = 0;
  /** Served ports rendered while the informers list (the agent's HeadStart); dropped by the first update. */
  private prepared: WeakMap<ServedPort, ServedNft> | undefined = new WeakMap();

  constructor(family: Family, masqueradeBit: number) {
    this.state = emptyNft(family, masqueradeBit);
  }

  /** A served port the first update will add, rendered ahead. */
  prepare(served: ServedPort): void {
    this.prepared?.set(served, servedNft(served, this.state.family, this.state.masqueradeBit));
  }

  /**
   * `transaction: false` when the table will be written whole anyway (the
   * kernel holds no version of it): a cold sync's transaction would be
   * built for nothing (~30 ms at 10,000 ports).
   * `changes`: the engine's record of how the model came to be.
   */
  update(model: FamilyModel, opts: { transaction?: boolean; changes?: PortChanges } = {}): NftUpdate {
    const since = this.version;
    if (model === this.model) return { state: this.state, version: since, since, delta: '' };
    if (model.family !== this.state.family) throw new Error(`an ${this.state.family} renderer was given an ${model.family} model`);
    const diff = portChanges(this.model?.ports ?? [], model, opts.changes);
    if (!diff) throw new Error('a model whose served ports are not sorted by key');
    this.model = model;
    const prepared = this.prepared;
    this.prepared = undefined;
    const edit = new Edit(this.state, opts.transaction ?? true);
    for (const served of diff.removed) {
      edit.apply(this.servedPorts.get(served)!, -1);
      this.servedPorts.delete(served);
    }
    for (const served of diff.added) {
      const p = prepared?.get(served) ?? servedNft(served, model.family, this.state.masqueradeBit);
      this.servedPorts.set(served, p);
      edit.apply(p, +1);
    }
    const delta = edit.finish();
    if (delta !== '') this.version++;
    return { state: this.state, version: this.version, since, delta };
  }
}

/** One update's changes to a state: made at once, remembered as before and after for the transaction. */
class Edit {
  private readonly r: NftRuleset;
  /** Per set, each touched key's value before the edit (undefined: absent), with the set's elements. */
  private readonly before = new Map<string, { was: Map<string, string | undefined>; items: Map<string, string> }>();
  private readonly spreadsBefore = new Map<string, boolean>();
  /** Each touched own object as it was before the edit (undefined: absent). */
  private readonly ownBefore = new Map<string, OwnObject | undefined>();
  private readonly widthBefore: number;
  /** Whether to remember what each element was: only a transaction needs it. */
  private readonly track: boolean;
  private changed = false;

  constructor(r: NftRuleset, track: boolean) {
    this.r = r;
    this.widthBefore = width(r);
    this.track = track;
  }

  /**
   * Adds (+1) or removes (-1) one served port's elements. Removals come
   * first: a key may pass from one served port to another. A cold sync puts
   * every element of the table through here: indexed loops, no
   * destructuring, one lookup per set (bench:agent, "nftables ... cold sync").
   */
  apply(p: ServedNft, sign: 1 | -1): void {
    this.changed = true;
    const list = p.items;
    for (let i = 0; i < list.length; i++) {
      const item = list[i]!;
      const set = this.touched(item[0]);
      const key = item[1];
      if (this.track && !set.was.has(key)) set.was.set(key, set.items.get(key));
      if (sign > 0) set.items.set(key, item[2]);
      else set.items.delete(key);
    }
    for (let i = 0; i < p.own.length; i++) {
      const o = p.own[i]!;
      const k = ownKey(o);
      if (this.track && !this.ownBefore.has(k)) this.ownBefore.set(k, this.r.own.get(k));
      if (sign > 0) this.r.own.set(k, o);
      else this.r.own.delete(k);
    }
    if (p.spread === '') return;
    const n = this.r.spreads.get(p.spread) ?? 0;
    if (!this.spreadsBefore.has(p.spread)) this.spreadsBefore.set(p.spread, n > 0);
    if (n + sign * p.frontends > 0) this.r.spreads.set(p.spread, n + sign * p.frontends);
    else this.r.spreads.delete(p.spread);
  }

  private touched(name: string): { was: Map<string, string | undefined>; items: Map<string, string> } {
    let t = this.before.get(name);
    if (!t) {
      let items = this.r.sets.get(name);
      if (!items) this.r.sets.set(name, (items = new Map()));
      this.before.set(name, (t = { was: new Map(), items }));
    }
    return t;
  }

  /** The transaction (see NftUpdate.delta); maps endpoints-<i> past the new width are dropped from the state too. */
  finish(): string | undefined {
    if (!this.track) {
      for (let i = width(this.r); i < this.widthBefore; i++) this.r.sets.delete(endpointsMap(i));
      return this.changed ? undefined : '';
    }
    const r = this.r;
    const t = `${NFT_FAMILY[r.family]} ${NFT_TABLE}`;
    const [wb, wa] = [this.widthBefore, width(r)];
    let block = '';
    for (let i = wb; i < wa; i++) block += pick(r.family, i);
    for (const [name, had] of this.spreadsBefore) if (!had && r.spreads.has(name)) block += spread(r.family, r.masqueradeBit, name);
    // Own objects: new ones declared, changed chains flushed and filled again, gone ones deleted last.
    let flushes = '';
    const declared: OwnObject[] = [];
    const gone: OwnObject[] = [];
    for (const [k, was] of this.ownBefore) {
      const now = r.own.get(k);
      if (now && now.text !== was?.text) {
        if (was) flushes += `flush chain ${t} ${now.name}\n`;
        declared.push(now);
      } else if (!now && was) gone.push(was);
    }
    for (const o of declared.sort(compareOwn)) block += o.text;
    let dels = '';
    let adds = '';
    for (const [set, { was, items }] of this.before) {
      const gone: string[] = [];
      const come: string[] = [];
      for (const [k, v] of was) {
        const now = items.get(k);
        if (now === v) continue;
        if (v !== undefined) gone.push(k);
        if (now !== undefined) come.push(k);
      }
      const dropped = (endpointsMapIndex(set) ?? -1) >= wa;
      if (gone.length && !dropped) dels += `delete element ${t} ${set} { ${gone.join(', ')} }\n`;
      if (come.length) adds += `add element ${t} ${set} { ${elementList(items, come)} }\n`;
    }
    // What goes, once nothing names it: spread chains, then the pick chains
    // they jump to, then the maps those read (with their elements).
    let drops = '';
    for (const o of gone.sort(compareOwn).reverse()) drops += `delete ${o.kind} ${t} ${o.name}\n`;
    for (const [name, had] of this.spreadsBefore) if (had && !r.spreads.has(name)) drops += `delete chain ${t} ${name}\n`;
    for (let i = wa; i < wb; i++) drops += `delete chain ${t} ${pickChain(i)}\n`;
    for (let i = wa; i < wb; i++) {
      drops += `delete map ${t} ${endpointsMap(i)}\n`;
      r.sets.delete(endpointsMap(i));
    }
    // New maps and chains first (elements name them), elements out before in
    // (a key may change its value), the rest last.
    return flushes + (block ? `table ${t} {\n${block}}\n` : '') + dels + adds + drops;
  }
}

function servedNft(served: ServedPort, family: Family, masqueradeBit: number): ServedNft {
  const proto = PROTOCOL[served.protocol].word;
  const keys = served.frontends.map((f) => `${f.address} . ${proto} . ${f.port}`);
  const items: ServedNft['items'] = [];
  if (served.endpoints.length === 0) {
    for (const k of keys) items.push([SET.noEndpoints, k, '']);
    return { items, spread: '', frontends: 0, own: NO_OWN };
  }
  const eps = [...served.endpoints].sort((a, b) => compareText(a.address, b.address) || a.port - b.port);
  const comment = ` comment "${served.comment.slice(0, MAX_NFT_COMMENT)}"`;
  const sticky = served.affinity > 0;
  const own = sticky ? affinityObjects(served, eps, family, masqueradeBit) : NO_OWN;
  const spread = sticky ? '' : spreadChain(eps.length, served.masquerade);
  const target = sticky ? own[own.length - 1]!.name : spread;
  for (const k of keys) {
    items.push([SET.services, k, `${comment} : goto ${target}`]);
    if (!sticky) eps.forEach((e, i) => items.push([endpointsMap(i), k, ` : ${e.address} . ${e.port}`]));
    // Local keeps the client's address, except for a pod reaching itself
    // through the frontend: its reply must come back through this node.
    if (!served.masquerade) for (const a of new Set(eps.map((e) => e.address))) items.push([SET.hairpin, `${k} . ${a}`, '']);
    if (served.restrictSources) {
      items.push([SET.restricted, k, '']);
      for (const r of outermost(served.sourceRanges, family)) items.push([SET.allowed, `${k} . ${r}`, '']);
    }
  }
  return { items, spread, frontends: keys.length, own };
}

const NO_OWN: readonly OwnObject[] = Object.freeze([]);

/** Own objects in a table block in OWN_ORDER (names.ts), so that a name is declared before a rule uses it. */
function compareOwn(a: OwnObject, b: OwnObject): number {
  return a.order - b.order || compareText(a.name, b.name);
}

/**
 * A ClientIP port's own objects, the chain its frontends go to last: per
 * endpoint a dynamic set of the clients it served (the timeout in its name,
 * so that a new timeout is a new set) and a chain that refreshes the client
 * there and DNATs; then affinity-<h>, which sends a known client back and
 * spreads a new one.
 */
function affinityObjects(served: ServedPort, eps: readonly Endpoint[], family: Family, masqueradeBit: number): OwnObject[] {
  const ip = NFT_FAMILY[family];
  const addr = family === 'ipv4' ? 'ipv4_addr' : 'ipv6_addr';
  const proto = PROTOCOL[served.protocol].word;
  const out: OwnObject[] = [];
  const stickies: string[] = [];
  let checks = '';
  for (const e of eps) {
    const seed = `${served.key}|${e.address}|${e.port}`;
    const clients = ownName('clients', `${seed}|${served.affinity}`);
    const sticky = ownName('sticky', seed);
    const to = family === 'ipv4' ? `${e.address}:${e.port}` : `[${e.address}]:${e.port}`;
    out.push({ kind: 'set', name: clients, text: `\tset ${clients} { type ${addr}; flags dynamic,timeout; timeout ${served.affinity}s; }\n`, rules: 0, order: OWN_ORDER.clients });
    out.push({ kind: 'chain', name: sticky, text: `\tchain ${sticky} { meta l4proto ${proto} update @${clients} { ${ip} saddr } dnat to ${to}; }\n`, rules: 1, order: OWN_ORDER.sticky });
    checks += ` ${ip} saddr @${clients} goto ${sticky};`;
    stickies.push(sticky);
  }
  const name = ownName('affinity', served.key);
  const choose = stickies.length === 1 ? `goto ${stickies[0]}` : `numgen random mod ${stickies.length} vmap { ${stickies.map((s, i) => `${i} : goto ${s}`).join(', ')} }`;
  out.push({ kind: 'chain', name, text: `\tchain ${name} { ${markRule(family, masqueradeBit, served.masquerade)};${checks} ${choose}; }\n`, rules: stickies.length + 2, order: OWN_ORDER.affinity });
  return out;
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
function skeleton(family: Family, masqueradeBit: number): string {
  const addr = family === 'ipv4' ? 'ipv4_addr' : 'ipv6_addr';
  const ip = NFT_FAMILY[family];
  const key = `${addr} . inet_proto . inet_service`;
  const frontend = `${ip} daddr . meta l4proto . th dport`;
  const sources = `${frontend} @${SET.restricted} ${frontend} . ${ip} saddr != @${SET.allowed} drop`;
  // TCP is reset, as in the iptables backend (render.ts, TCP_RESET: ICMP
  // errors are rate-limited per client); nft adds the rule's `meta l4proto
  // tcp` itself and leaves it out when it lists the rule.
  const noEndpoints = `ct state new ${frontend} @${SET.noEndpoints}`;
  const reject = `${noEndpoints} reject with tcp reset; ${noEndpoints} reject`;
  return [
    `\tmap ${SET.services} { type ${key} : verdict; }`,
    `\tset ${SET.hairpin} { type ${key} . ${addr}; }`,
    `\tset ${SET.noEndpoints} { type ${key}; }`,
    `\tset ${SET.restricted} { type ${key}; }`,
    `\tset ${SET.allowed} { type ${key} . ${addr}; flags interval; }`,
    // Numbers, not names: nft 1.0 knows "dstnat" for prerouting only.
    `\tchain ${CHAIN.filterPrerouting} { type filter hook prerouting priority -110; policy accept; ${sources}; }`,
    `\tchain ${CHAIN.filterInput} { type filter hook input priority -10; policy accept; ${reject}; }`,
    `\tchain ${CHAIN.filterOutput} { type filter hook output priority -110; policy accept; ${sources}; ${reject}; }`,
    `\tchain ${CHAIN.natPrerouting} { type nat hook prerouting priority -100; policy accept; ${frontend} vmap @${SET.services}; }`,
    `\tchain ${CHAIN.natOutput} { type nat hook output priority -100; policy accept; ${frontend} vmap @${SET.services}; }`,
    `\tchain ${CHAIN.natPostrouting} { type nat hook postrouting priority 100; policy accept; ct mark & ${hex(masqueradeBit)} != 0 masquerade; }`,
    '',
  ].join('\n');
}

/** Map endpoints-<i> and chain pick-<i>, which DNATs a frontend to its i-th endpoint. */
function pick(family: Family, i: number): string {
  const addr = family === 'ipv4' ? 'ipv4_addr' : 'ipv6_addr';
  const frontend = `${NFT_FAMILY[family]} daddr . meta l4proto . th dport`;
  return (
    `\tmap ${endpointsMap(i)} { type ${addr} . inet_proto . inet_service : ${addr} . inet_service; }\n` +
    `\tchain ${pickChain(i)} { meta l4proto { tcp, udp, sctp } dnat to ${frontend} map @${endpointsMap(i)}; }\n`
  );
}

/**
 * A spread-<n> or local-<n> chain: marks the connections to masquerade, then
 * picks one of n endpoints at random. A connection mark, as the iptables
 * backend's: a packet mark would have to be cleared before masquerade, or a
 * tunnel's outer packet would carry it.
 */
function spread(family: Family, masqueradeBit: number, name: string): string {
  const n = spreadChainWidth(name);
  const masquerade = markRule(family, masqueradeBit, spreadChainMasquerades(name));
  const choose = n === 1 ? `goto ${pickChain(0)}` : `numgen random mod ${n} vmap { ${Array.from({ length: n }, (_, i) => `${i} : goto ${pickChain(i)}`).join(', ')} }`;
  return `\tchain ${name} { ${masquerade}; ${choose}; }\n`;
}

/**
 * The rule that marks a connection for masquerade: every one (Cluster), or
 * only a pod's that reaches itself (Local: set hairpin).
 */
function markRule(family: Family, masqueradeBit: number, masquerade: boolean): string {
  const ip = NFT_FAMILY[family];
  const mark = `ct mark set ct mark | ${hex(masqueradeBit)}`;
  return masquerade ? mark : `${ip} daddr . meta l4proto . th dport . ${ip} saddr @${SET.hairpin} ${mark}`;
}

function elementList(m: ReadonlyMap<string, string>, keys?: readonly string[]): string {
  let out = '';
  for (const k of keys ?? m.keys()) out += `${out ? ', ' : ''}${k}${m.get(k)}`;
  return out;
}

/** The whole table, replacing whatever pier's table held, in one transaction (`nft -f`). */
export function nftScript(r: NftRuleset): string {
  const t = `${NFT_FAMILY[r.family]} ${NFT_TABLE}`;
  let out = `add table ${t}\ndelete table ${t}\n${tableBlock(r)}`;
  for (const [set, items] of r.sets) if (items.size > 0) out += `add element ${t} ${set} { ${elementList(items)} }\n`;
  return out;
}

/** The table with its sets and chains, no element. */
function tableBlock(r: NftRuleset): string {
  let out = `table ${NFT_FAMILY[r.family]} ${NFT_TABLE} {\n\tcomment ${TABLE_COMMENT}\n`;
  out += skeleton(r.family, r.masqueradeBit);
  for (let i = 0; i < width(r); i++) out += pick(r.family, i);
  for (const name of [...r.spreads.keys()].sort(compareText)) out += spread(r.family, r.masqueradeBit, name);
  for (const o of [...r.own.values()].sort(compareOwn)) out += o.text;
  return `${out}}\n`;
}

/**
 * What `state`'s affinity sets held in the table about to be replaced
 * (`listJson`, from `nft -j list table`), as elements keeping what was left
 * of their timeouts: replacing the table whole (an agent's restart, drift)
 * deletes it, and with it the clients the packet path remembered. '' when
 * there is nothing to carry.
 */
export function carriedClients(listJson: string, state: NftRuleset): string {
  const want = new Set<string>();
  for (const o of state.own.values()) if (o.kind === 'set') want.add(o.name);
  if (want.size === 0) return '';
  const t = `${NFT_FAMILY[state.family]} ${NFT_TABLE}`;
  let out = '';
  const items = (JSON.parse(listJson) as { nftables: { set?: { name: string; elem?: unknown[] } }[] }).nftables;
  for (const { set } of items) {
    if (!set || !want.has(set.name)) continue;
    const kept: string[] = [];
    for (const e of set.elem ?? []) {
      const el = (e as { elem?: { val?: unknown; expires?: unknown } }).elem;
      if (typeof el?.val === 'string' && typeof el.expires === 'number' && el.expires > 0) kept.push(`${el.val} expires ${el.expires}s`);
    }
    if (kept.length > 0) out += `add element ${t} ${set.name} { ${kept.join(', ')} }\n`;
  }
  return out;
}

/** The table made where none is, with no element: fails if a table is there. */
export function createScript(r: NftRuleset): string {
  // A table takes its comment when it is made: in the block after, it would be ignored.
  return `create table ${NFT_FAMILY[r.family]} ${NFT_TABLE} { comment ${TABLE_COMMENT}; }\n${tableBlock(r)}`;
}

/**
 * The elements of a table made by createScript, in `parts` transactions
 * that can run side by side, each frontend's elements in one. nft spends
 * its time parsing, one process to a core (bench:agent, "nftables ... cold
 * sync" at 10,000 ports: 210-270 ms in two halves, 270-490 ms in one).
 */
export function elementScripts(r: NftRuleset, parts: number): string[] {
  const t = `${NFT_FAMILY[r.family]} ${NFT_TABLE}`;
  const elements = Array.from({ length: parts }, () => '');
  for (const [set, items] of r.sets) {
    const lists = Array.from({ length: parts }, (): string[] => []);
    // hairpin and allowed are keyed by frontend . address.
    const compound = set === SET.hairpin || set === SET.allowed;
    for (const [k, v] of items) lists[shareOf(compound ? k.slice(0, k.lastIndexOf(' . ')) : k, parts)]!.push(k + v);
    for (let i = 0; i < parts; i++) if (lists[i]!.length > 0) elements[i] += `add element ${t} ${set} { ${lists[i]!.join(', ')} }\n`;
  }
  return elements;
}

/** Which share a frontend falls in, by the last digits of its port: as even as ports are. */
function shareOf(frontend: string, parts: number): number {
  const n = frontend.length;
  return (frontend.charCodeAt(n - 1) + 10 * frontend.charCodeAt(n - 2)) % parts;
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
  for (const name of applied.spreads.keys()) want.set(name, SPREAD_RULES);
  for (let i = 0; i < width(applied); i++) want.set(pickChain(i), PICK_RULES);
  const ownSets = new Set<string>();
  for (const o of applied.own.values()) {
    if (o.kind === 'chain') want.set(o.name, o.rules);
    else ownSets.add(o.name);
  }
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
  // The clients sets' elements are the kernel's own (the packet path adds them), only the sets are pier's.
  for (const set of ownSets) if (!observed.sets.has(set)) found.push(`set ${set}: missing`);
  for (const set of observed.sets.keys()) if (!applied.sets.has(set) && !ownSets.has(set)) found.push(`set ${set}: not pier's`);
  return found;
}
