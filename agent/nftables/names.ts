// The names of what pier's nftables table holds. Fixed sets and chains are
// constants; numbered and hashed ones each have a function that builds the
// name and, where a name is read back, one that parses it.
import { chainName } from '../names.ts';

/** The sets (and the verdict map `services`) every table has. */
export const SET = {
  /** frontend : verdict (goto a spread, local or affinity chain). */
  services: 'services',
  /** frontend . endpoint address: a pod reaching itself through a Local frontend. */
  hairpin: 'hairpin',
  /** Frontends without a usable endpoint: rejected. */
  noEndpoints: 'no-endpoints',
  /** Frontends with source ranges. */
  restricted: 'restricted',
  /** frontend . source range a restricted frontend admits. */
  allowed: 'allowed',
} as const;

export type FixedSet = (typeof SET)[keyof typeof SET];

export const FIXED_SETS: readonly FixedSet[] = [SET.services, SET.hairpin, SET.noEndpoints, SET.restricted, SET.allowed];

/** The base chains every table has, on the kernel's hooks. */
export const CHAIN = {
  filterPrerouting: 'filter-prerouting',
  filterInput: 'filter-input',
  filterOutput: 'filter-output',
  natPrerouting: 'nat-prerouting',
  natOutput: 'nat-output',
  natPostrouting: 'nat-postrouting',
} as const;

const ENDPOINTS = 'endpoints-';
const PICK = 'pick-';
const SPREAD = 'spread-';
const LOCAL = 'local-';

/** Map `endpoints-<i>`: frontend to its i-th endpoint. */
export function endpointsMap(i: number): string {
  return `${ENDPOINTS}${i}`;
}

/** The i of an `endpoints-<i>` map; undefined for any other set. */
export function endpointsMapIndex(name: string): number | undefined {
  return name.startsWith(ENDPOINTS) ? Number(name.slice(ENDPOINTS.length)) : undefined;
}

/** Chain `pick-<i>`: DNAT through map `endpoints-<i>`. */
export function pickChain(i: number): string {
  return `${PICK}${i}`;
}

/** The chain a served port's frontends go to, by its policy and how many endpoints it has: `spread-<n>` (Cluster) or `local-<n>` (Local). */
export function spreadChain(endpoints: number, masquerade: boolean): string {
  return `${masquerade ? SPREAD : LOCAL}${endpoints}`;
}

/** How many endpoints a `spread-<n>` or `local-<n>` chain picks from. */
export function spreadChainWidth(name: string): number {
  return Number(name.slice(name.startsWith(SPREAD) ? SPREAD.length : LOCAL.length));
}

/** Whether a spread chain is `spread-<n>` (every connection masqueraded), not `local-<n>`. */
export function spreadChainMasquerades(name: string): boolean {
  return name.startsWith(SPREAD);
}

/** The kinds of a ClientIP port's own sets and chains, in the order a table block declares them. */
export const OWN_ORDER = { clients: 0, sticky: 1, affinity: 2 } as const;

export type OwnKind = keyof typeof OWN_ORDER;

/** `<kind>-<16 base32 characters of sha256(seed)>`, lower case: `clients-` sets, `sticky-` and `affinity-` chains. */
export function ownName(kind: OwnKind, seed: string): string {
  return chainName(`${kind}-`, seed).toLowerCase();
}
