// `pier controller`: flags and environment to a Controller, signals to a
// clean stop that hands leadership over at once.
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';

import { API_SERVER_OPTION, apiServers, KUBECONFIG_OPTION, LOG_LEVEL_OPTION, parseCommand, type CommandSpec } from '../lib/command.ts';
import { formatDuration, type OptionValue } from '../lib/config.ts';
import { DEFAULT_NAMESPACE, DEFAULT_POOL, LOAD_BALANCER_CLASS } from '../lib/contract.ts';
import { connectCluster } from '../lib/kube.ts';
import { checkLeaderTimings, DEFAULT_LEADER_TIMINGS } from '../lib/leader.ts';
import { createLogger } from '../lib/log.ts';
import { DEFAULT_ALLOCATE_RANGE, DEFAULT_MAX_ADDRESSES, DEFAULT_RESERVED_PORTS, parseMaxAddresses, type AllocatorConfig, type PortRange } from '../controller/allocate.ts';
import { Controller, type ControllerConfig } from '../controller/controller.ts';

/** `80` or `8000-8999`, inclusive, within 1-65535. */
export function parsePortRange(text: string): PortRange | undefined {
  const m = /^(\d{1,5})(?:-(\d{1,5}))?$/.exec(text.trim());
  if (!m) return undefined;
  const from = Number(m[1]);
  const to = m[2] === undefined ? from : Number(m[2]);
  if (from < 1 || to > 65535 || from > to) return undefined;
  return { from, to };
}

export function formatPortRange(r: PortRange): string {
  return r.from === r.to ? String(r.from) : `${r.from}-${r.to}`;
}

const portRangeError = (v: string) => (parsePortRange(v) ? undefined : 'is not a port or an inclusive port range within 1-65535 (examples: 22, 2379-2380)');

/** The allocator's configuration from the controller's flags; `pier plan` and `pier trace` share those flags. */
export function allocatorConfig(v: Record<string, OptionValue>, agentNamespace: string = DEFAULT_NAMESPACE): AllocatorConfig {
  return {
    loadBalancerClass: LOAD_BALANCER_CLASS,
    defaultClass: v['default-class'] as boolean,
    defaultPool: v['default-pool'] as string,
    agentNamespace,
    reservedPorts: (v['reserved-ports'] as string[]).map((r) => parsePortRange(r)!),
    allocateRange: parsePortRange(v['allocate-range'] as string)!,
    maxPortsPerService: v['max-ports-per-service'] as number,
    // Commands sharing these flags without --max-addresses get the controller's default.
    maxAddresses: parseMaxAddresses(v['max-addresses']) ?? DEFAULT_MAX_ADDRESSES,
  };
}

