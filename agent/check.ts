// `pier check`: what the agent would report about this node, without a
// cluster: forwarding sysctls, and whether the rule backend works (the
// iptables flavour and each family's nat and filter tables, or nft). Exit 1
// when a family cannot forward.
import { parseCommand, type CommandSpec } from '../lib/command.ts';
import { FAMILIES } from '../lib/contract.ts';
import { detectBackend } from './backend.ts';
import { Xtables, commandRunner, type Backend } from './iptables.ts';
import { BACKEND_OPTION, RULE_BACKEND_OPTION } from './main.ts';
import { nftUsable } from './nft-applier.ts';
import { TABLES } from './render.ts';
import { checkForwarding } from './sysctl.ts';

export const CHECK_SPEC: CommandSpec = {
  name: 'check',
  summary: 'pier check: report whether this node can forward load-balanced traffic',
  usage: 'pier check [--backend iptables|nftables] [--iptables-backend auto|nft|legacy]',
  options: [{ ...RULE_BACKEND_OPTION, values: ['iptables', 'nftables'] }, BACKEND_OPTION],
};

export async function runCheck(argv: string[]): Promise<number> {
  const parsed = parseCommand(CHECK_SPEC, argv);
  if (typeof parsed === 'number') return parsed;
  const runner = commandRunner();
  const nftables = parsed.values['backend'] === 'nftables';
  const choice = parsed.values['iptables-backend'] as 'auto' | Backend;
  const detected = nftables ? undefined : choice === 'auto' ? await detectBackend(runner) : { backend: choice, reason: 'set with --iptables-backend' };
  const nft = nftables ? await nftUsable(runner) : undefined;
  const lines = [detected ? `iptables backend: ${detected.backend} (${detected.reason})` : `nftables: ${nft?.ok ? 'usable' : `not usable: ${nft?.ok === false ? nft.error : ''}`}`];
  let ok = true;
  for (const family of FAMILIES) {
    const fwd = await checkForwarding(family);
    const problems: string[] = fwd.enabled ? [] : [fwd.reason ?? 'forwarding off'];
    if (nft?.ok === false) problems.push(`nft unusable: ${nft.error}`);
    if (detected) {
      const xt = new Xtables(family, detected.backend, runner);
      for (const table of TABLES) {
        const t = await xt.hasTable(table);
        if (!t.ok) problems.push(`${table} table unusable: ${t.error}`);
      }
    }
    if (problems.length > 0) ok = false;
    lines.push(`${family}: ${problems.length === 0 ? 'can forward' : `cannot forward: ${problems.join('; ')}`}`);
  }
  process.stdout.write(`${lines.join('\n')}\n`);
  return ok ? 0 : 1;
}
