// `pier check`: what the agent would report about this node, without a
// cluster: forwarding sysctls, and whether the rule backend works (the
// iptables flavour and each family's nat and filter tables, or nft). Exit 1
// when a family cannot forward.
import { parseCommand, type CommandSpec } from '../lib/command.ts';
import { describeSource } from '../lib/config.ts';
import { FAMILIES } from '../lib/contract.ts';
import { silentLogger } from '../lib/log.ts';
import { commandRunner, type Runner } from '../lib/run.ts';
import { openBackend } from '../agent/backends.ts';
import { checkForwarding } from '../agent/sysctl.ts';
import { IPTABLES_FLAVOUR_OPTION, BACKEND_OPTION } from './options.ts';

export const CHECK_SPEC: CommandSpec = {
  name: 'check',
  summary: 'pier check: report whether this node can forward load-balanced traffic',
  usage: 'pier check [--backend iptables|nftables|auto] [--iptables-backend auto|nft|legacy]',
  // The agent's own options: `check` answers for the setting the agent runs with (PIER_BACKEND=auto included).
  options: [BACKEND_OPTION, IPTABLES_FLAVOUR_OPTION],
};

export interface CheckSettings {
  backend: 'iptables' | 'nftables' | 'auto';
  iptablesBackend: 'auto' | 'nft' | 'legacy';
  /** Where each was set (`--backend`, `PIER_BACKEND`, `the default`). */
  setBy: { backend: string; iptablesBackend: string };
}

/** The report's lines, and whether every family can forward. `procSys` is /proc/sys; tests point it elsewhere. */
export async function checkReport(s: CheckSettings, runner: Runner, procSys?: string): Promise<{ lines: string[]; ok: boolean }> {
  const lines: string[] = [];
  // As the agent chooses: auto takes the first backend that works.
  const backend = await openBackend({ runner, log: silentLogger, marks: { accept: 0, masquerade: 0 } }, { backend: s.backend, iptablesFlavour: s.iptablesBackend, setBy: s.setBy, dryRun: false, wording: 'report' });
  if (s.backend === 'auto') lines.push(`rule backend: ${backend.description.name} (${backend.description.reason})`);
  lines.push(await backend.hostLine());
  let ok = true;
  for (const family of FAMILIES) {
    const fwd = await checkForwarding(family, { root: procSys });
    const problems: string[] = fwd.enabled ? [] : [fwd.reason ?? 'forwarding off'];
    for (const u of await backend.check(family)) problems.push(u.report);
    if (problems.length > 0) ok = false;
    lines.push(`${family}: ${problems.length === 0 ? 'can forward' : `cannot forward: ${problems.join('; ')}`}`);
  }
  return { lines, ok };
}

export async function runCheck(argv: string[]): Promise<number> {
  const parsed = parseCommand(CHECK_SPEC, argv);
  if (typeof parsed === 'number') return parsed;
  const { values: v, sources } = parsed;
  const { lines, ok } = await checkReport(
    {
      backend: v['backend'] as CheckSettings['backend'],
      iptablesBackend: v['iptables-backend'] as CheckSettings['iptablesBackend'],
      setBy: { backend: describeSource(BACKEND_OPTION, sources['backend']!), iptablesBackend: describeSource(IPTABLES_FLAVOUR_OPTION, sources['iptables-backend']!) },
    },
    commandRunner(),
  );
  process.stdout.write(`${lines.join('\n')}\n`);
  return ok ? 0 : 1;
}
