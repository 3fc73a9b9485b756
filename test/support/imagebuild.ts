// Reproduces a Dockerfile's build outside Docker (no engine here or in CI):
// the build context filtered by .dockerignore, each needed stage as a folder
// standing for its root filesystem, COPY as file copies, and the npm steps of
// RUN executed on the host, whose Node stands in for the base image's. What
// only a package manager of the base image can do (apt-get) is recorded, not
// run, for the caller to check. Any other command throws.
import { cpSync, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { basename, dirname, join, posix } from 'node:path';
import { execa, type Options } from 'execa';
import { DockerfileError, parseDockerfile, parseDockerignore, splitShell, stageRef, type Dockerfile, type Stage } from './dockerfile.ts';

export interface BuiltStage {
  stage: Stage;
  /** The folder that stands for the stage's `/`. */
  rootfs: string;
  /** Debian packages its RUN steps install with apt-get (and those of the stage it starts from). */
  packages: string[];
}

export interface CommandResult {
  exitCode: number;
  stdout: string;
  stderr: string;
}

const hostPath = (rootfs: string, abs: string) => join(rootfs, posix.resolve('/', abs));

/** Copies the build context as Docker would send it: everything .dockerignore does not exclude. */
export function copyContext(contextDir: string, target: string): void {
  const ignoreFile = join(contextDir, '.dockerignore');
  const ignore = parseDockerignore(existsSync(ignoreFile) ? readFileSync(ignoreFile, 'utf8') : '');
  const walk = (rel: string) => {
    for (const entry of readdirSync(join(contextDir, rel), { withFileTypes: true })) {
      const relPath = rel === '' ? entry.name : `${rel}/${entry.name}`;
      const excluded = ignore.ignored(relPath);
      if (entry.isDirectory()) {
        // An excluded folder can still hold an included file only through a `!` pattern.
        if (excluded && !ignore.mayIncludeUnder(relPath)) continue;
        walk(relPath);
      } else if (!excluded) {
        mkdirSync(join(target, rel), { recursive: true });
        cpSync(join(contextDir, relPath), join(target, relPath), { verbatimSymlinks: true });
      }
    }
  };
  mkdirSync(target, { recursive: true });
  walk('');
}

/** Builds the stages of Dockerfiles sharing one context; identical stages (same base and steps) are built once, as Docker's cache would. */
export class ImageBuilder {
  private readonly built = new Map<string, Promise<BuiltStage>>();
  private readonly context: string;
  private readonly workDir: string;
  private readonly log: (line: string) => void;

  /** Copies the context at once, so later edits to the tree do not change the build. */
  constructor(contextDir: string, workDir: string, log: (line: string) => void = () => {}) {
    this.workDir = workDir;
    this.log = log;
    this.context = join(workDir, 'context');
    copyContext(contextDir, this.context);
  }

  /** Builds the last stage of the Dockerfile at `file` (and only the stages it needs). */
  async build(file: string): Promise<BuiltStage> {
    const df = parseDockerfile(readFileSync(file, 'utf8'));
    return this.buildStage(df, df.stages.at(-1)!, basename(file));
  }

  private async buildStage(df: Dockerfile, stage: Stage, file: string): Promise<BuiltStage> {
    const parentStage = stageRef(df, stage.base, stage.index);
    const parent = parentStage ? await this.buildStage(df, parentStage, file) : undefined;
    const deps = new Map<string, BuiltStage>();
    for (const step of stage.steps) {
      if (step.kind !== 'COPY' || step.from === undefined || deps.has(step.from)) continue;
      const from = stageRef(df, step.from, stage.index);
      if (!from) throw new DockerfileError(`${file} line ${step.line}: COPY --from=${step.from} names an image, not a stage; the reproduction cannot fetch images`);
      deps.set(step.from, await this.buildStage(df, from, file));
    }
    const key = createHash('sha256')
      .update(
        JSON.stringify({
          base: parent ? parent.rootfs : `image:${stage.base}`,
          deps: [...deps].map(([ref, d]) => [ref, d.rootfs]),
          steps: stage.steps.map(({ line: _line, ...s }) => s),
        }),
      )
      .digest('hex')
      .slice(0, 16);
    let result = this.built.get(key);
    if (!result) {
      result = this.runStage(stage, `${file} stage ${stage.name ?? stage.index}`, join(this.workDir, 'stages', key), parent, deps);
      this.built.set(key, result);
    }
    return { ...(await result), stage };
  }

  private async runStage(stage: Stage, label: string, rootfs: string, parent: BuiltStage | undefined, deps: Map<string, BuiltStage>): Promise<BuiltStage> {
    this.log(`[image] ${label} (from ${stage.base})`);
    const started = performance.now();
    if (parent) cpSync(parent.rootfs, rootfs, { recursive: true, verbatimSymlinks: true });
    mkdirSync(hostPath(rootfs, stage.workdir), { recursive: true });
    const packages = [...(parent?.packages ?? [])];
    for (const step of stage.steps) {
      const where = `${label}, line ${step.line}`;
      if (step.kind === 'WORKDIR') {
        mkdirSync(hostPath(rootfs, step.path), { recursive: true });
      } else if (step.kind === 'COPY') {
        const srcRoot = step.from !== undefined ? deps.get(step.from)!.rootfs : this.context;
        for (const src of step.sources) {
          const normal = posix.normalize(src);
          if (step.from === undefined && (normal.startsWith('../') || normal === '..')) throw new DockerfileError(`${where}: COPY ${src} is outside the build context`);
          const from = hostPath(srcRoot, normal);
          if (!existsSync(from)) {
            throw new DockerfileError(`${where}: COPY source ${src} does not exist in ${step.from !== undefined ? `stage ${step.from}` : 'the build context (after .dockerignore)'}`);
          }
          const dest = hostPath(rootfs, step.dest);
          if (lstatSync(from).isDirectory()) {
            // Docker copies a folder's contents, not the folder itself.
            cpSync(from, dest, { recursive: true, verbatimSymlinks: true });
          } else {
            const target = step.destIsDir || (existsSync(dest) && statSync(dest).isDirectory()) ? join(dest, basename(normal)) : dest;
            mkdirSync(dirname(target), { recursive: true });
            cpSync(from, target, { verbatimSymlinks: true });
          }
        }
      } else {
        for (const argv of step.exec ? [step.exec] : splitShell(step.shell!)) {
          await this.runCommand(argv, rootfs, step.workdir, step.env, packages, where);
        }
      }
    }
    this.log(`[image] ${label}: ${((performance.now() - started) / 1000).toFixed(1)} s`);
    return { stage, rootfs, packages };
  }

  private async runCommand(argv: string[], rootfs: string, workdir: string, env: Record<string, string>, packages: string[], where: string): Promise<void> {
    const [cmd, ...args] = argv as [string, ...string[]];
    const text = argv.join(' ');
    if (cmd === 'npm' || cmd === 'npx') {
      // Arguments naming absolute paths or globs would mean the host's files here, not the image's.
      const bad = args.find((a) => a.startsWith('/') || /[*?[]/.test(a));
      if (bad) throw new DockerfileError(`${where}: cannot reproduce "${text}": argument ${bad}`);
      // Only where packages come from changes: the lockfile still decides what is installed.
      const extra = cmd === 'npm' && (args[0] === 'ci' || args[0] === 'install') ? ['--prefer-offline'] : [];
      const started = performance.now();
      const r = await execa(cmd, [...args, ...extra], {
        cwd: hostPath(rootfs, workdir),
        // The image's environment, not the test runner's (vitest sets NODE_ENV=test, for one),
        // but the host's way to the registry: a build on this machine would need it too.
        env: { PATH: `${dirname(process.execPath)}:${process.env['PATH'] ?? ''}`, HOME: process.env['HOME'] ?? '/root', ...registryAccess(), ...env },
        extendEnv: false,
        reject: false,
        all: true,
      });
      if (r.exitCode !== 0) throw new DockerfileError(`${where}: "${text}" exited with ${r.exitCode}:\n${String(r.all ?? '').slice(-4000)}`);
      this.log(`[image]   ${text}: ${((performance.now() - started) / 1000).toFixed(1)} s`);
      return;
    }
    if (cmd === 'apt-get' && args[0] === 'update' && args.length === 1) return;
    if (cmd === 'apt-get' && args[0] === 'install') {
      const flags = args.slice(1).filter((a) => a.startsWith('-'));
      const unknown = flags.filter((f) => !['-y', '-q', '-qq', '--no-install-recommends'].includes(f));
      if (unknown.length > 0) throw new DockerfileError(`${where}: unsupported apt-get install flags ${unknown.join(' ')}`);
      packages.push(...args.slice(1).filter((a) => !a.startsWith('-')));
      return;
    }
    if (text === 'rm -rf /var/lib/apt/lists/*') return;
    throw new DockerfileError(`${where}: the reproduction cannot run "${text}" outside Docker (teach test/support/imagebuild.ts, or do it another way)`);
  }
}

/** The host's CA bundle and proxies, which npm needs to reach the registry from here. */
function registryAccess(): Record<string, string> {
  const names = ['NODE_EXTRA_CA_CERTS', 'HTTP_PROXY', 'HTTPS_PROXY', 'NO_PROXY', 'http_proxy', 'https_proxy', 'no_proxy'];
  return Object.fromEntries(names.flatMap((n) => (process.env[n] ? [[n, process.env[n]!]] : [])));
}

/** A node_modules above the image's folders would satisfy a dependency the image lacks. */
function assertNoOuterNodeModules(rootfs: string): void {
  for (let dir = dirname(rootfs); ; dir = dirname(dir)) {
    if (existsSync(join(dir, 'node_modules'))) throw new Error(`${join(dir, 'node_modules')} exists above the reproduced image and would hide missing dependencies`);
    if (dirname(dir) === dir) return;
  }
}

export interface RunOptions {
  /** argv the command runs under, e.g. a namespace's nsenter; the image's USER is applied inside it. */
  prefix?: string[];
}

/**
 * `docker run <image> ...args` as an argv: the ENTRYPOINT with `args` in
 * place of CMD, as the image's USER, in its WORKDIR, with only its ENV.
 * Paths in the ENTRYPOINT are the image's; `node` is the host's Node.
 */
export function imageCommand(image: BuiltStage, args: string[], opts: RunOptions = {}): { argv: string[]; options: Options } {
  const { stage, rootfs } = image;
  const [program, ...entryArgs] = stage.entrypoint ?? [];
  if (program !== 'node') throw new Error(`the reproduction can only run a "node" ENTRYPOINT, not ${JSON.stringify(stage.entrypoint)}`);
  assertNoOuterNodeModules(rootfs);
  let drop: string[] = [];
  if (stage.user !== undefined && !['root', '0', '0:0'].includes(stage.user)) {
    const m = /^(\d+)(?::(\d+))?$/.exec(stage.user);
    // A user name would need the image's /etc/passwd, which the reproduction does not have.
    if (!m) throw new Error(`USER ${stage.user}: only numeric uid[:gid] can be reproduced`);
    if (process.getuid?.() !== 0) throw new Error(`running as USER ${stage.user} needs root`);
    drop = ['setpriv', `--reuid=${m[1]}`, `--regid=${m[2] ?? m[1]}`, '--clear-groups', '--'];
  }
  const argv = [...(opts.prefix ?? []), ...drop, process.execPath, ...entryArgs.map((a) => (a.startsWith('/') ? hostPath(rootfs, a) : a)), ...args];
  const options: Options = {
    cwd: hostPath(rootfs, stage.workdir),
    // Docker gives a user without a passwd entry HOME=/.
    env: { PATH: `${dirname(process.execPath)}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`, HOME: drop.length > 0 ? '/' : '/root', ...stage.env },
    extendEnv: false,
    reject: false,
    stdin: 'ignore',
  };
  return { argv, options };
}

export async function runImage(image: BuiltStage, args: string[], opts: RunOptions = {}): Promise<CommandResult> {
  const { argv, options } = imageCommand(image, args, opts);
  const r = await execa(argv[0]!, argv.slice(1), options);
  return { exitCode: r.exitCode ?? -1, stdout: String(r.stdout), stderr: String(r.stderr) };
}
