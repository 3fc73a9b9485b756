// `pier controller`: watches Services, Nodes, EndpointSlices and agent
// Leases; recomputes the allocation once per burst of changes, re-judging
// only the Services the changes can affect (reallocate() in allocate.ts;
// from scratch at start and at every resync); and has workers write, per
// Service, only what differs (writes.ts). Every replica keeps its caches
// and allocation warm; only the leader writes, so a standby takes over with
// nothing to load.
import { setTimeout as sleep } from 'node:timers/promises';
import { CoreV1Api, type KubeConfig, type V1Lease, type V1Node, type V1ObjectReference, type V1Service } from '@kubernetes/client-node';

import { Coalescer } from '../lib/coalescer.ts';
import { endpointSliceInformer, leaseInformer, nodeInformer, serviceInformer } from '../lib/collections.ts';
import { LEADER_DEFAULT_CLASS, LEADER_DEFAULT_POOL, LEADER_LEASE_NAME, LEADER_MAX_ADDRESSES, LEASE_FORWARDING_IPV4, LEASE_FORWARDING_IPV6, agentLeaseName } from '../lib/contract.ts';
import { EventRecorder } from '../lib/events.ts';
import { startHealthServer } from '../lib/health.ts';
import type { InformerEvent } from '../lib/informer.ts';
import { requestOptions } from '../lib/kube.ts';
import { LeaderElector, type LeaderTimings } from '../lib/leader.ts';
import { apiStatus, sightLease, sightedFreshUntil, type LeaseSighting } from '../lib/lease.ts';
import type { Logger } from '../lib/log.ts';
import { WorkQueue, runWorkers } from '../lib/workqueue.ts';
import { DEFAULT_MAX_ADDRESSES, formatMaxAddresses, nodeReading, reallocate, serviceKey, type AllocatorConfig, type AllocatorState, type ServiceAllocation } from './allocate.ts';
import { controllerMetrics, type ControllerMetrics } from './metrics.ts';
import {
  SERVICE_STATES,
  assignmentEvent,
  hasWrites,
  newProblems,
  problemKey,
  sameProblems,
  serverDroppedIpMode,
  serviceState,
  serviceWork,
} from './writes.ts';

export interface ControllerConfig {
  /** pier's namespace: agent Leases and the leader Lease. */
  namespace: string;
  allocator: AllocatorConfig;
  workers: number;
  resyncPeriodMs: number;
  /** Shortest time between two allocations; changes in between are folded into the next. */
  minAllocateIntervalMs: number;
  leaderElect: boolean;
  leaderElection: LeaderTimings & { identity: string };
  healthAddress: string;
  healthPort: number;
}

export interface ControllerDeps {
  kc: KubeConfig;
  log: Logger;
}

/** Recorded in managedFields: who wrote the status. */
export const FIELD_MANAGER = 'pier-controller';
const REPORTING_CONTROLLER = 'pier.dev/controller';
/** A write that hangs must not hold a worker (and a Service) forever. */
const WRITE_TIMEOUT_MS = 30_000;
/** How long an Event may wait for the status writes to pause, once none is queued. */
const EVENT_DEFER_MS = 30_000;
/** Status writes this recent mean more may come: Events wait for a pause this long. */
const EVENT_QUIET_MS = 1000;
/** How long a graceful stop waits for the Events still waiting. */
const EVENT_FLUSH_MS = 3000;
const AGENT_LEASE_PREFIX = agentLeaseName('');
/** The share of the time allocations may take while changes keep coming. */
const ALLOCATE_DUTY_CYCLE = 0.25;
/**
 * Allocation time saved up while changes are quiet, so that a change after a
 * quiet spell is judged at once rather than up to three runs' time behind an
 * unrelated allocation that had just started (a lost node waited 1.5 s that
 * way in bench:scale). Enough for the resync's full allocation at 5,000 nodes and
 * 10,000 Services (1.5-5 s there on 2 cores) and the change behind it.
 */
