// The `pier trace` command: reads what `pier plan` reads (manifests, with
// the controller's allocation for Services without a status) or what the
// agent reads from a live cluster, asks trace.ts, and prints its verdict.
import type { V1EndpointSlice, V1Lease, V1Node, V1Service } from '@kubernetes/client-node';
import { parseCommand, type CommandSpec } from '../lib/command.ts';
import type { OptionValue } from '../lib/config.ts';
import { chooseSelection } from '../lib/cluster-settings.ts';
import { DEFAULT_NAMESPACE, LEADER_LEASE_NAME, LOAD_BALANCER_CLASS } from '../lib/contract.ts';
import { markBitsOf } from './options.ts';
import { readManifestFiles } from './manifests.ts';
import { nodeAddresses, parseAddress } from '../agent/engine/model.ts';
import { allocatorConfig } from './controller.ts';
import { allocateOffline, OFFLINE_OPTIONS } from './offline.ts';
import { parseFrontend, trace, traceWorld, TraceUsageError, verdictText, type TracePacket } from '../agent/iptables/trace.ts';

/**
 * plan's own flags (OFFLINE_OPTIONS), so that trace sees exactly what plan
 * renders; not --backend: trace walks the iptables rules, and a flag it took
 * and did not follow would name nftables hops that are iptables chains.
 */

export const TRACE_SPEC: CommandSpec = {
  name: 'trace',
  summary: [
    'pier trace: what a new connection from CLIENT to FRONTEND (ADDRESS:PORT/PROTO, IPv6 in brackets) meets in the',
    'rules pier installs on a node: the chains and rules it crosses, whether its source range admits it, the',
    'endpoints it may be DNATed to and how likely each is, whether it is masqueraded (the source the pod sees),',
    'or why it is rejected, dropped or left to the host. Reads manifests as `pier plan` does (-f), or the live',
    'cluster (--kubeconfig). Exit code 0: delivered to an endpoint; 1: not; 2: usage error.',
  ].join('\n'),
  usage: 'pier trace CLIENT ADDRESS:PORT/PROTO --node NAME [-f FILE_OR_DIR ... | --kubeconfig FILE] [--from-node] [-o text|json]',
  allowPositionals: true,
  options: [
    { name: 'node', type: 'string', env: null, help: 'the Node whose rules to walk' },
    { name: 'filename', type: 'list', env: null, help: 'manifest file or directory, as for pier plan (repeatable; -f works too); without it, the live cluster' },
    { name: 'kubeconfig', type: 'string', env: null, help: 'without -f: the cluster to read (else $KUBECONFIG, the in-cluster ServiceAccount, ~/.kube/config)' },
    { name: 'pier-namespace', type: 'string', default: DEFAULT_NAMESPACE, env: 'PIER_NAMESPACE', help: "without -f: pier's namespace, whose controller Lease says whether pier is the default (--default-class given overrides it)" },
    { name: 'from-node', type: 'boolean', default: false, env: null, help: 'the client is a process on the node (assumed when CLIENT is one of its addresses)' },
    { name: 'output', type: 'enum', values: ['text', 'json'], default: 'text', env: null, help: 'text for people, json for scripts (-o works too)' },
    ...OFFLINE_OPTIONS,
  ],
};

interface Objects {
  nodes: V1Node[];
  services: V1Service[];
  slices: V1EndpointSlice[];
  /** From a live cluster: what decides whether a Service without a class is pier's. */
  defaultClass?: boolean;
}

