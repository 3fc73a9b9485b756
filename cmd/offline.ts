// What `pier plan` and `pier trace` share when they read manifests instead
// of a cluster: Services without a status first get the one the controller
// would write, its own allocate() with its own flags (the controller's option
// specs). Offline there are no agent Leases, so every Node counts as running
// a healthy agent that forwards both families.
import type { V1Lease, V1Service } from '@kubernetes/client-node';
import { addressInfo } from '../lib/address.ts';
import type { OptionSpec } from '../lib/config.ts';
import { LEASE_FORWARDING_IPV4, LEASE_FORWARDING_IPV6, agentLeaseName, isPierService } from '../lib/contract.ts';
import { allocate, judgeNodes, REASONS, serviceKey, type AllocatorConfig } from '../controller/allocate.ts';
import { statusPatch } from '../controller/status.ts';
import { nodeAddresses } from '../agent/engine/model.ts';
import { CONTROLLER_SPEC } from './controller.ts';
import type { Manifests } from './manifests.ts';
import { MARK_OPTIONS } from './options.ts';

/** The controller's allocation flags, shared with it (plan reads no PIER_* variables: a plan depends on its command line only). */
const ALLOCATOR_OPTIONS: OptionSpec[] = ['default-class', 'default-pool', 'reserved-ports', 'allocate-range', 'max-ports-per-service', 'max-addresses'].map((name) => {
  const spec = CONTROLLER_SPEC.options.find((o) => o.name === name);
  if (!spec) throw new Error(`pier plan: the controller has no --${name} any more`);
  return { ...spec, env: null };
});

/** The flags of an offline plan besides what it is asked for: the mark bits and the controller's allocation flags, none read from PIER_* variables. */
export const OFFLINE_OPTIONS: OptionSpec[] = [...MARK_OPTIONS.map((o) => ({ ...o, env: null })), ...ALLOCATOR_OPTIONS];

export interface OfflineAllocation {
  /** Every Service, those without a status given the one the controller would write. */
  services: V1Service[];
  /** For stderr, one line per Service: what was allocated, and every Service the plan leaves out and why. */
  notes: string[];
}

/**
 * Gives each of pier's Services without status.loadBalancer.ingress the
 * status the controller would write, and says what `nodeName` gets of every
 * Service. Pure: the manifests in, the Services the agent would see and the
 * lines to print out.
 */
export function allocateOffline(m: Manifests, nodeName: string, config: AllocatorConfig): OfflineAllocation {
  const notes: string[] = [];
  const hasStatus = (svc: V1Service) => Array.isArray(svc.status?.loadBalancer?.ingress) && svc.status.loadBalancer.ingress.length > 0;
  const node = m.nodes.find((n) => n.metadata?.name === nodeName);
  const mine = new Set((node ? nodeAddresses(node) : []).map((a) => addressInfo(a)?.text).filter((a) => a !== undefined));
  const here = (svc: V1Service) => (svc.status?.loadBalancer?.ingress ?? []).some((i) => mine.has(addressInfo(i?.ip)?.text ?? ''));
  const others = (svc: V1Service) => (svc.status?.loadBalancer?.ingress ?? []).map((i) => i?.ip).filter((ip) => typeof ip === 'string').join(', ');

  let notLoadBalancer = 0;
  for (const svc of m.services) {
    if (svc.spec?.type !== 'LoadBalancer') notLoadBalancer++;
    else if (!isPierService(svc, config)) {
      const cls = svc.spec.loadBalancerClass;
      notes.push(`${serviceKey(svc)}: left out: ${cls ? `its loadBalancerClass ${JSON.stringify(cls)} is not ${config.loadBalancerClass}` : `it has no loadBalancerClass (add --default-class when pier is the cluster's default implementation, or set ${config.loadBalancerClass})`}`);
    }
  }
  if (notLoadBalancer > 0) notes.push(`${notLoadBalancer} Service${notLoadBalancer === 1 ? '' : 's'} not of type LoadBalancer left out`);

  const pier = m.services.filter((svc) => isPierService(svc, config));
  const unallocated = new Set(pier.filter((svc) => !hasStatus(svc)));
  let services = m.services;
  if (unallocated.size > 0) {
    const input = {
      services: m.services,
      nodes: m.nodes,
      slices: m.slices,
      leases: m.nodes.map((n) => healthyAgentLease(n.metadata?.name ?? '', config.agentNamespace)),
      // Fresh for ever: offline, an agent's health is an assumption, not an observation.
      leaseFreshUntil: new Map(m.nodes.map((n) => [agentLeaseName(n.metadata?.name ?? ''), Number.POSITIVE_INFINITY])),
      now: 0,
      config,
    };
    const allocation = allocate(input);
    const judged = judgeNodes(input);
    services = m.services.map((svc) => {
      if (!unallocated.has(svc)) return svc;
      const key = serviceKey(svc);
      const a = allocation.services.get(key);
      if (!a) return svc;
      const ingress = statusPatch(svc, a)?.status.loadBalancer?.ingress ?? [];
      const { condition } = a;
      const allocated = `${key}: allocated (no status in the manifests)`;
      if (ingress.length === 0) notes.push(`${key}: cannot be served: ${condition.reason}: ${condition.message}`);
      else if (condition.status === 'True') notes.push(`${allocated}: ${condition.message}`);
      else if (condition.reason === REASONS.partiallyServed) notes.push(`${allocated}, in part: ${condition.message}`);
      else notes.push(`${allocated}, but none of its ports can be served: ${condition.reason}: ${condition.message}`);
      for (const p of a.problems) if (!condition.message.includes(p.message)) notes.push(`${key}: warning: ${p.reason}: ${p.message}`);
      const withStatus: V1Service = { ...svc, status: { ...svc.status, loadBalancer: { ingress } } };
      if (ingress.length > 0 && !here(withStatus)) {
        const why = [...new Set((judged.get(key) ?? []).filter((j) => j.node === nodeName && j.excluded).map((j) => j.excluded!.why))];
        notes.push(`${key}: not on node ${nodeName}: ${why.length > 0 ? why.join('; ') : `its addresses (${others(withStatus)}) are other nodes'`}`);
      }
      return withStatus;
    });
  }
  for (const svc of pier) {
    if (unallocated.has(svc)) continue;
    if (!here(svc)) {
      notes.push(`${serviceKey(svc)}: not on node ${nodeName}: its status lists ${others(svc)}, none of them this node's`);
      continue;
    }
    // Ports the controller marked: the agent serves none of them here.
    const errored: string[] = [];
    for (const ing of svc.status?.loadBalancer?.ingress ?? []) {
      if (!mine.has(addressInfo(ing?.ip)?.text ?? '')) continue;
      for (const p of Array.isArray(ing.ports) ? ing.ports : []) if (p?.error) errored.push(`${p.port}/${p.protocol ?? 'TCP'} on ${ing.ip} (${p.error})`);
    }
    if (errored.length > 0) notes.push(`${serviceKey(svc)}: its status marks ports not served on node ${nodeName}: ${errored.join(', ')}`);
  }
  return { services, notes };
}

/** The Lease a healthy agent on `node` would hold. */
function healthyAgentLease(node: string, namespace: string): V1Lease {
  return {
    metadata: { name: agentLeaseName(node), namespace, annotations: { [LEASE_FORWARDING_IPV4]: 'true', [LEASE_FORWARDING_IPV6]: 'true' } },
    spec: { holderIdentity: node },
  };
}
