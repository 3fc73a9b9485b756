// npm run bench:agent — the agent's sync costs against the floor, in scratch
// network namespaces (root needed). Prints times with their ratios and a
// PASS/MISS line per target of the agent's scale issue.
//
// Every step is what Agent.sync does: Applier.prepare, the engine's model of
// the informers' objects, the iptables renderer's ruleset, Applier.apply. As in the
// informers' caches, objects are decoded from JSON and keep their identity
// between syncs: a no-op sync hands over the same objects again, and "one
// Service changed" replaces only that Service's EndpointSlice with a new one.
// A cold sync is a new pipeline and applier against an empty namespace, timed
// as the agent starts: its first iptables-save is read, its iptables-restore
// started, and the Services whose slices have arrived computed, while its
// informers list (listAhead, in pages of 500); the clock starts when the
// last pages arrive. The time with the save on the path and nothing computed
// ahead is printed too. The raw restore it is compared with
// writes the very payload the applier writes there (jumps into the built-in
// chains included), starting its process as any command does.
//
// The memory figure comes from a separate process (bench/agent-rss.ts,
// compiled to JavaScript, with this process's Node flags) holding the agent's
// modules, client-node's decoded objects and pier's state after a full sync:
// a proxy; npm run bench:agent-rss measures the bundled agent for real.
//
//   PIER_BENCH_SIZES=100,1000,10000   service ports for the cold syncs
//   PIER_BENCH_REPEAT=5               repetitions of the small measurements (median; nftables changes three times as many)
//   PIER_BENCH_COLD_REPEAT=9          repetitions of cold sync and raw restore (median; the fastest too)
//   PIER_BENCH_BACKEND=nft|legacy
//   PIER_BENCH_RSS_PORTS=10000        ports for the memory measurement (0: skip)
//   PIER_BENCH_DUAL_PORTS=10000       ports per family for the dual-stack cold sync (0: skip)
//   PIER_BENCH_DUAL_REPEAT=5          its repetitions (median)
//
// At PIER_BENCH_DUAL_PORTS, the verifying resyncs too: with nothing drifted
// and with one chain flushed from outside, PIER_BENCH_REPEAT times each.
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Applier, eachFamily, findDrift, diffJumps, type ApplyResult } from '../agent/iptables/applier.ts';
import { Xtables, type IptablesFlavour } from '../agent/iptables/xtables.ts';
import { commandRunner, type Runner } from '../lib/run.ts';
import { NftApplier, type NftApplyResult } from '../agent/nftables/applier.ts';
import { NftRenderer } from '../agent/nftables/render.ts';
import { SyncPipeline, type HeadStartSetup } from '../test/support/pipeline.ts';
import type { Ruleset } from '../agent/iptables/render.ts';
import { parseSave, restoreText, splitRule } from '../agent/iptables/restore.ts';
import type { ServedPort } from '../agent/engine/model.ts';
import { LOAD_BALANCER_CLASS, type Family } from '../lib/contract.ts';
import { scratchNamespace, type Scratch } from '../test/lab/scratch.ts';
import { ROOT, transpile } from './transpile.ts';

const NODE = 'bench-node';
const NODE_IP = '198.51.100.11';
const NODE_IP6 = '2001:db8::11';
const MODEL_CONFIG = { loadBalancerClass: LOAD_BALANCER_CLASS, defaultClass: false, maxPortsPerService: 256 };
/** The agent's default connection-mark bits. */
const MARKS = { accept: 0x2000, masquerade: 0x1000 };
const sizes = (process.env['PIER_BENCH_SIZES'] ?? '100,1000,10000').split(',').map(Number);
const repeat = Number(process.env['PIER_BENCH_REPEAT'] ?? '5');
const coldRepeat = Number(process.env['PIER_BENCH_COLD_REPEAT'] ?? '9');
const backend = (process.env['PIER_BENCH_BACKEND'] ?? 'nft') as IptablesFlavour;
const rssPorts = Number(process.env['PIER_BENCH_RSS_PORTS'] ?? String(Math.max(...sizes)));
const dualPorts = Number(process.env['PIER_BENCH_DUAL_PORTS'] ?? String(Math.max(...sizes)));
const dualRepeat = Number(process.env['PIER_BENCH_DUAL_REPEAT'] ?? '5');

