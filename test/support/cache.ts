import { homedir } from 'node:os';
import { join } from 'node:path';

/** The machine-wide build cache, as scripts/cache-env.sh names it: PIER_CACHE_DIR, else ${XDG_CACHE_HOME:-~/.cache}/pier. */
export function cacheDir(env: NodeJS.ProcessEnv = process.env): string {
  return env.PIER_CACHE_DIR || join(env.XDG_CACHE_HOME || join(env.HOME || homedir(), '.cache'), 'pier');
}
