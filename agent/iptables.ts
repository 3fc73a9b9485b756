// The only module that runs iptables. Every call goes through execa with an
// argument array; rule text from the renderer is split into arguments
// (splitRule), never handed to a shell.
import { execa, type Subprocess } from 'execa';
import { once } from 'node:events';
import { constants } from 'node:os';
import type { Writable } from 'node:stream';
import type { Family } from '../lib/contract.ts';
import { splitRule } from './restore.ts';

export type Backend = 'nft' | 'legacy';
export type Table = 'nat' | 'filter' | 'mangle' | 'raw';

/** Seconds to wait for the xtables lock another process holds (kube-proxy, kubelet, firewalld). */
const WAIT_SECONDS = '5';

export class IptablesError extends Error {
  override name = 'IptablesError';
  readonly stderr: string;
  readonly exitCode: number | undefined;
  constructor(message: string, stderr: string, exitCode: number | undefined) {
    super(message);
    this.stderr = stderr;
    this.exitCode = exitCode;
  }
}

export interface RunResult {
  exitCode: number;
  stdout: string;
  stderr: string;
}

/** A tool's input: whole, or in pieces made as the tool takes them (writeInput). */
export type Input = string | Iterable<string>;

/**
 * Runs one command. `prefix` (for example `ip netns exec NS`) lets tests and
 * benchmarks aim the agent at a namespace of their own; the agent itself runs
 * in the namespace it programs and uses none. A promised `input` starts the
 * process at once and writes its stdin when the promise settles. Should the
 * promise or the input's pieces fail, the process is killed before it reads
 * an end: a tool given part of its input must not take it for the whole.
 */
export type Runner = ((file: string, args: string[], input?: string | Promise<Input>) => Promise<RunResult>) & {
  /**
   * Starts a long-lived process where the runner runs its commands, its
   * stdin and stderr piped. A runner without it (some tests') gets
   * one process per command.
   */
  start?: (file: string, args: string[]) => Subprocess;
};

/**
 * The environment of every tool pier runs: glibc's malloc on transparent
 * huge pages. nft and iptables-restore allocate a small object per element
 * and rule, and page faults were most of their time (bench:agent at 10,000
 * ports: nft -f of pier's table 0.5 s of user time with glibc's defaults,
 * 0.23 s with this; iptables-restore 10-15 % faster). An operator's own
 * GLIBC_TUNABLES wins; a glibc before 2.35, or THP set to never, ignores it.
 */
export function toolEnv(env: NodeJS.ProcessEnv = process.env): Record<string, string> {
  return { GLIBC_TUNABLES: env['GLIBC_TUNABLES'] ?? 'glibc.malloc.hugetlb=1' };
}

export function commandRunner(prefix: readonly string[] = []): Runner {
  const argv = (file: string, args: string[]) => (prefix.length > 0 ? [...prefix, file, ...args] : [file, ...args]);
  const env = toolEnv();
  const start = (file: string, args: string[]): Subprocess => {
    const [cmd, ...rest] = argv(file, args);
    return execa(cmd!, rest, { env, stdin: 'pipe', stdout: 'ignore', stderr: 'pipe', buffer: false, reject: false });
  };
  return Object.assign(run, { start });
  async function run(file: string, args: string[], input?: string | Promise<Input>): Promise<RunResult> {
    const [cmd, ...rest] = argv(file, args);
    const now = typeof input === 'string' ? input : undefined;
    const sub = execa(cmd!, rest, { env, input: now, reject: false, stripFinalNewline: false, maxBuffer: 512 * 1024 * 1024 });
    // execa reports a write to a process that is already gone in the result,
    // not as an error of its own.
    if (typeof input === 'object' && sub.stdin) {
      const stdin = sub.stdin;
      input.then((given) => writeInput(stdin, given)).catch(() => sub.kill('SIGKILL'));
    }
    const r = await sub;
    const stdout = String(r.stdout ?? '');
    const stderr = String(r.stderr ?? '');
    if (r.signal) {
      // As a shell reports it: 128 + the signal's number.
      return { exitCode: 128 + (constants.signals[r.signal] ?? 0), stdout, stderr: `${stderr}${file} was killed by ${r.signal}\n` };
    }
    if (r.failed && r.exitCode === undefined) {
      // Not started at all (binary missing): say which one.
      throw new IptablesError(`cannot run ${file}: ${r.shortMessage}`, stderr, undefined);
    }
    return { exitCode: r.exitCode ?? 1, stdout, stderr };
  }
}

/** Pieces are gathered into writes of about this size: a pipe's default capacity. */
const PIPE_CHUNK = 64 * 1024;

