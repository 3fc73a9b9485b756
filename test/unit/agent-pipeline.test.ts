// The incremental pipeline against the pure functions it stands in for: after
// any sequence of the changes informers deliver (objects added, replaced,
// deleted, or left alone), its model and rulesets equal buildModel's and
// renderRuleset's from scratch, what it handed out before is never changed
// behind the applier's back, and the delta against the previous ruleset
// reaches the next one. buildModel and renderRuleset are only the oracle here:
// the pipeline never falls back to them, and on these inputs never even
// starts over (restarts), so the equality is its own incremental work.
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { diffServedPorts, portChanges, type Model } from '../../agent/engine/model.ts';
import { SyncPipeline } from '../support/pipeline.ts';
import { TABLES, type Ruleset } from '../../agent/iptables/render.ts';
import { restoreText } from '../../agent/iptables/restore.ts';
import { CONFIG, MARKS, NODE, NODE_V4, NODE_V6, OTHER_NODE, corrupt, corruptionArb, toInput, worldArb } from './agent-fixtures.ts';
import { buildModel, renderRuleset } from '../support/oracle.ts';

const FAMILIES = ['ipv4', 'ipv6'] as const;

type Op =
  | { kind: 'replaceService'; target: number; source: number }
  | { kind: 'addService'; source: number }
  | { kind: 'deleteService'; target: number }
  | { kind: 'recreateService'; target: number }
  | { kind: 'touchService'; target: number }
  | { kind: 'cloneService'; target: number; older: boolean }
  | { kind: 'replaceSlice'; target: number; source: number }
  | { kind: 'addSlice'; owner: number; source: number }
  | { kind: 'deleteSlice'; target: number }
  | { kind: 'nodeAddresses'; pick: boolean[] }
  | { kind: 'noop' };

const index = fc.nat({ max: 1000 });
const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 4, arbitrary: fc.record({ kind: fc.constant('replaceService' as const), target: index, source: index }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('addService' as const), source: index }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('deleteService' as const), target: index }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('recreateService' as const), target: index }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('touchService' as const), target: index }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('cloneService' as const), target: index, older: fc.boolean() }) },
  { weight: 4, arbitrary: fc.record({ kind: fc.constant('replaceSlice' as const), target: index, source: index }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('addSlice' as const), owner: index, source: index }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('deleteSlice' as const), target: index }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('nodeAddresses' as const), pick: fc.array(fc.boolean(), { minLength: 6, maxLength: 6 }) }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('noop' as const) }) },
);

/** Objects to draw replacements from: another world, sometimes with one broken Service. */
const poolArb = fc.tuple(worldArb, fc.option(corruptionArb, { freq: 2 })).map(([world, c]) => {
  const input = toInput(world);
  if (c) corrupt(world, input, c);
  return input;
});

const ALL_NODE_ADDRESSES = [...NODE_V4, ...NODE_V6, ...OTHER_NODE];

interface State {
  nodeAddresses: string[];
  services: V1Service[];
  slices: V1EndpointSlice[];
  /** Deleted Services, to come back later under their old name (their slices may still be there). */
  deleted: V1Service[];
  serial: number;
}

