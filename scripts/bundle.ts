// npm run bundle: the whole CLI and its dependencies as one minified ES
// module, dist/pier.mjs, which both images ship instead of node_modules,
// with the licences of what it holds in dist/THIRD-PARTY-NOTICES.txt.
//
// Why: Node keeps every module it loads, and @kubernetes/client-node's entry
// point loads every generated API client and model (~2,700 classes) whether
// used or not. Measured against a real API server with 10,000 Services
// (npm run bench:agent-rss, bench/README.md), the agent's RSS is ~270 MB from
// dist/ and node_modules, ~220 MB bundled and ~200 MB bundled and minified,
// all with --max-semi-space-size=1. Function names are kept, so stack traces
// and logs still name them; dist/pier.mjs.map maps back to the sources for
// `node --enable-source-maps`, which is left off in the images (it costs memory).
import { build } from 'esbuild';
import { copyFileSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));

/** Bundles cmd/bin.ts (the version check, then the CLI) into `outfile` (relative to the repository root, or absolute). */
export async function bundle(outfile = 'dist/pier.mjs'): Promise<string> {
  const result = await build({
    absWorkingDir: root,
    entryPoints: ['cmd/bin.ts'],
    outfile,
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node24',
    minify: true,
    keepNames: true,
    sourcemap: 'linked',
    // Licences go to a file of their own (notices(), below): at the end of
    // the bundle, one non-ASCII name in them made V8 hold the whole source as
    // a two-byte string (5.4 MB instead of 2.7).
    legalComments: 'none',
    metafile: true,
    // Bundled CommonJS dependencies (js-yaml, pino's helpers) call require()
    // for Node's built-ins; an ES module has none of its own.
    banner: { js: "import { createRequire as __pierCreateRequire } from 'node:module'; const require = __pierCreateRequire(import.meta.url);" },
    logLevel: 'warning',
  });
  writeFileSync(resolve(root, dirname(outfile), 'THIRD-PARTY-NOTICES.txt'), notices(Object.keys(result.metafile.inputs)));
  return outfile;
}

/**
 * The name, version, licence and licence text of every package the bundle
 * holds code of: what shipping node_modules used to carry.
 */
function notices(inputs: string[]): string {
  const dirs = new Set<string>();
  for (const input of inputs) {
    const m = /^(.*node_modules\/(?:@[^/]+\/)?[^/]+)\//.exec(input);
    if (m) dirs.add(m[1]!);
  }
  const parts = [...dirs].sort().map((dir) => {
    const pkg = JSON.parse(readFileSync(join(root, dir, 'package.json'), 'utf8')) as { name: string; version: string; license?: string };
    const file = readdirSync(join(root, dir)).find((f) => /^(licen[cs]e|copying)(\.|$)/i.test(f));
    const text = file ? readFileSync(join(root, dir, file), 'utf8').trim() : `(no licence file; package.json says ${pkg.license ?? 'nothing'})`;
    return `${pkg.name} ${pkg.version} (${pkg.license ?? 'unknown'})\n\n${text}\n`;
  });
  return `pier's bundle (dist/pier.mjs) contains code from these packages:\n\n${parts.join('\n' + '-'.repeat(72) + '\n\n')}`;
}

/**
 * The image's /app in `dir`: dist/pier.mjs and the package.json that
 * lib/version.ts reads one level above it. For benchmarks that run what ships.
 */
export async function bundleInto(dir: string): Promise<string> {
  mkdirSync(dir, { recursive: true });
  copyFileSync(join(root, 'package.json'), join(dir, 'package.json'));
  return bundle(join(dir, 'dist', 'pier.mjs'));
}

if (import.meta.main) await bundle();
