// The contract between pier's controller and agents (docs/architecture.md, section 1): the
// names both sides read and write. Changing one is a protocol change.

/** spec.loadBalancerClass that marks a Service as pier's. */
export const LOAD_BALANCER_CLASS = 'pier.dev/lb';

/**
 * Whether a Service is pier's (docs/architecture.md, section 1): type LoadBalancer and
 * pier's class, or no class when pier runs as the cluster's default. The
 * controller and the agent must agree on this exactly.
 */
export function isPierService(
  svc: { spec?: { type?: string; loadBalancerClass?: string | null } } | undefined,
  config: { loadBalancerClass: string; defaultClass: boolean },
): boolean {
  if (svc?.spec?.type !== 'LoadBalancer') return false;
  const cls = svc.spec.loadBalancerClass;
  if (cls === undefined || cls === null || cls === '') return config.defaultClass;
  return cls === config.loadBalancerClass;
}

/** Namespace of pier's own objects (agent Leases, the leader Lease). */
export const DEFAULT_NAMESPACE = 'pier-system';

export const ANNOTATION_PREFIX = 'pier.dev/';

/** Service annotation and node label: the address pool. */
export const POOL = 'pier.dev/pool';
export const DEFAULT_POOL = 'default';

/** Service annotation: `service` (external port = spec port) or `allocate` (from a range). */
export const PORT_MODE = 'pier.dev/port-mode';

/**
 * Service annotation: at most how many node addresses per address family the
 * controller lists in the status, a positive integer or `all`; overrides the
 * controller's --max-addresses for this Service.
 */
export const MAX_ADDRESSES = 'pier.dev/max-addresses';

/** Service annotation the controller writes in port-mode allocate: JSON `{"80/TCP": 40001}`, for people. */
export const PORT_MAPPING_ANNOTATION = 'pier.dev/port-mapping';

/** Service condition type the controller maintains. */
export const READY_CONDITION = 'pier.dev/Ready';

/** Node label that keeps a node out of every load balancer (upstream Kubernetes). */
export const EXCLUDE_FROM_LB_LABEL = 'node.kubernetes.io/exclude-from-external-load-balancers';

/** Legacy Service annotation for source ranges, used when spec.loadBalancerSourceRanges is empty. */
export const SOURCE_RANGES_ANNOTATION = 'service.beta.kubernetes.io/load-balancer-source-ranges';

/** The Lease the controller replicas elect their leader on, in pier's namespace. */
export const LEADER_LEASE_NAME = 'pier-controller';

/**
 * Leader Lease annotations: the settings that decide which Services are
 * pier's, as the leader runs with them, for the tools that read the cluster
 * (`pier status`, `pier trace`). Booleans are the strings "true" / "false".
 */
export const LEADER_DEFAULT_CLASS = 'pier.dev/default-class';
export const LEADER_DEFAULT_POOL = 'pier.dev/default-pool';
/**
 * Leader Lease annotation: the leader's --max-addresses (K), a positive
 * integer or `all`, so that `pier status` says why an eligible node is not
 * among a Service's addresses with the K the controller used.
 */
export const LEADER_MAX_ADDRESSES = 'pier.dev/max-addresses';

/** Agent Lease: one per node, renewed by that node's agent. */
export const agentLeaseName = (node: string) => `pier-agent-${node}`;
export const AGENT_LEASE_LABEL = 'pier.dev/component';
export const AGENT_LEASE_LABEL_VALUE = 'agent';

/** Agent Lease annotations. Booleans are the strings "true" / "false". */
export const LEASE_NODE = 'pier.dev/node';
export const LEASE_FORWARDING_IPV4 = 'pier.dev/forwarding-ipv4';
export const LEASE_FORWARDING_IPV6 = 'pier.dev/forwarding-ipv6';
/** Why a family cannot forward, for people reading the Lease. */
export const LEASE_FORWARDING_IPV4_REASON = 'pier.dev/forwarding-ipv4-reason';
export const LEASE_FORWARDING_IPV6_REASON = 'pier.dev/forwarding-ipv6-reason';
/** `iptables` or `nftables`: which rules the agent writes. */
export const LEASE_BACKEND = 'pier.dev/backend';
/** `nft` or `legacy` with the iptables backend; empty with nftables. */
export const LEASE_IPTABLES_BACKEND = 'pier.dev/iptables-backend';
export const LEASE_VERSION = 'pier.dev/version';

export type Family = 'ipv4' | 'ipv6';
export const FAMILIES: readonly Family[] = ['ipv4', 'ipv6'];

/**
 * Clusters of up to 16 nodes (per pool and family) keep every node in every
 * Service's status, as before there was a bound; beyond that a status stays
 * small (16 entries per family, ~1.5 KB of JSON for a one-port Service) and a
 * Service's traffic still spreads over 16 nodes.
 */
export const DEFAULT_MAX_ADDRESSES = 16;

/** `all` (Infinity) or a positive integer, as the flag and the annotation take it; undefined for anything else. */
export function parseMaxAddresses(value: unknown): number | undefined {
  if (typeof value !== 'string') return undefined;
  const text = value.trim();
  if (text === 'all') return Number.POSITIVE_INFINITY;
  if (!/^\d+$/.test(text)) return undefined;
  const n = Number(text);
  if (n < 1) return undefined;
  return Number.isSafeInteger(n) ? n : Number.POSITIVE_INFINITY;
}

/** How a bound reads in messages: `16` or `all`. */
export function formatMaxAddresses(n: number): string {
  return n === Number.POSITIVE_INFINITY ? 'all' : String(n);
}
