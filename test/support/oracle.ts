// The from-scratch oracles of the property tests: the agent's model, the
// iptables ruleset and the nftables table computed in one pass each, with
// nothing kept between calls. Production code uses the incremental Engine
// and renderers (agent/engine/engine.ts, agent/iptables/renderer.ts,
// agent/nftables/render.ts), built from the same per-Service and per-port
// pieces; the tests check that both give the same result.
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import type { Family } from '../../lib/contract.ts';
import { safely } from '../../lib/objects.ts';
import {
  compareServedPorts,
  compareText,
  conflictProblems,
  dedupeProblems,
  modelContext,
  pierService,
  rankClaims,
  servedFamily,
  serviceOwner,
  serviceResult,
  sliceServiceId,
  type Claim,
  type FamilyModel,
  type Frontend,
  type Model,
  type ModelInput,
  type Problem,
  type Protocol,
  type ServedPort,
} from '../../agent/engine/model.ts';
import {
  assembleRuleset,
  buildGroupTree,
  compareGroups,
  fixedRules,
  perTree,
  servedEntries,
  servedRules,
  treeTable,
  TREES,
  type PortEntry,
  type RenderConfig,
  type Ruleset,
  type TableName,
} from '../../agent/iptables/render.ts';
import { NftRenderer, type NftRuleset } from '../../agent/nftables/render.ts';

/** The model from scratch: each Service's share (serviceResult), then what spans Services (conflicting claims on a frontend). */
export function buildModel(input: ModelInput): Model {
  const ctx = modelContext(input);
  const slicesByService = new Map<string, V1EndpointSlice[]>();
  for (const slice of input.slices ?? []) {
    const id = sliceServiceId(slice);
    if (id === undefined) continue;
    let list = slicesByService.get(id);
    if (!list) slicesByService.set(id, (list = []));
    list.push(slice);
  }

  // Sorted so that nothing depends on the order objects arrive in, not even
  // which of two objects with one name wins.
  const services = sortServices((input.services ?? []).filter((s) => s && pierService(s, input.config)));
  const servedPorts: ServedPort[] = [];
  const byFrontend = new Map<number, Claim[]>();
  const problems: Problem[] = [];
  for (const svc of services) {
    const owner = serviceOwner(svc);
    const r = serviceResult(svc, owner, slicesByService.get(owner.id) ?? [], ctx);
    for (const p of r.servedPorts) servedPorts.push(p);
    for (const c of r.claims) {
      const list = byFrontend.get(c.key);
      if (list) list.push(c);
      else byFrontend.set(c.key, [c]);
    }
    for (const p of r.problems) problems.push(p);
  }

  // The served ports are this call's own: those that lose frontends lose them in place.
  const lost = new Map<ServedPort, Set<Frontend>>();
  for (const list of byFrontend.values()) {
    if (list.length < 2) continue;
    rankClaims(list);
    for (let i = 1; i < list.length; i++) {
      const c = list[i]!;
      let set = lost.get(c.served);
      if (!set) lost.set(c.served, (set = new Set()));
      set.add(c.frontend);
    }
    for (const p of conflictProblems(list)) problems.push(p);
  }
  for (const [served, set] of lost) served.frontends = served.frontends.filter((f) => !set.has(f));

  const byFamily: Record<Family, ServedPort[]> = { ipv4: [], ipv6: [] };
  const seen = new Set<string>();
  for (const served of servedPorts.sort(compareServedPorts)) {
    if (served.frontends.length === 0 || seen.has(served.key)) continue;
    seen.add(served.key);
    byFamily[servedFamily(served)].push(served);
  }

  return {
    ipv4: { family: 'ipv4', ports: byFamily.ipv4 },
    ipv6: { family: 'ipv6', ports: byFamily.ipv6 },
    problems: dedupeProblems(problems),
  };
}

/**
 * Services in a total order independent of arrival. Serialising every Service
 * to break ties would dominate a large model; only equal heads (the same
 * object twice, in practice never) pay for it.
 */
function sortServices(services: V1Service[]): V1Service[] {
  const decorated = services.map((svc) => ({ svc, head: serviceSortHead(svc), json: undefined as string | undefined }));
  const json = (d: (typeof decorated)[number]) => (d.json ??= safely(() => JSON.stringify(d.svc), ''));
  decorated.sort((a, b) => compareText(a.head, b.head) || compareText(json(a), json(b)));
  return decorated.map((d) => d.svc);
}

function serviceSortHead(svc: V1Service): string {
  return safely(() => {
    const m = svc.metadata;
    return `${m?.namespace ?? ''}\0${m?.name ?? ''}\0${m?.uid ?? ''}\0${m?.resourceVersion ?? ''}`;
  }, '');
}

/** The iptables ruleset from scratch. */
export function renderRuleset(model: FamilyModel, config: RenderConfig): Ruleset {
  const fixed = fixedRules(config.marks);
  const family = model.family;
  const groups = perTree(() => new Map<string, { address: string; protocol: Protocol; entries: PortEntry[] }>());
  const chains: Record<TableName, [string, string[]][]> = { nat: [], filter: [] };
  const servedPorts = [...model.ports].sort((a, b) => compareText(a.key, b.key));
  for (const served of servedPorts) {
    const r = servedRules(served, family, config.marks);
    for (const c of r.own) chains[c.table].push([c.name, c.rules]);
    for (const tree of TREES) {
      const rules = r.trees[tree];
      if (!rules) continue;
      const entries = servedEntries(served, tree, rules);
      for (let i = 0; i < entries.length; i++) {
        const f = served.frontends[i]!;
        const k = `${f.address}|${served.protocol}`;
        let g = groups[tree].get(k);
        if (!g) groups[tree].set(k, (g = { address: f.address, protocol: served.protocol, entries: [] }));
        g.entries.push(entries[i]!);
      }
    }
  }
  const roots = perTree((tree) => [...fixed.heads[tree]]);
  for (const tree of TREES) {
    for (const g of [...groups[tree].values()].sort(compareGroups)) {
      // Stable: two served ports on one port (only hand-made models have them) keep their key order.
      g.entries.sort((a, b) => a.port - b.port);
      const t = buildGroupTree(tree, family, config.marks, g.address, g.protocol, g.entries);
      for (const r of t.root) roots[tree].push(r);
      for (const [name, c] of t.chains) chains[treeTable(tree)].push([name, c.rules]);
    }
  }
  return assembleRuleset({ family, fixed, services: roots.nat, forward: roots.forward, noEndpoints: roots.noEndpoints, sources: roots.sources, chains });
}

/** The whole nftables table for a model, from scratch: the production renderer's first sync. */
export function renderNft(model: FamilyModel, masqueradeBit: number): NftRuleset {
  return new NftRenderer(model.family, masqueradeBit).update(model).state;
}
