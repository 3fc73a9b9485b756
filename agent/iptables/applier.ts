// Makes the kernel hold a rendered ruleset, for one address family, with as
// little work as possible:
//  - nothing at all when the desired ruleset equals what was last applied;
//  - otherwise one iptables-restore --noflush transaction with only the
//    changed chains (restoreText's delta), falling back to a full rewrite of
//    every pier chain when the partial one fails;
//  - a full rewrite when pier's state in the kernel is unknown: at start, or
//    after a failure;
//  - on verifying (periodic) resyncs, the kernel's pier chains and jumps are
//    read back and compared with what was applied (findDrift): whatever
//    differs (a flushed or edited chain, a missing or stray one, a missing or
//    duplicated jump) is rewritten in the same single transaction as the
//    sync's own changes (healText), and logged;
//  - jumps from built-in chains: on full rewrites, those the save shows are
//    deleted and inserted again in the same transaction and the missing ones
//    inserted; on verifying resyncs, as healJumps says.
// iptables-save is only read on full rewrites and verifying resyncs (it costs
// hundreds of milliseconds at 10,000 ports); event-driven syncs trust what
// was applied. The first save is read ahead, while the
// agent's informers list the cluster, so that it is off the path from "caches
// synced" to "rules in place". The iptables-restore of a full rewrite is
// started ahead too, and waits for its payload. The two families' appliers
// run side by side where the backend allows it (eachFamily).
import type { Family } from '../../lib/contract.ts';
import type { Logger } from '../../lib/log.ts';
import { silentLogger } from '../../lib/log.ts';
import type { IptablesFlavour, StartedRestore, Xtables } from './xtables.ts';
import type { AgentMetrics } from '../metrics.ts';
import type { ApplyMode } from '../backend.ts';
import { CHAIN_PREFIX, sameStrings, TABLES, type Ruleset, type TableName } from './render.ts';
import { jumpTarget, parseSave, restorePieces, restoreText, type JumpEdits, type SavedTables } from './restore.ts';

export type { JumpEdits };


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
  /** What a verifying resync found changed from outside (and rewrote); absent when nothing was. */
  drift?: Drift;
}

/** How many drifted chains a log line names; the counts cover them all. */
const DRIFT_LOG_CHAINS = 10;

/**
 * Runs `apply` for each family: side by side with nft, one after the other
 * with legacy. An iptables-nft-restore spends most of its time in its own
 * process, parsing and building its batch, and the kernel takes the two
 * families' commits one at a time anyway, so side by side is the faster
 * (bench:agent, 10,000 ports per family). A legacy restore holds the xtables lock, which
 * iptables and ip6tables share, for its whole run: the second would only
 * wait for it, and could wait past -w.
 */
export async function eachFamily<T>(flavour: IptablesFlavour, families: readonly Family[], apply: (family: Family) => Promise<T>): Promise<T[]> {
  if (flavour === 'nft') return Promise.all(families.map(apply));
  const out: T[] = [];
  for (const family of families) out.push(await apply(family));
  return out;
}

export class Applier {
  readonly family: Family;
  private readonly xt: Xtables;
  private readonly log: Logger;
  private readonly metrics: Pick<AgentMetrics, 'drift'> | undefined;
  /** What the kernel holds, as far as this process knows; undefined = unknown. */
  private applied: Ruleset | undefined;

  /** Whether the kernel holds what this applier last wrote. */
  get holdsRules(): boolean {
    return this.applied !== undefined;
  }
  /** The save for the next full rewrite, started early by prepare(), and when it started. */
  private pendingSave: { tables: Promise<SavedTables>; at: number } | undefined;
  /** The next full rewrite's iptables-restore, started by prepare(). */
  private pendingRestore: StartedRestore | undefined;

