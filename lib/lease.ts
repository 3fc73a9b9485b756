// Keeps a Lease renewed: the agent's heartbeat and capability report (design
// section 1), read by the controller. Renewal failures are logged and retried
// at the next tick; an agent that cannot reach the API server keeps its
// rules and simply lets its Lease go stale, which is what tells the
// controller to stop advertising the node.
import { CoordinationV1Api, V1MicroTime, type KubeConfig, type V1Lease } from '@kubernetes/client-node';
import type { Logger } from './log.ts';
import { silentLogger } from './log.ts';

export interface LeaseRenewerOptions {
  kc: KubeConfig;
  namespace: string;
  name: string;
  holder: string;
  durationSeconds: number;
  renewEveryMs: number;
  labels?: Record<string, string>;
  /** Read at every renewal, so the Lease always reports the current state. */
  annotations: () => Record<string, string>;
  log?: Logger;
}

export function apiStatus(err: unknown): number | undefined {
  const code = (err as { code?: unknown })?.code;
  return typeof code === 'number' ? code : undefined;
}

/** What the first successful renewal found: the Lease as the last holder left it. */
export interface FirstRenewal {
  /** performance.now() when the renewal was written. */
  at: number;
  /**
   * How long the Lease found still had to run, in ms, on this host's clock:
   * negative when it had run out, -Infinity when there was none, another
   * holder's, or one without a renewTime or duration.
   */
  remainingMs: number;
  /** Whether a Lease of that name existed. */
  existed: boolean;
}

export class LeaseRenewer {
  /** Resolves with the first renewal that succeeds (never when none does). */
  readonly firstRenewal: Promise<FirstRenewal>;
  private markFirst!: (r: FirstRenewal) => void;
  private readonly api: CoordinationV1Api;
  private readonly opts: LeaseRenewerOptions;
  private readonly log: Logger;
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private again = false;
  private stopped = false;
  private failures = 0;
  /** The Lease as this renewer's last write left it: the next renewal writes over it without reading. */
  private written: V1Lease | undefined;
  lastRenewal: Date | undefined;

  constructor(opts: LeaseRenewerOptions) {
    this.opts = opts;
    this.api = opts.kc.makeApiClient(CoordinationV1Api);
    this.log = (opts.log ?? silentLogger).child({ lease: `${opts.namespace}/${opts.name}` });
    this.firstRenewal = new Promise((resolve) => (this.markFirst = resolve));
  }

  start(): void {
    this.renewNow();
    this.timer = setInterval(() => this.renewNow(), this.opts.renewEveryMs);
  }

  /** Renews as soon as possible; calls made during a renewal coalesce into one more. */
  renewNow(): void {
    if (this.stopped) return;
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = this.renew().finally(() => {
      this.running = undefined;
      if (this.again) {
        this.again = false;
        this.renewNow();
      }
    });
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    await this.running;
  }

  /**
   * As the kubelet renews its node Lease: over the Lease this renewer last
   * wrote, one request per renewal; read first only at the start, or when
   * that write finds the Lease changed by another (409) or gone (404). At
   * 5,000 agents that is 500 requests/s at the default 10 s, not 1,000
   * (bench:scale).
   */
  private async renew(): Promise<void> {
    const { namespace, name } = this.opts;
    const now = new V1MicroTime();
    try {
      if (this.written) {
        try {
          this.written = await this.api.replaceNamespacedLease({ name, namespace, body: this.desired(this.written, now) });
          this.renewed(now);
          return;
        } catch (err) {
          const status = apiStatus(err);
          this.written = undefined;
          if (status !== 409 && status !== 404) throw err;
        }
      }
      let existing: V1Lease | undefined;
      try {
        existing = await this.api.readNamespacedLease({ name, namespace });
      } catch (err) {
        if (apiStatus(err) !== 404) throw err;
      }
      const body = this.desired(existing, now);
      const remainingMs = existing?.spec?.holderIdentity === this.opts.holder ? leaseRemainingMs(existing) : Number.NEGATIVE_INFINITY;
      this.written = existing ? await this.api.replaceNamespacedLease({ name, namespace, body }) : await this.api.createNamespacedLease({ namespace, body });
      if (!this.lastRenewal) this.markFirst({ at: performance.now(), remainingMs, existed: existing !== undefined });
      this.renewed(now);
    } catch (err) {
      // 409: someone else wrote in between; the next tick reads again. An
      // unreachable API server fails every tick: warn once, not every tick.
      this.failures++;
      this.log[this.failures === 1 ? 'warn' : 'debug']({ err: (err as Error).message, status: apiStatus(err), failures: this.failures }, 'lease renewal failed');
    }
  }

