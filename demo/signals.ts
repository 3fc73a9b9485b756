// Waiting for Ctrl-C. The harness (test/support/cleanup.ts) answers SIGINT,
// SIGTERM and SIGHUP by tearing down synchronously and exiting 130: right for
// an interrupted test, but the demo, once everything runs, should stop its
// processes in order and exit 0. So while it waits, the demo takes those
// signals over. The harness's 'exit' hook stays in place as the last resort.
const SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;

/** Resolves with the first of SIGINT, SIGTERM, SIGHUP. */
export function untilSignal(): Promise<NodeJS.Signals> {
  for (const s of SIGNALS) process.removeAllListeners(s);
  return new Promise((resolve) => {
    const first = (signal: NodeJS.Signals) => {
      firstAt = Date.now();
      for (const s of SIGNALS) process.removeListener(s, first);
      for (const s of SIGNALS) process.on(s, impatient);
      resolve(signal);
    };
    for (const s of SIGNALS) process.on(s, first);
  });
}

// Ctrl-C at a terminal reaches the demo and npm, which passes it on once more;
// that copy arrives within milliseconds and must not cut the orderly teardown
// short. A second Ctrl-C by a person, later, exits at once; the 'exit' hooks
// then kill and delete what is left.
let firstAt = 0;
function impatient(): void {
  if (Date.now() - firstAt > 1000) process.exit(130);
}
