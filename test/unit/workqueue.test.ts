import fc from 'fast-check';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import {
  ExponentialBackoffLimiter,
  MaxOfLimiter,
  TokenBucketLimiter,
  WorkQueue,
  runWorkers,
} from '../../lib/workqueue.ts';

describe('rate limiters', () => {
  it('backs off exponentially per key, capped, and forgets', () => {
    const l = new ExponentialBackoffLimiter<string>(5, 100);
    expect([1, 2, 3, 4, 5, 6].map(() => l.when('a'))).toEqual([5, 10, 20, 40, 80, 100]);
    expect(l.when('b')).toBe(5);
    expect(l.retries('a')).toBe(6);
    l.forget('a');
    expect(l.retries('a')).toBe(0);
    expect(l.when('a')).toBe(5);
  });

  it('token bucket allows a burst, then spaces requests at qps', () => {
    let now = 0;
    const l = new TokenBucketLimiter<string>(10, 3, () => now);
    expect([l.when('x'), l.when('y'), l.when('z')]).toEqual([0, 0, 0]);
    expect(l.when('x')).toBe(100);
    expect(l.when('x')).toBe(200);
    now = 1000; // refill (capped at the burst), minus the two reserved
    expect(l.when('x')).toBe(0);
  });

  it('max-of takes the longest delay and forgets in every limiter', () => {
    let now = 0;
    const l = new MaxOfLimiter<string>(new ExponentialBackoffLimiter(1, 1000), new TokenBucketLimiter(1, 1, () => now));
    expect(l.when('a')).toBe(1);
    expect(l.when('a')).toBe(1000); // bucket empty: 1 s until the next token
    l.forget('a');
    now = 5000;
    expect(l.when('a')).toBe(1);
  });
});

describe('work queue', () => {
  it('never holds a key twice while it is queued', async () => {
    const q = new WorkQueue<string>();
    q.add('a');
    q.add('b');
    q.add('a');
    expect(q.length).toBe(2);
    expect(await q.get()).toBe('a');
    expect(await q.get()).toBe('b');
    expect(q.length).toBe(0);
  });

  it('re-queues a key added while it is processed, only after done()', async () => {
    const q = new WorkQueue<string>();
    q.add('a');
    const k = await q.get();
    q.add('a');
    expect(q.length).toBe(0); // not handed to a second worker
    q.done(k!);
    expect(q.length).toBe(1);
    expect(await q.get()).toBe('a');
  });

  it('hands a key to a waiting worker directly', async () => {
    const q = new WorkQueue<string>();
    const waiting = q.get();
    q.add('x');
    expect(await waiting).toBe('x');
    q.add('x');
    expect(q.length).toBe(0);
  });

  it('shutdown releases waiting workers, drops queued keys and waits for keys in flight', async () => {
    const q = new WorkQueue<string>();
    q.add('busy');
    const busy = await q.get();
    q.add('queued');
    const waiter = q.get(); // gets 'queued'
    const idle = q.get(); // nothing left: waits
    expect(await waiter).toBe('queued');
    let drained = false;
    const shut = q.shutDown().then(() => (drained = true));
    expect(await idle).toBeUndefined();
    await Promise.resolve();
    expect(drained).toBe(false);
    q.done(busy!);
    q.done('queued');
    await shut;
    expect(drained).toBe(true);
    q.add('late');
    expect(await q.get()).toBeUndefined();
  });

  it('property: any interleaving of adds and worker steps processes each key exclusively and loses no add', () => {
    fc.assert(
      fc.property(
        fc.array(fc.oneof(fc.record({ op: fc.constant('add' as const), key: fc.constantFrom('a', 'b', 'c') }), fc.record({ op: fc.constant('step' as const), w: fc.nat(2) })), { maxLength: 60 }),
        (ops) => {
          // Three synchronous "workers" that each hold at most one key.
          const q = new WorkQueue<string>();
          const held: (string | undefined)[] = [undefined, undefined, undefined];
          const pendingSinceLastTake = new Set<string>();
          const internal = q as unknown as { queue: string[]; dirty: Set<string>; processing: Set<string> };
          for (const o of ops) {
            if (o.op === 'add') {
              q.add(o.key);
              pendingSinceLastTake.add(o.key);
            } else if (held[o.w] !== undefined) {
              q.done(held[o.w]!);
              held[o.w] = undefined;
            } else if (internal.queue.length > 0) {
              const key = internal.queue.shift()!;
              internal.dirty.delete(key);
              internal.processing.add(key);
              held[o.w] = key;
              pendingSinceLastTake.delete(key);
            }
            const active = held.filter((k) => k !== undefined);
            expect(new Set(active).size).toBe(active.length); // exclusivity
            expect(new Set(internal.queue).size).toBe(internal.queue.length); // no duplicates
          }
          // Every key added since it was last taken is still owed to a worker.
          for (const k of pendingSinceLastTake) expect(internal.dirty.has(k)).toBe(true);
        },
      ),
    );
  });
});

describe('runWorkers', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it('retries a failing key with growing delays and forgets it on success', async () => {
    const q = new WorkQueue<string>(new ExponentialBackoffLimiter(100, 10_000));
    const attempts: number[] = [];
    const run = runWorkers(
      q,
      async () => {
        attempts.push(Date.now());
        if (attempts.length < 4) throw new Error('transient');
      },
      { workers: 2 },
    );
    const t0 = Date.now();
    q.add('k');
    await vi.advanceTimersByTimeAsync(10_000);
    expect(attempts.map((t) => t - t0)).toEqual([0, 100, 300, 700]);
    expect(q.retries('k')).toBe(0);
    await q.shutDown();
    await run;
  });

  it('gives up after maxRetries and reports every error', async () => {
    const q = new WorkQueue<string>(new ExponentialBackoffLimiter(10, 10));
    const errors: number[] = [];
    const run = runWorkers(q, async () => Promise.reject(new Error('permanent')), {
      workers: 1,
      maxRetries: 3,
      onError: (_k, _e, retries) => errors.push(retries),
    });
    q.add('k');
    await vi.advanceTimersByTimeAsync(1000);
    expect(errors).toEqual([0, 1, 2, 3]);
    await q.shutDown();
    await run;
  });

  it('never runs one key on two workers at once', async () => {
    const q = new WorkQueue<string>();
    let running = 0;
    let maxRunning = 0;
    let calls = 0;
    const run = runWorkers(
      q,
      async () => {
        running++;
        calls++;
        maxRunning = Math.max(maxRunning, running);
        await new Promise((r) => setTimeout(r, 50));
        running--;
      },
      { workers: 4 },
    );
    q.add('same');
    await vi.advanceTimersByTimeAsync(10);
    q.add('same'); // arrives while the first run is in flight
    q.add('same');
    await vi.advanceTimersByTimeAsync(500);
    expect(maxRunning).toBe(1);
    expect(calls).toBe(2); // the in-flight change is processed once more, not twice
    await q.shutDown();
    await run;
  });
});
