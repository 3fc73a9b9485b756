// npm run bench:controller-rss — the controller's memory under a churn of
// Services, as its image runs it: the bundled CLI (npm run bundle, built into
// .cache) started by `node <flags> pier.mjs controller`, against a real
// kube-apiserver and etcd (test/cluster), with Node objects and fresh agent
// Leases so that it allocates and writes statuses. Per variant of Node flags
// it reads VmRSS from /proc/<pid>/status every 100 ms: settled before the
// churn, the peak during and after it, settled after, and how long after the
// churn RSS came back. The churn: N dual-stack Services (one EndpointSlice
// per family, as the EndpointSlice controller writes them), created at an
// even pace over the churn's duration, each deleted with its slices as soon
// as its status arrives. "Responsive" means every one got its status; the
// latency is from the Service stored to its status seen through a watch.
//
//   PIER_BENCH_CHURN=1000              Services created and deleted
//   PIER_BENCH_CHURN_SECONDS=90        over this long
//   PIER_BENCH_BACKGROUND=100          Services present throughout (written by the first variant)
//   PIER_BENCH_SETTLE=30               seconds of samples before the churn ("settled before": the mean of the last 10 s)
//   PIER_BENCH_AFTER=120               seconds after the churn to wait for RSS to come back
//   PIER_BENCH_NODE_FLAGS='--max-semi-space-size=1|'
//                                      Node flags of each controller run, `|`-separated, on node's
//                                      command line as the image's ENTRYPOINT gives them; an empty
//                                      entry: Node's defaults. Default: Dockerfile.controller's
//                                      ENTRYPOINT flags, then Node's defaults (once if the same)
//
// "Back" means within 10 % (at least 10 MB) of settled-before; once RSS has
// stayed back for 15 s the run ends early, and "settled after" is the mean of
// those 15 s (else of the last 10 s of the window).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { CoreV1Api, DiscoveryV1Api } from '@kubernetes/client-node';
import { execa, type ResultPromise } from 'execa';
import type { LeaseRenewer } from '../lib/lease.ts';
import { fakeAgents } from './fake-agents.ts';
import { ensureNamespace, registerNode, startControlPlane } from '../test/cluster/controlplane.ts';
import { atExit } from '../test/support/cleanup.ts';
import { Fleet, StatusWatch, fleetItems, summarize, type FleetSpec } from '../test/support/fleet.ts';
import { node as nodeObject } from '../test/support/objects.ts';
import { freePort } from '../test/support/ports.ts';
import { bundleInto } from '../scripts/bundle.ts';
import { shippedNodeFlags } from './shipped-flags.ts';
import { ROOT } from './transpile.ts';

const CHURN = Number(process.env['PIER_BENCH_CHURN'] ?? '1000');
const CHURN_MS = Number(process.env['PIER_BENCH_CHURN_SECONDS'] ?? '90') * 1000;
const BACKGROUND = Number(process.env['PIER_BENCH_BACKGROUND'] ?? '100');
const SETTLE_MS = Number(process.env['PIER_BENCH_SETTLE'] ?? '30') * 1000;
const AFTER_MS = Number(process.env['PIER_BENCH_AFTER'] ?? '120') * 1000;
const variants = [...new Set((process.env['PIER_BENCH_NODE_FLAGS'] ?? `${shippedNodeFlags('Dockerfile.controller').join(' ')}|`).split('|').map((v) => v.trim()))];
const SAMPLE_MS = 100;
const BACK_FOR_MS = 15_000;
/** A Service whose status has not come by then is deleted anyway and counted as missed. */
const STATUS_TIMEOUT_MS = 30_000;

const NODES = [
  { name: 'n1', v4: '198.51.100.11', v6: '2001:db8:0:1::11' },
  { name: 'n2', v4: '198.51.100.12', v6: '2001:db8:0:1::12' },
];
const SYSTEM = 'pier-system';