const ALLOCATE_BURST_MS = 5000;

type WriteKind = 'status' | 'annotation' | 'clear';

export class Controller {
  readonly metrics: ControllerMetrics;
  private readonly cfg: ControllerConfig;
  private readonly log: Logger;
  private readonly core: CoreV1Api;
  private readonly services;
  private readonly nodes;
  private readonly slices;
  private readonly leases;
  private readonly events: EventRecorder;
  private readonly coalescer: Coalescer<object>;
  private readonly queue = new WorkQueue<string>();
  private readonly elector: LeaderElector | undefined;
  private health: Awaited<ReturnType<typeof startHealthServer>> | undefined;
  private workers: Promise<void> | undefined;
  private resyncTimer: NodeJS.Timeout | undefined;
  private leaseTimer: NodeJS.Timeout | undefined;
  private synced = false;
  private stopping = false;
  private leading = false;
  /** Aborted when a term ends, cancelling the writes still in flight. */
  private term: AbortController | undefined;
  /** Set when a term starts: the first allocation of the term learns which problems the last leader already reported. */
  private seedPending = false;
  private desired = new Map<string, ServiceAllocation>();
  /** What the last allocation decided from, for the next to re-judge only what changed; undefined: judge everything. */
  private allocatorState: AllocatorState | undefined;
  /** Per Service, the resourceVersion and allocation queueWrites() last compared: the same pair again needs no second look. */
  private compared = new Map<string, { version: string | undefined; desired: ServiceAllocation | undefined }>();
  private comparedIpModeDropped = false;
  /** The resourceVersion of each Service the last allocation saw. */
  private allocatedVersion = new Map<string, string>();
  /** Per Service, the problems already reported as Events in this term. */
  private reported = new Map<string, Set<string>>();
  /** Per agent Lease, what allocation reads from it (freshness, forwarding) as of the last allocation. */
  private leaseViews = new Map<string, string>();
  /** Per Node, nodeReading() of the last version seen. */
  private readonly nodeReadings = new Map<string, string>();
  /** Per agent Lease, when this replica last saw it change (lib/lease.ts). */
  private readonly sightings = new Map<string, LeaseSighting>();
  /** performance.now() when this replica's view of the API last (re)started: every agent alive then gets a full Lease duration from it. */
  private graceFrom = Number.NEGATIVE_INFINITY;
  private ipModeDropped = false;
  /** Per Service, the resourceVersion this replica's last write produced, until its watch event comes back. */
  private readonly ownWrites = new Map<string, string>();
  /** Per Service being written, the resourceVersions of its updates seen meanwhile: a write's own watch event may beat its response. */
  private readonly writing = new Map<string, string[]>();
  /** Events go out one at a time, behind the status writes (see record()). */
  private eventsSent: Promise<void> = Promise.resolve();
  private eventsWaiting = 0;
  /** Set when a stop has waited long enough for them. */
  private dropEvents = false;
  /** performance.now() of the last status or annotation write's end. */
  private lastWriteAt = -Infinity;
  /** Allocations computed so far, for tests and logs. */
  allocations = 0;

