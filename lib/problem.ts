// What pier reports about bad or unservable input: one shape for the
// controller (per Service) and the agent (per Service and port), and one
// identity, so that a problem already reported is not reported again.

export interface Problem {
  /** `namespace/name`; absent where the problem's Service is implied (the controller's per-Service lists). */
  service?: string;
  /** The Service port's name, or its index when unnamed. */
  port?: string;
  /** CamelCase, usable as an Event reason. */
  reason: string;
  message: string;
}

/** A problem's identity, for "reported once" sets and deduplication. */
export function problemKey(p: Problem): string {
  return `${p.service ?? ''}\u0000${p.port ?? ''}\u0000${p.reason}\u0000${p.message}`;
}
