// `pier agent`: the per-node data plane. Watches Services, EndpointSlices and
// its own Node; renders the rules this node should hold (model.ts,
// render.ts) and applies them (applier.ts); reports what it can do in its
// Lease, in Events and in metrics. Rules stay in place when it stops.
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
import { Applier, eachFamily, type ApplyMode } from './applier.ts';
import { autoRuleBackend, choiceReason, detectBackend } from './backend.ts';
import { HeadStart } from './headstart.ts';
import { Xtables, commandRunner, type Backend, type Runner } from './iptables.ts';
import { NftApplier, findForwardDrops, nftUsable } from './nft-applier.ts';
import { NftRenderer, nftCounts, nftScript, NFT_TABLE, type NftUpdate } from './nft.ts';
import { agentMetrics, type AgentMetrics } from './metrics.ts';
import { problemKey, servedFamily, type Model, type Problem } from './model.ts';
import { SyncPipeline } from './pipeline.ts';
import { TABLES, type MarkBits, type Ruleset } from './render.ts';
import { planText, restoreText } from './restore.ts';
import { removePierRules } from './removal.ts';
import { checkForwarding } from './sysctl.ts';
import { Conntrack, describeCheck, flowFrontends, frontendsToCheck, type FlowFrontends } from './conntrack.ts';

export interface AgentConfig {
  nodeName: string;
  namespace: string;
  defaultClass: boolean;
  dryRun: boolean;
  setSysctls: boolean;
  /** Which rules pier writes: iptables chains, or its own nftables table. */
  backend: 'auto' | RuleBackend;
  /** The iptables flavour, for the iptables backend. */
  iptablesBackend: 'auto' | Backend;
  /** Where backend and iptablesBackend were set (`--backend`, `PIER_BACKEND`, `the default`), for the log; flags when absent. */
  setBy?: { backend: string; iptablesBackend: string };
  /** The connection-mark bits pier's rules set (masks, e.g. 0x2000). */
  marks: MarkBits;
  maxPortsPerService: number;
  minSyncIntervalMs: number;
  resyncPeriodMs: number;
  healthAddress: string;
  healthPort: number;
  leaseDurationSeconds: number;
  leaseRenewMs: number;
}

export type RuleBackend = 'iptables' | 'nftables';

/** One family's rules for one sync, in the backend's form, and what rendering them cost. */
type Rendered = { renderMs: number } & ({ kind: 'iptables'; ruleset: Ruleset } | { kind: 'nftables'; nft: NftUpdate });

/** What this node can do for one family, as the Lease reports it. */
interface Capability {
  forwarding: boolean;
  reason?: string;
}

