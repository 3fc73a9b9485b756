// What every subcommand shares: --help from the option specs, --log-level,
// and turning configuration errors into one clear line and exit code 2.
import { ConfigError, formatHelp, parseConfig, type OptionSpec, type ParsedConfig } from './config.ts';
import { LOG_LEVELS } from './log.ts';

export const LOG_LEVEL_OPTION: OptionSpec = {
  name: 'log-level',
  type: 'enum',
  values: LOG_LEVELS,
  default: 'info',
  help: 'log verbosity (logs are JSON lines on stderr)',
};

export const KUBECONFIG_OPTION: OptionSpec = {
  name: 'kubeconfig',
  type: 'string',
  help: 'kubeconfig file; otherwise $KUBECONFIG, the in-cluster ServiceAccount, then ~/.kube/config',
};

/** `host:port`, `[v6]:port` or an https:// URL as a URL string; undefined when it is none of them. */
export function apiServerUrl(text: string): string | undefined {
  const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(text) ? text : `https://${text}`;
  let url: URL;
  try {
    url = new URL(withScheme);
  } catch {
    return undefined;
  }
  if (url.protocol !== 'https:' || !url.hostname || url.pathname !== '/' || url.search || url.hash || url.username) return undefined;
  return url.origin;
}

export const API_SERVER_OPTION: OptionSpec = {
  name: 'api-server',
  type: 'list',
  validate: (v) => (apiServerUrl(v) ? undefined : 'is not host:port or an https:// URL'),
  help: "the API server's own address(es), host:port, comma-separated; the first that accepts a connection replaces the credentials' server (so pier needs no kube-proxy to reach it)",
};

/** The --api-server list as https origins. */
export const apiServers = (v: ParsedConfig['values']): string[] => ((v['api-server'] as string[] | undefined) ?? []).map((s) => apiServerUrl(s)!);

export interface CommandSpec {
  name: string;
  summary: string;
  usage: string;
  options: OptionSpec[];
  allowPositionals?: boolean;
}

/** Parses argv for a command; prints help or the error and returns an exit code instead of a config when it should stop. */
export function parseCommand(spec: CommandSpec, argv: string[], env = process.env): ParsedConfig | number {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(`${spec.summary}\n\nUsage: ${spec.usage}\n\nOptions:\n${formatHelp(spec.options)}\n`);
    return 0;
  }
  try {
    return parseConfig(spec.options, argv, env, { allowPositionals: spec.allowPositionals ?? false });
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`pier ${spec.name}: ${err.message}\n(see pier ${spec.name} --help)\n`);
      return 2;
    }
    throw err;
  }
}
