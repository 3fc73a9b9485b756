// The release workflow (.github/workflows/release.yaml) linted by the real
// actionlint (test/helm/build.sh builds it from its Go module), which checks
// the workflow's syntax, expressions and contexts, the inputs of the actions
// it uses, and its shell scripts through shellcheck. No GitHub here: what it
// publishes is held to the chart's defaults in test/unit/helm-chart.test.ts.
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actionlintPath } from '../helm/tools.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const WORKFLOW = '.github/workflows/release.yaml';

/** actionlint on the workflows of the repository in `dir`, with the machine's shellcheck. */
async function actionlint(dir: string) {
  const shellcheck = await execa('bash', ['-c', 'command -v shellcheck'], { reject: false });
  if (shellcheck.exitCode !== 0) throw new Error('no shellcheck on PATH: scripts/setup.sh installs it (Debian package shellcheck)');
  return execa(await actionlintPath(), ['-no-color', `-shellcheck=${shellcheck.stdout.trim()}`, '-pyflakes=', WORKFLOW], { cwd: dir, reject: false });
}

describe('the release workflow', () => {
  const copies: string[] = [];
  // Waited for here, under the hook's timeout: scripts/test.sh may still be building it.
  beforeAll(() => actionlintPath());
  afterAll(() => {
    for (const c of copies) rmSync(c, { recursive: true, force: true });
  });

  it('passes actionlint (with shellcheck)', async () => {
    const version = await execa(await actionlintPath(), ['-version']);
    expect(version.stdout).toMatch(/^v1\.7\.12/);
    const r = await actionlint(ROOT);
    expect(`${r.stdout}${r.stderr}`).toBe('');
    expect(r.exitCode).toBe(0);
  });

  it('fails actionlint when broken: an unknown action input, an undefined step output, a shell quoting error', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pier-actionlint-'));
    copies.push(dir);
    mkdirSync(join(dir, '.github', 'workflows'), { recursive: true });
    copyFileSync(join(ROOT, WORKFLOW), join(dir, WORKFLOW));
    const text = readFileSync(join(dir, WORKFLOW), 'utf8');
    const broken = text
      .replace('platforms: linux/amd64,linux/arm64', 'platform: linux/amd64,linux/arm64')
      .replace('tags: ${{ steps.release.outputs.image }}', 'tags: ${{ steps.relase.outputs.image }}')
      .replace('docker buildx imagetools inspect "$IMAGE"\n', 'docker buildx imagetools inspect $IMAGE\n');
    expect(broken).not.toBe(text);
    writeFileSync(join(dir, WORKFLOW), broken);
    const r = await actionlint(dir);
    expect(r.exitCode).toBe(1);
    expect(r.stdout).toMatch(/input "platform" is not defined in action "docker\/build-push-action@v7"/);
    expect(r.stdout).toMatch(/property "relase" is not defined/);
    expect(r.stdout).toMatch(/SC2086/);
  });
});
