// `pier agent`: the per-node data plane. Watches Services, EndpointSlices and
// its own Node; the engine (engine/) turns them into the model of what this
// node serves, the backend chosen at start (backend.ts, backends.ts) renders
// and applies its rules; reports what it can do in its Lease, in Events and
// in metrics. Rules stay in place when it stops.
import type { KubeConfig, V1Node, V1ObjectReference, V1Service } from '@kubernetes/client-node';
import { addressInfo } from '../lib/address.ts';
import { endpointSliceInformer, nodeInformer, serviceInformer } from '../lib/collections.ts';
import { Coalescer } from '../lib/coalescer.ts';
import * as contract from '../lib/contract.ts';
import type { Family } from '../lib/contract.ts';
import { EventRecorder } from '../lib/events.ts';
import { startHealthServer } from '../lib/health.ts';
import { LeaseRenewer } from '../lib/lease.ts';
import type { Logger } from '../lib/log.ts';
import { slimEndpointSlice, slimNode, slimService } from '../lib/slim.ts';
import { VERSION } from '../lib/version.ts';
import type { ApplyMode, Backend, BackendName, FamilyApplier, FamilyRenderer } from './backend.ts';
import { openBackend, removeRules } from './backends.ts';
import { Engine, familyChanges, type EngineResult } from './engine/engine.ts';
import { HeadStart } from './engine/headstart.ts';
import { nodeAddresses, problemKey, servedFamily, type Model, type Problem } from './engine/model.ts';
import { agentMetrics, type AgentMetrics } from './metrics.ts';
import { checkForwarding } from './sysctl.ts';
import { Conntrack, describeCheck, flowBaseline, frontendsToCheck, type FlowBaseline } from './conntrack.ts';
import { commandRunner, type Runner } from '../lib/run.ts';

export interface AgentConfig {
  nodeName: string;
  namespace: string;
  defaultClass: boolean;
  dryRun: boolean;
  setSysctls: boolean;
  /** Which rules pier writes (`--backend`): iptables chains, or its own nftables table. */
  backend: 'auto' | BackendName;
  /** The iptables flavour (`--iptables-backend`), for the iptables backend. */
  iptablesBackend: 'auto' | 'nft' | 'legacy';
  /** Where backend and iptablesBackend were set (`--backend`, `PIER_BACKEND`, `the default`), for the log; flags when absent. */
  setBy?: { backend: string; iptablesBackend: string };
  /** The connection-mark bits pier's rules set (masks, e.g. 0x2000). */
  marks: { accept: number; masquerade: number };
  maxPortsPerService: number;
  minSyncIntervalMs: number;
  resyncPeriodMs: number;
  healthAddress: string;
  healthPort: number;
  leaseDurationSeconds: number;
  leaseRenewMs: number;
}

/** One family's rules for one sync, in the backend's form (opaque here), and what rendering them cost. */
interface Rendered {
  update: unknown;
  renderMs: number;
}

/** What this node can do for one family, as the Lease reports it. */
interface Capability {
  forwarding: boolean;
  reason?: string;
}

export interface AgentDeps {
  kc: KubeConfig;
  log: Logger;
  /** Runs the backend's tools; tests and benchmarks aim it at a namespace. */
  runner?: Runner;
  /** Where dry-run payloads go. */
  out?: (text: string) => void;
  /** /proc/sys, overridable for tests. */
  procSys?: string;
}

/**
 * awaitControllerAnswer: how long the Services naming this node must stay
 * unchanged after the renewal before the controller's answer counts as
 * complete (it answers a Lease change with one allocation, at most every
 * 200 ms, and a status write per Service: ~0.15 s in the lab); and how
 * little a Lease may have left to count as run out (the controller may drop
 * the node before it sees the renewal).
 */
const ANSWER_SETTLE_MS = 2000;
const RUN_OUT_MARGIN_MS = 1000;

/** First and longest wait before a failed conntrack clean-up is tried again. */
const FLOW_RETRY_MS = 1000;
const FLOW_RETRY_MAX_MS = 30_000;