const mb = (kb: number) => `${(kb / 1024).toFixed(0)} MB`;
const row = (label: string, value: string) => process.stdout.write(`${label.padEnd(52)} ${value}\n`);
const label = (flags: string) => (flags === '' ? 'node (defaults)' : `node ${flags}`);
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

/** Dual-stack Services with an endpoint on each node, as `kubectl expose` and the EndpointSlice controller leave them. */
function spec(namespace: string, prefix: string, count: number, firstPort: number): FleetSpec {
  return {
    namespace,
    prefix,
    count,
    firstPort,
    targetPort: 8080,
    endpoints: {
      IPv4: NODES.map((n, i) => ({ address: `198.19.${i + 1}.10`, nodeName: n.name })),
      IPv6: NODES.map((n, i) => ({ address: `2001:db8:19:${i + 1}::10`, nodeName: n.name })),
    },
  };
}

interface Sample {
  at: number;
  rssKb: number;
}

function status(pid: number): { rssKb: number; hwmKb: number } {
  const text = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? NaN);
  return { rssKb: kb('VmRSS'), hwmKb: kb('VmHWM') };
}

/** `pier controller` as its image starts it: `node <flags> pier.mjs controller`, NODE_ENV=production. */
class Controller {
  readonly proc: ResultPromise;
  readonly port: number;
  private stderr = '';
  exited: string | undefined;
  private readonly unregister: () => void;

  constructor(cli: string, kubeconfig: string, flags: string, port: number) {
    this.port = port;
    const env: Record<string, string | undefined> = { ...process.env, NODE_ENV: 'production' };
    delete env['NODE_OPTIONS'];
    // setpriv: a SIGKILLed benchmark takes the controller with it.
    this.proc = execa('setpriv', ['--pdeathsig', 'SIGKILL', '--', process.execPath, ...flags.split(' ').filter((f) => f !== ''), cli, 'controller',
      '--kubeconfig', kubeconfig,
      '--leader-elect-id', `bench-rss-${process.pid}-${port}`,
      '--health-address', '127.0.0.1',
      '--health-port', String(port),
      '--log-level', 'warn',
    ], { env, extendEnv: false, stdin: 'ignore', stdout: 'ignore', reject: false });
    this.proc.stderr!.on('data', (d: Buffer) => (this.stderr = (this.stderr + d.toString()).slice(-20_000)));
    void this.proc.then((r) => (this.exited = String(r.exitCode ?? r.signal)));
    this.unregister = atExit(() => this.proc.kill('SIGKILL'));
  }

  get pid(): number {
    return this.proc.pid!;
  }

  log(): string {
    return this.stderr.slice(-5000);
  }

