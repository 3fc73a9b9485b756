// The forwarding switches. Without them the kernel drops every packet pier
// DNATs to a pod on another host or namespace, silently: the single most
// common reason a load balancer "does nothing" on a fresh machine.
import { readFile, writeFile } from 'node:fs/promises';
import type { Family } from '../lib/contract.ts';

export const FORWARDING_SYSCTL: Record<Family, string> = {
  ipv4: 'net.ipv4.ip_forward',
  ipv6: 'net.ipv6.conf.all.forwarding',
};

export interface ForwardingState {
  family: Family;
  enabled: boolean;
  /** Set when not enabled: what is wrong and how to fix it. */
  reason?: string;
}

const procPath = (key: string, root: string) => `${root}/${key.replaceAll('.', '/')}`;

/**
 * Reads (and with `set`, turns on) forwarding for `family`. `root` is
 * /proc/sys; tests point it elsewhere.
 */
export async function checkForwarding(family: Family, opts: { set?: boolean; root?: string } = {}): Promise<ForwardingState> {
  const key = FORWARDING_SYSCTL[family];
  const path = procPath(key, opts.root ?? '/proc/sys');
  let value: string;
  try {
    value = (await readFile(path, 'utf8')).trim();
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const why = code === 'ENOENT' ? `${key} does not exist (${family} disabled in this kernel?)` : `cannot read ${key}: ${(err as Error).message}`;
    return { family, enabled: false, reason: why };
  }
  if (value === '1') return { family, enabled: true };
  if (!opts.set) {
    return { family, enabled: false, reason: `${key} is ${value}; run "sysctl -w ${key}=1" on the node, or start the agent with --set-sysctls` };
  }
  try {
    await writeFile(path, '1');
  } catch (err) {
    return {
      family,
      enabled: false,
      reason: `${key} is ${value} and setting it failed (${(err as NodeJS.ErrnoException).code ?? (err as Error).message}); /proc/sys is read-only unless the agent runs privileged: set it on the node instead`,
    };
  }
  return { family, enabled: true };
}
