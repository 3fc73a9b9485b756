// IP addresses and CIDRs as pier compares and prints them: canonical text
// as inet_ntop prints it (what iptables-save shows, and one spelling per
// address), numeric order within a family, IPv4 before IPv6. Shared by the
// agent's model and the controller's allocator.
//
// A canonical dotted quad is read in place, with nothing kept: an agent sees
// every endpoint of the cluster, and a cache entry per address (~130 bytes,
// four objects) was a tenth of what its model keeps per service port. Other
// text (IPv6, which needs a real parser) is parsed once per text and cached.
import { isIPv6 } from 'node:net';
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

const BITS: Record<Family, number> = { ipv4: 32, ipv6: 128 };

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

/**
 * The value of a dotted quad as inet_ntop prints it (what node:net's isIPv4
 * accepts: four decimal numbers up to 255 without leading zeros), or -1.
 * Allocates nothing.
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

const HEX2 = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, '0'));

function hex4(word: number): string {
  return HEX2[word >>> 8]! + HEX2[word & 255]!;
}

function readIPv6(text: string): IPv6Info | undefined {
  if (text.length === 0 || text.length > 64) return undefined;
  // node:net's check is strict (no surrounding blanks) and far cheaper than a
  // general parser. It accepts zone ids; a scoped address is never a service
  // address.
  if (text.includes('%') || !isIPv6(text)) return undefined;
  const words = ipv6Words(text);
  let order = '';
  for (const w of words) order += hex4(w);
  return { family: 'ipv6', text: ipv6Text(words), order };
}

/** The eight 16-bit words of an address isIPv6 accepted. */
function ipv6Words(text: string): number[] {
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
      const [a = 0, b = 0, c = 0, d = 0] = g.split('.').map(Number);
      out.push((a << 8) | b, (c << 8) | d);
    } else out.push(parseInt(g, 16));
  }
  return out;
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

/** Everything but a dotted quad, parsed once per distinct text: the same addresses come back on every sync. */
function ipv6Info(text: string): IPv6Info | undefined {
  const hit = ipv6Cache.get(text);
  if (hit !== undefined) return hit ?? undefined;
  const info = readIPv6(text);
  if (ipv6Cache.size >= 200_000) ipv6Cache.clear();
  ipv6Cache.set(text, info ?? null);
  return info;
}

export function addressInfo(text: unknown): AddressInfo | undefined {
  if (typeof text !== 'string') return undefined;
  // A dotted quad isIPv4 accepts is already what inet_ntop prints.
  if (ipv4Value(text) >= 0) return { family: 'ipv4', text };
  return ipv6Info(text);
}

export function parseAddress(text: unknown): ParsedAddress | undefined {
  if (typeof text !== 'string') return undefined;
  const v4 = ipv4Value(text);
  if (v4 >= 0) return { family: 'ipv4', value: BigInt(v4), text };
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

/** The canonical text of a value, as inet_ntop prints it. */
export function formatAddress(family: Family, value: bigint): string {
  if (family === 'ipv4') {
    const n = Number(value);
    return `${n >>> 24}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`;
  }
  const words: number[] = [];
  for (let i = 7; i >= 0; i--) words.push(Number((value >> BigInt(i * 16)) & 0xffffn));
  return ipv6Text(words);
}

/** Numeric order within a family, IPv4 before IPv6; unparseable text last, by text. */
export function compareAddresses(a: string, b: string): number {
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
