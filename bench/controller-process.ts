// `pier controller` as the benchmark runs it: bundled as the images ship it
// (Node's TypeScript loader alone would add ~17 MB to its memory), a
// process of its own in the root namespace, its health server on loopback so
// the benchmark can read /readyz and /metrics, its memory read from /proc.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { execa, type ResultPromise } from 'execa';
import { atExit } from '../test/support/cleanup.ts';
import { controllerMetrics } from '../test/support/controller.ts';
import { freePort } from '../test/support/ports.ts';
import { bundleInto } from '../scripts/bundle.ts';
import { ROOT } from './transpile.ts';

const OUT = join(ROOT, '.cache', 'bench-controller');
let compiled: Promise<string> | undefined;

/** The bundle the images ship (scripts/bundle.ts), built into .cache/bench-controller once. */
function compiledCli(): Promise<string> {
  compiled ??= bundleInto(OUT);
  return compiled;
}

export interface Memory {
  /** VmRSS: resident now. */
  rssBytes: number;
  /** VmHWM: the most ever resident. */
  hwmBytes: number;
  /** V8's heap: live objects, and what it has reserved (it rarely gives memory back after a burst). */
  heapUsedBytes: number;
  heapTotalBytes: number;
}

export class ControllerProcess {
  readonly proc: ResultPromise;
  readonly port: number;
  /** performance.now() at spawn. */
  readonly spawnedAt: number;
  private stderr = '';
  private exit: string | undefined;
  private stopping = false;
  private readonly unregister: () => void;

  private constructor(proc: ResultPromise, port: number, spawnedAt: number) {
    this.proc = proc;
    this.port = port;
    this.spawnedAt = spawnedAt;
    proc.stderr?.on('data', (d: Buffer) => {
      this.stderr = (this.stderr + d.toString()).slice(-20_000);
    });
    void proc.then((r) => {
      this.exit = String(r.exitCode ?? r.signal);
      // A benchmark waiting for statuses would otherwise wait out its whole timeout.
      if (!this.stopping) process.stderr.write(`controller ${proc.pid} exited unexpectedly (${this.exit}); its last output:\n${this.stderr.slice(-5000)}\n`);
    });
    // setpriv's parent-death signal covers a SIGKILLed benchmark; this covers Ctrl-C and errors.
    this.unregister = atExit(() => proc.kill('SIGKILL'));
  }

  /** `nodeFlags`: Node's own, before the script (shippedNodeFlags() runs it as its image does). */
  static async start(kubeconfig: string, extra: string[] = [], nodeFlags: readonly string[] = []): Promise<ControllerProcess> {
    const cli = await compiledCli();
    const port = await freePort();
    const spawnedAt = performance.now();
    const proc = execa('setpriv', ['--pdeathsig', 'SIGKILL', '--', process.execPath, ...nodeFlags, cli, 'controller',
      '--kubeconfig', kubeconfig,
      '--leader-elect-id', `bench-${process.pid}-${port}`,
      '--health-address', '127.0.0.1',
      '--health-port', String(port),
      '--log-level', 'warn',
      ...extra,
    ], { stdin: 'ignore', stdout: 'ignore', reject: false });
    return new ControllerProcess(proc, port, spawnedAt);
  }

  get pid(): number {
    return this.proc.pid!;
  }

  log(): string {
    return this.stderr;
  }

  /** Resolves once /readyz says this replica leads (caches synced, Lease held). */
  async leading(timeoutMs = 60_000): Promise<number> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const res = await fetch(`http://127.0.0.1:${this.port}/readyz`).catch(() => undefined);
      if (res?.ok && (await res.text()).startsWith('leader')) return performance.now();
      if (this.exit !== undefined || performance.now() > deadline) {
        throw new Error(`controller not leading after ${timeoutMs} ms (${this.exit === undefined ? 'running' : `exited: ${this.exit}`}):\n${this.stderr}`);
      }
      await sleep(20);
    }
  }

  /** pier_controller_* samples as `name{labels}` -> value. */
  async metrics(): Promise<Map<string, number>> {
    return controllerMetrics(await (await fetch(`http://127.0.0.1:${this.port}/metrics`)).text());
  }

  /** Sum of every sample whose name starts with `prefix`. */
  async sum(prefix: string): Promise<number> {
    let n = 0;
    for (const [k, v] of await this.metrics()) if (k.startsWith(prefix)) n += v;
    return n;
  }

  /** performance.now() once no Event waits to be written (they wait for the status writes to pause). */
  async eventsWritten(timeoutMs = 120_000): Promise<number> {
    const deadline = performance.now() + timeoutMs;
    while ((await this.sum('pier_controller_events_pending')) > 0) {
      if (performance.now() > deadline) throw new Error(`Events still pending after ${timeoutMs} ms`);
      await sleep(50);
    }
    return performance.now();
  }

  async memory(): Promise<Memory> {
    const status = readFileSync(`/proc/${this.pid}/status`, 'utf8');
    const kb = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN) * 1024;
    const text = await (await fetch(`http://127.0.0.1:${this.port}/metrics`)).text();
    const gauge = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1] ?? NaN);
    return {
      rssBytes: kb('VmRSS'),
      hwmBytes: kb('VmHWM'),
      heapUsedBytes: gauge('nodejs_heap_size_used_bytes'),
      heapTotalBytes: gauge('nodejs_heap_size_total_bytes'),
    };
  }

  /** User plus system CPU time the process has used so far, in seconds. */
  cpuSeconds(): number {
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th of them, in clock ticks (100 Hz on Linux).
    const stat = readFileSync(`/proc/${this.pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100;
  }

  /**
   * Waits until the controller has nothing queued and has written nothing
   * for `quietMs`, then returns its memory: the steady state, not a burst.
   */
  async settle(quietMs = 3000, timeoutMs = 120_000): Promise<Memory> {
    const deadline = performance.now() + timeoutMs;
    let last = -1;
    let since = performance.now();
    for (;;) {
      const m = await this.metrics();
      let writes = 0;
      for (const [k, v] of m) if (k.startsWith('pier_controller_status_writes_total')) writes += v;
      const queued = m.get('pier_controller_queue_depth') ?? 0;
      if (writes !== last || queued > 0) {
        last = writes;
        since = performance.now();
      } else if (performance.now() - since >= quietMs) {
        return this.memory();
      }
      if (performance.now() > deadline) throw new Error(`controller still busy after ${timeoutMs} ms`);
      await sleep(250);
    }
  }

  /** SIGTERM (the leader releases its Lease) and wait; SIGKILL after 15 s. */
  async stop(): Promise<void> {
    this.stopping = true;
    this.proc.kill('SIGTERM');
    const t = setTimeout(() => this.proc.kill('SIGKILL'), 15_000);
    await this.proc.catch(() => undefined);
    clearTimeout(t);
    this.unregister();
  }
}
