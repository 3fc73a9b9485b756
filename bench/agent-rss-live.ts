// npm run bench:agent-rss — the agent's memory as a real agent has it: a real
// kube-apiserver and etcd (test/cluster), one Node and N pier LoadBalancer
// Services with their status written through the status subresource and one
// EndpointSlice of two endpoints each, and `pier agent --dry-run` as a child
// process, bundled as the images ship it and with their Node flags. Its
// informers list and watch the API server exactly as on a node; --dry-run
// only keeps the kernel out (it still builds its whole state and renders
// every rule). Reports, per variant of Node flags, the time to ready and
// VmRSS / VmHWM from /proc/<pid>/status: at ready, after settling, and after
// one Service's endpoints change through a watch event.
//
//   PIER_BENCH_SERVICES=10000          Services (one port each) and EndpointSlices (0: the floor only)
//   PIER_BENCH_CONCURRENCY=40          API requests in flight while creating them
//   PIER_BENCH_SETTLE=20               seconds to wait after ready before reading RSS
//   PIER_BENCH_NODE_FLAGS='--max-semi-space-size=1|'
//                                      Node flags of each agent run, `|`-separated, given
//                                      on node's command line as the image's ENTRYPOINT
//                                      does (some, like --no-opt, are refused in
//                                      NODE_OPTIONS); an empty entry: Node's defaults.
//                                      Default: the flags Dockerfile.agent's ENTRYPOINT
//                                      gives, then Node's defaults
//   PIER_BENCH_AGENT_SOURCE=1          run cmd/cli.ts through Node's type stripping instead
//   PIER_BENCH_HOLD=1                  keep the cluster up at the end (Ctrl-C cleans up)
//   PIER_BENCH_KUBECONFIG=<file>       measure against a cluster a held run left up
//                                      (its objects already created), not a new one
//   PIER_BENCH_AGENT_CLI=<file>        run this CLI instead of the bundle the images ship
//                                      (npm run bundle, built into .cache): another build,
//                                      for a before/after comparison
//
// Before it creates anything the bench measures the same agent against the
// empty cluster: the floor of Node, the agent's modules and its idle state.
import { execa, type ResultPromise } from 'execa';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { CoreV1Api, DiscoveryV1Api, PatchStrategy, setHeaderOptions, type V1EndpointSlice, type V1Service } from '@kubernetes/client-node';
import { LOAD_BALANCER_CLASS, READY_CONDITION } from '../lib/contract.ts';
import { loadKubeConfig } from '../lib/kube.ts';
import { ensureNamespace, registerNode, startControlPlane } from '../test/cluster/controlplane.ts';
import { inParallel } from '../test/support/fleet.ts';
import { node as nodeObject, lbService } from '../test/support/objects.ts';
import { bundleInto } from '../scripts/bundle.ts';
import { shippedNodeFlags } from './shipped-flags.ts';
import { ROOT } from './transpile.ts';

const NS = 'bench';
const NODE = 'bench-node';
const NODE_IP = '198.51.100.11';
const n = Number(process.env['PIER_BENCH_SERVICES'] ?? '10000');
const concurrency = Number(process.env['PIER_BENCH_CONCURRENCY'] ?? '40');
const settleMs = Number(process.env['PIER_BENCH_SETTLE'] ?? '20') * 1000;
const variants = (process.env['PIER_BENCH_NODE_FLAGS'] ?? `${shippedNodeFlags('Dockerfile.agent').join(' ')}|`).split('|').map((v) => v.trim());
const fromSource = process.env['PIER_BENCH_AGENT_SOURCE'] === '1';
const hold = process.env['PIER_BENCH_HOLD'] === '1';
const existing = process.env['PIER_BENCH_KUBECONFIG'];
const RSS_MB = 150;
const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);

const mb = (kb: number) => `${(kb / 1024).toFixed(0)} MB`;
const row = (label: string, value: string) => process.stdout.write(`${label.padEnd(58)} ${value}\n`);

/** Transient API errors (a 429 or 5xx while etcd compacts) are retried; anything else fails the bench. */
async function retrying<T>(what: string, call: () => Promise<T>): Promise<T> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await call();
    } catch (err) {
      const code = (err as { code?: number }).code;
      if (attempt >= 5 || (code !== undefined && code !== 429 && code < 500)) throw new Error(`${what}: ${(err as Error).message}`, { cause: err });
      await sleep(200 * 2 ** attempt);
    }
  }
}

