// Kubernetes Events (events.k8s.io/v1) for what people should see with
// `kubectl describe`: every failure, and changes worth knowing about. The
// same event repeated is folded into one object whose series count grows,
// with at most one API write per key per `minIntervalMs`, so a hot loop
// cannot flood the API server.
import { EventsV1Api, PatchStrategy, setHeaderOptions, V1MicroTime, type KubeConfig, type V1ObjectReference } from '@kubernetes/client-node';
import type { Logger } from './log.ts';
import { silentLogger } from './log.ts';

export interface EventInput {
  regarding: V1ObjectReference;
  type: 'Normal' | 'Warning';
  /** CamelCase, machine-readable: PortConflict, ForwardingDisabled. */
  reason: string;
  /** What the controller or agent was doing: Sync, Allocate, Check. */
  action: string;
  note: string;
}

interface Seen {
  name?: string;
  namespace: string;
  count: number;
  lastWrite: number;
  firstSeen: V1MicroTime;
}

export class EventRecorder {
  private readonly api: EventsV1Api;
  private readonly controller: string;
  private readonly instance: string;
  private readonly minIntervalMs: number;
  private readonly log: Logger;
  private readonly seen = new Map<string, Seen>();
  private seq = 0;

  constructor(opts: { kc: KubeConfig; controller: string; instance: string; minIntervalMs?: number; log?: Logger }) {
    this.api = opts.kc.makeApiClient(EventsV1Api);
    this.controller = opts.controller;
    this.instance = opts.instance;
    this.minIntervalMs = opts.minIntervalMs ?? 60_000;
    this.log = opts.log ?? silentLogger;
  }

  /** Fire and forget: an Event that cannot be written is logged, never thrown. */
  record(e: EventInput): void {
    void this.write(e).catch((err: unknown) =>
      this.log.warn({ err: (err as Error).message, reason: e.reason, regarding: `${e.regarding.namespace ?? ''}/${e.regarding.name}` }, 'cannot write event'),
    );
  }

  /** Forgets folded events (for example when the regarding object is deleted). */
  forget(regarding: V1ObjectReference): void {
    const prefix = `${regarding.kind}/${regarding.namespace ?? ''}/${regarding.name}\u0000`;
    for (const k of this.seen.keys()) if (k.startsWith(prefix)) this.seen.delete(k);
  }

  async write(e: EventInput): Promise<void> {
    const key = `${e.regarding.kind}/${e.regarding.namespace ?? ''}/${e.regarding.name}\u0000${e.type}\u0000${e.reason}\u0000${e.note}`;
    // Cluster-scoped objects (Nodes) get their Events in "default", as kubelet's do.
    const namespace = e.regarding.namespace || 'default';
    const now = Date.now();
    const prev = this.seen.get(key);
    if (prev) {
      prev.count++;
      if (now - prev.lastWrite < this.minIntervalMs || !prev.name) return;
      prev.lastWrite = now;
      await this.api.patchNamespacedEvent(
        { name: prev.name, namespace, body: { series: { count: prev.count, lastObservedTime: new V1MicroTime(now) } } },
        setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
      );
      return;
    }
    const entry: Seen = { namespace, count: 1, lastWrite: now, firstSeen: new V1MicroTime(now) };
    this.seen.set(key, entry);
    let created;
    try {
      created = await this.api.createNamespacedEvent({
        namespace,
        body: {
          // client-go's naming; the API server rejects a generateName ending in '.'.
          metadata: { name: `${(e.regarding.name ?? 'object').slice(0, 200)}.${(BigInt(now) * 1_000_000n + BigInt(this.seq++)).toString(16)}`, namespace },
          eventTime: entry.firstSeen,
          reportingController: this.controller,
          reportingInstance: this.instance.slice(0, 128),
          action: e.action,
          reason: e.reason,
          note: e.note.slice(0, 1024),
          type: e.type,
          regarding: e.regarding,
        },
      });
    } catch (err) {
      // Not recorded: the next occurrence tries again instead of being folded into nothing.
      this.seen.delete(key);
      throw err;
    }
    entry.name = created.metadata?.name;
  }
}