  async leading(timeoutMs = 60_000): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const res = await fetch(`http://127.0.0.1:${this.port}/readyz`).catch(() => undefined);
      if (res?.ok && (await res.text()).startsWith('leader')) return;
      if (this.exited !== undefined || performance.now() > deadline) throw new Error(`controller not leading (${this.exited ?? 'running'}):\n${this.log()}`);
      await sleep(50);
    }
  }

  /** V8's heap as the controller's metrics report it. */
  async heap(): Promise<{ usedBytes: number; totalBytes: number }> {
    const text = await (await fetch(`http://127.0.0.1:${this.port}/metrics`)).text();
    const gauge = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1] ?? NaN);
    return { usedBytes: gauge('nodejs_heap_size_used_bytes'), totalBytes: gauge('nodejs_heap_size_total_bytes') };
  }

  cpuSeconds(): number {
    const stat = readFileSync(`/proc/${this.pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100;
  }

  async stop(): Promise<void> {
    this.proc.kill('SIGTERM');
    const t = setTimeout(() => this.proc.kill('SIGKILL'), 15_000);
    await this.proc;
    clearTimeout(t);
    this.unregister();
  }
}

interface Run {
  flags: string;
  exited?: string;
  settledBeforeKb: number;
  peakKb: number;
  hwmKb: number;
  settledAfterKb: number;
  /** ms after the churn's last delete until RSS was back; NaN if it never was. */
  backMs: number;
  heapBefore: { usedBytes: number; totalBytes: number };
  heapAfter: { usedBytes: number; totalBytes: number };
  churnMs: number;
  cpuSeconds: number;
  statuses: number;
  missed: number;
  latency: { p50: number; p99: number; max: number };
}

async function measure(cli: string, kubeconfig: string, fleet: Fleet, flags: string, k: number): Promise<Run> {
  const core = fleet.kc.makeApiClient(CoreV1Api);
  const discovery = fleet.kc.makeApiClient(DiscoveryV1Api);
  const controller = new Controller(cli, kubeconfig, flags, await freePort());
  const samples: Sample[] = [];
  const sampler = setInterval(() => {
    if (controller.exited === undefined) samples.push({ at: performance.now(), rssKb: status(controller.pid).rssKb });
  }, SAMPLE_MS);
  const watch = await StatusWatch.start(fleet.kc, 'churn');
  try {
    await controller.leading();
    // The background's statuses: written by the first variant, already there for the rest.
    const background = await StatusWatch.start(fleet.kc, 'background');
    try {
      await background.waitFor(fleetItems(spec('background', 'bg-', BACKGROUND, 10000)).map((i) => i.name), 120_000);
    } finally {
      background.stop();
    }
    const settleFrom = performance.now();
    await sleep(SETTLE_MS);
    const before = samples.filter((s) => s.at >= performance.now() - 10_000);
    const settledBeforeKb = mean(before.map((s) => s.rssKb));
    const heapBefore = await controller.heap();

    // The churn: one create every CHURN_MS / CHURN, each Service deleted (with its slices) once its status is seen.
    const churn = spec('churn', `v${k}-`, CHURN, 20000);
    const items = fleetItems(churn);
    const latencies: number[] = [];
    let missed = 0;
    const cpu0 = controller.cpuSeconds();
    const t0 = performance.now();
    const lifecycles: Promise<void>[] = [];
    for (const [i, item] of items.entries()) {
      const wait = t0 + (i * CHURN_MS) / CHURN - performance.now();
      if (wait > 0) await sleep(wait);
      if (controller.exited !== undefined) break;
      lifecycles.push(
        (async () => {
          const { storedAt } = await fleet.createOne(churn, item);
          try {
            const [seen] = await watch.waitFor([item.name], STATUS_TIMEOUT_MS);
            latencies.push(seen!.at - storedAt);
          } catch {
            missed++;
          }
          await core.deleteNamespacedService({ name: item.name, namespace: churn.namespace });
          for (const family of ['ipv4', 'ipv6']) await discovery.deleteNamespacedEndpointSlice({ name: `${item.name}-${family}`, namespace: churn.namespace });
        })(),
      );
    }
    await Promise.all(lifecycles);
    const churnEnd = performance.now();
    const cpuSeconds = controller.cpuSeconds() - cpu0;

    // After: until RSS has been back for BACK_FOR_MS, or AFTER_MS.
    const back = (kb: number) => kb <= settledBeforeKb + Math.max(10 * 1024, settledBeforeKb * 0.1);
    let backSince: number | undefined;
    while (performance.now() - churnEnd < AFTER_MS && controller.exited === undefined) {
      await sleep(500);
      const recent = samples.filter((s) => s.at > performance.now() - 500);
      for (const s of recent) {
        if (!back(s.rssKb)) backSince = undefined;
        else backSince ??= s.at;
      }
      if (backSince !== undefined && performance.now() - backSince >= BACK_FOR_MS) break;
    }
    const tail = backSince !== undefined && performance.now() - backSince >= BACK_FOR_MS ? samples.filter((s) => s.at >= backSince!) : samples.filter((s) => s.at >= performance.now() - 10_000);
    const during = samples.filter((s) => s.at >= settleFrom);
    const { hwmKb } = controller.exited === undefined ? status(controller.pid) : { hwmKb: NaN };
    return {
      flags,
      ...(controller.exited !== undefined ? { exited: `${controller.exited}: ${controller.log()}` } : {}),
      settledBeforeKb,
      peakKb: Math.max(...during.map((s) => s.rssKb)),
      hwmKb,
      settledAfterKb: mean(tail.map((s) => s.rssKb)),
      backMs: backSince === undefined ? NaN : Math.max(0, backSince - churnEnd),
      heapBefore,
      heapAfter: controller.exited === undefined ? await controller.heap() : { usedBytes: NaN, totalBytes: NaN },
      churnMs: churnEnd - t0,
      cpuSeconds,
      statuses: latencies.length,
      missed,
      latency: summarize(latencies),
    };
  } finally {
    clearInterval(sampler);
    watch.stop();
    await controller.stop();
  }
}

const cp = await startControlPlane();
let agents: LeaseRenewer[] = [];
try {
  const fleet = new Fleet(cp.admin);
  const core = fleet.kc.makeApiClient(CoreV1Api);
  for (const ns of [SYSTEM, 'background', 'churn']) await ensureNamespace(core, ns);
  for (const n of NODES) await registerNode(core, nodeObject(n.name, [{ type: 'InternalIP', address: n.v4 }, { type: 'InternalIP', address: n.v6 }]));
  agents = fakeAgents(fleet.kc, NODES.map((n) => n.name), SYSTEM);
  await fleet.create(spec('background', 'bg-', BACKGROUND, 10000), { concurrency: 20 });
  const cli = await bundleInto(join(ROOT, '.cache', 'bench-controller-rss'));
  process.stdout.write(
    `pier controller (the bundle, as the image runs it) against a real API server: ${NODES.length} Nodes with fresh agent Leases, ${BACKGROUND} dual-stack Services present, ` +
      `then ${CHURN} created and deleted over ${CHURN_MS / 1000} s (each deleted once its status arrives); RSS sampled every ${SAMPLE_MS} ms\n`,
  );
  const runs: Run[] = [];
  for (const [k, flags] of variants.entries()) {
    process.stderr.write(`[bench] ${label(flags)}\n`);
    const r = await measure(cli, cp.adminKubeconfigPath, fleet, flags, k);
    runs.push(r);
    process.stdout.write(`\n${label(flags)}\n`);
    if (r.exited) row('  EXITED', r.exited);
    row('  settled before (mean of the last 10 s)', `${mb(r.settledBeforeKb)} (V8 heap ${(r.heapBefore.usedBytes / 2 ** 20).toFixed(0)} used of ${(r.heapBefore.totalBytes / 2 ** 20).toFixed(0)} MB)`);
    row('  peak (100 ms samples; VmHWM)', `${mb(r.peakKb)} (${mb(r.hwmKb)})`);
    row('  settled after', `${mb(r.settledAfterKb)} (V8 heap ${(r.heapAfter.usedBytes / 2 ** 20).toFixed(0)} used of ${(r.heapAfter.totalBytes / 2 ** 20).toFixed(0)} MB)`);
    row('  back after the churn', Number.isNaN(r.backMs) ? `not within ${AFTER_MS / 1000} s` : `${(r.backMs / 1000).toFixed(1)} s`);
    row('  churn took (last delete)', `${(r.churnMs / 1000).toFixed(1)} s, controller CPU ${r.cpuSeconds.toFixed(1)} s`);
    row('  statuses written', `${r.statuses} of ${CHURN}${r.missed ? ` (${r.missed} missed after ${STATUS_TIMEOUT_MS / 1000} s)` : ''}`);
    row('  stored -> status seen', `p50 ${r.latency.p50.toFixed(0)} ms, p99 ${r.latency.p99.toFixed(0)} ms, max ${r.latency.max.toFixed(0)} ms`);
  }
  process.stdout.write(`\n${JSON.stringify({ churn: CHURN, churnSeconds: CHURN_MS / 1000, background: BACKGROUND, runs })}\n`);
} finally {
  await Promise.all(agents.map((a) => a.stop()));
  await cp.stop();
}