/** What an informer would hold after `op`: changed objects are new objects, the rest stay the same objects. */
function step(s: State, op: Op, pool: { services: V1Service[]; slices: V1EndpointSlice[] }): void {
  const pick = <T>(list: T[], i: number) => (list.length === 0 ? undefined : list[i % list.length]);
  const named = (src: V1Service, like: V1Service): V1Service => {
    const copy = structuredClone(src);
    copy.metadata = { ...copy.metadata, namespace: like.metadata?.namespace, name: like.metadata?.name };
    return copy;
  };
  const sliceFor = (src: V1EndpointSlice, owner: V1Service, name: string): V1EndpointSlice => {
    const copy = structuredClone(src);
    copy.metadata = { ...copy.metadata, namespace: owner.metadata?.namespace, name, labels: { ...copy.metadata?.labels, 'kubernetes.io/service-name': owner.metadata!.name! } };
    return copy;
  };
  switch (op.kind) {
    case 'replaceService': {
      const target = pick(s.services, op.target);
      const src = pick(pool.services, op.source);
      if (target && src) s.services[s.services.indexOf(target)] = named(src, target);
      return;
    }
    case 'addService': {
      const src = pick(pool.services, op.source);
      if (src) s.services.push(named(src, { metadata: { namespace: src.metadata?.namespace, name: `added-${s.serial++}` } }));
      return;
    }
    case 'deleteService': {
      const target = pick(s.services, op.target);
      if (!target) return;
      s.services.splice(s.services.indexOf(target), 1);
      s.deleted.push(target);
      return;
    }
    case 'recreateService': {
      const target = pick(s.deleted, op.target);
      const id = (svc: V1Service) => `${svc.metadata?.namespace}/${svc.metadata?.name}`;
      if (target && !s.services.some((svc) => id(svc) === id(target))) s.services.push(structuredClone(target));
      return;
    }
    case 'touchService': {
      // A resync or an update of a field pier ignores: equal content, new object.
      const target = pick(s.services, op.target);
      if (target) s.services[s.services.indexOf(target)] = structuredClone(target);
      return;
    }
    case 'cloneService': {
      // Another Service on the same frontends, older or younger: a conflict,
      // and a change of winner when it is older.
      const target = pick(s.services, op.target);
      if (!target) return;
      const copy = named(target, { metadata: { namespace: target.metadata?.namespace, name: `clone-${s.serial++}` } });
      const created = new Date(target.metadata?.creationTimestamp ?? 0).getTime();
      copy.metadata!.creationTimestamp = new Date(created + (op.older ? -1000 : 1000));
      s.services.push(copy);
      return;
    }
    case 'replaceSlice': {
      const target = pick(s.slices, op.target);
      const src = pick(pool.slices, op.source);
      const owner = target && s.services.find((svc) => svc.metadata?.namespace === target.metadata?.namespace && svc.metadata?.name === target.metadata?.labels?.['kubernetes.io/service-name']);
      if (target && src) s.slices[s.slices.indexOf(target)] = owner ? sliceFor(src, owner, target.metadata!.name!) : structuredClone(src);
      return;
    }
    case 'addSlice': {
      const owner = pick(s.services, op.owner);
      const src = pick(pool.slices, op.source);
      if (owner && src) s.slices.push(sliceFor(src, owner, `slice-${s.serial++}`));
      return;
    }
    case 'deleteSlice': {
      const target = pick(s.slices, op.target);
      if (target) s.slices.splice(s.slices.indexOf(target), 1);
      return;
    }
    case 'nodeAddresses':
      s.nodeAddresses = ALL_NODE_ADDRESSES.filter((_, i) => op.pick[i]);
      return;
    case 'noop':
      return;
  }
}

/** The chains a kernel holds after `payload` (an iptables-restore --noflush delta) on top of `before`. */
function applyDelta(before: Ruleset, payload: string): Record<string, Map<string, string[]>> {
  const tables: Record<string, Map<string, string[]>> = {};
  for (const t of TABLES) tables[t] = new Map([...before.tables[t].chains].map(([c, r]) => [c, [...r]]));
  let table: Map<string, string[]> | undefined;
  for (const line of payload.split('\n')) {
    if (line.startsWith('*')) table = tables[line.slice(1)];
    else if (line.startsWith(':')) table!.set(line.slice(1).split(' ')[0]!, []);
    else if (line.startsWith('-A ')) {
      const rest = line.slice(3);
      const space = rest.indexOf(' ');
      table!.get(rest.slice(0, space))!.push(rest.slice(space + 1));
    } else if (line.startsWith('-X ')) table!.delete(line.slice(3));
  }
  return tables;
}

const snapshot = (r: Ruleset) => structuredClone(r);