  constructor(xt: Xtables, log: Logger = silentLogger, metrics?: Pick<AgentMetrics, 'drift'>) {
    this.xt = xt;
    this.family = xt.family;
    this.log = log.child({ family: xt.family });
    this.metrics = metrics;
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
   * Applies `next`. `verify` (periodic resyncs) also reads the kernel's pier
   * chains and jumps back and rewrites whatever differs from what was
   * applied, to heal changes made behind pier's back.
   */
  async apply(next: Ruleset, opts: { verify?: boolean } = {}): Promise<ApplyResult> {
    let reason: string | undefined;
    if (!this.applied) reason = 'initial sync';
    else if (opts.verify) return this.verified(next, this.applied);

    if (reason === undefined && this.applied) {
      const payload = next === this.applied ? '' : restoreText(next, { previous: this.applied });
      if (payload === '') return { family: this.family, mode: 'noop', payloadBytes: 0, jumpsInserted: 0 };
      try {
        await this.xt.restore(payload);
        this.applied = next;
        return { family: this.family, mode: 'partial', payloadBytes: payload.length, jumpsInserted: 0 };
      } catch (err) {
        reason = `partial restore failed: ${(err as Error).message}`;
        this.log.warn({ err: (err as Error).message }, 'partial restore failed; rewriting every pier chain');
      }
    }
    return this.full(next, reason ?? 'full');
  }

  /**
   * A verifying resync: one save, compared with what was applied (drift, for
   * the log and the metric) and with `next` (the payload: drift healed and the
   * sync's own changes in one transaction).
   */
  private async verified(next: Ruleset, applied: Ruleset): Promise<ApplyResult> {
    const saved = await this.saveTables();
    const drift = findDrift(applied, saved);
    if (drift) this.reportDrift(drift);
    // The common case, a resync of what was applied with nothing drifted: no second comparison.
    if (!drift && next === applied) return { family: this.family, mode: 'noop', payloadBytes: 0, jumpsInserted: 0 };
    const { payload, jumpsInserted } = healText(next, saved);
    if (payload === '') return { family: this.family, mode: 'noop', payloadBytes: 0, jumpsInserted: 0, drift };
    try {
      await this.xt.restore(payload);
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, 'restore at a verifying resync failed; rewriting every pier chain');
      return { ...(await this.full(next, `verifying restore failed: ${(err as Error).message}`)), drift };
    }
    this.applied = next;
    return { family: this.family, mode: 'partial', payloadBytes: payload.length, jumpsInserted, drift };
  }

  private reportDrift(drift: Drift): void {
    for (const c of drift.chains) this.metrics?.drift.inc({ family: this.family, table: c.table, kind: 'chain' });
    for (const j of drift.jumps) this.metrics?.drift.inc({ family: this.family, table: j.table, kind: 'jump' }, j.missing + j.unwanted);
    this.log.warn(driftLogFields(drift), 'pier chains were changed from outside; rewriting what differs');
  }

  private async full(next: Ruleset, reason: string): Promise<ApplyResult> {
    this.applied = undefined;
    const pending = this.pendingSave;
    this.pendingSave = undefined;
    // Without prepare() (after a failed partial or verifying restore), the restore process
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
      const edits = diffJumps(next, table, saved.get(table));
      jumpsInserted += edits.insert.length;
      // The wanted jumps the save shows are deleted and inserted again: had
      // one vanished since the save was read, its -D fails the restore
      // rather than leave the node without it until a resync; and each goes
      // back to the top of its chain, above rules added since.
      const missing = new Set(edits.insert);
      const wanted = next.tables[table].jumps;
      jumpEdits[table] = { remove: [...edits.remove, ...wanted.filter((j) => !missing.has(j))], insert: [...wanted] };
    }
    // One transaction: stale jumps out (before their chains are deleted),
    // chains rewritten, jumps in. No command per jump. Written out as the
    // restore takes it.
    const bytes = await (restore ?? this.xt.startRestore()).finish(restorePieces(next, { existingChains, jumps: jumpEdits }));
    this.applied = next;
    this.log.info({ reason, bytes, jumpsInserted }, 'full rewrite of pier chains');
    return { family: this.family, mode: 'full', payloadBytes: bytes, jumpsInserted, reason };
  }

  /** nat and filter in one iptables-save call. */
  private async saveTables(): Promise<SavedTables> {
    const all = parseSave(await this.xt.save());
    for (const table of TABLES) if (!all.has(table)) all.set(table, new Map());
    return all;
  }
}

