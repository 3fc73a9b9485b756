// lib/address.ts against ip-num, the library that decides what an address is,
// over generated IPv4 and IPv6 text, valid and not: the fast path (pier's own
// readers of text ip-num accepted) reads what ip-num reads, ip-num's patterns
// that address.ts asks decide as ip-num's validators do, and what address.ts
// exports agrees with ip-num.
import fc from 'fast-check';
import { IPv4, IPv4CidrRange, IPv6, IPv6CidrRange, IPv6Prefix, Validator } from 'ip-num';
import { describe, expect, it } from 'vitest';
import { addressInfo, compareAddresses, formatAddress, ipv4Value, ipv6Words, parseAddress, parseCidr } from '../../lib/address.ts';

/** What ip-num makes of text, zone ids refused as pier refuses them. */
function ipNum(text: string): { family: 'ipv4' | 'ipv6'; value: bigint } | undefined {
  if (Validator.isValidIPv4String(text)[0]) return { family: 'ipv4', value: IPv4.fromString(text).getValue() };
  if (!text.includes('%') && Validator.isValidIPv6String(text)[0]) return { family: 'ipv6', value: IPv6.fromString(text).getValue() };
  return undefined;
}

const pick = <T,>(xs: readonly T[]) => fc.constantFrom(...xs);

// IPv4: octets in and out of range, with and without leading zeros, too few or many.
const octet = fc.oneof(
  fc.integer({ min: 0, max: 255 }).map(String),
  fc.integer({ min: 0, max: 255 }).map((n) => `0${n}`),
  fc.integer({ min: 256, max: 1999 }).map(String),
  pick(['', '00', '000', '0000', '-1', '+1', ' 1', '1 ', 'a', '0x1', '1e1', '１']),
);
const quadLike = fc.array(octet, { minLength: 1, maxLength: 6 }).map((os) => os.join('.'));
const validQuad = fc.tuple(...[0, 1, 2, 3].map(() => fc.integer({ min: 0, max: 255 }))).map((os) => os.join('.'));

// IPv6: eight words (zero runs likely), spelled in many ways.
const word = fc.oneof({ weight: 3, arbitrary: fc.constant(0) }, { weight: 1, arbitrary: pick([1, 0xffff, 0xdb8, 0x2001, 0xfe80]) }, { weight: 2, arbitrary: fc.integer({ min: 0, max: 0xffff }) });
const words = fc.array(word, { minLength: 8, maxLength: 8 });
const valueOf = (ws: number[]) => ws.reduce((acc, w) => (acc << 16n) | BigInt(w), 0n);
const group = (w: number, style: number) => {
  const h = w.toString(16);
  return style === 0 ? h : style === 1 ? h.toUpperCase() : h.padStart(4, '0');
};
/** A spelling of `ws`: any zero run (or none) as `::`, any letter case and padding, a dotted tail or not. */
const spelled = fc.tuple(words, fc.integer({ min: 0, max: 2 }), fc.integer({ min: 0, max: 8 }), fc.integer({ min: 0, max: 8 }), fc.boolean()).map(([ws, style, from, len, dotted]) => {
  const text = (xs: number[]) => xs.map((w) => group(w, style)).join(':');
  const tail = dotted ? `${ws[6]! >> 8}.${ws[6]! & 255}.${ws[7]! >> 8}.${ws[7]! & 255}` : undefined;
  const hex = tail ? ws.slice(0, 6) : ws;
  const end = Math.min(hex.length, from + len);
  const zeros = len > 0 && hex.slice(from, end).every((w) => w === 0) && end > from;
  const body = zeros ? `${text(hex.slice(0, from))}::${text(hex.slice(end))}` : text(hex);
  return tail ? (body.endsWith(':') ? `${body}${tail}` : `${body}:${tail}`) : body;
});
const canonical = words.map((ws) => formatAddress('ipv6', valueOf(ws)));
const mapped = fc.tuple(pick(['::ffff:', '::', '64:ff9b::', '::ffff:0:', '1::']), validQuad).map(([p, q]) => p + q);

/** A few edits: characters added, dropped or doubled, a group made too long, blanks, a zone, a prefix. */
const edited = (base: fc.Arbitrary<string>) =>
  fc.tuple(base, fc.array(fc.tuple(fc.nat(), pick(['add', 'drop', 'double']), pick([':', '::', '.', '0', 'f', 'F', 'g', ' ', '%eth0', '/64', '1', '00000', '256', '-'])), { maxLength: 3 })).map(([text, edits]) => {
    let t = text;
    for (const [at, how, what] of edits) {
      const i = t.length === 0 ? 0 : at % (t.length + 1);
      if (how === 'add') t = t.slice(0, i) + what + t.slice(i);
      else if (how === 'drop') t = t.slice(0, i) + t.slice(i + 1);
      else t = t.slice(0, i) + t.slice(i, i + 1).repeat(2) + t.slice(i + 1);
    }
    return t;
  });

const garbage = fc.oneof(
  fc.string({ maxLength: 50 }),
  fc.string({ unit: pick([...'0123456789abcdefABCDEF:.%/ ']), maxLength: 46 }),
);

const anyText = fc.oneof(validQuad, quadLike, edited(validQuad), canonical, spelled, mapped, edited(canonical), edited(spelled), edited(mapped), garbage);

