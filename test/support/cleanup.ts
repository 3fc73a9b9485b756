// Last-resort cleanup for test harnesses. Each harness tears down in its own
// stop(); what it registers here runs only if the process exits (or is
// interrupted) before that, so an aborted run still leaves no namespaces,
// processes or temporary files behind. Handlers must be synchronous: on
// 'exit' nothing asynchronous runs any more.

const handlers = new Set<() => void>();
let installed = false;

function runAll(): void {
  for (const h of [...handlers].reverse()) {
    handlers.delete(h);
    try {
      h();
    } catch {
      // keep cleaning up the rest
    }
  }
}

function install(): void {
  if (installed) return;
  installed = true;
  process.once('exit', runAll);
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    process.once(sig, () => {
      runAll();
      process.exit(128 + (sig === 'SIGINT' ? 2 : sig === 'SIGTERM' ? 15 : 1));
    });
  }
}

/** Registers `fn` to run at exit; call the returned function once cleaned up normally. */
export function atExit(fn: () => void): () => void {
  install();
  handlers.add(fn);
  return () => handlers.delete(fn);
}

/** True when a process with this pid exists (signal 0 probes without sending). */
export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
