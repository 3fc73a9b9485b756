// `pier check`: what the agent would report about this node, without a
// cluster: forwarding sysctls, and whether the rule backend works (the
// iptables flavour and each family's nat and filter tables, or nft). Exit 1
// when a family cannot forward.
import { parseCommand, type CommandSpec } from '../lib/command.ts';
import { describeSource } from '../lib/config.ts';
import { FAMILIES } from '../lib/contract.ts';
import { autoRuleBackend, choiceReason, detectBackend } from './backend.ts';
import { Xtables, commandRunner, type Backend, type Runner } from './iptables.ts';
import { BACKEND_OPTION, RULE_BACKEND_OPTION } from './main.ts';
import { nftUsable } from './nft-applier.ts';
import { TABLES } from './render.ts';
import { checkForwarding } from './sysctl.ts';

export const CHECK_SPEC: CommandSpec = {
  name: 'check',
  summary: 'pier check: report whether this node can forward load-balanced traffic',
  usage: 'pier check [--backend iptables|nftables|auto] [--iptables-backend auto|nft|legacy]',
  // The agent's own options: `check` answers for the setting the agent runs with (PIER_BACKEND=auto included).
  options: [RULE_BACKEND_OPTION, BACKEND_OPTION],
};

export interface CheckSettings {
  backend: 'iptables' | 'nftables' | 'auto';
  iptablesBackend: 'auto' | Backend;
  /** Where each was set (`--backend`, `PIER_BACKEND`, `the default`). */
  setBy: { backend: string; iptablesBackend: string };
}

/** The report's lines, and whether every family can forward. `procSys` is /proc/sys; tests point it elsewhere. */
export async function checkReport(s: CheckSettings, runner: Runner, procSys?: string): Promise<{ lines: string[]; ok: boolean }> {
  const lines: string[] = [];
  const usable = async (backend: Backend, family: (typeof FAMILIES)[number]) => {
    const xt = new Xtables(family, backend, runner);
    const problems: string[] = [];
    for (const table of TABLES) {
      const t = await xt.hasTable(table);
      if (!t.ok) problems.push(`${table} table unusable: ${t.error}`);
    }
    return problems;
  };
  let detected: { backend: Backend; reason: string } | undefined;
  if (s.backend !== 'nftables') {
    detected =
      s.iptablesBackend === 'auto'
        ? await detectBackend(runner).then((c) => ({ backend: c.backend, reason: choiceReason(s.setBy.iptablesBackend, c.reason) }))
        : { backend: s.iptablesBackend, reason: choiceReason(s.setBy.iptablesBackend) };
  }
  let nft = s.backend === 'nftables' ? await nftUsable(runner) : undefined;
  if (s.backend === 'auto') {
    // As the agent decides: IPv4's tables, then nft only when they fail.
    const xtError = (await usable(detected!.backend, 'ipv4'))[0];
    nft = xtError ? await nftUsable(runner) : undefined;
    const auto = autoRuleBackend(xtError, nft);
    lines.push(`rule backend: ${auto.backend} (${choiceReason(s.setBy.backend, auto.found)})`);
    if (auto.backend === 'nftables') detected = undefined;
    else nft = undefined;
  }
  lines.push(detected ? `iptables backend: ${detected.backend} (${detected.reason})` : `nftables: ${nft?.ok ? 'usable' : `not usable: ${nft?.ok === false ? nft.error : ''}`}`);
  let ok = true;
  for (const family of FAMILIES) {
    const fwd = await checkForwarding(family, { root: procSys });
    const problems: string[] = fwd.enabled ? [] : [fwd.reason ?? 'forwarding off'];
    if (nft?.ok === false) problems.push(`nft unusable: ${nft.error}`);
    if (detected) problems.push(...(await usable(detected.backend, family)));
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
      setBy: { backend: describeSource(RULE_BACKEND_OPTION, sources['backend']!), iptablesBackend: describeSource(BACKEND_OPTION, sources['iptables-backend']!) },
    },
    commandRunner(),
  );
  process.stdout.write(`${lines.join('\n')}\n`);
  return ok ? 0 : 1;
}