// Targets from the agent's scale issue.
/** nftables backend (issue 18): its cold sync against the iptables backend's raw restore of the same Services. */
const NFT_COLD_RATIO = 0.5;
const NFT_CHANGE_MS = 10;
/** Issue 18 holds the iptables backend to its figures then: 1.2 was the scale issue's. */
const COLD_RATIO = 1.15;
const CHANGE_MS = 150;
const CHANGE_RATIO = 3;
/** "Cheap": what a no-op sync may cost at the largest size (it was 321 ms at 10,000 ports). */
const NOOP_MS = 10;
const RSS_MB = 150;
/** Issue 27: one change to a Service with ClientIP affinity, against the same change to one without, either backend. */
const AFFINITY_CHANGE_RATIO = 2;
/** The one Service of every size with ClientIP affinity: changes to it are measured beside changes to Service 0. */
const STICKY = 1;

interface Objects {
  services: V1Service[];
  slices: V1EndpointSlice[];
}

function service(i: number, ips = [NODE_IP]): V1Service {
  const port = 20000 + i;
  return {
    metadata: { namespace: 'bench', name: `svc-${i}`, uid: `uid-${i}` },
    spec: { type: 'LoadBalancer', loadBalancerClass: LOAD_BALANCER_CLASS, ports: [{ name: 'p', port, protocol: 'TCP', targetPort: 8080 }], ...(i === STICKY ? { sessionAffinity: 'ClientIP' } : {}) },
    status: { loadBalancer: { ingress: ips.map((ip) => ({ ip, ipMode: 'Proxy', ports: [{ port, protocol: 'TCP' }] })) } },
  };
}

/** Two endpoints each; `generation` moves the first one (a rolled pod). */
function slice(i: number, generation = 0): V1EndpointSlice {
  const a = (k: number) => `198.19.${(Math.floor((i * 2 + k) / 250) + (k === 0 ? generation : 0)) % 250}.${((i * 2 + k) % 250) + 1}`;
  return {
    metadata: { namespace: 'bench', name: `svc-${i}-1`, labels: { 'kubernetes.io/service-name': `svc-${i}` } },
    addressType: 'IPv4',
    endpoints: [0, 1].map((k) => ({ addresses: [a(k)], nodeName: NODE, conditions: { ready: true } })),
    ports: [{ name: 'p', port: 8080, protocol: 'TCP' }],
  };
}

/** As the informers hold them: decoded from JSON, so with flat strings. */
function decoded<T>(obj: T): T {
  return JSON.parse(JSON.stringify(obj)) as T;
}

function objects(n: number): Objects {
  return { services: Array.from({ length: n }, (_, i) => decoded(service(i))), slices: Array.from({ length: n }, (_, i) => decoded(slice(i))) };
}

/** Dual-stack: each Service on the node's IPv4 and IPv6 address, with a slice of two endpoints per family. */
function dualObjects(n: number): Objects {
  const v6 = (i: number): V1EndpointSlice => ({
    metadata: { namespace: 'bench', name: `svc-${i}-6`, labels: { 'kubernetes.io/service-name': `svc-${i}` } },
    addressType: 'IPv6',
    endpoints: [0, 1].map((k) => ({ addresses: [`2001:db8:1::${(i * 2 + k + 1).toString(16)}`], nodeName: NODE, conditions: { ready: true } })),
    ports: [{ name: 'p', port: 8080, protocol: 'TCP' }],
  });
  return {
    services: Array.from({ length: n }, (_, i) => decoded(service(i, [NODE_IP, NODE_IP6]))),
    slices: Array.from({ length: n }, (_, i) => [decoded(slice(i)), decoded(v6(i))]).flat(),
  };
}

function pipeline(): SyncPipeline {
  return new SyncPipeline({ nodeName: NODE, model: MODEL_CONFIG, render: { marks: MARKS } });
}

/** Agent.sync for one family. The lists are new arrays each time, as the informers' list() returns them. */
function ruleset(p: SyncPipeline, objs: Objects): Ruleset {
  const model = p.model({ nodeAddresses: [NODE_IP], services: [...objs.services], slices: [...objs.slices] });
  return p.ruleset(model.ipv4);
}

/** Agent.sync's steps; `computed` gets the time spent on the rules themselves. */
async function sync(p: SyncPipeline, applier: Applier, objs: Objects, computed?: (ms: number) => void): Promise<ApplyResult> {
  void applier.prepare();
  const t0 = performance.now();
  const rs = ruleset(p, objs);
  computed?.(performance.now() - t0);
  return applier.apply(rs);
}

/** Objects per list page, as the agent's informers read them. */
const PAGE = 500;

