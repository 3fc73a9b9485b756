// Turns a stream of "something changed" signals into runs of one task:
// never two at once, never closer together than `minIntervalMs`, and every
// signal followed by a run that started after it. A burst of informer
// events therefore costs one sync, not one per event. With `dutyCycle`, a
// run that took long spaces the next one further out, so that under a
// steady stream of signals the task takes at most that share of the time
// however long it grows (the controller's allocation grows with the cluster).
// `burstMs` lets that share be saved up while idle: a signal after a quiet
// spell runs at once even if a run just ended, so the pacing holds back
// sustained streams, not the first change after them. The share is a credit
// earned at `dutyCycle` ms per ms, at most `burstMs`, and spent by each run.
export class Coalescer<O extends object> {
  private readonly task: (opts: O) => Promise<void>;
  private readonly minIntervalMs: number;
  private readonly dutyCycle: number;
  private readonly burstMs: number;
  private readonly merge: (a: O, b: O) => O;
  private pending: O | undefined;
  private running = false;
  private lastStart = -Infinity;
  private credit: number;
  private creditAt = performance.now();
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private idleWaiters: (() => void)[] = [];

  constructor(task: (opts: O) => Promise<void>, opts: { minIntervalMs: number; merge: (a: O, b: O) => O; dutyCycle?: number; burstMs?: number }) {
    this.task = task;
    this.minIntervalMs = opts.minIntervalMs;
    this.merge = opts.merge;
    this.dutyCycle = opts.dutyCycle ?? 1;
    this.burstMs = opts.burstMs ?? 0;
    if (!(this.dutyCycle > 0 && this.dutyCycle <= 1)) throw new RangeError(`dutyCycle must be in (0, 1], not ${opts.dutyCycle}`);
    if (!(this.burstMs >= 0)) throw new RangeError(`burstMs must be >= 0, not ${opts.burstMs}`);
    this.credit = this.burstMs;
  }

  /** Asks for a run; options of requests that coalesce are merged. */
  request(opts: O): void {
    if (this.stopped) return;
    this.pending = this.pending ? this.merge(this.pending, opts) : opts;
    this.schedule();
  }

  private schedule(): void {
    if (this.running || this.timer || !this.pending) return;
    const now = performance.now();
    const credit = Math.min(this.burstMs, this.credit + (now - this.creditAt) * this.dutyCycle);
    const wait = Math.max(this.lastStart + this.minIntervalMs - now, -credit / this.dutyCycle);
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
    this.lastStart = now;
    // The task reports its own errors; a rejection here must not stop the loop.
    void this.task(opts)
      .catch(() => undefined)
      .finally(() => {
        this.running = false;
        // Earned during the run too, uncapped: with no burst this spaces runs d / dutyCycle apart.
        const end = performance.now();
        this.credit = credit - (end - now) * (1 - this.dutyCycle);
        this.creditAt = end;
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
