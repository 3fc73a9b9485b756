// Leader election on a coordination.k8s.io/v1 Lease, with client-go's
// semantics so that operators can reason about it the way they do about
// kube-controller-manager: a candidate takes the Lease when it is absent,
// released (no holder) or expired (renewTime + leaseDurationSeconds < now);
// the leader renews it every retry period and steps down when it has not
// renewed for the renew deadline, or sees another holder. Every write
// carries the resourceVersion it read, so two candidates racing for one
// expired Lease cannot both win: the loser gets a 409.
//
// Expiry is judged from the Lease's renewTime against the local clock, so
// replicas need clocks in step to well within the lease duration minus the
// renew deadline (5 s by default); NTP gives that by a wide margin.
import { CoordinationV1Api, V1MicroTime, type KubeConfig, type V1Lease } from '@kubernetes/client-node';
import { requestOptions } from './kube.ts';
import { apiStatus, leaseIsFresh } from './lease.ts';
import type { Logger } from './log.ts';
import { silentLogger } from './log.ts';

export interface LeaderTimings {
  /** How long a Lease stays valid without renewal: how long a dead leader blocks the others. */
  leaseDurationMs: number;
  /** The leader steps down when it has not renewed for this long; shorter than the lease duration, so it stops before anyone else may start. */
  renewDeadlineMs: number;
  /** How often the leader renews and candidates try. */
  retryPeriodMs: number;
}

/** client-go's defaults. */
export const DEFAULT_LEADER_TIMINGS: LeaderTimings = { leaseDurationMs: 15_000, renewDeadlineMs: 10_000, retryPeriodMs: 2_000 };

/** Candidates wait up to this much longer than the retry period, so that they do not all ask at once. */
const JITTER = 0.2;

/** Why a set of timings cannot work, or undefined. */
export function checkLeaderTimings(t: LeaderTimings): string | undefined {
  if (t.leaseDurationMs <= t.renewDeadlineMs) return 'the lease duration must be longer than the renew deadline';
  if (t.renewDeadlineMs <= t.retryPeriodMs * (1 + JITTER)) return `the renew deadline must be longer than ${1 + JITTER} times the retry period`;
  if (t.leaseDurationMs < 1000) return 'the lease duration must be at least 1s (Leases count whole seconds)';
  return undefined;
}

export interface LeaderElectorOptions extends LeaderTimings {
  kc: KubeConfig;
  namespace: string;
  name: string;
  /** Unique per replica: the Lease's holderIdentity. */
  identity: string;
  /** Written onto the Lease with every acquisition and renewal: what the holder says about itself. */
  annotations?: Record<string, string>;
  onStartedLeading: () => void;
  /** Called once per term, before anything else happens: stop writing here. */
  onStoppedLeading: () => void;
  /** Called when the observed holder changes (an empty string: nobody holds it). */
  onNewLeader?: (identity: string) => void;
  /**
   * Called when an attempt succeeds after attempts that failed or one that
   * hung for longer than the retry period: the API server was unreachable
   * or stalled meanwhile (a stopped API server may keep every connection
   * open), so what this replica's watches showed may have been stale.
   */
  onResumed?: () => void;
  log?: Logger;
}

type Attempt =
  | { kind: 'held' }
  | { kind: 'other'; holder: string }
  | { kind: 'conflict' }
  | { kind: 'error'; err: unknown };

export class LeaderElector {
  private readonly opts: LeaderElectorOptions;
  private readonly api: CoordinationV1Api;
  private readonly log: Logger;
  private leading = false;
  private stopped = false;
  /** Local time at which the last successful write was sent: the term lasts renewDeadline from there. */
  private lastRenew = 0;
  /** The Lease as this replica last wrote it: the fast path for renewals and what release() updates. */
  private held: V1Lease | undefined;
  private observed: string | undefined;
  private failures = 0;
  /** The last attempt failed; cleared by any answer. */
  private lastFailed = false;
  /** Local time the attempt in flight was sent. */
  private attemptSince: number | undefined;
  private watchdog: NodeJS.Timeout | undefined;
  private sleepTimer: NodeJS.Timeout | undefined;
  private wake: (() => void) | undefined;
  private loopDone: Promise<void> = Promise.resolve();

