// Makes the kernel hold a rendered ruleset, for one address family, with as
// little work as possible:
//  - nothing at all when the desired ruleset equals what was last applied;
//  - otherwise one iptables-restore --noflush transaction with only the
//    changed chains (restoreText's delta), falling back to a full rewrite of
//    every pier chain when the partial one fails;
//  - a full rewrite when pier's state in the kernel is unknown: at start, after
//    a failure, or when the canary rule is gone (someone flushed the table);
//  - jumps from built-in chains: on full rewrites, those the save shows are
//    deleted and inserted again in the same transaction and the missing ones
//    inserted; on periodic resyncs, checked with -C and inserted when missing.
// iptables-save is only read on full rewrites (it costs hundreds of
// milliseconds at 10,000 ports), and the first one is read ahead, while the
// agent's informers list the cluster, so that it is off the path from "caches
// synced" to "rules in place". The iptables-restore of a full rewrite is
// started ahead too, and waits for its payload. The two families' appliers
// run side by side where the backend allows it (eachFamily).
import type { Family } from '../lib/contract.ts';
import type { Logger } from '../lib/log.ts';
import { silentLogger } from '../lib/log.ts';
import type { Backend, StartedRestore, Xtables } from './iptables.ts';
import { CANARY_CHAIN, CHAIN_PREFIX, TABLES, type Ruleset, type TableName } from './render.ts';
import { parseSave, restoreText, splitRule, type JumpEdits, type SavedTables } from './restore.ts';

export type { JumpEdits };

export type ApplyMode = 'noop' | 'partial' | 'full';

/**
 * How long a save read ahead stays good for the first full rewrite: longer
 * than an agent's informers take to list 10,000 Services (~3 s), short enough
 * that the kernel has had little time to change. Should a jump into pier's
 * chains vanish in that window, the rewrite fails and reads again (full()).
 */
const READ_AHEAD_MS = 10_000;

export interface ApplyResult {
  family: Family;
  mode: ApplyMode;
  /** Bytes handed to iptables-restore (0 for noop). */
  payloadBytes: number;
  jumpsInserted: number;
  /** Why a full rewrite happened, when it did. */
  reason?: string;
}

/**
 * Runs `apply` for each family: side by side with nft, one after the other
 * with legacy. An iptables-nft-restore spends most of its time in its own
 * process, parsing and building its batch, and the kernel takes the two
 * families' commits one at a time anyway: two restores of 10,000 ports each
 * took 1.7-2.5 s side by side and 2.3-3.8 s one after the other
 * (bench/README.md). A legacy restore holds the xtables lock, which
 * iptables and ip6tables share, for its whole run: the second would only
 * wait for it, and could wait past -w.
 */
export async function eachFamily<T>(backend: Backend, families: readonly Family[], apply: (family: Family) => Promise<T>): Promise<T[]> {
  if (backend === 'nft') return Promise.all(families.map(apply));
  const out: T[] = [];
  for (const family of families) out.push(await apply(family));
  return out;
}

export class Applier {
  readonly family: Family;
  private readonly xt: Xtables;
  private readonly log: Logger;
  /** What the kernel holds, as far as this process knows; undefined = unknown. */
  private applied: Ruleset | undefined;
  /** The save for the next full rewrite, started early by prepare(), and when it started. */
  private pendingSave: { tables: Promise<SavedTables>; at: number } | undefined;
  /** The next full rewrite's iptables-restore, started by prepare(). */
  private pendingRestore: StartedRestore | undefined;

  constructor(xt: Xtables, log: Logger = silentLogger) {
    this.xt = xt;
    this.family = xt.family;
    this.log = log.child({ family: xt.family });
  }

  /** Forget what was applied, so the next apply rewrites everything. */
  invalidate(): void {
    this.applied = undefined;
    this.close();
  }

  /** Drops what was read and started ahead: a restore started ahead exits unused (the agent stops). */
  close(): void {
    this.pendingSave = undefined;
    this.pendingRestore?.cancel();
    this.pendingRestore = undefined;
  }

