import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { describe, expect, it } from 'vitest';

const cli = fileURLToPath(new URL('../../lib/cli.ts', import.meta.url));
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

  it('says so, and does nothing, for a command that is not built yet', async () => {
    const r = await pier('controller', '--kubeconfig', '/nonexistent');
    expect(r.exitCode).toBe(3);
    expect(r.stderr).toMatch(/pier controller: not built yet/);
  });

  it('prints the package version', async () => {
    const r = await pier('--version');
    expect(r.stdout.trim()).toMatch(/^\d+\.\d+\.\d+/);
  });
});
