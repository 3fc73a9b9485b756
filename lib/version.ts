// The version pier reports (CLI, agent Lease, metrics), read once from package.json.
import { readFileSync } from 'node:fs';

function readVersion(): string {
  // dist/lib/version.js and lib/version.ts both sit two levels below the root
  // in their trees, so the same relative path works compiled and from source.
  for (const rel of ['../../package.json', '../package.json']) {
    try {
      const pkg = JSON.parse(readFileSync(new URL(rel, import.meta.url), 'utf8')) as { name?: string; version?: string };
      if (pkg.name === 'pier' && pkg.version) return pkg.version;
    } catch {
      // try the next candidate
    }
  }
  return '0.0.0-unknown';
}

export const VERSION = readVersion();
