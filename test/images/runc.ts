// Runs a built image with runc, the runtime under containerd and the
// kubelet: the image's root filesystem (a buildah working container), its
// ENTRYPOINT, CMD, Env, WorkingDir and USER, and what a pod's spec adds
// (args, env, a read-only root, capabilities, no privilege escalation, a
// read-only file mounted like a Secret). The container shares the machine's
// network namespace (hostNetwork), so it reaches a test API server on
// loopback; it has its own PID, mount, IPC and UTS namespaces.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa, execaSync, type ResultPromise } from 'execa';
import { atExit } from '../support/cleanup.ts';
import { imageConfig, mountImage, type BuiltImages, type ImageName } from './images.ts';

export interface RunOptions {
  /** Replaces the image's CMD, as a pod's `args` does. */
  args?: string[];
  /** Replaces ENTRYPOINT and CMD, as a pod's `command` does. */
  command?: string[];
  /** Added to the image's Env (and overriding it). */
  env?: Record<string, string>;
  readOnlyRoot?: boolean;
  /** Overrides the image's USER, as runAsUser and runAsGroup do. */
  user?: { uid: number; gid: number };
  /** What a pod keeps after `drop: [ALL]`: e.g. ['NET_ADMIN']. Default: none. */
  capabilities?: string[];
  /** Files or folders bound read-only into the container. */
  mounts?: { source: string; destination: string }[];
}

export interface Container {
  id: string;
  /** `runc run`: exits with the container's status; its output is the container's; SIGTERM reaches the container. */
  proc: ResultPromise<{ stdin: 'ignore'; all: true; buffer: true; reject: false }>;
  /** Its stdout and stderr so far, interleaved. */
  output(): string;
  /** Its exit status once `runc run` has exited, else undefined. */
  exitCode(): number | undefined;
  /** The container's first process, as the machine sees it. */
  pid(): Promise<number>;
  /** Kills what is left and removes the container, its bundle and its root filesystem. */
  remove(): Promise<void>;
}

/** USER as uid and gid; only the numeric forms (names would need the image's /etc/passwd). */
export function parseUser(user: string | undefined): { uid: number; gid: number } {
  if (user === undefined || user === '' || user === 'root') return { uid: 0, gid: 0 };
  const m = /^(\d+)(?::(\d+))?$/.exec(user);
  if (!m) throw new Error(`USER ${user}: only uid[:gid] is supported`);
  return { uid: Number(m[1]), gid: Number(m[2] ?? m[1]) };
}

let runs = 0;
let stateRoot: string | undefined;

interface Spec {
  root: { path: string; readonly: boolean };
  process: {
    terminal: boolean;
    user: { uid: number; gid: number; additionalGids?: number[] };
    args: string[];
    env: string[];
    cwd: string;
    capabilities: Record<'bounding' | 'effective' | 'permitted' | 'inheritable' | 'ambient', string[]>;
    noNewPrivileges: boolean;
  };
  hostname: string;
  mounts: { destination: string; type: string; source: string; options: string[] }[];
  linux: { namespaces: { type: string }[] };
}

export async function startContainer(images: BuiltImages, image: ImageName, opts: RunOptions = {}): Promise<Container> {
  const config = await imageConfig(images, image);
  const id = `pier-images-run-${process.pid}-${runs++}`;
  if (!stateRoot) {
    const dir = mkdtempSync(join(tmpdir(), 'pier-runc-'));
    stateRoot = dir;
    atExit(() => rmSync(dir, { recursive: true, force: true }));
  }
  const root = stateRoot;
  const bundle = mkdtempSync(join(tmpdir(), 'pier-bundle-'));
  const rootfs = await mountImage(images, image).catch((err: unknown) => {
    rmSync(bundle, { recursive: true, force: true });
    throw err;
  });
  const removeSync = () => {
    execaSync('runc', ['--root', root, 'delete', '--force', id], { reject: false, stdio: 'ignore' });
    rmSync(bundle, { recursive: true, force: true });
  };
  const unregister = atExit(removeSync);
  const remove = async () => {
    await execa('runc', ['--root', root, 'delete', '--force', id], { reject: false, stdio: 'ignore' });
    rmSync(bundle, { recursive: true, force: true });
    await rootfs.remove();
    unregister();
  };
  try {
    // runc's own default spec (namespaces, /proc, /dev, masked paths, a
    // devices cgroup), adjusted to the image and the options.
    await execa('runc', ['spec', '--bundle', bundle]);
    const spec = JSON.parse(readFileSync(join(bundle, 'config.json'), 'utf8')) as Spec;
    const user = opts.user ?? parseUser(config.User);
    const caps = (opts.capabilities ?? []).map((c) => `CAP_${c}`);
    const env = new Map((config.Env ?? []).map((e) => [e.slice(0, e.indexOf('=')), e.slice(e.indexOf('=') + 1)]));
    for (const [k, v] of Object.entries(opts.env ?? {})) env.set(k, v);
    spec.root = { path: rootfs.rootfs, readonly: opts.readOnlyRoot ?? false };
    spec.process = {
      ...spec.process,
      terminal: false,
      user,
      args: opts.command ?? [...(config.Entrypoint ?? []), ...(opts.args ?? config.Cmd ?? [])],
      env: [...env].map(([k, v]) => `${k}=${v}`),
      cwd: config.WorkingDir || '/',
      // As containerd gives them: a non-root process holds none in effect.
      capabilities: { bounding: caps, effective: user.uid === 0 ? caps : [], permitted: user.uid === 0 ? caps : [], inheritable: [], ambient: [] },
      noNewPrivileges: true,
    };
    if (spec.process.args.length === 0) throw new Error(`${images.names[image]} has neither ENTRYPOINT nor CMD`);
    spec.hostname = id;
    for (const m of opts.mounts ?? []) spec.mounts.push({ destination: m.destination, type: 'bind', source: m.source, options: ['rbind', 'ro'] });
    spec.linux.namespaces = spec.linux.namespaces.filter((ns) => ns.type !== 'network');
    writeFileSync(join(bundle, 'config.json'), JSON.stringify(spec, null, 2));
    const proc = execa('runc', ['--root', root, 'run', '--bundle', bundle, id], { stdin: 'ignore', all: true, buffer: true, reject: false });
    let output = '';
    let exitCode: number | undefined;
    proc.all.on('data', (chunk: Buffer) => (output += chunk.toString()));
    void proc.then((r) => (exitCode = r.exitCode ?? -1));
    const pid = async () => {
      const { stdout } = await execa('runc', ['--root', root, 'state', id]);
      return (JSON.parse(stdout) as { pid: number }).pid;
    };
    return { id, proc, output: () => output, exitCode: () => exitCode, pid, remove };
  } catch (err) {
    await remove();
    throw err;
  }
}

export interface RunResult {
  exitCode: number;
  stdout: string;
  stderr: string;
}

/** Runs the image to completion (a minute at most) and removes the container. */
export async function runContainer(images: BuiltImages, image: ImageName, opts: RunOptions = {}): Promise<RunResult> {
  const c = await startContainer(images, image, opts);
  try {
    const timer = setTimeout(() => c.proc.kill('SIGKILL'), 60_000);
    const r = await c.proc;
    clearTimeout(timer);
    return { exitCode: r.exitCode ?? -1, stdout: String(r.stdout), stderr: String(r.stderr) };
  } finally {
    await c.remove();
  }
}