  constructor(cfg: ControllerConfig, deps: ControllerDeps) {
    this.cfg = cfg;
    this.log = deps.log;
    this.metrics = controllerMetrics();
    this.core = deps.kc.makeApiClient(CoreV1Api);
    const backoff = { initialMs: 500, maxMs: 10_000 };
    this.services = serviceInformer(deps.kc, { log: this.log, backoff });
    this.nodes = nodeInformer(deps.kc, { log: this.log, backoff });
    this.slices = endpointSliceInformer(deps.kc, { log: this.log, backoff });
    this.leases = leaseInformer(deps.kc, cfg.namespace, { log: this.log, backoff });
    const identity = cfg.leaderElection.identity;
    this.events = new EventRecorder({ kc: deps.kc, controller: REPORTING_CONTROLLER, instance: identity, log: this.log });
    // A full allocation is O(all Services): ~15 ms at 1,000, ~240 ms at
    // 10,000 on a small cluster; where a pool has more nodes than a Service
    // may list, it also ranks those nodes per Service (~1 s for 10,000
    // Services over 5,000 nodes, bench/allocate.ts). Re-judging what changed
    // costs a fraction of that (bench/allocate.ts, reallocate()). While
    // changes keep coming it may take a quarter of the time, no more, once
    // what it saved up while quiet is spent.
    this.coalescer = new Coalescer(() => this.allocateAll(), { minIntervalMs: cfg.minAllocateIntervalMs, merge: (a) => a, dutyCycle: ALLOCATE_DUTY_CYCLE, burstMs: ALLOCATE_BURST_MS });
    if (cfg.leaderElect) {
      this.elector = new LeaderElector({
        kc: deps.kc,
        namespace: cfg.namespace,
        name: LEADER_LEASE_NAME,
        ...cfg.leaderElection,
        // `pier status` and `pier trace` read these: the Lease states what the
        // running leader uses (a Deployment's args may be stale, overridden by
        // PIER_* variables, or not pier's manifests), and status already lists
        // Leases in this namespace with the permissions the README names.
        annotations: {
          [LEADER_DEFAULT_CLASS]: String(cfg.allocator.defaultClass),
          [LEADER_DEFAULT_POOL]: cfg.allocator.defaultPool,
          [LEADER_MAX_ADDRESSES]: formatMaxAddresses(cfg.allocator.maxAddresses ?? DEFAULT_MAX_ADDRESSES),
        },
        onStartedLeading: () => this.startLeading(),
        onStoppedLeading: () => this.stopLeading(),
        onResumed: () => this.viewResumed('the leader-election Lease is written again after failed or hung attempts'),
        log: this.log,
      });
    }
  }

  /** Resolves once the caches have synced; leadership may come later. */
  async start(): Promise<void> {
    this.health = await startHealthServer({
      address: this.cfg.healthAddress,
      port: this.cfg.healthPort,
      registry: this.metrics.registry,
      ready: () => this.readiness(),
    });
    const changed = () => this.requestAllocation();
    this.services.onChange((svc, event) => {
      if (event === 'delete') {
        this.events.forget({ kind: 'Service', namespace: svc.metadata?.namespace, name: svc.metadata?.name });
        this.ownWrites.delete(serviceKey(svc));
      }
      if (event === 'update' && this.isOwnWrite(svc)) return;
      changed();
    });
    this.nodes.onChange((node, event) => this.onNodeChange(node, event));
    this.slices.onChange(changed);
    this.leases.onChange((lease, event) => this.onLeaseChange(lease, event));
    this.leases.onResume(() => this.viewResumed('the Lease watch resumed'));
    for (const inf of [this.services, this.nodes, this.slices, this.leases]) inf.start();
    // The first allocation must see every existing status, or it could hand a
    // port to the wrong Service and move things on a mere restart.
    await Promise.all([this.services.synced, this.nodes.synced, this.slices.synced, this.leases.synced]);
    if (this.stopping) return;
    this.synced = true;
    this.workers = runWorkers(this.queue, (key) => this.handle(key), {
      workers: this.cfg.workers,
      onError: (key, err, retries) =>
        this.log[retries === 0 ? 'warn' : 'debug']({ service: key, err: (err as Error)?.message ?? String(err), status: apiStatus(err), retries }, 'writing the Service failed; retrying with backoff'),
    });
    this.requestAllocation();
    // A resync judges everything from scratch: whatever the incremental
    // allocation might have missed is corrected within one period.
    this.resyncTimer = setInterval(() => {
      this.allocatorState = undefined;
      this.requestAllocation();
    }, this.cfg.resyncPeriodMs);
    if (this.elector) this.elector.start();
    else this.startLeading();
    this.log.info(
      { healthPort: this.health.port, leaderElect: this.cfg.leaderElect, identity: this.cfg.leaderElection.identity, services: this.services.list().length, nodes: this.nodes.list().length },
      'controller started',
    );
  }