describe('lib/address.ts against ip-num', () => {
  it('fast path, IPv4: a dotted quad read in place is exactly what ip-num accepts, with its value', () => {
    fc.assert(
      fc.property(fc.oneof(validQuad, quadLike, edited(validQuad), anyText), (text) => {
        const v = ipv4Value(text);
        const want = Validator.isValidIPv4String(text)[0] ? IPv4.fromString(text) : undefined;
        expect(v >= 0, text).toBe(want !== undefined);
        if (want) {
          expect(BigInt(v), text).toBe(want.getValue());
          expect(want.toString(), 'a valid dotted quad is its own canonical text').toBe(text);
        }
      }),
      { numRuns: 10_000 },
    );
  });

  it('fast path, IPv6: the words read from text ip-num accepts make ip-num\'s value', () => {
    let accepted = 0;
    fc.assert(
      fc.property(fc.oneof(canonical, spelled, mapped, edited(spelled), edited(mapped), anyText), (text) => {
        if (text.includes('%') || !Validator.isValidIPv6String(text)[0]) return;
        accepted++;
        expect(valueOf(ipv6Words(text)), text).toBe(IPv6.fromString(text).getValue());
      }),
      { numRuns: 10_000 },
    );
    expect(accepted, 'most generated text is an address').toBeGreaterThan(5_000);
  });

  it('reads every text as ip-num does (its patterns decide as its validators do), and prints it canonically', () => {
    fc.assert(
      fc.property(anyText, (text) => {
        const want = ipNum(text);
        const got = parseAddress(text);
        expect(got && { family: got.family, value: got.value }, text).toEqual(want);
        if (!want) {
          expect(addressInfo(text), text).toBeUndefined();
          return;
        }
        expect(got!.text, text).toBe(formatAddress(want.family, want.value));
        const info = addressInfo(text);
        expect(info && { family: info.family, text: info.text }, text).toEqual({ family: want.family, text: got!.text });
        // One spelling per address: the canonical text reads back to itself.
        expect(parseAddress(got!.text)?.text).toBe(got!.text);
      }),
      { numRuns: 10_000 },
    );
  });

  it('prints IPv6 as glibc inet_ntop does, which ip-num has no printer for', () => {
    const cases: [string, string][] = [
      ['2001:DB8:0:0:0:0:0:1', '2001:db8::1'],
      ['2001:0:0:1:0:0:1:1', '2001::1:0:0:1:1'], // the first of two equal runs
      ['2001:db8:1:1:1:1:0:1', '2001:db8:1:1:1:1:0:1'], // a single zero group stays
      ['0:0:0:0:0:ffff:c000:201', '::ffff:192.0.2.1'], // v4-mapped: dotted
      ['::c000:201', '::192.0.2.1'], // v4-compatible: dotted
      ['::1', '::1'], // not v4-compatible: the loopback
      ['::ffff:0:c000:201', '::ffff:0:c000:201'], // SIIT: hex
      ['64:ff9b::c000:201', '64:ff9b::c000:201'], // NAT64: hex
      ['1:0:0:0:0:0:0:0', '1::'],
    ];
    for (const [input, want] of cases) expect(parseAddress(input)?.text, input).toBe(want);
  });

  it('reads CIDRs as ip-num does: its network address, the prefix kept', () => {
    const prefix4 = fc.integer({ min: 0, max: 32 });
    const prefix6 = fc.integer({ min: 0, max: 128 });
    fc.assert(
      fc.property(fc.oneof(fc.tuple(validQuad, prefix4), fc.tuple(canonical, prefix6)), ([address, prefix]) => {
        const text = `${address}/${prefix}`;
        const got = parseCidr(text);
        // ip-num's IPv6 CIDR pattern misses dotted tails (a `d` where `\d` was meant): those through its range directly.
        const range = !address.includes(':') ? IPv4CidrRange.fromCidr(text) : address.includes('.') ? new IPv6CidrRange(IPv6.fromString(address), IPv6Prefix.fromNumber(BigInt(prefix))) : IPv6CidrRange.fromCidr(text);
        const first = range.getFirst().getValue();
        expect(got?.value, text).toBe(first);
        expect(got?.prefix, text).toBe(prefix);
        expect(got?.text, text).toBe(`${formatAddress(got!.family, first)}/${prefix}`);
      }),
      { numRuns: 5_000 },
    );
    fc.assert(
      fc.property(anyText, fc.oneof(fc.integer({ min: 0, max: 200 }).map(String), pick(['', 'x', '-1', ' 8', '8 ', '0x8', '1.5'])), (address, prefix) => {
        const want = ipNum(address);
        const p = Number(prefix);
        const ok = want !== undefined && /^\d{1,3}$/.test(prefix) && p <= (want.family === 'ipv4' ? 32 : 128);
        expect(parseCidr(`${address}/${prefix}`) !== undefined, `${address}/${prefix}`).toBe(ok);
      }),
      { numRuns: 5_000 },
    );
  });

  it('orders what ip-num reads by family, then value; the rest last, by text', () => {
    fc.assert(
      fc.property(anyText, anyText, (a, b) => {
        const pa = ipNum(a);
        const pb = ipNum(b);
        const rank = (p: typeof pa) => (p ? (p.family === 'ipv4' ? 0 : 1) : 2);
        let want = Math.sign(rank(pa) - rank(pb));
        if (want === 0 && pa && pb) want = pa.value < pb.value ? -1 : pa.value > pb.value ? 1 : 0;
        if (want === 0 && !pa && !pb) want = a < b ? -1 : a > b ? 1 : 0;
        expect(Math.sign(compareAddresses(a, b)), `${a} vs ${b}`).toBe(want);
      }),
      { numRuns: 5_000 },
    );
  });
});
