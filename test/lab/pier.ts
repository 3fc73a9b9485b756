// pier running in the lab, shared by the end-to-end test and the controller
// benchmark: Node objects for the lab's nodes, one agent per node namespace,
// the controller in a host of its own, fleets of Services whose endpoints
// are the lab's pods, and the two measurements that need real connections:
// "is every Service answered on every listed address" and "how long from
// creating a Service until a client's connection is answered".
import { createInterface } from 'node:readline';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { PatchStrategy, setHeaderOptions, type CoreV1Api, type DiscoveryV1Api, type V1Service } from '@kubernetes/client-node';
import type { ResultPromise } from 'execa';
import { registerNode } from '../cluster/controlplane.ts';
import { endpointSlice, lbService, node as nodeObject } from '../support/objects.ts';
import { fleetItems, type Fleet, type FleetSpec } from '../support/fleet.ts';
import { ECHO_PORT, type Endpoint, type Lab } from './lab.ts';

const HERE = dirname(fileURLToPath(import.meta.url));
export const CLI = join(HERE, '..', '..', 'cmd', 'cli.ts');

/** Node objects for the lab's nodes, Ready, with both underlay addresses as InternalIPs: what kubelet would register. */
export async function registerLabNodes(core: CoreV1Api, lab: Lab): Promise<void> {
  for (const n of lab.nodes) {
    await registerNode(core, nodeObject(n.name, [{ type: 'InternalIP', address: n.v4 }, { type: 'InternalIP', address: n.v6 }]));
  }
}

export interface LabServicePort {
  name: string;
  port: number;
  protocol?: 'TCP' | 'UDP';
}

/**
 * A dual-stack pier Service whose endpoints are `pods` (one EndpointSlice per
 * family, the echo servers' port), and the status a controller would write
 * for both addresses of each of `nodes`, every port marked with `portError`
 * when given: the tests that run agents without a controller control exactly
 * what the agents see.
 */
export async function createLabService(
  api: { core: CoreV1Api; discovery: DiscoveryV1Api },
  namespace: string,
  name: string,
  ports: LabServicePort[],
  pods: { v4: string; v6: string; node: string }[],
  opts: { nodes: Endpoint[]; extra?: Partial<NonNullable<V1Service['spec']>>; portError?: string },
): Promise<void> {
  await api.core.createNamespacedService({
    namespace,
    body: lbService(namespace, name, ports.map((p) => ({ ...p, targetPort: ECHO_PORT })), { ipFamilyPolicy: 'PreferDualStack', ipFamilies: ['IPv4', 'IPv6'], ...opts.extra }),
  });
  for (const [family, type] of [['v4', 'IPv4'], ['v6', 'IPv6']] as const) {
    await api.discovery.createNamespacedEndpointSlice({
      namespace,
      body: endpointSlice(namespace, name, type, pods.map((p) => ({ address: p[family], nodeName: p.node })), ports.map((p) => ({ name: p.name, port: ECHO_PORT, protocol: p.protocol }))),
    });
  }
  const error = opts.portError ? { error: opts.portError } : {};
  const ingress = opts.nodes.flatMap((n) => [n.v4, n.v6].map((ip) => ({ ip, ipMode: 'Proxy', ports: ports.map((p) => ({ port: p.port, protocol: p.protocol ?? 'TCP', ...error })) })));
  await api.core.patchNamespacedServiceStatus({ name, namespace, body: { status: { loadBalancer: { ingress } } } }, MERGE_PATCH);
}

const MERGE_PATCH = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);

/** `pier agent` in every node namespace (health on the node's own addresses, port 10265 by default). */
export function spawnAgents(lab: Lab, kubeconfig: string, extra: string[] = []): ResultPromise[] {
  return lab.nodes.map((n) =>
    lab.spawn(n.ns, process.execPath, [CLI, 'agent', '--node-name', n.name, '--kubeconfig', kubeconfig, '--log-level', 'warn', ...extra]),
  );
}

/** `pier controller` in `host`'s namespace, off the nodes, as a Deployment's pod may run. */
export function spawnController(lab: Lab, host: Endpoint, kubeconfig: string, extra: string[] = []): ResultPromise {
  return lab.spawn(host.ns, process.execPath, [CLI, 'controller', '--kubeconfig', kubeconfig, '--health-port', '0', '--log-level', 'warn', ...extra]);
}

/** Stops processes started with lab.spawn and waits for them (SIGKILL after 5 s). */
export async function stopProcesses(procs: readonly ResultPromise[]): Promise<void> {
  await Promise.all(
    procs.map(async (p) => {
      p.kill('SIGTERM');
      const t = setTimeout(() => p.kill('SIGKILL'), 5000);
      await p.catch(() => undefined);
      clearTimeout(t);
    }),
  );
}

