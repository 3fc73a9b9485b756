// Names hashed from a seed, for what pier creates in the kernel: iptables
// chains (at most 28 characters) and nftables chains and sets. Both
// backends use them, so they are stable across agent versions: a renamed
// object is a rewritten one.
import { createHash } from 'node:crypto';

const BASE32 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';
const chainNames = new Map<string, string>();

/** `<prefix><16 base32 characters of sha256(seed)>`: 80 bits, stable and at most 28 characters for the prefixes used here. */
export function chainName(prefix: string, seed: string): string {
  const memo = `${prefix}\0${seed}`;
  const known = chainNames.get(memo);
  if (known !== undefined) return known;
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
  const name = prefix + out;
  // The same few thousand chains come back on every render; a hash each time
  // was a visible share of it.
  if (chainNames.size >= 100_000) chainNames.clear();
  chainNames.set(memo, name);
  return name;
}
