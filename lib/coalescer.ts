// Turns a stream of "something changed" signals into runs of one task:
// never two at once, never closer together than `minIntervalMs`, and every
// signal followed by a run that started after it. A burst of informer
// events therefore costs one sync, not one per event. With `dutyCycle`, a
// run that took long spaces the next one further out, so that under a
// steady stream of signals the task takes at most that share of the time
// however long it grows (the controller's allocation grows with the cluster).
export class Coalescer<O extends object> {
  private readonly task: (opts: O) => Promise<void>;
  private readonly minIntervalMs: number;
  private readonly dutyCycle: number;
  private readonly merge: (a: O, b: O) => O;
  private pending: O | undefined;
  private running = false;
  private lastStart = -Infinity;
  private lastDuration = 0;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private idleWaiters: (() => void)[] = [];

  constructor(task: (opts: O) => Promise<void>, opts: { minIntervalMs: number; merge: (a: O, b: O) => O; dutyCycle?: number }) {
    this.task = task;
    this.minIntervalMs = opts.minIntervalMs;
    this.merge = opts.merge;
    this.dutyCycle = opts.dutyCycle ?? 1;
    if (!(this.dutyCycle > 0 && this.dutyCycle <= 1)) throw new RangeError(`dutyCycle must be in (0, 1], not ${opts.dutyCycle}`);
  }

  /** Asks for a run; options of requests that coalesce are merged. */
  request(opts: O): void {
    if (this.stopped) return;
    this.pending = this.pending ? this.merge(this.pending, opts) : opts;
    this.schedule();
  }

  private schedule(): void {
    if (this.running || this.timer || !this.pending) return;
    const interval = Math.max(this.minIntervalMs, this.lastDuration / this.dutyCycle);
    const wait = this.lastStart + interval - performance.now();
    if (wait > 0) {
      this.timer = setTimeout(() => {
        this.timer = undefined;
        this.schedule();
      }, wait);
      return;
    }
    const opts = this.pending;
    this.pending = undefined;
    this.running = true;
    this.lastStart = performance.now();
    // The task reports its own errors; a rejection here must not stop the loop.
    const started = this.lastStart;
    void this.task(opts)
      .catch(() => undefined)
      .finally(() => {
        this.running = false;
        this.lastDuration = performance.now() - started;
        if (this.pending && !this.stopped) this.schedule();
        else if (!this.timer) for (const w of this.idleWaiters.splice(0)) w();
      });
  }

  /** Resolves when no run is in progress or pending. */
  idle(): Promise<void> {
    if (!this.running && !this.pending) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** Drops pending requests and waits for a run in progress to finish. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.pending = undefined;
    clearTimeout(this.timer);
    this.timer = undefined;
    await this.idle();
  }
}