/**
 * The agent's head start (agent/headstart.ts) as its informers drive it: the
 * Node first, then the pages of Services and of slices in the order they
 * would finish arriving, each saying what is left as the API server's
 * remainingItemCount does, all but the last of each. Returns the rest: the
 * last pages, which arrive when the lists end, on the cold sync's clock.
 */
function listAhead(p: SyncPipeline, objs: Objects, addresses: string[], opts: HeadStartSetup): () => void {
  const head = p.headStart(opts);
  head.node(addresses);
  const pages = <T>(list: T[]) => Array.from({ length: Math.ceil(list.length / PAGE) }, (_, i) => list.slice(i * PAGE, (i + 1) * PAGE));
  const left = (list: unknown[], i: number) => Math.max(0, list.length - (i + 1) * PAGE);
  const feeds = [
    ...pages(objs.services).map((page, i, all) => ({ at: (i + 1) / all.length, feed: () => head.servicesListed(page, left(objs.services, i)) })),
    ...pages(objs.slices).map((page, i, all) => ({ at: (i + 1) / all.length, feed: () => head.slicesListed(page, left(objs.slices, i)) })),
  ].sort((a, b) => a.at - b.at);
  const last = feeds.filter((f) => f.at === 1);
  for (const f of feeds) if (f.at < 1) f.feed();
  return () => {
    for (const f of last) f.feed();
    head.done();
  };
}

/** What the applier writes into an empty namespace on its first sync (the jumps into the built-in chains included): the raw restores' payload. */
function firstPayload(rs: Ruleset): string {
  return restoreText(rs, { jumps: { nat: diffJumps(rs, 'nat', undefined), filter: diffJumps(rs, 'filter', undefined) } });
}

const ms = (t0: number) => performance.now() - t0;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/**
 * Commands in the scratch namespace, as the agent runs them on its node:
 * nsenter enters the network namespace only, where `ip netns exec` also
 * remounts /sys, ~15 ms a command on this machine that an agent never pays.
 */
function inNamespace(ns: string): Runner {
  return commandRunner(['nsenter', `--net=/run/netns/${ns}`]);
}

async function withScratch<T>(fn: (s: Scratch, xt: Xtables, xt6: Xtables) => Promise<T>): Promise<T> {
  const s = await scratchNamespace();
  try {
    const runner = inNamespace(s.ns);
    return await fn(s, new Xtables('ipv4', backend, runner), new Xtables('ipv6', backend, runner));
  } finally {
    await s.destroy();
  }
}

const row = (what: string, value: string) => process.stdout.write(`${what.padEnd(58)} ${value}\n`);
const fmt = (x: number) => `${x.toFixed(1)} ms`;
const mark = (ok: boolean) => (ok ? 'PASS' : 'MISS');
const results: { target: string; value: string; ok: boolean }[] = [];

