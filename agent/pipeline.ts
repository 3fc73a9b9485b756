// The agent's sync, incremental: buildModel and renderRuleset give the same
// result from scratch, but at 10,000 Service ports a sync from scratch costs
// far more than the one Service that changed.
//
// What makes it safe: the informers' caches replace an object when it changes
// and hand out the very same object while it does not, and nothing in the
// agent mutates them. So a Service's share of the model is kept per Service
// object (with the identities of its slices), a port's rule texts until its
// served port object changes, and a tree chain until a port in its range changes.
// What spans Services is redone, but only where the changes reach: the claims
// on a changed frontend, the served ports whose frontends moved, the chains on a
// changed port's path. Unchanged parts keep their identity all the way to the
// ruleset, so the applier's diff skips an unchanged chain with one
// comparison, and a sync with no change at all returns the previous model and
// rulesets themselves.
//
// A cold sync (a new pipeline) does the same work as the pure functions plus
// the bookkeeping. What is kept between syncs costs ~1.8 KB per service port
// (measured with two endpoints each) besides the rule texts the applied
// ruleset holds anyway (~0.55 KB).
//
// This is the only engine outside the tests: buildModel and renderRuleset are
// the property tests' oracle. What the bookkeeping does not expect (two
// Services with one name, two served ports with one key: informers hold each
// object once, names hold no '/', and pier plan's reader, manifests.ts, keeps
// it so) throws Unexpected; the caches start over and the sync is redone from
// an empty state, a cold sync. Should that fail too, the error goes to the
// caller, which keeps the rules in place.
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import type { Family } from '../lib/contract.ts';
import {
  compareServedPorts,
  conflictProblems,
  portChanges,
  recordPortChanges,
  type PortChanges,
  dedupeProblems,
  pierService,
  modelContext,
  servedFamily,
  rankClaims,
  serviceOwner,
  serviceResult,
  sliceServiceId,
  type Claim,
  type FamilyModel,
  type Frontend,
  type Model,
  type ModelConfig,
  type ModelContext,
  type Problem,
  type Protocol,
  type ServiceIdentity,
  type ServedPort,
  type ServiceResult,
} from './model.ts';
import {
  assembleRuleset,
  buildGroupTree,
  compareGroups,
  fixedRules,
  servedEntries,
  perTree,
  servedRules,
  sameStrings,
  treeTable,
  TREES,
  type GroupTree,
  type MarkBits,
  type ServedRules,
  type PortEntry,
  type RenderConfig,
  type Ruleset,
  type TableName,
  type TreeName,
} from './render.ts';

export interface PipelineConfig {
  nodeName: string;
  model: ModelConfig;
  render: RenderConfig;
}

export interface PipelineInput {
  /** This node's addresses, both families. */
  nodeAddresses: readonly string[];
  /** As the informer lists them; unchanged objects must be the same objects. */
  services: readonly V1Service[];
  slices: readonly V1EndpointSlice[];
}

/** Thrown inside, caught at the top: the input is outside what the incremental path handles. */
class Unexpected extends Error {}

/** Holds the caches of one agent's syncs. */
export class SyncPipeline {
  private readonly config: PipelineConfig;
  private readonly incrementalModel = new IncrementalModel();
  private readonly renderers: Record<Family, IncrementalRenderer>;
  /** Syncs redone from an empty state because the bookkeeping lost track: 0 unless pier has a bug. */
  restarts = 0;

  constructor(config: PipelineConfig) {
    this.config = config;
    this.renderers = { ipv4: new IncrementalRenderer('ipv4', config.render), ipv6: new IncrementalRenderer('ipv6', config.render) };
  }

  /** buildModel's result for this input; the previous Model itself when nothing changed. */
  model(input: PipelineInput): Model {
    const ctxInput = { nodeName: this.config.nodeName, nodeAddresses: [...input.nodeAddresses], config: this.config.model };
    try {
      return this.incrementalModel.update(ctxInput, input);
    } catch (err) {
      // Whatever was half done is dropped; the next sync starts afresh.
      this.incrementalModel.reset();
      if (!(err instanceof Unexpected)) throw err;
      this.restarts++;
      return again(() => this.incrementalModel.update(ctxInput, input), () => this.incrementalModel.reset());
    }
  }

