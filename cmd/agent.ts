// `pier agent`: flags and environment to an Agent, signals to a clean stop.
import { API_SERVER_OPTION, apiServers, KUBECONFIG_OPTION, LOG_LEVEL_OPTION, parseCommand, type CommandSpec } from '../lib/command.ts';
import { describeSource } from '../lib/config.ts';
import { DEFAULT_NAMESPACE } from '../lib/contract.ts';
import { connectCluster } from '../lib/kube.ts';
import { createLogger } from '../lib/log.ts';
import { Agent, type AgentConfig } from '../agent/agent.ts';
import { BACKEND_OPTION, IPTABLES_FLAVOUR_OPTION, MARK_OPTIONS, markBitsOf } from './options.ts';

// Valid as long as the kubelet's node Lease (40 s), renewed a little less
// often (12 s, the kubelet 10 s): 5,000 agents write 417 renewals/s, fewer
// than the kubelets' 500, which leaves the controller's requests room under
// theirs (bench:scale), and three renewals may fail before a Lease runs out.
// A dead node's addresses are withdrawn within 40 s, about when Kubernetes
// marks the node NotReady.
export const AGENT_LEASE_DURATION_MS = 40_000;
export const AGENT_LEASE_RENEW_MS = 12_000;

export const AGENT_SPEC: CommandSpec = {
  name: 'agent',
  summary: "pier agent: program this node's iptables for the LoadBalancer Services assigned to it",
  usage: 'pier agent --node-name NAME [options]',
  options: [
    KUBECONFIG_OPTION,
    API_SERVER_OPTION,
    { name: 'node-name', type: 'string', env: 'NODE_NAME', help: 'this node (required; the DaemonSet sets it from spec.nodeName)' },
    { name: 'namespace', type: 'string', default: DEFAULT_NAMESPACE, help: "namespace of the agent's Lease" },
    { name: 'default-class', type: 'boolean', default: false, help: 'also serve LoadBalancer Services without a loadBalancerClass (pier is the cluster default)' },
    { name: 'dry-run', type: 'boolean', default: false, help: 'print the iptables-restore (or nft) input of each sync instead of applying it; never touches the kernel' },
    { name: 'set-sysctls', type: 'boolean', default: false, help: 'turn on net.ipv4.ip_forward and net.ipv6.conf.all.forwarding when off (needs a writable /proc/sys)' },
    BACKEND_OPTION,
    IPTABLES_FLAVOUR_OPTION,
    ...MARK_OPTIONS,
    { name: 'max-ports-per-service', type: 'int', default: 256, min: 1, max: 65535, help: 'Services with more ports are skipped with a Warning Event' },
    { name: 'min-sync-interval', type: 'duration', default: 250, min: 0, help: 'shortest time between two syncs; changes in between are coalesced' },
    { name: 'resync-period', type: 'duration', default: 30_000, min: 1000, help: 'verifying sync (sysctls, pier chains and jumps read back and healed) at least this often' },
    { name: 'health-address', type: 'string', default: '0.0.0.0', help: 'address for /healthz, /readyz and /metrics' },
    { name: 'health-port', type: 'int', default: 10265, min: 0, max: 65535, help: 'port for /healthz, /readyz and /metrics (0 picks a free one)' },
    { name: 'lease-duration', type: 'duration', default: AGENT_LEASE_DURATION_MS, min: 1000, help: 'how long the Lease stays valid without renewal' },
    { name: 'lease-renew-interval', type: 'duration', default: AGENT_LEASE_RENEW_MS, min: 100, help: 'how often the Lease is renewed' },
    LOG_LEVEL_OPTION,
  ],
};

export async function runAgent(argv: string[]): Promise<number> {
  const parsed = parseCommand(AGENT_SPEC, argv);
  if (typeof parsed === 'number') return parsed;
  const v = parsed.values;
  const log = createLogger({ level: v['log-level'] as string, name: 'pier-agent' });
  const nodeName = v['node-name'] as string | undefined;
  if (!nodeName) {
    process.stderr.write('pier agent: --node-name (or NODE_NAME) is required\n');
    return 2;
  }
  if ((v['lease-renew-interval'] as number) >= (v['lease-duration'] as number)) {
    process.stderr.write('pier agent: --lease-renew-interval must be shorter than --lease-duration\n');
    return 2;
  }
  const marks = markBitsOf(v);
  if (typeof marks === 'string') {
    process.stderr.write(`pier agent: ${marks}\n`);
    return 2;
  }
  const kc = await connectCluster({ kubeconfig: v['kubeconfig'] as string | undefined, apiServers: apiServers(v) }, log);

  const cfg: AgentConfig = {
    nodeName,
    namespace: v['namespace'] as string,
    defaultClass: v['default-class'] as boolean,
    dryRun: v['dry-run'] as boolean,
    setSysctls: v['set-sysctls'] as boolean,
    backend: v['backend'] as AgentConfig['backend'],
    iptablesBackend: v['iptables-backend'] as AgentConfig['iptablesBackend'],
    setBy: { backend: describeSource(BACKEND_OPTION, parsed.sources['backend']!), iptablesBackend: describeSource(IPTABLES_FLAVOUR_OPTION, parsed.sources['iptables-backend']!) },
    marks,
    maxPortsPerService: v['max-ports-per-service'] as number,
    minSyncIntervalMs: v['min-sync-interval'] as number,
    resyncPeriodMs: v['resync-period'] as number,
    healthAddress: v['health-address'] as string,
    healthPort: v['health-port'] as number,
    leaseDurationSeconds: Math.ceil((v['lease-duration'] as number) / 1000),
    leaseRenewMs: v['lease-renew-interval'] as number,
  };
  const agent = new Agent(cfg, { kc, log });
  await agent.start();
  const signal = await new Promise<NodeJS.Signals>((resolve) => {
    for (const s of ['SIGTERM', 'SIGINT'] as const) process.once(s, () => resolve(s));
  });
  log.info({ signal }, 'stopping; iptables rules stay in place');
  await agent.stop();
  return 0;
}
