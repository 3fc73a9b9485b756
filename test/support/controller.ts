// `pier controller` from source as a process of the test, for the
// integration tests: started with its health server on loopback and waited
// for until ready, its log kept, its metrics read from /metrics. setpriv
// kills it with the test process, even a killed one.
import { fileURLToPath } from 'node:url';
import { execa, type ResultPromise } from 'execa';
import { atExit } from './cleanup.ts';
import { freePort } from './ports.ts';
import { eventually } from './wait.ts';

const CLI = fileURLToPath(new URL('../../cmd/cli.ts', import.meta.url));
/** The log kept per controller: the tail, enough for a failure's story. */
const LOG_CHARS = 200_000;

export interface ControllerRun {
  proc: ResultPromise;
  /** Its health and metrics port on 127.0.0.1. */
  port: number;
  log: () => string;
  exited: () => boolean;
  /** SIGTERM (the exit code must then be 0, else an Error with the log) or SIGKILL; resolves once it exited. */
  stop: (signal?: 'SIGTERM' | 'SIGKILL') => Promise<void>;
  /** Its `pier_controller_*` metrics, as `name{labels}` -> value. */
  metrics: () => Promise<Map<string, number>>;
  /** The sum of a metric over its labels. */
  metric: (name: string) => Promise<number>;
}

/** Starts `pier controller --kubeconfig <kubeconfig> <args>` and waits for /readyz. */
export async function startController(kubeconfig: string, args: readonly string[]): Promise<ControllerRun> {
  const port = await freePort();
  let log = '';
  let exited = false;
  const proc = execa('setpriv', ['--pdeathsig', 'SIGKILL', '--', process.execPath, CLI, 'controller',
    '--kubeconfig', kubeconfig,
    '--health-address', '127.0.0.1',
    '--health-port', String(port),
    ...args,
  ], { reject: false, stdin: 'ignore' });
  void proc.then(() => (exited = true));
  proc.stderr?.on('data', (d: Buffer) => (log = (log + d.toString()).slice(-LOG_CHARS)));
  atExit(() => proc.kill('SIGKILL'));

  const metrics = async () => controllerMetrics(await (await fetch(`http://127.0.0.1:${port}/metrics`)).text());
  const run: ControllerRun = {
    proc,
    port,
    log: () => log,
    exited: () => exited,
    async stop(signal = 'SIGTERM') {
      proc.kill(signal);
      const res = await proc;
      if (signal === 'SIGTERM' && res.exitCode !== 0) throw new Error(`controller exited with ${res.exitCode} on SIGTERM:\n${log.slice(-5000)}`);
    },
    metrics,
    async metric(name) {
      let n = 0;
      for (const [k, v] of await metrics()) if (k === name || k.startsWith(`${name}{`)) n += v;
      return n;
    },
  };
  await eventually('controller ready', async () => (await fetch(`http://127.0.0.1:${port}/readyz`).catch(() => undefined))?.ok, { timeoutMs: 30_000 });
  return run;
}

/** The `pier_controller_*` samples of a /metrics text, as `name{labels}` -> value. */
export function controllerMetrics(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (!line.startsWith('pier_controller_')) continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}
