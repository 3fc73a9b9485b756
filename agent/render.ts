// From one family's model to the iptables rules that serve it, in pier's own
// chains. Pure: the applier diffs and writes what this returns.
//
// Layout (klipper-lb's three rule kinds, in the host namespace):
//
//   nat    PREROUTING, OUTPUT -> PIER-SERVICES
//            -d <address> -p <proto>      -> PIER-SVCS-<h>  one per address and protocol
//              --dport <lo:hi>           -> PIER-SVCS-<h>  aligned port ranges, as deep as needed
//                --dport <port>          [MARK] DNAT      a port with few endpoints: inline,
//                                                         spread with -m statistic
//                --dport <port>          -> PIER-SVC-<h>  a port with many: a chain of its own
//          POSTROUTING -> PIER-POSTROUTING: masquerade what carries the mark bit
//   filter FORWARD -> PIER-FORWARD: accept pier's DNATed connections, found by
//            their original destination (the same tree, matched with conntrack);
//            a port with source ranges accepts those and drops the rest (inline
//            when the list is short, else in PIER-SRC-<h>)
//          INPUT, OUTPUT (new connections) -> PIER-NOENDPOINTS: REJECT frontends
//            whose port has no usable endpoint (the same tree again)
//
// Why a tree: a new connection walks a chain rule by rule, and a flat list of
// 10,000 ports costs ~165 us per connection; one chain per port instead makes
// iptables-restore slow (user chains are what it pays for). Aligned port
// ranges keep both small, and keep chain names stable when ports come and go,
// so a change rewrites only the chains on its path.
//
// The filter rules match the connection (conntrack's original tuple), not the
// packet: replies and related ICMP errors (fragmentation needed, say) of an
// accepted connection are accepted with it.
//
// Every rule is written exactly as iptables-save prints it back (match order,
// /32 suffixes, quoting, the statistic match's rounded probability), so the
// applier and the tests can compare a ruleset with the kernel's by string
// equality, for the nft and the legacy backend alike.
import { createHash } from 'node:crypto';
import type { Family } from '../lib/contract.ts';
import { compareAddresses, compareText, type Endpoint, type FamilyModel, type Protocol } from './model.ts';

export type TableName = 'nat' | 'filter';
export const TABLES: readonly TableName[] = ['nat', 'filter'];

export interface Jump {
  /** A built-in chain. */
  chain: string;
  /** The rule spec, as after `-A <chain> `. */
  rule: string;
}

export interface TableRules {
  /** pier-owned chain -> its rules, each the text after `-A <chain> `. */
  chains: Map<string, string[]>;
  /** Rules that belong in built-in chains, in the order they are placed. */
  jumps: Jump[];
}

export interface Ruleset {
  family: Family;
  tables: Record<TableName, TableRules>;
}

export interface RenderConfig {
  /** The packet-mark bit that asks PIER-POSTROUTING to masquerade, e.g. 0x2000. */
  markBit: number;
}

export const CHAIN_PREFIX = 'PIER-';
export const MAX_CHAIN_NAME = 28;
export const SERVICES_CHAIN = 'PIER-SERVICES';
export const POSTROUTING_CHAIN = 'PIER-POSTROUTING';
export const FORWARD_CHAIN = 'PIER-FORWARD';
export const NOENDPOINTS_CHAIN = 'PIER-NOENDPOINTS';
export const CANARY_CHAIN = 'PIER-CANARY';
/**
 * The canary holds a rule, not just a chain: `iptables -F` empties chains
 * without deleting them, and the applier must notice that too.
 */
export const CANARY_RULE = '-m comment --comment "pier/canary" -j RETURN';

/** Rules a leaf chain may hold. */
export const LEAF_RULES = 32;
/** Each tier of the tree holds about this many times the rules of the tier below. */
export const TIER_FACTOR = 8;
/** A port range this small sits in its parent chain instead of a chain of its own. */
export const INLINE_RULES = 4;
/** A port gets a chain of its own (PIER-SVC-, PIER-SRC-) only when its rules are more than this. */
export const PORT_CHAIN_RULES = 8;

const PROTO: Record<Protocol, { name: string; number: number }> = {
  TCP: { name: 'tcp', number: 6 },
  UDP: { name: 'udp', number: 17 },
  SCTP: { name: 'sctp', number: 132 },
};

