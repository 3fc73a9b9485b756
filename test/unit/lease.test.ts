// Agent Leases judged by observation (lib/lease.ts): when the controller saw
// a Lease change, on its own clock, and when its view of the API (re)started.
import type { V1Lease } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';

import { leaseIsFresh, leaseRemainingMs, sightLease, sightedFreshUntil, type LeaseSighting, type ObserverView } from '../../lib/lease.ts';

const lease = (renewTime: string | undefined, seconds: number | undefined = 5): V1Lease => ({
  metadata: { name: 'pier-agent-n1', namespace: 'pier-system' },
  spec: { holderIdentity: 'n1', leaseDurationSeconds: seconds, renewTime: renewTime as never },
});
const T1 = '2024-01-01T00:00:00.000000Z';
const T2 = '2024-01-01T00:00:01.000000Z';
/** A view that never (re)started and is not interrupted. */
const steady: ObserverView = { graceFrom: Number.NEGATIVE_INFINITY, interrupted: false };

describe('sightLease', () => {
  it('starts the clock when a Lease is first seen, whatever its renewTime says', () => {
    expect(sightLease(undefined, lease(T1), 100)).toEqual({ renewTime: String(Date.parse(T1)), changedAt: 100, durationMs: 5000, expired: false });
  });

  it('keeps the time of the last change while renewTime stays, and restarts it when renewTime changes', () => {
    const first = sightLease(undefined, lease(T1), 100);
    expect(sightLease(first, lease(T1), 4000)).toBe(first);
    expect(sightLease(first, lease(T2), 4000)).toEqual({ ...first, renewTime: String(Date.parse(T2)), changedAt: 4000 });
  });

  it('reads the same renewTime the same whether listed (a Date) or watched (a string)', () => {
    const listed = sightLease(undefined, lease(new Date(T1) as never), 100);
    expect(sightLease(listed, lease(T1), 200)).toBe(listed);
  });

  it('follows a changed duration without counting it as a renewal', () => {
    const first = sightLease(undefined, lease(T1, 5), 100);
    expect(sightLease(first, lease(T1, 20), 300)).toEqual({ ...first, durationMs: 20_000 });
  });

  it('clears an expired mark only when the Lease changes', () => {
    const expired: LeaseSighting = { ...sightLease(undefined, lease(T1), 100), expired: true };
    expect(sightLease(expired, lease(T1), 9000).expired).toBe(true);
    expect(sightLease(expired, lease(T2), 9000)).toMatchObject({ expired: false, changedAt: 9000 });
  });
});

describe('sightedFreshUntil', () => {
  const seen = (changedAt: number, durationMs = 5000, expired = false): LeaseSighting => ({ renewTime: '1', changedAt, durationMs, expired });

  it('is a full Lease duration after the last change seen', () => {
    expect(sightedFreshUntil(seen(100), steady, 200)).toBe(5100);
    expect(sightedFreshUntil(seen(100), steady, 6000)).toBe(5100);
  });

  it('gives every agent a full duration from when the view (re)started, and never shortens one', () => {
    expect(sightedFreshUntil(seen(100), { graceFrom: 3000, interrupted: false }, 6000)).toBe(8000);
    expect(sightedFreshUntil(seen(7000), { graceFrom: 3000, interrupted: false }, 7000)).toBe(12_000);
  });

  it('keeps every agent alive while the view is interrupted: a full duration from now', () => {
    expect(sightedFreshUntil(seen(100), { graceFrom: 0, interrupted: true }, 60_000)).toBe(65_000);
  });

  it('never revives a Lease already judged expired, nor one without a duration or renewTime', () => {
    const view = { graceFrom: 6000, interrupted: true };
    expect(sightedFreshUntil(seen(100, 5000, true), view, 6000)).toBe(Number.NEGATIVE_INFINITY);
    expect(sightedFreshUntil(seen(100, 0), view, 6000)).toBe(Number.NEGATIVE_INFINITY);
    expect(sightedFreshUntil({ ...seen(100), renewTime: '' }, view, 6000)).toBe(Number.NEGATIVE_INFINITY);
  });

  it('does not read renewTime against the clock: an agent whose renewTime is far behind is alive while it is seen to renew', () => {
    // The observer's clock is an hour ahead of the agent's: leaseIsFresh() says expired, observation says alive.
    const l = lease(T1);
    const hourAhead = Date.parse(T1) + 3_600_000;
    expect(leaseIsFresh(l, hourAhead)).toBe(false);
    const s = sightLease(undefined, l, 50);
    expect(sightedFreshUntil(s, steady, 60) > 60).toBe(true);
  });
});

describe('leaseRemainingMs', () => {
  it('is what a Lease has left by its renewTime and duration, negative once it ran out; leaseIsFresh is it being positive', () => {
    const at = Date.parse(T1);
    expect(leaseRemainingMs(lease(T1, 20), at + 5000)).toBe(15_000);
    expect(leaseRemainingMs(lease(new Date(T1) as never, 20), at + 23_000)).toBe(-3000);
    expect(leaseIsFresh(lease(T1, 20), at + 19_999)).toBe(true);
    expect(leaseIsFresh(lease(T1, 20), at + 20_000)).toBe(false);
  });

  it('is -Infinity without a renewTime or a duration, or with a renewTime that is no time', () => {
    for (const l of [lease(undefined), lease(T1, 0), lease('yesterday')]) expect(leaseRemainingMs(l, 0)).toBe(Number.NEGATIVE_INFINITY);
  });
});
