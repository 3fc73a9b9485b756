// Taking pier's rules away, the one way `pier cleanup` (uninstall) and an
// agent after a switch of --backend (the other backend's leftovers) both do it.
import { FAMILIES } from '../lib/contract.ts';
import { removeAll } from './applier.ts';
import { Xtables, type Backend, type Runner } from './iptables.ts';
import { removeNftTables } from './nft-applier.ts';

/** What one part of the removal did: how much went, or why it could not look. */
export interface Removal {
  /** For example `nft ipv4` (an iptables flavour and family) or `nftables`. */
  part: string;
  /** How many chains and jumps, or tables, went. */
  removed: number;
  summary: string;
  error?: string;
}

/**
 * Removes pier's chains and the jumps into them for each iptables flavour
 * given, in both families, and pier's nftables tables if asked: nothing else.
 * Never throws; a part that failed says so in its error. A host without nft
 * has no pier table, so a missing nft binary is no error.
 */
export async function removePierRules(runner: Runner, which: { iptables: readonly Backend[]; nftables: boolean }): Promise<Removal[]> {
  const out: Removal[] = [];
  for (const flavour of which.iptables) {
    for (const family of FAMILIES) {
      const part = `${flavour} ${family}`;
      try {
        const { jumps, chains } = await removeAll(new Xtables(family, flavour, runner));
        out.push({ part, removed: jumps + chains, summary: `removed ${chains} chains and ${jumps} jumps` });
      } catch (err) {
        out.push({ part, removed: 0, summary: 'failed', error: (err as Error).message });
      }
    }
  }
  if (which.nftables) {
    const part = 'nftables';
    try {
      const tables = await removeNftTables(runner);
      out.push({ part, removed: tables, summary: `removed ${tables} pier table${tables === 1 ? '' : 's'}` });
    } catch (err) {
      const msg = (err as Error).message;
      if (/^cannot run nft/.test(msg)) out.push({ part, removed: 0, summary: 'no nft on this host' });
      else out.push({ part, removed: 0, summary: 'failed', error: msg });
    }
  }
  return out;
}