/** A fleet whose endpoints are every pod of the lab, IPv4 and IPv6 unless told otherwise. */
export function labFleetSpec(
  lab: Lab,
  spec: Omit<FleetSpec, 'endpoints' | 'targetPort'> & { families?: ('IPv4' | 'IPv6')[] },
): FleetSpec {
  const families = spec.families ?? ['IPv4', 'IPv6'];
  const endpoints: FleetSpec['endpoints'] = {};
  for (const f of families) endpoints[f] = lab.pods.map((p) => ({ address: f === 'IPv4' ? p.v4 : p.v6, nodeName: p.node }));
  const { families: _omit, ...rest } = spec;
  return { ...rest, targetPort: ECHO_PORT, endpoints };
}

export interface ProbeOutcome {
  target: string;
  ok: boolean;
  attempts: number;
  ms: number;
  pod?: string;
  error?: string;
  /** performance.now() in this process when the line arrived. */
  at: number;
}

/** `host:port`, bracketed for IPv6. */
export const target = (host: string, port: number) => (host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`);

export interface RunningProber {
  /** Resolves once the prober is running (its start-up is over). */
  ready: Promise<void>;
  /** Every target's outcome, once the prober has exited. */
  done: Promise<ProbeOutcome[]>;
  /** Resolves with each outcome as it arrives. */
  next(): Promise<ProbeOutcome | undefined>;
}

/** Starts prober.ts in `from`'s namespace on `targets`; see prober.ts for the options. */
export function startProber(
  lab: Lab,
  from: Endpoint,
  targets: readonly string[],
  opts: { intervalMs?: number; timeoutMs?: number; deadlineMs?: number; concurrency?: number } = {},
): RunningProber {
  const proc = lab.spawn(from.ns, process.execPath, [
    join(HERE, 'prober.ts'),
    '--targets', targets.join(','),
    '--interval', String(opts.intervalMs ?? 10),
    '--timeout', String(opts.timeoutMs ?? 300),
    '--deadline', String(opts.deadlineMs ?? 30_000),
    '--concurrency', String(opts.concurrency ?? 32),
  ]);
  const outcomes: ProbeOutcome[] = [];
  const queue: ProbeOutcome[] = [];
  const takers: ((o: ProbeOutcome | undefined) => void)[] = [];
  let ended = false;
  let markReady!: () => void;
  const ready = new Promise<void>((resolve) => (markReady = resolve));
  const lines = createInterface({ input: proc.stdout! });
  lines.on('line', (line) => {
    const at = performance.now();
    const msg = JSON.parse(line) as { ready?: boolean } & Omit<ProbeOutcome, 'at'>;
    if (msg.ready) return markReady();
    const o = { ...msg, at };
    outcomes.push(o);
    const taker = takers.shift();
    if (taker) taker(o);
    else queue.push(o);
  });
  const done = (async () => {
    const res = await proc;
    ended = true;
    for (const t of takers.splice(0)) t(undefined);
    if (outcomes.length < targets.length) {
      throw new Error(`prober in ${from.name} exited (${res.exitCode ?? res.signal}) with ${outcomes.length} of ${targets.length} outcomes`);
    }
    return outcomes;
  })();
  // A prober that dies before "ready" must not leave the caller waiting.
  void done.catch(() => undefined).then(markReady);
  return {
    ready,
    done,
    next: () => {
      const o = queue.shift();
      if (o || ended) return Promise.resolve(o);
      return new Promise((resolve) => takers.push(resolve));
    },
  };
}

/** Connects to every target until answered (or `deadlineMs` passes) and returns the outcomes. */
export async function probeAll(lab: Lab, from: Endpoint, targets: readonly string[], opts: { deadlineMs?: number; concurrency?: number } = {}): Promise<ProbeOutcome[]> {
  return startProber(lab, from, targets, { intervalMs: 50, ...opts }).done;
}

export interface LatencySample {
  name: string;
  target: string;
  ok: boolean;
  /** From the start of the create call to the answered connection's reply arriving here. */
  ms: number;
  pod?: string;
  error?: string;
}

/**
 * Create -> first answered connection, one Service at a time: a prober in
 * `from` starts connecting to the Service's future address before the
 * Service exists (refused until the agent's rules are in), then the clock
 * starts and the Service and its slices are created; the sample ends when
 * the prober's answered line arrives. Service i is probed on the i-th of
 * `addresses` in turn, which must be addresses the controller lists (the
 * caller checks the statuses afterwards).
 */
export async function measureCreateToAnswer(
  lab: Lab,
  fleet: Fleet,
  spec: FleetSpec,
  opts: { from: Endpoint; addresses: readonly string[]; deadlineMs?: number },
): Promise<LatencySample[]> {
  const samples: LatencySample[] = [];
  for (const [k, item] of fleetItems(spec).entries()) {
    const t = target(opts.addresses[k % opts.addresses.length]!, item.port);
    const prober = startProber(lab, opts.from, [t], { intervalMs: 5, timeoutMs: 300, deadlineMs: opts.deadlineMs ?? 20_000 });
    await prober.ready;
    const start = performance.now();
    await fleet.createOne(spec, item);
    const o = await prober.next();
    await prober.done.catch(() => undefined);
    samples.push({ name: item.name, target: t, ok: o?.ok ?? false, ms: (o?.at ?? performance.now()) - start, pod: o?.pod, error: o?.error ?? (o ? undefined : 'prober exited') });
  }
  return samples;
}
