// The agent's sync, incremental: the tests' oracles (test/support/oracle.ts)
// give the same result from scratch, but at 10,000 Service ports a sync from scratch costs
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
// with two endpoints, besides the rule texts the applied ruleset holds
// anyway (~0.55 KB).
//
// This is the only engine outside the tests; the from-scratch model and
// ruleset are the property tests' oracle. What the bookkeeping does not expect (two
// Services with one name, two served ports with one key: informers hold each
// object once, names hold no '/', and pier plan's reader, manifests.ts, keeps
// it so) throws Unexpected; the caches start over and the sync is redone from
// an empty state, a cold sync. Should that fail too, the error goes to the
// caller, which keeps the rules in place.
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import type { Family } from '../../lib/contract.ts';
import {
  compareServedPorts,
  conflictProblems,
  portChanges,
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

export interface EngineConfig {
  nodeName: string;
  model: ModelConfig;
}

export interface EngineInput {
  /** This node's addresses, both families. */
  nodeAddresses: readonly string[];
  /** As the informer lists them; unchanged objects must be the same objects. */
  services: readonly V1Service[];
  slices: readonly V1EndpointSlice[];
}

/**
 * Per family, how its served ports changed to make this model from the
 * previous one (`since`); a family absent kept the previous family model
 * itself. 'all' after a rebuild from an empty state, which keeps no record:
 * a renderer then compares the lists (diffServedPorts).
 */
export type ModelChanges = Partial<Record<Family, PortChanges>> | 'all';

/** One update of the engine: the model, and what changed since the last. */
export interface EngineResult {
  model: Model;
  changes: ModelChanges;
}

/** Thrown inside, caught at the top: the input is outside what the incremental path handles. */
export class Unexpected extends Error {}

/** Holds the model of one agent's syncs between them. */
export class Engine {
  private readonly config: EngineConfig;
  private readonly incrementalModel = new IncrementalModel();
  /** Syncs redone from an empty state because the bookkeeping lost track: 0 unless pier has a bug. */
  restarts = 0;

  constructor(config: EngineConfig) {
    this.config = config;
  }

  /** The model for this input (the previous Model itself when nothing changed), and what changed to make it. */
  update(input: EngineInput): EngineResult {
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

  /** update()'s model alone. */
  model(input: EngineInput): Model {
    return this.update(input).model;
  }

  /**
   * Before the first sync, while the informers list: one listed Service's
   * share of the model, computed ahead so that the first sync, handed the
   * same objects, finds it done. A guess that turns out wrong (the Node's
   * addresses change, another slice arrives, the object is replaced) costs
   * only the work: the sync checks every object by identity, as it does
   * between syncs. After the first sync it does nothing. Returns the
   * Service's served ports, for the backends to render ahead.
   */
  warm(nodeAddresses: readonly string[], svc: V1Service, slices: readonly V1EndpointSlice[]): readonly ServedPort[] {
    const ctxInput = { nodeName: this.config.nodeName, nodeAddresses: [...nodeAddresses], config: this.config.model };
    try {
      return this.incrementalModel.warm(ctxInput, svc, slices)?.servedPorts ?? [];
    } catch (err) {
      // Nothing is lost: the first sync computes what is missing.
      this.incrementalModel.reset();
      if (!(err instanceof Unexpected)) throw err;
      return [];
    }
  }
}

/**
 * A sync redone on caches just reset: the incremental path from an empty
 * state, which is a cold sync. An Unexpected there comes from the input, not
 * from what was kept, so it goes up, with the caches reset again.
 */
export function again<T>(run: () => T, reset: () => void): T {
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
/** A sync that changed nothing. */
const NO_CHANGES: ModelChanges = Object.freeze({});
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

  /**
   * Hands each slice to its Service's Live (its `next`, stamped `stamp`): in
   * a steady state a lookup by identity, no map built per sync. Returns the
   * slices of Services not live yet, by Service id.
   */
  private assignSlices(slices: EngineInput['slices'], stamp: number): Map<string, SliceSet> {
    const orphans = new Map<string, SliceSet>();
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
    return orphans;
  }

  update(ctxInput: ContextInput, input: EngineInput): EngineResult {
    this.context(ctxInput);
    const stamp = ++this.stamp;
    const orphans = this.assignSlices(input.slices, stamp);

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
    if (this.last && changed.length === 0 && dropped.length === 0) return { model: this.last, changes: NO_CHANGES };
    // Past a point, settling each change on its own costs more than settling everything.
    const bulk = !this.last || changed.length + dropped.length > this.live.size / 4;
    const result = bulk ? this.rebuild() : this.apply(changed, dropped, droppedFinals);
    this.last = result.model;
    return result;
  }

  /** Everything across Services, from the live results: the conflicting claims on each frontend. */
  private rebuild(): EngineResult {
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
  private apply(changed: Live[], dropped: ServiceResult[], droppedFinals: ServedPort[]): EngineResult {
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

  /** `changes`: how each family's served ports changed (the others keep the last model's), or 'all' after a rebuild. */
  private model(changes: ModelChanges, problemsChanged: boolean): EngineResult {
    const last = this.last;
    let problems = last?.problems ?? [];
    if (problemsChanged || !last) {
      const all: Problem[] = [];
      for (const r of this.withProblems) for (const p of r.problems) all.push(p);
      for (const list of this.conflicts.values()) for (const p of list) all.push(p);
      problems = dedupeProblems(all);
    }
    const family = (f: Family): FamilyModel => (changes === 'all' || changes[f] ? { family: f, ports: this.sorted[f] } : last![f]);
    return { model: { ipv4: family('ipv4'), ipv6: family('ipv6'), problems }, changes };
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
  // Written over a copy, then cut: an array grown by pushes ends up to
  // three times the size it needs (at 10,000 ports, 217 KB a change instead of 80).
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

/** One family's record in `changes`, if the engine kept one. */
export function familyChanges(changes: ModelChanges, family: Family): PortChanges | undefined {
  return changes === 'all' ? undefined : changes[family];
}
