// `pier check` (agent/check.ts) takes what its help describes, --backend
// auto included, and answers for auto as the agent would decide: iptables
// where it works, else nftables where nft works. Commands are faked; the
// sysctls are files in a temporary /proc/sys.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { CHECK_SPEC, checkReport, type CheckSettings } from '../../cmd/check.ts';
import type { Runner } from '../../lib/run.ts';
import { formatHelp, parseConfig } from '../../lib/config.ts';

const procSys = mkdtempSync(join(tmpdir(), 'pier-check-'));
mkdirSync(join(procSys, 'net/ipv4'), { recursive: true });
mkdirSync(join(procSys, 'net/ipv6/conf/all'), { recursive: true });
writeFileSync(join(procSys, 'net/ipv4/ip_forward'), '1\n');
writeFileSync(join(procSys, 'net/ipv6/conf/all/forwarding'), '1\n');
afterAll(() => rmSync(procSys, { recursive: true, force: true }));

/** A host whose iptables tables do (or do not) answer, and whose nft does (or does not). */
function host(opts: { iptables: boolean; nft: boolean }): { runner: Runner; ran: string[] } {
  const ran: string[] = [];
  const runner: Runner = async (file, args) => {
    ran.push(file);
    if (file.endsWith('-save')) return { exitCode: 0, stdout: '', stderr: '' };
    if (file === 'nft') return opts.nft ? { exitCode: 0, stdout: '', stderr: '' } : { exitCode: 1, stdout: '', stderr: 'Error: Could not process rule: Operation not supported' };
    if (args.includes('-t')) return opts.iptables ? { exitCode: 0, stdout: '', stderr: '' } : { exitCode: 3, stdout: '', stderr: "iptables v1.8.9 (nf_tables): can't initialize iptables table `nat': Table does not exist" };
    throw new Error(`unexpected command ${file} ${args.join(' ')}`);
  };
  return { runner, ran };
}

const auto: CheckSettings = { backend: 'auto', iptablesBackend: 'auto', setBy: { backend: 'PIER_BACKEND', iptablesBackend: 'the default' } };

describe('pier check', () => {
  it('takes --backend auto, as its help says', () => {
    expect(formatHelp(CHECK_SPEC.options)).toContain('--backend <iptables|nftables|auto>');
    expect(CHECK_SPEC.usage).toContain('--backend iptables|nftables|auto');
    expect(parseConfig(CHECK_SPEC.options, ['--backend', 'auto'], {}).values['backend']).toBe('auto');
    expect(parseConfig(CHECK_SPEC.options, [], { PIER_BACKEND: 'auto' }).values['backend']).toBe('auto');
  });

  it('with auto, reports iptables where it works and never asks nft', async () => {
    const h = host({ iptables: true, nft: true });
    const r = await checkReport(auto, h.runner, procSys);
    expect(r).toEqual({
      ok: true,
      lines: [
        'rule backend: iptables (auto (set with PIER_BACKEND): iptables works)',
        'iptables backend: nft (auto (the default): no rules in either backend; nft is the default)',
        'ipv4: can forward',
        'ipv6: can forward',
      ],
    });
    expect(h.ran).not.toContain('nft');
  });

  it('with auto, reports nftables where iptables does not work and nft does, and checks nft alone', async () => {
    const r = await checkReport(auto, host({ iptables: false, nft: true }).runner, procSys);
    expect(r.ok).toBe(true);
    expect(r.lines[0]).toMatch(/^rule backend: nftables \(auto \(set with PIER_BACKEND\): iptables does not work \(nat table unusable: iptables v1\.8\.9 .*\); nft does\)$/);
    expect(r.lines.slice(1)).toEqual(['nftables: usable', 'ipv4: can forward', 'ipv6: can forward']);
  });

  it('with auto and neither working, reports iptables and why each family cannot forward', async () => {
    const r = await checkReport(auto, host({ iptables: false, nft: false }).runner, procSys);
    expect(r.ok).toBe(false);
    expect(r.lines[0]).toContain('rule backend: iptables (auto (set with PIER_BACKEND): neither works; iptables: ');
    expect(r.lines[2]).toMatch(/^ipv4: cannot forward: nat table unusable: .*; filter table unusable/);
  });

  it('with a backend set, says where it was set and checks only that one', async () => {
    const h = host({ iptables: false, nft: true });
    const r = await checkReport({ backend: 'nftables', iptablesBackend: 'legacy', setBy: { backend: '--backend', iptablesBackend: '--iptables-backend' } }, h.runner, procSys);
    expect(r).toEqual({ ok: true, lines: ['nftables: usable', 'ipv4: can forward', 'ipv6: can forward'] });
    expect(h.ran).toEqual(['nft']);
    const xt = await checkReport({ backend: 'iptables', iptablesBackend: 'legacy', setBy: { backend: 'the default', iptablesBackend: '--iptables-backend' } }, host({ iptables: true, nft: false }).runner, procSys);
    expect(xt.lines[0]).toBe('iptables backend: legacy (set with --iptables-backend)');
  });
});
