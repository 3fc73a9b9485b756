// `pier plan`: the agent's rules for one node and family, from manifests on
// disk, with no cluster: the same model and renderer the agent uses, printed
// as a complete `iptables-restore --noflush` input (jumps inserted at the top
// of their chains, as the agent puts them) that yields exactly the agent's
// ruleset on that host, or as single commands, or with `--backend nftables`
// as the `nft -f` script that replaces pier's table; followed by the
// conntrack clean-up the agent makes after applying them.
//
// Services without a status first get the one the controller would write:
// its own allocate(), with its own flags (the controller's option specs), on
// the same manifests. Offline there are no agent Leases, so every Node counts
// as running a healthy agent that forwards both families.
import type { V1Lease, V1Service } from '@kubernetes/client-node';
import { addressInfo } from '../lib/address.ts';
import { parseCommand, type CommandSpec } from '../lib/command.ts';
import type { OptionSpec } from '../lib/config.ts';
import { LEASE_FORWARDING_IPV4, LEASE_FORWARDING_IPV6, agentLeaseName, isPierService, type Family } from '../lib/contract.ts';
import { allocate, judgeNodes, REASONS, serviceKey, type AllocatorConfig } from '../controller/allocate.ts';
import { allocatorConfig, CONTROLLER_SPEC } from '../controller/main.ts';
import { statusPatch } from '../controller/status.ts';
import { nodeAddresses } from './agent.ts';
import { MARK_OPTIONS, markBitsOf } from './main.ts';
import { readManifestFiles, type Manifests } from './manifests.ts';
import { SyncPipeline } from './pipeline.ts';
import { nftScript, renderNft } from './nft.ts';
import { commandsText, planText } from './restore.ts';
import { describeCheck, flowFrontends, frontendsToCheck } from './conntrack.ts';

/** The controller's allocation flags, shared with it (plan reads no PIER_* variables: a plan depends on its command line only). */
const ALLOCATOR_OPTIONS: OptionSpec[] = ['default-class', 'default-pool', 'reserved-ports', 'allocate-range', 'max-ports-per-service'].map((name) => {
  const spec = CONTROLLER_SPEC.options.find((o) => o.name === name);
  if (!spec) throw new Error(`pier plan: the controller has no --${name} any more`);
  return { ...spec, env: null };
});

export const PLAN_SPEC: CommandSpec = {
  name: 'plan',
  summary: [
    'pier plan: print the iptables rules the agent would hold on a node, from Node, Service and EndpointSlice manifests, with no cluster',
    '',
    'A Service without status.loadBalancer.ingress first gets the status the controller would write: the',
    "controller's own allocation, with the allocation flags below, over every manifest. Offline there are no",
    "agent Leases, so every Node in the manifests counts as running a healthy agent that forwards IPv4 and",
    'IPv6; its Ready condition, labels and addresses count as they are. stderr names the Services it allocated',
    '(addresses, ports) and every Service it leaves out, with the reason. A file that cannot be read or parsed',
    'is skipped and named; the plan is still printed from the others, and the exit code is 1. Of two objects',
    'of one kind with one name (and namespace) the later one read is used, as kubectl apply would leave it;',
    'both are named, and the exit code is 1.',
  ].join('\n'),
  usage: 'pier plan --node NAME [--family ipv4|ipv6] [--backend iptables|nftables] [--format restore|commands] -f FILE_OR_DIR [-f ...]',
  allowPositionals: false,
  options: [
    { name: 'node', type: 'string', env: null, help: 'the Node (from the manifests) to plan for' },
    { name: 'family', type: 'enum', values: ['ipv4', 'ipv6'], default: 'ipv4', env: null, help: 'address family' },
    { name: 'backend', type: 'enum', values: ['iptables', 'nftables'], default: 'iptables', env: null, help: "iptables rules, or pier's nftables table (an nft -f script)" },
    { name: 'format', type: 'enum', values: ['restore', 'commands'], default: 'restore', env: null, help: 'iptables-restore input, or one iptables command per line (iptables backend)' },
    { name: 'filename', type: 'list', env: null, help: 'manifest file or directory (.yaml, .yml, .json; repeatable; -f works too)' },
    ...MARK_OPTIONS.map((o) => ({ ...o, env: null })),
    ...ALLOCATOR_OPTIONS,
  ],
};

