// Typed configuration from command-line flags and environment variables.
// Every option has one spec; its flag is `--name`, its variable PIER_NAME
// (upper snake case). A flag beats the variable, which beats the default.
// Every rejected value is reported with where it came from, so a person can
// find the typo in a manifest or a shell history.
import { parseArgs } from 'node:util';
import { ExplainedError } from './errors.ts';

export type OptionType = 'string' | 'boolean' | 'int' | 'duration' | 'enum' | 'list';

interface BaseSpec {
  /** Flag name without dashes, kebab case: `min-sync-interval`. */
  name: string;
  help: string;
  /** Overrides the derived PIER_* variable name; `null` means flag only. */
  env?: string | null;
}

export type OptionSpec =
  | (BaseSpec & { type: 'string'; default?: string; validate?: (v: string) => string | undefined })
  | (BaseSpec & { type: 'boolean'; default?: boolean })
  | (BaseSpec & { type: 'int'; default?: number; min?: number; max?: number })
  | (BaseSpec & { type: 'duration'; default?: number; min?: number })
  | (BaseSpec & { type: 'enum'; values: readonly string[]; default?: string })
  | (BaseSpec & { type: 'list'; default?: string[]; validate?: (v: string) => string | undefined });

export type OptionValue = string | boolean | number | string[] | undefined;

export class ConfigError extends ExplainedError {
  override name = 'ConfigError';
}

export function envName(spec: Pick<BaseSpec, 'name' | 'env'>): string | undefined {
  if (spec.env === null) return undefined;
  return spec.env ?? `PIER_${spec.name.replaceAll('-', '_').toUpperCase()}`;
}

const DURATION = /^(\d+(?:\.\d+)?)(ms|s|m|h)$/;
const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/** Parses Go-style durations (`500ms`, `10s`, `1.5m`, `2h`) into milliseconds. */
export function parseDuration(text: string): number | undefined {
  const m = DURATION.exec(text.trim());
  if (!m) return undefined;
  return Math.round(Number(m[1]) * UNIT_MS[m[2]!]!);
}

function convert(spec: OptionSpec, raw: string | boolean, source: string): OptionValue {
  const bad = (why: string) => new ConfigError(`${source}: ${JSON.stringify(raw)} ${why}`);
  switch (spec.type) {
    case 'boolean': {
      if (typeof raw === 'boolean') return raw;
      const t = raw.trim().toLowerCase();
      if (['1', 'true', 'yes', 'on'].includes(t)) return true;
      if (['0', 'false', 'no', 'off', ''].includes(t)) return false;
      throw bad('is not a boolean (use true or false)');
    }
    case 'string': {
      const v = String(raw);
      const why = spec.validate?.(v);
      if (why) throw bad(why);
      return v;
    }
    case 'int': {
      const v = String(raw).trim();
      if (!/^-?\d+$/.test(v)) throw bad('is not an integer');
      const n = Number(v);
      if (spec.min !== undefined && n < spec.min) throw bad(`is below the minimum ${spec.min}`);
      if (spec.max !== undefined && n > spec.max) throw bad(`is above the maximum ${spec.max}`);
      return n;
    }
    case 'duration': {
      const ms = parseDuration(String(raw));
      if (ms === undefined) throw bad('is not a duration (examples: 500ms, 10s, 1m, 2h)');
      if (spec.min !== undefined && ms < spec.min) throw bad(`is shorter than the minimum ${spec.min}ms`);
      return ms;
    }
    case 'enum': {
      const v = String(raw);
      if (!spec.values.includes(v)) throw bad(`is not one of ${spec.values.join(', ')}`);
      return v;
    }
    case 'list': {
      const items = String(raw)
        .split(',')
        .map((s) => s.trim())
        .filter((s) => s !== '');
      for (const item of items) {
        const why = spec.validate?.(item);
        if (why) throw new ConfigError(`${source}: ${JSON.stringify(item)} ${why}`);
      }
      return items;
    }
  }
}

/** Where an option's value came from. */
export type OptionSource = 'flag' | 'env' | 'default';

export interface ParsedConfig {
  values: Record<string, OptionValue>;
  /** Per option, so a caller can tell a value given from a default (and say which). */
  sources: Record<string, OptionSource>;
  positionals: string[];
}

/** How a person set `spec`'s value: `--backend`, `PIER_BACKEND` or `the default`. */
export function describeSource(spec: Pick<BaseSpec, 'name' | 'env'>, source: OptionSource): string {
  if (source === 'flag') return `--${spec.name}`;
  if (source === 'env') return envName(spec) ?? `--${spec.name}`;
  return 'the default';
}

/**
 * Resolves every option from argv, then env, then its default. Unknown flags,
 * missing flag values and invalid values throw ConfigError.
 */