// ---------------------------------------------------------------------------
// Rule text

interface RuleSpec {
  s?: string;
  d?: string;
  p?: string;
  comment: string;
  /** `--dport` value; needs p. */
  dport?: string;
  ct?: { state?: string; notState?: string; proto?: number; origsrc?: string; origdst?: string; origdstport?: string };
  probability?: string;
  notMark?: string;
  target: string;
}

/** Matches in the order iptables-save prints them for rules written in this order. */
export function formatRule(r: RuleSpec): string {
  const out: string[] = [];
  if (r.s) out.push('-s', r.s);
  if (r.d) out.push('-d', r.d);
  if (r.p) out.push('-p', r.p);
  out.push('-m', 'comment', '--comment', saveString(r.comment));
  if (r.dport !== undefined) out.push('-m', r.p!, '--dport', r.dport);
  if (r.ct) {
    out.push('-m', 'conntrack');
    if (r.ct.notState) out.push('!', '--ctstate', r.ct.notState);
    if (r.ct.state) out.push('--ctstate', r.ct.state);
    if (r.ct.proto !== undefined) out.push('--ctproto', String(r.ct.proto));
    if (r.ct.origsrc) out.push('--ctorigsrc', r.ct.origsrc);
    if (r.ct.origdst) out.push('--ctorigdst', r.ct.origdst);
    if (r.ct.origdstport) out.push('--ctorigdstport', r.ct.origdstport);
  }
  if (r.probability) out.push('-m', 'statistic', '--mode', 'random', '--probability', r.probability);
  if (r.notMark) out.push('-m', 'mark', '!', '--mark', r.notMark);
  out.push('-j', r.target);
  return out.join(' ');
}

/** xtables_save_string: bare when made only of [_-0-9A-Za-z], else double-quoted with ", \ and ' escaped. */
export function saveString(value: string): string {
  if (/^[-_0-9A-Za-z]+$/.test(value)) return value;
  return `"${value.replace(/["\\']/g, (c) => `\\${c}`)}"`;
}

/**
 * The statistic match stores round(p * 2^31) and prints it back as a decimal
 * with 11 places (glibc rounds exact ties to even); 1/n written this way
 * survives a round trip through the kernel unchanged.
 */
export function probability(n: number): string {
  const k = BigInt(Math.round(2 ** 31 / n));
  const scaled = k * 10n ** 11n;
  let q = scaled >> 31n;
  const r = scaled & (2n ** 31n - 1n);
  const half = 2n ** 30n;
  if (r > half || (r === half && (q & 1n) === 1n)) q++;
  const s = q.toString().padStart(12, '0');
  return `${s.slice(0, -11)}.${s.slice(-11)}`;
}

export function hex(n: number): string {
  return `0x${n.toString(16)}`;
}

const BASE32 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';

/** `<prefix><16 base32 characters of sha256(seed)>`: 80 bits, stable and at most 28 characters for the prefixes used here. */
export function chainName(prefix: string, seed: string): string {
  const digest = createHash('sha256').update(seed).digest();
  let bits = 0;
  let acc = 0;
  let out = '';
  for (const byte of digest) {
    acc = (acc << 8) | byte;
    bits += 8;
    while (bits >= 5 && out.length < 16) {
      out += BASE32[(acc >>> (bits - 5)) & 31];
      bits -= 5;
    }
    acc &= (1 << bits) - 1;
    if (out.length === 16) break;
  }
  return `${prefix}${out}`;
}

// ---------------------------------------------------------------------------
// Families

interface FamilyText {
  host: (a: string) => string;
  /** conntrack prints a full-length prefix as a bare address. */
  ctNet: (cidr: string) => string;
  dnat: (e: Endpoint) => string;
  reject: string;
}

const FAMILY_TEXT: Record<Family, FamilyText> = {
  ipv4: {
    host: (a) => `${a}/32`,
    ctNet: (c) => (c.endsWith('/32') ? c.slice(0, -3) : c),
    dnat: (e) => `${e.address}:${e.port}`,
    reject: 'icmp-port-unreachable',
  },
  ipv6: {
    host: (a) => `${a}/128`,
    ctNet: (c) => (c.endsWith('/128') ? c.slice(0, -4) : c),
    dnat: (e) => `[${e.address}]:${e.port}`,
    reject: 'icmp6-port-unreachable',
  },
};

