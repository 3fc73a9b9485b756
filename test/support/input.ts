import type { Input } from '../../lib/run.ts';

/** All a command was given, whatever the form (iptables.ts's Input). */
export async function inputText(input: Input | Promise<Input> | undefined): Promise<string | undefined> {
  const given = await input;
  if (given === undefined || typeof given === 'string') return given;
  return [...given].join('');
}
