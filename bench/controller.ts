// npm run bench:controller — the controller against a real API server (and,
// for the latency, with agents in the network lab). Prints what it measures
// as it goes, then a results table with ratios and a PASS/MISS line per
// target of the controller's issue. See bench/README.md for what each
// number means and why the floors are what they are.
//
//   PIER_BENCH_SERVICES=1000              N
//   PIER_BENCH_RSS_SERVICES=10000         the large size for memory (0: skip)
//   PIER_BENCH_FLOOR_CONCURRENCY=8,16,32  the status floor at more than the controller's 4 in flight
//   PIER_BENCH_CREATE_CONCURRENCY=20      creates in flight, as a script applying many objects
//   PIER_BENCH_BURST_REPEAT=3             burst floor + pier burst pairs (each adds N pier Services)
//   PIER_BENCH_BACKLOG_REPEAT=5           status floor + pier backlog pairs
//   PIER_BENCH_LATENCY_SAMPLES=100        per agent setting (0: skip the lab)
//   PIER_BENCH_LATENCY_SETTINGS=default,50ms   agent --min-sync-interval: its default (250 ms), then 50 ms
import { CoreV1Api, EventsV1Api, KubeConfig, V1MicroTime, type EventsV1Event, type V1Service } from '@kubernetes/client-node';
import { execa } from 'execa';
import { statusPatch } from '../controller/status.ts';
import { requestOptions } from '../lib/kube.ts';
import type { LeaseRenewer } from '../lib/lease.ts';
import { fakeAgents } from './fake-agents.ts';
import { ensureNamespace, registerNode, startControlPlane, type ControlPlane } from '../test/cluster/controlplane.ts';
import { Fleet, StatusWatch, fleetItems, inParallel, summarize, type FleetItem, type FleetSpec } from '../test/support/fleet.ts';
import { node as nodeObject } from '../test/support/objects.ts';
import { latencyInLab, type AgentSetting } from './controller-latency.ts';
import { ControllerProcess, type Memory } from './controller-process.ts';

const N = Number(process.env['PIER_BENCH_SERVICES'] ?? '1000');
const RSS_N = Number(process.env['PIER_BENCH_RSS_SERVICES'] ?? '10000');
const FLOOR_CONCURRENCY = (process.env['PIER_BENCH_FLOOR_CONCURRENCY'] ?? '8,16,32').split(',').filter(Boolean).map(Number);
const CREATE_CONCURRENCY = Number(process.env['PIER_BENCH_CREATE_CONCURRENCY'] ?? '20');
const LATENCY_SAMPLES = Number(process.env['PIER_BENCH_LATENCY_SAMPLES'] ?? '100');
const LATENCY_SETTINGS = (process.env['PIER_BENCH_LATENCY_SETTINGS'] ?? 'default,50ms').split(',').filter(Boolean);
/** The controller's --workers default: the status floor writes with as many in flight. */
const WORKERS = 4;
const BURST_REPEAT = Number(process.env['PIER_BENCH_BURST_REPEAT'] ?? '3');
const BACKLOG_REPEAT = Number(process.env['PIER_BENCH_BACKLOG_REPEAT'] ?? '5');

// Targets from the controller's issue.
const THROUGHPUT_RATIO = 0.8;
const LATENCY_P99_MS = 1000;

const NODES = [
  { name: 'n1', v4: '198.51.100.11', v6: '2001:db8:0:1::11' },
  { name: 'n2', v4: '198.51.100.12', v6: '2001:db8:0:1::12' },
];
const SYSTEM = 'pier-system';
const NOT_PIER = 'bench.pier.dev/not-pier';
const FIELD_MANAGER = 'pier-controller';

const perSecond = (n: number, ms: number) => (n / ms) * 1000;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)]!;
const fmtMs = (x: number) => (x >= 10_000 ? `${(x / 1000).toFixed(1)} s` : `${x.toFixed(0)} ms`);
const fmtRate = (n: number, ms: number) => `${perSecond(n, ms).toFixed(0)} Services/s`;
const mb = (b: number) => `${(b / 1024 / 1024).toFixed(0)} MB`;
const row = (label: string, value: string) => process.stdout.write(`${label.padEnd(78)} ${value}\n`);
const note = (s: string) => process.stdout.write(`${s}\n`);

interface Result {
  label: string;
  rate?: number;
  ratio?: number;
  value?: string;
}
const table: Result[] = [];
const targets: { target: string; value: string; ok: boolean }[] = [];