// ---------------------------------------------------------------------------
// Dispatch trees

/** How a tree matches a packet: by its destination now (nat, INPUT) or by the connection's original one (after DNAT). */
type TreeKind = 'dst' | 'ct';

interface TreeSpec {
  kind: TreeKind;
  /** Prefix of the tree's own chains. */
  prefix: string;
}

/** One port's rules, before the tree adds the match that selects the port. */
interface Entry {
  port: number;
  rules: RuleSpec[];
}

interface Group {
  address: string;
  protocol: Protocol;
  entries: Entry[];
}

class TreeBuilder {
  readonly groups = new Map<string, Group>();
  private readonly spec: TreeSpec;
  private readonly family: Family;

  constructor(spec: TreeSpec, family: Family) {
    this.spec = spec;
    this.family = family;
  }

  add(address: string, protocol: Protocol, entry: Entry): void {
    const k = `${address}|${protocol}`;
    let g = this.groups.get(k);
    if (!g) this.groups.set(k, (g = { address, protocol, entries: [] }));
    g.entries.push(entry);
  }

  /** Root rules (for the tree's fixed root chain); its other chains go into `chains`. */
  build(chains: Map<string, string[]>): string[] {
    const root: string[] = [];
    const groups = [...this.groups.values()].sort(
      (a, b) => compareAddresses(a.address, b.address) || PROTO[a.protocol].number - PROTO[b.protocol].number,
    );
    for (const g of groups) {
      g.entries.sort((a, b) => a.port - b.port);
      const cost = costOf(g.entries);
      if (cost <= INLINE_RULES) {
        for (const e of g.entries) for (const r of e.rules) root.push(formatRule(this.portRule(r, g, String(e.port), true)));
        continue;
      }
      const name = this.chainFor(g, 0, 65535);
      root.push(formatRule(this.groupJump(g, name)));
      chains.set(name, this.node(g, 0, 16, g.entries, chains));
    }
    return root;
  }

  /**
   * The rules of the chain for the aligned range [lo, lo + 2^bits). The
   * binary trie over port bits is cut where a subtree's tier (how many
   * TIER_FACTORs of LEAF_RULES its rules need) drops below this chain's: those
   * subtrees are the chain's children. A tier depends only on the rules inside
   * the range, so adding a port can change only the chains on its own path.
   */
  private node(g: Group, lo: number, bits: number, entries: Entry[], chains: Map<string, string[]>): string[] {
    const rules: string[] = [];
    const inline = (list: Entry[]) => {
      for (const e of list) for (const r of e.rules) rules.push(formatRule(this.portRule(r, g, String(e.port), false)));
    };
    const t = tier(costOf(entries));
    if (t === 0) {
      inline(entries);
      return rules;
    }
    const frontier: Span[] = [];
    const descend = (span: Span) => {
      if (span.bits === 0) return void frontier.push(span);
      for (const half of halves(span)) {
        if (tier(costOf(half.entries)) < t) frontier.push(half);
        else descend(half);
      }
    };
    descend({ lo, bits, entries });
    for (const span of frontier) {
      if (span.bits === 0 || costOf(span.entries) <= INLINE_RULES) {
        inline(span.entries);
        continue;
      }
      const hi = span.lo + 2 ** span.bits - 1;
      const name = this.chainFor(g, span.lo, hi);
      rules.push(formatRule(this.rangeJump(g, `${span.lo}:${hi}`, name)));
      chains.set(name, this.node(g, span.lo, span.bits, span.entries, chains));
    }
    return rules;
  }

  private chainFor(g: Group, lo: number, hi: number): string {
    return chainName(this.spec.prefix, `${this.spec.prefix}|${this.family}|${g.address}|${g.protocol}|${lo}-${hi}`);
  }

  private dispatchComment(g: Group, range?: string): string {
    return `dispatch/${PROTO[g.protocol].name}/${g.address}${range ? `/${range.replace(':', '-')}` : ''}`;
  }

