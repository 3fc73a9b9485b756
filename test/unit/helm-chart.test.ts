// The Helm chart (deploy/helm/pier) is generated from deploy/ by
// test/helm/generate.ts: its templates must be what the generator makes of
// deploy/ as it is now, and a change to deploy/ that the chart could not
// carry must stop the generation, not be dropped. Also: one owner named
// everywhere (package.json, the chart's default images, the release
// workflow). Rendering with the real helm and comparing with kustomize is
// test/integration/helm.test.ts.
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { afterEach, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { CHART_DIR, generate, ROOT, stale } from '../helm/generate.ts';

const read = (file: string) => readFileSync(join(ROOT, file), 'utf8');

/** values.schema.json's text with `change` made to its parsed JSON. */
const schemaEdit = (text: string, change: (schema: any) => unknown) => {
  const schema = JSON.parse(text);
  change(schema);
  return `${JSON.stringify(schema, null, 2)}\n`;
};

describe('the Helm chart, generated from deploy/', () => {
  const copies: string[] = [];
  afterEach(() => {
    for (const c of copies.splice(0)) rmSync(c, { recursive: true, force: true });
  });
  /** A copy of what the generator reads, to change. */
  const copy = () => {
    const dir = mkdtempSync(join(tmpdir(), 'pier-helm-gen-'));
    copies.push(dir);
    cpSync(join(ROOT, 'deploy'), join(dir, 'deploy'), { recursive: true });
    cpSync(join(ROOT, 'package.json'), join(dir, 'package.json'));
    return dir;
  };
  const edit = (dir: string, file: string, change: (text: string) => string) => {
    const before = readFileSync(join(dir, file), 'utf8');
    const after = change(before);
    expect(after, `the edit of ${file} changed nothing`).not.toBe(before);
    writeFileSync(join(dir, file), after);
  };

  it('has the templates and values files that test/helm/generate.ts makes of deploy/ now (else: run it)', () => {
    expect(stale()).toEqual([]);
    const files = [...generate().keys()];
    expect(files).toContain(`${CHART_DIR}/templates/agent.yaml`);
    expect(files).toContain('deploy/helm/values/kind.yaml');
  });

  it('notices an edit of deploy/ that was not carried into the chart', () => {
    const dir = copy();
    expect(stale(dir)).toEqual([]);
    edit(dir, 'deploy/base/agent.yaml', (t) => t.replace('periodSeconds: 5', 'periodSeconds: 7'));
    edit(dir, 'deploy/components/metrics/services.yaml', (t) => t.replace('port: 10266', 'port: 10267'));
    edit(dir, 'deploy/overlays/kind/agent-api-server.yaml', (t) => t.replace('kind-control-plane:6443', 'other-control-plane:6443'));
    expect(stale(dir)).toEqual([`${CHART_DIR}/templates/agent.yaml`, `${CHART_DIR}/templates/metrics-services.yaml`, 'deploy/helm/values/kind.yaml']);
    writeFileSync(join(dir, CHART_DIR, 'templates', 'extra.yaml'), 'kind: ConfigMap\n');
    expect(stale(dir)).toContain(`${CHART_DIR}/templates/extra.yaml (not generated: remove it)`);
  });

  it.each([
    ['a pier.env variable the chart has no value for', 'deploy/base/pier.env', (t: string) => `${t}PIER_RESYNC_PERIOD=30s\n`, /pier\.env sets PIER_RESYNC_PERIOD, which the chart has no value for/],
    ['a pier.env default the chart does not share', 'deploy/base/pier.env', (t: string) => t.replace('PIER_ALLOCATE_RANGE=40000-49999', 'PIER_ALLOCATE_RANGE=30000-39999'), /allocateRange gives PIER_ALLOCATE_RANGE=40000-49999, but deploy\/base\/pier\.env says 30000-39999/],
    ['resources the chart does not default to', 'deploy/base/agent.yaml', (t: string) => t.replace('memory: 128Mi', 'memory: 256Mi'), /agent\.resources is .*128Mi.*, but deploy\/base\/agent\.yaml: DaemonSet pier-agent says .*256Mi/],
    ['tolerations the chart does not default to', 'deploy/base/controller.yaml', (t: string) => t.replace('effect: NoSchedule', 'effect: NoExecute'), /controller\.tolerations is/],
    ['a new file in the base', 'deploy/base/kustomization.yaml', (t: string) => t.replace('  - agent.yaml\n', '  - agent.yaml\n  - extra.yaml\n'), /lists extra\.yaml, which the chart does not carry/],
    ['another kind of overlay patch', 'deploy/overlays/k3s/agent-api-server.yaml', (t: string) => t.replace('value: 127.0.0.1:6443,127.0.0.1:6444', 'value: x\n            - name: OTHER\n              value: y'), /only a patch setting PIER_API_SERVER/],
    ['template text in a manifest', 'deploy/base/agent-rbac.yaml', (t: string) => `# {{ not for helm }}\n${t}`, /contains \{\{ or \}\}/],
    ['a values.yaml key without a schema entry', `${CHART_DIR}/values.yaml`, (t: string) => t.replace('  replicas: 2\n', '  replicas: 2\n  priorityClassName: ""\n'), /values\.yaml has controller\.priorityClassName, which deploy\/helm\/pier\/values\.schema\.json does not describe/],
    ['a schema entry without a values.yaml key', `${CHART_DIR}/values.schema.json`, (t: string) => schemaEdit(t, (s) => (s.properties.agent.properties.apiServerPort = { type: 'integer' })), /values\.schema\.json describes agent\.apiServerPort, which deploy\/helm\/pier\/values\.yaml does not have/],
    ['a schema object with fixed keys that takes any other', `${CHART_DIR}/values.schema.json`, (t: string) => schemaEdit(t, (s) => delete s.properties.metrics.properties.service.additionalProperties), /metrics\.service has fixed keys, so it must refuse others \(additionalProperties: false\)/],
    ['a schema entry without a type', `${CHART_DIR}/values.schema.json`, (t: string) => schemaEdit(t, (s) => delete s.properties.logLevel.type), /logLevel has no type/],
    ['a new image tag', 'deploy/base/kustomization.yaml', (t: string) => t.replace('    newTag: 0.1.0\n  - name: pier/agent', '    newTag: 0.2.0\n  - name: pier/agent'), /expected pier\/controller with newTag 0\.1\.0/],
  ])('refuses to generate from %s, naming it', (_what, file, change, message) => {
    const dir = copy();
    edit(dir, file, change);
    expect(() => generate(dir)).toThrow(message);
  });

  it('refuses, in CI (CI=true), to run without the helm 3 scripts/test.sh builds (PIER_HELM3 or PIER_TOOLS_DIR), rather than build one silently; waits for its background build', async () => {
    const env = { ...process.env, CI: 'true', PIER_HELM3: '', PIER_TOOLS_DIR: '' };
    const script = "const m = await import('./test/helm/tools.ts'); console.log(await m.helm3Path());";
    const run = (extra: Record<string, string>) => execa(process.execPath, ['--input-type=module', '-e', script], { cwd: ROOT, env: { ...env, ...extra }, reject: false, timeout: 30_000 });
    const r = await run({});
    expect(r.exitCode).not.toBe(0);
    expect(r.stderr).toMatch(/PIER_HELM3 is not set, nor PIER_TOOLS_DIR: in CI scripts\/test\.sh builds it \(bash test\/helm\/build\.sh helm3\)/);
    const missing = await run({ PIER_HELM3: '/nonexistent/helm' });
    expect(missing.stderr).toMatch(/PIER_HELM3 is \/nonexistent\/helm, which does not exist/);
    // scripts/test.sh's background build: its failure names the log; its path is waited for.
    const tools = mkdtempSync(join(tmpdir(), 'pier-tools-'));
    try {
      writeFileSync(join(tools, 'helm3.failed'), '/r/test-results/build-helm3.log\n');
      const failed = await run({ PIER_TOOLS_DIR: tools });
      expect(failed.exitCode).not.toBe(0);
      expect(failed.stderr).toContain('scripts/test.sh could not build helm3; its log: /r/test-results/build-helm3.log');
      rmSync(join(tools, 'helm3.failed'));
      const waiting = run({ PIER_TOOLS_DIR: tools });
      await new Promise((r) => setTimeout(r, 1500));
      writeFileSync(join(tools, 'helm3.path'), '/built/helm\n');
      const built = await waiting;
      expect([built.exitCode, built.stdout.trim()]).toEqual([0, '/built/helm']);
    } finally {
      rmSync(tools, { recursive: true, force: true });
    }
  });

  it('names one owner: package.json\'s repository, the chart\'s sources and default images, and the release workflow\'s registry', () => {
    const pkg = JSON.parse(read('package.json')) as { version: string; repository: { url: string } };
    const [, owner, repo] = /^git\+https:\/\/github\.com\/([^/]+)\/([^/.]+)\.git$/.exec(pkg.repository.url) ?? [];
    expect(owner).toBeTruthy();
    const chart = parse(read(`${CHART_DIR}/Chart.yaml`)) as { home: string; sources: string[]; appVersion: string; version: string };
    expect(chart.home).toBe(`https://github.com/${owner}/${repo}`);
    expect(chart.sources).toEqual([chart.home]);
    expect([chart.version, chart.appVersion]).toEqual([pkg.version, pkg.version]);
    const values = parse(read(`${CHART_DIR}/values.yaml`)) as Record<'controller' | 'agent', { image: { repository: string; tag: string } }>;
    for (const c of ['controller', 'agent'] as const) {
      expect(values[c].image.repository).toBe(`ghcr.io/${owner!.toLowerCase()}/pier-${c}`);
      expect(values[c].image.tag).toBe('');
    }

    // The workflow pushes ghcr.io/<the repository's owner>/pier-<component>, each from its Dockerfile, for both platforms.
    const wf = parse(read('.github/workflows/release.yaml')) as {
      on: { push: { tags: string[] } };
      jobs: { images: { strategy: { matrix: { component: string[] } }; permissions: Record<string, string>; steps: { id?: string; uses?: string; run?: string; with?: Record<string, string> }[] } };
    };
    const job = wf.jobs.images;
    expect(job.strategy.matrix.component.sort()).toEqual(['agent', 'controller']);
    for (const c of job.strategy.matrix.component) expect(existsSync(join(ROOT, `Dockerfile.${c}`))).toBe(true);
    expect(job.permissions).toEqual({ contents: 'read', packages: 'write' });
    const release = job.steps.find((s) => s.id === 'release')!;
    expect(release.run).toContain('echo "image=ghcr.io/${GITHUB_REPOSITORY_OWNER,,}/pier-$COMPONENT"');
    const build = job.steps.find((s) => s.uses?.startsWith('docker/build-push-action@'))!;
    expect(build.with?.['file']).toBe('Dockerfile.${{ matrix.component }}');
    expect(build.with?.['platforms']?.split(',').sort()).toEqual(['linux/amd64', 'linux/arm64']);
    expect(build.with?.['push']).toBe(true);
    for (const label of ['source', 'revision', 'version']) {
      expect(build.with?.['labels']).toMatch(new RegExp(`^org\\.opencontainers\\.image\\.${label}=.*\\$\\{\\{ .+ \\}\\}.*$`, 'm'));
      expect(build.with?.['annotations']).toMatch(new RegExp(`^index:org\\.opencontainers\\.image\\.${label}=.*\\$\\{\\{ .+ \\}\\}.*$`, 'm'));
    }
    // The tag it is started by is the version the chart installs by default.
    expect(wf.on.push.tags).toEqual(['v*.*.*']);
    expect(release.run).toContain('version="${GITHUB_REF_NAME#v}"');
    expect(release.run).toContain('require("./package.json").version');
  });
});
