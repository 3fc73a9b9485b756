// What the writer sends for a Service's status: nothing when the status
// already says what allocate() decided, once the API server's own defaults
// are accounted for, so that an unchanged Service causes no write and no
// Event. Patches are JSON merge patches (application/merge-patch+json) for
// the status subresource; a merge patch replaces lists whole, so conditions
// written by other controllers are carried along unchanged, and the
// resourceVersion is included so that a concurrent change to them turns into
// a conflict and a retry, not a lost write.
import { isDeepStrictEqual } from 'node:util';
import type { V1Condition, V1LoadBalancerIngress, V1Service, V1ServiceStatus } from '@kubernetes/client-node';

import { READY_CONDITION } from '../lib/contract.ts';
import { PORT_MAPPING_ANNOTATION, type IngressAssignment, type ReadyCondition } from './allocate.ts';

export interface NormalPort {
  port: number;
  protocol: string;
  error?: string;
}

export interface NormalIngress {
  ip?: string;
  hostname?: string;
  ipMode?: string;
  ports: NormalPort[];
}

/** A condition as far as comparison goes: when it changed and for which generation do not make it different. */
export interface NormalCondition {
  type: string;
  status: string;
  reason: string;
  message: string;
}

export interface NormalStatus {
  ingress: NormalIngress[];
  conditions: NormalCondition[];
}

/** What a Service's status should say: a ServiceAllocation is one. */
export interface DesiredStatus {
  ingress: IngressAssignment[];
  condition: ReadyCondition;
}

export interface StatusPatch {
  metadata?: { resourceVersion: string };
  status: {
    loadBalancer?: { ingress: V1LoadBalancerIngress[] };
    conditions?: PlainCondition[];
  };
}

/** V1Condition as JSON: times as RFC 3339 text. */
export type PlainCondition = Omit<V1Condition, 'lastTransitionTime'> & { lastTransitionTime: string };

/**
 * The status as the API server would return it after storing it: absent and
 * empty lists are one thing, an ingress with an ip and no ipMode has the
 * server's default `VIP`, an empty error is no error.
 */
export function normalizeStatus(status: V1ServiceStatus | undefined | null): NormalStatus {
  const ingress = (status?.loadBalancer?.ingress ?? []).map((ing) => {
    const out: NormalIngress = { ports: [] };
    if (ing?.ip) out.ip = ing.ip;
    if (ing?.hostname) out.hostname = ing.hostname;
    const ipMode = ing?.ipMode || (ing?.ip ? 'VIP' : undefined);
    if (ipMode) out.ipMode = ipMode;
    out.ports = (ing?.ports ?? []).map((p) => {
      const port: NormalPort = { port: p?.port, protocol: p?.protocol || 'TCP' };
      if (p?.error) port.error = p.error;
      return port;
    });
    return out;
  });
  const conditions = (status?.conditions ?? []).map((c) => ({
    type: c?.type ?? '',
    status: c?.status ?? '',
    reason: c?.reason ?? '',
    message: c?.message ?? '',
  }));
  return { ingress, conditions };
}

/**
 * The merge patch that makes `current`'s status say `desired`, or undefined
 * when it already does. The condition keeps its lastTransitionTime unless
 * its status (True/False) changes.
 */
export function statusPatch(current: V1Service, desired: DesiredStatus, now: Date = new Date()): StatusPatch | undefined {
  const have = normalizeStatus(current?.status);
  const wantIngress = desired.ingress.map(plainIngress);
  const wantCondition: NormalCondition = { type: READY_CONDITION, ...pickCondition(desired.condition) };

  const ingressChanged = !isDeepStrictEqual(have.ingress, normalizeStatus({ loadBalancer: { ingress: wantIngress } }).ingress);
  const mine = have.conditions.filter((c) => c.type === READY_CONDITION);
  const conditionChanged = mine.length !== 1 || !isDeepStrictEqual(mine[0], wantCondition);
  if (!ingressChanged && !conditionChanged) return undefined;

  const patch: StatusPatch = { status: {} };
  if (ingressChanged) patch.status.loadBalancer = { ingress: wantIngress };
  if (conditionChanged) {
    const existing = current?.status?.conditions ?? [];
    const previous = existing.find((c) => c?.type === READY_CONDITION);
    const since = previous && previous.status === wantCondition.status && previous.lastTransitionTime ? formatTime(previous.lastTransitionTime) : formatTime(now);
    const ours: PlainCondition = { ...wantCondition, lastTransitionTime: since };
    const conditions: PlainCondition[] = [];
    let placed = false;
    for (const c of existing) {
      if (c?.type !== READY_CONDITION) conditions.push(plainCondition(c));
      else if (!placed) {
        // In place, so that a person reading the list sees it where it was.
        conditions.push(ours);
        placed = true;
      }
    }
    if (!placed) conditions.push(ours);
    patch.status.conditions = conditions;
    withResourceVersion(patch, current);
  }
  return patch;
}

