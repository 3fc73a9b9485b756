// `pier cleanup`: removes every pier chain and every jump into one, and
// pier's nftables tables, in both families, and nothing else. For uninstalling: stop the agent first, or it
// puts the rules back at its next sync.
import { parseCommand, type CommandSpec } from '../lib/command.ts';
import { FAMILIES } from '../lib/contract.ts';
import { removeAll } from './applier.ts';
import { detectBackend } from './backend.ts';
import { Xtables, commandRunner, type Backend } from './iptables.ts';
import { BACKEND_OPTION } from './main.ts';
import { removeNftTables } from './nft-applier.ts';

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
  let failed = false;
  for (const backend of backends) {
    for (const family of FAMILIES) {
      const xt = new Xtables(family, backend, runner);
      try {
        const { jumps, chains } = await removeAll(xt);
        process.stdout.write(`${backend} ${family}: removed ${chains} chains and ${jumps} jumps\n`);
      } catch (err) {
        failed = true;
        process.stderr.write(`${backend} ${family}: ${(err as Error).message}\n`);
      }
    }
  }
  // Whichever backend the agent ran with: a host may have switched.
  try {
    const tables = await removeNftTables(runner);
    process.stdout.write(`nftables: removed ${tables} pier table${tables === 1 ? '' : 's'}\n`);
  } catch (err) {
    // A host without nft has no pier table either.
    if (!/cannot run nft/.test((err as Error).message)) {
      failed = true;
      process.stderr.write(`nftables: ${(err as Error).message}\n`);
    }
  }
  return failed ? 1 : 0;
}
