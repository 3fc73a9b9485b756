// Reading Kubernetes objects that may be malformed: both pure cores (the
// controller's allocation and the agent's model) must be total, so a bad
// field costs its own object and never an exception.
import type { V1Service } from '@kubernetes/client-node';

/** The label that ties an EndpointSlice to its Service. */
export const SERVICE_NAME_LABEL = 'kubernetes.io/service-name';

/** `read()`, or `fallback` when a malformed object makes it throw. */
export function safely<T>(read: () => T, fallback: T): T {
  try {
    return read();
  } catch {
    return fallback;
  }
}

/** Milliseconds of a Kubernetes timestamp; a missing or unreadable one sorts last. */
export function timestamp(t: unknown): number {
  if (t === undefined || t === null) return Number.POSITIVE_INFINITY;
  const ms = t instanceof Date ? t.getTime() : new Date(t as string).getTime();
  return Number.isNaN(ms) ? Number.POSITIVE_INFINITY : ms;
}

/** `namespace/name`: how pier keys a Service everywhere (work queue, model, reports). */
export function serviceKey(svc: V1Service): string {
  return `${svc?.metadata?.namespace ?? ''}/${svc?.metadata?.name ?? ''}`;
}