/** Two endpoints on this node, as the EndpointSlice controller writes them; `generation` moves the first. */
function slice(i: number, owner: V1Service, generation = 0): V1EndpointSlice {
  const name = `svc-${i}`;
  const address = (k: number) => `198.19.${(Math.floor((i * 2 + k) / 250) + (k === 0 ? generation : 0)) % 250}.${((i * 2 + k) % 250) + 1}`;
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {
      name: `${name}-x7k2p`,
      namespace: NS,
      labels: { 'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io', 'kubernetes.io/service-name': name, app: name },
      annotations: { 'endpoints.kubernetes.io/last-change-trigger-time': new Date().toISOString().replace(/\.\d+Z$/, 'Z') },
      ownerReferences: [{ apiVersion: 'v1', kind: 'Service', name, uid: owner.metadata!.uid!, controller: true, blockOwnerDeletion: true }],
    },
    addressType: 'IPv4',
    endpoints: [0, 1].map((k) => ({
      addresses: [address(k)],
      conditions: { ready: true, serving: true, terminating: false },
      nodeName: NODE,
      targetRef: { kind: 'Pod', namespace: NS, name: `${name}-7d9f8-${k}`, uid: `00000000-0000-4000-8000-${(i * 2 + k).toString(16).padStart(12, '0')}` },
    })),
    ports: [{ name: 'p', protocol: 'TCP', port: 8080 }],
  };
}

/** The bundle the images ship, built as their Dockerfiles build it. */
function bundledAgent(): Promise<string> {
  return bundleInto(join(ROOT, '.cache', 'bench-rss-live'));
}

interface Memory {
  rssKb: number;
  hwmKb: number;
  /** The process's own memory; the rest of VmRSS is file pages (mostly the node binary), shared and reclaimable, so it varies with the machine's memory pressure. */
  anonKb: number;
  fileKb: number;
}

function memory(pid: number): Memory {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN);
  return { rssKb: kb('VmRSS'), hwmKb: kb('VmHWM'), anonKb: kb('RssAnon'), fileKb: kb('RssFile') };
}

interface Run {
  nodeFlags: string;
  /** Rules in the ipv4 nat table once ready: at least one per service port. */
  natRules: number;
  /** /readyz said ready before the rules held every Service: a sync from a partial cache. */
  readyEarly: boolean;
  readyMs: number;
  atReady: Memory;
  settled: Memory;
  afterChange: Memory;
  changeMs: number;
  dryRunBytes: number;
}

/**
 * One agent process from start to stop. `change` (when given) makes one
 * Service's endpoints move and returns a text the agent's rules hold only
 * once it has seen the change through its watch.
 */
