// From one family's model to the iptables rules that serve it, in pier's own
// chains. Pure: the applier diffs and writes what this returns.
//
// Layout (klipper-lb's three rule kinds, in the host namespace):
//
//   nat    PREROUTING, OUTPUT -> PIER-SERVICES
//            -d <address> -p <proto>      -> PIER-SVCS-<h>  one per address and protocol
//              --dport <lo:hi>           -> PIER-SVCS-<h>  aligned port ranges, as deep as needed
//                --dport <port>  [CONNMARK] DNAT          a port with few endpoints: inline,
//                                                         spread with -m statistic
//                --dport <port>          -> PIER-SVC-<h>  a port with many: a chain of its own
//                with ClientIP affinity, per endpoint first a DNAT for the clients
//                its xt_recent list <h>-PIER-AFF holds, then the spread remembers
//          POSTROUTING -> PIER-POSTROUTING: masquerade connections with the masquerade bit
//   filter FORWARD -> PIER-FORWARD: accept pier's DNATed connections. Those
//            to a port any source may use carry a connection mark, set by
//            their nat rules, and are accepted at its first rule. Ports with
//            source ranges form a tree again, matched by the connection's
//            original destination (conntrack): it accepts those ranges (and
//            marks the connection) and drops the rest (inline when the list
//            is short, else in PIER-SRC-<h>)
//          INPUT, OUTPUT (new connections) -> PIER-NOENDPOINTS: REJECT frontends
//            whose port has no usable endpoint (the same tree again)
//          INPUT, OUTPUT (new connections) -> PIER-SOURCES: the source ranges
//            again, for the DNATed connections FORWARD never sees: those a
//            client on the node opens, and those DNATed to an endpoint on the
//            host network. Drop only: allowed sources RETURN (inline, or in
//            PIER-LSRC-<h>) and the host's own INPUT and OUTPUT rules still
//            apply to them. Only ports with source ranges are in this tree.
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
// Rules are made as data (rule.ts Rule) and spelled by rule.ts spell(), the
// one place that knows how iptables-save prints them back.
//
// The pieces (servedRules, servedEntries, buildGroupTree, assembleRuleset) are
// exported for the incremental renderer (renderer.ts), which keeps each port's
// rule texts and each group's tree between syncs and rebuilds only the chains a
// change reaches; the tests' oracle runs them once, from scratch.
import type { Family } from '../../lib/contract.ts';
import { compareAddresses, compareText, type Endpoint, type FamilyModel, type Protocol, type ServedPort } from '../engine/model.ts';
import { PROTOCOL } from '../../lib/protocols.ts';
import { chainName } from '../names.ts';
import { hex, saveString, spell, type RecentMatch, type Rule } from './rule.ts';

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

/**
 * The connection-mark bits pier's nat rules set, one bit each, e.g. 0x2000
 * and 0x1000. Connection marks, not packet marks: set at a connection's
 * first packet, they cost no rule to clear (a packet mark would have to be
 * cleared before MASQUERADE, or a tunnel's outer packet would carry it), and
 * one CONNMARK sets both.
 */
export interface MarkBits {
  /** PIER-FORWARD accepts the connection at its first rule. */
  accept: number;
  /** PIER-POSTROUTING masquerades the connection. */
  masquerade: number;
}

export interface RenderConfig {
  marks: MarkBits;
}

export const CHAIN_PREFIX = 'PIER-';
export const MAX_CHAIN_NAME = 28;
export const SERVICES_CHAIN = 'PIER-SERVICES';
export const POSTROUTING_CHAIN = 'PIER-POSTROUTING';
export const FORWARD_CHAIN = 'PIER-FORWARD';
export const NOENDPOINTS_CHAIN = 'PIER-NOENDPOINTS';
export const SOURCES_CHAIN = 'PIER-SOURCES';
export const CANARY_CHAIN = 'PIER-CANARY';
/** Where the forward tree sends a connection it accepts: marked, so that its later packets skip the tree. */
export const ACCEPT_CHAIN = 'PIER-ACCEPT';
/**
 * The canary holds a rule, not just a chain: `iptables -F` empties chains
 * without deleting them, and the applier must notice that too.
 */