  /**
   * Before the first sync, while the informers list: one listed Service's
   * share of the model and its ports' rules, computed ahead so that the first
   * sync, handed the same objects, finds them done. A guess that turns out
   * wrong (the Node's addresses change, another slice arrives, the object is
   * replaced) costs only the work: the sync checks every object by identity,
   * as it does between syncs. After the first sync it does nothing. Returns
   * the Service's served ports, for the nftables renderers to prepare.
   */
  warm(nodeAddresses: readonly string[], svc: V1Service, slices: readonly V1EndpointSlice[], families: readonly Family[]): readonly ServedPort[] {
    const ctxInput = { nodeName: this.config.nodeName, nodeAddresses: [...nodeAddresses], config: this.config.model };
    try {
      const result = this.incrementalModel.warm(ctxInput, svc, slices);
      if (!result) return [];
      // Only the families the first sync renders: what is prepared is kept until then.
      for (let i = 0; i < result.servedPorts.length; i++) {
        const served = result.servedPorts[i]!;
        const family = servedFamily(served);
        if (served.frontends.length > 0 && families.includes(family)) this.renderers[family].prepare(served);
      }
      return result.servedPorts;
    } catch (err) {
      // Nothing is lost: the first sync computes what is missing.
      this.incrementalModel.reset();
      for (const family of FAMILY_LIST) this.renderers[family].reset();
      if (!(err instanceof Unexpected)) throw err;
      return [];
    }
  }

  /** renderRuleset's result for one family's model; the previous Ruleset itself when the family model is the previous one. */
  ruleset(model: FamilyModel): Ruleset {
    const r = this.renderers[model.family];
    try {
      return r.update(model);
    } catch (err) {
      r.reset();
      if (!(err instanceof Unexpected)) throw err;
      this.restarts++;
      return again(() => r.update(model), () => r.reset());
    }
  }
}

/**
 * A sync redone on caches just reset: the incremental path from an empty
 * state, which is a cold sync. An Unexpected there comes from the input, not
 * from what was kept, so it goes up, with the caches reset again.
 */
function again<T>(run: () => T, reset: () => void): T {
  try {
    return run();
  } catch (err) {
    reset();
    throw err;
  }
}

// ---------------------------------------------------------------------------
// The model

/** A Service in the current model. */
interface Live {
  /** The object `result` was made from. */
  svc: V1Service;
  owner: ServiceIdentity;
  /** The slices `result` was made from: one, several, or none. */
  slices: SliceSet;
  result: ServiceResult | undefined;
  /** result.servedPorts as the model shows them: the same objects unless a conflict cost them a frontend. */
  finals: readonly ServedPort[];
  /** The update that last saw it. */
  stamp: number;
  /** Still in the model. */
  current: boolean;
  /** The slices this update found for it, valid when nextStamp is the update's. */
  next: SliceSet;
  nextStamp: number;
}

/** Most Services have one slice: no array for them. */
type SliceSet = V1EndpointSlice | V1EndpointSlice[] | undefined;

const FAMILY_LIST: readonly Family[] = ['ipv4', 'ipv6'];
const NO_SLICES: readonly V1EndpointSlice[] = Object.freeze([]);

type ContextInput = { nodeName: string; nodeAddresses: string[]; config: ModelConfig };

