// node --expose-gc bench/allocate.ts — the controller's allocation alone, a
// pure function, on synthetic clusters: no API server, no timing asserted
// anywhere. Prints the median of a few runs per case, and what a Service's
// status weighs; then reallocate(), the incremental allocation the
// controller runs, after one change of the large cluster, with how many
// Services it re-judged.
//
//   PIER_BENCH_NODES=5000            nodes of the large cluster (dual-stack, each with a fresh agent Lease)
//   PIER_BENCH_SERVICES=10000        Services (8 in 10 Cluster IPv4, 1 in 10 dual-stack, 1 in 10 Local with 3 endpoint nodes)
//   PIER_BENCH_MAX_ADDRESSES=16      K (`all` for every node, as before the bound)
//   PIER_BENCH_RUNS=5
//   PIER_BENCH_ALLOCATE_FROM=path    another allocate.ts to time beside this one (say, an earlier commit's)
import type { V1EndpointSlice, V1Lease, V1Node, V1Service } from '@kubernetes/client-node';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

import * as current from '../controller/allocate.ts';
import type { AllocateInput, Allocation } from '../controller/allocate.ts';

const NODES = Number(process.env['PIER_BENCH_NODES'] ?? '5000');
const SERVICES = Number(process.env['PIER_BENCH_SERVICES'] ?? '10000');
const K = current.parseMaxAddresses(process.env['PIER_BENCH_MAX_ADDRESSES'] ?? String(current.DEFAULT_MAX_ADDRESSES));
const RUNS = Number(process.env['PIER_BENCH_RUNS'] ?? '5');
const NS = 'pier-system';
const NOW = Date.parse('2026-01-01T00:00:00Z');

if (K === undefined) throw new Error('PIER_BENCH_MAX_ADDRESSES: a positive integer or all');

type Allocate = (input: AllocateInput) => Allocation;

function node(i: number, ready = true): V1Node {
  return {
    metadata: { name: `node-${String(i).padStart(5, '0')}`, labels: {} },
    status: {
      // 198.18.0.0/15 (benchmarking) and 2001:db8::/32 (documentation).
      addresses: [
        { type: 'InternalIP', address: `198.18.${i >> 8}.${i & 255}` },
        { type: 'InternalIP', address: `2001:db8:1::${(i + 1).toString(16)}` },
      ],
      conditions: [{ type: 'Ready', status: ready ? 'True' : 'False' }],
    },
  };
}

function lease(i: number): V1Lease {
  return {
    metadata: { name: `pier-agent-node-${String(i).padStart(5, '0')}`, namespace: NS, annotations: { 'pier.dev/forwarding-ipv4': 'true', 'pier.dev/forwarding-ipv6': 'true' } },
    spec: { renewTime: new Date(NOW - 1000) as never, leaseDurationSeconds: 15 },
  };
}

function service(i: number): V1Service {
  const dual = i % 10 === 1;
  const local = i % 10 === 2;
  return {
    metadata: { namespace: `ns-${i % 50}`, name: `svc-${i}`, uid: `00000000-0000-4000-8000-${String(i).padStart(12, '0')}`, creationTimestamp: new Date(NOW - i * 1000) as never, resourceVersion: String(i) },
    spec: {
      type: 'LoadBalancer',
      loadBalancerClass: 'pier.dev/lb',
      // One port each, unique per Service, so that nothing conflicts and only addresses are measured.
      ports: [{ name: 'p', port: 1024 + (i % 60000), protocol: 'TCP', targetPort: 8080 as never }],
      ipFamilies: dual ? ['IPv4', 'IPv6'] : ['IPv4'],
      externalTrafficPolicy: local ? 'Local' : 'Cluster',
    },
    status: { loadBalancer: {} },
  };
}

function slices(i: number, nodes: number): V1EndpointSlice[] {
  if (i % 10 !== 2) return [];
  return [
    {
      addressType: 'IPv4',
      metadata: { namespace: `ns-${i % 50}`, name: `svc-${i}-a`, labels: { 'kubernetes.io/service-name': `svc-${i}` } },
      endpoints: [0, 1, 2].map((j) => ({ addresses: [`198.19.${j}.${i & 255}`], nodeName: `node-${String((i * 7 + j * 131) % nodes).padStart(5, '0')}`, conditions: { ready: true } })),
    },
  ];
}

/** The Services as the controller would leave them: its allocation in their status. */
function withStatus(services: V1Service[], allocation: Allocation): V1Service[] {
  return services.map((s) => {
    const a = allocation.services.get(`${s.metadata!.namespace}/${s.metadata!.name}`);
    return a ? { ...s, status: { loadBalancer: { ingress: a.ingress.map((x) => ({ ...x, ports: x.ports.map((p) => ({ ...p })) })) } } } : s;
  });
}

function median(xs: number[]): number {
  return [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)]!;
}

function time(label: string, allocate: Allocate, input: AllocateInput): Allocation {
  const ms: number[] = [];
  let out: Allocation | undefined;
  for (let r = 0; r < RUNS; r++) {
    globalThis.gc?.();
    const t0 = performance.now();
    out = allocate(input);
    ms.push(performance.now() - t0);
  }
  process.stdout.write(`${label.padEnd(72)} ${median(ms).toFixed(0).padStart(6)} ms  (runs: ${ms.map((x) => x.toFixed(0)).join(', ')})\n`);
  return out!;
}

