// `pier cleanup`: removes every pier chain and every jump into one, and
// pier's nftables tables, in both families, and nothing else. For uninstalling: stop the agent first, or it
// puts the rules back at its next sync.
import { parseCommand, type CommandSpec } from '../lib/command.ts';
import { detectBackend } from './backend.ts';
import { commandRunner, type Backend } from './iptables.ts';
import { BACKEND_OPTION } from './main.ts';
import { removePierRules } from './removal.ts';

export const CLEANUP_SPEC: CommandSpec = {
  name: 'cleanup',
  summary: "pier cleanup: remove every pier chain and rule, and pier's nftables tables, from this node, IPv4 and IPv6",
  usage: 'pier cleanup [--iptables-backend auto|nft|legacy]',
  options: [BACKEND_OPTION],
};

export async function runCleanup(argv: string[]): Promise<number> {
  const parsed = parseCommand(CLEANUP_SPEC, argv);
  if (typeof parsed === 'number') return parsed;
  const runner = commandRunner();
  const choice = parsed.values['iptables-backend'] as 'auto' | Backend;
  const backends: Backend[] = choice === 'auto' ? ['nft', 'legacy'] : [choice];
  if (choice === 'auto') {
    // Clean both flavours: rules an earlier agent wrote with the other one
    // (before a host switched backends) would otherwise survive the uninstall.
    const detected = await detectBackend(runner);
    process.stdout.write(`host iptables backend: ${detected.backend} (${detected.reason}); cleaning both\n`);
  }
  // Whichever backend the agent ran with, its nftables tables too: a host may have switched.
  let failed = false;
  for (const r of await removePierRules(runner, { iptables: backends, nftables: true })) {
    if (r.error === undefined) process.stdout.write(`${r.part}: ${r.summary}\n`);
    else {
      failed = true;
      process.stderr.write(`${r.part}: ${r.error}\n`);
    }
  }
  return failed ? 1 : 0;
}