export interface AgentDeps {
  kc: KubeConfig;
  log: Logger;
  /** Runs iptables; tests and benchmarks aim it at a namespace. */
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
  private appliers = new Map<Family, Applier | NftApplier>();
  private ruleBackend: RuleBackend = 'iptables';
  private ruleBackendReason = '';
  private backend: Backend = 'nft';
  private backendReason = '';
  /** Whether the other backend's rules were looked for (once, after the first good sync). */
  private leftoversRemoved = false;
  /** Other tables' forward chains whose policy drops, last reported (nftables backend). */
  private forwardDrops = '';
  private capability: Record<Family, Capability> = {
    ipv4: { forwarding: false, reason: 'not checked yet' },
    ipv6: { forwarding: false, reason: 'not checked yet' },
  };
  /** Families whose last apply failed, with the error. */
  private applyErrors = new Map<Family, string>();
  private lastProblems = new Set<string>();
  private dryRunApplied = new Map<Family, Ruleset | NftUpdate>();
  /** The nftables backend's table per family, kept between syncs. */
  private nftRenderers = new Map<Family, NftRenderer>();
  /** Per family, the UDP and SCTP frontends whose stale flows are gone; unset until the first clean-up. */
  private flowsCleaned = new Map<Family, FlowFrontends>();
  private conntrack = new Map<Family, Conntrack>();
  /** Retry of a failed flow clean-up: its delay, and the pending timer. */
  private flowRetry: { delayMs: number; timer?: NodeJS.Timeout } = { delayMs: FLOW_RETRY_MS };
  /** Holds what each sync leaves for the next to reuse. */
  private readonly pipeline: SyncPipeline;
  /** Feeds the pipeline while the informers first list; gone once the first sync starts. */
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
    this.pipeline = new SyncPipeline({
      nodeName: cfg.nodeName,
      model: {
        loadBalancerClass: contract.LOAD_BALANCER_CLASS,
        defaultClass: cfg.defaultClass,
        maxPortsPerService: cfg.maxPortsPerService,
      },
      render: { marks: cfg.marks },
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
      if (a && event !== 'delete' && (svc.status?.loadBalancer?.ingress ?? []).some((i) => a.addresses.has(addressInfo(i.ip)?.text ?? ''))) a.at = performance.now();
    });
    this.slices.onChange(onChange);
    this.nodes.onChange(onChange);
    // The first sync's iptables-save is read, its iptables-restore started,
    // and what each Service needs computed, while the informers list.
    for (const applier of this.appliers.values()) if (applier instanceof Applier) void applier.prepare();
    // The model is warmed either way; iptables rule texts only for the iptables backend.
    const families = this.renderedFamilies();
    // The rehearsal renders as the first sync will; a full write follows either way.
    const rehearse = (model: Model) => {
      const started = performance.now();
      for (const f of families) {
        if (this.ruleBackend === 'iptables') this.pipeline.ruleset(model[f]);
        else this.nftRenderer(f).update(model[f], { transaction: false });
      }
      const ports = families.reduce((n, f) => n + model[f].ports.length, 0);
      this.log.debug({ ports, ms: Math.round(performance.now() - started) }, "rendered the first sync's rules ahead, the lists' last pages still to come");
    };
    this.headStart =
      this.ruleBackend === 'iptables'
        ? new HeadStart(this.pipeline, { families, rehearse })
        : new HeadStart(this.pipeline, {
            families: [],
            prepare: (served) => {
              const family = servedFamily(served);
              if (served.frontends.length > 0 && families.includes(family)) this.nftRenderer(family).prepare(served);
            },
            rehearse,
          });
    for (const inf of [this.services, this.slices, this.nodes]) inf.start();
    await Promise.all([this.services.synced, this.slices.synced, this.nodes.synced]);
    await this.awaitControllerAnswer();
    if (this.stopped) return;
    this.cachesSynced = true;
    const iptables = this.ruleBackend === 'iptables' ? { iptablesBackend: this.backend, iptablesBackendReason: this.backendReason } : {};
    this.log.info({ backend: this.ruleBackend, backendReason: this.ruleBackendReason, ...iptables, dryRun: cfg.dryRun, healthPort: this.health.port }, 'agent started');
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
   * controller's answer brings them back (~0.25 s). So the rules in place
   * stay until the Services naming this node have been quiet for
   * ANSWER_SETTLE_MS after the renewal (at most a Lease duration); what the
   * controller did not list again then goes. A fresh Lease (a restart at
   * once, a rolling update) or none (a new node) waits for nothing.
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
    while (!this.stopped) {
      const until = Math.min(answer.at + ANSWER_SETTLE_MS, first.at + maxMs);
      const wait = until - performance.now();
      if (wait <= 0) break;
      await new Promise((resolve) => setTimeout(resolve, Math.min(wait, 100)));
    }
    this.answer = undefined;
    this.log.info({ waitedMs: Math.round(performance.now() - first.at), answered: answer.at > first.at }, 'the first sync follows the controller\'s answer');
  }

  /** The rule backend and, for iptables, its flavour: chosen once, before the first applier exists. */
  private async chooseBackends(runner: Runner): Promise<void> {
    const cfg = this.cfg;
    const setBy = this.setBy();
    if (cfg.iptablesBackend === 'auto') {
      const choice = await detectBackend(runner);
      this.backend = choice.backend;
      this.backendReason = choiceReason(setBy.iptablesBackend, choice.reason);
    } else {
      this.backend = cfg.iptablesBackend;
      this.backendReason = choiceReason(setBy.iptablesBackend);
    }
    if (cfg.backend !== 'auto') {
      this.ruleBackend = cfg.backend;
      this.ruleBackendReason = choiceReason(setBy.backend);
      return;
    }
    const xtError = await this.iptablesError('ipv4', runner);
    const nft = xtError ? await nftUsable(runner) : undefined;
    const auto = autoRuleBackend(xtError, nft);
    this.ruleBackend = auto.backend;
    this.ruleBackendReason = choiceReason(setBy.backend, auto.found);
  }

  private setBy(): { backend: string; iptablesBackend: string } {
    return this.cfg.setBy ?? { backend: '--backend', iptablesBackend: '--iptables-backend' };
  }

  /** Why iptables cannot serve `family` on this host, if it cannot. */
  private async iptablesError(family: Family, runner: Runner): Promise<string | undefined> {
    const xt = new Xtables(family, this.backend, runner);
    for (const table of TABLES) {
      const t = await xt.hasTable(table);
      if (!t.ok) return `${family === 'ipv4' ? 'iptables' : 'ip6tables'} has no usable ${table} table: ${t.error}`;
    }
    return undefined;
  }

  /**
   * Once this backend's rules are in place: the other backend's, which an
   * agent before a switch of --backend left (both would DNAT; the first nat
   * chain to bind a connection wins), go. As kube-proxy cleans up after its
   * other modes. Never fails the sync: a host without the other tool has
   * nothing of it.
   */
  private async removeLeftovers(): Promise<void> {
    this.leftoversRemoved = true;
    const nftables = this.ruleBackend === 'iptables';
    const results = await removePierRules(this.deps.runner ?? commandRunner(), { iptables: nftables ? [] : ['nft', 'legacy'], nftables });
    for (const r of results) if (r.error !== undefined) this.log.debug({ err: r.error }, `looking for pier's ${r.part} rules failed`);
    const removed = results.filter((r) => r.removed > 0).map((r) => `${r.part}: ${r.summary}`);
    if (removed.length > 0) this.log.info({ removed }, `removed pier's rules of the other backend (now ${this.ruleBackend})`);
  }

  /** Forwarding sysctls, the rule backend and its tables: what this node can serve. */
  async checkNode(): Promise<void> {
    const cfg = this.cfg;
    const runner = this.deps.runner ?? commandRunner();
    if (this.appliers.size === 0) {
      if (cfg.dryRun) {
        // Nothing is run in a dry run; auto prints what the default would write.
        this.ruleBackend = cfg.backend === 'nftables' ? 'nftables' : 'iptables';
        this.ruleBackendReason = choiceReason(this.setBy().backend, cfg.backend === 'auto' ? 'a dry run shows iptables' : undefined);
      } else await this.chooseBackends(runner);
      // A dry run detects no iptables flavour: the label stays empty rather than guess.
      this.metrics.buildInfo(this.ruleBackend, this.ruleBackend === 'iptables' && !cfg.dryRun ? this.backend : '');
    }
    const nftables = this.ruleBackend === 'nftables';
    const nftError = nftables && !cfg.dryRun ? await nftUsable(runner) : undefined;
    if (nftables && !cfg.dryRun) await this.reportForwardDrops(runner);
    for (const family of contract.FAMILIES) {
      const fwd = await checkForwarding(family, { set: cfg.setSysctls && !cfg.dryRun, root: this.deps.procSys });
      let tableError: string | undefined;
      if (!cfg.dryRun) {
        tableError = nftables ? (nftError?.ok === false ? `nft is not usable: ${nftError.error}` : undefined) : await this.iptablesError(family, runner);
        // Rules are programmed even while forwarding is off, so they work the
        // moment it is turned on; only unusable tables keep a family out.
        if (!tableError && !this.appliers.has(family)) {
          this.appliers.set(family, nftables ? new NftApplier(family, runner, this.log, this.metrics) : new Applier(new Xtables(family, this.backend, runner), this.log, this.metrics));
        }
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

  /**
   * An accept in pier's nftables table cannot override a drop in another
   * table's forward chain: say so (log and Event) whenever the set of such
   * chains changes, since what pier DNATs to other hosts then passes only
   * if the host's own rules accept it.
   */
  private async reportForwardDrops(runner: Runner): Promise<void> {
    let drops: string[];
    try {
      drops = await findForwardDrops(runner);
    } catch {
      return;
    }
    const now = drops.join(', ');
    if (now === this.forwardDrops) return;
    this.forwardDrops = now;
    if (drops.length === 0) return;
    const note = `forward chains with policy drop (${now}): pier's nftables table cannot accept across tables; add an accept for DNATed connections (iptables -A FORWARD -m conntrack --ctstate DNAT -j ACCEPT and the same with ip6tables, or ct status dnat accept in an nftables forward chain) or run pier with --backend iptables`;
    this.log.warn({ chains: drops }, note);
    this.events.record({ regarding: this.nodeRef(), type: 'Warning', reason: 'ForwardPolicyDrop', action: 'Check', note });
  }

  private leaseAnnotations(): Record<string, string> {
    const a: Record<string, string> = {
      [contract.LEASE_NODE]: this.cfg.nodeName,
      [contract.LEASE_BACKEND]: this.ruleBackend,
      // Only the iptables backend has a flavour.
      [contract.LEASE_IPTABLES_BACKEND]: this.ruleBackend === 'iptables' ? this.backend : '',
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
    // A full rewrite's iptables-save runs, and its iptables-restore starts, while the rules are computed.
    for (const applier of this.appliers.values()) if (applier instanceof Applier) void applier.prepare();
    // Incremental: the informers hand out the same object for an unchanged
    // Service or slice, so only what changed since the last sync is redone.
    // Both families' rules first, then their restores: a restore reads its
    // input while this thread is free to write it, and nft runs the two side
    // by side (eachFamily).
    const families = this.renderedFamilies();
    const planned = new Map<Family, Rendered>();
    let model: Model;
    try {
      model = this.pipeline.model({ nodeAddresses: nodeAddresses(node), services: this.services.list(), slices: this.slices.list() });
      this.report(model.problems);
      for (const family of families) {
        const started = performance.now();
        const rendered: Rendered =
          this.ruleBackend === 'nftables'
            ? { kind: 'nftables', nft: this.nftRenderer(family).update(model[family], { transaction: this.nftTransaction(family) }), renderMs: 0 }
            : { kind: 'iptables', ruleset: this.pipeline.ruleset(model[family]), renderMs: 0 };
        rendered.renderMs = performance.now() - started;
        planned.set(family, rendered);
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
    // nft takes no lock: both families side by side, as iptables-nft.
    const outcomes = await eachFamily(this.ruleBackend === 'nftables' ? 'nft' : this.backend, families, async (family) => {
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
      const mode = this.cfg.dryRun ? this.printDryRun(family, rendered) : await this.applyRendered(family, rendered, opts);
      this.metrics.syncDuration.observe({ family, mode }, (rendered.renderMs + performance.now() - started) / 1000);
      this.countRules(family, rendered);
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

  /** Whether a change to the nftables table is worth a transaction: not when it is written whole anyway. */
  private nftTransaction(family: Family): boolean {
    const applier = this.appliers.get(family);
    return !(applier instanceof NftApplier) || applier.holdsTable;
  }

  private nftRenderer(family: Family): NftRenderer {
    let r = this.nftRenderers.get(family);
    if (!r) this.nftRenderers.set(family, (r = new NftRenderer(family, this.cfg.marks.masquerade)));
    return r;
  }

  private async applyRendered(family: Family, r: Rendered, opts: { verify: boolean }): Promise<ApplyMode> {
    const applier = this.appliers.get(family)!;
    if (r.kind === 'nftables') return (await (applier as NftApplier).apply(r.nft, opts)).mode;
    return (await (applier as Applier).apply(r.ruleset, opts)).mode;
  }

  private countRules(family: Family, r: Rendered): void {
    if (r.kind === 'nftables') {
      const { rules, chains } = nftCounts(r.nft.state);
      this.metrics.rules.set({ family, table: NFT_TABLE }, rules);
      this.metrics.chains.set({ family, table: NFT_TABLE }, chains);
      return;
    }
    for (const table of TABLES) {
      const t = r.ruleset.tables[table];
      let rules = t.jumps.length;
      for (const c of t.chains.values()) rules += c.length;
      this.metrics.rules.set({ family, table }, rules);
      this.metrics.chains.set({ family, table }, t.chains.size);
    }
  }

  private printDryRun(family: Family, r: Rendered): ApplyMode {
    const previous = this.dryRunApplied.get(family);
    let payload: string;
    let tool: string;
    if (r.kind === 'nftables') {
      payload = previous && r.nft.delta !== undefined ? r.nft.delta : nftScript(r.nft.state);
      tool = 'nft -f';
      this.dryRunApplied.set(family, r.nft);
    } else {
      payload = previous ? restoreText(r.ruleset, { previous: previous as Ruleset }) : planText(r.ruleset);
      tool = `${family === 'ipv4' ? 'iptables' : 'ip6tables'}-restore --noflush`;
      this.dryRunApplied.set(family, r.ruleset);
    }
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
   * Deletes the UDP and SCTP flows this sync's rule changes left pinned to
   * an old outcome (conntrack.ts). Never throws: a failure is logged,
   * counted and retried with a backoff, and never holds the rules back.
   */
  private async cleanFlows(family: Family, model: Model[Family]): Promise<void> {
    const now = flowFrontends(model);
    const checks = frontendsToCheck(this.flowsCleaned.get(family), now);
    if (checks.length === 0) return;
    if (this.cfg.dryRun) {
      this.flowsCleaned.set(family, now);
      const out = this.deps.out ?? ((t: string) => process.stdout.write(t));
      out(`# pier agent --dry-run: node ${this.cfg.nodeName}, ${family}, sync ${this.syncs}: conntrack\n${checks.map(describeCheck).join('')}`);
      return;
    }
    let ct = this.conntrack.get(family);
    if (!ct) this.conntrack.set(family, (ct = new Conntrack(family, this.deps.runner ?? commandRunner())));
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

/** The addresses the controller may advertise for this node: InternalIP and ExternalIP. */
export function nodeAddresses(node: V1Node): string[] {
  return (node.status?.addresses ?? [])
    .filter((a) => a.type === 'InternalIP' || a.type === 'ExternalIP')
    .map((a) => a.address);
}

export type { Model };
