// The only module that runs nft: applies nft.ts's tables and transactions
// through execa (the Runner) with the script on stdin, never a shell; small
// transactions through a resident nft (NftSession).
import type { Family } from '../../lib/contract.ts';
import { silentLogger, type Logger } from '../../lib/log.ts';
import { type Runner, type RunResult } from '../../lib/run.ts';
import type { AgentMetrics } from '../metrics.ts';
import { SET } from './names.ts';
import { carriedClients, createScript, elementScripts, NFT_FAMILY, NFT_TABLE, nftDrift, nftScript, parseNftJson, type NftRuleset, type NftUpdate } from './render.ts';
import { firstLines, NftError, NftSession, SESSION_MAX_BYTES } from './session.ts';
import type { ApplyResult } from '../backend.ts';

/** One nft apply: the backends' common shape (drift: the differences found). */
export type NftApplyResult = ApplyResult;

/** The transactions a table written where none is takes, side by side (elementScripts): one per core of the 2-core benchmark machine. */
const FRESH_PARTS = 2;

/** An `nft -f -` waiting for its script (NftApplier.waitingNft). */
interface WaitingNft {
  give: (script: string) => void;
  result: Promise<RunResult>;
}

/** How many differences a log line names. */
const DRIFT_LOG_ITEMS = 10;

export class NftApplier {
  readonly family: Family;
  private readonly run: Runner;
  private readonly log: Logger;
  private readonly metrics: Pick<AgentMetrics, 'drift'> | undefined;
  /** The renderer's version the kernel holds, as far as this process knows; undefined = unknown. */
  private applied: number | undefined;
  private readonly session: NftSession | undefined;
  /** Whether this process has written the table: only its first write may find none there. */
  private wrote = false;
  private closed = false;
  /** The nft processes of the first write (fresh()), started with the applier, waiting for their scripts. */
  private firstWrite: { create: WaitingNft; parts: WaitingNft[] } | undefined;

  constructor(family: Family, run: Runner, log: Logger = silentLogger, metrics?: Pick<AgentMetrics, 'drift'>) {
    this.family = family;
    this.run = run;
    this.log = log.child({ family });
    this.metrics = metrics;
    this.session = run.start ? new NftSession(run.start) : undefined;
    this.firstWrite = this.startFirstWrite();
  }

  private startFirstWrite(): { create: WaitingNft; parts: WaitingNft[] } {
    return { create: this.waitingNft(), parts: Array.from({ length: FRESH_PARTS }, () => this.waitingNft()) };
  }

  /**
   * An `nft -f -` started now, reading its script when given one: starting
   * a process costs 20-30 ms here, in a large Node process, and three of
   * them were 60-85 ms of a cold sync's path (bench:agent, "nftables ...
   * cold sync"). An empty script does nothing.
   */
  private waitingNft(): WaitingNft {
    let give: (script: string) => void = () => {};
    const script = new Promise<string>((resolve) => (give = resolve));
    const result = this.run('nft', ['-f', '-'], script).catch((err: Error): RunResult => ({ exitCode: -1, stdout: '', stderr: err.message }));
    return { give, result };
  }

  /** Whether the kernel holds a version of the table this applier wrote: else the next apply writes it whole. */
  get holdsTable(): boolean {
    return this.applied !== undefined;
  }

  /** Stops the resident nft, and the first write's processes if they still wait. */
  close(): void {
    this.closed = true;
    this.session?.close();
    // Given nothing to do, they end.
    for (const n of this.firstWrite ? [this.firstWrite.create, ...this.firstWrite.parts] : []) n.give('');
    this.firstWrite = undefined;
  }

  /** The first write's processes: those started with the applier, or new ones after close(). */
  private takeFirstWrite(): { create: WaitingNft; parts: WaitingNft[] } {
    const w = this.firstWrite ?? this.startFirstWrite();
    this.firstWrite = undefined;
    return w;
  }