process.stdout.write(`pier agent benchmark: iptables ${backend}, medians of ${coldRepeat} cold and ${repeat} small measurements\n\n`);
const cold = new Map<number, { agent: number; raw: number }>();
const change = new Map<number, number>();
/** The same change to the Service with ClientIP affinity. */
const stickyChange = new Map<number, number>();
const noop = new Map<number, number>();
for (const n of sizes) {
  const objs = objects(n);
  // The floor: iptables-restore of the same payload into an empty namespace,
  // the jumps from the built-in chains included, as the applier writes it.
  const planned = ruleset(pipeline(), objs);
  const payload = firstPayload(planned);
  const rules = [...planned.tables.nat.chains.values(), ...planned.tables.filter.chains.values()].reduce((a, r) => a + r.length, 0);
  const chains = planned.tables.nat.chains.size + planned.tables.filter.chains.size;

  const raws: number[] = [];
  const agents: number[] = [];
  const withSaves: number[] = [];
  const saves: number[] = [];
  const aheads: number[] = [];
  const computes: number[] = [];
  const applies: number[] = [];
  let steady: { noop: number; changed: number; sticky: number } | undefined;
  for (let k = 0; k < coldRepeat; k++) {
    raws.push(
      await withScratch(async (_s, xt) => {
        const t0 = performance.now();
        await xt.restore(payload);
        return ms(t0);
      }),
    );
    // The agent from scratch, reading iptables-save on the sync's path (a
    // save, overlapped with computing the rules, then the restore).
    await withScratch(async (_s, xt) => {
      const t0 = performance.now();
      await sync(pipeline(), new Applier(xt), objs);
      withSaves.push(ms(t0));
    });
    // The agent from scratch as it starts: while the informers list, the
    // save is read, the restore started and each Service computed whose
    // slices have arrived; the clock starts when the last pages arrive, and
    // runs through the sync (the rest of the computing, the restore with the
    // jumps).
    const last = k === coldRepeat - 1;
    await withScratch(async (_s, xt) => {
      const p = pipeline();
      const applier = new Applier(xt);
      const s0 = performance.now();
      await applier.prepare();
      saves.push(ms(s0));
      const a0 = performance.now();
      const listed = listAhead(p, objs, [NODE_IP], { families: ['ipv4'], rehearse: (model) => p.ruleset(model.ipv4) });
      aheads.push(ms(a0));
      const t0 = performance.now();
      listed();
      let computed = 0;
      const res = await sync(p, applier, objs, () => computes.push((computed = ms(t0))));
      agents.push(ms(t0));
      applies.push(ms(t0) - computed);
      if (res.mode !== 'full') throw new Error(`expected a full sync, got ${res.mode}`);
      if (!last) return;
      const noops: number[] = [];
      const changes = { plain: [] as number[], sticky: [] as number[] };
      for (let r = 0; r < repeat; r++) {
        for (const [i, times] of [[0, changes.plain], [STICKY, changes.sticky]] as const) {
          let t = performance.now();
          const res = await sync(p, applier, objs);
          noops.push(ms(t));
          if (res.mode !== 'noop') throw new Error(`expected a no-op sync, got ${res.mode}`);
          // One Service changed: the informer replaces its slice, nothing else.
          objs.slices[i] = decoded(slice(i, r + 1));
          t = performance.now();
          const c = await sync(p, applier, objs);
          times.push(ms(t));
          if (c.mode !== 'partial') throw new Error(`expected a partial sync, got ${c.mode}`);
        }
      }
      steady = { noop: median(noops), changed: median(changes.plain), sticky: median(changes.sticky) };
    });
  }
  // The engine from an empty state with nothing ahead, as `pier plan` and `pier trace` run it.
  const pure: number[] = [];
  for (let r = 0; r < repeat; r++) {
    const t0 = performance.now();
    const p = pipeline();
    p.ruleset(p.model({ nodeAddresses: [NODE_IP], ...objs }).ipv4);
    pure.push(ms(t0));
  }

  const agent = median(agents);
  const raw = median(raws);
  cold.set(n, { agent, raw });
  change.set(n, steady!.changed);
  stickyChange.set(n, steady!.sticky);
  noop.set(n, steady!.noop);
  const ratio = agent / raw;
  const first = change.get(Math.min(...sizes));
  row(`${n} ports: ${rules} rules in ${chains} chains, cold sync`, `${fmt(agent)} (raw restore ${fmt(raw)}, ratio ${ratio.toFixed(2)}) ${mark(ratio <= COLD_RATIO)}`);
  // This machine's restores fall into a fast and a slow band (at 1,000
  // ports ~100 and ~160 ms, interleaved at random): the fastest of each is
  // the cost without the interference, as timeit's documentation argues.
  row(`${n} ports:   the fastest of each`, `${fmt(Math.min(...agents))} (raw restore ${fmt(Math.min(...raws))}, ratio ${(Math.min(...agents) / Math.min(...raws)).toFixed(2)})`);
  row(`${n} ports:   of which computing the rules`, `${fmt(median(computes))} (and ${fmt(median(aheads))} while the lists arrived, before the clock)`);
  row(`${n} ports:   of which applying (the payload's text, the restore)`, `${fmt(median(applies))} (${(median(applies) / raw).toFixed(2)}x the raw restore)`);
  row(`${n} ports:   the iptables-save read while the informers list`, fmt(median(saves)));
  row(`${n} ports:   cold sync with the save on its path, nothing ahead`, `${fmt(median(withSaves))} (ratio ${(median(withSaves) / raw).toFixed(2)})`);
  row(`${n} ports: no-op sync`, fmt(steady!.noop));
  row(`${n} ports: one Service changed`, `${fmt(steady!.changed)}${first && n !== Math.min(...sizes) ? ` (${(steady!.changed / first).toFixed(2)}x the same change at ${Math.min(...sizes)})` : ''}`);
  row(`${n} ports: one Service with ClientIP affinity changed`, `${fmt(steady!.sticky)} (${(steady!.sticky / steady!.changed).toFixed(2)}x one without)`);
  row(`${n} ports: computing the rules from an empty state, nothing ahead (pier plan)`, fmt(median(pure)));
}