class IncrementalModel {
  private ctx: ModelContext | undefined;
  private ctxKey = '';
  /** Per slice: the Live it belongs to, or the id of its Service when none is live, or null for none. */
  private sliceOwners = new WeakMap<V1EndpointSlice, Live | string | null>();
  /** The Live of the object last seen for it, to skip reading the object again. */
  private byObject = new WeakMap<V1Service, Live>();
  private stamp = 0;
  private live = new Map<string, Live>();
  /** Claims per frontend key, ranked: the first serves the frontend. */
  private claims = new Map<number, Claim[]>();
  private conflicts = new Map<number, Problem[]>();
  /** The model's served ports per family, sorted by key: those with frontends. Replaced, never changed in place. */
  private sorted: Record<Family, ServedPort[]> = { ipv4: [], ipv6: [] };
  private withProblems = new Set<ServiceResult>();
  private last: Model | undefined;

  reset(): void {
    this.ctx = undefined;
    this.ctxKey = '';
    this.sliceOwners = new WeakMap();
    this.byObject = new WeakMap();
    this.live = new Map();
    this.claims = new Map();
    this.conflicts = new Map();
    this.sorted = { ipv4: [], ipv6: [] };
    this.withProblems = new Set();
    this.last = undefined;
  }

  /** The context results are computed in; a new one drops every cached result, which all depend on the node and the config. */
  private context(ctxInput: ContextInput): ModelContext {
    const ctx = modelContext(ctxInput);
    const c = ctx.config;
    const key = JSON.stringify([ctx.nodeName, [...ctx.nodeAddresses.keys()], c.loadBalancerClass, c.defaultClass, c.maxPortsPerService]);
    if (key !== this.ctxKey) {
      this.reset();
      this.ctxKey = key;
    }
    return (this.ctx ??= ctx);
  }

  /**
   * SyncPipeline.warm's model half: the Live a first update will find for
   * this object and these slices, its result computed. Returns the result
   * when it computed one.
   */
  warm(ctxInput: ContextInput, svc: V1Service, slices: readonly V1EndpointSlice[]): ServiceResult | undefined {
    if (this.last) return undefined;
    const ctx = this.context(ctxInput);
    if (!pierService(svc, ctx.config)) return undefined;
    const owner = serviceOwner(svc);
    // The shape update() gives a Service's slices, in the order listed.
    const set: SliceSet = slices.length === 0 ? undefined : slices.length === 1 ? slices[0] : [...slices];
    let live = this.live.get(owner.id);
    if (live && live.svc === svc && live.result && sameSlices(live.slices, set)) return undefined;
    if (!live) {
      live = { svc, owner, slices: set, result: undefined, finals: [], stamp: 0, current: true, next: undefined, nextStamp: 0 };
      this.live.set(owner.id, live);
    } else {
      // The same Live: slices already warmed point at it.
      live.svc = svc;
      live.owner = owner;
      live.slices = set;
    }
    live.result = serviceResult(svc, owner, slices, ctx);
    this.byObject.set(svc, live);
    for (let i = 0; i < slices.length; i++) this.sliceOwners.set(slices[i]!, live);
    return live.result;
  }

