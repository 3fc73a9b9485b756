// Which Services are pier's, and how many addresses each lists, for the
// commands that read a live cluster (`pier status`, `pier trace`): as the
// running controller says on its leader Lease (lib/contract.ts
// LEADER_DEFAULT_CLASS, LEADER_MAX_ADDRESSES), unless the user gives the
// setting. The commands read the Lease; this decides.
import type { V1Lease } from '@kubernetes/client-node';
import { DEFAULT_MAX_ADDRESSES, LEADER_DEFAULT_CLASS, LEADER_DEFAULT_POOL, LEADER_MAX_ADDRESSES, formatMaxAddresses, parseMaxAddresses } from './contract.ts';

export interface Selection {
  defaultClass: boolean;
  defaultPool: string;
  /** K, the controller's --max-addresses; Infinity for `all`. */
  maxAddresses: number;
}

/** The command line (flag or its variable), the controller's Lease, or the command's own default. */
export type SelectionSource = 'flag' | 'controller' | 'default';

export interface ChosenSelection extends Selection {
  from: { [K in keyof Selection]: SelectionSource };
  /** One line for stderr when a setting the command needs fell back to its default: what was assumed, and why. */
  note?: string;
}

const FLAG: { [K in keyof Selection]: string } = { defaultClass: 'default-class', defaultPool: 'default-pool', maxAddresses: 'max-addresses' };

const show = <K extends keyof Selection>(k: K, v: Selection[K]): string => (k === 'maxAddresses' ? formatMaxAddresses(v as number) : String(v));

/** What the leader Lease says; a value it does not hold, or holds garbled, is absent. */
export function leaseSelection(lease: V1Lease | undefined): Partial<Selection> {
  const a = lease?.metadata?.annotations ?? {};
  const out: Partial<Selection> = {};
  const cls = a[LEADER_DEFAULT_CLASS];
  if (cls === 'true' || cls === 'false') out.defaultClass = cls === 'true';
  const pool = a[LEADER_DEFAULT_POOL];
  if (typeof pool === 'string' && pool !== '') out.defaultPool = pool;
  const max = parseMaxAddresses(a[LEADER_MAX_ADDRESSES]);
  if (max !== undefined) out.maxAddresses = max;
  return out;
}

/**
 * A setting given beats the Lease, which beats the default. Even a released
 * or expired Lease is read: it holds what the last leader ran with, a better
 * guess than a default that ignores the install.
 */
export function chooseSelection(opts: {
  given: Partial<Selection>;
  /** maxAddresses defaults to the controller's own default. */
  defaults: Omit<Selection, 'maxAddresses'> & Partial<Pick<Selection, 'maxAddresses'>>;
  lease: V1Lease | undefined;
  /** `namespace/name` of the Lease, for the note. */
  leaseRef: string;
  /** Why the Lease could not be read, when it could not (a 404 is no Lease, not this). */
  unreadable?: string;
  /** The settings the command uses; only those are worth a note. */
  needs: readonly (keyof Selection)[];
}): ChosenSelection {
  const said = leaseSelection(opts.lease);
  const defaults: Selection = { maxAddresses: DEFAULT_MAX_ADDRESSES, ...opts.defaults };
  const pick = <K extends keyof Selection>(k: K): [Selection[K], SelectionSource] =>
    opts.given[k] !== undefined ? [opts.given[k]!, 'flag'] : said[k] !== undefined ? [said[k]!, 'controller'] : [defaults[k], 'default'];
  const [defaultClass, classFrom] = pick('defaultClass');
  const [defaultPool, poolFrom] = pick('defaultPool');
  const [maxAddresses, maxFrom] = pick('maxAddresses');
  const out: ChosenSelection = { defaultClass, defaultPool, maxAddresses, from: { defaultClass: classFrom, defaultPool: poolFrom, maxAddresses: maxFrom } };
  const assumed = opts.needs.filter((k) => out.from[k] === 'default');
  if (assumed.length > 0) {
    const why = opts.unreadable
      ? `cannot read the controller Lease ${opts.leaseRef} (${opts.unreadable})`
      : opts.lease
      ? `the controller Lease ${opts.leaseRef} does not say ${assumed.map((k) => `--${FLAG[k]}`).join(' or ')} (a controller older than this command?)`
      : `no controller Lease ${opts.leaseRef} (is the controller running, with leader election, in that namespace?)`;
    out.note = `${why}: assuming ${assumed.map((k) => `--${FLAG[k]}=${show(k, out[k])}`).join(' ')}; give ${assumed.length > 1 ? 'them' : 'it'} to override`;
  }
  return out;
}
