// npm run bench:agent — the agent's sync costs against the floor, in scratch
// network namespaces (root needed). Prints a table of times and the ratios
// the agent issue sets targets for. Every step is the agent's real pipeline
// (buildModel -> renderRuleset -> Applier.apply with iptables-restore).
//
//   PIER_BENCH_SIZES=100,1000,10000   service ports for the cold syncs
//   PIER_BENCH_REPEAT=5               repetitions of the small measurements (median)
//   PIER_BENCH_BACKEND=nft|legacy
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { Applier } from '../agent/applier.ts';
import { Xtables, commandRunner, type Backend } from '../agent/iptables.ts';
import { buildModel } from '../agent/model.ts';
import { renderRuleset, type Ruleset } from '../agent/render.ts';
import { restoreText, splitRule } from '../agent/restore.ts';
import { LOAD_BALANCER_CLASS } from '../lib/contract.ts';
import { scratchNamespace, type Scratch } from '../test/lab/scratch.ts';

const NODE = 'bench-node';
const NODE_IP = '198.51.100.11';
const sizes = (process.env['PIER_BENCH_SIZES'] ?? '100,1000,10000').split(',').map(Number);
const repeat = Number(process.env['PIER_BENCH_REPEAT'] ?? '5');
const backend = (process.env['PIER_BENCH_BACKEND'] ?? 'nft') as Backend;

function services(n: number, generation = 0): { services: V1Service[]; slices: V1EndpointSlice[] } {
  const svcs: V1Service[] = [];
  const slices: V1EndpointSlice[] = [];
  for (let i = 0; i < n; i++) {
    const name = `svc-${i}`;
    const port = 20000 + i;
    svcs.push({
      metadata: { namespace: 'bench', name, uid: `uid-${i}` },
      spec: { type: 'LoadBalancer', loadBalancerClass: LOAD_BALANCER_CLASS, ports: [{ name: 'p', port, protocol: 'TCP', targetPort: 8080 }] },
      status: { loadBalancer: { ingress: [{ ip: NODE_IP, ipMode: 'Proxy', ports: [{ port, protocol: 'TCP' }] }] } },
    });
    // Two endpoints each; `generation` moves the first service's endpoints to model "one change".
    const base = i === 0 ? generation : 0;
    const a = (k: number) => `198.19.${(Math.floor((i * 2 + k) / 250) + base) % 250}.${((i * 2 + k) % 250) + 1}`;
    slices.push({
      metadata: { namespace: 'bench', name: `${name}-1`, labels: { 'kubernetes.io/service-name': name } },
      addressType: 'IPv4',
      endpoints: [0, 1].map((k) => ({ addresses: [a(k)], nodeName: NODE, conditions: { ready: true } })),
      ports: [{ name: 'p', port: 8080, protocol: 'TCP' }],
    });
  }
  return { services: svcs, slices };
}

function render(n: number, generation = 0): Ruleset {
  const objs = services(n, generation);
  const model = buildModel({
    nodeName: NODE,
    nodeAddresses: [NODE_IP],
    ...objs,
    config: { loadBalancerClass: LOAD_BALANCER_CLASS, defaultClass: false, maxPortsPerService: 256 },
  });
  return renderRuleset(model.ipv4, { markBit: 0x2000 });
}

const ms = (t0: number) => performance.now() - t0;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function withScratch<T>(fn: (s: Scratch, xt: Xtables) => Promise<T>): Promise<T> {
  const s = await scratchNamespace();
  try {
    return await fn(s, new Xtables('ipv4', backend, commandRunner(['ip', 'netns', 'exec', s.ns])));
  } finally {
    await s.destroy();
  }
}

const rows: [string, string][] = [];
const row = (what: string, value: string) => {
  rows.push([what, value]);
  process.stdout.write(`${what.padEnd(58)} ${value}\n`);
};
const fmt = (x: number) => `${x.toFixed(1)} ms`;

process.stdout.write(`pier agent benchmark: iptables ${backend}, ${repeat} repetitions for small steps\n\n`);
const cold = new Map<number, { agent: number; raw: number }>();
const change = new Map<number, number>();
for (const n of sizes) {
  // The floor: iptables-restore of the same payload into an empty namespace.
  const ruleset = render(n);
  const payload = restoreText(ruleset);
  const rules = [...ruleset.tables.nat.chains.values(), ...ruleset.tables.filter.chains.values()].reduce((a, r) => a + r.length, 0);
  const chains = ruleset.tables.nat.chains.size + ruleset.tables.filter.chains.size;
  const raw = await withScratch(async (_s, xt) => {
    const t0 = performance.now();
    await xt.restore(payload);
    return ms(t0);
  });
  // The agent: model + render + full apply (save, restore, jumps) from scratch.
  const { agent, noop, changed } = await withScratch(async (_s, xt) => {
    const applier = new Applier(xt);
    const t0 = performance.now();
    await applier.apply(render(n));
    const agent = ms(t0);
    const noops: number[] = [];
    const changes: number[] = [];
    for (let r = 0; r < repeat; r++) {
      let t = performance.now();
      const res = await applier.apply(render(n, r));
      noops.push(ms(t));
      if (res.mode !== 'noop') throw new Error(`expected a no-op sync, got ${res.mode}`);
      t = performance.now();
      const c = await applier.apply(render(n, r + 1));
      changes.push(ms(t));
      if (c.mode !== 'partial') throw new Error(`expected a partial sync, got ${c.mode}`);
    }
    return { agent, noop: median(noops), changed: median(changes) };
  });
  cold.set(n, { agent, raw });
  change.set(n, changed);
  row(`${n} ports: ${rules} rules in ${chains} chains, cold sync`, `${fmt(agent)} (raw restore ${fmt(raw)}, ratio ${(agent / raw).toFixed(2)})`);
  row(`${n} ports: no-op sync (model + render + diff)`, fmt(noop));
  row(`${n} ports: one Service changed`, fmt(changed));
}

// The seed's way: one iptables command per rule.
const perRuleN = 1000;
if (sizes.includes(perRuleN)) {
  const rs = render(perRuleN);
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

const big = Math.max(...sizes);
const small = Math.min(...sizes);
global.gc?.();
row(`process RSS after the ${big}-port runs`, `${(process.memoryUsage().rss / 1024 / 1024).toFixed(0)} MB`);
if (sizes.length > 1) row(`one change at ${big} / one change at ${small}`, `${(change.get(big)! / change.get(small)!).toFixed(2)}x`);