export const CANARY_RULE = spell({ comment: saveString('pier/canary'), target: 'RETURN' });

/** Rules a leaf chain may hold. */
export const LEAF_RULES = 32;
/** Each tier of the tree holds about this many times the rules of the tier below. */
export const TIER_FACTOR = 8;
/** A port range this small sits in its parent chain instead of a chain of its own. */
export const INLINE_RULES = 4;
/** A port gets a chain of its own (PIER-SVC-, PIER-SRC-, PIER-LSRC-) only when its rules are more than this. */
export const PORT_CHAIN_RULES = 8;

// ---------------------------------------------------------------------------
// Families

interface FamilyText {
  host: (a: string) => string;
  /** conntrack prints a full-length prefix as a bare address. */
  ctNet: (cidr: string) => string;
  /** The DNAT target to an endpoint. */
  dnat: (e: Endpoint) => string;
  /** The REJECT target of a port without endpoints, UDP and SCTP (TCP gets TCP_RESET). */
  unreachable: string;
  /** The recent match's default --mask, which iptables-save prints. */
  fullMask: string;
}

const FAMILY_TEXT: Record<Family, FamilyText> = {
  ipv4: {
    host: (a) => [a, '/32'].join(''),
    ctNet: (c) => (c.endsWith('/32') ? c.slice(0, -3) : c),
    dnat: (e) => ['DNAT --to-destination ', e.address, ':', e.port].join(''),
    unreachable: 'REJECT --reject-with icmp-port-unreachable',
    fullMask: '255.255.255.255',
  },
  ipv6: {
    host: (a) => [a, '/128'].join(''),
    ctNet: (c) => (c.endsWith('/128') ? c.slice(0, -4) : c),
    dnat: (e) => ['DNAT --to-destination [', e.address, ']:', e.port].join(''),
    unreachable: 'REJECT --reject-with icmp6-port-unreachable',
    fullMask: 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff',
  },
};

/**
 * A TCP port without endpoints answers with a reset, as a closed port does:
 * the kernel sends ICMP errors to a client in a burst of 6, then one a second
 * (net.ipv4.icmp_ratelimit, net.ipv6.icmp.ratelimit), so a client retrying
 * an ICMP-refused port sees its 7th SYN go unanswered for a second.
 */
const TCP_RESET = 'REJECT --reject-with tcp-reset';

/** The CONNMARK targets a port's nat rules take, per pair of mark bits. */
interface MarkTargets {
  accept: string;
  masquerade: string;
  both: string;
}
const markTargetsCache = new Map<string, MarkTargets>();

function markTargets(marks: MarkBits): MarkTargets {
  const key = `${marks.accept}/${marks.masquerade}`;
  let t = markTargetsCache.get(key);
  if (!t) {
    const set = (bits: number) => `CONNMARK --set-xmark ${hex(bits)}/${hex(bits)}`;
    markTargetsCache.set(key, (t = { accept: set(marks.accept), masquerade: set(marks.masquerade), both: set(marks.accept | marks.masquerade) }));
  }
  return t;
}

// ---------------------------------------------------------------------------
// One port's rules

/** The dispatch trees: nat, filter FORWARD and sources (by conntrack), and filter no-endpoints. */
export type TreeName = 'nat' | 'forward' | 'noEndpoints' | 'sources';
export const TREES: readonly TreeName[] = ['nat', 'forward', 'noEndpoints', 'sources'];

/** One value per tree, each made afresh. */
export function perTree<T>(make: (tree: TreeName) => T): Record<TreeName, T> {
  return { nat: make('nat'), forward: make('forward'), noEndpoints: make('noEndpoints'), sources: make('sources') };
}

/** How a tree matches a packet: by its destination now (nat, INPUT) or by the connection's original one (after DNAT). */
type TreeKind = 'dst' | 'ct';