export function parseConfig(
  specs: readonly OptionSpec[],
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>>,
  opts: { allowPositionals?: boolean } = {},
): ParsedConfig {
  const options: Record<string, { type: 'string' | 'boolean'; multiple?: boolean }> = {};
  for (const s of specs) {
    options[s.name] = { type: s.type === 'boolean' ? 'boolean' : 'string', multiple: s.type === 'list' };
  }
  // Booleans also take `--name=false`, the spelling Kubernetes components use
  // (`--leader-elect=false`), and `--no-name`; parseArgs knows only the latter.
  const booleans = new Map(specs.filter((s) => s.type === 'boolean').map((s) => [s.name, s]));
  const end = argv.indexOf('--');
  const args = argv.map((arg, i) => {
    const m = end >= 0 && i > end ? null : /^--([^=]+)=(.*)$/s.exec(arg);
    const spec = m ? booleans.get(m[1]!) : undefined;
    if (!m || !spec) return arg;
    return convert(spec, m[2]!, `--${m[1]}`) ? `--${m[1]}` : `--no-${m[1]}`;
  });
  let parsed;
  try {
    parsed = parseArgs({ args, options, strict: true, allowNegative: true, allowPositionals: opts.allowPositionals ?? false });
  } catch (err) {
    throw parseArgsError(err as Error & { code?: string }, specs);
  }
  const values: Record<string, OptionValue> = {};
  const sources: Record<string, OptionSource> = {};
  for (const s of specs) {
    const fromFlag = parsed.values[s.name];
    const variable = envName(s);
    const fromEnv = variable === undefined ? undefined : env[variable];
    if (fromFlag !== undefined) {
      // Lists may be given as repeated flags or comma-separated, or both.
      const raw = Array.isArray(fromFlag) ? fromFlag.join(',') : fromFlag;
      values[s.name] = convert(s, raw, `--${s.name}`);
      sources[s.name] = 'flag';
    } else if (fromEnv !== undefined && fromEnv !== '') {
      values[s.name] = convert(s, fromEnv, variable!);
      sources[s.name] = 'env';
    } else {
      values[s.name] = s.default;
      sources[s.name] = 'default';
    }
  }
  return { values, sources, positionals: parsed.positionals };
}

/**
 * node:util parseArgs' errors in pier's words. Its own advice (about
 * positionals after `--`) rarely fits and quotes unevenly; the errors carry
 * only a code and a message, so the option is read back from the message.
 */
export function parseArgsError(err: Error & { code?: string }, specs: readonly Pick<BaseSpec, 'name'>[]): ConfigError {
  const quoted = /'([^' ]+)/.exec(err.message)?.[1];
  switch (err.code) {
    case 'ERR_PARSE_ARGS_UNKNOWN_OPTION': {
      const option = quoted ?? '?';
      const guess = closestOption(option, specs.map((s) => s.name));
      return new ConfigError(`unknown option ${option}${guess ? ` (did you mean --${guess}?)` : ''}`);
    }
    case 'ERR_PARSE_ARGS_INVALID_OPTION_VALUE':
      if (/does not take an argument/.test(err.message)) return new ConfigError(`${quoted} takes no value`);
      // Missing, or followed by something that looks like an option.
      return new ConfigError(`${quoted} needs a value${/ambiguous/.test(err.message) ? ` (one that starts with a dash is written ${quoted}=VALUE)` : ''}`);
    case 'ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL':
      return new ConfigError(`unexpected argument ${quoted === undefined ? '' : `"${quoted}" `}(this command takes only options)`);
    default:
      return new ConfigError(err.message);
  }
}

/** The option an unknown `--name` most likely meant: the only one it begins, or one a typo or two away. */
export function closestOption(given: string, names: readonly string[]): string | undefined {
  const typed = given.replace(/^-+(no-)?/, '');
  if (typed === '') return undefined;
  const prefixed = names.filter((n) => n.startsWith(typed));
  if (prefixed.length === 1) return prefixed[0];
  let best: { name: string; d: number } | undefined;
  for (const name of names) {
    const d = editDistance(typed, name);
    if (!best || d < best.d) best = { name, d };
  }
  // Beyond a third of the word the guess is more likely wrong than helpful.
  return best && best.d <= Math.max(1, Math.floor(typed.length / 3)) ? best.name : undefined;
}

/** Levenshtein distance, with an adjacent swap counting as one edit. */
function editDistance(a: string, b: string): number {
  const d = Array.from({ length: a.length + 1 }, (_, i) => Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)));
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      d[i]![j] = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d[i]![j] = Math.min(d[i]![j]!, d[i - 2]![j - 2]! + 1);
    }
  }
  return d[a.length]![b.length]!;
}

/** One line per option for `--help`: flag, variable, default and text. */
export function formatHelp(specs: readonly OptionSpec[]): string {
  const rows = specs.map((s) => {
    const flag =
      s.type === 'boolean'
        ? s.default === true
          ? `--[no-]${s.name}`
          : `--${s.name}`
        : `--${s.name} <${s.type === 'enum' ? s.values.join('|') : s.type}>`;
    const variable = envName(s);
    const def = s.default === undefined ? '' : ` (default ${formatDefault(s)})`;
    return { flag, text: `${s.help}${def}${variable ? ` [${variable}]` : ''}` };
  });
  const width = Math.max(0, ...rows.map((r) => r.flag.length));
  return rows.map((r) => `  ${r.flag.padEnd(width)}  ${r.text}`).join('\n');
}

function formatDefault(s: OptionSpec): string {
  if (s.type === 'duration' && typeof s.default === 'number') return formatDuration(s.default);
  if (Array.isArray(s.default)) return s.default.join(',') || 'none';
  return String(s.default);
}

export function formatDuration(ms: number): string {
  if (ms % 3_600_000 === 0) return `${ms / 3_600_000}h`;
  if (ms % 60_000 === 0) return `${ms / 60_000}m`;
  if (ms % 1000 === 0) return `${ms / 1000}s`;
  return `${ms}ms`;
}
