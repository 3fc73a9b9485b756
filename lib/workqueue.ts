// A rate-limited work queue with client-go's semantics, which every controller
// author already knows: a key is queued at most once; a key being processed is
// never handed to a second worker, and if it changes meanwhile it is queued
// again when the first worker is done; failures are retried with per-key
// exponential backoff, and an overall token bucket caps the retry rate.

export interface RateLimiter<K> {
  /** Milliseconds to wait before `key` may be processed again. */
  when(key: K): number;
  /** Stop tracking `key` (it succeeded or was given up on). */
  forget(key: K): void;
  /** How many times `key` has been rate-limited since it was last forgotten. */
  retries(key: K): number;
}

/** base * 2^failures, capped at max: the per-item half of the pair. */
export class ExponentialBackoffLimiter<K> implements RateLimiter<K> {
  private readonly failures = new Map<K, number>();
  private readonly baseMs: number;
  private readonly maxMs: number;
  constructor(baseMs = 5, maxMs = 300_000) {
    this.baseMs = baseMs;
    this.maxMs = maxMs;
  }
  when(key: K): number {
    const n = this.failures.get(key) ?? 0;
    this.failures.set(key, n + 1);
    return Math.min(this.baseMs * 2 ** n, this.maxMs);
  }
  forget(key: K): void {
    this.failures.delete(key);
  }
  retries(key: K): number {
    return this.failures.get(key) ?? 0;
  }
}

/**
 * A token bucket of `burst` tokens refilled at `qps`: the overall half of the
 * pair. Each call reserves a token and returns how long until it is available,
 * so a storm of failures is spread out instead of hammering the API server.
 */
export class TokenBucketLimiter<K> implements RateLimiter<K> {
  private tokens: number;
  private last: number;
  private readonly qps: number;
  private readonly burst: number;
  private readonly now: () => number;
  constructor(qps = 10, burst = 100, now: () => number = Date.now) {
    this.qps = qps;
    this.burst = burst;
    this.now = now;
    this.tokens = burst;
    this.last = now();
  }
  when(_key: K): number {
    const t = this.now();
    this.tokens = Math.min(this.burst, this.tokens + ((t - this.last) / 1000) * this.qps);
    this.last = t;
    this.tokens -= 1;
    return this.tokens >= 0 ? 0 : Math.ceil((-this.tokens / this.qps) * 1000);
  }
  forget(_key: K): void {}
  retries(_key: K): number {
    return 0;
  }
}

/** The longest delay any of the limiters asks for. */
export class MaxOfLimiter<K> implements RateLimiter<K> {
  private readonly limiters: RateLimiter<K>[];
  constructor(...limiters: RateLimiter<K>[]) {
    this.limiters = limiters;
  }
  when(key: K): number {
    return Math.max(0, ...this.limiters.map((l) => l.when(key)));
  }
  forget(key: K): void {
    for (const l of this.limiters) l.forget(key);
  }
  retries(key: K): number {
    return Math.max(0, ...this.limiters.map((l) => l.retries(key)));
  }
}

/** The sample-controller's default: 5 ms doubling to 1000 s per key, 10 qps / 100 burst overall. */
export function defaultControllerRateLimiter<K>(): RateLimiter<K> {
  return new MaxOfLimiter<K>(new ExponentialBackoffLimiter<K>(5, 1_000_000), new TokenBucketLimiter<K>(10, 100));
}

export class WorkQueue<K> {
  private readonly queue: K[] = [];
  /** Keys that need processing: queued, or changed while being processed. */
  private readonly dirty = new Set<K>();
  private readonly processing = new Set<K>();
  private readonly waiters: ((key: K | undefined) => void)[] = [];
  private readonly timers = new Map<K, { timer: NodeJS.Timeout; due: number }>();
  private shuttingDown = false;
  private drainWaiters: (() => void)[] = [];