  /** Stops writing, hands leadership over, and stops watching. Statuses stay as they are. */
  async stop(): Promise<void> {
    this.stopping = true;
    clearInterval(this.resyncTimer);
    clearTimeout(this.leaseTimer);
    await this.coalescer.stop();
    // Writes in flight finish (they were made as leader); nothing new starts.
    this.leading = false;
    await this.queue.shutDown();
    await this.workers;
    // Events still waiting for the writes to pause go out now, for a while.
    const timeout = new AbortController();
    const flushed = await Promise.race([this.eventsSent.then(() => true), sleep(EVENT_FLUSH_MS, false, { signal: timeout.signal }).catch(() => false)]);
    timeout.abort();
    if (!flushed) {
      this.dropEvents = true;
      this.log.warn({ events: this.eventsWaiting }, 'stopping with Events not yet written; they are dropped');
    }
    await this.elector?.stop();
    this.stopLeading();
    await Promise.all([this.services.stop(), this.nodes.stop(), this.slices.stop(), this.leases.stop()]);
    await this.health?.close();
  }

  get healthPort(): number | undefined {
    return this.health?.port;
  }

  get isLeader(): boolean {
    return this.leading;
  }

  private readiness(): { ok: boolean; detail: string } {
    if (!this.synced) return { ok: false, detail: 'waiting for the caches to sync' };
    if (this.leading) return { ok: true, detail: `leader; ${this.allocations} allocations` };
    return { ok: true, detail: `standby; leader is ${this.elector?.leader || 'unknown'}` };
  }

  private startLeading(): void {
    if (this.stopping) return;
    this.leading = true;
    this.term = new AbortController();
    this.seedPending = true;
    this.reported.clear();
    this.metrics.leader.set(1);
    // A new term may follow an outage that held the agents' renewals back.
    this.graceFrom = performance.now();
    // A standby keeps its allocation current: the writes it calls for start
    // now, not after the next allocation. What changed since is skipped by
    // handle() (another resourceVersion) and queued again by that allocation;
    // an allocation that judged an agent otherwise than now is not written at all.
    if (this.synced && this.allocations > 0 && !this.leasesChanged(performance.now())) this.queueWrites(this.services.list(), this.desired);
    this.requestAllocation();
  }

  private stopLeading(): void {
    this.leading = false;
    this.term?.abort(new Error('no longer the leader'));
    this.term = undefined;
    this.metrics.leader.set(0);
  }

  /** The view of the API was interrupted and is back: agents alive before get a full Lease duration from now. */
  private viewResumed(why: string): void {
    if (this.stopping) return;
    this.graceFrom = performance.now();
    this.log.info({ why }, 'the view of the API resumed; every live agent gets a full Lease duration from now');
    this.requestAllocation();
  }

  private requestAllocation(): void {
    if (!this.synced || this.stopping) return;
    this.coalescer.request({});
  }

  // -------------------------------------------------------------------------
  // Allocation

