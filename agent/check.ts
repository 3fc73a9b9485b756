// `pier check`: what the agent would report about this node, without a
// cluster: forwarding sysctls, the iptables backend and whether each
// family's nat and filter tables work. Exit 1 when a family cannot forward.
import { parseCommand, type CommandSpec } from '../lib/command.ts';
import { FAMILIES } from '../lib/contract.ts';
import { detectBackend } from './backend.ts';
import { Xtables, commandRunner, type Backend } from './iptables.ts';
import { BACKEND_OPTION } from './main.ts';
import { TABLES } from './render.ts';
import { checkForwarding } from './sysctl.ts';

export const CHECK_SPEC: CommandSpec = {
  name: 'check',
  summary: 'pier check: report whether this node can forward load-balanced traffic',
  usage: 'pier check [--iptables-backend auto|nft|legacy]',
  options: [BACKEND_OPTION],
};

export async function runCheck(argv: string[]): Promise<number> {
  const parsed = parseCommand(CHECK_SPEC, argv);
  if (typeof parsed === 'number') return parsed;
  const runner = commandRunner();
  const choice = parsed.values['iptables-backend'] as 'auto' | Backend;
  const detected = choice === 'auto' ? await detectBackend(runner) : { backend: choice, reason: 'set with --iptables-backend' };
  const lines = [`iptables backend: ${detected.backend} (${detected.reason})`];
  let ok = true;
  for (const family of FAMILIES) {
    const fwd = await checkForwarding(family);
    const xt = new Xtables(family, detected.backend, runner);
    const problems: string[] = fwd.enabled ? [] : [fwd.reason ?? 'forwarding off'];
    for (const table of TABLES) {
      const t = await xt.hasTable(table);
      if (!t.ok) problems.push(`${table} table unusable: ${t.error}`);
    }
    if (problems.length > 0) ok = false;
    lines.push(`${family}: ${problems.length === 0 ? 'can forward' : `cannot forward: ${problems.join('; ')}`}`);
  }
  process.stdout.write(`${lines.join('\n')}\n`);
  return ok ? 0 : 1;
}
