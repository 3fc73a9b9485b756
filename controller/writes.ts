// What the writer does for one Service, decided without I/O: which patches
// to send, which Events an accepted write deserves, and how a Service's
// allocation counts in the metrics. The controller calls these both when it
// decides what to enqueue and when a worker writes, so the two never
// disagree about whether a Service needs work.
import type { V1LoadBalancerIngress, V1Service, V1ServiceStatus } from '@kubernetes/client-node';

import { problemKey, type Problem } from '../lib/problem.ts';
import { REASONS, type IngressAssignment, type ServiceAllocation } from './allocate.ts';
import { annotationPatch, clearPatch, statusPatch, type StatusPatch } from './status.ts';

export interface ServiceWork {
  /** Merge patch for the status subresource. */
  status?: StatusPatch;
  /** Merge patch for the Service itself: the port-mapping annotation. */
  annotation?: { metadata: { annotations: Record<string, string | null> } };
  /** The status patch removes pier's traces from a Service that is no longer pier's. */
  clearing: boolean;
}

export interface WorkOptions {
  /**
   * The API server drops ipMode (a server older than 1.30, or the
   * LoadBalancerIPMode gate off): entries without one are compared as if
   * they said Proxy, or the writer would rewrite them forever.
   */
  ipModeDropped: boolean;
  /** The time a new condition transition is stamped with. */
  now?: Date;
}

/**
 * The writes that make `svc` say what `desired` says; for a Service that is
 * not pier's (desired undefined) only the removal of what pier once wrote,
 * which is nothing for a Service pier never wrote.
 */
export function serviceWork(svc: V1Service, desired: ServiceAllocation | undefined, opts: WorkOptions): ServiceWork {
  const view = opts.ipModeDropped ? withIpModeProxy(svc) : svc;
  if (!desired) {
    const status = clearPatch(view);
    return status ? { status, clearing: true } : { clearing: false };
  }
  const out: ServiceWork = { clearing: false };
  const status = statusPatch(view, desired, opts.now);
  if (status) out.status = status;
  const annotation = annotationPatch(svc, desired.portMapping);
  if (annotation) out.annotation = annotation;
  return out;
}

export function hasWrites(work: ServiceWork): boolean {
  return work.status !== undefined || work.annotation !== undefined;
}

function withIpModeProxy(svc: V1Service): V1Service {
  const ingress = svc.status?.loadBalancer?.ingress;
  if (!ingress?.some((i) => i?.ip && !i.ipMode)) return svc;
  return {
    ...svc,
    status: { ...svc.status, loadBalancer: { ...svc.status?.loadBalancer, ingress: ingress.map((i) => (i?.ip && !i.ipMode ? { ...i, ipMode: 'Proxy' } : i)) } },
  };
}

/** True when the server stored ingress entries without the ipMode the patch sent. */
export function serverDroppedIpMode(sent: StatusPatch, stored: V1Service): boolean {
  const sentModes = (sent.status.loadBalancer?.ingress ?? []).some((i) => i.ipMode);
  if (!sentModes) return false;
  const back = stored.status?.loadBalancer?.ingress ?? [];
  return back.length > 0 && back.every((i) => i?.ip && !i.ipMode);
}

/** `ip:port/PROTO` of every served (error-free) port, sorted: what clients can reach. */
export function served(ingress: readonly (V1LoadBalancerIngress | IngressAssignment)[] | undefined): string[] {
  const out = new Set<string>();
  for (const ing of ingress ?? []) {
    if (!ing?.ip) continue;
    const host = ing.ip.includes(':') ? `[${ing.ip}]` : ing.ip;
    for (const p of ing.ports ?? []) if (!p?.error) out.add(`${host}:${p.port}/${p.protocol || 'TCP'}`);
  }
  return [...out].sort();
}

export interface AssignmentEvent {
  reason: 'Assigned' | 'AssignmentChanged';
  note: string;
}

/** The Normal Event a status write that changes what is served deserves, if any. */
export function assignmentEvent(before: V1ServiceStatus | undefined, after: readonly IngressAssignment[]): AssignmentEvent | undefined {
  const was = served(before?.loadBalancer?.ingress);
  const now = served(after);
  if (was.length === now.length && was.every((s, i) => s === now[i])) return undefined;
  if (was.length === 0) return { reason: 'Assigned', note: `served on ${list(now)}` };
  if (now.length === 0) return { reason: 'AssignmentChanged', note: `no longer served (was ${list(was)})` };
  const added = now.filter((s) => !was.includes(s));
  const removed = was.filter((s) => !now.includes(s));
  const parts = [added.length > 0 ? `added ${list(added)}` : '', removed.length > 0 ? `removed ${list(removed)}` : ''].filter(Boolean);
  return { reason: 'AssignmentChanged', note: `${parts.join('; ')}; now served on ${list(now)}` };
}

export type ServiceState = 'serving' | 'partial' | 'unserved';
export const SERVICE_STATES: readonly ServiceState[] = ['serving', 'partial', 'unserved'];

export function serviceState(a: ServiceAllocation): ServiceState {
  if (a.condition.status === 'True') return 'serving';
  return a.condition.reason === REASONS.partiallyServed ? 'partial' : 'unserved';
}

export { problemKey };

/** Problems not in `reported`: each deserves one Warning Event. */
export function newProblems(reported: ReadonlySet<string> | undefined, problems: readonly Problem[]): Problem[] {
  return problems.filter((p) => !reported?.has(problemKey(p)));
}

/** Whether `reported` is exactly the set of `problems` (so nothing needs reporting or forgetting). */
export function sameProblems(reported: ReadonlySet<string> | undefined, problems: readonly Problem[]): boolean {
  const size = reported?.size ?? 0;
  if (size !== new Set(problems.map(problemKey)).size) return false;
  return newProblems(reported, problems).length === 0;
}

/** Keeps a note readable for a Service served on many addresses. */
function list(items: string[], max = 8): string {
  if (items.length <= max) return items.join(', ');
  return `${items.slice(0, max).join(', ')} and ${items.length - max} more`;
}