  private async allocateAll(): Promise<void> {
    const started = performance.now();
    // Leases are judged on the monotonic clock, by when they were seen to change.
    const now = started;
    const services = this.services.list();
    const leases = this.agentLeases();
    const freshUntil = this.judgeLeases(leases, now);
    let allocation: Map<string, ServiceAllocation>;
    const full = this.allocatorState === undefined;
    let rejudged: number;
    try {
      const out = reallocate(
        {
          services: [...services],
          nodes: [...this.nodes.list()],
          slices: [...this.slices.list()],
          leases,
          leaseFreshUntil: freshUntil,
          now,
          config: this.cfg.allocator,
        },
        this.allocatorState,
      );
      allocation = out.services;
      this.allocatorState = out.state;
      rejudged = out.rejudged;
    } catch (err) {
      // Allocation is total by design; if it throws anyway, keep the last decision rather than write a wrong one, and judge everything next time.
      this.allocatorState = undefined;
      this.log.error({ err: (err as Error)?.stack ?? String(err) }, 'allocation failed; keeping the previous one');
      return;
    }
    this.metrics.allocateDuration.observe((performance.now() - started) / 1000);
    this.metrics.lastAllocation.set(Date.now() / 1000);
    this.allocations++;
    this.desired = allocation;
    this.allocatedVersion = new Map(services.map((s) => [serviceKey(s), s.metadata?.resourceVersion ?? '']));
    this.leaseViews = new Map(leases.map((l) => [l.metadata?.name ?? '', leaseView(l, (freshUntil.get(l.metadata?.name ?? '') ?? -Infinity) > now)]));
    this.scheduleLeaseCheck(now, freshUntil.values());
    this.recordAllocationMetrics(allocation);

    if (!this.leading) return;
    const queued = this.queueWrites(services, allocation, full);
    this.log.debug({ services: allocation.size, rejudged, full, queued, ms: Math.round(performance.now() - started) }, 'allocated');
  }

  /**
   * Queues each Service whose status, annotation or reported problems differ
   * from the allocation. Only Services whose object or allocation changed
   * since the last look are compared, unless `all`: a term's start, a full
   * allocation, or ipMode found dropped, each of which may change the verdict
   * for a pair already compared.
   */
  private queueWrites(services: readonly V1Service[], allocation: Map<string, ServiceAllocation>, all = true): number {
    const seeding = this.seedPending;
    this.seedPending = false;
    const everything = all || seeding || this.comparedIpModeDropped !== this.ipModeDropped;
    this.comparedIpModeDropped = this.ipModeDropped;
    const compared = new Map<string, { version: string | undefined; desired: ServiceAllocation | undefined }>();
    let queued = 0;
    for (const svc of services) {
      const key = serviceKey(svc);
      const desired = allocation.get(key);
      const version = svc.metadata?.resourceVersion;
      const last = this.compared.get(key);
      const same = version !== undefined && last?.version === version && last.desired === desired;
      compared.set(key, same ? last : { version, desired });
      if (!everything && same) continue;
      const problems = desired?.problems ?? [];
      const writes = hasWrites(serviceWork(svc, desired, { ipModeDropped: this.ipModeDropped }));
      // A status that already says what this allocation says was written by
      // an earlier leader (or this one before a restart), which reported its
      // problems then: reporting them again on every failover is noise.
      if (seeding && !writes) {
        if (problems.length > 0) this.reported.set(key, new Set(problems.map(problemKey)));
        else this.reported.delete(key);
      }
      if (writes || !sameProblems(this.reported.get(key), problems)) {
        this.queue.add(key);
        queued++;
      }
    }
    this.compared = compared;
    for (const key of this.reported.keys()) if (!this.allocatedVersion.has(key)) this.reported.delete(key);
    this.metrics.queueDepth.set(this.queue.length);
    return queued;
  }

  private recordAllocationMetrics(services: Map<string, ServiceAllocation>): void {
    const states = new Map(SERVICE_STATES.map((s) => [s, 0]));
    const reasons = new Map<string, number>();
    for (const a of services.values()) {
      const state = serviceState(a);
      states.set(state, (states.get(state) ?? 0) + 1);
      for (const p of a.problems) reasons.set(p.reason, (reasons.get(p.reason) ?? 0) + 1);
    }
    for (const [state, n] of states) this.metrics.services.set({ state }, n);
    this.metrics.problems.reset();
    for (const [reason, n] of reasons) this.metrics.problems.set({ reason }, n);
  }

  /**
   * Kubelets write their Node's status every few seconds (44 writes a second
   * at 5,000 nodes in bench:scale). An update that changes nothing the
   * allocation reads costs no allocation, so that a node's real change never
   * waits behind heartbeats for the coalescer's duty cycle.
   */
  private onNodeChange(node: V1Node, event: InformerEvent): void {
    const name = node.metadata?.name ?? '';
    if (event === 'delete') {
      this.nodeReadings.delete(name);
      this.requestAllocation();
      return;
    }
    const reading = nodeReading(node, this.cfg.allocator);
    if (this.nodeReadings.get(name) === reading) return;
    this.nodeReadings.set(name, reading);
    this.requestAllocation();
  }