async function runAgent(cli: string, kubeconfig: string, nodeFlags: string, services: number, change?: () => Promise<string>): Promise<Run> {
  const args = [...nodeFlags.split(' ').filter((f) => f !== ''), cli, 'agent', '--dry-run', '--node-name', NODE, '--kubeconfig', kubeconfig, '--health-address', '127.0.0.1', '--health-port', '0', '--min-sync-interval', '200ms', '--log-level', 'info'];
  const env = { ...process.env };
  delete env['NODE_OPTIONS'];
  const started = performance.now();
  const proc: ResultPromise = execa(process.execPath, args, { env, extendEnv: false, stdin: 'ignore', reject: false, buffer: false });
  let stderr = '';
  let healthPort: number | undefined;
  let exited = false;
  void proc.then(() => (exited = true));
  proc.stderr!.on('data', (d: Buffer) => {
    stderr += d.toString();
    const m = /"healthPort":(\d+)/.exec(stderr);
    if (m && healthPort === undefined) healthPort = Number(m[1]);
  });
  // The dry-run payloads: counted, not kept, so the pipe never fills up.
  let dryRunBytes = 0;
  let needle: string | undefined;
  let found = false;
  let tail = '';
  proc.stdout!.on('data', (d: Buffer) => {
    dryRunBytes += d.length;
    const text = tail + d.toString();
    if (needle !== undefined && text.includes(needle)) found = true;
    tail = text.slice(-200);
  });
  try {
    const deadline = Date.now() + 600_000;
    for (;;) {
      if (exited) throw new Error(`agent exited before it was ready:\n${stderr.slice(-3000)}`);
      if (Date.now() > deadline) throw new Error(`agent not ready after 600 s:\n${stderr.slice(-3000)}`);
      if (healthPort !== undefined) {
        const res = await fetch(`http://127.0.0.1:${healthPort}/readyz`).catch(() => undefined);
        if (res?.ok) break;
      }
      await sleep(100);
    }
    // Ready must mean the whole cluster is rendered; an agent that reports
    // ready earlier (from a partial cache) is waited for, and marked.
    const natRules = async () => {
      const metrics = await (await fetch(`http://127.0.0.1:${healthPort}/metrics`)).text();
      return Number(/^pier_agent_rules\{family="ipv4",table="nat"\} (\d+)/m.exec(metrics)?.[1] ?? NaN);
    };
    let rules = await natRules();
    const readyEarly = !(rules >= services);
    while (!(rules >= services)) {
      if (exited) throw new Error(`agent exited:\n${stderr.slice(-3000)}`);
      if (Date.now() > deadline) throw new Error(`agent never rendered ${services} Services (${rules} ipv4 nat rules)`);
      await sleep(100);
      rules = await natRules();
    }
    const readyMs = performance.now() - started;
    const atReady = memory(proc.pid!);
    await sleep(settleMs);
    const settled = memory(proc.pid!);
    let changeMs = NaN;
    let afterChange = settled;
    if (change) {
      const t0 = performance.now();
      needle = await change();
      while (!found) {
        if (exited) throw new Error(`agent exited:\n${stderr.slice(-3000)}`);
        if (performance.now() - t0 > 60_000) throw new Error('the change never reached the agent');
        await sleep(20);
      }
      changeMs = performance.now() - t0;
      await sleep(Math.min(settleMs, 5000));
      afterChange = memory(proc.pid!);
    }
    return { nodeFlags, natRules: rules, readyEarly, readyMs, atReady, settled, afterChange, changeMs, dryRunBytes };
  } finally {
    proc.kill('SIGTERM');
    const timer = setTimeout(() => proc.kill('SIGKILL'), 10_000);
    await proc;
    clearTimeout(timer);
  }
}