/** Single-stack IPv4 Services with an endpoint on each node; nothing connects to them here. */
function throughputSpec(namespace: string, count: number, first: number, loadBalancerClass?: string): FleetSpec {
  return {
    namespace,
    prefix: 'svc-',
    count,
    first,
    firstPort: 20000,
    targetPort: 8080,
    endpoints: { IPv4: NODES.map((n, i) => ({ address: `198.19.${i + 1}.10`, nodeName: n.name })) },
    ...(loadBalancerClass ? { loadBalancerClass } : {}),
  };
}


/**
 * What pier writes for a Service served on both nodes, as the controller
 * builds it (controller/status.ts: ingress, condition, resourceVersion).
 * `round` moves the port so that every floor round is a real change.
 */
function pierPatch(current: V1Service, item: FleetItem, round: number) {
  const port = item.port + round;
  const ips = NODES.map((n) => n.v4);
  return statusPatch(current, {
    ingress: ips.map((ip) => ({ ip, ipMode: 'Proxy' as const, ports: [{ port, protocol: 'TCP' }] })),
    condition: { status: 'True', reason: 'Serving', message: `served on ${ips.join(', ')}, 1 port ${port}/TCP` },
  })!;
}

async function patchStatus(core: CoreV1Api, current: V1Service, item: FleetItem, round: number): Promise<V1Service> {
  return core.patchNamespacedServiceStatus(
    { name: item.name, namespace: current.metadata!.namespace!, body: pierPatch(current, item, round), fieldManager: FIELD_MANAGER },
    requestOptions({ mergePatch: true, timeoutMs: 30_000 }),
  );
}

let eventSeq = 0;
/** The Event pier's EventRecorder creates after a first assignment. */
function assignedEvent(svc: V1Service): EventsV1Event {
  const now = Date.now();
  return {
    metadata: { name: `${svc.metadata!.name}.${(BigInt(now) * 1_000_000n + BigInt(eventSeq++)).toString(16)}`, namespace: svc.metadata!.namespace },
    eventTime: new V1MicroTime(now),
    reportingController: 'pier.dev/controller',
    reportingInstance: 'bench-floor',
    action: 'Allocate',
    reason: 'Assigned',
    note: `served on ${(svc.status?.loadBalancer?.ingress ?? []).map((i) => `${i.ip}:${i.ports?.[0]?.port}/TCP`).join(', ')}`,
    type: 'Normal',
    regarding: { apiVersion: 'v1', kind: 'Service', namespace: svc.metadata!.namespace, name: svc.metadata!.name, uid: svc.metadata!.uid },
  };
}

/**
 * One status-floor round over existing Services, `concurrency` in flight;
 * with `events`, each accepted patch is followed by an Event that is not
 * waited for, as pier does. Returns the time until the last patch returned.
 */
async function floorRound(kc: KubeConfig, current: Map<string, V1Service>, items: FleetItem[], concurrency: number, round: number, events = false): Promise<number> {
  const core = kc.makeApiClient(CoreV1Api);
  const eventsApi = kc.makeApiClient(EventsV1Api);
  const sent: Promise<unknown>[] = [];
  const t0 = performance.now();
  await inParallel(items, concurrency, async (item) => {
    const stored = await patchStatus(core, current.get(item.name)!, item, round);
    current.set(item.name, stored);
    if (events) sent.push(eventsApi.createNamespacedEvent({ namespace: stored.metadata!.namespace!, body: assignedEvent(stored) }));
  });
  const ms = performance.now() - t0;
  await Promise.all(sent);
  return ms;
}

/**
 * Runs a floor with the same watch open that times pier's runs, so that both
 * pay for delivering their changes to one watcher.
 */
async function whileWatched<T>(kc: KubeConfig, namespace: string, run: () => Promise<T>): Promise<T> {
  const watch = await StatusWatch.start(kc, namespace, () => false);
  try {
    return await run();
  } finally {
    watch.stop();
  }
}

/**
 * Creates a fleet while the controller runs, with one watch on statuses
 * started before the first create. Times are from the first create.
 */