// The seed's way: one iptables command per rule.
const perRuleN = 1000;
if (sizes.includes(perRuleN)) {
  const rs = ruleset(pipeline(), objects(perRuleN));
  const cmds: string[][] = [];
  for (const table of ['nat', 'filter'] as const) {
    const t = rs.tables[table];
    for (const chain of t.chains.keys()) cmds.push(['iptables', '-t', table, '-N', chain]);
    for (const [chain, rules] of t.chains) for (const r of rules) cmds.push(['iptables', '-t', table, '-A', chain, ...splitRule(r)]);
    for (const j of t.jumps) cmds.push(['iptables', '-t', table, '-A', j.chain, ...splitRule(j.rule)]);
  }
  const perRule = await withScratch(async (s) => {
    const t0 = performance.now();
    for (const [file, ...args] of cmds) await s.exec(file!, args);
    return ms(t0);
  });
  row(`${perRuleN} ports, one iptables command per rule (${cmds.length} commands)`, `${fmt(perRule)} (${(perRule / cold.get(perRuleN)!.agent).toFixed(0)}x the agent's cold sync)`);
}

// Dual-stack: Agent.sync renders both families, then applies them through
// eachFamily (side by side with nft). Against the two raw restores one after
// the other and side by side, and against the agent's earlier way, the
// families one after the other.
if (dualPorts > 0) {
  const objs = dualObjects(dualPorts);
  const families = ['ipv4', 'ipv6'] as const;
  /** Agent.sync's rules for both families. */
  const rulesets = (p: SyncPipeline) => {
    const model = p.model({ nodeAddresses: [NODE_IP, NODE_IP6], services: [...objs.services], slices: [...objs.slices] });
    return { ipv4: p.ruleset(model.ipv4), ipv6: p.ruleset(model.ipv6) };
  };
  const planned = rulesets(pipeline());
  const payloads = { ipv4: firstPayload(planned.ipv4), ipv6: firstPayload(planned.ipv6) };
  const agentDual = (together: boolean) =>
    withScratch(async (_s, xt, xt6) => {
      const p = pipeline();
      const appliers = { ipv4: new Applier(xt), ipv6: new Applier(xt6) };
      await Promise.all(families.map((f) => appliers[f].prepare()));
      const listed = listAhead(p, objs, [NODE_IP, NODE_IP6], { families, rehearse: (model) => families.forEach((f) => p.ruleset(model[f])) });
      const t0 = performance.now();
      listed();
      const rs = rulesets(p);
      const apply = (f: (typeof families)[number]) => appliers[f].apply(rs[f]);
      if (together) await eachFamily(backend, families, apply);
      else for (const f of families) await apply(f);
      return ms(t0);
    });
  const runs = { sideBySide: [] as number[], oneByOne: [] as number[], rawSequential: [] as number[], rawSideBySide: [] as number[] };
  for (let k = 0; k < dualRepeat; k++) {
    runs.rawSequential.push(
      await withScratch(async (_s, xt, xt6) => {
        const t0 = performance.now();
        await xt.restore(payloads.ipv4);
        await xt6.restore(payloads.ipv6);
        return ms(t0);
      }),
    );
    runs.rawSideBySide.push(
      await withScratch(async (_s, xt, xt6) => {
        const t0 = performance.now();
        await Promise.all([xt.restore(payloads.ipv4), xt6.restore(payloads.ipv6)]);
        return ms(t0);
      }),
    );
    // In turn first, so that neither always follows the same measurement.
    for (const together of k % 2 ? [true, false] : [false, true]) (together ? runs.sideBySide : runs.oneByOne).push(await agentDual(together));
  }
  const d = { sideBySide: median(runs.sideBySide), oneByOne: median(runs.oneByOne), rawSequential: median(runs.rawSequential), rawSideBySide: median(runs.rawSideBySide) };
  row(`${dualPorts} ports per family, dual-stack: cold sync`, `${fmt(d.sideBySide)} (raw restores one after the other ${fmt(d.rawSequential)}, ratio ${(d.sideBySide / d.rawSequential).toFixed(2)})`);
  row(`${dualPorts} ports per family:   raw restores side by side`, `${fmt(d.rawSideBySide)} (the cold sync's ratio to it ${(d.sideBySide / d.rawSideBySide).toFixed(2)})`);
  row(`${dualPorts} ports per family:   the families one after the other`, `${fmt(d.oneByOne)} (${(d.oneByOne / d.sideBySide).toFixed(2)}x the cold sync)`);

  // Verifying resyncs (the agent's periodic ones): each family's
  // iptables-save read and compared with what was applied, nothing written
  // when nothing drifted; then with one dispatch chain of IPv4's nat table
  // flushed from outside before each, healed by a restore of that chain.
  await withScratch(async (s, xt, xt6) => {
    const p = pipeline();
    const appliers = { ipv4: new Applier(xt), ipv6: new Applier(xt6) };
    await eachFamily(backend, families, (f) => appliers[f].apply(rulesets(p)[f]));
    const verify = async (only?: Family) => {
      const t0 = performance.now();
      const rs = rulesets(p);
      const out = await eachFamily(backend, only ? [only] : families, (f) => appliers[f].apply(rs[f], { verify: true }));
      return { ms: ms(t0), out };
    };
    const chain = [...rulesets(p).ipv4.tables.nat.chains.keys()].find((c) => c.startsWith('PIER-SVCS-'))!;
    const flush = () => s.exec(backend === 'nft' ? 'iptables-nft' : 'iptables-legacy', ['-t', 'nat', '-F', chain]);
    const v = { both: [] as number[], ipv4: [] as number[], ipv6: [] as number[], save4: [] as number[], save6: [] as number[], parse4: [] as number[], compare4: [] as number[], drift4: [] as number[], driftBoth: [] as number[] };
    let healBytes = 0;
    for (let r = 0; r < repeat; r++) {
      for (const [key, only] of [['both', undefined], ['ipv4', 'ipv4'], ['ipv6', 'ipv6']] as const) {
        const { ms: t, out } = await verify(only);
        if (out.some((o) => o.mode !== 'noop')) throw new Error(`expected no-op verifying syncs, got ${out.map((o) => o.mode).join(', ')}`);
        v[key].push(t);
      }
      for (const [key, x] of [['save4', xt], ['save6', xt6]] as const) {
        const t0 = performance.now();
        const text = await x.save();
        v[key].push(ms(t0));
        if (key !== 'save4') continue;
        // The applier's own share: parse the save, compare, build the (empty) payload.
        const c0 = performance.now();
        const saved = parseSave(text);
        v.parse4.push(ms(c0));
        const c1 = performance.now();
        if (findDrift(rulesets(p).ipv4, saved)) throw new Error('the save differs from what was applied');
        v.compare4.push(ms(c1));
      }
      for (const [key, only] of [['drift4', 'ipv4'], ['driftBoth', undefined]] as const) {
        await flush();
        const { ms: t, out } = await verify(only);
        if (out[0]!.mode !== 'partial' || out[0]!.drift?.chains.length !== 1) throw new Error(`expected one drifted chain healed, got ${JSON.stringify(out[0])}`);
        healBytes = out[0]!.payloadBytes;
        v[key].push(t);
      }
    }
    const md = (k: keyof typeof v) => fmt(median(v[k]));
    row(`${dualPorts} ports per family: verifying sync, nothing drifted`, `${md('both')} both families (IPv4 alone ${md('ipv4')}, IPv6 alone ${md('ipv6')})`);
    row(`${dualPorts} ports per family:   of which iptables-save alone`, `IPv4 ${md('save4')}, IPv6 ${md('save6')}`);
    row(`${dualPorts} ports per family:   of which parsing it, and comparing (IPv4)`, `${md('parse4')}, ${md('compare4')} (rendering again included)`);
    row(`${dualPorts} ports per family: verifying sync, one chain drifted`, `${md('driftBoth')} both families (IPv4 alone ${md('drift4')}; restore of ${healBytes} bytes)`);
  });
}