  update(ctxInput: ContextInput, input: PipelineInput): Model {
    this.context(ctxInput);

    // Slices go straight to their Service's Live: in a steady state that is a
    // lookup by identity, no map built per sync.
    const stamp = ++this.stamp;
    const orphans = new Map<string, SliceSet>();
    const slices = input.slices;
    for (let i = 0; i < slices.length; i++) {
      const slice = slices[i]!;
      if (!slice || typeof slice !== 'object') continue;
      let owner = this.sliceOwners.get(slice);
      if (owner === undefined) owner = sliceServiceId(slice) ?? null;
      if (owner === null) {
        this.sliceOwners.set(slice, null);
        continue;
      }
      if (typeof owner !== 'string' && !owner.current) owner = owner.owner.id;
      if (typeof owner === 'string') {
        const live = this.live.get(owner);
        if (!live) {
          this.sliceOwners.set(slice, owner);
          orphans.set(owner, withSlice(orphans.get(owner), slice));
          continue;
        }
        owner = live;
      }
      this.sliceOwners.set(slice, owner);
      owner.next = owner.nextStamp === stamp ? withSlice(owner.next, slice) : slice;
      owner.nextStamp = stamp;
    }

    const changed: Live[] = [];
    const dropped: ServiceResult[] = [];
    const droppedFinals: ServedPort[] = [];
    const drop = (live: Live) => {
      if (!live.result) return;
      dropped.push(live.result);
      for (const f of live.finals) droppedFinals.push(f);
      live.result = undefined;
      live.finals = [];
    };
    let seen = 0;
    const services = input.services;
    for (let i = 0; i < services.length; i++) {
      const svc = services[i]!;
      if (!svc || typeof svc !== 'object') continue;
      let live = this.byObject.get(svc);
      if (!live || !live.current || live.svc !== svc) {
        if (!pierService(svc, this.ctx!.config)) continue;
        const owner = serviceOwner(svc);
        live = this.live.get(owner.id);
        if (!live) {
          live = { svc, owner, slices: undefined, result: undefined, finals: [], stamp: 0, current: true, next: orphans.get(owner.id), nextStamp: stamp };
          this.live.set(owner.id, live);
        } else if (live.stamp !== stamp) {
          // A new object for a Service already in the model.
          drop(live);
          live.svc = svc;
          live.owner = owner;
        }
        this.byObject.set(svc, live);
      }
      // Informers never hold two objects with one name, and pier plan's
      // reader keeps the later (manifests.ts): which one would win is not
      // this engine's to guess.
      if (live.stamp === stamp) throw new Unexpected(`two Services named ${live.owner.id}`);
      live.stamp = stamp;
      seen++;
      const slices = live.nextStamp === stamp ? live.next : undefined;
      if (!live.result || !sameSlices(live.slices, slices)) {
        drop(live);
        live.result = serviceResult(svc, live.owner, slices === undefined ? NO_SLICES : Array.isArray(slices) ? slices : [slices], this.ctx!);
        live.slices = slices;
        changed.push(live);
      }
    }
    if (seen < this.live.size) {
      for (const [id, live] of this.live) {
        if (live.stamp === stamp) continue;
        drop(live);
        live.current = false;
        this.live.delete(id);
      }
    }
    if (this.last && changed.length === 0 && dropped.length === 0) return this.last;
    // Past a point, settling each change on its own costs more than settling everything.
    const bulk = !this.last || changed.length + dropped.length > this.live.size / 4;
    return (this.last = bulk ? this.rebuild() : this.apply(changed, dropped, droppedFinals));
  }

  /** Everything across Services, from the live results: buildModel's second step. */
  private rebuild(): Model {
    // forEach and indexed loops rather than for...of: no iterator step
    // objects on a cold sync (see model.ts).
    const claims = new Map<number, Claim[]>();
    const withProblems = new Set<ServiceResult>();
    this.live.forEach((live) => {
      const r = live.result!;
      if (r.problems.length > 0) withProblems.add(r);
      for (let i = 0; i < r.claims.length; i++) {
        const c = r.claims[i]!;
        const list = claims.get(c.key);
        if (list) list.push(c);
        else claims.set(c.key, [c]);
      }
    });
    this.withProblems = withProblems;
    const conflicts = new Map<number, Problem[]>();
    claims.forEach((list, key) => {
      if (list.length < 2) return;
      rankClaims(list);
      const lost = conflictProblems(list);
      if (lost.length > 0) conflicts.set(key, lost);
    });
    this.claims = claims;
    this.conflicts = conflicts;
    const sorted: Record<Family, ServedPort[]> = { ipv4: [], ipv6: [] };
    this.live.forEach((live) => {
      const finals = (live.finals = this.finalsOf(live.result!, live.finals));
      for (let i = 0; i < finals.length; i++) {
        const f = finals[i]!;
        if (f.frontends.length > 0) sorted[servedFamily(f)].push(f);
      }
    });
    for (const family of FAMILY_LIST) {
      const list = sorted[family].sort(compareServedPorts);
      // Keys are unique while names hold no '/' (the API server's rule, and manifests.ts's).
      for (let i = 1; i < list.length; i++) if (list[i - 1]!.key === list[i]!.key) throw new Unexpected(`two served ports with key ${list[i]!.key}`);
    }
    this.sorted = sorted;
    return this.model('all', true);
  }

