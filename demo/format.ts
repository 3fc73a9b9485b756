// What the demo prints, as pure functions: the commands it runs, spelled as
// a person would type them, and one line per request.

/** A command line as a shell reads it: arguments with anything but plain characters single-quoted. */
export function commandLine(args: string[]): string {
  return `$ ${args.map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replaceAll("'", `'\\''`)}'`)).join(' ')}`;
}

export interface Answer {
  proto: 'tcp' | 'udp';
  address: string;
  port: number;
  /** The pod that answered and the client address it saw; absent when nothing answered. */
  reply?: { pod: string; peer: string };
  error?: string;
  ms: number;
}

/** One aligned line per request: what was asked, who answered, what they saw. */
export function answerLines(answers: Answer[]): string[] {
  const targets = answers.map((a) => `${a.proto.toUpperCase()}  ${hostPort(a.address, a.port)}`);
  const width = Math.max(0, ...targets.map((t) => t.length));
  return answers.map((a, i) => {
    const what = a.reply ? `answered by ${a.reply.pod}, which saw the client as ${a.reply.peer}` : `NOT ANSWERED (${a.error ?? 'no reply'})`;
    return `  ${targets[i]!.padEnd(width)}  ${what}  (${a.ms.toFixed(1)} ms)`;
  });
}

export function hostPort(address: string, port: number): string {
  return address.includes(':') ? `[${address}]:${port}` : `${address}:${port}`;
}
