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