const TREE: Record<TreeName, { kind: TreeKind; prefix: string; table: TableName }> = {
  nat: { kind: 'dst', prefix: 'PIER-SVCS-', table: 'nat' },
  forward: { kind: 'ct', prefix: 'PIER-FWD-', table: 'filter' },
  noEndpoints: { kind: 'dst', prefix: 'PIER-NOEP-', table: 'filter' },
  sources: { kind: 'ct', prefix: 'PIER-SRCS-', table: 'filter' },
};

/**
 * One rule of a port, before the tree adds the matches that select the port
 * (and, at a tree's root, its address and protocol): atPort(). Made while a
 * served port is rendered, not kept: what is kept is the text (PortEntry.inner).
 */
export interface PortRule extends Pick<Rule, 's' | 'oneIn' | 'recent' | 'comment' | 'target'> {
  /** The connection's original source (ct trees). */
  origsrc?: string;
}

/** One frontend's rules in one tree: what a tree chain lists for that port. */
export interface PortEntry {
  port: number;
  /** The rule texts for this port inside a range chain: the very strings the chain holds. */
  inner: string[];
  /** Where they come from: the few rules that sit at a tree's root are formatted again from it. */
  served: ServedPort;
}

/** What one served port contributes to a family's ruleset. */
export interface ServedRules {
  /** Its rules in each tree it appears in. */
  trees: Partial<Record<TreeName, readonly PortRule[]>>;
  /** Chains of the served port's own (PIER-SVC-, PIER-SRC-), by table. */
  own: { table: TableName; name: string; rules: string[] }[];
}

/**
 * The rules of one served port, for every tree it appears in. Pure.
 *
 * Comments: no rule on the path of a connection pier serves has one: not
 * the fixed rules, the dispatch rules, a port's marks or its DNAT rules,
 * whose addresses and ports say what they serve (`pier trace` names the
 * Service). One per DNAT rule would make the 10,000-port payload, and so
 * its restore, a fifth larger. The rules that refuse or admit by source
 * (REJECT, the source ranges' accept and drop) name the Service.
 */
export function servedRules(served: ServedPort, family: Family, marks: MarkBits): ServedRules {
  const proto = PROTOCOL[served.protocol].word;
  const text = FAMILY_TEXT[family];
  const comment = saveString(served.comment);
  const endpoints = sortedEndpoints(served.endpoints);
  const own: ServedRules['own'] = [];
  if (endpoints.length === 0) {
    return { trees: { noEndpoints: [portRule(served.protocol === 'TCP' ? TCP_RESET : text.unreachable, { comment })] }, own };
  }

  // nat: mark the connection as accepted when any source may use the port,
  // and for masquerade when it must be; then DNAT, spread when several.
  const set = markTargets(marks);
  // Local keeps the client's address, except when a pod reaches itself
  // through the load balancer: without masquerade its reply would not come
  // back through this node's conntrack.
  const accept = !served.restrictSources;
  const hairpins = served.masquerade ? 0 : endpoints.length;
  const markRules = (accept || served.masquerade ? 1 : 0) + hairpins;
  const sticky = served.affinity > 0;
  let nat = new Array<PortRule>(markRules + (sticky ? 2 : 1) * endpoints.length);
  let k = 0;
  // Marked in nat, which sees only a connection's first packet, the
  // connection skips the FORWARD tree: PIER-FORWARD accepts it by its mark
  // at its first rule (bench:connect, "TCP connect").
  if (accept || served.masquerade) nat[k++] = portRule(accept && served.masquerade ? set.both : accept ? set.accept : set.masquerade);
  for (let i = 0; i < hairpins; i++) nat[k++] = portRule(set.masquerade, { s: text.host(endpoints[i]!.address) });
  // ClientIP affinity: a client an endpoint's list remembers goes back to
  // it (and is remembered afresh); a new one is spread and remembered where
  // it lands. A list per endpoint, so an endpoint's rules leaving end its
  // clients' affinity with it.
  const lists = sticky ? endpoints.map((e) => affinityList(served, e, text)) : undefined;
  if (lists) for (let i = 0; i < endpoints.length; i++) nat[k++] = portRule(text.dnat(endpoints[i]!), { recent: lists[i]!.update });
  for (let i = 0; i < endpoints.length; i++) {
    const oneIn = i < endpoints.length - 1 ? endpoints.length - i : undefined;
    nat[k++] = portRule(text.dnat(endpoints[i]!), { oneIn, recent: lists?.[i]!.set });
  }
  // A port whose rules are few sits in the dispatch tree; one chain per port
  // would make every full restore pay for a user chain.
  if (nat.length > PORT_CHAIN_RULES) {
    const name = chainName('PIER-SVC-', `svc|${served.key}`);
    const rules = nat.map((r, i) => spell(i < markRules ? { s: r.s, target: r.target } : { protocol: proto, oneIn: r.oneIn, recent: r.recent, target: r.target }));
    own.push({ table: 'nat', name, rules });
    nat = [portRule(name)];
  }

  // filter: a restricted port's connection is accepted by the FORWARD tree,
  // which checks its source.
  if (!served.restrictSources) return { trees: { nat }, own };
  const forward = sourceCheck(served, comment, text, FORWARD_CHECK, own);
  // sources: the same ranges for connections FORWARD does not see; an
  // allowed one goes on to the host's own rules.
  const sources = sourceCheck(served, comment, text, SOURCES_CHECK, own);
  return { trees: { nat, forward, sources }, own };
}

