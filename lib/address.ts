// IP addresses and CIDRs as pier compares and prints them: canonical text
// as inet_ntop prints it (what iptables-save shows, and one spelling per
// address), numeric order within a family, IPv4 before IPv6. The one place
// where the controller and the agent read addresses and CIDRs, and ip-num
// decides what is one: its Validator's patterns for addresses, its prefixes
// and CIDR ranges for networks.
//
// Two steps are pier's own. Reading the value of text ip-num accepted is the
// fast path below (ipv4Value, ipv6Words), held equal to ip-num's reading by
// test/unit/address-property.test.ts. And printing: ip-num prints IPv6 per
// RFC 5952 in the input's letter case and never with a dotted tail, so
// ipv6Text prints it as glibc's inet_ntop does.
//
// A dotted quad is read in place, with nothing kept: an agent sees every
// endpoint of the cluster, and a cache entry per address (~130 bytes, four
// objects) was a tenth of what its model keeps per service port. Other text
// (IPv6) is read once per text and cached.
import { IPv4, IPv4CidrRange, IPv4Prefix, IPv6, IPv6CidrRange, IPv6Prefix, Validator } from 'ip-num';
import type { Family } from './contract.ts';

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

/** What the hot paths need of an address: no bigint. */
export interface AddressInfo {
  family: Family;
  /** Canonical, as inet_ntop prints it. */
  text: string;
}

/** An IPv6 address with an order that plain string comparison follows. */
interface IPv6Info extends AddressInfo {
  /** The value in fixed-width hex. */
  order: string;
}

/** Longer than any address (45 characters at most, leading zeros included): spares ip-num's patterns long text. */
const MAX_TEXT = 64;

/**
 * ip-num's verdict on a dotted quad. Its Validator.isValidIPv4String ends
 * with this pattern after checks the pattern makes too.
 */
function isIPv4(text: string): boolean {
  return text.length <= MAX_TEXT && Validator.IPV4_PATTERN.test(text);
}

/**
 * ip-num's verdict on IPv6 text, zone ids refused: a scoped address is never
 * a service address. Validator.isValidIPv6String ends with this pattern,
 * after expanding the text twice to check what the pattern checks too
 * (~10-50 µs, against ~0.5 µs for the pattern).
 */
function isIPv6(text: string): boolean {
  return text.length <= MAX_TEXT && !text.includes('%') && Validator.IPV6_PATTERN.test(text);
}

// ---------------------------------------------------------------------------
// Fast path: the value of text ip-num accepted.
//
// ip-num reads an address into objects, binary strings and more pattern
// matches (~5-10 µs a dotted quad, ~25-50 µs an IPv6 address). These readers
// accept exactly what ip-num accepts and allocate nothing: a newly started
// agent's first sync at 10,000 ports (model and rules, bench:agent) takes
// 259 ms of CPU single-stack and 469 ms dual-stack with them, 558 and
// 1,215 ms with ip-num reading every address.

/**
 * The value of a dotted quad as ip-num accepts it (four decimal numbers up to
 * 255 without leading zeros, which is also how inet_ntop prints it), or -1.
 * Allocates nothing: it also orders addresses in sorts.
 */
export function ipv4Value(text: string): number {
  const n = text.length;
  if (n < 7 || n > 15) return -1;
  let value = 0;
  let octet = 0;
  let digits = 0;
  let dots = 0;
  for (let i = 0; i < n; i++) {
    const c = text.charCodeAt(i);
    if (c === 46) {
      if (digits === 0 || dots === 3) return -1;
      value = value * 256 + octet;
      octet = 0;
      digits = 0;
      dots++;
    } else if (c >= 48 && c <= 57) {
      if (digits > 0 && octet === 0) return -1;
      octet = octet * 10 + (c - 48);
      if (++digits > 3 || octet > 255) return -1;
    } else return -1;
  }
  if (digits === 0 || dots !== 3) return -1;
  return value * 256 + octet;
}

/** The eight 16-bit words of IPv6 text ip-num accepted (isIPv6); anything else gives garbage. */
export function ipv6Words(text: string): number[] {
  const gap = text.indexOf('::');
  const head = ipv6Groups(gap < 0 ? text : text.slice(0, gap));
  if (gap < 0) return head;
  const tail = ipv6Groups(text.slice(gap + 2));
  for (let i = head.length + tail.length; i < 8; i++) head.push(0);
  for (const w of tail) head.push(w);
  return head;
}

function ipv6Groups(part: string): number[] {
  const out: number[] = [];
  if (part === '') return out;
  for (const g of part.split(':')) {
    if (g.includes('.')) {
      const v = ipv4Value(g);
      out.push(v >>> 16, v & 0xffff);
    } else out.push(parseInt(g, 16));
  }
  return out;
}

