// The container images, without a Docker engine (there is none here or in
// CI): the Dockerfiles are read for what the manifests rely on, then their
// steps are reproduced outside Docker (test/support/imagebuild.ts): the
// context as .dockerignore filters it, npm ci and the TypeScript build, then
// each runtime stage assembled from exactly what it COPYs. The CLI then runs
// from those folders, so a file or dependency a Dockerfile forgets fails here.
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync, type Dirent } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CoordinationV1Api, CoreV1Api } from '@kubernetes/client-node';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { binaries, type Backend } from '../../agent/iptables.ts';
import { DEFAULT_NAMESPACE, FAMILIES, LEADER_LEASE_NAME } from '../../lib/contract.ts';
import { ensureNamespace, registerNode, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { atExit } from '../support/cleanup.ts';
import { nodeFlags, parseDockerfile, splitShell, type Stage } from '../support/dockerfile.ts';
import { ImageBuilder, imageCommand, runImage, type BuiltStage } from '../support/imagebuild.ts';
import { freePort } from '../support/ports.ts';
import { readOnlyRoot, type ReadOnlyRoot } from '../support/readonlyroot.ts';
import { eventually } from '../support/wait.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const PKG = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  version: string;
  license: string;
  dependencies: Record<string, string>;
};
/** What deploy/ runs: the manifests pass only args (controller, agent). */
const BUNDLE = '/app/dist/pier.mjs';
const IMAGES = { controller: 'Dockerfile.controller', agent: 'Dockerfile.agent' } as const;
type Image = keyof typeof IMAGES;
/** Every backend the agent may pick; the Record makes a new Backend a compile error here. */
const BACKENDS = Object.keys({ nft: true, legacy: true } satisfies Record<Backend, true>) as Backend[];

const finalStage = (image: Image): Stage => parseDockerfile(readFileSync(join(ROOT, IMAGES[image]), 'utf8')).stages.at(-1)!;
const hostCodename = () => /^VERSION_CODENAME=(\S+)$/m.exec(readFileSync('/etc/os-release', 'utf8'))?.[1];