  /**
   * Called when the agent starts and again right before each ruleset is
   * computed: when the next apply is going to be a full rewrite (nothing
   * applied yet), the iptables-save it needs starts now, in its own process,
   * while this one lists the cluster or renders (a save of 10,000 ports'
   * rules takes longer than rendering them). A save younger than
   * READ_AHEAD_MS is kept: pier applied nothing since, and should another
   * program have changed pier's chains meanwhile, full() reads again. The
   * rewrite's iptables-restore starts now as well and waits for its payload,
   * however long. The promise says when the save is read (it never rejects;
   * the apply that uses the save reports its failure).
   */
  prepare(): Promise<void> {
    if (this.applied) {
      this.close();
      return Promise.resolve();
    }
    this.pendingRestore ??= this.xt.startRestore();
    if (!this.pendingSave || performance.now() - this.pendingSave.at > READ_AHEAD_MS) {
      this.pendingSave = { tables: this.saveTables(), at: performance.now() };
    }
    return this.pendingSave.tables.then(
      () => undefined,
      () => undefined,
    );
  }

  /**
   * Applies `next`. `verify` (periodic resyncs) also checks the canary and
   * every jump, to heal changes made behind pier's back.
   */
  async apply(next: Ruleset, opts: { verify?: boolean } = {}): Promise<ApplyResult> {
    let reason: string | undefined;
    if (!this.applied) reason = 'initial sync';
    else if (opts.verify && !(await this.canaryIntact())) reason = 'canary rule missing: pier chains were flushed from outside';

    if (reason === undefined && this.applied) {
      const payload = next === this.applied ? '' : restoreText(next, { previous: this.applied });
      if (payload === '') {
        const jumpsInserted = opts.verify ? await this.ensureJumps(next) : 0;
        return { family: this.family, mode: 'noop', payloadBytes: 0, jumpsInserted };
      }
      try {
        await this.xt.restore(payload);
        this.applied = next;
        const jumpsInserted = opts.verify ? await this.ensureJumps(next) : 0;
        return { family: this.family, mode: 'partial', payloadBytes: payload.length, jumpsInserted };
      } catch (err) {
        reason = `partial restore failed: ${(err as Error).message}`;
        this.log.warn({ err: (err as Error).message }, 'partial restore failed; rewriting every pier chain');
      }
    }
    return this.full(next, reason ?? 'full');
  }

  private async full(next: Ruleset, reason: string): Promise<ApplyResult> {
    this.applied = undefined;
    const pending = this.pendingSave;
    this.pendingSave = undefined;
    // Without prepare() (a flush found by the canary), the restore process
    // starts while the save is read.
    const restore = this.pendingRestore ?? this.xt.startRestore();
    this.pendingRestore = undefined;
    try {
      return await this.rewrite(next, reason, await (pending?.tables ?? this.saveTables()), restore);
    } catch (err) {
      restore.cancel();
      if (!pending) throw err;
      // The save was read before this apply: a jump it lists may be gone
      // (the restore's -D fails, atomically; see rewrite()) or the save
      // itself failed. Once more with a save read now; a second failure is real.
      this.log.info({ err: (err as Error).message }, 'full rewrite from the earlier iptables-save failed; reading it again');
      return this.rewrite(next, reason, await this.saveTables());
    }
  }

  private async rewrite(next: Ruleset, reason: string, saved: SavedTables, restore?: StartedRestore): Promise<ApplyResult> {
    const existingChains: Partial<Record<TableName, string[]>> = {};
    const jumpEdits: Partial<Record<TableName, JumpEdits>> = {};
    let jumpsInserted = 0;
    for (const table of TABLES) {
      existingChains[table] = pierChains(saved.get(table));
      const plan = planJumps(next, table, saved.get(table));
      jumpsInserted += plan.insert.length;
      // The wanted jumps the save shows are deleted and inserted again: had
      // one vanished since the save was read, its -D fails the restore
      // rather than leave the node without it until a resync; and each goes
      // back to the top of its chain, above rules added since.
      const missing = new Set(plan.insert);
      const wanted = next.tables[table].jumps;
      jumpEdits[table] = { remove: [...plan.remove, ...wanted.filter((j) => !missing.has(j))], insert: [...wanted] };
    }
    // One transaction: stale jumps out (before their chains are deleted),
    // chains rewritten, jumps in. No command per jump.
    const payload = restoreText(next, { existingChains, jumps: jumpEdits });
    if (payload === '') restore?.cancel();
    else await (restore ? restore.finish(payload) : this.xt.restore(payload));
    this.applied = next;
    this.log.info({ reason, bytes: payload.length, jumpsInserted }, 'full rewrite of pier chains');
    return { family: this.family, mode: 'full', payloadBytes: payload.length, jumpsInserted, reason };
  }