  /**
   * Applies an update of one NftRenderer: its transaction when the kernel
   * holds the version it starts from, else the whole table (nothing known
   * yet, or the last transaction failed). `verify` (periodic resyncs) then
   * reads pier's table back and replaces it when it differs from the state.
   */
  async apply(u: NftUpdate, opts: { verify?: boolean } = {}): Promise<NftApplyResult> {
    if (this.applied === undefined) return this.full(u, 'initial sync');
    if (this.applied !== u.since) return this.full(u, `the kernel holds version ${this.applied}, the change starts from ${u.since}`);
    if (u.delta === undefined) return this.full(u, 'no transaction was made');
    let result: NftApplyResult = { family: this.family, mode: 'noop', payloadBytes: 0 };
    if (u.delta !== '') {
      try {
        if (this.session && u.delta.length <= SESSION_MAX_BYTES) await this.session.run(u.delta);
        else await this.nft(u.delta);
        this.applied = u.version;
        result = { family: this.family, mode: 'partial', payloadBytes: u.delta.length };
      } catch (err) {
        this.log.warn({ err: (err as Error).message }, "changing pier's nftables table failed; replacing it whole");
        return this.full(u, `partial change failed: ${(err as Error).message}`);
      }
    }
    if (!opts.verify) return result;
    const drift = await this.drift(u.state);
    if (drift.length === 0) return result;
    this.metrics?.drift.inc({ family: this.family, table: NFT_TABLE, kind: 'table' });
    this.log.warn({ found: drift.length, differences: drift.slice(0, DRIFT_LOG_ITEMS) }, "pier's nftables table was changed from outside; replacing it");
    return { ...(await this.full(u, 'drift')), drift };
  }

  private async full(u: NftUpdate, reason: string): Promise<NftApplyResult> {
    this.applied = undefined;
    const first = !this.wrote;
    this.wrote = true;
    const bytes = (first && (await this.fresh(u))) || (await this.replace(u));
    this.applied = u.version;
    // Off the sync's path: the rules are in place.
    setImmediate(() => {
      if (!this.closed) this.session?.prime();
    });
    // What it serves, to tell an empty or partial first table from a full one in the log.
    const count = (set: string) => u.state.sets.get(set)?.size ?? 0;
    this.log.info({ reason, bytes, frontends: count(SET.services), noEndpoints: count(SET.noEndpoints) }, "pier's nftables table written whole");
    return { family: this.family, mode: 'full', payloadBytes: bytes, reason };
  }

  /** The table replaced whole in one transaction: the bytes written. */
  private async replace(u: NftUpdate): Promise<number> {
    // nft starts while the script is written out: its start-up (~10-15 ms)
    // is then off a cold sync's path (bench:agent, "nftables ... cold sync").
    let give: (script: string) => void = () => {};
    const started = this.nft(new Promise<string>((resolve) => (give = resolve)));
    const payload = nftScript(u.state) + (await this.remembered(u.state));
    give(payload);
    await started;
    return payload.length;
  }

  /**
   * This process's first write, where the kernel holds no pier table (a
   * node's boot): the table created empty, then its elements in FRESH_PARTS
   * transactions side by side (elementScripts). Until the last commits, a
   * frontend not yet written is unserved, as it was before. False when a
   * table is there (an agent's restart: replace() keeps it whole until the
   * new one commits) or when a part failed; replace() then writes it all.
   */
  private async fresh(u: NftUpdate): Promise<number | false> {
    const { create, parts } = this.takeFirstWrite();
    const made = createScript(u.state);
    create.give(made);
    // Written out while the table is made.
    const elements = elementScripts(u.state, FRESH_PARTS);
    const r = await create.result;
    const ok = r.exitCode === 0;
    parts.forEach((p, k) => p.give(ok ? (elements[k] ?? '') : ''));
    const results = await Promise.all(parts.map((p) => p.result));
    if (!ok) {
      if (!/File exists/.test(r.stderr)) this.log.info({ err: firstLines(r.stderr) }, "creating pier's nftables table failed; replacing it whole");
      return false;
    }
    const failed = results.find((p) => p.exitCode !== 0);
    if (failed) {
      this.log.warn({ err: firstLines(failed.stderr) }, "writing pier's new nftables table in parts failed; replacing it whole");
      return false;
    }
    return made.length + elements.reduce((n, e) => n + e.length, 0);
  }