  private agentLeases(): V1Lease[] {
    return this.leases.list().filter((l) => l.metadata?.name?.startsWith(AGENT_LEASE_PREFIX));
  }

  /**
   * Agents renew every few seconds; a renewal that changes nothing the
   * allocation reads only moves the expiry later and costs no allocation.
   */
  private onLeaseChange(lease: V1Lease, event: InformerEvent): void {
    const name = lease.metadata?.name ?? '';
    if (!name.startsWith(AGENT_LEASE_PREFIX)) return;
    if (event === 'delete') {
      this.sightings.delete(name);
      this.requestAllocation();
      return;
    }
    const now = performance.now();
    if (leaseView(lease, this.judgeLease(lease, now) > now) !== this.leaseViews.get(name)) this.requestAllocation();
  }

  /**
   * Until when (performance.now() clock) the agent behind `lease` counts as
   * alive, recording what was seen: the adapter around lib/lease.ts's pure
   * judge. Once judged expired, a Lease stays so until it changes, so that a
   * later grace never brings back an agent this replica saw go.
   */
  private judgeLease(lease: V1Lease, now: number): number {
    const name = lease.metadata?.name ?? '';
    const seen = sightLease(this.sightings.get(name), lease, now);
    const view = { graceFrom: this.graceFrom, interrupted: this.viewInterrupted() };
    const until = sightedFreshUntil(seen, view, now);
    this.sightings.set(name, until <= now && !seen.expired ? { ...seen, expired: true } : seen);
    return until;
  }

  /** The Lease watch failed and has not resumed, or the leader-election Lease cannot be written or read. */
  private viewInterrupted(): boolean {
    return this.leases.errorsSinceLastConnect > 0 || (this.elector?.interrupted ?? false);
  }

  /** judgeLease() of every agent Lease, by name; forgets the Leases that are gone. */
  private judgeLeases(leases: readonly V1Lease[], now: number): Map<string, number> {
    const out = new Map(leases.map((l) => [l.metadata?.name ?? '', this.judgeLease(l, now)]));
    for (const name of this.sightings.keys()) if (!out.has(name)) this.sightings.delete(name);
    return out;
  }

  /** Whether any agent Lease reads otherwise now than at the last allocation. */
  private leasesChanged(now: number): boolean {
    const leases = this.agentLeases();
    const until = this.judgeLeases(leases, now);
    return leases.some((l) => leaseView(l, (until.get(l.metadata?.name ?? '') ?? -Infinity) > now) !== this.leaseViews.get(l.metadata?.name ?? ''));
  }

  /**
   * A Lease expires without any event: wake up when the soonest one does, so
   * a dead node is dropped within its agent's lease duration.
   */
  private scheduleLeaseCheck(now: number, freshUntil: Iterable<number>): void {
    clearTimeout(this.leaseTimer);
    let soonest = Infinity;
    for (const until of freshUntil) if (until > now && until < soonest) soonest = until;
    if (soonest === Infinity || this.stopping) return;
    // Fresh means strictly before the expiry, so just after it the agent is expired.
    this.leaseTimer = setTimeout(() => this.checkLeases(), soonest - now + 5);
    this.leaseTimer.unref();
  }

  private checkLeases(): void {
    const now = performance.now();
    if (this.leasesChanged(now)) this.requestAllocation();
    else this.scheduleLeaseCheck(now, this.judgeLeases(this.agentLeases(), now).values());
  }

  // -------------------------------------------------------------------------
  // Writing