/**
 * For a Service that stopped being pier's: removes pier's condition and the
 * ingress entries pier wrote, leaving everything else. Without pier's
 * condition, pier never wrote this status (or already cleared it), and the
 * ingress may be another implementation's: nothing is touched. Pier writes
 * only `ipMode: Proxy` entries; `isPierAddress` narrows that further when the
 * caller knows which addresses pier may have used.
 */
export function clearPatch(current: V1Service, isPierAddress: (ip: string) => boolean = () => true): StatusPatch | undefined {
  const existing = current?.status?.conditions ?? [];
  if (!existing.some((c) => c?.type === READY_CONDITION)) return undefined;
  const patch: StatusPatch = { status: { conditions: existing.filter((c) => c?.type !== READY_CONDITION).map(plainCondition) } };
  const ingress = current?.status?.loadBalancer?.ingress ?? [];
  const kept = ingress.filter((i) => !(i?.ipMode === 'Proxy' && typeof i.ip === 'string' && isPierAddress(i.ip)));
  if (kept.length !== ingress.length) patch.status.loadBalancer = { ingress: kept.map(copyIngress) };
  withResourceVersion(patch, current);
  return patch;
}

/**
 * The merge patch (for the Service itself, not its status) that keeps the
 * port-mapping annotation equal to `portMapping`, removing it when there is
 * none; undefined when it already is.
 */
export function annotationPatch(current: V1Service, portMapping: string | undefined): { metadata: { annotations: Record<string, string | null> } } | undefined {
  const have = current?.metadata?.annotations?.[PORT_MAPPING_ANNOTATION];
  if (have === portMapping) return undefined;
  return { metadata: { annotations: { [PORT_MAPPING_ANNOTATION]: portMapping ?? null } } };
}

function plainIngress(ing: IngressAssignment): V1LoadBalancerIngress {
  return {
    ip: ing.ip,
    ipMode: ing.ipMode,
    ports: ing.ports.map((p) => (p.error ? { port: p.port, protocol: p.protocol, error: p.error } : { port: p.port, protocol: p.protocol })),
  };
}

function copyIngress(ing: V1LoadBalancerIngress): V1LoadBalancerIngress {
  return JSON.parse(JSON.stringify(ing)) as V1LoadBalancerIngress;
}

function pickCondition(c: ReadyCondition): Omit<NormalCondition, 'type'> {
  return { status: c.status, reason: c.reason, message: c.message };
}

function plainCondition(c: V1Condition): PlainCondition {
  const out = JSON.parse(JSON.stringify(c ?? {})) as PlainCondition;
  if (c?.lastTransitionTime) out.lastTransitionTime = formatTime(c.lastTransitionTime);
  return out;
}

/** metav1.Time is RFC 3339 with whole seconds. */
function formatTime(t: Date | string): string {
  if (typeof t === 'string') return t;
  const ms = t.getTime();
  if (Number.isNaN(ms)) return new Date(0).toISOString().replace(/\.\d+Z$/, 'Z');
  return t.toISOString().replace(/\.\d+Z$/, 'Z');
}

function withResourceVersion(patch: StatusPatch, current: V1Service): void {
  const rv = current?.metadata?.resourceVersion;
  if (rv) patch.metadata = { resourceVersion: rv };
}
