// A steady client: probe.ts connecting to one address over and over (a new
// TCP connection every `intervalMs`) until stopped, as a user's traffic
// would, with its attempts tallied by how they failed. A refusal (the SYN
// answered by a reset: pier's REJECT of a port without endpoints, or the
// node's own stack where no DNAT rule caught the SYN), a reset of a
// connection already made, and a timeout (the SYN or its answer lost, or no
// reply) point at different causes, so they are counted apart.
import { fileURLToPath } from 'node:url';
import type { ResultPromise } from 'execa';
import type { Endpoint, ProbeResult } from './lab.ts';

const PROBE = fileURLToPath(new URL('./probe.ts', import.meta.url));

export interface Tally {
  total: number;
  ok: number;
  /** ECONNREFUSED: the SYN was answered with a reset. */
  refused: number;
  /** ECONNRESET: a connection made, then reset. */
  reset: number;
  timeout: number;
  /** Anything else (an unparsable reply, another errno). */
  other: number;
}

export function tally(results: readonly ProbeResult[]): Tally {
  const t: Tally = { total: results.length, ok: 0, refused: 0, reset: 0, timeout: 0, other: 0 };
  for (const r of results) {
    if (r.ok) t.ok++;
    else if (r.error === 'ECONNREFUSED') t.refused++;
    else if (r.error === 'ECONNRESET') t.reset++;
    else if (r.error === 'timeout') t.timeout++;
    else t.other++;
  }
  return t;
}

/** A tally as one line: `203 connections: 198 answered, 5 refused, 0 reset, 0 timed out, 0 other`. */
export function describeTally(t: Tally): string {
  return `${t.total} connections: ${t.ok} answered, ${t.refused} refused, ${t.reset} reset, ${t.timeout} timed out, ${t.other} other`;
}

export interface SteadyClient {
  /** Resolves once the first attempt has ended. */
  started: Promise<void>;
  /** The attempts so far. */
  readonly results: readonly ProbeResult[];
  /** Stops the client and returns every attempt. */
  stop(): Promise<ProbeResult[]>;
}

/**
 * Starts probe.ts in `from`'s namespace. An attempt may take `timeoutMs`
 * (default 3 s): longer than the kernel's 1 s initial SYN timeout, so a lost
 * SYN is retransmitted (see Lab.tcpRetransmits) rather than cut short, and a
 * client the machine's load holds back is not mistaken for a lost connection.
 */
export function steadyClient(
  lab: { spawn(ns: string, file: string, args: string[]): ResultPromise },
  from: Endpoint,
  host: string,
  port: number,
  opts: { proto?: 'tcp' | 'udp'; intervalMs?: number; timeoutMs?: number } = {},
): SteadyClient {
  const args = [PROBE, '--proto', opts.proto ?? 'tcp', '--host', host, '--port', String(port), '--count', '1000000', '--timeout', String(opts.timeoutMs ?? 3000), '--interval', String(opts.intervalMs ?? 50)];
  const proc = lab.spawn(from.ns, process.execPath, args);
  const results: ProbeResult[] = [];
  let partial = '';
  let first: () => void;
  const started = new Promise<void>((resolve) => (first = resolve));
  proc.stdout!.on('data', (d: Buffer) => {
    const lines = (partial + d.toString()).split('\n');
    partial = lines.pop()!;
    for (const l of lines) if (l.trim()) results.push(JSON.parse(l) as ProbeResult);
    if (results.length > 0) first();
  });
  return {
    started,
    results,
    async stop() {
      proc.kill('SIGTERM');
      await proc;
      return results;
    },
  };
}
