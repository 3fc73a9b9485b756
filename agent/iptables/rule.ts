// One iptables rule as data, and the one function that spells it. The
// spelling is iptables-save's: its match order, the statistic match's
// rounded probability, its quoting. The applier and the tests compare a
// ruleset with the kernel's by string equality, for the nft and the legacy
// iptables alike, so every rule pier writes goes through spell().

/** One `-m conntrack`, its options in the order iptables-save prints them. */
export interface ConntrackMatch {
  notState?: string;
  state?: string;
  /** Protocol number. */
  proto?: number;
  origsrc?: string;
  origdst?: string;
  /** A port or a range `lo:hi`. */
  origdstport?: number | string;
}

/** An xt_recent list of clients, matched by source address. */
export interface RecentMatch {
  /** `update`: a client the list holds, seen within `seconds`, refreshed; `set`: remember the client. */
  mode: 'update' | 'set';
  seconds?: number;
  name: string;
  /** The default full-length mask, which iptables-save prints. */
  mask: string;
}

export interface Rule {
  /** `-s`, with its prefix length. */
  s?: string;
  /** `-d`, with its prefix length. */
  d?: string;
  /** `-p`: the protocol's name. */
  protocol?: string;
  /** `-m <protocol> --dport`: a port or a range `lo:hi`; needs `protocol`. */
  dport?: number | string;
  conntrack?: ConntrackMatch;
  /** `-m connmark --mark value/mask`. */
  connmark?: string;
  /** `-m statistic`: one connection in this many (at least 2). */
  oneIn?: number;
  recent?: RecentMatch;
  /** Already quoted (saveString). Placed after every other match, so a packet meets only the comment of the rule it takes. */
  comment?: string;
  /** The target and its options, e.g. `DNAT --to-destination 192.0.2.1:80`. */
  target: string;
}

/**
 * A rule as iptables-save prints it. Joined from one array of pieces: a
 * string built by `+=` stays a tree of a dozen pieces, which at the 40,000
 * rules of 10,000 ports costs more memory and garbage collection than
 * copying into one flat string. Frequent runs of pieces come ready-joined
 * (protocolHead, statistic): joining costs by the piece (bench:agent,
 * "computing the rules").
 */
export function spell(r: Rule): string {
  const p = pieces;
  let n = 0;
  if (r.s) (p[n++] = '-s '), (p[n++] = r.s), (p[n++] = ' ');
  if (r.d) (p[n++] = '-d '), (p[n++] = r.d), (p[n++] = ' ');
  if (r.protocol) {
    const head = protocolHead(r.protocol);
    if (r.dport === undefined) p[n++] = head.bare;
    else (p[n++] = head.dport), (p[n++] = r.dport), (p[n++] = ' ');
  }
  const ct = r.conntrack;
  if (ct) {
    p[n++] = '-m conntrack';
    if (ct.notState) (p[n++] = ' ! --ctstate '), (p[n++] = ct.notState);
    if (ct.state) (p[n++] = ' --ctstate '), (p[n++] = ct.state);
    if (ct.proto !== undefined) (p[n++] = ' --ctproto '), (p[n++] = ct.proto);
    if (ct.origsrc) (p[n++] = ' --ctorigsrc '), (p[n++] = ct.origsrc);
    if (ct.origdst) (p[n++] = ' --ctorigdst '), (p[n++] = ct.origdst);
    if (ct.origdstport !== undefined) (p[n++] = ' --ctorigdstport '), (p[n++] = ct.origdstport);
    p[n++] = ' ';
  }
  if (r.connmark) (p[n++] = '-m connmark --mark '), (p[n++] = r.connmark), (p[n++] = ' ');
  if (r.oneIn !== undefined) p[n++] = statistic(r.oneIn);
  const recent = r.recent;
  if (recent) {
    if (recent.mode === 'update') (p[n++] = '-m recent --update --seconds '), (p[n++] = recent.seconds ?? 0), (p[n++] = ' --reap --name ');
    else p[n++] = '-m recent --set --name ';
    (p[n++] = recent.name), (p[n++] = ' --mask '), (p[n++] = recent.mask), (p[n++] = ' --rsource ');
  }
  if (r.comment) (p[n++] = '-m comment --comment '), (p[n++] = r.comment), (p[n++] = ' ');
  p[n++] = '-j ';
  p[n++] = r.target;
  // Emptied rather than shortened: an array cut short and grown again
  // reallocates; empty pieces cost join almost nothing.
  for (let i = n; i < piecesUsed; i++) p[i] = '';
  if (n > piecesUsed) piecesUsed = n;
  return p.join('');
}

/** spell()'s pieces of one rule: one array for every rule, so that joining them allocates only the result. */
const pieces: (string | number)[] = [];
let piecesUsed = 0;

const protocolHeads = new Map<string, { bare: string; dport: string }>();

/** `-p tcp ` and `-p tcp -m tcp --dport `. */
function protocolHead(protocol: string): { bare: string; dport: string } {
  let head = protocolHeads.get(protocol);
  if (!head) protocolHeads.set(protocol, (head = { bare: `-p ${protocol} `, dport: `-p ${protocol} -m ${protocol} --dport ` }));
  return head;
}

const BARE = /^[-_0-9A-Za-z]+$/;
const ESCAPED = /["\\']/;

/** xtables_save_string: bare when made only of [_-0-9A-Za-z], else double-quoted with ", \ and ' escaped. */
export function saveString(value: string): string {
  if (BARE.test(value)) return value;
  // Sanitised comments never need escapes; only the quotes are added.
  const escaped = ESCAPED.test(value) ? value.replace(/["\\']/g, (c) => `\\${c}`) : value;
  return ['"', escaped, '"'].join('');
}

const probabilities: string[] = [];

/**
 * The statistic match stores round(p * 2^31) and prints it back as a decimal
 * with 11 places (glibc rounds exact ties to even); 1/n written this way
 * survives a round trip through the kernel unchanged.
 */
export function probability(n: number): string {
  const known = probabilities[n];
  if (known !== undefined) return known;
  const k = BigInt(Math.round(2 ** 31 / n));
  const scaled = k * 10n ** 11n;
  let q = scaled >> 31n;
  const r = scaled & (2n ** 31n - 1n);
  const half = 2n ** 30n;
  if (r > half || (r === half && (q & 1n) === 1n)) q++;
  const s = q.toString().padStart(12, '0');
  const text = `${s.slice(0, -11)}.${s.slice(-11)}`;
  if (Number.isInteger(n) && n > 0 && n < 65536) probabilities[n] = text;
  return text;
}

const statistics: string[] = [];

/** The match that takes one of n connections; the same string for every rule with n. */
function statistic(n: number): string {
  return (statistics[n] ??= `-m statistic --mode random --probability ${probability(n)} `);
}

export function hex(n: number): string {
  return `0x${(n >>> 0).toString(16)}`;
}