function cluster(nodes: number, services: V1Service[], k: number): AllocateInput {
  return {
    services,
    nodes: Array.from({ length: nodes }, (_, i) => node(i)),
    slices: Array.from({ length: services.length }, (_, i) => slices(i, nodes)).flat(),
    leases: Array.from({ length: nodes }, (_, i) => lease(i)),
    now: NOW,
    config: current.defaultAllocatorConfig({ maxAddresses: k }),
  };
}

function changed(a: Allocation, b: Allocation): number {
  let n = 0;
  for (const [key, x] of a.services) if (x !== b.services.get(key) && JSON.stringify(x) !== JSON.stringify(b.services.get(key))) n++;
  for (const key of b.services.keys()) if (!a.services.has(key)) n++;
  return n;
}

async function main(): Promise<void> {
  const implementations: [string, Allocate][] = [['this tree', current.allocate]];
  const other = process.env['PIER_BENCH_ALLOCATE_FROM'];
  if (other) implementations.push([other, ((await import(pathToFileURL(resolve(other)).href)) as typeof current).allocate]);
  process.stdout.write(`allocate(): ${SERVICES} Services, K = ${current.formatMaxAddresses(K!)}, median of ${RUNS}${globalThis.gc ? '' : ' (run with --expose-gc for a collection before each run)'}\n`);
  const fresh = Array.from({ length: SERVICES }, (_, i) => service(i));

  for (const [name, allocate] of implementations) {
    process.stdout.write(`\n${name}\n`);
    // Small clusters: at most K eligible nodes, so no Service is hashed (bench:controller's case is 2 nodes).
    for (const nodes of [2, 16]) {
      const small = cluster(nodes, fresh, K!);
      time(`${nodes} nodes, no statuses`, allocate, small);
    }
    const big = cluster(NODES, fresh, K!);
    const first = time(`${NODES} nodes, no statuses`, allocate, big);
    const restarted = { ...big, services: withStatus(fresh, first) };
    const again = time(`${NODES} nodes, each Service's status as the controller wrote it (restart)`, allocate, restarted);
    process.stdout.write(`  Services changed by the restart: ${changed(first, again)}\n`);
    const lost = { ...restarted, nodes: restarted.nodes.map((n, i) => (i === 17 ? node(17, false) : n)) };
    const after = time(`${NODES} nodes, one of them NotReady`, allocate, lost);
    const victim = ['198.18.0.17', '2001:db8:1::12'];
    const listed = [...again.services.values()].filter((a) => a.ingress.some((x) => victim.includes(x.ip))).length;
    process.stdout.write(`  Services changed by the node's loss: ${changed(again, after)}; Services that listed it: ${listed}\n`);
    const sizes = [...first.services.values()].map((a) => JSON.stringify({ ingress: a.ingress }).length);
    process.stdout.write(`  status.loadBalancer per Service: max ${Math.max(...sizes)} bytes of JSON, ingress entries max ${Math.max(...[...first.services.values()].map((a) => a.ingress.length))}\n`);
    if (allocate !== current.allocate) continue;

    // The same changes, re-judging only what they affect, from the state of the run before.
    process.stdout.write(`\nreallocate(), ${NODES} nodes, from the state of the restart's allocation\n`);
    const from = (prev: current.AllocatorState | undefined) => {
      let rejudged = 0;
      const run = (input: AllocateInput) => {
        const out = current.reallocate(input, prev);
        rejudged = out.rejudged;
        return out;
      };
      return { run, rejudged: () => rejudged };
    };
    const cold = from(undefined);
    const settled = time(`no state (a cold start)`, cold.run, restarted) as current.Reallocation;
    process.stdout.write(`  re-judged ${cold.rejudged()}; equal to allocate(): ${changed(settled, again) === 0}\n`);
    const unchanged = from(settled.state);
    time('nothing changed', unchanged.run, restarted);
    process.stdout.write(`  re-judged ${unchanged.rejudged()}\n`);
    const loss = from(settled.state);
    const lostOut = time('one node NotReady', loss.run, lost) as current.Reallocation;
    process.stdout.write(`  re-judged ${loss.rejudged()}; Services changed: ${changed(again, lostOut)}; equal to allocate(): ${changed(lostOut, after) === 0}\n`);
    const back = from(lostOut.state);
    const backOut = time('the node Ready again', back.run, restarted) as current.Reallocation;
    process.stdout.write(`  re-judged ${back.rejudged()}; Services changed: ${changed(lostOut, backOut)}; equal to allocate(): ${changed(backOut, again) === 0}\n`);
    const added = { ...restarted, services: [...restarted.services, service(SERVICES)] };
    const add = from(settled.state);
    const addOut = time('one Service added', add.run, added) as current.Reallocation;
    process.stdout.write(`  re-judged ${add.rejudged()}; equal to allocate(): ${changed(addOut, allocate(added)) === 0}\n`);
  }
}

await main();
