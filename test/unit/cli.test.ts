import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { describe, expect, it } from 'vitest';

const cli = fileURLToPath(new URL('../../cmd/cli.ts', import.meta.url));
const pier = (...args: string[]) => execa(process.execPath, [cli, ...args], { reject: false });

describe('pier CLI', () => {
  it('prints usage with every command on --help', async () => {
    const r = await pier('--help');
    expect(r.exitCode).toBe(0);
    for (const cmd of ['controller', 'agent', 'plan', 'cleanup', 'check']) expect(r.stdout).toMatch(new RegExp(`^  ${cmd} `, 'm'));
  });

  it('exits non-zero with usage when no command is given', async () => {
    const r = await pier();
    expect(r.exitCode).toBe(2);
    expect(r.stdout).toContain('Usage: pier <command>');
  });

  it('rejects an unknown command', async () => {
    const r = await pier('frobnicate');
    expect(r.exitCode).toBe(2);
    expect(r.stderr).toContain('unknown command "frobnicate"');
  });

  it('runs pier controller, which explains its flags and rejects bad ones before touching a cluster', async () => {
    const help = await pier('controller', '--help');
    expect(help.exitCode).toBe(0);
    for (const flag of ['--leader-elect-lease-duration', '--reserved-ports', '--allocate-range', '--workers']) expect(help.stdout).toContain(flag);

    const range = await pier('controller', '--allocate-range', '50000-40000', '--kubeconfig', '/nonexistent');
    expect(range.exitCode).toBe(2);
    expect(range.stderr).toContain('--allocate-range: "50000-40000" is not a port or an inclusive port range');

    const timings = await pier('controller', '--leader-elect-renew-deadline', '20s', '--kubeconfig', '/nonexistent');
    expect(timings.exitCode).toBe(2);
    expect(timings.stderr).toContain('the lease duration must be longer than the renew deadline');
  });

  it("reports a mistyped option in pier's words, with the option it likely meant", async () => {
    const r = await pier('check', '--bakend', 'nftables');
    expect(r.exitCode).toBe(2);
    expect(r.stderr).toBe('pier check: unknown option --bakend (did you mean --backend?)\n(see pier check --help)');
  });

  it('prints the package version', async () => {
    const r = await pier('--version');
    expect(r.stdout.trim()).toMatch(/^\d+\.\d+\.\d+/);
  });
});
