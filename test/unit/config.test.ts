import { describe, expect, it } from 'vitest';
import { ConfigError, closestOption, describeSource, formatHelp, parseConfig, parseDuration, type OptionSpec } from '../../lib/config.ts';

const specs: OptionSpec[] = [
  { name: 'kubeconfig', type: 'string', help: 'path to a kubeconfig' },
  { name: 'dry-run', type: 'boolean', default: false, help: 'print instead of applying' },
  { name: 'workers', type: 'int', default: 4, min: 1, max: 64, help: 'parallel workers' },
  { name: 'resync-period', type: 'duration', default: 60_000, min: 1000, help: 'full resync' },
  { name: 'iptables-backend', type: 'enum', values: ['auto', 'nft', 'legacy'], default: 'auto', help: 'backend' },
  { name: 'reserved-ports', type: 'list', default: ['22'], help: 'ports', validate: (v) => (/^\d+$/.test(v) ? undefined : 'is not a port') },
  { name: 'log-level', type: 'string', env: 'LOG_LEVEL', default: 'info', help: 'level' },
  { name: 'node-name', type: 'string', env: null, help: 'flag only' },
  { name: 'leader-elect', type: 'boolean', default: true, help: 'on unless turned off' },
];

describe('parseConfig', () => {
  it('uses defaults when nothing is given', () => {
    const { values } = parseConfig(specs, [], {});
    expect(values).toEqual({
      kubeconfig: undefined,
      'dry-run': false,
      workers: 4,
      'resync-period': 60_000,
      'iptables-backend': 'auto',
      'reserved-ports': ['22'],
      'log-level': 'info',
      'node-name': undefined,
      'leader-elect': true,
    });
  });

  it('turns booleans off with --name=false or --no-name, and on with --name=true', () => {
    expect(parseConfig(specs, ['--leader-elect=false'], {}).values['leader-elect']).toBe(false);
    expect(parseConfig(specs, ['--no-leader-elect'], {}).values['leader-elect']).toBe(false);
    expect(parseConfig(specs, ['--leader-elect=true'], { PIER_LEADER_ELECT: 'false' }).values['leader-elect']).toBe(true);
    expect(parseConfig(specs, [], { PIER_LEADER_ELECT: 'false' }).values['leader-elect']).toBe(false);
    expect(parseConfig(specs, ['--dry-run=yes'], {}).values['dry-run']).toBe(true);
    expect(() => parseConfig(specs, ['--leader-elect=maybe'], {})).toThrow(/--leader-elect: "maybe" is not a boolean/);
    expect(formatHelp(specs)).toContain('--[no-]leader-elect ');
  });

  it('prefers flags over environment over defaults', () => {
    const env = { PIER_WORKERS: '8', PIER_DRY_RUN: 'true', LOG_LEVEL: 'debug', PIER_NODE_NAME: 'ignored' };
    const { values } = parseConfig(specs, ['--workers', '2', '--reserved-ports=22,6443', '--reserved-ports', '10250'], env);
    expect(values['workers']).toBe(2);
    expect(values['dry-run']).toBe(true);
    expect(values['log-level']).toBe('debug');
    expect(values['reserved-ports']).toEqual(['22', '6443', '10250']);
    expect(values['node-name']).toBeUndefined();
  });

  it('says where each value came from, in the words a person would look for', () => {
    const { sources } = parseConfig(specs, ['--workers', '2'], { PIER_DRY_RUN: 'true', LOG_LEVEL: 'debug', PIER_RESYNC_PERIOD: '' });
    expect(sources).toMatchObject({ workers: 'flag', 'dry-run': 'env', 'log-level': 'env', 'resync-period': 'default', kubeconfig: 'default' });
    const spec = (name: string) => specs.find((s) => s.name === name)!;
    expect(describeSource(spec('workers'), sources['workers']!)).toBe('--workers');
    expect(describeSource(spec('dry-run'), sources['dry-run']!)).toBe('PIER_DRY_RUN');
    expect(describeSource(spec('log-level'), sources['log-level']!)).toBe('LOG_LEVEL');
    expect(describeSource(spec('resync-period'), sources['resync-period']!)).toBe('the default');
  });

  it.each([
    [['--workers', 'many'], /--workers: "many" is not an integer/],
    [['--workers', '0'], /--workers: "0" is below the minimum 1/],
    [['--resync-period', '10'], /--resync-period: "10" is not a duration/],
    [['--resync-period', '10ms'], /shorter than the minimum 1000ms/],
    [['--iptables-backend', 'ebpf'], /--iptables-backend: "ebpf" is not one of auto, nft, legacy/],
    [['--reserved-ports', '22,ssh'], /--reserved-ports: "ssh" is not a port/],
    [['--no-such-flag'], /^unknown option --no-such-flag$/],
    [['--workers'], /^--workers needs a value$/],
  ])('rejects %j naming the bad value', (argv, message) => {
    expect(() => parseConfig(specs, argv, {})).toThrow(ConfigError);
    expect(() => parseConfig(specs, argv, {})).toThrow(message);
  });

  it.each([
    [['--wrokers', '2'], 'unknown option --wrokers (did you mean --workers?)'],
    [['--resync'], 'unknown option --resync (did you mean --resync-period?)'],
    [['--no-dryrun'], 'unknown option --no-dryrun (did you mean --dry-run?)'],
    [['--backend', 'nftables'], 'unknown option --backend'],
    [['-x'], 'unknown option -x'],
    [['--workers', '--dry-run'], '--workers needs a value (one that starts with a dash is written --workers=VALUE)'],
    [['--no-leader-elect=x'], '--leader-elect takes no value'],
    [['stray'], 'unexpected argument "stray" (this command takes only options)'],
  ])('says what is wrong with %j in its own words', (argv, message) => {
    let thrown: unknown;
    try {
      parseConfig(specs, argv, {});
    } catch (err) {
      thrown = err;
    }
    expect(thrown).toBeInstanceOf(ConfigError);
    expect((thrown as Error).message).toBe(message);
  });

  it('gives an unknown option only the advice that fits, even where positionals are allowed', () => {
    expect(() => parseConfig(specs, ['--kubeconfgi', 'x'], {}, { allowPositionals: true })).toThrow(/^unknown option --kubeconfgi \(did you mean --kubeconfig\?\)$/);
  });

  it('suggests an option only when one is close', () => {
    const names = specs.map((s) => s.name);
    expect(closestOption('--leader-elcet', names)).toBe('leader-elect');
    expect(closestOption('--frobnicate', names)).toBeUndefined();
    // Ambiguous beginnings ("re" starts two) fall back to spelling, which is too far.
    expect(closestOption('--re', names)).toBeUndefined();
  });

  it('names the environment variable when the bad value came from there', () => {
    expect(() => parseConfig(specs, [], { PIER_DRY_RUN: 'maybe' })).toThrow(/PIER_DRY_RUN: "maybe" is not a boolean/);
    expect(() => parseConfig(specs, [], { PIER_RESYNC_PERIOD: '1 minute' })).toThrow(/PIER_RESYNC_PERIOD/);
  });

  it('documents every option with its variable and default', () => {
    const help = formatHelp(specs);
    expect(help).toContain('--resync-period <duration>');
    expect(help).toContain('(default 1m) [PIER_RESYNC_PERIOD]');
    expect(help).toContain('--iptables-backend <auto|nft|legacy>');
    expect(help).toContain('[LOG_LEVEL]');
    expect(help.split('\n')).toHaveLength(specs.length);
  });
});

describe('parseDuration', () => {
  it.each([
    ['500ms', 500],
    ['10s', 10_000],
    ['1.5m', 90_000],
    ['2h', 7_200_000],
  ])('%s is %d ms', (text, ms) => expect(parseDuration(text)).toBe(ms));
  it.each(['', '10', 's', '-1s', '1d', '1 s'])('%j is not a duration', (text) => expect(parseDuration(text)).toBeUndefined());
});
