// Which Services `pier status` and `pier trace` count as pier's: a setting
// given beats the controller's Lease, which beats the default, and a
// fallback says so in one line.
import type { V1Lease } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { chooseSelection, leaseSelection } from '../../lib/cluster-settings.ts';
import { LEADER_DEFAULT_CLASS, LEADER_DEFAULT_POOL } from '../../lib/contract.ts';

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
    expect(c).toEqual({ defaultClass: true, defaultPool: 'edge', from: { defaultClass: 'controller', defaultPool: 'controller' } });
  });

  it('lets a setting given beat the Lease, each setting on its own', () => {
    const c = chooseSelection({ ...base, given: { defaultClass: false }, lease: lease({ [LEADER_DEFAULT_CLASS]: 'true', [LEADER_DEFAULT_POOL]: 'edge' }) });
    expect(c).toEqual({ defaultClass: false, defaultPool: 'edge', from: { defaultClass: 'flag', defaultPool: 'controller' } });
  });

  it('falls back to the defaults without a Lease, and says so in one line', () => {
    const c = chooseSelection({ ...base, given: {}, lease: undefined });
    expect(c.from).toEqual({ defaultClass: 'default', defaultPool: 'default' });
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
