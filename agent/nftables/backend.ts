// The nftables backend: pier's own tables (ip pier, ip6 pier), their
// service ports as set and map elements, changed in nft transactions.
import type { Family } from '../../lib/contract.ts';
import { MissingToolError, type Runner } from '../../lib/run.ts';
import type { ApplyResult, Backend, BackendContext, BackendKind, BackendSettings, FamilyApplier, FamilyRenderer, Removal, RuleCount, Unusable } from '../backend.ts';
import type { FamilyModel, PortChanges, ServedPort } from '../engine/model.ts';
import { findForwardDrops, NftApplier, nftUsable, removeNftTables } from './applier.ts';
import { NFT_TABLE, NftRenderer, nftCounts, nftScript, type NftUpdate } from './render.ts';

class NftFamilyRenderer implements FamilyRenderer<NftUpdate> {
  readonly family: Family;
  private readonly renderer: NftRenderer;

  constructor(family: Family, masqueradeBit: number) {
    this.family = family;
    this.renderer = new NftRenderer(family, masqueradeBit);
  }

  prepare(served: ServedPort): void {
    this.renderer.prepare(served);
  }

  render(model: FamilyModel, changes: PortChanges | undefined, opts: { whole: boolean }): NftUpdate {
    return this.renderer.update(model, { transaction: !opts.whole, changes });
  }

  text(update: NftUpdate, previous: NftUpdate | undefined): { tool: string; text: string } {
    return { tool: 'nft -f', text: previous && update.delta !== undefined ? update.delta : nftScript(update.state) };
  }

  count(update: NftUpdate): RuleCount[] {
    return [{ table: NFT_TABLE, ...nftCounts(update.state) }];
  }
}

class NftFamilyApplier implements FamilyApplier<NftUpdate> {
  private readonly applier: NftApplier;

  constructor(applier: NftApplier) {
    this.applier = applier;
  }

  get holdsRules(): boolean {
    return this.applier.holdsTable;
  }

  prepare(): void {
    // Its first write's processes start with it (NftApplier).
  }

  apply(update: NftUpdate, opts: { verify: boolean }): Promise<ApplyResult> {
    return this.applier.apply(update, opts);
  }

  close(): void {
    this.applier.close();
  }
}

/**
 * An accept in pier's table cannot override a drop in another table's
 * forward chain: say so (log and Event) whenever the set of such chains
 * changes, since what pier DNATs to other hosts then passes only if the
 * host's own rules accept it.
 */
function forwardDropReporter(ctx: BackendContext): () => Promise<void> {
  let last = '';
  return async () => {
    let drops: string[];
    try {
      drops = await findForwardDrops(ctx.runner);
    } catch {
      return;
    }
    const now = drops.join(', ');
    if (now === last) return;
    last = now;
    if (drops.length === 0) return;
    const note = `forward chains with policy drop (${now}): pier's nftables table cannot accept across tables; add an accept for DNATed connections (iptables -A FORWARD -m conntrack --ctstate DNAT -j ACCEPT and the same with ip6tables, or ct status dnat accept in an nftables forward chain) or run pier with --backend iptables`;
    ctx.warn?.('ForwardPolicyDrop', note, { chains: drops });
  };
}

/** What keeps nft from serving any family here: nft itself, or the kernel's nf_tables. */
async function nftUnusable(usable: () => ReturnType<typeof nftUsable>): Promise<Unusable[]> {
  const r = await usable();
  return r.ok ? [] : [{ lease: `nft is not usable: ${r.error}`, report: `nft unusable: ${r.error}` }];
}

export const nftablesBackend: BackendKind = {
  name: 'nftables',

  async open(ctx: BackendContext, settings: BackendSettings): Promise<Backend<NftUpdate>> {
    // One answer per check of the host: its families are checked one right after the other.
    let usable: { at: number; result: ReturnType<typeof nftUsable> } | undefined;
    const usableNow = () => {
      if (!usable || performance.now() - usable.at > 1000) usable = { at: performance.now(), result: nftUsable(ctx.runner) };
      return usable.result;
    };
    return {
      description: { name: 'nftables', reason: settings.reason, flavour: '', logFields: {} },
      check: () => nftUnusable(usableNow),
      hostLine: async () => {
        const r = await usableNow();
        return `nftables: ${r.ok ? 'usable' : `not usable: ${r.error}`}`;
      },
      checkHost: settings.dryRun ? async () => {} : forwardDropReporter(ctx),
      renderer: (family) => new NftFamilyRenderer(family, ctx.marks.masquerade),
      applier: (family) => new NftFamilyApplier(new NftApplier(family, ctx.runner, ctx.log, ctx.metrics)),
      // nft takes no lock: both families side by side.
      eachFamily: (families, apply) => Promise.all(families.map(apply)),
    };
  },

  /** A host without nft has no pier table, so a missing nft binary is no error. */
  async removeAll(runner: Runner): Promise<Removal[]> {
    const part = 'nftables';
    try {
      const tables = await removeNftTables(runner);
      return [{ part, removed: tables, summary: `removed ${tables} pier table${tables === 1 ? '' : 's'}` }];
    } catch (err) {
      if (err instanceof MissingToolError) return [{ part, removed: 0, summary: 'no nft on this host' }];
      return [{ part, removed: 0, summary: 'failed', error: (err as Error).message }];
    }
  },
};