async function timedFleet(kc: KubeConfig, fleet: Fleet, spec: FleetSpec, controller: ControllerProcess, concurrency: number) {
  const watch = await StatusWatch.start(kc, spec.namespace);
  const writesBefore = await controller.sum('pier_controller_status_writes_total');
  const events = kc.makeApiClient(EventsV1Api);
  // Only pier's: the API server writes some of its own (ClusterIPNotAllocated from its repair loop under a create burst).
  const pierEvents = async () => (await events.listNamespacedEvent({ namespace: spec.namespace })).items.filter((e) => e.reportingController === 'pier.dev/controller').length;
  const eventsBefore = await pierEvents();
  const cpuBefore = controller.cpuSeconds();
  try {
    const stored = new Map<string, number>();
    const t0 = performance.now();
    const items = await fleet.create(spec, { concurrency, onCreated: (item, at) => stored.set(item.name, at) });
    const createdMs = performance.now() - t0;
    const seen = await watch.waitFor(items.map((i) => i.name), 900_000);
    const lastStatusMs = Math.max(...seen.map((s) => s.at)) - t0;
    const cpu = controller.cpuSeconds() - cpuBefore;
    const eventsByLastStatus = (await pierEvents()) - eventsBefore;
    const lag = summarize(items.map((item, k) => seen[k]!.at - stored.get(item.name)!));
    const eventsDoneMs = (await controller.eventsWritten()) - t0;
    await controller.settle();
    const writes = (await controller.sum('pier_controller_status_writes_total')) - writesBefore;
    return { createdMs, lastStatusMs, lag, writes, eventsByLastStatus, events: (await pierEvents()) - eventsBefore, eventsDoneMs, cpu };
  } finally {
    watch.stop();
  }
}