/**
 * Writes `input` to a process's stdin and ends it. Pieces are made only as
 * the pipe takes the last ones, so that the tool parses the first while the
 * rest are made: an iptables-restore of 10,000 ports' payload (3.7 MB) fed
 * so took 655 ms where the same text made first took 727 ms (median of 9
 * each, alternating); bench:agent's cold sync at 10,000 ports, the two ways
 * alternating in one run, 8 syncs each: 944 and 873 ms against 972 and 890
 * in two runs. Stops quietly when the process is gone; its exit says why.
 * Throws what the pieces throw, leaving stdin open.
 */
export async function writeInput(stdin: Writable, input: Input): Promise<void> {
  if (typeof input === 'string') {
    stdin.end(input);
    return;
  }
  let chunk = '';
  for (const piece of input) {
    chunk += piece;
    if (chunk.length < PIPE_CHUNK) continue;
    if (stdin.destroyed) return;
    const flowing = stdin.write(chunk);
    chunk = '';
    if (!flowing && !(await drained(stdin))) return;
  }
  if (!stdin.destroyed) stdin.end(chunk);
}

/** Whether the stream drained, rather than closed or failed first. */
async function drained(stream: Writable): Promise<boolean> {
  const stop = new AbortController();
  try {
    return await Promise.race([once(stream, 'drain', { signal: stop.signal }).then(() => true), once(stream, 'close', { signal: stop.signal }).then(() => false)]);
  } catch {
    return false;
  } finally {
    stop.abort();
  }
}

export function binaries(backend: Backend, family: Family): { cmd: string; save: string; restore: string } {
  const base = family === 'ipv4' ? 'iptables' : 'ip6tables';
  return { cmd: `${base}-${backend}`, save: `${base}-${backend}-save`, restore: `${base}-${backend}-restore` };
}

/** An iptables-restore process waiting for its payload (Xtables.startRestore). */
export interface StartedRestore {
  /** Hands over the payload; resolves to its length, or throws as Xtables.restore does. */
  finish(payload: Input): Promise<number>;
  /** Lets it exit without changing anything. A no-op after finish(). */
  cancel(): void;
}

/** iptables for one family and backend. */
export class Xtables {
  readonly family: Family;
  readonly backend: Backend;
  private readonly run: Runner;
  private readonly bin: ReturnType<typeof binaries>;
  private readonly wait: string[];

  constructor(family: Family, backend: Backend, run: Runner = commandRunner()) {
    this.family = family;
    this.backend = backend;
    this.run = run;
    this.bin = binaries(backend, family);
    // nft needs no lock and warns about the interval flag; legacy polls the lock.
    this.wait = backend === 'legacy' ? ['-w', WAIT_SECONDS, '-W', '100000'] : ['-w', WAIT_SECONDS];
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

  async chainExists(table: Table, chain: string): Promise<boolean> {
    const r = await this.run(this.bin.cmd, [...this.wait, '-t', table, '-S', chain, '1']);
    return r.exitCode === 0;
  }

  /** Whether `chain` exists and holds at least one rule (the canary test: a flush empties chains). */
  async chainHasRules(table: Table, chain: string): Promise<boolean> {
    const r = await this.run(this.bin.cmd, [...this.wait, '-t', table, '-S', chain]);
    return r.exitCode === 0 && r.stdout.split('\n').some((l) => l.startsWith('-A '));
  }

  async checkRule(table: Table, chain: string, rule: string): Promise<boolean> {
    const r = await this.run(this.bin.cmd, [...this.wait, '-t', table, '-C', chain, ...splitRule(rule)]);
    if (r.exitCode === 0) return true;
    if (r.exitCode === 1) return false;
    throw new IptablesError(`${this.bin.cmd} -t ${table} -C ${chain} ${rule}: ${r.stderr.trim()}`, r.stderr, r.exitCode);
  }

  async insertRule(table: Table, chain: string, rule: string, position = 1): Promise<void> {
    await this.must(['-t', table, '-I', chain, String(position), ...splitRule(rule)]);
  }

  /** Deletes one copy of the rule; false when it was not there. */
  async deleteRule(table: Table, chain: string, rule: string): Promise<boolean> {
    const r = await this.run(this.bin.cmd, [...this.wait, '-t', table, '-D', chain, ...splitRule(rule)]);
    return r.exitCode === 0;
  }

  private async must(args: string[]): Promise<void> {
    const r = await this.run(this.bin.cmd, [...this.wait, ...args]);
    if (r.exitCode !== 0) throw new IptablesError(`${this.bin.cmd} ${args.join(' ')}: ${r.stderr.trim()}`, r.stderr, r.exitCode);
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