export const CONTROLLER_SPEC: CommandSpec = {
  name: 'controller',
  summary: 'pier controller: assign node addresses and ports to LoadBalancer Services and write them to their status',
  usage: 'pier controller [options]',
  options: [
    KUBECONFIG_OPTION,
    API_SERVER_OPTION,
    { name: 'namespace', type: 'string', default: DEFAULT_NAMESPACE, help: "pier's namespace: agent Leases and the leader-election Lease" },
    { name: 'default-class', type: 'boolean', default: false, help: 'also take LoadBalancer Services without a loadBalancerClass (pier is the cluster default)' },
    { name: 'default-pool', type: 'string', default: DEFAULT_POOL, help: 'pool of Services without the pier.dev/pool annotation and of Nodes without the pier.dev/pool label' },
    {
      name: 'reserved-ports',
      type: 'list',
      default: DEFAULT_RESERVED_PORTS.map(formatPortRange),
      validate: portRangeError,
      help: 'external ports no Service gets (PortReserved): they belong to the node itself; comma-separated ports and ranges, empty for none',
    },
    { name: 'allocate-range', type: 'string', default: formatPortRange(DEFAULT_ALLOCATE_RANGE), validate: portRangeError, help: 'where pier.dev/port-mode: allocate draws external ports from' },
    { name: 'max-ports-per-service', type: 'int', default: 256, min: 1, max: 65535, help: 'Services with more ports are not served (TooManyPorts); keep it equal to the agents\' value' },
    {
      name: 'max-addresses',
      type: 'string',
      default: String(DEFAULT_MAX_ADDRESSES),
      validate: (v) => (parseMaxAddresses(v) === undefined ? 'is neither a positive integer nor "all"' : undefined),
      help: 'per Service and address family, list at most this many node addresses, chosen by rendezvous hashing (every eligible node while there are no more); "all" lists every eligible node; the annotation pier.dev/max-addresses overrides it per Service',
    },
    { name: 'workers', type: 'int', default: 4, min: 1, max: 64, help: 'Services written concurrently' },
    // Changes are judged as they come (reallocate(), held equal to a full allocation by its property tests); the
    // resync is the safety net. At 5,000 nodes a full allocation holds the controller for 4-6 s on a busy 2-core
    // machine (bench:scale), writes included: every minute was too often.
    { name: 'resync-period', type: 'duration', default: 300_000, min: 1000, help: 'recompute everything at least this often, even without changes' },
    { name: 'leader-elect', type: 'boolean', default: true, help: 'elect a leader among replicas on a Lease; only the leader writes (turn off only for a single replica)' },
    { name: 'leader-elect-lease-duration', type: 'duration', default: DEFAULT_LEADER_TIMINGS.leaseDurationMs, min: 1000, help: 'how long a standby waits for a leader that stopped renewing' },
    { name: 'leader-elect-renew-deadline', type: 'duration', default: DEFAULT_LEADER_TIMINGS.renewDeadlineMs, min: 100, help: 'the leader stops writing when it could not renew for this long' },
    { name: 'leader-elect-retry-period', type: 'duration', default: DEFAULT_LEADER_TIMINGS.retryPeriodMs, min: 100, help: 'how often the leader renews and standbys try' },
    { name: 'leader-elect-id', type: 'string', help: 'this replica\'s identity in the Lease (default: $POD_NAME, else the hostname and a random suffix)' },
    { name: 'health-address', type: 'string', default: '0.0.0.0', help: 'address for /healthz, /readyz and /metrics' },
    { name: 'health-port', type: 'int', default: 10266, min: 0, max: 65535, help: 'port for /healthz, /readyz and /metrics (0 picks a free one)' },
    LOG_LEVEL_OPTION,
  ],
};

export async function runController(argv: string[], env = process.env): Promise<number> {
  const parsed = parseCommand(CONTROLLER_SPEC, argv, env);
  if (typeof parsed === 'number') return parsed;
  const v = parsed.values;
  const timings = {
    leaseDurationMs: v['leader-elect-lease-duration'] as number,
    renewDeadlineMs: v['leader-elect-renew-deadline'] as number,
    retryPeriodMs: v['leader-elect-retry-period'] as number,
  };
  const bad = checkLeaderTimings(timings);
  if (bad) {
    const shown = `lease duration ${formatDuration(timings.leaseDurationMs)}, renew deadline ${formatDuration(timings.renewDeadlineMs)}, retry period ${formatDuration(timings.retryPeriodMs)}`;
    process.stderr.write(`pier controller: --leader-elect-*: ${bad} (${shown})\n`);
    return 2;
  }
  const identity = (v['leader-elect-id'] as string | undefined) || env['POD_NAME'] || `${hostname()}_${randomUUID().slice(0, 8)}`;
  const log = createLogger({ level: v['log-level'] as string, name: 'pier-controller' });
  const kc = await connectCluster({ kubeconfig: v['kubeconfig'] as string | undefined, apiServers: apiServers(v) }, log);

  const namespace = v['namespace'] as string;
  const cfg: ControllerConfig = {
    namespace,
    allocator: allocatorConfig(v, namespace),
    workers: v['workers'] as number,
    resyncPeriodMs: v['resync-period'] as number,
    minAllocateIntervalMs: 200,
    leaderElect: v['leader-elect'] as boolean,
    leaderElection: { ...timings, identity },
    healthAddress: v['health-address'] as string,
    healthPort: v['health-port'] as number,
  };
  const controller = new Controller(cfg, { kc, log });
  // Listen before starting: a replica still waiting for its caches must stop cleanly too.
  const signal = new Promise<NodeJS.Signals>((resolve) => {
    for (const s of ['SIGTERM', 'SIGINT'] as const) process.once(s, () => resolve(s));
  });
  try {
    await Promise.race([controller.start(), signal]);
  } catch (err) {
    await controller.stop();
    throw err;
  }
  const got = await signal;
  log.info({ signal: got }, 'stopping; statuses stay as they are');
  await controller.stop();
  return 0;
}