const cp = existing ? undefined : await startControlPlane();
try {
  const kubeconfig = existing ?? cp!.adminKubeconfigPath;
  const kc = loadKubeConfig({ kubeconfig }).kc;
  const core = kc.makeApiClient(CoreV1Api);
  const discovery = kc.makeApiClient(DiscoveryV1Api);
  const cli = process.env['PIER_BENCH_AGENT_CLI'] ?? (fromSource ? join(ROOT, 'cmd', 'cli.ts') : await bundledAgent());
  const label = (nodeFlags: string) => (nodeFlags === '' ? 'node (defaults)' : `node ${nodeFlags}`);
  const floors = new Map<string, Run>();

  let createdS = NaN;
  if (!existing) {
    await ensureNamespace(core, NS);
    await registerNode(core, nodeObject(NODE, [{ type: 'InternalIP', address: NODE_IP }]));
    for (const nodeFlags of variants) floors.set(nodeFlags, await runAgent(cli, kubeconfig, nodeFlags, 0));

    const t0 = performance.now();
    await inParallel(Array.from({ length: n }, (_, i) => i), concurrency, async (i) => {
      const name = `svc-${i}`;
      const port = 20000 + i;
      // No NodePorts: 10,000 Services would exhaust the default NodePort range.
      const body = lbService(NS, name, [{ name: 'p', port, targetPort: 8080 }], { allocateLoadBalancerNodePorts: false, externalTrafficPolicy: 'Cluster' });
      body.metadata!.labels = { app: name };
      const svc = await retrying(`create Service ${name}`, () => core.createNamespacedService({ namespace: NS, body }));
      const status = {
        loadBalancer: { ingress: [{ ip: NODE_IP, ipMode: 'Proxy', ports: [{ port, protocol: 'TCP' }] }] },
        conditions: [{ type: READY_CONDITION, status: 'True', reason: 'Serving', message: `served on ${NODE_IP}:${port}/TCP`, lastTransitionTime: new Date().toISOString().replace(/\.\d+Z$/, 'Z') }],
      };
      await retrying(`status of ${name}`, () => core.patchNamespacedServiceStatus({ name, namespace: NS, body: { status } }, mergePatch));
      await retrying(`EndpointSlice of ${name}`, () => discovery.createNamespacedEndpointSlice({ namespace: NS, body: slice(i, svc) }));
    });
    createdS = (performance.now() - t0) / 1000;
  }
  process.stdout.write(
    `pier agent --dry-run against a real API server: ${n} Services and ${n} EndpointSlices (${existing ? 'an existing cluster' : `created in ${createdS.toFixed(0)} s, ${concurrency} in flight`}), ` +
      `agent ${process.env['PIER_BENCH_AGENT_CLI'] ?? (fromSource ? 'from TypeScript source' : 'bundled as the images ship it')}, settle ${settleMs / 1000} s\n`,
  );
  const results: Run[] = [];
  if (n > 0) {
    const sample = await core.readNamespacedService({ name: `svc-${n - 1}`, namespace: NS });
    if (sample.spec?.loadBalancerClass !== LOAD_BALANCER_CLASS || sample.status?.loadBalancer?.ingress?.[0]?.ip !== NODE_IP) throw new Error('the Services do not look like pier Services with a status');
    const owner = await core.readNamespacedService({ name: 'svc-0', namespace: NS });
    // Moved to 198.19.<generation>.1, a subnet no other endpoint uses (they fill 198.19.0-79.x at 10,000 Services).
    let generation = 100 + (Date.now() % 50);
    for (const nodeFlags of variants) {
      results.push(
        await runAgent(cli, kubeconfig, nodeFlags, n, async () => {
          const s = slice(0, owner, ++generation);
          await discovery.patchNamespacedEndpointSlice({ name: s.metadata!.name!, namespace: NS, body: { endpoints: s.endpoints } }, mergePatch);
          return `${s.endpoints![0]!.addresses[0]}:8080`;
        }),
      );
    }
  }
  for (const nodeFlags of variants) {
    const r = results.find((x) => x.nodeFlags === nodeFlags);
    const floor = floors.get(nodeFlags);
    process.stdout.write(`\n${label(nodeFlags)}\n`);
    if (floor) row('  empty cluster: VmRSS after settling (the floor)', `${mb(floor.settled.rssKb)} (anonymous ${mb(floor.settled.anonKb)}, file ${mb(floor.settled.fileKb)}; peak ${mb(floor.settled.hwmKb)})`);
    if (!r) continue;
    row('  every Service rendered after', `${(r.readyMs / 1000).toFixed(1)} s (${r.natRules} ipv4 nat rules, dry-run output ${(r.dryRunBytes / 1e6).toFixed(1)} MB)`);
    if (r.readyEarly) row('  /readyz said ready before that', 'yes: the agent synced a partial cache');
    row('  VmRSS at ready', mb(r.atReady.rssKb));
    row(`  VmRSS after ${settleMs / 1000} s`, `${mb(r.settled.rssKb)} (anonymous ${mb(r.settled.anonKb)}, file ${mb(r.settled.fileKb)})`);
    row('  one Service changed: seen and rendered after', `${r.changeMs.toFixed(0)} ms`);
    row('  VmRSS after the change', `${mb(r.afterChange.rssKb)} (anonymous ${mb(r.afterChange.anonKb)}, file ${mb(r.afterChange.fileKb)})`);
    row('  VmHWM (peak)', mb(r.afterChange.hwmKb));
    row(`  target: RSS < ${RSS_MB} MB`, r.afterChange.rssKb < RSS_MB * 1024 ? 'PASS' : 'MISS');
  }
  process.stdout.write(`\n${JSON.stringify({ services: n, floors: Object.fromEntries(floors), results })}\n`);

  if (hold && cp) {
    process.stdout.write(`\nholding the cluster: PIER_BENCH_KUBECONFIG=${cp.adminKubeconfigPath} (Ctrl-C stops it)\n`);
    await new Promise(() => {});
  }
} finally {
  await cp?.stop();
}