  /** Only what the changed Services reach: their claims' frontends, and the served ports whose frontends moved. */
  private apply(changed: Live[], dropped: ServiceResult[], droppedFinals: ServedPort[]): Model {
    /** Frontend keys whose claims changed, with the claim that served them before. */
    const dirty = new Map<number, Claim | undefined>();
    let problemsChanged = false;
    for (const r of dropped) {
      if (this.withProblems.delete(r)) problemsChanged = true;
      for (const c of r.claims) {
        const list = this.claims.get(c.key)!;
        if (!dirty.has(c.key)) dirty.set(c.key, list[0]);
        const at = list.indexOf(c);
        if (at < 0) throw new Unexpected(`claim on ${c.frontend.address} ${c.served.protocol} ${c.frontend.port} is not where it should be`);
        list.splice(at, 1);
      }
    }
    for (const live of changed) {
      const r = live.result!;
      if (r.problems.length > 0) {
        this.withProblems.add(r);
        problemsChanged = true;
      }
      for (const c of r.claims) {
        const list = this.claims.get(c.key);
        if (!dirty.has(c.key)) dirty.set(c.key, list?.[0]);
        if (list) list.push(c);
        else this.claims.set(c.key, [c]);
      }
    }

    const refresh = new Set<Live>(changed);
    for (const [key, before] of dirty) {
      const list = this.claims.get(key)!;
      const hadConflicts = this.conflicts.delete(key);
      if (list.length === 0) {
        // Its claimant left: a dropped result, whose Service is gone or changed.
        this.claims.delete(key);
        problemsChanged ||= hadConflicts;
        continue;
      }
      rankClaims(list);
      const winner = list[0]!;
      if (winner !== before) {
        refresh.add(this.live.get(winner.owner.id)!);
        if (before && list.includes(before)) refresh.add(this.live.get(before.owner.id)!);
      }
      const lost = conflictProblems(list);
      if (lost.length > 0) this.conflicts.set(key, lost);
      problemsChanged ||= hadConflicts || lost.length > 0;
    }

    const removed = new Set<ServedPort>();
    const added: ServedPort[] = [];
    for (const f of droppedFinals) if (f.frontends.length > 0) removed.add(f);
    for (const live of refresh) {
      const before = live.finals;
      const finals = this.finalsOf(live.result!, before);
      for (let i = 0; i < finals.length; i++) {
        const f = finals[i]!;
        const b = before[i];
        if (f === b) continue;
        if (b && b.frontends.length > 0) removed.add(b);
        if (f.frontends.length > 0) added.push(f);
      }
      live.finals = finals;
    }
    const families = new Set<Family>();
    for (const f of removed) families.add(servedFamily(f));
    for (const f of added) families.add(servedFamily(f));
    const changes: Partial<Record<Family, PortChanges>> = {};
    for (const family of families) {
      const since = this.sorted[family];
      const c: PortChanges = { since, removed: [], added: added.filter((f) => servedFamily(f) === family) };
      this.sorted[family] = mergeServed(since, removed, c);
      changes[family] = c;
    }
    return this.model(changes, problemsChanged);
  }

  /**
   * A result's served ports without the frontends other Services won: the served ports
   * themselves when they lost none (the common case), else copies, the
   * previous copy when nothing moved since.
   */
  private finalsOf(r: ServiceResult, before: readonly ServedPort[]): readonly ServedPort[] {
    let finals: ServedPort[] | undefined;
    // serviceResult lists claims port by port, each served port's in its frontends' order.
    let ci = 0;
    for (let pi = 0; pi < r.servedPorts.length; pi++) {
      const served = r.servedPorts[pi]!;
      let won: Frontend[] | undefined;
      for (let k = 0; ci < r.claims.length && r.claims[ci]!.served === served; ci++, k++) {
        const c = r.claims[ci]!;
        const wins = this.claims.get(c.key)![0] === c;
        if (!wins && !won) won = served.frontends.slice(0, k);
        else if (wins && won) won.push(c.frontend);
      }
      let final = served;
      if (won) {
        const prev = before[pi];
        final = prev && prev !== served && sameFrontends(prev.frontends, won) ? prev : { ...served, frontends: won };
      }
      if (final !== served && !finals) finals = r.servedPorts.slice(0, pi);
      finals?.push(final);
    }
    if (ci !== r.claims.length) throw new Unexpected('claims out of order');
    return finals ?? r.servedPorts;
  }