  /** nat and filter in one iptables-save call. */
  private async saveTables(): Promise<SavedTables> {
    const all = parseSave(await this.xt.save());
    for (const table of TABLES) if (!all.has(table)) all.set(table, new Map());
    return all;
  }

  private async canaryIntact(): Promise<boolean> {
    for (const table of TABLES) {
      if (!(await this.xt.chainHasRules(table, CANARY_CHAIN))) return false;
    }
    return true;
  }

  /**
   * Checks each jump with -C and inserts the missing ones at the top of their
   * built-in chain (so the host's own DROP rules cannot shadow them),
   * in reverse so the rendered order holds. Used on resyncs; full rewrites
   * fold jump edits into their restore payload instead.
   */
  private async ensureJumps(next: Ruleset): Promise<number> {
    let inserted = 0;
    for (const table of TABLES) {
      const missing = [];
      for (const j of next.tables[table].jumps) if (!(await this.xt.checkRule(table, j.chain, j.rule))) missing.push(j);
      for (const j of missing.reverse()) {
        await this.xt.insertRule(table, j.chain, j.rule, 1);
        inserted++;
      }
    }
    return inserted;
  }
}

/**
 * From a save of one table: jumps into pier chains that are not wanted (an
 * older pier's, or duplicates) and wanted jumps that are missing.
 */
export function planJumps(next: Ruleset, table: TableName, saved: Map<string, string[]> | undefined): JumpEdits {
  const wanted = next.tables[table].jumps;
  const want = new Set(wanted.map((j) => `${j.chain}\u0000${j.rule}`));
  const seen = new Set<string>();
  const remove: JumpEdits['remove'] = [];
  for (const [chain, rules] of saved ?? []) {
    if (chain.startsWith(CHAIN_PREFIX)) continue;
    for (const rule of rules) {
      if (!jumpTarget(rule)?.startsWith(CHAIN_PREFIX)) continue;
      const key = `${chain}\u0000${rule}`;
      if (!want.has(key) || seen.has(key)) remove.push({ chain, rule });
      seen.add(key);
    }
  }
  const insert = wanted.filter((j) => !seen.has(`${j.chain}\u0000${j.rule}`));
  return { remove, insert };
}

/** Every pier chain in one table of a parsed save. */
export function pierChains(tables: Map<string, string[]> | undefined): string[] {
  return [...(tables?.keys() ?? [])].filter((c) => c.startsWith(CHAIN_PREFIX));
}

/** The target of a rule as iptables-save prints it (`-j X` or `-g X`). */
export function jumpTarget(rule: string): string | undefined {
  // Split first: a comment may contain " -j ".
  const words = splitRule(rule);
  for (let i = words.length - 2; i >= 0; i--) if (words[i] === '-j' || words[i] === '-g') return words[i + 1];
  return undefined;
}

/**
 * Removes every pier jump and chain from both tables of one family, and
 * nothing else, in one transaction: `pier cleanup`. Returns what it removed.
 */
export async function removeAll(xt: Xtables): Promise<{ jumps: number; chains: number }> {
  const saved = parseSave(await xt.save());
  const edits: Partial<Record<TableName, JumpEdits>> = {};
  const existingChains: Partial<Record<TableName, string[]>> = {};
  let jumps = 0;
  let chains = 0;
  for (const table of TABLES) {
    const tableChains = saved.get(table);
    existingChains[table] = pierChains(tableChains);
    chains += existingChains[table].length;
    edits[table] = { remove: [], insert: [] };
    for (const [chain, rules] of tableChains ?? []) {
      if (chain.startsWith(CHAIN_PREFIX)) continue;
      for (const rule of rules) if (jumpTarget(rule)?.startsWith(CHAIN_PREFIX)) edits[table].remove.push({ chain, rule });
    }
    jumps += edits[table].remove.length;
  }
  const payload = restoreText(EMPTY, { existingChains, jumps: edits });
  if (payload !== '') await xt.restore(payload);
  return { jumps, chains };
}

const EMPTY: Ruleset = {
  family: 'ipv4',
  tables: { nat: { chains: new Map(), jumps: [] }, filter: { chains: new Map(), jumps: [] } },
};