  private async handle(key: string): Promise<void> {
    this.metrics.queueDepth.set(this.queue.length);
    const term = this.term;
    if (!this.leading || !term) return;
    const slash = key.indexOf('/');
    const namespace = key.slice(0, slash);
    const name = key.slice(slash + 1);
    const svc = this.services.get(name, namespace);
    if (!svc) {
      this.reported.delete(key);
      return;
    }
    // Decided from another version of this Service: the allocation its change
    // asked for decides again, and enqueues it again if there is still work.
    if (this.allocatedVersion.get(key) !== svc.metadata?.resourceVersion) return;
    const desired = this.desired.get(key);
    const work = serviceWork(svc, desired, { ipModeDropped: this.ipModeDropped });
    const opts = () => requestOptions({ mergePatch: true, signal: term.signal, timeoutMs: WRITE_TIMEOUT_MS });

    if (work.status) {
      const body = work.status;
      const stored = await this.write(work.clearing ? 'clear' : 'status', key, () =>
        this.core.patchNamespacedServiceStatus({ name, namespace, body, fieldManager: FIELD_MANAGER }, opts()),
      );
      if (!stored) return;
      if (work.clearing) {
        this.log.info({ service: key }, 'no longer pier\'s Service; removed pier\'s status');
        this.record(svc, 'Normal', 'StatusCleared', 'the Service is no longer a pier LoadBalancer Service; pier removed its addresses and condition from the status');
      } else if (desired) {
        if (!this.ipModeDropped && serverDroppedIpMode(body, stored)) {
          this.ipModeDropped = true;
          this.log.warn('the API server drops ingress ipMode (older than 1.30, or LoadBalancerIPMode off): kube-proxy will also capture these addresses; comparing statuses without ipMode from now on');
        }
        const change = body.status.loadBalancer ? assignmentEvent(svc.status, desired.ingress) : undefined;
        if (change) {
          this.log.info({ service: key, reason: change.reason }, change.note);
          this.record(svc, 'Normal', change.reason, change.note);
        }
      }
    }
    if (work.annotation) {
      const body = work.annotation;
      const stored = await this.write('annotation', key, () => this.core.patchNamespacedService({ name, namespace, body, fieldManager: FIELD_MANAGER }, opts()));
      if (!stored) return;
    }
    const problems = desired?.problems ?? [];
    for (const p of newProblems(this.reported.get(key), problems)) {
      this.log.warn({ service: key, reason: p.reason }, p.message);
      this.record(svc, 'Warning', p.reason, p.message);
    }
    if (problems.length > 0) this.reported.set(key, new Set(problems.map(problemKey)));
    else this.reported.delete(key);
  }

  /** One write, counted; undefined when the Service is gone or this replica no longer leads. Throws (for a retry with backoff) on anything else. */
  private async write(kind: WriteKind, key: string, send: () => Promise<V1Service>): Promise<V1Service | undefined> {
    // A term that ended while this key waited: the next leader writes it.
    if (!this.leading) return undefined;
    let stored: V1Service | undefined;
    this.writing.set(key, []);
    try {
      stored = await send();
      this.metrics.writes.inc({ kind, result: 'ok' });
      this.log.debug({ service: key, kind }, 'wrote');
      return stored;
    } catch (err) {
      const status = apiStatus(err);
      // Deleted meanwhile: nothing to write, nothing to retry. Cancelled
      // because the term ended: the next leader decides afresh.
      if (status === 404 || !this.leading) return undefined;
      this.metrics.writes.inc({ kind, result: status === 409 ? 'conflict' : 'error' });
      if (status !== 409 && this.leading) {
        const [namespace, name] = [key.slice(0, key.indexOf('/')), key.slice(key.indexOf('/') + 1)];
        const svc = this.services.get(name, namespace);
        if (svc) this.record(svc, 'Warning', 'StatusWriteFailed', `cannot write the ${kind === 'annotation' ? 'port-mapping annotation' : 'status'}: ${(err as Error)?.message ?? String(err)}`);
      }
      throw err;
    } finally {
      this.lastWriteAt = performance.now();
      const meanwhile = this.writing.get(key) ?? [];
      this.writing.delete(key);
      const own = stored?.metadata?.resourceVersion;
      if (own && meanwhile.includes(own)) this.adoptOwnVersion(key, own);
      else if (own) this.ownWrites.set(key, own);
      // Whatever else changed the Service during the write still asks for an allocation.
      if (meanwhile.some((v) => v !== own)) this.requestAllocation();
    }
  }