  /** `changes`: how each family's served ports changed (the others keep the last model's), or 'all' after a rebuild, which keeps no record. */
  private model(changes: Partial<Record<Family, PortChanges>> | 'all', problemsChanged: boolean): Model {
    const last = this.last;
    let problems = last?.problems ?? [];
    if (problemsChanged || !last) {
      const all: Problem[] = [];
      for (const r of this.withProblems) for (const p of r.problems) all.push(p);
      for (const list of this.conflicts.values()) for (const p of list) all.push(p);
      problems = dedupeProblems(all);
    }
    const family = (f: Family): FamilyModel => {
      if (changes === 'all') return { family: f, ports: this.sorted[f] };
      const c = changes[f];
      if (!c) return last![f];
      return recordPortChanges({ family: f, ports: this.sorted[f] }, c);
    };
    return { ipv4: family('ipv4'), ipv6: family('ipv6'), problems };
  }
}

/** A set with one slice more; arrays made this sync only, so never one a Live still compares against. */
function withSlice(set: SliceSet, slice: V1EndpointSlice): SliceSet {
  if (set === undefined) return slice;
  if (Array.isArray(set)) {
    set.push(slice);
    return set;
  }
  return [set, slice];
}

function sameSlices(a: SliceSet, b: SliceSet): boolean {
  if (a === b) return true;
  if (!Array.isArray(a) || !Array.isArray(b)) return false;
  return sameObjects(a, b);
}

function sameObjects<T>(a: readonly T[], b: readonly T[]): boolean {
  if (a === b) return true;
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function sameFrontends(a: readonly Frontend[], b: readonly Frontend[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i]!.address !== b[i]!.address || a[i]!.port !== b[i]!.port) return false;
  return true;
}

/** `list` without `drop`, with `changes.added`: a new array, sorted by key. Records in `changes` what it took out, and sorts what it put in. */
function mergeServed(list: readonly ServedPort[], drop: ReadonlySet<ServedPort>, changes: PortChanges): ServedPort[] {
  const add = changes.added.sort(compareServedPorts);
  // Written over a copy, then cut: pushing onto an empty array grew it to
  // three times its size in steps (217 KB a change at 10,000 ports, against
  // 80; bench:agent, "nftables ... one Service changed").
  const out = list.slice();
  let k = 0;
  let i = 0;
  let j = 0;
  while (i < list.length || j < add.length) {
    const a = list[i];
    if (a && drop.has(a)) {
      changes.removed.push(a);
      i++;
      continue;
    }
    const b = add[j];
    // Unique keys, as in rebuild().
    if (a && b && a.key === b.key) throw new Unexpected(`two served ports with key ${b.key}`);
    if (b && j > 0 && add[j - 1]!.key === b.key) throw new Unexpected(`two served ports with key ${b.key}`);
    if (a && (!b || a.key < b.key)) {
      out[k++] = a;
      i++;
    } else {
      out[k++] = b!;
      j++;
    }
  }
  out.length = k;
  return out;
}


// ---------------------------------------------------------------------------
// The rules

interface Group {
  address: string;
  protocol: Protocol;
  /** Sorted by port, one per port. Replaced, never changed in place. */
  entries: PortEntry[];
  tree: GroupTree | undefined;
}

/** What a renderer takes of a served port: its own chains, and its entries in each tree it appears in. */
interface RenderedPort {
  own: ServedRules['own'];
  entries: Partial<Record<TreeName, readonly PortEntry[]>>;
}

