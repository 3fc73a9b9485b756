// The Node flags an image runs pier with, read from its Dockerfile, so that
// benchmarks measure the process as shipped rather than under Node's defaults.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from './transpile.ts';

/**
 * The flags between `node` and the script of the Dockerfile's last
 * `ENTRYPOINT ["node", ...]` line. (test/integration/images.test.ts checks
 * the built agent image's against bench:agent's.)
 */
export function shippedNodeFlags(dockerfile: 'Dockerfile.agent' | 'Dockerfile.controller'): string[] {
  const lines = readFileSync(join(ROOT, dockerfile), 'utf8').split('\n');
  const entrypoint = lines.filter((l) => l.startsWith('ENTRYPOINT ')).at(-1);
  const argv = entrypoint ? (JSON.parse(entrypoint.slice('ENTRYPOINT '.length)) as string[]) : [];
  if (argv[0] !== 'node' || argv.length < 2) throw new Error(`${dockerfile}: no ENTRYPOINT ["node", ...flags, script] line (found ${JSON.stringify(entrypoint)})`);
  return argv.slice(1, -1);
}
