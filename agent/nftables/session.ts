// A resident `nft -i` for pier's small transactions. Starting nft costs a
// node 10-20 ms each time (the process, its libraries, its cache of the
// ruleset), more than a one-Service change may take; through a process kept
// running the same change takes ~1 ms (bench:agent, "one Service changed").
//
// Why by hand: libnftables has no Node binding, and nft's interactive mode
// has no "done" signal. It reads one transaction per line and prints nothing
// when one succeeds, so each line is followed by a word nft cannot parse,
// naming the transaction: nft reports that syntax error on stderr after
// whatever the transaction reported, which marks where its messages end.
// Parsing fails before nft looks at its cache or the kernel, so the marker
// costs nothing.
import type { Subprocess } from 'execa';
import { CommandError, type Runner } from '../../lib/run.ts';

/** An nft command or transaction failed. */
export class NftError extends CommandError {
  override name = 'NftError';
}

/** How long one transaction may take before the process is deemed stuck and replaced. */
const TIMEOUT_MS = 30_000;

/**
 * Larger scripts go to `nft -f`: nft's line editor reads input a byte at a
 * time (~1.7 us per byte, a 2 MB table ~3.5 s against ~0.65 s through
 * `nft -f`), which costs more than a new process from about 10 KB.
 */
export const SESSION_MAX_BYTES = 8 * 1024;

/** The first lines of what nft printed, on one line: enough for an error message. */
export function firstLines(text: string): string {
  return text.trim().split('\n').slice(0, 3).join(' | ');
}

interface Pending {
  marker: string;
  resolve: () => void;
  reject: (err: Error) => void;
  timer: NodeJS.Timeout;
}

export class NftSession {
  private readonly start: NonNullable<Runner['start']>;
  private proc: Subprocess | undefined;
  private stderr = '';
  private pending: Pending | undefined;
  private seq = 0;
  private queue: Promise<void> = Promise.resolve();

  constructor(start: NonNullable<Runner['start']>) {
    this.start = start;
  }

  /** Runs `script` as one transaction; throws with nft's message when nft refuses it. One at a time. */
  run(script: string): Promise<void> {
    const next = this.queue.then(() => this.once(script));
    this.queue = next.catch(() => undefined);
    return next;
  }

  /**
   * Starts nft ahead of the first transaction: a new `nft -i` takes ~0.1 s
   * at 10,000 ports before it answers (bench:agent), which the first
   * change after a full write would otherwise wait for.
   */
  prime(): void {
    this.run('').catch(() => undefined);
  }

  close(): void {
    const p = this.proc;
    this.proc = undefined;
    p?.stdin?.end();
    p?.kill();
  }

  private once(script: string): Promise<void> {
    const proc = this.process();
    const marker = `pier-transaction-${++this.seq}`;
    // One line is one transaction: nft takes `;` where a script has a newline.
    const line = script
      .split('\n')
      .filter((l) => l.trim() !== '')
      .join('; ');
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => this.fail(new NftError(`nft -i did not answer within ${TIMEOUT_MS / 1000} s`, this.stderr, undefined)), TIMEOUT_MS);
      this.pending = { marker, resolve, reject, timer };
      proc.stdin!.write(`${line}\n${marker}\n`);
    });
  }

  private process(): Subprocess {
    if (this.proc) return this.proc;
    const proc = this.start('nft', ['-i']);
    this.proc = proc;
    this.stderr = '';
    proc.stderr!.setEncoding('utf8');
    proc.stderr!.on('data', (chunk: string) => {
      this.stderr += chunk;
      this.settle();
    });
    // A write after the process is gone is reported by its exit.
    proc.stdin!.on('error', () => undefined);
    void proc.then((r) => {
      if (this.proc !== proc) return;
      this.proc = undefined;
      const how = r.failed && r.exitCode === undefined ? `could not start: ${r.shortMessage}` : `exited (${r.signal ?? `code ${r.exitCode}`})`;
      this.fail(new NftError(`nft -i ${how}: ${firstLines(this.stderr)}`, this.stderr, r.exitCode));
    });
    return proc;
  }

  /** Settles the transaction under way once nft has reported its marker, with the caret line below it. */
  private settle(): void {
    const p = this.pending;
    if (!p) return;
    const at = this.stderr.indexOf(`\n${p.marker}\n`);
    if (at < 0) return;
    const end = this.stderr.indexOf('\n', at + p.marker.length + 2);
    if (end < 0) return;
    // What precedes the marker's own "Error: syntax error" line is the transaction's.
    const own = this.stderr.slice(0, this.stderr.lastIndexOf('\n', at - 1) + 1).trim();
    this.stderr = this.stderr.slice(end + 1);
    this.pending = undefined;
    clearTimeout(p.timer);
    if (own === '') p.resolve();
    else p.reject(new NftError(`nft refused the transaction: ${firstLines(own)}`, own, 1));
  }

  private fail(err: Error): void {
    const p = this.pending;
    this.pending = undefined;
    if (p) {
      clearTimeout(p.timer);
      p.reject(err);
    }
    // Stuck or gone: the next transaction starts a new process.
    this.close();
  }
}