export class Agent {
  readonly metrics: AgentMetrics;
  private readonly cfg: AgentConfig;
  private readonly deps: AgentDeps;
  private readonly log: Logger;
  private readonly services;
  private readonly slices;
  private readonly nodes;
  private readonly events: EventRecorder;
  private readonly coalescer: Coalescer<{ verify: boolean }>;
  private lease: LeaseRenewer | undefined;
  private health: Awaited<ReturnType<typeof startHealthServer>> | undefined;
  private resyncTimer: NodeJS.Timeout | undefined;
  /** The rule backend, chosen once by the first checkNode(). */
  private backend: Backend | undefined;
  /** Per family, the backend's renderer (kept between syncs) and, for families it can serve, its applier. */
  private renderers = new Map<Family, FamilyRenderer<unknown>>();
  private appliers = new Map<Family, FamilyApplier<unknown>>();
  /** Whether the other backends' rules were looked for (once, after the first good sync). */
  private leftoversRemoved = false;
  private capability: Record<Family, Capability> = {
    ipv4: { forwarding: false, reason: 'not checked yet' },
    ipv6: { forwarding: false, reason: 'not checked yet' },
  };
  /** Families whose last apply failed, with the error. */
  private applyErrors = new Map<Family, string>();
  private lastProblems = new Set<string>();
  private dryRunApplied = new Map<Family, unknown>();
  /** Per family, the UDP and SCTP frontends whose stale flows are gone; unset until the first clean-up. */
  private flowsCleaned = new Map<Family, FlowBaseline>();
  private conntrack = new Map<Family, Conntrack>();
  /** Retry of a failed flow clean-up: its delay, and the pending timer. */
  private flowRetry: { delayMs: number; timer?: NodeJS.Timeout } = { delayMs: FLOW_RETRY_MS };
  /** Holds the model each sync leaves for the next to reuse. */
  private readonly engine: Engine;
  /** Feeds the engine while the informers first list; gone once the first sync starts. */
  private headStart: HeadStart | undefined;
  private syncs = 0;
  /** Every cache holds its first list; before that a sync would render (and apply) a partial cluster. */
  private cachesSynced = false;
  /** While the first sync waits for the controller (awaitControllerAnswer): this node's addresses, and when a Service naming one last changed. */
  private answer: { addresses: Set<string>; at: number } | undefined;
  private stopped = false;
  private readyDetail = 'no successful sync yet';
  ready = false;

  constructor(cfg: AgentConfig, deps: AgentDeps) {
    this.cfg = cfg;
    this.deps = deps;
    this.log = deps.log.child({ node: cfg.nodeName });
    this.metrics = agentMetrics();
    const backoff = { initialMs: 500, maxMs: 10_000 };
    // The caches keep only what the agent reads (lib/slim.ts): at 10,000
    // Services whole objects would be most of the agent's memory. Lists are
    // read as JSON (lib/rawlist.ts), each page handed to the head start as it lands.
    const informing = { log: this.log, backoff, raw: true };
    this.services = serviceInformer(deps.kc, { ...informing, transform: slimService, onListPage: (page, left) => this.listed((h) => h.servicesListed(page, left)) });
    this.slices = endpointSliceInformer(deps.kc, { ...informing, transform: slimEndpointSlice, onListPage: (page, left) => this.listed((h) => h.slicesListed(page, left)) });
    this.nodes = nodeInformer(deps.kc, {
      ...informing,
      transform: slimNode,
      fieldSelector: `metadata.name=${cfg.nodeName}`,
      onListPage: (page) => {
        const node = page.find((n) => n.metadata?.name === cfg.nodeName);
        if (node) this.listed((h) => h.node(nodeAddresses(node)));
      },
    });
    this.engine = new Engine({
      nodeName: cfg.nodeName,
      model: {
        loadBalancerClass: contract.LOAD_BALANCER_CLASS,
        defaultClass: cfg.defaultClass,
        maxPortsPerService: cfg.maxPortsPerService,
      },
    });
    this.events = new EventRecorder({ kc: deps.kc, controller: 'pier.dev/agent', instance: cfg.nodeName, log: this.log });
    this.coalescer = new Coalescer((o) => this.sync(o), {
      minIntervalMs: cfg.minSyncIntervalMs,
      merge: (a, b) => ({ verify: a.verify || b.verify }),
    });
  }