  private groupJump(g: Group, chain: string): RuleSpec {
    const comment = this.dispatchComment(g);
    if (this.spec.kind === 'dst') return { d: FAMILY_TEXT[this.family].host(g.address), p: PROTO[g.protocol].name, comment, target: chain };
    return { comment, ct: { proto: PROTO[g.protocol].number, origdst: g.address }, target: chain };
  }

  private rangeJump(g: Group, range: string, chain: string): RuleSpec {
    const comment = this.dispatchComment(g, range);
    if (this.spec.kind === 'dst') return { p: PROTO[g.protocol].name, dport: range, comment, target: chain };
    return { comment, ct: { origdstport: range }, target: chain };
  }

  /** A port's rule with the matches that select it; `atRoot` adds the group's address and protocol. */
  private portRule(r: RuleSpec, g: Group, port: string, atRoot: boolean): RuleSpec {
    if (this.spec.kind === 'dst') {
      return { ...r, ...(atRoot ? { d: FAMILY_TEXT[this.family].host(g.address) } : {}), p: PROTO[g.protocol].name, dport: port };
    }
    const ct = atRoot ? { proto: PROTO[g.protocol].number, origdst: g.address, origdstport: port } : { origdstport: port };
    return { ...r, ct: { ...r.ct, ...ct } };
  }
}

function costOf(entries: Entry[]): number {
  let n = 0;
  for (const e of entries) n += e.rules.length;
  return n;
}

interface Span {
  lo: number;
  bits: number;
  /** Sorted by port, all within [lo, lo + 2^bits). */
  entries: Entry[];
}

function halves(span: Span): Span[] {
  const bits = span.bits - 1;
  const mid = span.lo + 2 ** bits;
  const cut = span.entries.findIndex((e) => e.port >= mid);
  const low = cut < 0 ? span.entries : span.entries.slice(0, cut);
  const high = cut < 0 ? [] : span.entries.slice(cut);
  return [
    { lo: span.lo, bits, entries: low },
    { lo: mid, bits, entries: high },
  ].filter((s) => s.entries.length > 0);
}

function tier(cost: number): number {
  let t = 0;
  for (let cap = LEAF_RULES; cost > cap; cap *= TIER_FACTOR) t++;
  return t;
}

// ---------------------------------------------------------------------------
// The ruleset

