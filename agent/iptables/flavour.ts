// Which iptables flavour the host uses. Rules written with the other one would
// run in a separate kernel subsystem, ordered unpredictably against the
// host's own (a "-I FORWARD 1" with nft still runs after legacy's DROP), so
// pier must use the host's. Detection follows kube-proxy's iptables wrapper:
// kubelet's hint chains first, then whichever backend holds more rules.
import type { IptablesFlavour } from './xtables.ts';
import type { Runner } from '../../lib/run.ts';

/** kubelet (1.17+) creates one of these in the mangle table with the backend it uses. */
const KUBELET_HINT = /^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY)\b/m;

export interface FlavourEvidence {
  /** iptables-nft-save -t mangle, ip6tables-nft-save -t mangle, concatenated. */
  nftMangle: string;
  /** iptables-legacy-save and ip6tables-legacy-save of all tables (naming a table would create it). */
  legacyAll: string;
  /** iptables-nft-save and ip6tables-nft-save of all tables. */
  nftAll: string;
}

export interface FlavourChoice {
  backend: IptablesFlavour;
  reason: string;
}

const countRules = (save: string) => save.split('\n').filter((l) => l.startsWith('-A ')).length;

/** The decision, as a pure function of what the save commands printed. */
export function chooseFlavour(e: FlavourEvidence): FlavourChoice {
  if (KUBELET_HINT.test(e.nftMangle)) return { backend: 'nft', reason: 'kubelet hint chain found with iptables-nft' };
  if (KUBELET_HINT.test(e.legacyAll)) return { backend: 'legacy', reason: 'kubelet hint chain found with iptables-legacy' };
  const legacy = countRules(e.legacyAll);
  const nft = countRules(e.nftAll);
  if (legacy > nft) return { backend: 'legacy', reason: `iptables-legacy holds more rules (${legacy} against ${nft})` };
  return { backend: 'nft', reason: nft > 0 ? `iptables-nft holds more rules (${nft} against ${legacy})` : 'no rules in either backend; nft is the default' };
}

/** Runs the save commands (ignoring failures: a missing backend just shows no rules) and decides. */
export async function detectFlavour(run: Runner): Promise<FlavourChoice> {
  const out = async (file: string, args: string[]) => {
    try {
      const r = await run(file, args);
      return r.exitCode === 0 ? r.stdout : '';
    } catch {
      return '';
    }
  };
  const nftMangle = (await out('iptables-nft-save', ['-t', 'mangle'])) + (await out('ip6tables-nft-save', ['-t', 'mangle']));
  if (KUBELET_HINT.test(nftMangle)) return chooseFlavour({ nftMangle, legacyAll: '', nftAll: '' });
  const legacyAll = (await out('iptables-legacy-save', [])) + (await out('ip6tables-legacy-save', []));
  const nftAll = (await out('iptables-nft-save', [])) + (await out('ip6tables-nft-save', []));
  return chooseFlavour({ nftMangle, legacyAll, nftAll });
}
