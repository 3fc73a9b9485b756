// `pier cleanup`: removes every pier chain and every jump into one, and
// pier's nftables tables, in both families, and nothing else. For uninstalling: stop the agent first, or it
// puts the rules back at its next sync.
import { parseCommand, type CommandSpec } from '../lib/command.ts';
import { commandRunner } from '../lib/run.ts';
import { removeRules } from '../agent/backends.ts';
import { IPTABLES_FLAVOUR_OPTION } from './options.ts';

export const CLEANUP_SPEC: CommandSpec = {
  name: 'cleanup',
  summary: "pier cleanup: remove every pier chain and rule, and pier's nftables tables, from this node, IPv4 and IPv6",
  usage: 'pier cleanup [--iptables-backend auto|nft|legacy]',
  options: [IPTABLES_FLAVOUR_OPTION],
};

export async function runCleanup(argv: string[]): Promise<number> {
  const parsed = parseCommand(CLEANUP_SPEC, argv);
  if (typeof parsed === 'number') return parsed;
  // Every backend's rules, whichever the agent ran with: a host may have switched.
  // With auto, every iptables flavour too, and what the host uses is said first.
  let failed = false;
  for (const r of await removeRules(commandRunner(), { iptablesFlavour: parsed.values['iptables-backend'] as string, explain: true })) {
    if (r.error === undefined) process.stdout.write(`${r.part}: ${r.summary}\n`);
    else {
      failed = true;
      process.stderr.write(`${r.part}: ${r.error}\n`);
    }
  }
  return failed ? 1 : 0;
}
