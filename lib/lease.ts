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

export class LeaseRenewer {
  private readonly api: CoordinationV1Api;
  private readonly opts: LeaseRenewerOptions;
  private readonly log: Logger;
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private again = false;
  private stopped = false;
  private failures = 0;
  lastRenewal: Date | undefined;

  constructor(opts: LeaseRenewerOptions) {
    this.opts = opts;
    this.api = opts.kc.makeApiClient(CoordinationV1Api);
    this.log = (opts.log ?? silentLogger).child({ lease: `${opts.namespace}/${opts.name}` });
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

  private async renew(): Promise<void> {
    const { namespace, name } = this.opts;
    const now = new V1MicroTime();
    try {
      let existing: V1Lease | undefined;
      try {
        existing = await this.api.readNamespacedLease({ name, namespace });
      } catch (err) {
        if (apiStatus(err) !== 404) throw err;
      }
      const body = this.desired(existing, now);
      if (existing) await this.api.replaceNamespacedLease({ name, namespace, body });
      else await this.api.createNamespacedLease({ namespace, body });
      if (this.failures > 0) this.log.info({ failures: this.failures }, 'lease renewed again');
      this.failures = 0;
      this.lastRenewal = now;
    } catch (err) {
      // 409: someone else wrote in between; the next tick reads again. An
      // unreachable API server fails every tick: warn once, not every 5 s.
      this.failures++;
      this.log[this.failures === 1 ? 'warn' : 'debug']({ err: (err as Error).message, status: apiStatus(err), failures: this.failures }, 'lease renewal failed');
    }
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
  const renew = lease.spec?.renewTime;
  const duration = lease.spec?.leaseDurationSeconds;
  if (!renew || !duration) return false;
  return new Date(renew).getTime() + duration * 1000 > now;
}