  async start(): Promise<void> {
    const cfg = this.cfg;
    this.health = await startHealthServer({
      address: cfg.healthAddress,
      port: cfg.healthPort,
      registry: this.metrics.registry,
      ready: () => ({ ok: this.ready, detail: this.readyDetail }),
    });
    await this.checkNode();
    if (!cfg.dryRun) {
      this.lease = new LeaseRenewer({
        kc: this.deps.kc,
        namespace: cfg.namespace,
        name: contract.agentLeaseName(cfg.nodeName),
        holder: cfg.nodeName,
        durationSeconds: cfg.leaseDurationSeconds,
        renewEveryMs: cfg.leaseRenewMs,
        labels: { [contract.AGENT_LEASE_LABEL]: contract.AGENT_LEASE_LABEL_VALUE },
        annotations: () => this.leaseAnnotations(),
        log: this.log,
      });
      this.lease.start();
    }
    // The first list of one collection lands before the others: syncing on
    // its events would apply the rules of a cluster without Services, and
    // drop every connection on a restart until the next sync.
    const onChange = () => {
      if (this.cachesSynced) this.coalescer.request({ verify: false });
    };
    this.services.onChange(onChange);
    this.services.onChange((svc, event) => {
      const a = this.answer;
      if (a && event !== 'delete' && listsAny(svc, a.addresses)) a.at = performance.now();
    });
    this.slices.onChange(onChange);
    this.nodes.onChange(onChange);
    // What the first sync's full write needs (a save, a waiting process) is
    // started, and what each Service needs computed, while the informers list.
    for (const applier of this.appliers.values()) applier.prepare();
    const families = this.renderedFamilies();
    // The rehearsal renders as the first sync will; a full write follows either way.
    const rehearse = ({ model, changes }: EngineResult) => {
      const started = performance.now();
      for (const f of families) this.renderer(f).render(model[f], familyChanges(changes, f), { whole: true });
      const ports = families.reduce((n, f) => n + model[f].ports.length, 0);
      this.log.debug({ ports, ms: Math.round(performance.now() - started) }, "rendered the first sync's rules ahead, the lists' last pages still to come");
    };
    this.headStart = new HeadStart(this.engine, {
      prepare: (served) => {
        const family = servedFamily(served);
        if (served.frontends.length > 0 && families.includes(family)) this.renderer(family).prepare(served);
      },
      rehearse,
    });
    for (const inf of [this.services, this.slices, this.nodes]) inf.start();
    await Promise.all([this.services.synced, this.slices.synced, this.nodes.synced]);
    await this.awaitControllerAnswer();
    if (this.stopped) return;
    this.cachesSynced = true;
    const d = this.backend!.description;
    this.log.info({ backend: d.name, backendReason: d.reason, ...d.logFields, dryRun: cfg.dryRun, healthPort: this.health.port }, 'agent started');
    this.coalescer.request({ verify: true });
    this.resyncTimer = setInterval(() => {
      void this.checkNode().then(() => this.coalescer.request({ verify: true }));
    }, cfg.resyncPeriodMs);
  }

  get healthPort(): number | undefined {
    return this.health?.port;
  }