function renderPort(served: ServedPort, family: Family, marks: MarkBits): RenderedPort {
  const r = servedRules(served, family, marks);
  const entries: RenderedPort['entries'] = {};
  for (let t = 0; t < TREES.length; t++) {
    const tree = TREES[t]!;
    const rules = r.trees[tree];
    if (rules) entries[tree] = servedEntries(served, tree, rules);
  }
  return { own: r.own, entries };
}

interface GroupEdit {
  /** Ports whose entry goes. */
  drop: Set<number>;
  add: PortEntry[];
}

class IncrementalRenderer {
  private readonly family: Family;
  private readonly config: RenderConfig;
  private model: FamilyModel | undefined;
  private ruleset: Ruleset | undefined;
  private groups = perTree(() => new Map<string, Group>());
  /** Each tree's root chain as last assembled. */
  private roots = perTree((): string[] => []);
  private own: Record<TableName, Map<string, string[]>> = { nat: new Map(), filter: new Map() };
  /** Served ports rendered ahead of the first update (SyncPipeline.warm); none after it. */
  private prepared: WeakMap<ServedPort, RenderedPort> | undefined = new WeakMap();

  constructor(family: Family, config: RenderConfig) {
    this.family = family;
    this.config = config;
  }

  reset(): void {
    this.model = undefined;
    this.ruleset = undefined;
    this.groups = perTree(() => new Map<string, Group>());
    this.roots = perTree((): string[] => []);
    this.own = { nat: new Map(), filter: new Map() };
    this.prepared = undefined;
  }

  /** A served port the first update will add, rendered ahead. */
  prepare(served: ServedPort): void {
    this.prepared?.set(served, renderPort(served, this.family, this.config.marks));
  }

  update(model: FamilyModel): Ruleset {
    if (model.family !== this.family) throw new Error(`a ${model.family} model for the ${this.family} renderer`);
    if (model === this.model && this.ruleset) return this.ruleset;
    const { marks } = this.config;
    const fixed = fixedRules(marks);
    const before = this.model?.ports ?? [];
    const after = model.ports;
    // Both sorted by key (buildModel's order); anything else is not a model
    // this bookkeeping can follow.
    const diff = portChanges(before, model);
    if (!diff) throw new Unexpected('served ports not sorted by key');
    const { removed, added } = diff;

    const edits = perTree(() => new Map<Group, GroupEdit>());
    this.lastEdit = {};
    const retired: Record<TableName, Map<string, string[]>> = { nat: new Map(), filter: new Map() };
    for (const served of removed) {
      // Rendered again to learn where it was: cheaper than keeping every
      // served port's rules for the few that go.
      const r = servedRules(served, this.family, marks);
      for (const c of r.own) {
        retired[c.table].set(c.name, this.own[c.table].get(c.name)!);
        this.own[c.table].delete(c.name);
      }
      for (const tree of TREES) {
        if (!r.trees[tree]) continue;
        for (const f of served.frontends) this.edit(edits[tree], tree, f.address, served.protocol).drop.add(f.port);
      }
    }
    // Indexed loops: on a cold sync this runs for every served port (see model.ts).
    const prepared = this.prepared;
    this.prepared = undefined;
    for (let p = 0; p < added.length; p++) {
      const served = added[p]!;
      const r = prepared?.get(served) ?? renderPort(served, this.family, marks);
      for (let k = 0; k < r.own.length; k++) {
        const c = r.own[k]!;
        if (this.own[c.table].has(c.name)) throw new Unexpected(`chain ${c.name} twice`);
        // The same rules under the same name (the served port changed elsewhere)
        // keep the array the applier last wrote.
        const old = retired[c.table].get(c.name);
        this.own[c.table].set(c.name, old && sameStrings(old, c.rules) ? old : c.rules);
      }
      for (let t = 0; t < TREES.length; t++) {
        const tree = TREES[t]!;
        const entries = r.entries[tree];
        if (!entries) continue;
        for (let k = 0; k < entries.length; k++) this.edit(edits[tree], tree, served.frontends[k]!.address, served.protocol).add.push(entries[k]!);
      }
    }

    const first = this.model === undefined;
    for (const tree of TREES) {
      if (edits[tree].size === 0 && !first) continue;
      const groups = this.groups[tree];
      for (const [g, edit] of edits[tree]) {
        const { entries, changedPorts } = mergeEntries(g.entries, edit, g.tree !== undefined);
        g.entries = entries;
        if (entries.length === 0) {
          groups.delete(`${g.address}|${g.protocol}`);
          continue;
        }
        g.tree = buildGroupTree(tree, this.family, marks, g.address, g.protocol, entries, g.tree && { tree: g.tree, changedPorts });
      }
      const root: string[] = [...fixed.heads[tree]];
      for (const g of [...groups.values()].sort(compareGroups)) for (const rule of g.tree!.root) root.push(rule);
      if (first || !sameStrings(this.roots[tree], root)) this.roots[tree] = root;
    }

    const chains: Record<TableName, [string, string[]][]> = { nat: [...this.own.nat], filter: [...this.own.filter] };
    for (const tree of TREES) {
      const list = chains[treeTable(tree)];
      for (const g of this.groups[tree].values()) for (const [name, c] of g.tree!.chains) list.push([name, c.rules]);
    }
    this.model = model;
    return (this.ruleset = assembleRuleset({
      family: this.family,
      fixed,
      services: this.roots.nat,
      forward: this.roots.forward,
      noEndpoints: this.roots.noEndpoints,
      sources: this.roots.sources,
      chains,
    }));
  }