// ---------------------------------------------------------------------------

const HEX2 = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, '0'));

function hex4(word: number): string {
  return HEX2[word >>> 8]! + HEX2[word & 255]!;
}

function valueWords(value: bigint): number[] {
  const words: number[] = [];
  for (let i = 7; i >= 0; i--) words.push(Number((value >> BigInt(i * 16)) & 0xffffn));
  return words;
}

/** inet_ntop's output: glibc compresses the first longest run of two or more zero groups and prints v4-mapped/compatible tails dotted. */
function ipv6Text(words: number[]): string {
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
      out += `${words[6]! >>> 8}.${words[6]! & 255}.${words[7]! >>> 8}.${words[7]! & 255}`;
      break;
    }
    out += words[i]!.toString(16);
  }
  if (bestBase >= 0 && bestBase + bestLen === 8) out += ':';
  return out;
}

const ipv6Cache = new Map<string, IPv6Info | null>();

/** Everything but a dotted quad, read once per distinct text: the same addresses come back on every sync. */
function ipv6Info(text: string): IPv6Info | undefined {
  const hit = ipv6Cache.get(text);
  if (hit !== undefined) return hit ?? undefined;
  let info: IPv6Info | undefined;
  if (isIPv6(text)) {
    const words = ipv6Words(text);
    let order = '';
    for (const w of words) order += hex4(w);
    info = { family: 'ipv6', text: ipv6Text(words), order };
  }
  if (ipv6Cache.size >= 200_000) ipv6Cache.clear();
  ipv6Cache.set(text, info ?? null);
  return info;
}

export function addressInfo(text: unknown): AddressInfo | undefined {
  if (typeof text !== 'string') return undefined;
  // A dotted quad ip-num accepts is already what inet_ntop prints.
  if (isIPv4(text)) return { family: 'ipv4', text };
  return ipv6Info(text);
}

export function parseAddress(text: unknown): ParsedAddress | undefined {
  if (typeof text !== 'string') return undefined;
  if (isIPv4(text)) return { family: 'ipv4', value: BigInt(ipv4Value(text)), text };
  const info = ipv6Info(text);
  if (!info) return undefined;
  return { family: info.family, value: BigInt(`0x${info.order}`), text: info.text };
}

/** Accepts `addr/prefix` or a bare address (a host route); host bits are zeroed. */
export function parseCidr(text: unknown): ParsedCidr | undefined {
  if (typeof text !== 'string') return undefined;
  const slash = text.indexOf('/');
  const addr = parseAddress(slash < 0 ? text : text.slice(0, slash));
  if (!addr) return undefined;
  const p = slash < 0 ? undefined : text.slice(slash + 1);
  // The address and the prefix are read apart: ip-num's fromCidr takes `/024`
  // for IPv4 but not for IPv6, and refuses IPv6 with a dotted tail.
  if (p !== undefined && !/^\d{1,3}$/.test(p)) return undefined;
  try {
    // ip-num's ranges refuse a prefix longer than the family's and give the network address.
    const range =
      addr.family === 'ipv4'
        ? new IPv4CidrRange(IPv4.fromNumber(addr.value), IPv4Prefix.fromNumber(BigInt(p ?? 32)))
        : new IPv6CidrRange(IPv6.fromBigInt(addr.value), IPv6Prefix.fromNumber(BigInt(p ?? 128)));
    const value = range.getFirst().getValue();
    const prefix = Number(range.getPrefix().getValue());
    return { family: addr.family, value, prefix, text: `${formatAddress(addr.family, value)}/${prefix}` };
  } catch {
    return undefined;
  }
}

/** The canonical text of a value, as inet_ntop prints it. */
export function formatAddress(family: Family, value: bigint): string {
  if (family === 'ipv4') {
    const n = Number(value);
    return `${n >>> 24}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`;
  }
  return ipv6Text(valueWords(value));
}

/** Numeric order within a family, IPv4 before IPv6; unparseable text last, by text. */
export function compareAddresses(a: string, b: string): number {
  // ipv4Value accepts exactly what ip-num does, so it alone tells dotted quads apart here.
  const va = ipv4Value(a);
  const vb = ipv4Value(b);
  if (va >= 0) return vb >= 0 ? va - vb : -1;
  if (vb >= 0) return 1;
  const pa = ipv6Info(a);
  const pb = ipv6Info(b);
  if (pa && pb) return compareText(pa.order, pb.order);
  if (pa) return -1;
  if (pb) return 1;
  return compareText(a, b);
}

export function compareText(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