export function renderRuleset(model: FamilyModel, config: RenderConfig): Ruleset {
  const { markBit } = config;
  if (!Number.isInteger(markBit) || markBit <= 0 || markBit > 0xffffffff) throw new RangeError(`markBit ${markBit} is not a mark mask`);
  const family = model.family;
  const text = FAMILY_TEXT[family];
  const mark = `${hex(markBit)}/${hex(markBit)}`;

  const natChains = new Map<string, string[]>();
  const filterChains = new Map<string, string[]>();
  const nat = new TreeBuilder({ kind: 'dst', prefix: 'PIER-SVCS-' }, family);
  const forward = new TreeBuilder({ kind: 'ct', prefix: 'PIER-FWD-' }, family);
  const noEndpoints = new TreeBuilder({ kind: 'dst', prefix: 'PIER-NOEP-' }, family);

  const plans = [...model.ports].sort((a, b) => compareText(a.key, b.key));
  for (const plan of plans) {
    const comment = plan.comment;
    const endpoints = [...plan.endpoints].sort((a, b) => compareAddresses(a.address, b.address) || a.port - b.port);
    const frontends = plan.frontends;
    if (endpoints.length === 0) {
      const reject: RuleSpec = { comment, target: `REJECT --reject-with ${text.reject}` };
      for (const f of frontends) noEndpoints.add(f.address, plan.protocol, { port: f.port, rules: [reject] });
      continue;
    }

    // nat: mark what must be masqueraded, then DNAT, spread when several.
    const marks: RuleSpec[] = plan.masquerade
      ? [{ comment, target: `MARK --set-xmark ${mark}` }]
      : // Local keeps the client's address, except when a pod reaches itself
        // through the load balancer: without masquerade its reply would not
        // come back through this node's conntrack.
        endpoints.map((e) => ({ s: text.host(e.address), comment, target: `MARK --set-xmark ${mark}` }));
    const dnats: RuleSpec[] = endpoints.map((e, i) => ({
      p: PROTO[plan.protocol].name,
      comment,
      ...(i < endpoints.length - 1 ? { probability: probability(endpoints.length - i) } : {}),
      target: `DNAT --to-destination ${text.dnat(e)}`,
    }));
    // A port whose rules are few sits in the dispatch tree; one chain per port
    // would make every full restore pay for a user chain.
    const own = [...marks, ...dnats];
    let natEntry: RuleSpec[] = own;
    if (own.length > PORT_CHAIN_RULES) {
      const svcChain = chainName('PIER-SVC-', `svc|${plan.key}`);
      natChains.set(svcChain, own.map(formatRule));
      natEntry = [{ comment, target: svcChain }];
    }
    for (const f of frontends) nat.add(f.address, plan.protocol, { port: f.port, rules: natEntry.map(stripProto) });

    // filter: accept the DNATed connection, checking its source when restricted.
    let accept: RuleSpec[] = [{ comment, target: 'ACCEPT' }];
    if (plan.restrictSources) {
      accept = [
        ...plan.sourceRanges.map((cidr): RuleSpec => ({ comment, ct: { origsrc: text.ctNet(cidr) }, target: 'ACCEPT' })),
        { comment, target: 'DROP' },
      ];
      if (accept.length > PORT_CHAIN_RULES) {
        const srcChain = chainName('PIER-SRC-', `src|${plan.key}`);
        filterChains.set(srcChain, accept.map(formatRule));
        accept = [{ comment, target: srcChain }];
      }
    }
    for (const f of frontends) forward.add(f.address, plan.protocol, { port: f.port, rules: accept });
  }

  const tag = (name: string) => `pier/${name}`;
  natChains.set(SERVICES_CHAIN, nat.build(natChains));
  natChains.set(POSTROUTING_CHAIN, [
    formatRule({ comment: tag('postrouting'), notMark: mark, target: 'RETURN' }),
    // XOR clears the bit: only marked packets get here.
    formatRule({ comment: tag('postrouting'), target: `MARK --set-xmark ${hex(markBit)}/0x0` }),
    formatRule({ comment: tag('postrouting'), target: 'MASQUERADE' }),
  ]);
  natChains.set(CANARY_CHAIN, [CANARY_RULE]);

  filterChains.set(FORWARD_CHAIN, [
    // Most forwarded packets are not DNATed at all: one rule sends them back.
    formatRule({ comment: tag('forward'), ct: { notState: 'DNAT' }, target: 'RETURN' }),
    ...forward.build(filterChains),
  ]);
  filterChains.set(NOENDPOINTS_CHAIN, noEndpoints.build(filterChains));
  filterChains.set(CANARY_CHAIN, [CANARY_RULE]);

  return {
    family,
    tables: {
      nat: {
        chains: sortChains(natChains),
        jumps: [
          { chain: 'PREROUTING', rule: formatRule({ comment: tag('services'), target: SERVICES_CHAIN }) },
          { chain: 'OUTPUT', rule: formatRule({ comment: tag('services'), target: SERVICES_CHAIN }) },
          { chain: 'POSTROUTING', rule: formatRule({ comment: tag('postrouting'), target: POSTROUTING_CHAIN }) },
        ],
      },
      filter: {
        chains: sortChains(filterChains),
        jumps: [
          { chain: 'INPUT', rule: formatRule({ comment: tag('noendpoints'), ct: { state: 'NEW' }, target: NOENDPOINTS_CHAIN }) },
          { chain: 'FORWARD', rule: formatRule({ comment: tag('forward'), target: FORWARD_CHAIN }) },
          { chain: 'OUTPUT', rule: formatRule({ comment: tag('noendpoints'), ct: { state: 'NEW' }, target: NOENDPOINTS_CHAIN }) },
        ],
      },
    },
  };
}

/** The tree adds `-p` together with the port match; a DNAT rule's own `-p` would repeat it. */
function stripProto(r: RuleSpec): RuleSpec {
  const { p: _p, ...rest } = r;
  return rest;
}

function sortChains(chains: Map<string, string[]>): Map<string, string[]> {
  return new Map([...chains.entries()].sort(([a], [b]) => compareText(a, b)));
}