// The nftables backend on the same objects: Agent.sync's steps with
// NftRenderer and NftApplier, the lists' last pages on the clock as above.
const nft = new Map<number, { cold: number; change: number; sticky: number; noop: number; verify: number }>();
for (const n of sizes) {
  const objs = objects(n);
  const colds: number[] = [];
  let steady: { change: number; sticky: number; noop: number; verify: number } | undefined;
  for (let k = 0; k < coldRepeat; k++) {
    await withScratch(async (s) => {
      const p = pipeline();
      const renderer = new NftRenderer('ipv4', MARKS.masquerade);
      const applier = new NftApplier('ipv4', inNamespace(s.ns));
      try {
        const nftSync = async (verify = false): Promise<NftApplyResult> => {
          const model = p.model({ nodeAddresses: [NODE_IP], services: [...objs.services], slices: [...objs.slices] });
          return applier.apply(renderer.update(model.ipv4, { transaction: applier.holdsTable, changes: p.changes('ipv4') }), { verify });
        };
        const listed = listAhead(p, objs, [NODE_IP], {
          families: [],
          prepare: (served) => renderer.prepare(served),
          rehearse: (model) => renderer.update(model.ipv4, { transaction: false, changes: p.changes('ipv4') }),
        });
        const t0 = performance.now();
        listed();
        const res = await nftSync();
        colds.push(ms(t0));
        if (res.mode !== 'full') throw new Error(`expected a full nft sync, got ${res.mode}`);
        if (k !== coldRepeat - 1) return;
        const noops: number[] = [];
        const changes: number[] = [];
        const verifies: number[] = [];
        // As with iptables, changes between no-op syncs; the verifying
        // syncs after them, as the agent runs one every few minutes, not
        // between two changes (a change right after one paid for collecting
        // the 10,000 elements it had read back: 10-12 ms, against 4-6).
        // And not right after the cold sync: the applier then starts its
        // `nft -i`, which reads the table before it answers (0.1-0.2 s at
        // 10,000 ports), and the agent's next change comes seconds later
        // (the first change waited for it: 167 ms in one run). Three times
        // as many changes as the iptables loop: the first two after a cold
        // sync still pay for collecting its garbage (5-8 ms against 2.5-4
        // at 10,000 ports), and a median of five then fell on a third slow one.
        await new Promise((resolve) => setTimeout(resolve, 1000));
        const stickies: number[] = [];
        for (let r = 0; r < 3 * repeat; r++) {
          for (const [i, times] of [[0, changes], [STICKY, stickies]] as const) {
            const t = performance.now();
            if ((await nftSync()).mode !== 'noop') throw new Error('expected a no-op nft sync');
            noops.push(ms(t));
            objs.slices[i] = decoded(slice(i, 100 + r));
            const c0 = performance.now();
            const c = await nftSync();
            times.push(ms(c0));
            if (c.mode !== 'partial') throw new Error(`expected a partial nft sync, got ${c.mode}`);
          }
        }
        for (let r = 0; r < repeat; r++) {
          const t = performance.now();
          if ((await nftSync(true)).mode !== 'noop') throw new Error('expected a no-op verifying nft sync');
          verifies.push(ms(t));
        }
        steady = { change: median(changes), sticky: median(stickies), noop: median(noops), verify: median(verifies) };
      } finally {
        applier.close();
      }
    });
  }
  const nftCold = median(colds);
  nft.set(n, { cold: nftCold, ...steady! });
  const raw = cold.get(n)!.raw;
  row(`nftables, ${n} ports: cold sync`, `${fmt(nftCold)} (${(nftCold / raw).toFixed(2)}x the iptables backend's raw restore, ${fmt(raw)})`);
  row(`nftables, ${n} ports: no-op sync; one Service changed`, `${fmt(steady!.noop)}; ${fmt(steady!.change)}`);
  row(`nftables, ${n} ports: one Service with ClientIP affinity changed`, `${fmt(steady!.sticky)} (${(steady!.sticky / steady!.change).toFixed(2)}x one without)`);
  row(`nftables, ${n} ports: verifying sync, nothing drifted`, fmt(steady!.verify));
}

