// The iptables backend's incremental renderer: one family's model to its
// Ruleset, keeping each port's rule texts and each group's tree between
// syncs and rebuilding only the chains a change reaches. The tests' oracle
// (test/support/oracle.ts) runs the same pieces once, from scratch.
// Unchanged parts keep their identity all the way to the ruleset, so the
// applier's diff skips an unchanged chain with one comparison, and an
// unchanged model returns the previous ruleset itself.
import type { Family } from '../../lib/contract.ts';
import { again, Unexpected } from '../engine/engine.ts';
import { portChanges, type FamilyModel, type PortChanges, type Protocol, type ServedPort } from '../engine/model.ts';
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
  type FixedRules,
  type GroupTree,
  type MarkBits,
  type ServedRules,
  type PortEntry,
  type RenderConfig,
  type Ruleset,
  type TableName,
  type TreeName,
} from './render.ts';

/** One family's renderer, kept between syncs. */
export class IptablesRenderer {
  private readonly inner: IncrementalRenderer;
  /** Renders redone from an empty state because the bookkeeping lost track: 0 unless pier has a bug. */
  restarts = 0;

  constructor(family: Family, config: RenderConfig) {
    this.inner = new IncrementalRenderer(family, config);
  }

  /** A served port the first render will add, rendered ahead (the head start). */
  prepare(served: ServedPort): void {
    this.inner.prepare(served);
  }

  /** The ruleset for one family's model (the oracle's renderRuleset gives the same); the previous Ruleset itself when the family model is the previous one. `changes`: the engine's record of how the model came to be. */
  render(model: FamilyModel, changes?: PortChanges): Ruleset {
    const r = this.inner;
    try {
      return r.update(model, changes);
    } catch (err) {
      r.reset();
      if (!(err instanceof Unexpected)) throw err;
      this.restarts++;
      return again(() => r.update(model), () => r.reset());
    }
  }
}

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
  /** Served ports rendered ahead of the first update (the head start); none after it. */
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

  update(model: FamilyModel, changes?: PortChanges): Ruleset {
    if (model.family !== this.family) throw new Error(`a ${model.family} model for the ${this.family} renderer`);
    if (model === this.model && this.ruleset) return this.ruleset;
    const fixed = fixedRules(this.config.marks);
    // Both sorted by key (the model's order); anything else is not a model
    // this bookkeeping can follow.
    const diff = portChanges(this.model?.ports ?? [], model, changes);
    if (!diff) throw new Unexpected('served ports not sorted by key');

    const edits = perTree(() => new Map<Group, GroupEdit>());
    this.lastEdit = {};
    const retired = this.retire(diff.removed, edits);
    this.admit(diff.added, edits, retired);
    this.rebuildTrees(edits, fixed, this.model === undefined);

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

  /** Takes the removed served ports out: their own chains (returned by table, for admit() to reuse) and their tree entries (into `edits`). */
  private retire(removed: readonly ServedPort[], edits: Record<TreeName, Map<Group, GroupEdit>>): Record<TableName, Map<string, string[]>> {
    const retired: Record<TableName, Map<string, string[]>> = { nat: new Map(), filter: new Map() };
    for (const served of removed) {
      // Rendered again to learn where it was: cheaper than keeping every
      // served port's rules for the few that go.
      const r = servedRules(served, this.family, this.config.marks);
      for (const c of r.own) {
        retired[c.table].set(c.name, this.own[c.table].get(c.name)!);
        this.own[c.table].delete(c.name);
      }
      for (const tree of TREES) {
        if (!r.trees[tree]) continue;
        for (const f of served.frontends) this.edit(edits[tree], tree, f.address, served.protocol).drop.add(f.port);
      }
    }
    return retired;
  }

  /** Puts the added served ports in: their own chains, and their tree entries (into `edits`). */
  private admit(added: readonly ServedPort[], edits: Record<TreeName, Map<Group, GroupEdit>>, retired: Record<TableName, Map<string, string[]>>): void {
    // Indexed loops: on a cold sync this runs for every served port (see model.ts).
    const prepared = this.prepared;
    this.prepared = undefined;
    for (let p = 0; p < added.length; p++) {
      const served = added[p]!;
      const r = prepared?.get(served) ?? renderPort(served, this.family, this.config.marks);
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
  }

  /** Rebuilds the trees of the groups `edits` reaches, and each tree's root chain (all of them on the first update). */
  private rebuildTrees(edits: Record<TreeName, Map<Group, GroupEdit>>, fixed: FixedRules, first: boolean): void {
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
        g.tree = buildGroupTree(tree, this.family, this.config.marks, g.address, g.protocol, entries, g.tree && { tree: g.tree, changedPorts });
      }
      const root: string[] = [...fixed.heads[tree]];
      for (const g of [...groups.values()].sort(compareGroups)) for (const rule of g.tree!.root) root.push(rule);
      if (first || !sameStrings(this.roots[tree], root)) this.roots[tree] = root;
    }
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
