import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { Coalescer } from '../../lib/coalescer.ts';

describe('Coalescer', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  const make = (runMs: number, minIntervalMs: number) => {
    const runs: { at: number; full: boolean }[] = [];
    let active = 0;
    let maxActive = 0;
    const c = new Coalescer<{ full: boolean }>(
      async (o) => {
        active++;
        maxActive = Math.max(maxActive, active);
        runs.push({ at: Date.now(), full: o.full });
        await new Promise((r) => setTimeout(r, runMs));
        active--;
      },
      { minIntervalMs, merge: (a, b) => ({ full: a.full || b.full }) },
    );
    return { c, runs, maxActive: () => maxActive };
  };

  it('folds a burst into one run right away and one more after the interval', async () => {
    const { c, runs } = make(10, 1000);
    const t0 = Date.now();
    for (let i = 0; i < 50; i++) c.request({ full: false });
    await vi.advanceTimersByTimeAsync(5);
    for (let i = 0; i < 50; i++) c.request({ full: i === 7 });
    await vi.advanceTimersByTimeAsync(3000);
    expect(runs.map((r) => r.at - t0)).toEqual([0, 1000]);
    expect(runs.map((r) => r.full)).toEqual([false, true]);
  });

  it('never runs twice at once, and a request during a run gets a run that starts after it', async () => {
    const { c, runs, maxActive } = make(500, 100);
    const t0 = Date.now();
    c.request({ full: false });
    await vi.advanceTimersByTimeAsync(200);
    c.request({ full: false });
    await vi.advanceTimersByTimeAsync(2000);
    expect(maxActive()).toBe(1);
    expect(runs.map((r) => r.at - t0)).toEqual([0, 500]);
  });

  /** Runs of 300 ms, paced to a quarter of the time, and a signal every 10 ms for 5 s: the runs' starts from the first signal. */
  const pacedStream = async (burstMs?: number) => {
    const starts: number[] = [];
    const c = new Coalescer<object>(
      async () => {
        starts.push(Date.now());
        await new Promise((r) => setTimeout(r, 300));
      },
      { minIntervalMs: 200, merge: (a) => a, dutyCycle: 0.25, burstMs },
    );
    const t0 = Date.now();
    for (let t = 0; t < 5000; t += 10) {
      c.request({});
      await vi.advanceTimersByTimeAsync(10);
    }
    return { c, starts, fromFirst: starts.map((s) => s - t0) };
  };

  it('with a duty cycle, spaces runs that take long further apart than the minimum interval', async () => {
    const { c, fromFirst } = await pacedStream();
    // Runs of 300 ms may take a quarter of the time: one per 1,200 ms.
    expect(fromFirst).toEqual([0, 1200, 2400, 3600, 4800]);
    const stopped = c.stop();
    await vi.advanceTimersByTimeAsync(300); // the run in progress ends
    await stopped;
    expect(() => new Coalescer(async () => {}, { minIntervalMs: 1, merge: (a) => a, dutyCycle: 0 })).toThrow(RangeError);
  });

  it('with a burst, a change after a quiet spell runs at once; a sustained stream is still held to the duty cycle', async () => {
    const { c, starts, fromFirst } = await pacedStream(600);
    // The saved 600 ms pay for the first runs back to back, then a quarter of the time: one per 1,200 ms.
    expect(fromFirst).toEqual([0, 300, 600, 1200, 2400, 3600, 4800]);
    await vi.advanceTimersByTimeAsync(10_000); // the stream's last signal runs; then quiet: the credit fills up again
    const [quiet, before] = [Date.now(), starts.length];
    c.request({});
    await vi.advanceTimersByTimeAsync(100);
    c.request({}); // during the run: runs as soon as it ends, not 900 ms later
    await vi.advanceTimersByTimeAsync(2000);
    expect(starts.slice(before).map((s) => s - quiet)).toEqual([0, 300]);
    expect(() => new Coalescer(async () => {}, { minIntervalMs: 1, merge: (a) => a, burstMs: -1 })).toThrow(RangeError);
  });

  it('keeps going after a failing run, and stop() drops what is pending', async () => {
    let calls = 0;
    const c = new Coalescer<{ x: number }>(
      async () => {
        calls++;
        throw new Error('boom');
      },
      { minIntervalMs: 1000, merge: (a) => a },
    );
    c.request({ x: 1 });
    await vi.advanceTimersByTimeAsync(1500);
    c.request({ x: 1 }); // the interval has passed: runs at once despite the failure before
    await vi.advanceTimersByTimeAsync(10);
    expect(calls).toBe(2);
    c.request({ x: 1 }); // within the interval: pending
    await c.stop();
    await vi.advanceTimersByTimeAsync(5000);
    c.request({ x: 1 });
    await vi.advanceTimersByTimeAsync(5000);
    expect(calls).toBe(2);
  });
});
