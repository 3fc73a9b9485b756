import { describe, expect, it } from 'vitest';
import { percentile, summarize } from '../support/fleet.ts';

describe('nearest-rank percentiles', () => {
  const fifty = Array.from({ length: 50 }, (_, i) => 50 - i); // 50..1, unsorted on purpose
  it('p50 of 50 samples is the 25th smallest, p99 the largest', () => {
    expect(percentile(fifty, 50)).toBe(25);
    expect(percentile(fifty, 99)).toBe(50);
  });
  it('p99 of 100 samples is the 99th smallest', () => {
    expect(percentile(Array.from({ length: 100 }, (_, i) => i + 1), 99)).toBe(99);
  });
  it('summarize reports n, p50, p99 and max', () => {
    expect(summarize([3, 1, 2])).toEqual({ n: 3, p50: 2, p99: 3, max: 3 });
    expect(summarize([]).n).toBe(0);
  });
});