/** One endpoint's xt_recent list of a served port with affinity. */
interface AffinityList {
  /** Matches a client the list holds, not older than the timeout, and refreshes it. */
  update: RecentMatch;
  /** Remembers the client. */
  set: RecentMatch;
}

/** A PortRule, always of one shape: spell() then reads every rule's fields the same way. */
function portRule(target: string, f: Omit<PortRule, 'target'> = {}): PortRule {
  return { s: f.s, origsrc: f.origsrc, oneIn: f.oneIn, recent: f.recent, comment: f.comment, target };
}

/**
 * The xt_recent list of the clients of one endpoint of a served port. The
 * hash comes first: for every packet the kernel finds a rule's list by
 * comparing its name with each list of the namespace in turn, and names
 * that differ at their first byte end each comparison there.
 */
export function affinityListName(served: ServedPort, e: Endpoint): string {
  return `${chainName('', `aff|${served.key}|${e.address}|${e.port}`)}-PIER-AFF`;
}

function affinityList(served: ServedPort, e: Endpoint, text: FamilyText): AffinityList {
  const name = affinityListName(served, e);
  return { update: { mode: 'update', seconds: served.affinity, name, mask: text.fullMask }, set: { mode: 'set', name, mask: text.fullMask } };
}

/** How a tree checks sources: what an allowed source gets, and the port's own chain when the list is long. */
interface SourceCheck {
  allow: typeof ACCEPT_CHAIN | 'RETURN';
  prefix: string;
  /** Hashed with the served port's key into the chain's name. */
  seed: string;
}
/** FORWARD accepts, even under a DROP policy. */
const FORWARD_CHECK: SourceCheck = { allow: ACCEPT_CHAIN, prefix: 'PIER-SRC-', seed: 'src' };
/** INPUT and OUTPUT only drop: the host's own rules still see allowed connections. */
const SOURCES_CHECK: SourceCheck = { allow: 'RETURN', prefix: 'PIER-LSRC-', seed: 'lsrc' };

/** A restricted port's source check in one tree: `allow` for each listed range, DROP for the rest. */
function sourceCheck(served: ServedPort, comment: string, text: FamilyText, check: SourceCheck, own: ServedRules['own']): PortRule[] {
  const rules = [...served.sourceRanges.map((cidr) => portRule(check.allow, { origsrc: text.ctNet(cidr), comment })), portRule('DROP', { comment })];
  if (rules.length <= PORT_CHAIN_RULES) return rules;
  const name = chainName(check.prefix, `${check.seed}|${served.key}`);
  // No port to match in the port's own chain: the tree did.
  own.push({ table: 'filter', name, rules: rules.map((r) => spell({ conntrack: r.origsrc ? { origsrc: r.origsrc } : undefined, comment, target: r.target })) });
  return [portRule(name, { comment })];
}