const big = Math.max(...sizes);
const small = Math.min(...sizes);
{
  const nb = nft.get(big)!;
  results.push({ target: `nftables: cold sync at ${big} <= ${NFT_COLD_RATIO}x iptables raw restore`, value: `${(nb.cold / cold.get(big)!.raw).toFixed(2)}x`, ok: nb.cold / cold.get(big)!.raw <= NFT_COLD_RATIO });
  results.push({ target: `nftables: one change at ${big} <= ${NFT_CHANGE_MS} ms`, value: fmt(nb.change), ok: nb.change <= NFT_CHANGE_MS });
  const r = nb.sticky / nb.change;
  results.push({ target: `nftables: one ClientIP Service changed at ${big} <= ${AFFINITY_CHANGE_RATIO}x one without`, value: `${r.toFixed(2)}x`, ok: r <= AFFINITY_CHANGE_RATIO });
}
{
  const c = cold.get(big)!;
  results.push({ target: `cold sync at ${big} <= ${COLD_RATIO}x raw restore`, value: `${(c.agent / c.raw).toFixed(2)}x`, ok: c.agent / c.raw <= COLD_RATIO });
  for (const n of sizes) {
    if (n === big) continue;
    const s = cold.get(n)!;
    results.push({ target: `cold sync at ${n} <= ${COLD_RATIO}x raw restore`, value: `${(s.agent / s.raw).toFixed(2)}x`, ok: s.agent / s.raw <= COLD_RATIO });
  }
  results.push({ target: `one change at ${big} <= ${CHANGE_MS} ms`, value: fmt(change.get(big)!), ok: change.get(big)! <= CHANGE_MS });
  if (sizes.length > 1) {
    const r = change.get(big)! / change.get(small)!;
    results.push({ target: `one change at ${big} <= ${CHANGE_RATIO}x one change at ${small}`, value: `${r.toFixed(2)}x`, ok: r <= CHANGE_RATIO });
  }
  const sticky = stickyChange.get(big)! / change.get(big)!;
  results.push({ target: `one ClientIP Service changed at ${big} <= ${AFFINITY_CHANGE_RATIO}x one without`, value: `${sticky.toFixed(2)}x`, ok: sticky <= AFFINITY_CHANGE_RATIO });
  results.push({ target: `no-op sync at ${big} <= ${NOOP_MS} ms`, value: fmt(noop.get(big)!), ok: noop.get(big)! <= NOOP_MS });
}