  constructor(opts: LeaderElectorOptions) {
    const why = checkLeaderTimings(opts);
    if (why) throw new Error(`leader election: ${why}`);
    this.opts = opts;
    this.api = opts.kc.makeApiClient(CoordinationV1Api);
    this.log = (opts.log ?? silentLogger).child({ lease: `${opts.namespace}/${opts.name}`, identity: opts.identity });
  }

  get isLeader(): boolean {
    return this.leading;
  }

  /** Whether the API looks unreachable or stalled now: the last attempt failed, or the one in flight has taken longer than the retry period. */
  get interrupted(): boolean {
    if (this.stopped) return false;
    return this.lastFailed || (this.attemptSince !== undefined && Date.now() - this.attemptSince > this.opts.retryPeriodMs);
  }

  /** The holder as last seen, '' when nobody holds the Lease, undefined before the first read. */
  get leader(): string | undefined {
    return this.observed;
  }

  start(): void {
    this.loopDone = this.loop();
  }

  /**
   * Stops trying. A leader stops leading first (onStoppedLeading), then
   * releases the Lease so that another replica takes over at its next try
   * instead of waiting for the Lease to expire.
   */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.sleepTimer);
    this.wake?.();
    await this.loopDone;
    if (this.leading) this.stepDown('stopping');
    await this.release();
  }

  private async loop(): Promise<void> {
    while (!this.stopped) {
      const sent = Date.now();
      this.attemptSince = sent;
      const result = await this.tryAcquireOrRenew(sent);
      this.attemptSince = undefined;
      if (this.stopped) {
        // A write that landed after stop() began still makes this replica the holder: release() needs to know.
        return;
      }
      const resumed = result.kind !== 'error' && (this.lastFailed || Date.now() - sent > this.opts.retryPeriodMs);
      this.lastFailed = result.kind === 'error';
      switch (result.kind) {
        case 'held':
          if (this.failures > 0) this.log.info({ failures: this.failures }, 'leader election: lease written again');
          this.failures = 0;
          this.lastRenew = sent;
          if (!this.leading) {
            this.leading = true;
            this.log.info('became leader');
            this.observe(this.opts.identity);
            this.opts.onStartedLeading();
          }
          this.armWatchdog();
          if (resumed) this.opts.onResumed?.();
          break;
        case 'other':
          this.observe(result.holder);
          if (this.leading) this.stepDown(`the lease is held by ${result.holder}`);
          if (resumed) this.opts.onResumed?.();
          break;
        case 'conflict':
          // Someone wrote in between: the next try reads what they wrote.
          if (resumed) this.opts.onResumed?.();
          break;
        case 'error':
          this.failures++;
          this.log[this.failures === 1 ? 'warn' : 'debug'](
            { err: (result.err as Error)?.message ?? String(result.err), status: apiStatus(result.err), failures: this.failures },
            this.leading ? 'leader election: cannot renew the lease' : 'leader election: cannot read or take the lease',
          );
          break;
      }
      if (this.leading && Date.now() - this.lastRenew >= this.opts.renewDeadlineMs) this.stepDown('the lease was not renewed within the renew deadline');
      const wait = this.leading ? this.opts.retryPeriodMs : this.opts.retryPeriodMs * (1 + Math.random() * JITTER);
      await this.sleep(wait);
    }
  }

  private async tryAcquireOrRenew(now: number): Promise<Attempt> {
    const { namespace, name } = this.opts;
    const options = () => requestOptions({ timeoutMs: this.opts.renewDeadlineMs });
    // Fast path, as in client-go: a leader updates the Lease it last wrote
    // without reading it first; a 409 means it changed, and the slow path looks.
    if (this.leading && this.held) {
      try {
        this.held = await this.api.replaceNamespacedLease({ name, namespace, body: this.record(this.held, now) }, options());
        return { kind: 'held' };
      } catch (err) {
        if (apiStatus(err) !== 409) return { kind: 'error', err };
      }
    }
    let lease: V1Lease | undefined;
    try {
      lease = await this.api.readNamespacedLease({ name, namespace }, options());
    } catch (err) {
      if (apiStatus(err) !== 404) return { kind: 'error', err };
    }
    if (!lease) {
      try {
        this.held = await this.api.createNamespacedLease({ namespace, body: this.record(undefined, now) }, options());
        return { kind: 'held' };
      } catch (err) {
        return apiStatus(err) === 409 ? { kind: 'conflict' } : { kind: 'error', err };
      }
    }
    const holder = lease.spec?.holderIdentity ?? '';
    if (holder !== '' && holder !== this.opts.identity && leaseIsFresh(lease, now)) {
      this.held = undefined;
      return { kind: 'other', holder };
    }
    try {
      this.held = await this.api.replaceNamespacedLease({ name, namespace, body: this.record(lease, now) }, options());
      return { kind: 'held' };
    } catch (err) {
      return apiStatus(err) === 409 ? { kind: 'conflict' } : { kind: 'error', err };
    }
  }

  private record(existing: V1Lease | undefined, now: number): V1Lease {
    const mine = existing?.spec?.holderIdentity === this.opts.identity;
    const at = new V1MicroTime(now);
    return {
      ...existing,
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: {
        ...existing?.metadata,
        name: this.opts.name,
        namespace: this.opts.namespace,
        ...(this.opts.annotations ? { annotations: { ...existing?.metadata?.annotations, ...this.opts.annotations } } : {}),
      },
      spec: {
        holderIdentity: this.opts.identity,
        leaseDurationSeconds: Math.ceil(this.opts.leaseDurationMs / 1000),
        acquireTime: mine && existing?.spec?.acquireTime ? new V1MicroTime(existing.spec.acquireTime) : at,
        renewTime: at,
        leaseTransitions: (existing?.spec?.leaseTransitions ?? 0) + (existing && !mine ? 1 : 0),
      },
    };
  }

  /** Hands the Lease back: no holder, and a 1 s duration for readers that look only at the times. */
  private async release(): Promise<void> {
    const held = this.held;
    if (!held || held.spec?.holderIdentity !== this.opts.identity) return;
    const at = new V1MicroTime(Date.now());
    const body: V1Lease = {
      ...held,
      spec: { ...held.spec, holderIdentity: '', leaseDurationSeconds: 1, acquireTime: at, renewTime: at },
    };
    try {
      await this.api.replaceNamespacedLease(
        { name: this.opts.name, namespace: this.opts.namespace, body },
        requestOptions({ timeoutMs: Math.min(this.opts.renewDeadlineMs, 5000) }),
      );
      this.held = undefined;
      this.log.info('released the lease');
    } catch (err) {
      // 409: someone else holds it already, which is what releasing is for.
      if (apiStatus(err) !== 409) this.log.warn({ err: (err as Error).message, status: apiStatus(err) }, 'cannot release the lease; the others wait for it to expire');
    }
  }

  private stepDown(why: string): void {
    if (!this.leading) return;
    this.leading = false;
    clearTimeout(this.watchdog);
    this.log.warn({ why }, 'stopped leading');
    this.opts.onStoppedLeading();
  }

  /** Steps down at the deadline even while a renewal hangs: the loop only notices when it returns. */
  private armWatchdog(): void {
    clearTimeout(this.watchdog);
    const left = this.lastRenew + this.opts.renewDeadlineMs - Date.now();
    this.watchdog = setTimeout(() => {
      if (this.leading && Date.now() - this.lastRenew >= this.opts.renewDeadlineMs) this.stepDown('the lease was not renewed within the renew deadline');
    }, Math.max(0, left));
  }

  private observe(holder: string): void {
    if (holder === this.observed) return;
    this.observed = holder;
    if (holder !== this.opts.identity) this.log.info({ leader: holder || '(none)' }, 'observed leader');
    this.opts.onNewLeader?.(holder);
  }

  private sleep(ms: number): Promise<void> {
    if (this.stopped) return Promise.resolve();
    return new Promise((resolve) => {
      this.wake = resolve;
      this.sleepTimer = setTimeout(resolve, ms);
    });
  }
}