describe('the Dockerfiles, read', () => {
  it.each(Object.keys(IMAGES) as Image[])('%s: runs the CLI from /app with the entry point the manifests name, its subcommand by default', (image) => {
    const stage = finalStage(image);
    // node, its flags (the agent's keep its heap small), the bundled CLI.
    const [program, ...rest] = stage.entrypoint ?? [];
    expect(program).toBe('node');
    expect(rest.at(-1)).toBe(BUNDLE);
    for (const flag of rest.slice(0, -1)) expect(flag).toMatch(/^--[a-z-]+(=\S+)?$/);
    if (image === 'controller') expect(rest).toEqual([BUNDLE]);
    expect(stage.workdir).toBe('/app');
    expect(stage.cmd).toEqual([image]);
    expect(stage.env['NODE_ENV']).toBe('production');
  });

  it.each(Object.keys(IMAGES) as Image[])('%s: OCI labels name it, its licence and package.json version', (image) => {
    const labels = finalStage(image).labels;
    expect(labels['org.opencontainers.image.title']).toBe(`pier-${image}`);
    expect(labels['org.opencontainers.image.description']).toMatch(new RegExp(`^pier ${image}: `));
    expect(labels).toHaveProperty(['org.opencontainers.image.source']);
    expect(labels['org.opencontainers.image.licenses']).toBe(PKG.license);
    expect(labels['org.opencontainers.image.version']).toBe(PKG.version);
  });

  it.each(Object.keys(IMAGES) as Image[])('%s: every base image is the Node and Debian release this reproduction runs on', (image) => {
    // The reproduction runs the steps with this machine's Node and checks
    // packages against this machine's Debian: only valid if they match.
    const df = parseDockerfile(readFileSync(join(ROOT, IMAGES[image]), 'utf8'));
    const names = new Set(df.stages.map((s) => s.name));
    const bases = df.stages.map((s) => s.base).filter((b) => !names.has(b));
    expect(bases.length).toBeGreaterThan(0);
    for (const base of bases) {
      expect(base).toMatch(/^node:\d+-[a-z]+-slim(@sha256:[0-9a-f]{64})?$/);
      const [, major, codename] = /^node:(\d+)-([a-z]+)/.exec(base)!;
      expect(major).toBe(process.versions.node.split('.')[0]);
      expect(codename).toBe(hostCodename());
    }
  });

  it('agent: npm run bench:agent measures the agent with the Node flags its image runs it with', () => {
    const flags = nodeFlags(finalStage('agent'));
    expect(flags.length).toBeGreaterThan(0);
    const scripts = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts;
    const bench = scripts['bench:agent']!.split(' ');
    expect(bench[0]).toBe('node');
    expect(bench.slice(1, -1).filter((f) => f !== '--expose-gc')).toEqual(flags);
  });

  it('controller: runs as a non-root numeric user', () => {
    const user = finalStage('controller').user;
    expect(user).toBe('65532:65532');
  });

  it('agent: runs as root and installs iptables, which holds every iptables binary the agent calls', async () => {
    const stage = finalStage('agent');
    expect([undefined, 'root', '0', '0:0']).toContain(stage.user);
    const commands = stage.steps.flatMap((s) => (s.kind !== 'RUN' ? [] : s.exec ? [s.exec] : splitShell(s.shell!)));
    const packages = commands.filter(([cmd, sub]) => cmd === 'apt-get' && sub === 'install').flatMap((c) => c.slice(2).filter((w) => !w.startsWith('-')));
    expect(packages).toContain('iptables');
    // The image's Debian release is this machine's (checked above), so dpkg here lists what the package ships there.
    const { stdout } = await execa('dpkg-query', ['-L', ...packages]);
    const shipped = new Set(stdout.split('\n').filter((p) => /^\/usr\/s?bin\//.test(p)).map((p) => p.replace(/^.*\//, '')));
    const needed = FAMILIES.flatMap((family) => BACKENDS.flatMap((backend) => Object.values(binaries(backend, family))));
    expect(needed).toHaveLength(12);
    expect(needed.filter((b) => !shipped.has(b))).toEqual([]);
  });
});

describe('the images, built outside Docker', () => {
  let work: string;
  let unregister: () => void;
  const built = {} as Record<Image, BuiltStage>;
  let cpStart: Promise<ControlPlane> | undefined;

  beforeAll(async () => {
    work = mkdtempSync(join(tmpdir(), 'pier-images-'));
    unregister = atExit(() => rmSync(work, { recursive: true, force: true }));
    // The controller runs as 65532, which must be able to read its folders.
    chmodSync(work, 0o755);
    // Started alongside the build, which spends much of its time waiting on npm and the disk.
    cpStart = startControlPlane();
    cpStart.catch(() => {}); // reported by the test that awaits it
    const builder = new ImageBuilder(ROOT, work, (line) => process.stderr.write(`${line}\n`));
    for (const image of Object.keys(IMAGES) as Image[]) built[image] = await builder.build(join(ROOT, IMAGES[image]));
  });

  afterAll(async () => {
    const cp = await cpStart?.catch(() => undefined);
    await cp?.stop();
    if (work) rmSync(work, { recursive: true, force: true });
    unregister?.();
  });

  it('the agent image records iptables among its packages', () => {
    expect(built.agent.packages).toContain('iptables');
    expect(built.controller.packages).toEqual([]);
  });

  it.each(Object.keys(IMAGES) as Image[])('%s: holds the bundled CLI, its source map, the licences of what it bundles and package.json, and nothing else', (image) => {
    const app = join(built[image].rootfs, 'app');
    const files = (readdirSync(app, { recursive: true, withFileTypes: true }) as Dirent[]).filter((e) => !e.isDirectory());
    expect(files.map((e) => relative(app, join(e.parentPath, e.name))).sort()).toEqual(['dist/THIRD-PARTY-NOTICES.txt', 'dist/pier.mjs', 'dist/pier.mjs.map', 'package.json']);
    const notices = readFileSync(join(app, 'dist/THIRD-PARTY-NOTICES.txt'), 'utf8');
    for (const dep of Object.keys(PKG.dependencies)) expect(notices).toMatch(new RegExp(`^${dep} \\d+\\.\\d+\\.\\d+ \\(`, 'm'));
    expect(JSON.parse(readFileSync(join(app, 'package.json'), 'utf8'))).toMatchObject({ version: PKG.version });
    // No node_modules: the commands below, which run the image, prove that every dependency is inside the bundle.
  });

  it.each([
    ['controller', ['controller', '--help'], /^pier controller: .*\n\nUsage: pier controller/],
    ['controller', ['--help'], /^pier \d+\.\d+\.\d+: [\s\S]*Usage: pier <command>/],
    ['agent', ['agent', '--help'], /^pier agent: .*\n\nUsage: pier agent/],
    ['agent', ['plan', '--help'], /^pier plan: .*\n\nUsage: pier plan/],
    ['agent', ['cleanup', '--help'], /^pier cleanup: .*\n\nUsage: pier cleanup/],
    ['agent', ['check', '--help'], /^pier check: .*\n\nUsage: pier check/],
  ] as [Image, string[], RegExp][])('%s image: %j exits 0 with its usage', async (image, args, usage) => {
    const r = await runImage(built[image], args);
    expect(r.stderr).toBe('');
    expect(r.exitCode).toBe(0);
    expect(r.stdout).toMatch(usage);
  });

  it.each(Object.keys(IMAGES) as Image[])('%s image: --version prints package.json version', async (image) => {
    const r = await runImage(built[image], ['--version']);
    expect(r).toMatchObject({ exitCode: 0, stdout: PKG.version });
  });

  describe('the controller image against a real API server, as 65532:65532 on a read-only root', () => {
    let cp: ControlPlane;
    let ro: ReadOnlyRoot;

    beforeAll(async () => {
      cp = await cpStart!;
      ro = await readOnlyRoot();
    });

    afterAll(async () => {
      await ro?.stop();
    });

    it('becomes ready, leads, and stops cleanly on SIGTERM', async () => {
      await ensureNamespace(cp.admin.makeApiClient(CoreV1Api), DEFAULT_NAMESPACE);
      // Outside the image's folders, readable by 65532, like a mounted Secret.
      const kubeconfig = join(work, 'kubeconfig');
      writeFileSync(kubeconfig, cp.admin.exportConfig(), { mode: 0o644 });
      const port = await freePort();
      const { argv, options } = imageCommand(
        built.controller,
        ['controller', `--kubeconfig=${kubeconfig}`, '--health-address=127.0.0.1', `--health-port=${port}`, '--leader-elect-id=image-test'],
        { prefix: ro.prefix },
      );
      const proc = execa(argv[0]!, argv.slice(1), { ...options, all: true, buffer: true });
      const stopProc = atExit(() => proc.kill('SIGKILL'));
      let exited: number | undefined;
      void proc.then((r) => (exited = r.exitCode ?? -1));
      try {
        const body = await eventually(
          'the controller to report itself ready and leading',
          async () => {
            if (exited !== undefined) throw new Error(`exited with ${exited}: ${String((await proc).all).slice(-2000)}`);
            const res = await fetch(`http://127.0.0.1:${port}/readyz`);
            const text = await res.text();
            return res.status === 200 && text.startsWith('leader') ? text : undefined;
          },
          { timeoutMs: 60_000, intervalMs: 200 },
        );
        expect(body).toMatch(/^leader/);
        // The process itself, not only its command line: user, and the root it sees.
        const status = readFileSync(`/proc/${proc.pid}/status`, 'utf8');
        expect(/^Uid:\s+(.*)$/m.exec(status)?.[1]?.split(/\s+/)).toEqual(['65532', '65532', '65532', '65532']);
        expect(/^Gid:\s+(.*)$/m.exec(status)?.[1]?.split(/\s+/)).toEqual(['65532', '65532', '65532', '65532']);
        const root = readFileSync(`/proc/${proc.pid}/mountinfo`, 'utf8').split('\n').filter((l) => l.split(' ')[4] === '/').at(-1);
        expect(root?.split(' ')[5]?.split(',')).toContain('ro');
        const lease = await cp.admin.makeApiClient(CoordinationV1Api).readNamespacedLease({ namespace: DEFAULT_NAMESPACE, name: LEADER_LEASE_NAME });
        expect(lease.spec?.holderIdentity).toBe('image-test');
        proc.kill('SIGTERM');
        const r = await proc;
        expect(r.exitCode, String(r.all)).toBe(0);
        // A write attempt on the read-only root would surface as EROFS.
        expect(String(r.all)).not.toMatch(/EROFS|EACCES|read-only file system/i);
      } finally {
        proc.kill('SIGKILL');
        stopProc();
      }
    });
  });

  it('the agent image, with its Node flags, syncs against a real API server in dry-run mode', async () => {
    const cp = await cpStart!;
    const core = cp.admin.makeApiClient(CoreV1Api);
    await registerNode(core, { metadata: { name: 'image-node' }, status: { addresses: [{ type: 'InternalIP', address: '198.51.100.31' }] } });
    const kubeconfig = join(work, 'agent-kubeconfig');
    writeFileSync(kubeconfig, cp.admin.exportConfig(), { mode: 0o600 });
    const port = await freePort();
    const { argv, options } = imageCommand(built.agent, ['agent', '--dry-run', '--node-name=image-node', `--kubeconfig=${kubeconfig}`, '--health-address=127.0.0.1', `--health-port=${port}`]);
    const proc = execa(argv[0]!, argv.slice(1), { ...options, all: true, buffer: true });
    const stopProc = atExit(() => proc.kill('SIGKILL'));
    let exited: number | undefined;
    void proc.then((r) => (exited = r.exitCode ?? -1));
    try {
      await eventually(
        'the agent to report its first sync',
        async () => {
          if (exited !== undefined) throw new Error(`exited with ${exited}: ${String((await proc).all).slice(-2000)}`);
          const res = await fetch(`http://127.0.0.1:${port}/readyz`);
          return res.status === 200 ? true : undefined;
        },
        { timeoutMs: 60_000, intervalMs: 200 },
      );
      proc.kill('SIGTERM');
      const r = await proc;
      expect(r.exitCode, String(r.all)).toBe(0);
      // Each sync prints its restore input: pier's chains for the node, in both families.
      expect(String(r.stdout)).toMatch(/^\*nat$/m);
      expect(String(r.all)).not.toMatch(/"level":"(error|fatal)"/);
    } finally {
      proc.kill('SIGKILL');
      stopProc();
    }
  });
});
