// Typed configuration from command-line flags and environment variables.
// Every option has one spec; its flag is `--name`, its variable PIER_NAME
// (upper snake case). A flag beats the variable, which beats the default.
// Every rejected value is reported with where it came from, so a person can
// find the typo in a manifest or a shell history.
import { parseArgs } from 'node:util';

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

export class ConfigError extends Error {
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

export interface ParsedConfig {
  values: Record<string, OptionValue>;
  positionals: string[];
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
    throw new ConfigError((err as Error).message);
  }
  const values: Record<string, OptionValue> = {};
  for (const s of specs) {
    const fromFlag = parsed.values[s.name];
    const variable = envName(s);
    const fromEnv = variable === undefined ? undefined : env[variable];
    if (fromFlag !== undefined) {
      // Lists may be given as repeated flags or comma-separated, or both.
      const raw = Array.isArray(fromFlag) ? fromFlag.join(',') : fromFlag;
      values[s.name] = convert(s, raw, `--${s.name}`);
    } else if (fromEnv !== undefined && fromEnv !== '') {
      values[s.name] = convert(s, fromEnv, variable!);
    } else {
      values[s.name] = s.default;
    }
  }
  return { values, positionals: parsed.positionals };
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