/** A served port's entries in one tree, one per frontend, with their text for a range chain. */
export function servedEntries(served: ServedPort, tree: TreeName, rules: readonly PortRule[]): PortEntry[] {
  return served.frontends.map((f) => ({ port: f.port, inner: portTexts(tree, served.protocol, rules, f.port, undefined), served }));
}

/** A port's rules as a tree chain lists them; `root` adds the group's address and protocol match. */
function portTexts(tree: TreeName, protocol: Protocol, rules: readonly PortRule[], port: number, root: string | undefined): string[] {
  const out = new Array<string>(rules.length);
  for (let i = 0; i < rules.length; i++) out[i] = spell(select(tree, protocol, rules[i]!, port, root));
  return out;
}

/**
 * A tree's rule: `r` with the matches that select its port (or a range of
 * ports), and at the tree's root its address and protocol. A dst tree
 * matches the packet's destination, a ct tree the connection's original one
 * (after DNAT).
 */
function select(tree: TreeName, protocol: Protocol, r: PortRule, port: number | string | undefined, root: string | undefined): Rule {
  const p = PROTOCOL[protocol];
  // Both of one shape (every field, in one order): spell() reads them alike.
  if (TREE[tree].kind === 'dst') return { s: r.s, d: root, protocol: p.word, dport: port, conntrack: undefined, connmark: undefined, oneIn: r.oneIn, recent: r.recent, comment: r.comment, target: r.target };
  const conntrack = { notState: undefined, state: undefined, proto: root ? p.number : undefined, origsrc: r.origsrc, origdst: root, origdstport: port };
  return { s: undefined, d: undefined, protocol: undefined, dport: undefined, conntrack, connmark: undefined, oneIn: undefined, recent: undefined, comment: r.comment, target: r.target };
}

function sortedEndpoints(endpoints: readonly Endpoint[]): readonly Endpoint[] {
  const compare = (a: Endpoint, b: Endpoint) => compareAddresses(a.address, b.address) || a.port - b.port;
  // The model hands them over sorted; only other callers pay for a copy.
  for (let i = 1; i < endpoints.length; i++) if (compare(endpoints[i - 1]!, endpoints[i]!) > 0) return [...endpoints].sort(compare);
  return endpoints;
}

// ---------------------------------------------------------------------------
// Dispatch trees

/** One chain of a group's tree, and the chains it jumps to. */
export interface TreeChain {
  rules: string[];
  children: string[];
}

/** What one (address, protocol) group adds to a tree: rules in the tree's root chain, and its chains below. */
export interface GroupTree {
  root: string[];
  chains: Map<string, TreeChain>;
}

/** A group's previous tree, and which of its ports changed since: chains whose range holds none of them are taken over as they are. */
export interface GroupReuse {
  tree: GroupTree;
  /** Sorted. */
  changedPorts: readonly number[];
}

/**
 * The chains for one address and protocol. `entries` are sorted by port.
 *
 * Each chain covers an aligned port range [lo, lo + 2^bits). The binary trie
 * over port bits is cut where a subtree's tier (how many TIER_FACTORs of
 * LEAF_RULES its rules need) drops below its chain's: those subtrees are the
 * chain's children. A tier depends only on the rules inside the range, so
 * adding a port can change only the chains on its own path, and a chain whose
 * range holds no changed port is the chain it was.
 */
export function buildGroupTree(
  tree: TreeName,
  family: Family,
  marks: MarkBits,
  address: string,
  protocol: Protocol,
  entries: readonly PortEntry[],
  reuse?: GroupReuse,
): GroupTree {
  const group = new GroupTreeBuilder(tree, family, marks, address, protocol, entries, reuse);
  const root: string[] = [];
  const n = entries.length;
  if (group.cost(0, n) <= INLINE_RULES) group.inline(root, 0, n, true);
  else root.push(spell(select(tree, protocol, portRule(group.chain(0, 16, 0, n)), undefined, group.root)));
  return { root: reuse && sameStrings(reuse.tree.root, root) ? reuse.tree.root : root, chains: group.chains };
}