describe('SyncPipeline', () => {
  it('after any sequence of adds, updates and deletes, equals buildModel and renderRuleset from scratch', () => {
    const seen = new Map<string, number>();
    fc.assert(
      fc.property(worldArb, poolArb, fc.array(opArb, { minLength: 1, maxLength: 25 }), (world, pool, ops) => {
        const start = toInput(world);
        const s: State = { nodeAddresses: [...NODE_V4, ...NODE_V6], services: [...start.services], slices: [...start.slices], deleted: [], serial: 0 };
        const pipeline = new SyncPipeline({ nodeName: NODE, model: CONFIG, render: { marks: MARKS } });
        let prev: { model: Model; rulesets: Record<string, Ruleset>; copies: Record<string, Ruleset> } | undefined;
        for (const op of [{ kind: 'noop' } as Op, ...ops]) {
          step(s, op, pool);
          seen.set(op.kind, (seen.get(op.kind) ?? 0) + 1);
          const input = { nodeAddresses: [...s.nodeAddresses], services: [...s.services], slices: [...s.slices] };
          const reused = op.kind === 'noop';
          const model = pipeline.model(input);
          const pure = buildModel({ nodeName: NODE, config: CONFIG, ...input });
          if (pure.problems.some((p) => p.reason === 'FrontendConflict')) seen.set('conflict', (seen.get('conflict') ?? 0) + 1);
          expect(model).toStrictEqual(pure);
          const rulesets: Record<string, Ruleset> = {};
          const copies: Record<string, Ruleset> = {};
          for (const f of FAMILIES) {
            const r = pipeline.ruleset(model[f]);
            expect(r).toStrictEqual(renderRuleset(pure[f], { marks: MARKS }));
            if (prev) {
              // The engine's record of a change is what a diff of the two models finds.
              const changes = portChanges(prev.model[f].ports, model[f], pipeline.changes(f))!;
              const found = diffServedPorts(prev.model[f].ports, model[f].ports)!;
              expect({ removed: changes.removed, added: changes.added }).toStrictEqual(found);
              if ('since' in changes) seen.set('recorded', (seen.get('recorded') ?? 0) + 1);
              // What was handed out last time is as it was: the applier
              // compares chains by identity.
              expect(prev.rulesets[f]).toStrictEqual(prev.copies[f]);
              const reached = applyDelta(prev.copies[f]!, restoreText(r, { previous: prev.rulesets[f] }));
              for (const t of TABLES) expect(reached[t]).toStrictEqual(r.tables[t].chains);
              if (reused) expect(r).toBe(prev.rulesets[f]);
            }
            rulesets[f] = r;
            copies[f] = snapshot(r);
          }
          if (prev && reused) expect(model).toBe(prev.model);
          prev = { model, rulesets, copies };
        }
        expect(pipeline.restarts).toBe(0);
      }),
      { numRuns: 250 },
    );
    for (const kind of ['replaceService', 'addService', 'deleteService', 'recreateService', 'touchService', 'cloneService', 'replaceSlice', 'addSlice', 'deleteSlice', 'nodeAddresses', 'conflict', 'recorded']) {
      expect(seen.get(kind) ?? 0, kind).toBeGreaterThan(20);
    }
  });

  it('warmed and rehearsed while the lists arrive (any pages, any order, the Node early, late or elsewhere), the first sync and the later ones equal buildModel and renderRuleset', () => {
    const seen = new Map<string, number>();
    const count = (what: string) => seen.set(what, (seen.get(what) ?? 0) + 1);
    fc.assert(
      fc.property(
        worldArb,
        poolArb,
        fc.record({
          servicePage: fc.integer({ min: 1, max: 4 }),
          slicePage: fc.integer({ min: 1, max: 4 }),
          order: fc.array(fc.boolean(), { maxLength: 40 }),
          nodeAt: fc.nat({ max: 12 }),
          // The Node's addresses when listed; the sync's may differ (another Node object since).
          nodePick: fc.option(fc.array(fc.boolean(), { minLength: 6, maxLength: 6 }), { freq: 3 }),
          families: fc.subarray([...FAMILIES]),
          // Whether the pages say what is left, which lets the head start rehearse the first sync.
          counted: fc.boolean(),
        }),
        fc.array(opArb, { maxLength: 4 }),
        fc.array(opArb, { maxLength: 4 }),
        (world, pool, listing, before, after) => {
          const start = toInput(world);
          const s: State = { nodeAddresses: [...NODE_V4, ...NODE_V6], services: [...start.services], slices: [...start.slices], deleted: [], serial: 0 };
          const pipeline = new SyncPipeline({ nodeName: NODE, model: CONFIG, render: { marks: MARKS } });
          let rehearsed = false;
          const head = pipeline.headStart({
            families: listing.families,
            rehearse: (model) => {
              rehearsed = true;
              for (const f of listing.families) pipeline.ruleset(model[f]);
            },
          });
          const listedAddresses = listing.nodePick ? ALL_NODE_ADDRESSES.filter((_, i) => listing.nodePick![i]) : s.nodeAddresses;
          const pages = <T>(list: T[], size: number) => Array.from({ length: Math.ceil(list.length / size) }, (_, i) => list.slice(i * size, (i + 1) * size));
          const servicePages = pages(s.services, listing.servicePage);
          const slicePages = pages(s.slices, listing.slicePage);
          let step_ = 0;
          const nodeNow = () => {
            if (step_++ === listing.nodeAt) head.node(listedAddresses);
          };
          let i = 0;
          const left = <T>(pages: T[][]) => (listing.counted ? pages.reduce((n, p) => n + p.length, 0) : undefined);
          while (servicePages.length > 0 || slicePages.length > 0) {
            nodeNow();
            const servicesNext = slicePages.length === 0 || (servicePages.length > 0 && (listing.order[i++] ?? true));
            if (servicesNext) head.servicesListed(servicePages.shift()!, left(servicePages));
            else head.slicesListed(slicePages.shift()!, left(slicePages));
          }
          if (step_ <= listing.nodeAt) head.node(listedAddresses);
          head.done();
          count(listing.nodePick ? 'other addresses' : 'the same addresses');
          if (rehearsed) count('rehearsed');
          if (before.length > 0) count('changed before the sync');

          for (const [k, op] of [...before, { kind: 'noop' } as Op, ...after].entries()) {
            step(s, op, pool);
            // Each op of `before` changes what was listed; the sync comes after the noop.
            if (k < before.length) continue;
            const input = { nodeAddresses: [...s.nodeAddresses], services: [...s.services], slices: [...s.slices] };
            const model = pipeline.model(input);
            const pure = buildModel({ nodeName: NODE, config: CONFIG, ...input });
            expect(model).toStrictEqual(pure);
            for (const f of FAMILIES) expect(pipeline.ruleset(model[f])).toStrictEqual(renderRuleset(pure[f], { marks: MARKS }));
          }
          expect(pipeline.restarts).toBe(0);
        },
      ),
      { numRuns: 250 },
    );
    for (const what of ['other addresses', 'the same addresses', 'changed before the sync', 'rehearsed']) expect(seen.get(what) ?? 0, what).toBeGreaterThan(20);
  });

  it('the first sync takes what was warmed while listing, by identity', () => {
    const svc: V1Service = {
      metadata: { namespace: 'ns', name: 'web' },
      spec: { type: 'LoadBalancer', loadBalancerClass: CONFIG.loadBalancerClass, ports: [{ name: 'p', port: 80, protocol: 'TCP' }] },
      status: { loadBalancer: { ingress: [{ ip: NODE_V4[0]!, ports: [{ port: 80, protocol: 'TCP' }] }] } },
    };
    const slice: V1EndpointSlice = {
      metadata: { namespace: 'ns', name: 'web-1', labels: { 'kubernetes.io/service-name': 'web' } },
      addressType: 'IPv4',
      endpoints: [{ addresses: ['198.18.0.1'], nodeName: NODE, conditions: { ready: true } }],
      ports: [{ name: 'p', port: 8080, protocol: 'TCP' }],
    };
    const pipeline = new SyncPipeline({ nodeName: NODE, model: CONFIG, render: { marks: MARKS } });
    const head = pipeline.headStart({ families: ['ipv4'] });
    head.slicesListed([slice]);
    head.node([...NODE_V4]);
    head.servicesListed([svc]);
    head.done();
    // No informer changes an object in place; here it shows which content the sync used.
    slice.endpoints![0]!.addresses = ['198.18.0.2'];
    const rules = [...pipeline.ruleset(pipeline.model({ nodeAddresses: [...NODE_V4], services: [svc], slices: [slice] }).ipv4).tables.nat.chains.values()].flat().join('\n');
    expect(rules).toContain('198.18.0.1:8080');
    expect(rules).not.toContain('198.18.0.2');
  });

  it('rehearses the first sync once, when each list has at most one page left and the Node is known', () => {
    const svc = (i: number): V1Service => ({
      metadata: { namespace: 'ns', name: `web-${i}` },
      spec: { type: 'LoadBalancer', loadBalancerClass: CONFIG.loadBalancerClass, ports: [{ name: 'p', port: 80 + i, protocol: 'TCP' }] },
      status: { loadBalancer: { ingress: [{ ip: NODE_V4[0]!, ports: [{ port: 80 + i, protocol: 'TCP' }] }] } },
    });
    const slice = (i: number): V1EndpointSlice => ({
      metadata: { namespace: 'ns', name: `web-${i}-1`, labels: { 'kubernetes.io/service-name': `web-${i}` } },
      addressType: 'IPv4',
      endpoints: [{ addresses: [`198.18.0.${i + 1}`], nodeName: NODE, conditions: { ready: true } }],
      ports: [{ name: 'p', port: 8080, protocol: 'TCP' }],
    });
    const run = (counted: boolean, nodeFirst: boolean) => {
      const pipeline = new SyncPipeline({ nodeName: NODE, model: CONFIG, render: { marks: MARKS } });
      const seen: string[] = [];
      const head = pipeline.headStart({ families: ['ipv4'], rehearse: (m) => seen.push(`rehearsed ${m.ipv4.ports.length}`) });
      const left = (n: number) => (counted ? n : undefined);
      if (nodeFirst) head.node([...NODE_V4]);
      // Pages of 2 of 6 Services and 6 slices.
      head.servicesListed([svc(0), svc(1)], left(4));
      head.slicesListed([slice(0), slice(1)], left(4));
      seen.push('2 left');
      head.servicesListed([svc(2), svc(3)], left(2));
      seen.push('services: one left');
      head.slicesListed([slice(2), slice(3)], left(2));
      seen.push('slices: one left');
      if (!nodeFirst) head.node([...NODE_V4]);
      head.servicesListed([svc(4), svc(5)], left(0));
      head.slicesListed([slice(4), slice(5)], left(0));
      head.done();
      return seen;
    };
    expect(run(true, true)).toEqual(['2 left', 'services: one left', 'rehearsed 4', 'slices: one left']);
    expect(run(true, false)).toEqual(['2 left', 'services: one left', 'slices: one left', 'rehearsed 4']);
    expect(run(false, true)).toEqual(['2 left', 'services: one left', 'slices: one left']);
  });

  it('at scale, rewrites only the chains on a changed port\'s path and keeps every other chain by identity', () => {
    const n = 3000;
    const services: V1Service[] = [];
    const slices: V1EndpointSlice[] = [];
    const sliceOf = (i: number, generation: number): V1EndpointSlice => ({
      metadata: { namespace: 'bench', name: `s${i}-a`, labels: { 'kubernetes.io/service-name': `s${i}` } },
      addressType: 'IPv4',
      endpoints: [0, 1].map((k) => ({ addresses: [`198.18.${(i >> 7) & 255}.${((i * 2 + k + generation) & 255) || 1}`], nodeName: NODE, conditions: { ready: true } })),
      ports: [{ name: 'p', port: 8080, protocol: 'TCP' }],
    });
    for (let i = 0; i < n; i++) {
      const port = 1 + ((i * 7919) % 65535);
      services.push({
        metadata: { namespace: 'bench', name: `s${i}` },
        spec: { type: 'LoadBalancer', loadBalancerClass: CONFIG.loadBalancerClass, ports: [{ name: 'p', port, protocol: 'TCP' }] },
        status: { loadBalancer: { ingress: [{ ip: NODE_V4[0]!, ports: [{ port, protocol: 'TCP' }] }] } },
      });
      slices.push(sliceOf(i, 0));
    }
    const pipeline = new SyncPipeline({ nodeName: NODE, model: { ...CONFIG, maxPortsPerService: 8 }, render: { marks: MARKS } });
    const input = () => ({ nodeAddresses: [...NODE_V4], services: [...services], slices: [...slices] });
    const before = pipeline.ruleset(pipeline.model(input()).ipv4);
    slices[1234] = sliceOf(1234, 1);
    const model = pipeline.model(input());
    const after = pipeline.ruleset(model.ipv4);
    expect(after).toStrictEqual(renderRuleset(buildModel({ nodeName: NODE, config: { ...CONFIG, maxPortsPerService: 8 }, ...input() }).ipv4, { marks: MARKS }));
    const rewritten = [...after.tables.nat.chains].filter(([name, rules]) => before.tables.nat.chains.get(name) !== rules).map(([name]) => name);
    expect(rewritten).toHaveLength(1);
    for (const [name, rules] of after.tables.filter.chains) expect(before.tables.filter.chains.get(name), name).toBe(rules);
    expect(restoreText(after, { previous: before }).split('\n').filter((l) => l.startsWith(':'))).toHaveLength(1);
  });

  describe('when the bookkeeping loses track', () => {
    // No input reaches a broken invariant (the properties above count the
    // restarts); an object the pipeline was handed, changed in place behind
    // its back, which no caller does, stands in for a bug.
    const served = (name: string, port: number): V1Service => ({
      metadata: { namespace: 'ns', name, creationTimestamp: new Date(Date.UTC(2024, 0, 1)) },
      spec: { type: 'LoadBalancer', loadBalancerClass: CONFIG.loadBalancerClass, ports: [{ name: 'p', port, protocol: 'TCP' }] },
      status: { loadBalancer: { ingress: [{ ip: NODE_V4[0]!, ports: [{ port, protocol: 'TCP' }] }] } },
    });
    const oracle = (services: V1Service[]) => buildModel({ nodeName: NODE, config: CONFIG, nodeAddresses: [...NODE_V4], services, slices: [] });

    it('the model is redone from an empty state, by the same engine: the oracle\'s result', () => {
      const services = Array.from({ length: 8 }, (_, i) => served(`s${i}`, 1000 + i));
      const pipeline = new SyncPipeline({ nodeName: NODE, model: CONFIG, render: { marks: MARKS } });
      const first = pipeline.model({ nodeAddresses: [...NODE_V4], services: [...services], slices: [] });
      // s0's served port now claims the key s1's has.
      first.ipv4.ports[0]!.key = first.ipv4.ports[1]!.key;
      services[1] = served('s1', 2001);
      const model = pipeline.model({ nodeAddresses: [...NODE_V4], services: [...services], slices: [] });
      expect(pipeline.restarts).toBe(1);
      expect(model).toStrictEqual(oracle(services));
      expect(pipeline.ruleset(model.ipv4)).toStrictEqual(renderRuleset(model.ipv4, { marks: MARKS }));
      // Afresh: the next change is incremental again.
      const restarts = pipeline.restarts;
      services[2] = served('s2', 2002);
      const next = pipeline.model({ nodeAddresses: [...NODE_V4], services: [...services], slices: [] });
      expect(next).toStrictEqual(oracle(services));
      expect(pipeline.ruleset(next.ipv4)).toStrictEqual(renderRuleset(next.ipv4, { marks: MARKS }));
      expect(pipeline.restarts).toBe(restarts);
    });

    it('the rules are redone from an empty state, by the same engine: the oracle\'s result', () => {
      const pipeline = new SyncPipeline({ nodeName: NODE, model: CONFIG, render: { marks: MARKS } });
      const before = oracle([served('a', 80), served('b', 443)]).ipv4;
      pipeline.ruleset(before);
      // a's frontend moves in place: its old rules are no longer where the renderer looks.
      before.ports[0]!.frontends[0]!.port = 81;
      const after = structuredClone(before);
      const ruleset = pipeline.ruleset(after);
      expect(pipeline.restarts).toBe(1);
      expect(ruleset).toStrictEqual(renderRuleset(after, { marks: MARKS }));
      expect(TABLES.flatMap((t) => [...ruleset.tables[t].chains.values()].flat()).join('\n')).toContain('--dport 81');
    });

    it('an input no engine state can follow is an error for the caller, and the next sync starts afresh', () => {
      const pipeline = new SyncPipeline({ nodeName: NODE, model: CONFIG, render: { marks: MARKS } });
      const services = [served('a', 80), served('b', 443)];
      pipeline.ruleset(pipeline.model({ nodeAddresses: [...NODE_V4], services, slices: [] }).ipv4);
      // Informers hold each Service once; manifests.ts keeps the later of two.
      expect(() => pipeline.model({ nodeAddresses: [...NODE_V4], services: [...services, served('b', 444)], slices: [] })).toThrow('two Services named ns/b');
      const model = pipeline.model({ nodeAddresses: [...NODE_V4], services, slices: [] });
      expect(model).toStrictEqual(oracle(services));
      expect(pipeline.ruleset(model.ipv4)).toStrictEqual(renderRuleset(model.ipv4, { marks: MARKS }));
      // Neither is a model any engine makes: the renderer refuses it, cold too.
      const [a] = model.ipv4.ports;
      expect(() => pipeline.ruleset({ family: 'ipv4', ports: [a!, a!] })).toThrow('served ports not sorted by key');
      expect(pipeline.ruleset(model.ipv4)).toStrictEqual(renderRuleset(model.ipv4, { marks: MARKS }));
    });
  });
});