  /**
   * The watch event of this replica's own write carries nothing the
   * allocation that asked for the write did not know: the status now says
   * what it decided. Allocating again for it would, during a burst, mean a
   * full allocation every few writes. Any other change to the Service
   * arrives as an event of its own, so nothing is missed.
   */
  private isOwnWrite(svc: V1Service): boolean {
    const key = serviceKey(svc);
    const version = svc.metadata?.resourceVersion;
    if (!version) return false;
    if (this.ownWrites.get(key) === version) {
      this.ownWrites.delete(key);
      this.adoptOwnVersion(key, version);
      return true;
    }
    // Being written: decided when the write returns and says which version is its own.
    const meanwhile = this.writing.get(key);
    if (!meanwhile) return false;
    meanwhile.push(version);
    return true;
  }

  /** The decision that led to this replica's write holds for the version the write produced: a worker may act on it. */
  private adoptOwnVersion(key: string, version: string): void {
    if (this.allocatedVersion.has(key)) this.allocatedVersion.set(key, version);
  }

  /**
   * Statuses first: Events go out one at a time, each after the queued
   * status writes (a backlog always drains), then once the writes pause
   * (none in flight, none for EVENT_QUIET_MS) or EVENT_DEFER_MS after it was
   * recorded. Each Event costs the API server (and etcd) about what a status
   * write does; this way a backlog or a burst of Services spends it on the
   * statuses, which is what users wait for, and the Events follow. A single
   * change waits EVENT_QUIET_MS. With the time limit alone, a cold start
   * lasting minutes (10,000 Services at 5,000 nodes, bench:scale) wrote its
   * Events beside the statuses from its 30th second on.
   */
  private record(svc: V1Service, type: 'Normal' | 'Warning', reason: string, note: string): void {
    const event = { regarding: serviceRef(svc), type, reason, action: 'Allocate', note };
    const since = performance.now();
    this.metrics.eventsPending.set(++this.eventsWaiting);
    this.eventsSent = this.eventsSent
      .then(() => this.afterWritesPause(since))
      .then(() => (this.dropEvents ? undefined : this.events.write(event)))
      .catch((err: unknown) => this.log.warn({ err: (err as Error)?.message ?? String(err), reason, service: serviceKey(svc) }, 'cannot write event'))
      .finally(() => this.metrics.eventsPending.set(--this.eventsWaiting));
  }

  private async afterWritesPause(since: number): Promise<void> {
    for (;;) {
      const now = performance.now();
      if (this.stopping) return;
      const quietFor = now - this.lastWriteAt;
      if (this.queue.length === 0 && (now - since >= EVENT_DEFER_MS || (this.writing.size === 0 && quietFor >= EVENT_QUIET_MS))) return;
      await sleep(this.queue.length > 0 || this.writing.size > 0 ? 20 : Math.min(EVENT_QUIET_MS - quietFor + 1, EVENT_DEFER_MS - (now - since)));
    }
  }
}

function serviceRef(svc: V1Service): V1ObjectReference {
  return { apiVersion: 'v1', kind: 'Service', namespace: svc.metadata?.namespace, name: svc.metadata?.name, uid: svc.metadata?.uid };
}

/** What allocate() reads from an agent Lease. */
function leaseView(l: V1Lease, fresh: boolean): string {
  const a = l.metadata?.annotations ?? {};
  return `${fresh}|${a[LEASE_FORWARDING_IPV4] ?? ''}|${a[LEASE_FORWARDING_IPV6] ?? ''}`;
}