/** buildGroupTree's state while it builds one group's chains. */
class GroupTreeBuilder {
  readonly chains = new Map<string, TreeChain>();
  /** What the root chain's rules match the group by: the host address (dst trees) or the address (ct trees). */
  readonly root: string;
  private readonly prefix: string;
  /** costs[i]: the rules of entries [0, i). */
  private readonly costs: number[];

  private readonly tree: TreeName;
  private readonly family: Family;
  private readonly marks: MarkBits;
  private readonly address: string;
  private readonly protocol: Protocol;
  private readonly entries: readonly PortEntry[];
  private readonly reuse: GroupReuse | undefined;

  constructor(tree: TreeName, family: Family, marks: MarkBits, address: string, protocol: Protocol, entries: readonly PortEntry[], reuse: GroupReuse | undefined) {
    this.tree = tree;
    this.family = family;
    this.marks = marks;
    this.address = address;
    this.protocol = protocol;
    this.entries = entries;
    this.reuse = reuse;
    this.prefix = TREE[tree].prefix;
    this.root = TREE[tree].kind === 'dst' ? FAMILY_TEXT[family].host(address) : address;
    const costs = new Array<number>(entries.length + 1);
    costs[0] = 0;
    for (let i = 0; i < entries.length; i++) costs[i + 1] = costs[i]! + entries[i]!.inner.length;
    this.costs = costs;
  }

  /** The rules of entries [i, j). */
  cost(i: number, j: number): number {
    return this.costs[j]! - this.costs[i]!;
  }

  /** Appends the rules of entries [i, j) to `rules`. */
  inline(rules: string[], i: number, j: number, atRoot: boolean): void {
    for (let k = i; k < j; k++) {
      const e = this.entries[k]!;
      // Only a group of a few rules sits in the root chain: formatting its
      // served ports' rules again costs less than keeping them.
      const texts = atRoot ? portTexts(this.tree, this.protocol, servedRules(e.served, this.family, this.marks).trees[this.tree]!, e.port, this.root) : e.inner;
      for (const t of texts) rules.push(t);
    }
  }

  /** Builds (or takes over) the chain for [lo, lo + 2^bits) holding entries [i, j); returns its name. */
  chain(lo: number, bits: number, i: number, j: number): string {
    const hi = lo + 2 ** bits - 1;
    const name = chainName(this.prefix, `${this.prefix}|${this.family}|${this.address}|${this.protocol}|${lo}-${hi}`);
    const reuse = this.reuse;
    if (reuse && reuse.tree.chains.has(name) && !this.changedWithin(lo, hi)) {
      this.takeOver(name);
      return name;
    }
    const rules: string[] = [];
    const children: string[] = [];
    const t = tier(this.cost(i, j));
    if (t === 0) this.inline(rules, i, j, false);
    else {
      const frontier = this.frontier(t, lo, bits, i, j);
      for (let f = 0; f < frontier.length; f += 4) {
        const [slo, sbits, si, sj] = [frontier[f]!, frontier[f + 1]!, frontier[f + 2]!, frontier[f + 3]!];
        if (sbits === 0 || this.cost(si, sj) <= INLINE_RULES) {
          this.inline(rules, si, sj, false);
          continue;
        }
        const child = this.chain(slo, sbits, si, sj);
        rules.push(spell(select(this.tree, this.protocol, portRule(child), `${slo}:${slo + 2 ** sbits - 1}`, undefined)));
        children.push(child);
      }
    }
    // A rebuilt chain that came out the same keeps its array: the applier's
    // diff then skips it by identity.
    const before = reuse?.tree.chains.get(name);
    this.chains.set(name, { rules: before && sameStrings(before.rules, rules) ? before.rules : rules.slice(), children: children.length > 0 ? children.slice() : NO_CHILDREN });
    return name;
  }