async function throughputAndMemory(): Promise<void> {
  let cp: ControlPlane | undefined;
  let controller: ControllerProcess | undefined;
  let agents: LeaseRenewer[] = [];
  const memory = new Map<string, Memory>();
  try {
    cp = await startControlPlane();
    // The benchmark's own requests share connections, so that its client costs the API server as little as possible.
    const fleet = new Fleet(cp.admin);
    const kc = fleet.kc;
    const core = kc.makeApiClient(CoreV1Api);
    for (const ns of [SYSTEM, 'floor', 'floor-burst', 'bench']) await ensureNamespace(core, ns);
    for (const n of NODES) {
      await registerNode(core, nodeObject(n.name, [{ type: 'InternalIP', address: n.v4 }, { type: 'InternalIP', address: n.v6 }]));
    }
    agents = fakeAgents(kc, NODES.map((n) => n.name), SYSTEM);

    // -- Status floor: existing Services (of another class, so no controller would touch them).
    note(`\nstatus floor: a plain loop patching the status of ${N} existing Services`);
    const floorSpec = throughputSpec('floor', N, 0, NOT_PIER);
    const c0 = performance.now();
    const floorItems = await fleet.create(floorSpec, { concurrency: CREATE_CONCURRENCY });
    const createMs = performance.now() - c0;
    row(`creating them (Service + EndpointSlice, ${CREATE_CONCURRENCY} in flight)`, `${fmtMs(createMs)} (${fmtRate(N, createMs)})`);
    const floorCurrent = new Map((await core.listNamespacedService({ namespace: 'floor' })).items.map((s) => [s.metadata!.name!, s]));
    let round = 0;
    const at4 = [await floorRound(kc, floorCurrent, floorItems, WORKERS, round++), await floorRound(kc, floorCurrent, floorItems, WORKERS, round++)];
    const floorMs = Math.min(...at4);
    const floorRate = perSecond(N, floorMs);
    row(`${WORKERS} in flight (the controller's --workers), best of ${at4.map(fmtMs).join(', ')}`, `${fmtMs(floorMs)} (${fmtRate(N, floorMs)})`);
    table.push({ label: `status floor: ${N} patches, ${WORKERS} in flight`, rate: floorRate, ratio: 1 });
    for (const c of FLOOR_CONCURRENCY) {
      const ms = await floorRound(kc, floorCurrent, floorItems, c, round++);
      row(`${c} in flight`, `${fmtMs(ms)} (${fmtRate(N, ms)})`);
      table.push({ label: `status floor, ${c} in flight`, rate: perSecond(N, ms), ratio: perSecond(N, ms) / floorRate });
    }
    const withEvents = await floorRound(kc, floorCurrent, floorItems, WORKERS, round++, true);
    row(`${WORKERS} in flight, each patch followed by an Event as pier sends it`, `${fmtMs(withEvents)} (${fmtRate(N, withEvents)})`);
    table.push({ label: 'status floor + one Event per Service (what pier writes)', rate: perSecond(N, withEvents), ratio: perSecond(N, withEvents) / floorRate });
    const plain = await floorRound(cp.admin, floorCurrent, floorItems, WORKERS, round++);
    row(`${WORKERS} in flight, client-node as it comes (a new TLS connection per request)`, `${fmtMs(plain)} (${fmtRate(N, plain)})`);
    table.push({ label: 'status floor, client-node without connection reuse', rate: perSecond(N, plain), ratio: perSecond(N, plain) / floorRate });
    await fleet.deleteServices('floor', floorItems.map((i) => i.name), CREATE_CONCURRENCY);

    // Background load on this machine drifts; each pier run is paired with a
    // floor run right before it, and the ratio is taken per pair.

    // -- Burst: N Services created at once. Floor: the same creates, each status patched the moment
    //    its Service exists (a controller with no delay at all), no controller running. pier: the
    //    controller runs while the same creates happen.
    note(`\nburst: ${N} Services created at once (${CREATE_CONCURRENCY} in flight); floor = each status patched by the creating lane right after its create`);
    const burstRatios: number[] = [];
    for (let rep = 0; rep < BURST_REPEAT; rep++) {
      const floorSpec = throughputSpec('floor-burst', N, rep * N, NOT_PIER);
      const floorBurstMs = await whileWatched(kc, 'floor-burst', async () => {
        const b0 = performance.now();
        await inParallel(fleetItems(floorSpec), CREATE_CONCURRENCY, async (item) => {
          const { service } = await fleet.createOne(floorSpec, item);
          await patchStatus(core, service, item, 0);
        });
        return performance.now() - b0;
      });
      await fleet.deleteServices('floor-burst', fleetItems(floorSpec).map((i) => i.name), CREATE_CONCURRENCY);

      controller = await ControllerProcess.start(cp.adminKubeconfigPath);
      await controller.leading();
      const burst = await timedFleet(kc, fleet, throughputSpec('bench', N, rep * N), controller, CREATE_CONCURRENCY);
      const ratio = floorBurstMs / burst.lastStatusMs;
      burstRatios.push(ratio);
      row(`run ${rep + 1}: floor, first create -> last status`, `${fmtMs(floorBurstMs)} (${fmtRate(N, floorBurstMs)})`);
      row(`run ${rep + 1}: pier, first create -> all have status (${rep * N} pier Services already there)`, `${fmtMs(burst.lastStatusMs)} (${fmtRate(N, burst.lastStatusMs)}, ${ratio.toFixed(2)}x the floor)`);
      row(`  creating them alone; last status after the last create`, `${fmtMs(burst.createdMs)} (${fmtRate(N, burst.createdMs)}); ${fmtMs(burst.lastStatusMs - burst.createdMs)}`);
      row(`  per Service, Service stored -> status seen: p50 / p99 / max`, `${fmtMs(burst.lag.p50)} / ${fmtMs(burst.lag.p99)} / ${fmtMs(burst.lag.max)}`);
      row(`  status patches; controller CPU until the last status`, `${burst.writes}; ${burst.cpu.toFixed(1)} s (${((burst.cpu / burst.lastStatusMs) * 100_000).toFixed(0)} % of a core)`);
      row(`  Events written by the last status / in all; all written after`, `${burst.eventsByLastStatus} / ${burst.events}; ${fmtMs(burst.eventsDoneMs)}`);
      table.push({ label: `burst floor, run ${rep + 1}`, rate: perSecond(N, floorBurstMs), ratio: 1 });
      table.push({ label: `pier burst, run ${rep + 1}: until all ${N} have status`, rate: perSecond(N, burst.lastStatusMs), ratio });
      if (rep === 0) memory.set(`${N} Services, after the first burst`, await controller.settle());
      await controller.stop();
      controller = undefined;
    }
    const burstRatio = median(burstRatios);
    if (burstRatios.length > 0) targets.push({ target: `burst of ${N}: Services/s >= ${THROUGHPUT_RATIO}x the burst floor (median of ${BURST_REPEAT})`, value: `${burstRatio.toFixed(2)}x`, ok: burstRatio >= THROUGHPUT_RATIO });

    // -- Backlog: N existing pier Services whose statuses a plain loop has just changed (the floor,
    //    same patches as pier's, 4 in flight) while no controller runs; then a controller starts and
    //    puts them all back: status writes alone, against the floor that made them necessary.
    const present = BURST_REPEAT * N;
    note(`\nbacklog: the statuses of ${N} of the ${present} pier Services changed while no controller runs (the floor, ${WORKERS} in flight), then a controller started`);
    const backlogItems = fleetItems(throughputSpec('bench', N, 0));
    const current = new Map((await core.listNamespacedService({ namespace: 'bench' })).items.map((s) => [s.metadata!.name!, s]));
    const backlogRatios: number[] = [];
    for (let rep = 0; rep < BACKLOG_REPEAT; rep++) {
      const floorRunMs = await whileWatched(kc, 'bench', () => floorRound(kc, current, backlogItems, WORKERS, rep + 1));
      const restored = (svc: V1Service) => {
        const ingress = svc.status?.loadBalancer?.ingress ?? [];
        return ingress.length === NODES.length && ingress.every((i) => i.ports?.[0]?.port === svc.spec?.ports?.[0]?.port);
      };
      const watch = await StatusWatch.start(kc, 'bench', restored);
      try {
        controller = await ControllerProcess.start(cp.adminKubeconfigPath);
        const leadingAt = await controller.leading();
        const seen = await watch.waitFor(backlogItems.map((i) => i.name), 900_000);
        const cpu = controller.cpuSeconds();
        const first = Math.min(...seen.map((x) => x.at));
        const last = Math.max(...seen.map((x) => x.at));
        const fromLeading = last - leadingAt;
        const ratio = floorRunMs / fromLeading;
        backlogRatios.push(ratio);
        row(`run ${rep + 1}: floor, ${N} patches`, `${fmtMs(floorRunMs)} (${fmtRate(N, floorRunMs)})`);
        row(`run ${rep + 1}: pier, leading -> all ${N} rewritten`, `${fmtMs(fromLeading)} (${fmtRate(N, fromLeading)}, ${ratio.toFixed(2)}x the floor)`);
        row(`  process start -> leading (caches of ${present} Services synced, Lease held)`, fmtMs(leadingAt - controller.spawnedAt));
        row(`  first status -> last (writing alone)`, `${fmtMs(last - first)} (${fmtRate(N - 1, last - first)}, ${(floorRunMs / (last - first)).toFixed(2)}x)`);
        const eventsDoneMs = (await controller.eventsWritten()) - leadingAt;
        await controller.settle();
        row(`  leading -> all Events written (they wait for the status writes to pause)`, fmtMs(eventsDoneMs));
        row(`  status patches / controller CPU from process start to the last status`, `${await controller.sum('pier_controller_status_writes_total')} / ${cpu.toFixed(1)} s`);
        table.push({ label: `status floor, run ${rep + 1}`, rate: perSecond(N, floorRunMs), ratio: 1 });
        table.push({ label: `pier backlog, run ${rep + 1}: from leading until all rewritten`, rate: perSecond(N, fromLeading), ratio });
        if (rep === BACKLOG_REPEAT - 1) memory.set(`${present} Services, freshly started, after rewriting ${N}`, await controller.memory());
      } finally {
        watch.stop();
      }
      if (rep < BACKLOG_REPEAT - 1) {
        await controller.stop();
        controller = undefined;
      }
      // What the controller wrote is the starting point of the next floor round.
      for (const svc of (await core.listNamespacedService({ namespace: 'bench' })).items) current.set(svc.metadata!.name!, svc);
    }
    const backlogRatio = median(backlogRatios);
    targets.push({ target: `backlog of ${N}: Services/s >= ${THROUGHPUT_RATIO}x the status floor (median of ${BACKLOG_REPEAT})`, value: `${backlogRatio.toFixed(2)}x`, ok: backlogRatio >= THROUGHPUT_RATIO });

    // -- Scale: the rest up to RSS_N created while no controller runs (creating them under a running
    //    controller is the burst above, and slower to set up), then a controller that writes them all,
    //    then a restart that must write nothing.
    let running = controller!;
    if (RSS_N > present) {
      const more = RSS_N - present;
      note(`\nscale: ${more} more pier Services created while no controller runs (40 in flight), then a controller started, then restarted`);
      await running.stop();
      const c0 = performance.now();
      const moreItems = await fleet.create(throughputSpec('bench', more, present), { concurrency: 40 });
      row(`creating them`, `${fmtMs(performance.now() - c0)} (${fmtRate(more, performance.now() - c0)})`);
      const watch = await StatusWatch.start(kc, 'bench');
      try {
        controller = running = await ControllerProcess.start(cp.adminKubeconfigPath);
        const leadingAt = await running.leading(180_000);
        const seen = await watch.waitFor(moreItems.map((i) => i.name), 1_800_000);
        const last = Math.max(...seen.map((x) => x.at));
        row(`process start -> leading (caches of ${RSS_N} Services synced)`, fmtMs(leadingAt - running.spawnedAt));
        row(`leading -> all ${more} new have status`, `${fmtMs(last - leadingAt)} (${fmtRate(more, last - leadingAt)}); controller CPU ${running.cpuSeconds().toFixed(1)} s`);
        table.push({ label: `pier backlog of ${more} with ${RSS_N} present, from leading`, rate: perSecond(more, last - leadingAt), ratio: perSecond(more, last - leadingAt) / floorRate });
      } finally {
        watch.stop();
      }
      memory.set(`${RSS_N} Services, after writing ${more}`, await running.settle(5000));
      const m = await running.metrics();
      const allocs = m.get('pier_controller_allocate_duration_seconds_count') ?? 0;
      const allocSum = m.get('pier_controller_allocate_duration_seconds_sum') ?? 0;
      row(`  allocations computed, mean time of one`, `${allocs} (${fmtMs((allocSum / Math.max(1, allocs)) * 1000)})`);
      await running.stop();
      controller = running = await ControllerProcess.start(cp.adminKubeconfigPath);
      const leadingAt = await running.leading(180_000);
      const restart = await running.settle(5000);
      const writes = await running.sum('pier_controller_status_writes_total');
      row(`restart with ${RSS_N} present: process start -> leading`, fmtMs(leadingAt - running.spawnedAt));
      row(`  status patches after the restart (must be 0)`, String(writes));
      memory.set(`${RSS_N} Services, freshly restarted (nothing to write)`, restart);
      targets.push({ target: `restart with ${RSS_N} Services writes nothing`, value: String(writes), ok: writes === 0 });
    }
    await running.stop();
    controller = undefined;

    note('\ncontroller memory, settled (no writes for 3-5 s); peak = VmHWM of that process so far');
    for (const [label, m] of memory) {
      row(`  ${label}`, `RSS ${mb(m.rssBytes)}, peak ${mb(m.hwmBytes)}; V8 heap ${mb(m.heapUsedBytes)} used of ${mb(m.heapTotalBytes)}`);
      table.push({ label: `controller RSS, ${label}`, value: `${mb(m.rssBytes)} (peak ${mb(m.hwmBytes)})` });
    }
  } finally {
    await controller?.stop();
    await Promise.all(agents.map((a) => a.stop()));
    await cp?.stop();
  }
}

