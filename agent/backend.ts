// The one seam between the agent and the kernel's rules. The engine
// (engine/) turns the cluster into a model per family; a backend owns only
// how that model is spelled as rules and how they are applied: iptables
// chains (iptables/) or pier's own nftables table (nftables/). The agent,
// `pier plan`, `--dry-run`, `pier check` and `pier cleanup` speak to this
// interface alone; backends.ts is where one is chosen.
import type { Family } from '../lib/contract.ts';
import type { Logger } from '../lib/log.ts';
import type { Runner } from '../lib/run.ts';
import type { FamilyModel, PortChanges, ServedPort } from './engine/model.ts';
import type { AgentMetrics } from './metrics.ts';

/** `--backend`'s words, and the Lease's `pier.dev/backend`. */
export type BackendName = 'iptables' | 'nftables';

/** How an apply went: nothing to do, a change written, or everything rewritten. */
export type ApplyMode = 'noop' | 'partial' | 'full';

/** One family's apply, in one shape for every backend. */
export interface ApplyResult {
  family: Family;
  mode: ApplyMode;
  /** Bytes handed to the tool (0 for noop). */
  payloadBytes: number;
  /** Why everything was rewritten, when it was. */
  reason?: string;
  /** What a verifying resync found changed from outside (and rewrote), one line each; absent when nothing was. */
  drift?: string[];
}

/** What a backend says about itself: for the Lease, the start log and build_info. */
export interface BackendDescription {
  name: BackendName;
  /** Why this backend: where it was set, and for auto what was found. */
  reason: string;
  /** The Lease's `pier.dev/iptables-backend` and build_info's `iptables_backend`: the iptables flavour, '' where there is none. */
  flavour: string;
  /** Fields the start log adds. */
  logFields: Record<string, string>;
}

/** What keeps a backend from serving a family on this host. */
export interface Unusable {
  /** As the Lease's reason and the agent's log say it. */
  lease: string;
  /** As `pier check` says it. */
  report: string;
}

/** Rules and chains one update holds, per table, for the metrics. */
export interface RuleCount {
  table: string;
  rules: number;
  chains: number;
}

/** Output formats of `pier plan`; a backend with one format ignores the choice. */
export type TextFormat = 'restore' | 'commands';

/**
 * One family's renderer: the engine's model to the backend's update (`U`,
 * opaque to the agent), kept between syncs so that a change costs what it
 * touches.
 */
export interface FamilyRenderer<U> {
  readonly family: Family;
  /** A served port the first render will add, rendered ahead (the head start). */
  prepare(served: ServedPort): void;
  /**
   * The update that makes the kernel hold `model`. `changes` is the
   * engine's record of how `model` came from the last one; `whole` says the
   * next apply writes everything anyway, so no change needs spelling.
   */
  render(model: FamilyModel, changes: PortChanges | undefined, opts: { whole: boolean }): U;
  /** What a person reads: the complete input for the tool, or with `previous` the change since it. */
  text(update: U, previous: U | undefined, format?: TextFormat): { tool: string; text: string };
  count(update: U): RuleCount[];
}

/** One family's applier: makes the kernel hold an update, with as little work as it can. */
export interface FamilyApplier<U> {
  /** Whether the kernel holds what this applier last wrote; when not, the next apply writes everything. */
  readonly holdsRules: boolean;
  /** Starts ahead what the next full write needs (a save read, a process waiting for its input). */
  prepare(): void;
  /** `verify` (periodic resyncs): also reads the kernel back and rewrites what differs. */
  apply(update: U, opts: { verify: boolean }): Promise<ApplyResult>;
  /** Drops what was started ahead and any resident process. */
  close(): void;
}

/** What a backend is given when it is opened. */
export interface BackendContext {
  runner: Runner;
  log: Logger;
  metrics?: Pick<AgentMetrics, 'drift'>;
  /** The connection-mark bits pier's rules set. */
  marks: { accept: number; masquerade: number };
  /** Warns an operator (log and Event on the Node); `reason` is the Event's. */
  warn?: (reason: string, note: string, fields: Record<string, unknown>) => void;
}

/** A backend opened for this host, chosen once at start. */
export interface Backend<U = unknown> {
  readonly description: BackendDescription;
  /** What keeps `family` from being served on this host; empty when nothing does. */
  check(family: Family): Promise<Unusable[]>;
  /** Host-wide conditions to report at each check (the agent's Events). */
  checkHost(): Promise<void>;
  /** `pier check`'s line about the backend itself: which flavour and why, or whether its tool works. */
  hostLine(): Promise<string>;
  renderer(family: Family): FamilyRenderer<U>;
  applier(family: Family): FamilyApplier<U>;
  /** Runs `apply` for each family: side by side where the tool allows it, else one after the other. */
  eachFamily<T>(families: readonly Family[], apply: (family: Family) => Promise<T>): Promise<T[]>;
}

/** What a removal is asked to take: `iptablesFlavour` 'auto' means every flavour. */
export interface RemovalScope {
  iptablesFlavour: string;
  /** Say what was detected on the host, for `pier cleanup`'s output. */
  explain: boolean;
}

/** What one part of a removal did: how much went, or why it could not look. */
export interface Removal {
  /** For example `nft ipv4` (an iptables flavour and family) or `nftables`. */
  part: string;
  /** How many chains and jumps, or tables, went. */
  removed: number;
  summary: string;
  error?: string;
}

/** A backend before it is chosen: how to open it, and how to take everything of it away. */
export interface BackendKind {
  name: BackendName;
  /** Opens it for this host. `setBy` names where the setting came from, for the reasons; `dryRun` runs no command. */
  open(ctx: BackendContext, settings: BackendSettings): Promise<Backend>;
  /** Removes every rule of pier's this backend may have written, and nothing else. Never throws. */
  removeAll(runner: Runner, scope: RemovalScope): Promise<Removal[]>;
}

/** The agent's settings a backend reads when it is opened. */
export interface BackendSettings {
  /** `--iptables-backend`: 'auto' or a flavour. */
  iptablesFlavour: string;
  setBy: { backend: string; iptablesBackend: string };
  /** Why this backend was chosen, as the start log says it. */
  reason: string;
  dryRun: boolean;
}

/**
 * Why a backend setting has its value, for the start log: where it was set
 * (`setBy`: `--backend`, `PIER_BACKEND` or `the default`) and, for auto, what
 * detection found. An operator reading the log can then find the setting.
 */
export function choiceReason(setBy: string, found?: string): string {
  const how = setBy === 'the default' ? 'the default' : `set with ${setBy}`;
  return found === undefined ? how : `auto (${how}): ${found}`;
}
