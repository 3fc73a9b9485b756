// The Dockerfile and .dockerignore reader behind test/integration/images.test.ts:
// what it understands must match Docker, and what it does not must throw.
import { describe, expect, it } from 'vitest';
import { logicalLines, parseDockerfile, parseDockerignore, parsePairs, splitShell, stageRef } from '../support/dockerfile.ts';

const SAMPLE = `# syntax=docker/dockerfile:1
ARG BASE=node:24-bookworm-slim
FROM \${BASE} AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci \\
  # a comment inside a continued instruction
  --no-audit
COPY lib ./lib

FROM build AS test
ENV A=1 B="two words"
WORKDIR sub
RUN ["npm", "test"]

FROM \${BASE}
ARG SOURCE=
ARG BASE
LABEL one="x y" two=z src="\${SOURCE}" base=$BASE
WORKDIR /srv
COPY --from=build /app/lib lib/
USER 65532:65532
CMD ["old"]
ENTRYPOINT ["node", "/srv/cli.js"]
CMD ["controller"]
`;

describe('parseDockerfile', () => {
  const df = parseDockerfile(SAMPLE);

  it('reads stages, their bases and names, with global ARGs substituted in FROM', () => {
    expect(df.stages.map((s) => [s.name, s.base])).toEqual([
      ['build', 'node:24-bookworm-slim'],
      ['test', 'build'],
      [undefined, 'node:24-bookworm-slim'],
    ]);
  });

  it('joins continuation lines and drops comment lines inside them', () => {
    const run = df.stages[0]!.steps.find((s) => s.kind === 'RUN');
    expect(run).toMatchObject({ shell: 'npm ci --no-audit', workdir: '/app' });
    expect(logicalLines('RUN a \\\n\n  b\n')).toEqual([{ line: 1, text: 'RUN a b' }]);
  });

  it('resolves COPY destinations and WORKDIR against the working folder', () => {
    expect(df.stages[0]!.steps.filter((s) => s.kind === 'COPY')).toMatchObject([
      { sources: ['package.json', 'package-lock.json'], dest: '/app', destIsDir: true },
      { sources: ['lib'], dest: '/app/lib', destIsDir: false },
    ]);
    expect(df.stages[2]!.steps.find((s) => s.kind === 'COPY')).toMatchObject({ from: 'build', sources: ['/app/lib'], dest: '/srv/lib', destIsDir: true });
  });

  it('inherits working folder and environment from a parent stage, and records them on RUN', () => {
    const test = df.stages[1]!;
    expect(test.workdir).toBe('/app/sub');
    expect(test.env).toEqual({ A: '1', B: 'two words' });
    expect(test.steps.at(-1)).toMatchObject({ kind: 'RUN', exec: ['npm', 'test'], workdir: '/app/sub', env: { A: '1', B: 'two words' } });
  });

  it('records labels with ARG values, USER, ENTRYPOINT and the CMD given after it', () => {
    const last = df.stages[2]!;
    expect(last.labels).toEqual({ one: 'x y', two: 'z', src: '', base: 'node:24-bookworm-slim' });
    expect(last.user).toBe('65532:65532');
    expect(last.entrypoint).toEqual(['node', '/srv/cli.js']);
    expect(last.cmd).toEqual(['controller']);
  });

  it('drops a CMD set before ENTRYPOINT, as Docker does', () => {
    const d = parseDockerfile('FROM x\nCMD ["a"]\nENTRYPOINT ["b"]\n');
    expect(d.stages[0]!.cmd).toBeUndefined();
  });

  it('finds stages by name or index, and refuses forward references', () => {
    expect(stageRef(df, 'build', 2)?.index).toBe(0);
    expect(stageRef(df, '1', 2)?.name).toBe('test');
    expect(stageRef(df, 'node:24', 2)).toBeUndefined();
    expect(() => stageRef(df, 'test', 1)).toThrow(/before it is defined/);
  });

  it.each([
    ['an unsupported instruction', 'FROM x\nADD a b\n', /unsupported instruction ADD/],
    ['shell-form ENTRYPOINT', 'FROM x\nENTRYPOINT node cli.js\n', /exec \(JSON array\) form/],
    ['COPY wildcards', 'FROM x\nCOPY package*.json ./\n', /wildcards/],
    ['unsupported COPY flags', 'FROM x\nCOPY --chmod=755 a b\n', /unsupported COPY flag/],
    ['RUN flags', 'FROM x\nRUN --mount=type=cache,target=/root/.npm npm ci\n', /RUN flags/],
    ['an undeclared variable', 'FROM x\nLABEL a=$NOPE\n', /not declared/],
    ['an instruction before FROM', 'WORKDIR /app\nFROM x\n', /before the first FROM/],
    ['the legacy ENV form', 'FROM x\nENV A 1\n', /key=value/],
    ['no FROM at all', '# empty\n', /no FROM/],
  ])('throws on %s', (_what, text, error) => {
    expect(() => parseDockerfile(text)).toThrow(error);
  });
});