async function latency(): Promise<void> {
  note(`\ncreate -> first answered connection, ${N} Services present (lab: 2 nodes, an agent on each, the controller; one Service at a time)`);
  const settings: AgentSetting[] = LATENCY_SETTINGS.map((s) =>
    s === 'default' ? { label: 'agent defaults (--min-sync-interval 250ms)', args: [] } : { label: `agent --min-sync-interval ${s}`, args: ['--min-sync-interval', s] },
  );
  const run = await latencyInLab({ background: N, samples: LATENCY_SAMPLES, concurrency: CREATE_CONCURRENCY, settings, log: note });
  row(`background: ${N} dual-stack Services (3 objects each) created`, fmtMs(run.createMs));
  row(`  all have status / all answered on every listed address`, `${fmtMs(run.statusMs)} / ${fmtMs(run.answeredMs)}`);
  for (const r of run.results) {
    const s = r.summary;
    const value = `p50 ${fmtMs(s.p50)}, p99 ${fmtMs(s.p99)}, max ${fmtMs(s.max)}${r.failures ? `, ${r.failures} never answered` : ''}${r.unlisted ? `, ${r.unlisted} on an unlisted address` : ''}`;
    row(`${r.setting.label}, ${s.n} Services`, value);
    table.push({ label: `create -> answered, ${r.setting.label}`, value });
    targets.push({ target: `${r.setting.label}: p99 < ${LATENCY_P99_MS} ms`, value: fmtMs(s.p99), ok: s.p99 < LATENCY_P99_MS && r.failures === 0 && r.unlisted === 0 });
  }
}

const { stdout: before } = await execa('uptime', []);
note(`pier controller benchmark: N = ${N}; load before: ${before.trim()}`);
await throughputAndMemory();
if (LATENCY_SAMPLES > 0) await latency();

note('\nresults (ratio: to the floor of the same kind above it)');
for (const r of table) row(`  ${r.label}`, r.value ?? `${r.rate!.toFixed(0).padStart(5)} Services/s   ${r.ratio!.toFixed(2)}x`);
note('\ntargets');
for (const t of targets) row(`  ${t.target}`, `${t.value.padEnd(10)} ${t.ok ? 'PASS' : 'MISS'}`);
const { stdout: after } = await execa('uptime', []);
note(`\nload after: ${after.trim()}`);