  /**
   * The subtrees below a chain of tier `t` over [lo, lo + 2^bits): the
   * binary trie over port bits cut where a subtree's tier drops below `t`,
   * as flat (lo, bits, i, j) quadruples in port order.
   */
  private frontier(t: number, lo: number, bits: number, i: number, j: number): number[] {
    const out: number[] = [];
    const descend = (lo: number, bits: number, i: number, j: number) => {
      if (bits === 0) return void out.push(lo, bits, i, j);
      const mid = lo + 2 ** (bits - 1);
      const cut = this.lowerBound(mid, i, j);
      if (cut > i) {
        if (tier(this.cost(i, cut)) < t) out.push(lo, bits - 1, i, cut);
        else descend(lo, bits - 1, i, cut);
      }
      if (j > cut) {
        if (tier(this.cost(cut, j)) < t) out.push(mid, bits - 1, cut, j);
        else descend(mid, bits - 1, cut, j);
      }
    };
    descend(lo, bits, i, j);
    return out;
  }

  /** First index in [i, j) whose port is >= port. */
  private lowerBound(port: number, i: number, j: number): number {
    while (i < j) {
      const mid = (i + j) >>> 1;
      if (this.entries[mid]!.port < port) i = mid + 1;
      else j = mid;
    }
    return i;
  }

  /** Whether a changed port lies in [lo, hi]. */
  private changedWithin(lo: number, hi: number): boolean {
    const ports = this.reuse!.changedPorts;
    let a = 0;
    let b = ports.length;
    while (a < b) {
      const mid = (a + b) >>> 1;
      if (ports[mid]! < lo) a = mid + 1;
      else b = mid;
    }
    return a < ports.length && ports[a]! <= hi;
  }

  /** Keeps a chain of the previous tree, and its chains below. */
  private takeOver(name: string): void {
    const c = this.reuse!.tree.chains.get(name)!;
    this.chains.set(name, c);
    for (const child of c.children) this.takeOver(child);
  }
}

const NO_CHILDREN: string[] = [];

function tier(cost: number): number {
  let t = 0;
  for (let cap = LEAF_RULES; cost > cap; cap *= TIER_FACTOR) t++;
  return t;
}