  /** Per tree, the group edit of the previous edit() call in this update: consecutive served ports mostly share a group. */
  private lastEdit: Partial<Record<TreeName, { address: string; protocol: Protocol; edit: GroupEdit }>> = {};

  /** The pending edit of the group of (address, protocol) in a tree. */
  private edit(edits: Map<Group, GroupEdit>, tree: TreeName, address: string, protocol: Protocol): GroupEdit {
    const last = this.lastEdit[tree];
    if (last && last.address === address && last.protocol === protocol) return last.edit;
    const key = `${address}|${protocol}`;
    let g = this.groups[tree].get(key);
    if (!g) this.groups[tree].set(key, (g = { address, protocol, entries: [], tree: undefined }));
    let edit = edits.get(g);
    if (!edit) edits.set(g, (edit = { drop: new Set(), add: [] }));
    this.lastEdit[tree] = { address, protocol, edit };
    return edit;
  }
}

/**
 * A group's entries without the dropped ports, with the added entries: a new
 * array, sorted by port, and (when `track`, for a tree to reuse) the ports
 * that changed.
 */
function mergeEntries(list: readonly PortEntry[], edit: GroupEdit, track: boolean): { entries: PortEntry[]; changedPorts: number[] } {
  const add = edit.add.sort((a, b) => a.port - b.port);
  const entries: PortEntry[] = [];
  const changed: number[] = track ? [...edit.drop] : [];
  let dropped = 0;
  let i = 0;
  let j = 0;
  while (i < list.length || j < add.length) {
    const a = list[i];
    if (a && edit.drop.has(a.port)) {
      dropped++;
      i++;
      continue;
    }
    const b = add[j];
    // The model gives each frontend to one served port.
    if (b && ((a && a.port === b.port) || (j > 0 && add[j - 1]!.port === b.port))) throw new Unexpected(`two served ports on port ${b.port}`);
    if (a && (!b || a.port < b.port)) {
      entries.push(a);
      i++;
    } else {
      entries.push(b!);
      if (track) changed.push(b!.port);
      j++;
    }
  }
  if (dropped !== edit.drop.size) throw new Unexpected('a dropped port was not there');
  return { entries, changedPorts: track ? [...new Set(changed)].sort((x, y) => x - y) : changed };
}
