// A small interpreter for the subset of iptables that pier renders: walks a
// packet through chains held as iptables-save rule text. `pier trace` asks it
// where a packet goes, so its answer cannot disagree with the rules; the
// property tests ask it the same instead of matching rule text.
//
// It knows exactly the matches and targets render.ts writes (and the jumps
// in the built-in chains); any other option is an error, not a guess.
import type { ProtocolWord } from '../../lib/protocols.ts';
import { parseCidr } from '../engine/model.ts';
import { splitRule } from './restore.ts';

export interface Packet {
  src: string;
  dst: string;
  proto: ProtocolWord;
  dport: number;
  /** The packet mark before the walk (0 when absent). */
  mark?: number;
  /** Its connection's mark (0 when absent): a new connection has none. */
  ctmark?: number;
  /** The connection as conntrack knows it (filter table). */
  ct?: { new: boolean; dnat: boolean; proto: number; origsrc: string; origdst: string; origdport: number };
  /** The xt_recent lists that remember this client, not yet timed out (session affinity); none when absent. */
  remembered?: ReadonlySet<string>;
}

/** A rule whose matches all held: a jump, a MARK, or the terminating rule. */
export interface Hop {
  chain: string;
  /** The rule text, as after `-A <chain> `. */
  rule: string;
}

export type WalkVerdict = 'DNAT' | 'ACCEPT' | 'DROP' | 'REJECT' | 'MASQUERADE' | 'CONTINUE';

export interface WalkResult {
  /** The terminating target reached, or CONTINUE when the packet leaves pier's chains. */
  verdict: WalkVerdict;
  /** DNAT's `--to-destination` value. */
  to?: string;
  /** The packet mark after the walk. */
  mark: number;
  /** The connection's mark after the walk. */
  ctmark: number;
  /** Rules evaluated on the way. */
  rules: number;
  /** Statistic matches met (one per branch point passed). */
  randomPoints: number;
  /** How likely this path is, by the printed probabilities of the statistic matches passed. */
  chance: number;
  hops: Hop[];
}

const parsed = new Map<string, ReturnType<typeof parseCidr>>();
function cidrOf(text: string) {
  if (!parsed.has(text)) {
    if (parsed.size > 10_000) parsed.clear();
    parsed.set(text, parseCidr(text));
  }
  return parsed.get(text);
}

export function inCidr(address: string, cidr: string): boolean {
  const a = cidrOf(address);
  const c = cidrOf(cidr);
  if (!a || !c || a.family !== c.family) return false;
  const host = BigInt((a.family === 'ipv4' ? 32 : 128) - c.prefix);
  return a.value >> host === c.value >> host;
}

function inPorts(port: number, spec: string): boolean {
  const [lo, hi = lo] = spec.split(':').map(Number);
  return port >= lo! && port <= hi!;
}

/** conntrack prints a full-length prefix as a bare address. */
const ctNet = (v: string) => (v.includes('/') ? v : `${v}/${v.includes(':') ? 128 : 32}`);

/**
 * Walks `pkt` from `chain`. The n-th statistic match met succeeds iff
 * n === choice (so choice k picks the k-th branch of a spread; -1: none).
 */
export function walk(chains: ReadonlyMap<string, readonly string[]>, chain: string, pkt: Packet, choice = -1): WalkResult {
  let rules = 0;
  let mark = pkt.mark ?? 0;
  let ctmark = pkt.ctmark ?? 0;
  let randomPoints = 0;
  let chance = 1;
  const hops: Hop[] = [];
  const visit = (name: string, depth: number): { verdict: WalkVerdict; to?: string } | undefined => {
    if (depth > 32) throw new Error(`chain loop at ${name}`);
    const list = chains.get(name);
    if (!list) throw new Error(`jump to missing chain ${name}`);
    for (const rule of list) {
      rules++;
      const w = splitRule(rule);
      let ok = true;
      let target = '';
      let args: string[] = [];
      let module = '';
      for (let i = 0; i < w.length && ok; ) {
        const neg = w[i] === '!';
        if (neg) i++;
        const opt = w[i]!;
        const v = w[i + 1] ?? '';
        let m = true;
        let step = 2;
        switch (opt) {
          case '-s': m = inCidr(pkt.src, v); break;
          case '-d': m = inCidr(pkt.dst, v); break;
          case '-p': m = pkt.proto === v; break;
          case '-m': module = v; break;
          case '--comment': case '--mode': break;
          case '--dport': m = inPorts(pkt.dport, v); break;
          case '--probability':
            m = randomPoints++ === choice;
            chance *= m ? Number(v) : 1 - Number(v);
            break;
          case '--mark': { const [val, mask] = v.split('/').map(Number); m = ((module === 'connmark' ? ctmark : mark) & mask!) === val; break; }
          case '--ctstate': m = pkt.ct !== undefined && v.split(',').some((s) => (s === 'NEW' && pkt.ct!.new) || (s === 'DNAT' && pkt.ct!.dnat)); break;
          case '--ctproto': m = pkt.ct?.proto === Number(v); break;
          case '--ctorigsrc': m = pkt.ct !== undefined && inCidr(pkt.ct.origsrc, ctNet(v)); break;
          case '--ctorigdst': m = pkt.ct !== undefined && inCidr(pkt.ct.origdst, ctNet(v)); break;
          case '--ctorigdstport': m = pkt.ct !== undefined && inPorts(pkt.ct.origdport, v); break;
          case '--set': case '--update': case '--rcheck': {
            // The recent match's options, the list's --name among them, end at the next -m or -j.
            let name = 'DEFAULT';
            for (step = 1; i + step < w.length && w[i + step] !== '-m' && w[i + step] !== '-j'; step++) {
              if (w[i + step] === '--name') name = w[i + step + 1]!;
            }
            m = opt === '--set' || (pkt.remembered?.has(name) ?? false);
            break;
          }
          case '-j': target = v; args = w.slice(i + 2); i = w.length; continue;
          default: throw new Error(`the rule interpreter does not know ${opt} (in: ${rule})`);
        }
        if (neg ? m : !m) ok = false;
        i += step;
      }
      if (!ok) continue;
      hops.push({ chain: name, rule });
      if (target === 'MARK' || target === 'CONNMARK') {
        const [val, mask] = args[1]!.split('/').map(Number);
        if (target === 'MARK') mark = (mark & ~mask!) ^ val!;
        else ctmark = (ctmark & ~mask!) ^ val!;
        continue;
      }
      if (target === 'RETURN') return undefined;
      if (target === 'DNAT') return { verdict: 'DNAT', to: args[1] };
      if (target === 'ACCEPT' || target === 'DROP' || target === 'REJECT' || target === 'MASQUERADE') return { verdict: target };
      const res = visit(target, depth + 1);
      if (res) return res;
    }
    return undefined;
  };
  const res = visit(chain, 0);
  return { verdict: res?.verdict ?? 'CONTINUE', to: res?.to, mark: mark >>> 0, ctmark: ctmark >>> 0, rules, randomPoints, chance, hops };
}

/**
 * Every way a new connection can walk from `chain`, one per branch of the
 * statistic matches it meets (the first walk takes none of them; there is
 * one spread per path in what pier renders).
 */
export function branches(chains: ReadonlyMap<string, readonly string[]>, chain: string, pkt: Packet): WalkResult[] {
  const first = walk(chains, chain, pkt, -1);
  if (first.randomPoints === 0) return [first];
  const out: WalkResult[] = [];
  for (let k = 0; k <= first.randomPoints; k++) out.push(walk(chains, chain, pkt, k));
  return out;
}
