// Which Services `pier status` and `pier trace` count as pier's: a setting
// given beats the controller's Lease, which beats the default, and a
// fallback says so in one line.
import type { V1Lease } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { chooseSelection, leaseSelection } from '../../lib/cluster-settings.ts';
import { LEADER_DEFAULT_CLASS, LEADER_DEFAULT_POOL, LEADER_MAX_ADDRESSES } from '../../lib/contract.ts';

const lease = (annotations: Record<string, string>): V1Lease => ({ metadata: { name: 'pier-controller', namespace: 'pier-system', annotations }, spec: { holderIdentity: 'c-1' } });
const base = { defaults: { defaultClass: false, defaultPool: 'default' }, leaseRef: 'pier-system/pier-controller', needs: ['defaultClass', 'defaultPool'] as const };

describe('leaseSelection', () => {
  it('reads the two annotations, and ignores what is absent or garbled', () => {
    expect(leaseSelection(lease({ [LEADER_DEFAULT_CLASS]: 'true', [LEADER_DEFAULT_POOL]: 'edge' }))).toEqual({ defaultClass: true, defaultPool: 'edge' });
    expect(leaseSelection(lease({ [LEADER_DEFAULT_CLASS]: 'false' }))).toEqual({ defaultClass: false });
    expect(leaseSelection(lease({ [LEADER_DEFAULT_CLASS]: 'yes', [LEADER_DEFAULT_POOL]: '' }))).toEqual({});
    expect(leaseSelection(undefined)).toEqual({});
  });
});

describe('chooseSelection', () => {
  it("takes the controller's setting when none is given, silently", () => {
    const c = chooseSelection({ ...base, given: {}, lease: lease({ [LEADER_DEFAULT_CLASS]: 'true', [LEADER_DEFAULT_POOL]: 'edge' }) });
    expect(c).toEqual({ defaultClass: true, defaultPool: 'edge', maxAddresses: 16, from: { defaultClass: 'controller', defaultPool: 'controller', maxAddresses: 'default' } });
  });

  it('lets a setting given beat the Lease, each setting on its own', () => {
    const c = chooseSelection({ ...base, given: { defaultClass: false }, lease: lease({ [LEADER_DEFAULT_CLASS]: 'true', [LEADER_DEFAULT_POOL]: 'edge' }) });
    expect(c).toEqual({ defaultClass: false, defaultPool: 'edge', maxAddresses: 16, from: { defaultClass: 'flag', defaultPool: 'controller', maxAddresses: 'default' } });
  });

  it('falls back to the defaults without a Lease, and says so in one line', () => {
    const c = chooseSelection({ ...base, given: {}, lease: undefined });
    expect(c.from).toEqual({ defaultClass: 'default', defaultPool: 'default', maxAddresses: 'default' });
    expect(c.note).toBe(
      'no controller Lease pier-system/pier-controller (is the controller running, with leader election, in that namespace?): assuming --default-class=false --default-pool=default; give them to override',
    );
  });

  it('names only the settings the command needs and lacks, and why it lacks them', () => {
    const old = chooseSelection({ ...base, needs: ['defaultClass'], given: {}, lease: lease({ [LEADER_DEFAULT_POOL]: 'edge' }) });
    expect(old.note).toBe('the controller Lease pier-system/pier-controller does not say --default-class (a controller older than this command?): assuming --default-class=false; give it to override');
    const forbidden = chooseSelection({ ...base, needs: ['defaultClass'], given: {}, lease: undefined, unreadable: 'HTTP 403' });
    expect(forbidden.note).toMatch(/^cannot read the controller Lease pier-system\/pier-controller \(HTTP 403\): assuming --default-class=false;/);
    // Given, nothing is assumed: no note.
    expect(chooseSelection({ ...base, needs: ['defaultClass'], given: { defaultClass: true }, lease: undefined }).note).toBeUndefined();
  });
});

describe("the controller's K (--max-addresses) on its Lease", () => {
  it('reads a positive integer or all, and ignores what is absent or garbled', () => {
    expect(leaseSelection(lease({ [LEADER_MAX_ADDRESSES]: '8' }))).toEqual({ maxAddresses: 8 });
    expect(leaseSelection(lease({ [LEADER_MAX_ADDRESSES]: 'all' }))).toEqual({ maxAddresses: Number.POSITIVE_INFINITY });
    for (const garbled of ['0', '-3', '2.5', 'eight', '']) expect(leaseSelection(lease({ [LEADER_MAX_ADDRESSES]: garbled }))).toEqual({});
  });

  it("judges with the Lease's K unless one is given, which only overrides", () => {
    const withK = lease({ [LEADER_DEFAULT_CLASS]: 'false', [LEADER_DEFAULT_POOL]: 'default', [LEADER_MAX_ADDRESSES]: '4' });
    const needs = ['defaultClass', 'defaultPool', 'maxAddresses'] as const;
    const fromLease = chooseSelection({ ...base, needs, given: {}, lease: withK });
    expect([fromLease.maxAddresses, fromLease.from.maxAddresses, fromLease.note]).toEqual([4, 'controller', undefined]);
    const given = chooseSelection({ ...base, needs, given: { maxAddresses: Number.POSITIVE_INFINITY }, lease: withK });
    expect([given.maxAddresses, given.from.maxAddresses]).toEqual([Number.POSITIVE_INFINITY, 'flag']);
  });

  it("falls back to the controller's default K, or the one the command defaults to, and says so", () => {
    const needs = ['defaultClass', 'maxAddresses'] as const;
    const old = chooseSelection({ ...base, needs, given: {}, lease: lease({ [LEADER_DEFAULT_CLASS]: 'true' }) });
    expect(old.maxAddresses).toBe(16);
    expect(old.note).toBe('the controller Lease pier-system/pier-controller does not say --max-addresses (a controller older than this command?): assuming --max-addresses=16; give it to override');
    const all = chooseSelection({ ...base, defaults: { ...base.defaults, maxAddresses: Number.POSITIVE_INFINITY }, needs, given: {}, lease: lease({ [LEADER_DEFAULT_CLASS]: 'true' }) });
    expect(all.note).toMatch(/assuming --max-addresses=all;/);
  });
});
