// Where a backend is chosen: once, when the agent (or `pier check`) starts.
// A new backend is a folder implementing backend.ts and one line in BACKENDS.
import type { Runner } from '../lib/run.ts';
import { choiceReason, type Backend, type BackendContext, type BackendKind, type BackendName, type BackendSettings, type Removal, type RemovalScope } from './backend.ts';
import { iptablesBackend } from './iptables/backend.ts';
import { nftablesBackend } from './nftables/backend.ts';

/** Every backend, in auto's order of preference. */
export const BACKENDS: readonly BackendKind[] = [iptablesBackend, nftablesBackend];

/**
 * What `--backend auto` takes, from what keeps the first backend from
 * serving IPv4 (`firstError`) and, only when something does, whether the
 * next one works: the first wherever it works, the next for hosts without it.
 */
export function autoBackend(firstError: string | undefined, next: { ok: true } | { ok: false; error: string } | undefined): { backend: BackendName; found: string } {
  if (!firstError) return { backend: 'iptables', found: 'iptables works' };
  if (next?.ok) return { backend: 'nftables', found: `iptables does not work (${firstError}); nft does` };
  return { backend: 'iptables', found: `neither works; iptables: ${firstError}` };
}

export interface BackendChoice {
  /** `--backend`: a backend's name, or auto. */
  backend: string;
  iptablesFlavour: string;
  setBy: { backend: string; iptablesBackend: string };
  dryRun: boolean;
  /** Whose words auto's reason uses for what keeps a backend out: the Lease's (the agent) or `pier check`'s. */
  wording?: 'lease' | 'report';
}

/** Opens the backend the settings name; auto resolved here, by trying each in BACKENDS' order. */
export async function openBackend(ctx: BackendContext, choice: BackendChoice): Promise<Backend> {
  const settings = (reason: string): BackendSettings => ({ iptablesFlavour: choice.iptablesFlavour, setBy: choice.setBy, reason, dryRun: choice.dryRun });
  const named = BACKENDS.find((b) => b.name === choice.backend);
  if (named) return named.open(ctx, settings(choiceReason(choice.setBy.backend)));
  const [first, next] = BACKENDS as [BackendKind, BackendKind];
  // Nothing is run in a dry run; auto shows what the default would write.
  if (choice.dryRun) return first.open(ctx, settings(choiceReason(choice.setBy.backend, `a dry run shows ${first.name}`)));
  const tried = [await first.open(ctx, settings(''))];
  const firstError = (await tried[0]!.check('ipv4'))[0]?.[choice.wording ?? 'lease'];
  if (firstError) tried.push(await next.open(ctx, settings('')));
  const nextProblems = firstError ? await tried[1]!.check('ipv4') : undefined;
  const auto = autoBackend(firstError, nextProblems && (nextProblems.length === 0 ? { ok: true } : { ok: false, error: nextProblems[0]!.report }));
  const chosen = tried.find((b) => b.description.name === auto.backend)!;
  return { ...chosen, description: { ...chosen.description, reason: choiceReason(choice.setBy.backend, auto.found) } };
}

/** Removes pier's rules of every backend but `keep` (all of them without it). Never throws. */
export async function removeRules(runner: Runner, scope: RemovalScope, keep?: BackendName): Promise<Removal[]> {
  const out: Removal[] = [];
  for (const b of BACKENDS) if (b.name !== keep) out.push(...(await b.removeAll(runner, scope)));
  return out;
}