  /** The clients the table in the kernel remembers for `state`'s affinity sets (carriedClients); '' when it has none, or there is no table. */
  private async remembered(state: NftRuleset): Promise<string> {
    if (![...state.own.values()].some((o) => o.kind === 'set')) return '';
    const r = await this.run('nft', ['-j', 'list', 'table', NFT_FAMILY[this.family], NFT_TABLE]);
    if (r.exitCode !== 0) return '';
    try {
      return carriedClients(r.stdout, state);
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, "reading the clients pier's nftables table remembers failed; session affinity starts afresh");
      return '';
    }
  }

  /** The differences between pier's table in the kernel and `state`; a missing table is one. */
  private async drift(state: NftRuleset): Promise<string[]> {
    const r = await this.run('nft', ['-j', 'list', 'table', NFT_FAMILY[this.family], NFT_TABLE]);
    if (r.exitCode !== 0) {
      if (/No such file or directory/.test(r.stderr)) return ['table: missing'];
      throw new NftError(`nft list table failed (exit ${r.exitCode}): ${r.stderr.trim()}`, r.stderr, r.exitCode);
    }
    return nftDrift(state, parseNftJson(r.stdout));
  }

  private async nft(script: string | Promise<string>): Promise<void> {
    const r = await this.run('nft', ['-f', '-'], script);
    if (r.exitCode !== 0) throw new NftError(`nft -f failed (exit ${r.exitCode}): ${firstLines(r.stderr)}`, r.stderr, r.exitCode);
  }
}

/**
 * Whether nft runs and the kernel would take pier's table: a transaction
 * checked, not committed. Cheaper than listing, which reads every element
 * of every table first.
 */
export async function nftUsable(run: Runner): Promise<{ ok: true } | { ok: false; error: string }> {
  try {
    const r = await run('nft', ['--check', 'add', 'table', 'ip', NFT_TABLE]);
    return r.exitCode === 0 ? { ok: true } : { ok: false, error: `nft --check add table: ${firstLines(r.stderr) || `exit ${r.exitCode}`}` };
  } catch (err) {
    return { ok: false, error: (err as Error).message };
  }
}

/**
 * Base chains of other tables on the forward hook whose policy drops: an
 * accept in pier's table cannot override them, so what pier DNATs to
 * another host passes only if their own rules accept it.
 */
export function forwardDrops(listChainsJson: string): string[] {
  const items = (JSON.parse(listChainsJson) as { nftables: { chain?: { family: string; table: string; name: string; hook?: string; policy?: string } }[] }).nftables;
  return items
    .map((i) => i.chain)
    .filter((c) => c !== undefined && c.hook === 'forward' && c.policy === 'drop' && c.table !== NFT_TABLE)
    .map((c) => `${c!.family} ${c!.table} ${c!.name}`);
}

export async function findForwardDrops(run: Runner): Promise<string[]> {
  const r = await run('nft', ['-j', 'list', 'chains']);
  return r.exitCode === 0 ? forwardDrops(r.stdout) : [];
}

/** Deletes pier's tables of both families; how many there were. */
export async function removeNftTables(run: Runner): Promise<number> {
  let removed = 0;
  for (const family of ['ip', 'ip6']) {
    const r = await run('nft', ['delete', 'table', family, NFT_TABLE]);
    if (r.exitCode === 0) removed++;
    else if (!/No such file or directory/.test(r.stderr)) throw new NftError(`nft delete table ${family} ${NFT_TABLE} failed: ${firstLines(r.stderr)}`, r.stderr, r.exitCode);
  }
  return removed;
}
