// `pier plan`: the agent's rules for one node and family, from manifests on
// disk, with no cluster: the same model and renderer the agent uses, printed
// as a complete `iptables-restore --noflush` input (jumps inserted at the top
// of their chains, as the agent puts them) that yields exactly the agent's
// ruleset on that host, or as single commands, or with `--backend nftables`
// as the `nft -f` script that replaces pier's table; followed by the
// conntrack clean-up the agent makes after applying them.
//
// Services without a status first get the one the controller would write
// (offline.ts).
import { parseCommand, type CommandSpec } from '../lib/command.ts';
import type { Family } from '../lib/contract.ts';
import { allocatorConfig } from './controller.ts';
import { allocateOffline, OFFLINE_OPTIONS } from './offline.ts';
import { markBitsOf } from './options.ts';
import { readManifestFiles } from './manifests.ts';
import { BACKENDS } from '../agent/backends.ts';
import { Engine } from '../agent/engine/engine.ts';
import { nodeAddresses } from '../agent/engine/model.ts';
import { silentLogger } from '../lib/log.ts';
import { commandRunner } from '../lib/run.ts';
import { describeCheck, flowBaseline, frontendsToCheck } from '../agent/conntrack.ts';

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
    { name: 'backend', type: 'enum', values: BACKENDS.map((b) => b.name), default: 'iptables', env: null, help: "iptables rules, or pier's nftables table (an nft -f script)" },
    { name: 'format', type: 'enum', values: ['restore', 'commands'], default: 'restore', env: null, help: 'iptables-restore input, or one iptables command per line (iptables backend)' },
    { name: 'filename', type: 'list', env: null, help: 'manifest file or directory (.yaml, .yml, .json; repeatable; -f works too)' },
    ...OFFLINE_OPTIONS,
  ],
};

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
  // The agent's own engine and backend, from an empty state: what it would compute on this node.
  const engine = new Engine({
    nodeName,
    model: { loadBalancerClass: config.loadBalancerClass, defaultClass: config.defaultClass, maxPortsPerService: config.maxPortsPerService! },
  });
  const model = engine.model({ nodeAddresses: nodeAddresses(node), services, slices: manifests.slices });
  for (const p of model.problems) {
    process.stderr.write(`pier plan: warning: ${p.service}${p.port ? ` port ${p.port}` : ''}: ${p.reason}: ${p.message}\n`);
  }
  const family = v['family'] as Family;
  // A dry run's backend runs nothing.
  const backend = await BACKENDS.find((b) => b.name === v['backend'])!.open(
    { runner: commandRunner(), log: silentLogger, marks },
    { iptablesFlavour: 'auto', setBy: { backend: '--backend', iptablesBackend: '--iptables-backend' }, reason: '', dryRun: true },
  );
  const renderer = backend.renderer(family);
  const update = renderer.render(model[family], undefined, { whole: true });
  process.stdout.write(renderer.text(update, undefined, v['format'] as 'restore' | 'commands').text);
  // What the agent deletes once these rules are in place, as comments both formats allow.
  process.stdout.write(frontendsToCheck(undefined, flowBaseline(model[family])).map(describeCheck).join(''));
  if (errors.length > 0) {
    process.stderr.write(`pier plan: ${errors.length} file${errors.length === 1 ? '' : 's'} skipped (above); the plan leaves out what ${errors.length === 1 ? 'it holds' : 'they hold'}\n`);
  }
  if (duplicates.length > 0) {
    process.stderr.write(`pier plan: ${duplicates.length} object${duplicates.length === 1 ? '' : 's'} read again later (above); the plan uses the later one of each\n`);
  }
  return errors.length > 0 || duplicates.length > 0 ? 1 : 0;
}
