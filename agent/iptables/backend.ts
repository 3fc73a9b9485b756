// The iptables backend: pier's chains in the nat and filter tables, written
// with iptables-restore in the host's flavour (nft or legacy).
import type { Family } from '../../lib/contract.ts';
import { FAMILIES } from '../../lib/contract.ts';
import type { Runner } from '../../lib/run.ts';
import { choiceReason, type ApplyResult, type Backend, type BackendContext, type BackendKind, type BackendSettings, type FamilyApplier, type FamilyRenderer, type Removal, type RemovalScope, type RuleCount, type Unusable } from '../backend.ts';
import { Applier, driftLines, eachFamily, removeAll } from './applier.ts';
import { detectFlavour } from './flavour.ts';
import { TABLES, type Ruleset } from './render.ts';
import { IptablesRenderer } from './renderer.ts';
import { commandsText, planText, restoreText } from './restore.ts';
import { Xtables, type IptablesFlavour } from './xtables.ts';

export const FLAVOURS: readonly IptablesFlavour[] = ['nft', 'legacy'];

/** `iptables` or `ip6tables`: the family's command, as messages name it. */
export function iptablesCommand(family: Family): string {
  return family === 'ipv4' ? 'iptables' : 'ip6tables';
}

/** What keeps the iptables flavour from serving `family`: each of pier's tables that does not work. */
export async function iptablesUnusable(flavour: IptablesFlavour, family: Family, runner: Runner): Promise<Unusable[]> {
  const xt = new Xtables(family, flavour, runner);
  const out: Unusable[] = [];
  for (const table of TABLES) {
    const t = await xt.hasTable(table);
    if (!t.ok) out.push({ lease: `${iptablesCommand(family)} has no usable ${table} table: ${t.error}`, report: `${table} table unusable: ${t.error}` });
  }
  return out;
}

/** The flavour the settings name, or the host's; a dry run detects nothing and shows nft. */
async function flavourOf(settings: BackendSettings, runner: Runner): Promise<{ flavour: IptablesFlavour; reason: string; detected: boolean }> {
  if (settings.dryRun) return { flavour: 'nft', reason: '', detected: false };
  if (settings.iptablesFlavour === 'auto') {
    const choice = await detectFlavour(runner);
    return { flavour: choice.backend, reason: choiceReason(settings.setBy.iptablesBackend, choice.reason), detected: true };
  }
  return { flavour: settings.iptablesFlavour as IptablesFlavour, reason: choiceReason(settings.setBy.iptablesBackend), detected: true };
}

class IptablesFamilyRenderer implements FamilyRenderer<Ruleset> {
  readonly family: Family;
  private readonly renderer: IptablesRenderer;

  constructor(family: Family, marks: BackendContext['marks']) {
    this.family = family;
    this.renderer = new IptablesRenderer(family, { marks });
  }

  prepare(served: Parameters<FamilyRenderer<Ruleset>['prepare']>[0]): void {
    this.renderer.prepare(served);
  }

  render(model: Parameters<FamilyRenderer<Ruleset>['render']>[0], changes: Parameters<FamilyRenderer<Ruleset>['render']>[1]): Ruleset {
    return this.renderer.render(model, changes);
  }

  text(update: Ruleset, previous: Ruleset | undefined, format: 'restore' | 'commands' = 'restore'): { tool: string; text: string } {
    const text = previous ? restoreText(update, { previous }) : format === 'commands' ? commandsText(update, this.family) : planText(update);
    return { tool: `${iptablesCommand(this.family)}-restore --noflush`, text };
  }

  count(update: Ruleset): RuleCount[] {
    return TABLES.map((table) => {
      const t = update.tables[table];
      let rules = t.jumps.length;
      for (const c of t.chains.values()) rules += c.length;
      return { table, rules, chains: t.chains.size };
    });
  }
}

class IptablesFamilyApplier implements FamilyApplier<Ruleset> {
  private readonly applier: Applier;

  constructor(applier: Applier) {
    this.applier = applier;
  }

  get holdsRules(): boolean {
    return this.applier.holdsRules;
  }

  prepare(): void {
    void this.applier.prepare();
  }

  async apply(update: Ruleset, opts: { verify: boolean }): Promise<ApplyResult> {
    const r = await this.applier.apply(update, opts);
    return { family: r.family, mode: r.mode, payloadBytes: r.payloadBytes, reason: r.reason, drift: r.drift && driftLines(r.drift) };
  }

  close(): void {
    this.applier.close();
  }
}

export const iptablesBackend: BackendKind = {
  name: 'iptables',

  async open(ctx: BackendContext, settings: BackendSettings): Promise<Backend<Ruleset>> {
    const { flavour, reason, detected } = await flavourOf(settings, ctx.runner);
    return {
      description: {
        name: 'iptables',
        reason: settings.reason,
        // A dry run detects no flavour: the label stays empty rather than guess.
        flavour: detected ? flavour : '',
        logFields: { iptablesBackend: flavour, iptablesBackendReason: reason },
      },
      check: (family) => iptablesUnusable(flavour, family, ctx.runner),
      checkHost: async () => {},
      hostLine: async () => `iptables backend: ${flavour} (${reason})`,
      renderer: (family) => new IptablesFamilyRenderer(family, ctx.marks),
      applier: (family) => new IptablesFamilyApplier(new Applier(new Xtables(family, flavour, ctx.runner), ctx.log, ctx.metrics)),
      eachFamily: (families, apply) => eachFamily(flavour, families, apply),
    };
  },

  async removeAll(runner: Runner, scope: RemovalScope): Promise<Removal[]> {
    const out: Removal[] = [];
    const auto = scope.iptablesFlavour === 'auto';
    if (auto && scope.explain) {
      // Both flavours go: rules an earlier agent wrote with the other one
      // (before a host switched) would otherwise survive the uninstall.
      const detected = await detectFlavour(runner);
      out.push({ part: 'host iptables backend', removed: 0, summary: `${detected.backend} (${detected.reason}); cleaning both` });
    }
    for (const flavour of auto ? FLAVOURS : [scope.iptablesFlavour as IptablesFlavour]) {
      for (const family of FAMILIES) {
        const part = `${flavour} ${family}`;
        try {
          const { jumps, chains } = await removeAll(new Xtables(family, flavour, runner));
          out.push({ part, removed: jumps + chains, summary: `removed ${chains} chains and ${jumps} jumps` });
        } catch (err) {
          out.push({ part, removed: 0, summary: 'failed', error: (err as Error).message });
        }
      }
    }
    return out;
  },
};
