// iptables for one family and flavour: save, restore (whole or started
// ahead), and whether a table works. Every call goes through the Runner
// (lib/run.ts) with an argument array, never a shell.
import type { Family } from '../../lib/contract.ts';
import { CommandError, commandRunner, type Input, type Runner, type RunResult } from '../../lib/run.ts';

/** Which iptables binaries the host uses: iptables-nft or iptables-legacy (`--iptables-backend`). */
export type IptablesFlavour = 'nft' | 'legacy';
export type Table = 'nat' | 'filter' | 'mangle' | 'raw';

/** Seconds to wait for the xtables lock another process holds (kube-proxy, kubelet, firewalld). */
const WAIT_SECONDS = '5';

/** An iptables command failed. */
export class IptablesError extends CommandError {
  override name = 'IptablesError';
}

export function binaries(flavour: IptablesFlavour, family: Family): { cmd: string; save: string; restore: string } {
  const base = family === 'ipv4' ? 'iptables' : 'ip6tables';
  return { cmd: `${base}-${flavour}`, save: `${base}-${flavour}-save`, restore: `${base}-${flavour}-restore` };
}

/** An iptables-restore process waiting for its payload (Xtables.startRestore). */
export interface StartedRestore {
  /** Hands over the payload; resolves to its length, or throws as Xtables.restore does. */
  finish(payload: Input): Promise<number>;
  /** Lets it exit without changing anything. A no-op after finish(). */
  cancel(): void;
}

/** iptables for one family and flavour. */
export class Xtables {
  readonly family: Family;
  readonly flavour: IptablesFlavour;
  private readonly run: Runner;
  private readonly bin: ReturnType<typeof binaries>;
  private readonly wait: string[];

  constructor(family: Family, flavour: IptablesFlavour, run: Runner = commandRunner()) {
    this.family = family;
    this.flavour = flavour;
    this.run = run;
    this.bin = binaries(flavour, family);
    // nft needs no lock and warns about the interval flag; legacy polls the lock.
    this.wait = flavour === 'legacy' ? ['-w', WAIT_SECONDS, '-W', '100000'] : ['-w', WAIT_SECONDS];
  }

  /** Applies a payload in one transaction without flushing what it does not name. */
  async restore(payload: string, opts: { test?: boolean } = {}): Promise<void> {
    this.checkRestore(await this.run(this.bin.restore, this.restoreArgs(opts.test), payload), payload);
  }

  /**
   * iptables-restore --noflush started now, its payload given later, so that
   * starting it (about 7 ms from exec to reading stdin, execa's share
   * included) is off the path of the payload. It holds nothing while it
   * waits: the legacy backend takes the xtables lock and nft reads the
   * kernel's rules only once input arrives. Cancelled or left behind, it reads
   * an empty input and exits having changed nothing.
   */
  startRestore(): StartedRestore {
    let give: (payload: Input) => void = () => {};
    const input = new Promise<Input>((resolve) => (give = resolve));
    let given = false;
    let exited = false;
    const outcome = this.run(this.bin.restore, this.restoreArgs(), input).finally(() => {
      exited = true;
    });
    // A cancelled one's result is nobody's; finish() awaits it otherwise.
    outcome.catch(() => undefined);
    return {
      finish: async (payload) => {
        if (given) throw new Error('this iptables-restore was already given its input');
        given = true;
        if (exited) {
          // Gone before it got anything (killed, or it could not start): one now.
          const whole = typeof payload === 'string' ? payload : [...payload].join('');
          await this.restore(whole);
          return whole.length;
        }
        if (typeof payload === 'string') {
          give(payload);
          this.checkRestore(await outcome, payload);
          return payload.length;
        }
        // What was written: joined only for a failure's line.
        const written: string[] = [];
        give(recorded(payload, written));
        const r = await outcome;
        if (r.exitCode !== 0) this.checkRestore(r, written.join(''));
        return written.reduce((n, piece) => n + piece.length, 0);
      },
      cancel: () => {
        given = true;
        give('');
      },
    };
  }

  private restoreArgs(test = false): string[] {
    return [...this.wait, '--noflush', ...(test ? ['--test'] : [])];
  }

  private checkRestore(r: RunResult, payload: string): void {
    if (r.exitCode !== 0) {
      throw new IptablesError(`${this.bin.restore} failed: ${describeRestoreFailure(r.stderr, payload)}`, r.stderr, r.exitCode);
    }
  }

  /** iptables-save of one table, or of all. Slow at scale (hundreds of ms for 10k rules): not for every sync. */
  async save(table?: Table): Promise<string> {
    const r = await this.run(this.bin.save, table ? ['-t', table] : []);
    if (r.exitCode !== 0) throw new IptablesError(`${this.bin.save}${table ? ` -t ${table}` : ''} failed: ${r.stderr.trim()}`, r.stderr, r.exitCode);
    return r.stdout;
  }

  /** Whether `table` can be used at all (ip6tables' nat table needs kernel support). */
  async hasTable(table: Table): Promise<{ ok: boolean; error?: string }> {
    const r = await this.run(this.bin.cmd, [...this.wait, '-t', table, '-S', 'INPUT', '1']);
    // A table without an INPUT chain (raw) still answers 1 for a missing chain, not 3 (module missing).
    if (r.exitCode === 0) return { ok: true };
    return { ok: false, error: r.stderr.trim() || `exit code ${r.exitCode}` };
  }
}

/** `pieces` as they are taken, each kept in `into`. */
function* recorded(pieces: Iterable<string>, into: string[]): Generator<string> {
  for (const piece of pieces) {
    into.push(piece);
    yield piece;
  }
}

/** Adds the offending payload line to iptables-restore's "Error occurred at line: N". */
export function describeRestoreFailure(stderr: string, payload: string): string {
  const msg = stderr.trim().split('\n').filter((l) => !l.startsWith('Try `')).join('; ');
  const m = /line:? (\d+)/i.exec(stderr);
  if (!m) return msg || 'no error output';
  const line = payload.split('\n')[Number(m[1]) - 1];
  return line === undefined ? msg : `${msg} (line ${m[1]}: ${line})`;
}
