// Runs the tools pier drives (iptables, nft, conntrack): execa with an
// argument array, never a shell; a payload written to stdin as it is made.
import { execa, type Subprocess } from 'execa';
import { once } from 'node:events';
import { constants } from 'node:os';
import type { Writable } from 'node:stream';
import { ExplainedError } from './errors.ts';

/** A command pier ran failed, or could not start; the message says which and why. */
export class CommandError extends ExplainedError {
  override name = 'CommandError';
  readonly stderr: string;
  readonly exitCode: number | undefined;
  constructor(message: string, stderr: string, exitCode: number | undefined) {
    super(message);
    this.stderr = stderr;
    this.exitCode = exitCode;
  }
}

/** The command could not be started at all: its binary is missing. */
export class MissingToolError extends CommandError {
  override name = 'MissingToolError';
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
      throw new MissingToolError(`cannot run ${file}: ${r.shortMessage}`, stderr, undefined);
    }
    return { exitCode: r.exitCode ?? 1, stdout, stderr };
  }
}

/** Pieces are gathered into writes of about this size: a pipe's default capacity. */
const PIPE_CHUNK = 64 * 1024;

/**
 * Writes `input` to a process's stdin and ends it. Pieces are made only as
 * the pipe takes the last ones, so that the tool parses the first while the
 * rest are made (10,000 ports' iptables-restore payload, 3.7 MB: 655 ms
 * against 727 ms made first). Stops quietly when the process is gone; its
 * exit says why. Throws what the pieces throw, leaving stdin open.
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

