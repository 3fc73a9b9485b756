// The transport protocols a Service port may name, and how each tool spells
// them: the one table the model, the controller, both backends, the trace
// interpreter and the conntrack clean-up read.

/** A Service port's protocol, as Kubernetes names it. */
export type Protocol = 'TCP' | 'UDP' | 'SCTP';

/** iptables' `-p`/`-m` word, nft's and conntrack's `-p` word: all three spell a protocol alike. */
export type ProtocolWord = 'tcp' | 'udp' | 'sctp';

export interface ProtocolInfo {
  name: Protocol;
  /** iptables `-p` and `-m`, nft (`meta l4proto`, a set key's `inet_proto`), conntrack `-p`. */
  word: ProtocolWord;
  /** The IP protocol number (iptables `--ctproto`). */
  number: number;
  /** Its place in PROTOCOLS: a small number for packed keys. */
  index: number;
}

export const PROTOCOL: Readonly<Record<Protocol, ProtocolInfo>> = {
  TCP: { name: 'TCP', word: 'tcp', number: 6, index: 0 },
  UDP: { name: 'UDP', word: 'udp', number: 17, index: 1 },
  SCTP: { name: 'SCTP', word: 'sctp', number: 132, index: 2 },
};

export const PROTOCOLS: readonly Protocol[] = ['TCP', 'UDP', 'SCTP'];

export function isProtocol(name: unknown): name is Protocol {
  return name === 'TCP' || name === 'UDP' || name === 'SCTP';
}

/** The protocol a tool's lower-case word names, if any. */
export function protocolOfWord(word: string | undefined): Protocol | undefined {
  return word === 'tcp' ? 'TCP' : word === 'udp' ? 'UDP' : word === 'sctp' ? 'SCTP' : undefined;
}
