// Options more than one command takes: the agent's backend choice (`check`
// answers for it), and the connection-mark bits (`plan` and `trace` render
// what the agent would).
import type { OptionValue } from '../lib/config.ts';
import type { MarkBits } from '../agent/iptables/render.ts';

/** `--iptables-backend`: the iptables flavour (the flag keeps its name). */
export const IPTABLES_FLAVOUR_OPTION = {
  name: 'iptables-backend',
  type: 'enum',
  values: ['auto', 'nft', 'legacy'],
  default: 'auto',
  help: 'iptables flavour for the iptables backend; auto detects the one the host uses (kubelet hint chains, then rule counts)',
} as const;

/** The connection-mark bits of pier's rules (MarkBits); plan and trace take them too, to render what the agent would. */
export const MARK_OPTIONS = [
  { name: 'accept-bit', type: 'int', default: 13, min: 0, max: 31, help: "connection-mark bit of the connections pier's FORWARD rules accept (13 is 0x2000; iptables backend)" },
  { name: 'masquerade-bit', type: 'int', default: 12, min: 0, max: 31, help: 'connection-mark bit of the connections pier masquerades (12 is 0x1000); kube-proxy uses packet-mark bits 14 and 15 and no connection mark' },
] as const;

/** MARK_OPTIONS' values as masks, or what is wrong with them. */
export function markBitsOf(v: Record<string, OptionValue>): MarkBits | string {
  const [accept, masquerade] = [v['accept-bit'] as number, v['masquerade-bit'] as number];
  if (accept === masquerade) return `--accept-bit and --masquerade-bit are both ${accept}: give them different bits`;
  return { accept: 2 ** accept, masquerade: 2 ** masquerade };
}

/** `--backend`: which rules pier writes. */
export const BACKEND_OPTION = {
  name: 'backend',
  type: 'enum',
  values: ['iptables', 'nftables', 'auto'],
  default: 'iptables',
  env: 'PIER_BACKEND',
  help: "which rules to write: iptables chains, or pier's own nftables tables (ip pier, ip6 pier); auto takes nftables only where iptables does not work",
} as const;