describe('parsePairs', () => {
  it('reads quoted values with escapes and empty values', () => {
    expect(parsePairs('a=1 b="x \\"y\\"" c=', 1)).toEqual([
      ['a', '1'],
      ['b', 'x "y"'],
      ['c', ''],
    ]);
  });
});

describe('splitShell', () => {
  it('splits on && into words', () => {
    expect(splitShell('apt-get update && apt-get install -y iptables  &&  rm -rf /var/lib/apt/lists/*')).toEqual([
      ['apt-get', 'update'],
      ['apt-get', 'install', '-y', 'iptables'],
      ['rm', '-rf', '/var/lib/apt/lists/*'],
    ]);
  });

  it.each(['a; b', 'a || b', 'a | b', 'a > f', 'echo "x"', 'echo $HOME', 'a & b', 'echo `x`', 'a && && b'])('throws on %s', (cmd) => {
    expect(() => splitShell(cmd)).toThrow();
  });
});

describe('parseDockerignore', () => {
  const ig = parseDockerignore(`# comment
node_modules
/dist/
*.md
**/*.log
test?
docs
!docs/keep.txt
`);

  it.each([
    ['node_modules', true],
    ['node_modules/vitest/package.json', true],
    ['lib/node_modules', false],
    ['dist/lib/cli.js', true],
    ['README.md', true],
    ['lib/notes.md', false],
    ['a/b/c.log', true],
    ['x.log', true],
    ['test1/a', true],
    ['test/a', false],
    ['docs/other.txt', true],
    ['docs/keep.txt', false],
    ['lib/cli.ts', false],
  ])('%s ignored: %s', (path, ignored) => {
    expect(ig.ignored(path)).toBe(ignored);
  });

  it('knows whether an ignored folder may hold included files', () => {
    expect(ig.mayIncludeUnder('docs')).toBe(true);
    expect(ig.mayIncludeUnder('node_modules')).toBe(false);
    expect(parseDockerignore('node_modules\n').mayIncludeUnder('node_modules')).toBe(false);
    expect(parseDockerignore('*\n!**/keep\n').mayIncludeUnder('anything')).toBe(true);
  });

  it('reads an allow-list: everything out, listed paths back in', () => {
    const allow = parseDockerignore('*\n!package.json\n!lib\n');
    expect(['package.json', 'lib', 'lib/a/b.ts'].map((p) => allow.ignored(p))).toEqual([false, false, false]);
    expect(['node_modules', 'node_modules/x/package.json', 'README.md', 'test/lib/a.ts', '.git/HEAD'].map((p) => allow.ignored(p))).toEqual([true, true, true, true, true]);
    expect(allow.mayIncludeUnder('node_modules')).toBe(false);
    expect(allow.mayIncludeUnder('.git')).toBe(false);
  });

  it('throws on character classes rather than guessing', () => {
    expect(() => parseDockerignore('[ab].txt\n')).toThrow(/character classes/);
  });
});
