import type { Input } from '../../agent/iptables.ts';

/** All a command was given, whatever the form (iptables.ts's Input): waits for the last piece. */
export async function inputText(input: Input | Promise<Input> | undefined): Promise<string | undefined> {
  const given = await input;
  if (given === undefined || typeof given === 'string') return given;
  let text = '';
  for await (const piece of given) text += piece;
  return text;
}