export function sameStrings(a: readonly string[] | undefined, b: readonly string[]): boolean {
  if (a === b) return true;
  if (!a || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** Groups in the order the root chain lists them: by address, then protocol number. */
export function compareGroups(a: { address: string; protocol: Protocol }, b: { address: string; protocol: Protocol }): number {
  return compareAddresses(a.address, b.address) || PROTOCOL[a.protocol].number - PROTOCOL[b.protocol].number;
}

// ---------------------------------------------------------------------------
// The ruleset

/** The parts of a ruleset that do not depend on the model. */
export interface FixedRules {
  postrouting: string[];
  /**
   * The rules each tree's root chain starts with: most packets that reach
   * PIER-FORWARD or PIER-SOURCES were not DNATed, and one rule sends them
   * back; in PIER-FORWARD, the rule before it accepts pier's connections
   * by their mark.
   */
  heads: Record<TreeName, readonly string[]>;
  /** PIER-ACCEPT: marks the connection, then accepts. */
  accept: string[];
  canary: string[];
  nat: Jump[];
  filter: Jump[];
}

const fixedRulesCache = new Map<string, FixedRules>();

/** One bit each, and not the same bit: else a RangeError naming them. */
function checkMarkBits(marks: MarkBits): void {
  const one = (b: number) => Number.isInteger(b) && b > 0 && b <= 0x80000000 && (b & (b - 1)) === 0;
  if (!one(marks.accept) || !one(marks.masquerade)) throw new RangeError(`mark bits ${hex(marks.accept)} and ${hex(marks.masquerade)}: each must be a single bit`);
  if (marks.accept === marks.masquerade) throw new RangeError(`mark bits: accept and masquerade are both ${hex(marks.accept)}; they must differ`);
}

export function fixedRules(marks: MarkBits): FixedRules {
  const key = `${marks.accept}/${marks.masquerade}`;
  const known = fixedRulesCache.get(key);
  if (known) return known;
  checkMarkBits(marks);
  const accepted = `${hex(marks.accept)}/${hex(marks.accept)}`;
  const fixed: FixedRules = {
    postrouting: [spell({ connmark: `${hex(marks.masquerade)}/${hex(marks.masquerade)}`, target: 'MASQUERADE' })],
    heads: {
      nat: [],
      // Every packet of pier's connections, both ways, is accepted at the
      // first rule, by the mark its nat rules or PIER-ACCEPT gave the
      // connection (bench:connect); the rest of the traffic leaves at the second.
      forward: [spell({ connmark: accepted, target: 'ACCEPT' }), spell({ conntrack: { notState: 'DNAT' }, target: 'RETURN' })],
      noEndpoints: [],
      sources: [spell({ conntrack: { notState: 'DNAT' }, target: 'RETURN' })],
    },
    // A connection keeps the mark for its life: once accepted it stays
    // accepted when its Service's source ranges shrink or the port goes, as
    // kube-proxy keeps established connections (conntrack ends them).
    accept: [spell({ target: markTargets(marks).accept }), spell({ target: 'ACCEPT' })],
    canary: [CANARY_RULE],
    nat: [
      { chain: 'PREROUTING', rule: spell({ target: SERVICES_CHAIN }) },
      { chain: 'OUTPUT', rule: spell({ target: SERVICES_CHAIN }) },
      { chain: 'POSTROUTING', rule: spell({ target: POSTROUTING_CHAIN }) },
    ],
    filter: [
      { chain: 'INPUT', rule: spell({ conntrack: { state: 'NEW' }, target: SOURCES_CHAIN }) },
      { chain: 'INPUT', rule: spell({ conntrack: { state: 'NEW' }, target: NOENDPOINTS_CHAIN }) },
      { chain: 'FORWARD', rule: spell({ target: FORWARD_CHAIN }) },
      { chain: 'OUTPUT', rule: spell({ conntrack: { state: 'NEW' }, target: SOURCES_CHAIN }) },
      { chain: 'OUTPUT', rule: spell({ conntrack: { state: 'NEW' }, target: NOENDPOINTS_CHAIN }) },
    ],
  };
  fixedRulesCache.set(key, fixed);
  return fixed;
}

/** Everything a ruleset is made of besides the fixed rules. */
export interface RulesetParts {
  family: Family;
  fixed: FixedRules;
  /** PIER-SERVICES: the nat tree's root. */
  services: string[];
  /** PIER-FORWARD: its head (FixedRules.heads), then the forward tree's root. */
  forward: string[];
  /** PIER-NOENDPOINTS: the no-endpoints tree's root. */
  noEndpoints: string[];
  /** PIER-SOURCES: its head, then the sources tree's root. */
  sources: string[];
  /** Every tree chain and every served port's own chain, by table. */
  chains: Record<TableName, Iterable<[string, string[]]>>;
}

export function assembleRuleset(parts: RulesetParts): Ruleset {
  const { fixed } = parts;
  const nat: [string, string[]][] = [...parts.chains.nat];
  nat.push([SERVICES_CHAIN, parts.services], [POSTROUTING_CHAIN, fixed.postrouting], [CANARY_CHAIN, fixed.canary]);
  const filter: [string, string[]][] = [...parts.chains.filter];
  filter.push([FORWARD_CHAIN, parts.forward], [ACCEPT_CHAIN, fixed.accept], [NOENDPOINTS_CHAIN, parts.noEndpoints], [SOURCES_CHAIN, parts.sources], [CANARY_CHAIN, fixed.canary]);
  const sorted = (list: [string, string[]][]) => new Map(list.sort(([a], [b]) => compareText(a, b)));
  return {
    family: parts.family,
    tables: {
      nat: { chains: sorted(nat), jumps: fixed.nat },
      filter: { chains: sorted(filter), jumps: fixed.filter },
    },
  };
}

/** Which table a tree's chains live in. */
export function treeTable(tree: TreeName): TableName {
  return TREE[tree].table;
}