  private renewed(now: V1MicroTime): void {
    if (this.failures > 0) this.log.info({ failures: this.failures }, 'lease renewed again');
    this.failures = 0;
    this.lastRenewal = now;
  }

  private desired(existing: V1Lease | undefined, now: V1MicroTime): V1Lease {
    const o = this.opts;
    const sameHolder = existing?.spec?.holderIdentity === o.holder;
    return {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: {
        name: o.name,
        namespace: o.namespace,
        resourceVersion: existing?.metadata?.resourceVersion,
        labels: { ...existing?.metadata?.labels, ...o.labels },
        annotations: { ...existing?.metadata?.annotations, ...o.annotations() },
      },
      spec: {
        holderIdentity: o.holder,
        leaseDurationSeconds: o.durationSeconds,
        acquireTime: sameHolder && existing?.spec?.acquireTime ? existing.spec.acquireTime : now,
        renewTime: now,
        leaseTransitions: (existing?.spec?.leaseTransitions ?? 0) + (existing && !sameHolder ? 1 : 0),
      },
    };
  }
}

/** Whether a Lease was renewed within its duration, as seen at `now`. */
export function leaseIsFresh(lease: V1Lease, now: number = Date.now()): boolean {
  return leaseRemainingMs(lease, now) > 0;
}

/** How long a Lease has left at `now` by its renewTime and duration (negative once run out); -Infinity without either. */
export function leaseRemainingMs(lease: V1Lease, now: number = Date.now()): number {
  const renew = lease.spec?.renewTime;
  const duration = lease.spec?.leaseDurationSeconds;
  if (!renew || !duration) return Number.NEGATIVE_INFINITY;
  const at = new Date(renew).getTime();
  return Number.isNaN(at) ? Number.NEGATIVE_INFINITY : at + duration * 1000 - now;
}

// ---------------------------------------------------------------------------
// Judging another's Lease by observation, as the node lifecycle controller
// does: not from its renewTime against the local clock (skewed clocks, and
// an API outage that held every renewal back), but from when this observer
// last saw it change, on the observer's own monotonic clock.

/** What an observer has seen of one Lease. Times are on the observer's monotonic clock (performance.now()). */
export interface LeaseSighting {
  /** spec.renewTime as last seen, only compared for change. */
  renewTime: string;
  /** When the observer first saw the Lease, or last saw its renewTime change. */
  changedAt: number;
  /** spec.leaseDurationSeconds as last seen, in ms; 0 without a valid one. */
  durationMs: number;
  /** Judged expired since it last changed: a later grace does not bring it back. */
  expired: boolean;
}

/** The observer's own view of the API, on the same clock. */
export interface ObserverView {
  /** When the observer's view last (re)started: it began leading, or its watch or its own renewals resumed after failing or hanging. */
  graceFrom: number;
  /** Its view is interrupted now (a watch failed and has not resumed, its own renewals fail or hang): nothing it does not see is news. */
  interrupted: boolean;
}

/** The sighting after seeing `lease` at `now`: a new renewTime (or a first sight) restarts it. */
export function sightLease(prev: LeaseSighting | undefined, lease: V1Lease, now: number): LeaseSighting {
  const renew = lease.spec?.renewTime;
  const renewMs = renew ? new Date(renew).getTime() : Number.NaN;
  const renewTime = Number.isNaN(renewMs) ? '' : String(renewMs);
  const seconds = lease.spec?.leaseDurationSeconds;
  const durationMs = typeof seconds === 'number' && seconds > 0 ? seconds * 1000 : 0;
  if (!prev || prev.renewTime !== renewTime) return { renewTime, changedAt: now, durationMs, expired: false };
  return prev.durationMs === durationMs ? prev : { ...prev, durationMs };
}

/**
 * Until when (same clock) the Lease's holder counts as alive: a full Lease
 * duration after it was last seen to change, and never less than a full
 * duration after the observer's view (re)started; while that view is
 * interrupted, a full duration from now. A Lease already judged expired
 * stays so until it changes, and one without a duration never counts.
 */
export function sightedFreshUntil(s: LeaseSighting, view: ObserverView, now: number): number {
  if (!(s.durationMs > 0) || s.renewTime === '' || s.expired) return Number.NEGATIVE_INFINITY;
  const from = Math.max(s.changedAt, view.graceFrom, view.interrupted ? now : Number.NEGATIVE_INFINITY);
  return from + s.durationMs;
}