const m = rssPorts > 0 ? await agentMemory(rssPorts).catch((err: Error) => void row('agent process RSS', `not measured: ${err.message.split('\n')[0]}`)) : undefined;
if (m) {
  const mb = (x: number) => `${(x / 1024 / 1024).toFixed(0)} MB`;
  const s = m.stages;
  row(`agent process RSS, ${m.ports} ports (${m.modes.join(', ')}; node ${process.execArgv.join(' ')})`, `${mb(s.steady.rss)}`);
  row('  node itself', mb(s.node.rss));
  row('  + the agent\'s modules (client-node, prom-client, pino)', `${mb(s.modules.rss - s.node.rss)} (heap ${mb(s.modules.heapUsed - s.node.heapUsed)})`);
  row(`  + ${m.ports} Services and EndpointSlices as client-node caches them`, `${mb(s.objects.rss - s.modules.rss)} (heap ${mb(s.objects.heapUsed - s.modules.heapUsed)})`);
  row('  + pier after a full sync (pipeline caches, applied rules)', `${mb(s.synced.rss - s.objects.rss)} (heap ${mb(s.synced.heapUsed - s.objects.heapUsed)})`);
  row('  + a no-op and a one-Service change', `${mb(s.steady.rss - s.synced.rss)} (heap ${mb(s.steady.heapUsed - s.synced.heapUsed)})`);
  // A proxy (unbundled modules, read right after the syncs): the target is
  // judged by npm run bench:agent-rss, the bundled agent settled.
  results.push({ target: `  agent RSS proxy at ${m.ports} ports (the ${RSS_MB} MB target: npm run bench:agent-rss)`, value: mb(s.steady.rss), ok: true });
  results.push({ target: `  of which pier's own state`, value: `${mb(s.steady.rss - s.objects.rss)} RSS, ${mb(s.steady.heapUsed - s.objects.heapUsed)} heap`, ok: true });
}

process.stdout.write('\ntargets\n');
for (const r of results) row(`  ${r.target}`, r.target.startsWith('  ') ? r.value : `${r.value.padEnd(12)} ${mark(r.ok)}`);

interface Memory {
  ports: number;
  modes: string[];
  stages: Record<'node' | 'modules' | 'objects' | 'synced' | 'steady', { rss: number; heapUsed: number; external: number }>;
}

/**
 * Runs bench/agent-rss.ts as JavaScript (the agent ships compiled; Node's
 * TypeScript loader alone adds ~17 MB) in a process of its own, against a
 * scratch namespace.
 */
async function agentMemory(ports: number): Promise<Memory> {
  const out = join(ROOT, '.cache', 'bench-rss');
  await transpile(out, ['agent', 'lib', 'test/support/pipeline.ts', 'bench/agent-rss.ts']);
  return withScratch(async (s) => {
    // With this process's Node flags: npm run bench:agent gives the image's.
    const flags = [...new Set([...process.execArgv, '--expose-gc'])];
    const { stdout } = await promisify(execFile)(process.execPath, [...flags, join(out, 'bench', 'agent-rss.js'), s.ns, String(ports), backend], { maxBuffer: 1 << 20 });
    return JSON.parse(stdout.trim().split('\n').pop()!) as Memory;
  });
}