export { allocatorConfig };

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

export async function runPlan(argv: string[]): Promise<number> {
  // kubectl's short -f, mapped onto --filename.
  const args = argv.map((a) => (a === '-f' ? '--filename' : a.startsWith('-f=') ? `--filename=${a.slice(3)}` : a));
  const parsed = parseCommand(PLAN_SPEC, args);
  if (typeof parsed === 'number') return parsed;
  const v = parsed.values;
  const nodeName = v['node'] as string | undefined;
  const files = (v['filename'] as string[] | undefined) ?? [];
  if (!nodeName || files.length === 0) {
    process.stderr.write(`pier plan: --node and at least one -f are required\nUsage: ${PLAN_SPEC.usage}\n`);
    return 2;
  }
  const { manifests, errors, duplicates } = readManifestFiles(files);
  // Bad files are skipped, and the plan is made from the rest: one typo does not hide everything else.
  for (const err of errors) process.stderr.write(`pier plan: skipped ${err.message}\n`);
  // Likely a stale copy of a file: the plan is printed, but the exit code says to look.
  for (const d of duplicates) process.stderr.write(`pier plan: warning: ${d.message}\n`);
  const node = manifests.nodes.find((n) => n.metadata?.name === nodeName);
  if (!node) {
    const known = manifests.nodes.map((n) => n.metadata?.name).join(', ') || 'none';
    process.stderr.write(`pier plan: no Node named ${JSON.stringify(nodeName)} in the manifests (Nodes found: ${known})\n`);
    return 1;
  }
  const config = allocatorConfig(v);
  const { services, notes } = allocateOffline(manifests, nodeName, config);
  for (const line of notes) process.stderr.write(`pier plan: ${line}\n`);
  const marks = markBitsOf(v);
  if (typeof marks === 'string') {
    process.stderr.write(`pier plan: ${marks}\n`);
    return 2;
  }
  // The agent's own engine, from an empty state: what it would compute on this node.
  const pipeline = new SyncPipeline({
    nodeName,
    model: { loadBalancerClass: config.loadBalancerClass, defaultClass: config.defaultClass, maxPortsPerService: config.maxPortsPerService! },
    render: { marks },
  });
  const model = pipeline.model({ nodeAddresses: nodeAddresses(node), services, slices: manifests.slices });
  for (const p of model.problems) {
    process.stderr.write(`pier plan: warning: ${p.service}${p.port ? ` port ${p.port}` : ''}: ${p.reason}: ${p.message}\n`);
  }
  const family = v['family'] as Family;
  if (v['backend'] === 'nftables') process.stdout.write(nftScript(renderNft(model[family], marks.masquerade)));
  else {
    const ruleset = pipeline.ruleset(model[family]);
    process.stdout.write(v['format'] === 'commands' ? commandsText(ruleset, family) : planText(ruleset));
  }
  // What the agent deletes once these rules are in place, as comments both formats allow.
  process.stdout.write(frontendsToCheck(undefined, flowFrontends(model[family])).map(describeCheck).join(''));
  if (errors.length > 0) {
    process.stderr.write(`pier plan: ${errors.length} file${errors.length === 1 ? '' : 's'} skipped (above); the plan leaves out what ${errors.length === 1 ? 'it holds' : 'they hold'}\n`);
  }
  if (duplicates.length > 0) {
    process.stderr.write(`pier plan: ${duplicates.length} object${duplicates.length === 1 ? '' : 's'} read again later (above); the plan uses the later one of each\n`);
  }
  return errors.length > 0 || duplicates.length > 0 ? 1 : 0;
}
