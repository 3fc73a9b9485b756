// `pier plan`: the agent's rules for one node and family, from manifests on
// disk, with no cluster: the same model and renderer the agent uses, printed
// as a complete `iptables-restore --noflush` input (jumps included) that
// yields exactly the agent's ruleset on an empty host, or as single commands,
// followed by the conntrack clean-up the agent makes after applying them.
import { parseCommand, type CommandSpec } from '../lib/command.ts';
import { LOAD_BALANCER_CLASS, type Family } from '../lib/contract.ts';
import { nodeAddresses } from './agent.ts';
import { ManifestError, readManifests } from './manifests.ts';
import { buildModel } from './model.ts';
import { renderRuleset } from './render.ts';
import { commandsText, planText } from './restore.ts';
import { describeCheck, flowFrontends, frontendsToCheck } from './conntrack.ts';

export const PLAN_SPEC: CommandSpec = {
  name: 'plan',
  summary: 'pier plan: print the iptables rules the agent would hold on a node, from Node, Service and EndpointSlice manifests',
  usage: 'pier plan --node NAME [--family ipv4|ipv6] [--format restore|commands] -f FILE_OR_DIR [-f ...]',
  allowPositionals: false,
  options: [
    { name: 'node', type: 'string', env: null, help: 'the Node (from the manifests) to plan for' },
    { name: 'family', type: 'enum', values: ['ipv4', 'ipv6'], default: 'ipv4', env: null, help: 'address family' },
    { name: 'format', type: 'enum', values: ['restore', 'commands'], default: 'restore', env: null, help: 'iptables-restore input, or one iptables command per line' },
    { name: 'filename', type: 'list', env: null, help: 'manifest file or directory (.yaml, .yml, .json; repeatable; -f works too)' },
    { name: 'default-class', type: 'boolean', default: false, env: null, help: 'also plan Services without a loadBalancerClass' },
    { name: 'masquerade-bit', type: 'int', default: 13, min: 0, max: 31, env: null, help: 'packet-mark bit that asks for masquerading' },
    { name: 'max-ports-per-service', type: 'int', default: 256, min: 1, max: 65535, env: null, help: 'Services with more ports are skipped' },
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
  let manifests;
  try {
    manifests = readManifests(files);
  } catch (err) {
    if (err instanceof ManifestError) {
      process.stderr.write(`pier plan: ${err.message}\n`);
      return 1;
    }
    throw err;
  }
  const node = manifests.nodes.find((n) => n.metadata?.name === nodeName);
  if (!node) {
    const known = manifests.nodes.map((n) => n.metadata?.name).join(', ') || 'none';
    process.stderr.write(`pier plan: no Node named ${JSON.stringify(nodeName)} in the manifests (Nodes found: ${known})\n`);
    return 1;
  }
  const model = buildModel({
    nodeName,
    nodeAddresses: nodeAddresses(node),
    services: manifests.services,
    slices: manifests.slices,
    config: {
      loadBalancerClass: LOAD_BALANCER_CLASS,
      defaultClass: v['default-class'] as boolean,
      maxPortsPerService: v['max-ports-per-service'] as number,
    },
  });
  for (const p of model.problems) {
    process.stderr.write(`pier plan: warning: ${p.service}${p.port ? ` port ${p.port}` : ''}: ${p.reason}: ${p.message} (skipped, as the agent would)\n`);
  }
  const family = v['family'] as Family;
  const ruleset = renderRuleset(model[family], { markBit: 1 << (v['masquerade-bit'] as number) });
  process.stdout.write(v['format'] === 'commands' ? commandsText(ruleset, family) : planText(ruleset));
  // What the agent deletes once these rules are in place, as comments both formats allow.
  process.stdout.write(frontendsToCheck(undefined, flowFrontends(model[family])).map(describeCheck).join(''));
  return 0;
}