export async function runTrace(argv: string[]): Promise<number> {
  // kubectl's short -f and -o.
  const args = argv.map((a) => (a === '-f' ? '--filename' : a.startsWith('-f=') ? `--filename=${a.slice(3)}` : a === '-o' ? '--output' : a.startsWith('-o=') ? `--output=${a.slice(3)}` : a));
  const parsed = parseCommand(TRACE_SPEC, args);
  if (typeof parsed === 'number') return parsed;
  const v = parsed.values;
  const usage = (msg: string) => {
    process.stderr.write(`pier trace: ${msg}\nUsage: ${TRACE_SPEC.usage}\n`);
    return 2;
  };
  const nodeName = v['node'] as string | undefined;
  const files = (v['filename'] as string[] | undefined) ?? [];
  if (parsed.positionals.length !== 2) return usage('CLIENT and FRONTEND are required, e.g. pier trace 203.0.113.7 192.0.2.10:443/tcp --node n1 -f manifests/');
  if (!nodeName) return usage('--node is required');
  if (files.length > 0 && v['kubeconfig'] !== undefined) return usage('give either -f or --kubeconfig, not both');
  const [clientText, frontendText] = parsed.positionals as [string, string];
  let packet: TracePacket;
  try {
    const f = parseFrontend(frontendText);
    const client = parseAddress(clientText);
    if (!client) throw new TraceUsageError(`client ${JSON.stringify(clientText)} is not an IP address`);
    if (client.family !== (f.address.includes(':') ? 'ipv6' : 'ipv4')) throw new TraceUsageError(`client ${client.text} and frontend ${f.address} are of different address families`);
    packet = { client: client.text, ...f, fromNode: v['from-node'] as boolean };
  } catch (err) {
    if (err instanceof TraceUsageError) return usage(err.message);
    throw err;
  }

  const marks = markBitsOf(v);
  if (typeof marks === 'string') return usage(marks);

  const objects =
    files.length > 0
      ? fromManifests(files, nodeName, v)
      : await fromCluster(v['kubeconfig'] as string | undefined, v['pier-namespace'] as string, parsed.sources['default-class'] !== 'default' ? (v['default-class'] as boolean) : undefined);
  if (typeof objects === 'number') return objects;
  const node = objects.nodes.find((n) => n.metadata?.name === nodeName);
  if (!node) {
    const known = objects.nodes.map((n) => n.metadata?.name).join(', ') || 'none';
    process.stderr.write(`pier trace: no Node named ${JSON.stringify(nodeName)} (Nodes found: ${known})\n`);
    return 1;
  }
  const world = traceWorld({
    nodeName,
    nodeAddresses: nodeAddresses(node),
    services: objects.services,
    slices: objects.slices,
    config: { loadBalancerClass: LOAD_BALANCER_CLASS, defaultClass: objects.defaultClass ?? (v['default-class'] as boolean), maxPortsPerService: v['max-ports-per-service'] as number },
    marks,
  });
  const verdict = trace(world, packet);
  process.stdout.write(v['output'] === 'json' ? `${JSON.stringify(verdict, null, 2)}\n` : verdictText(verdict));
  return verdict.outcome === 'delivered' ? 0 : 1;
}

/** As `pier plan` reads them: bad files skipped and named; Services without a status allocated as the controller would. */
function fromManifests(files: string[], nodeName: string, v: Record<string, OptionValue>): Objects | number {
  const { manifests, errors, duplicates } = readManifestFiles(files);
  for (const err of errors) process.stderr.write(`pier trace: skipped ${err.message}\n`);
  for (const d of duplicates) process.stderr.write(`pier trace: warning: ${d.message}\n`);
  if (!manifests.nodes.some((n) => n.metadata?.name === nodeName)) return manifests;
  const { services, notes } = allocateOffline(manifests, nodeName, allocatorConfig(v));
  // Only when trace made up a status is the note worth reading: the verdict explains the rest.
  if (services.some((s, i) => s !== manifests.services[i])) for (const line of notes) process.stderr.write(`pier trace: ${line}\n`);
  return { ...manifests, services };
}

/** The three lists the agent watches, read once, and whether pier is the default as the controller's Lease says (unless `givenDefaultClass`). */
async function fromCluster(kubeconfig: string | undefined, pierNamespace: string, givenDefaultClass: boolean | undefined): Promise<Objects | number> {
  const { CoordinationV1Api, CoreV1Api, DiscoveryV1Api } = await import('@kubernetes/client-node');
  const { loadKubeConfig } = await import('../lib/kube.ts');
  const { apiStatus } = await import('../lib/lease.ts');
  const { kc } = loadKubeConfig({ kubeconfig });
  const core = kc.makeApiClient(CoreV1Api);
  const discovery = kc.makeApiClient(DiscoveryV1Api);
  const coordination = kc.makeApiClient(CoordinationV1Api);
  // The Lease is read only when it decides something; a missing one (404) or one this user may not read is a note, not a failure.
  const lease: Promise<{ lease?: V1Lease; unreadable?: string }> =
    givenDefaultClass === undefined
      ? coordination.readNamespacedLease({ name: LEADER_LEASE_NAME, namespace: pierNamespace }).then(
          (l) => ({ lease: l }),
          (err: unknown) => (apiStatus(err) === 404 ? {} : { unreadable: apiStatus(err) ? `HTTP ${apiStatus(err)}` : (err as Error).message.split('\n')[0] }),
        )
      : Promise.resolve({});
  try {
    const [nodes, services, slices, read] = await Promise.all([core.listNode(), core.listServiceForAllNamespaces(), discovery.listEndpointSliceForAllNamespaces(), lease]);
    const chosen = chooseSelection({
      given: givenDefaultClass === undefined ? {} : { defaultClass: givenDefaultClass },
      defaults: { defaultClass: false, defaultPool: '' },
      lease: read.lease,
      leaseRef: `${pierNamespace}/${LEADER_LEASE_NAME}`,
      unreadable: read.unreadable,
      needs: ['defaultClass'],
    });
    if (chosen.note) process.stderr.write(`pier trace: ${chosen.note}\n`);
    return { nodes: nodes.items, services: services.items, slices: slices.items, defaultClass: chosen.defaultClass };
  } catch (err) {
    process.stderr.write(`pier trace: cannot list Nodes, Services and EndpointSlices from ${kc.getCurrentCluster()?.server ?? 'the cluster'}: ${(err as Error).message.split('\n')[0]}\n`);
    return 1;
  }
}