/**
 * From a save of one table: jumps into pier chains that are not wanted (an
 * older pier's, or duplicates) and wanted jumps that are missing.
 */
export function diffJumps(next: Ruleset, table: TableName, saved: Map<string, string[]> | undefined): JumpEdits {
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

/** One chain whose kernel state differs from what pier applied. */
export interface ChainDrift {
  table: TableName;
  chain: string;
  /** missing: applied, gone from the kernel; changed: its rules differ; unwanted: a pier chain pier did not apply. */
  state: 'missing' | 'changed' | 'unwanted';
  /** Rules applied that the kernel lacks (as a multiset: a duplicate counts). */
  lost: number;
  /** Rules the kernel holds that were not applied. A reordered chain has neither. */
  added: number;
}

export interface Drift {
  /** By table, then as the applied ruleset lists its chains, unwanted ones last. */
  chains: ChainDrift[];
  /** Tables whose jumps into pier chains differ: wanted ones missing, others (stale, foreign, duplicated) present; both 0 when only their order changed. */
  jumps: { table: TableName; missing: number; unwanted: number }[];
}

/**
 * What differs between the ruleset pier last applied and a save of the
 * kernel: pier's chains (rule texts compared as strings, since rendered rules
 * are spelled as iptables-save prints them) and the jumps into them.
 * undefined when nothing does.
 */
export function findDrift(applied: Ruleset, saved: SavedTables): Drift | undefined {
  const chains: ChainDrift[] = [];
  const jumps: Drift['jumps'] = [];
  for (const table of TABLES) {
    const have = saved.get(table);
    const want = applied.tables[table].chains;
    for (const [chain, rules] of want) {
      const held = have?.get(chain);
      if (!held) chains.push({ table, chain, state: 'missing', lost: rules.length, added: 0 });
      else if (!sameStrings(held, rules)) chains.push({ table, chain, state: 'changed', ...ruleCounts(rules, held) });
    }
    for (const chain of pierChains(have)) {
      if (!want.has(chain)) chains.push({ table, chain, state: 'unwanted', lost: 0, added: have!.get(chain)!.length });
    }
    let missing = 0;
    let unwanted = 0;
    let differ = false;
    for (const j of jumpChains(applied, table, have)) {
      if (sameStrings(j.have, j.want)) continue;
      const counts = ruleCounts(j.want, j.have);
      missing += counts.lost;
      unwanted += counts.added;
      differ = true;
    }
    if (differ) jumps.push({ table, missing, unwanted });
  }
  return chains.length > 0 || jumps.length > 0 ? { chains, jumps } : undefined;
}

/**
 * The --noflush payload that turns the kernel's pier state, as saved, into
 * `next`: restoreText's delta with the save in place of the previous ruleset
 * (only chains whose rules differ are written, pier chains not in `next`
 * deleted), and the jump edits of healJumps. Empty when the kernel holds `next`.
 */
export function healText(next: Ruleset, saved: SavedTables): { payload: string; jumpsInserted: number } {
  const kernel: Ruleset = { family: next.family, tables: { nat: savedTable(saved, 'nat'), filter: savedTable(saved, 'filter') } };
  const jumps: Partial<Record<TableName, JumpEdits>> = {};
  let jumpsInserted = 0;
  for (const table of TABLES) {
    const edits = healJumps(next, table, saved.get(table));
    jumpsInserted += edits.missing;
    jumps[table] = edits;
  }
  return { payload: restoreText(next, { previous: kernel, jumps }), jumpsInserted };
}

/**
 * The jump edits for a verifying resync. A built-in chain whose jumps into
 * pier chains are not, in order, the ones `next` wants (one missing,
 * duplicated, stale, or out of order) has them all deleted and the wanted
 * ones inserted again at its top, so that they end as after a full rewrite;
 * other chains are left alone. `missing` counts wanted jumps that were absent.
 */
export function healJumps(next: Ruleset, table: TableName, saved: Map<string, string[]> | undefined): JumpEdits & { missing: number } {
  const edits = { remove: [] as JumpEdits['remove'], insert: [] as JumpEdits['insert'], missing: 0 };
  for (const { chain, want, have } of jumpChains(next, table, saved)) {
    if (sameStrings(have, want)) continue;
    for (const rule of have) edits.remove.push({ chain, rule });
    for (const rule of want) edits.insert.push({ chain, rule });
    edits.missing += ruleCounts(want, have).lost;
  }
  return edits;
}

/** Per chain outside pier's (built-in ones, in practice): the jumps into pier chains `next` wants there, and those the save shows, in order. */
function jumpChains(next: Ruleset, table: TableName, saved: Map<string, string[]> | undefined): { chain: string; want: string[]; have: string[] }[] {
  const byChain = new Map<string, { chain: string; want: string[]; have: string[] }>();
  const entry = (chain: string) => {
    let e = byChain.get(chain);
    if (!e) byChain.set(chain, (e = { chain, want: [], have: [] }));
    return e;
  };
  for (const j of next.tables[table].jumps) entry(j.chain).want.push(j.rule);
  for (const [chain, rules] of saved ?? []) {
    if (chain.startsWith(CHAIN_PREFIX)) continue;
    for (const rule of rules) if (jumpTarget(rule)?.startsWith(CHAIN_PREFIX)) entry(chain).have.push(rule);
  }
  return [...byChain.values()];
}

/** A drift as log fields: totals, and the first few chains by name (a flush of everything must not log thousands of lines). */
export function driftLogFields(drift: Drift): Record<string, unknown> {
  const count = (state: ChainDrift['state']) => drift.chains.filter((c) => c.state === state).length;
  const fields: Record<string, unknown> = {
    chainsChanged: count('changed'),
    chainsMissing: count('missing'),
    chainsUnwanted: count('unwanted'),
    rulesLost: drift.chains.reduce((n, c) => n + c.lost, 0),
    rulesAdded: drift.chains.reduce((n, c) => n + c.added, 0),
    chains: drift.chains.slice(0, DRIFT_LOG_CHAINS).map((c) => `${c.table} ${c.chain}: ${c.state}, ${c.lost} rules lost, ${c.added} added`),
  };
  if (drift.chains.length > DRIFT_LOG_CHAINS) fields.moreChains = drift.chains.length - DRIFT_LOG_CHAINS;
  if (drift.jumps.length > 0) fields.jumps = drift.jumps.map((j) => `${j.table}: ${j.missing} missing, ${j.unwanted} unwanted`);
  return fields;
}

/** A drift as lines, one per chain and per table of jumps (ApplyResult.drift). */
export function driftLines(drift: Drift): string[] {
  return [
    ...drift.chains.map((c) => `${c.table} ${c.chain}: ${c.state}, ${c.lost} rules lost, ${c.added} added`),
    ...drift.jumps.map((j) => `${j.table} jumps: ${j.missing} missing, ${j.unwanted} unwanted`),
  ];
}

/** One table's pier chains from a save, as a ruleset's table (jumps aside: healJumps reads those). */
function savedTable(saved: SavedTables, table: TableName): Ruleset['tables'][TableName] {
  const chains = new Map<string, string[]>();
  const have = saved.get(table);
  for (const chain of pierChains(have)) chains.set(chain, have!.get(chain)!);
  return { chains, jumps: [] };
}

/** Rules of `want` missing from `have`, and rules of `have` not in `want`, counted as multisets. */
function ruleCounts(want: readonly string[], have: readonly string[]): { lost: number; added: number } {
  const left = new Map<string, number>();
  for (const r of want) left.set(r, (left.get(r) ?? 0) + 1);
  let added = 0;
  for (const r of have) {
    const n = left.get(r) ?? 0;
    if (n > 0) left.set(r, n - 1);
    else added++;
  }
  let lost = 0;
  for (const n of left.values()) lost += n;
  return { lost, added };
}

/** Every pier chain in one table of a parsed save. */
export function pierChains(tables: Map<string, string[]> | undefined): string[] {
  return [...(tables?.keys() ?? [])].filter((c) => c.startsWith(CHAIN_PREFIX));
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