  readonly limiter: RateLimiter<K>;
  constructor(limiter: RateLimiter<K> = defaultControllerRateLimiter<K>()) {
    this.limiter = limiter;
  }

  add(key: K): void {
    if (this.shuttingDown || this.dirty.has(key)) return;
    this.dirty.add(key);
    // A key being processed is re-queued by done(), so one worker owns it.
    if (this.processing.has(key)) return;
    const waiter = this.waiters.shift();
    if (waiter) {
      this.dirty.delete(key);
      this.processing.add(key);
      waiter(key);
    } else {
      this.queue.push(key);
    }
  }

  /** Adds `key` after `ms`; a later call with a shorter delay wins. */
  addAfter(key: K, ms: number): void {
    if (this.shuttingDown) return;
    if (ms <= 0) {
      this.add(key);
      return;
    }
    const due = Date.now() + ms;
    const existing = this.timers.get(key);
    if (existing) {
      if (existing.due <= due) return;
      clearTimeout(existing.timer);
    }
    const timer = setTimeout(() => {
      this.timers.delete(key);
      this.add(key);
    }, ms);
    timer.unref();
    this.timers.set(key, { timer, due });
  }

  addRateLimited(key: K): void {
    this.addAfter(key, this.limiter.when(key));
  }

  forget(key: K): void {
    this.limiter.forget(key);
  }

  retries(key: K): number {
    return this.limiter.retries(key);
  }

  /** Resolves with the next key, or undefined once the queue shuts down. */
  get(): Promise<K | undefined> {
    const key = this.queue.shift();
    if (key !== undefined) {
      this.dirty.delete(key);
      this.processing.add(key);
      return Promise.resolve(key);
    }
    if (this.shuttingDown) return Promise.resolve(undefined);
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  /** Must be called once for every key get() returned. */
  done(key: K): void {
    this.processing.delete(key);
    if (this.dirty.has(key)) {
      this.dirty.delete(key);
      if (!this.shuttingDown) {
        this.add(key);
      }
    }
    if (this.processing.size === 0) {
      for (const w of this.drainWaiters.splice(0)) w();
    }
  }

  get length(): number {
    return this.queue.length;
  }

  get isShuttingDown(): boolean {
    return this.shuttingDown;
  }

  /**
   * Stops handing out keys: waiting get() calls resolve undefined, queued and
   * delayed keys are dropped. Resolves once every key in flight is done().
   */
  async shutDown(): Promise<void> {
    this.shuttingDown = true;
    for (const t of this.timers.values()) clearTimeout(t.timer);
    this.timers.clear();
    this.queue.length = 0;
    this.dirty.clear();
    for (const w of this.waiters.splice(0)) w(undefined);
    if (this.processing.size > 0) {
      await new Promise<void>((resolve) => this.drainWaiters.push(resolve));
    }
  }
}

export interface WorkerOptions<K> {
  workers: number;
  /** Gives up on a key after this many failed attempts in a row (it stays forgotten until re-added). */
  maxRetries?: number;
  onError?: (key: K, err: unknown, retries: number) => void;
}

/**
 * Runs `handler` for keys from `queue` on `workers` concurrent loops: success
 * forgets the key's backoff, failure re-queues it rate-limited. Resolves when
 * the queue has shut down and every loop has finished its current key.
 */
export async function runWorkers<K>(
  queue: WorkQueue<K>,
  handler: (key: K) => Promise<void>,
  opts: WorkerOptions<K>,
): Promise<void> {
  const loop = async () => {
    for (;;) {
      const key = await queue.get();
      if (key === undefined) return;
      try {
        await handler(key);
        queue.forget(key);
      } catch (err) {
        const retries = queue.retries(key);
        opts.onError?.(key, err, retries);
        if (opts.maxRetries !== undefined && retries >= opts.maxRetries) {
          queue.forget(key);
        } else {
          queue.addRateLimited(key);
        }
      } finally {
        queue.done(key);
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, opts.workers) }, loop));
}