  /** Stops watching and reporting. The rules stay: traffic keeps flowing through an upgrade. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.resyncTimer);
    clearTimeout(this.flowRetry.timer);
    await this.coalescer.stop();
    for (const applier of this.appliers.values()) applier.close();
    await Promise.all([this.services.stop(), this.slices.stop(), this.nodes.stop()]);
    await this.lease?.stop();
    await this.health?.close();
  }

  /**
   * Issue 27. When this node's Lease had run out before this agent renewed
   * it (the kubelet's back-off after crashes, a reboot with the rules
   * restored), the controller has withdrawn the node from the statuses
   * while the rules the last agent left still serve it, and lists it again
   * once it sees the renewal. A first sync from the statuses before that
   * deletes those rules, and the node refuses connections until the
   * controller's answer brings them back. So the rules in place stay until
   * a Service lists this node again and the Services naming it have been
   * quiet for ANSWER_SETTLE_MS; at most a Lease duration after the renewal,
   * when what the controller did not list again goes. Quiet alone is no
   * answer: a controller that is slow (busy, failing over) has not answered
   * yet. A fresh Lease (a restart at once, a rolling update) or none (a new
   * node) waits for nothing.
   */
  private async awaitControllerAnswer(): Promise<void> {
    const lease = this.lease;
    if (!lease) return;
    const maxMs = this.cfg.leaseDurationSeconds * 1000;
    let timer: NodeJS.Timeout | undefined;
    const first = await Promise.race([lease.firstRenewal, new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), maxMs)))]);
    clearTimeout(timer);
    if (!first || !first.existed || first.remainingMs >= RUN_OUT_MARGIN_MS) return;
    const node = this.nodes.get(this.cfg.nodeName);
    const addresses = new Set((node ? nodeAddresses(node) : []).map((a) => addressInfo(a)?.text ?? a));
    const answer = (this.answer = { addresses, at: first.at });
    this.readyDetail = 'waiting for the controller to list this node again; keeping the rules in place';
    const leftMs = Number.isFinite(first.remainingMs) ? Math.round(first.remainingMs) : undefined;
    this.log.info({ leaseLeftMs: leftMs, settleMs: ANSWER_SETTLE_MS, maxMs }, "this node's Lease had run out when this agent renewed it, so the controller may have withdrawn the node: the rules in place stay until it has answered the renewal");
    const listed = () => this.services.list().some((svc) => listsAny(svc, addresses));
    while (!this.stopped) {
      const until = Math.min(listed() ? answer.at + ANSWER_SETTLE_MS : Number.POSITIVE_INFINITY, first.at + maxMs);
      const wait = until - performance.now();
      if (wait <= 0) break;
      await new Promise((resolve) => setTimeout(resolve, Math.min(wait, 100)));
    }
    this.answer = undefined;
    this.log.info({ waitedMs: Math.round(performance.now() - first.at), listed: listed() }, "the first sync follows the controller's answer");
  }

  private setBy(): { backend: string; iptablesBackend: string } {
    return this.cfg.setBy ?? { backend: '--backend', iptablesBackend: '--iptables-backend' };
  }

  /**
   * Once this backend's rules are in place: the other backends', which an
   * agent before a switch of --backend left (both would DNAT; the first nat
   * chain to bind a connection wins), go. As kube-proxy cleans up after its
   * other modes. Never fails the sync: a host without the other tool has
   * nothing of it.
   */
  private async removeLeftovers(): Promise<void> {
    this.leftoversRemoved = true;
    const name = this.backend!.description.name;
    const results = await removeRules(this.runner(), { iptablesFlavour: 'auto', explain: false }, name);
    for (const r of results) if (r.error !== undefined) this.log.debug({ err: r.error }, `looking for pier's ${r.part} rules failed`);
    const removed = results.filter((r) => r.removed > 0).map((r) => `${r.part}: ${r.summary}`);
    if (removed.length > 0) this.log.info({ removed }, `removed pier's rules of the other backend (now ${name})`);
  }

  private runner(): Runner {
    return this.deps.runner ?? commandRunner();
  }

  /** Forwarding sysctls, the rule backend and its tables: what this node can serve. */
  async checkNode(): Promise<void> {
    const cfg = this.cfg;
    const runner = this.runner();
    if (!this.backend) {
      const ctx = { runner, log: this.log, metrics: this.metrics, marks: cfg.marks, warn: (reason: string, note: string, fields: Record<string, unknown>) => this.warnNode(reason, note, fields) };
      this.backend = await openBackend(ctx, { backend: cfg.backend, iptablesFlavour: cfg.iptablesBackend, setBy: this.setBy(), dryRun: cfg.dryRun });
      this.metrics.buildInfo(this.backend.description.name, this.backend.description.flavour);
    }
    const backend = this.backend;
    if (!cfg.dryRun) await backend.checkHost();
    for (const family of contract.FAMILIES) {
      const fwd = await checkForwarding(family, { set: cfg.setSysctls && !cfg.dryRun, root: this.deps.procSys });
      let tableError: string | undefined;
      if (!cfg.dryRun) {
        tableError = (await backend.check(family))[0]?.lease;
        // Rules are programmed even while forwarding is off, so they work the
        // moment it is turned on; only unusable tables keep a family out.
        if (!tableError && !this.appliers.has(family)) this.appliers.set(family, backend.applier(family));
      }
      const cap: Capability = tableError
        ? { forwarding: false, reason: tableError }
        : fwd.enabled
          ? { forwarding: true }
          : { forwarding: false, reason: fwd.reason };
      const before = this.capability[family];
      this.capability[family] = cap;
      this.metrics.forwarding.set({ family }, cap.forwarding ? 1 : 0);
      if (before.forwarding === cap.forwarding && before.reason === cap.reason) continue;
      if (cap.forwarding) {
        this.log.info({ family }, 'forwarding available');
      } else {
        this.log.warn({ family, reason: cap.reason }, 'this node cannot forward the family; the controller will not advertise it');
        this.events.record({ regarding: this.nodeRef(), type: 'Warning', reason: 'ForwardingDisabled', action: 'Check', note: `${family}: ${cap.reason}` });
      }
      this.lease?.renewNow();
    }
  }

  /** A condition of this node an operator should know: a log line and a Warning Event on the Node. */
  private warnNode(reason: string, note: string, fields: Record<string, unknown>): void {
    this.log.warn(fields, note);
    this.events.record({ regarding: this.nodeRef(), type: 'Warning', reason, action: 'Check', note });
  }

  private leaseAnnotations(): Record<string, string> {
    const a: Record<string, string> = {
      [contract.LEASE_NODE]: this.cfg.nodeName,
      [contract.LEASE_BACKEND]: this.backend?.description.name ?? '',
      // Only the iptables backend has a flavour.
      [contract.LEASE_IPTABLES_BACKEND]: this.backend?.description.flavour ?? '',
      [contract.LEASE_VERSION]: VERSION,
    };
    const keys = {
      ipv4: [contract.LEASE_FORWARDING_IPV4, contract.LEASE_FORWARDING_IPV4_REASON],
      ipv6: [contract.LEASE_FORWARDING_IPV6, contract.LEASE_FORWARDING_IPV6_REASON],
    } as const;
    for (const family of contract.FAMILIES) {
      const cap = this.capability[family];
      const applyError = this.applyErrors.get(family);
      const ok = cap.forwarding && applyError === undefined;
      a[keys[family][0]] = String(ok);
      a[keys[family][1]] = ok ? '' : (cap.reason ?? `applying rules fails: ${applyError}`);
    }
    return a;
  }

  private nodeRef(): V1ObjectReference {
    const node = this.nodes.get(this.cfg.nodeName);
    return { apiVersion: 'v1', kind: 'Node', name: this.cfg.nodeName, uid: node?.metadata?.uid };
  }

  /** The families a sync renders rules for. */
  private renderedFamilies(): Family[] {
    return this.cfg.dryRun ? [...contract.FAMILIES] : [...this.appliers.keys()];
  }

  /** Hands a listed page to the head start; a failure there only leaves the first sync more to do. */
  private listed(feed: (h: HeadStart) => void): void {
    const h = this.headStart;
    if (!h) return;
    try {
      feed(h);
    } catch (err) {
      h.done();
      this.headStart = undefined;
      this.log.warn({ err: (err as Error).message }, 'computing rules while listing failed; the first sync computes them all');
    }
  }

  /** One sync: render from the informers' caches, apply per family. Never throws. */
  private async sync(opts: { verify: boolean }): Promise<void> {
    this.headStart?.done();
    this.headStart = undefined;
    const node = this.nodes.get(this.cfg.nodeName);
    if (!node) {
      // Without the Node its addresses are unknown; rendering nothing would
      // delete every rule, so keep what is there until it shows up.
      this.readyDetail = `Node ${this.cfg.nodeName} not found; keeping existing rules`;
      this.log.warn(this.readyDetail);
      return;
    }
    this.syncs++;
    // What a full write needs (an iptables-save, a waiting iptables-restore) starts while the rules are computed.
    for (const applier of this.appliers.values()) applier.prepare();
    // Incremental: the informers hand out the same object for an unchanged
    // Service or slice, so only what changed since the last sync is redone.
    // Both families' rules first, then their applies: a tool reads its
    // input while this thread is free to write it, and the backend may run
    // the two side by side (eachFamily).
    const families = this.renderedFamilies();
    const planned = new Map<Family, Rendered>();
    let model: Model;
    try {
      const result = this.engine.update({ nodeAddresses: nodeAddresses(node), services: this.services.list(), slices: this.slices.list() });
      model = result.model;
      this.report(model.problems);
      for (const family of families) {
        const started = performance.now();
        // No change needs spelling when the apply writes everything anyway.
        const whole = this.appliers.get(family)?.holdsRules === false;
        const update = this.renderer(family).render(model[family], familyChanges(result.changes, family), { whole });
        planned.set(family, { update, renderMs: performance.now() - started });
      }
    } catch (err) {
      // A bug, not input: the engine already retried from an empty state.
      // Nothing was written; the next sync (at the latest the resync) tries again.
      const msg = (err as Error).message;
      for (const family of families) this.metrics.syncErrors.inc({ family });
      this.readyDetail = `computing the rules failed: ${msg}; the rules in place are kept`;
      this.log.error({ err: msg, stack: (err as Error).stack }, 'computing the rules failed; the rules in place are kept');
      return;
    }
    const outcomes = await this.backend!.eachFamily(families, async (family) => {
      const ok = await this.applyFamily(family, planned.get(family)!, opts);
      // Only once the rules that should serve a flow are in place: the
      // flow's next packet must meet them.
      if (ok) await this.cleanFlows(family, model[family]);
      return ok;
    });
    const allOk = outcomes.every(Boolean);
    if (allOk && !this.leftoversRemoved && !this.cfg.dryRun) await this.removeLeftovers();
    if (allOk) {
      this.ready = true;
      this.readyDetail = `synced ${this.syncs} times`;
      this.metrics.lastSuccess.set(Date.now() / 1000);
    } else {
      this.readyDetail = `last sync failed: ${[...this.applyErrors].map(([f, e]) => `${f}: ${e}`).join('; ')}`;
    }
  }

  /** One family's apply, with its metrics, logs and Events; whether it succeeded. Never throws. */
  private async applyFamily(family: Family, rendered: Rendered, opts: { verify: boolean }): Promise<boolean> {
    const started = performance.now();
    try {
      const mode = this.cfg.dryRun ? this.printDryRun(family, rendered.update) : (await this.appliers.get(family)!.apply(rendered.update, opts)).mode;
      this.metrics.syncDuration.observe({ family, mode }, (rendered.renderMs + performance.now() - started) / 1000);
      for (const c of this.renderer(family).count(rendered.update)) {
        this.metrics.rules.set({ family, table: c.table }, c.rules);
        this.metrics.chains.set({ family, table: c.table }, c.chains);
      }
      if (this.applyErrors.delete(family)) this.lease?.renewNow();
      return true;
    } catch (err) {
      const msg = (err as Error).message;
      this.metrics.syncErrors.inc({ family });
      this.log.error({ family, err: msg }, 'applying rules failed; the rules in place stay until a sync succeeds');
      if (!this.applyErrors.has(family)) this.lease?.renewNow();
      this.applyErrors.set(family, msg);
      this.events.record({ regarding: this.nodeRef(), type: 'Warning', reason: 'SyncFailed', action: 'Sync', note: `${family}: ${msg}` });
      return false;
    }
  }

  /** The backend's renderer for `family`, made on first use and kept. */
  private renderer(family: Family): FamilyRenderer<unknown> {
    let r = this.renderers.get(family);
    if (!r) this.renderers.set(family, (r = this.backend!.renderer(family)));
    return r;
  }

  private printDryRun(family: Family, update: unknown): ApplyMode {
    const previous = this.dryRunApplied.get(family);
    const { tool, text: payload } = this.renderer(family).text(update, previous);
    this.dryRunApplied.set(family, update);
    const out = this.deps.out ?? ((t: string) => process.stdout.write(t));
    const head = `# pier agent --dry-run: node ${this.cfg.nodeName}, ${family}, sync ${this.syncs}`;
    if (payload === '') {
      out(`${head}: no change\n`);
      return 'noop';
    }
    out(`${head}: ${previous ? 'changes' : 'complete ruleset'} for ${tool}\n${payload}`);
    return previous ? 'partial' : 'full';
  }

  /**
   * Deletes the flows this sync's changes left pinned to an old outcome: UDP
   * and SCTP ones the rules moved, TCP ones to endpoints gone from the slices
   * (conntrack.ts). Never throws: a failure is logged,
   * counted and retried with a backoff, and never holds the rules back.
   */
  private async cleanFlows(family: Family, model: Model[Family]): Promise<void> {
    const now = flowBaseline(model);
    const checks = frontendsToCheck(this.flowsCleaned.get(family), now);
    if (checks.length === 0) {
      // The new baseline all the same: a TCP frontend is checked against what it listed before.
      this.flowsCleaned.set(family, now);
      return;
    }
    if (this.cfg.dryRun) {
      this.flowsCleaned.set(family, now);
      const out = this.deps.out ?? ((t: string) => process.stdout.write(t));
      out(`# pier agent --dry-run: node ${this.cfg.nodeName}, ${family}, sync ${this.syncs}: conntrack\n${checks.map(describeCheck).join('')}`);
      return;
    }
    let ct = this.conntrack.get(family);
    if (!ct) this.conntrack.set(family, (ct = new Conntrack(family, this.runner())));
    try {
      const { deletions, deleted } = await ct.clean(checks);
      this.flowsCleaned.set(family, now);
      this.flowRetry.delayMs = FLOW_RETRY_MS;
      for (const d of deletions) this.metrics.conntrackDeleted.inc({ family, protocol: d.protocol }, d.entries);
      if (deletions.length > 0) {
        const shown = deletions.slice(0, 10).map((d) => `${d.protocol} ${d.address}:${d.port} from ${d.replySrc}:${d.replySport} (${d.entries})`);
        this.log.info({ family, frontends: checks.length, deleted, flows: shown }, 'deleted stale conntrack entries');
      }
    } catch (err) {
      const msg = (err as Error).message;
      this.metrics.conntrackErrors.inc({ family });
      const retry = this.flowRetry;
      this.log.warn({ family, err: msg, retryInMs: retry.delayMs }, 'deleting stale conntrack entries failed; the rules are in place, the clean-up is retried');
      if (retry.delayMs === FLOW_RETRY_MS) {
        this.events.record({ regarding: this.nodeRef(), type: 'Warning', reason: 'ConntrackFailed', action: 'Sync', note: `${family}: ${msg}` });
      }
      clearTimeout(retry.timer);
      retry.timer = setTimeout(() => this.coalescer.request({ verify: false }), retry.delayMs);
      retry.delayMs = Math.min(retry.delayMs * 2, FLOW_RETRY_MAX_MS);
    }
  }

  /** Problems become Warning Events on their Service and log lines, once per distinct problem. */
  private report(problems: Problem[]): void {
    const now = new Set<string>();
    const byReason = new Map<string, number>();
    for (const p of problems) {
      const key = problemKey(p);
      now.add(key);
      byReason.set(p.reason, (byReason.get(p.reason) ?? 0) + 1);
      if (this.lastProblems.has(key)) continue;
      this.log.warn({ service: p.service, port: p.port, reason: p.reason }, p.message);
      const [namespace, name] = p.service.split('/') as [string, string];
      const svc: V1Service | undefined = this.services.get(name, namespace);
      this.events.record({
        regarding: { apiVersion: 'v1', kind: 'Service', namespace, name, uid: svc?.metadata?.uid },
        type: 'Warning',
        reason: p.reason,
        action: 'Sync',
        note: `node ${this.cfg.nodeName}: ${p.message}`,
      });
    }
    this.metrics.problems.reset();
    for (const [reason, n] of byReason) this.metrics.problems.set({ reason }, n);
    this.lastProblems = now;
  }

  /** For tests: resolves when no sync is running or pending. */
  idle(): Promise<void> {
    return this.coalescer.idle();
  }
}

export { nodeAddresses };
export type { Model };

/** Whether `svc`'s status lists one of `addresses` (canonical text). */
function listsAny(svc: V1Service, addresses: ReadonlySet<string>): boolean {
  return (svc.status?.loadBalancer?.ingress ?? []).some((i) => addresses.has(addressInfo(i.ip)?.text ?? ''));
}
