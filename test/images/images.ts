// The container images the tests run, built by a real builder:
// test/images/build.sh (buildah, with a locally made base image, since no
// registry is reachable). ensureImages() runs it once per process (warm: a
// few seconds), or, when scripts/test.sh already did, reads what it built
// from $PIER_IMAGES_DIR. Also here: reading an image's configuration and
// mounting its root filesystem from buildah's storage.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa, execaSync } from 'execa';
import { atExit } from '../support/cleanup.ts';

export const IMAGES = ['agent', 'controller', 'pause', 'echo'] as const;
export type ImageName = (typeof IMAGES)[number];

export interface BuiltImages {
  /** The folder build.sh printed: archives, images.json and buildah's storage. */
  dir: string;
  /** docker-archive files, for `ctr -n k8s.io images import` (or `docker load`). */
  archives: Record<ImageName, string>;
  /** Full names, as containerd stores them: docker.io/pier/agent:0.1.0, registry.k8s.io/pause:3.10, ... */
  names: Record<ImageName, string>;
  /** buildah's global flags for the private storage holding the images: `buildah ...flags inspect NAME`. */
  buildahFlags: string[];
}

/** The part of an OCI image configuration the tests read. */
export interface ImageConfig {
  User?: string;
  Env?: string[];
  Entrypoint?: string[];
  Cmd?: string[];
  WorkingDir?: string;
  Labels?: Record<string, string>;
  ExposedPorts?: Record<string, object>;
}

const BUILD = fileURLToPath(new URL('./build.sh', import.meta.url));

interface Manifest {
  storage: { root: string; runroot: string; driver: string };
  images: Record<ImageName, { name: string; archive: string }>;
}

let loading: Promise<BuiltImages> | undefined;

/** The built images; builds (or refreshes) them unless $PIER_IMAGES_DIR names a build already made. */
export async function ensureImages(): Promise<BuiltImages> {
  loading ??= load().catch((err: unknown) => {
    loading = undefined;
    throw err;
  });
  return loading;
}

async function load(): Promise<BuiltImages> {
  let dir = process.env['PIER_IMAGES_DIR'];
  if (!dir) {
    // Progress on the test's stderr: a cold build takes minutes.
    const r = await execa('bash', [BUILD], { stdin: 'ignore', stderr: 'inherit', reject: false });
    if (r.exitCode !== 0) throw new Error(`test/images/build.sh exited with ${r.exitCode} (its log is above)`);
    dir = r.stdout.trim();
  }
  const file = join(dir, 'images.json');
  if (!existsSync(file)) throw new Error(`${file} not found: is ${dir} a folder test/images/build.sh printed?`);
  const m = JSON.parse(readFileSync(file, 'utf8')) as Manifest;
  const archives = {} as Record<ImageName, string>;
  const names = {} as Record<ImageName, string>;
  for (const image of IMAGES) {
    const entry = m.images[image];
    if (!entry || !existsSync(entry.archive)) throw new Error(`${file}: no archive for ${image}`);
    archives[image] = entry.archive;
    names[image] = entry.name;
  }
  const buildahFlags = ['--root', m.storage.root, '--runroot', m.storage.runroot, '--storage-driver', m.storage.driver];
  return { dir, archives, names, buildahFlags };
}

/** `buildah ...args` on the images' storage. */
export async function buildah(images: BuiltImages, args: string[]): Promise<string> {
  const r = await execa('buildah', [...images.buildahFlags, ...args], { stdin: 'ignore', reject: false, all: true });
  if (r.exitCode !== 0) throw new Error(`buildah ${args.join(' ')} exited with ${r.exitCode}: ${String(r.all)}`);
  return r.stdout;
}

/** The image's configuration as buildah committed it (OCI form). */
export async function imageConfig(images: BuiltImages, image: ImageName): Promise<ImageConfig> {
  const info = JSON.parse(await buildah(images, ['inspect', '--type', 'image', images.names[image]])) as { OCIv1: { config?: ImageConfig } };
  return info.OCIv1.config ?? {};
}

export interface MountedImage {
  /** The image's root filesystem, writable: a buildah working container's. */
  rootfs: string;
  remove(): Promise<void>;
}

let mounts = 0;

/**
 * A working container of `image`, mounted: its root filesystem as a folder.
 * Named pier-images-test-<pid>-<n>, so build.sh leaves it alone; removed by
 * `remove()`, or at exit.
 */
export async function mountImage(images: BuiltImages, image: ImageName): Promise<MountedImage> {
  const name = `pier-images-test-${process.pid}-${mounts++}`;
  const removeSync = () => {
    execaSync('buildah', [...images.buildahFlags, 'umount', name], { reject: false, stdio: 'ignore' });
    execaSync('buildah', [...images.buildahFlags, 'rm', name], { reject: false, stdio: 'ignore' });
  };
  const unregister = atExit(removeSync);
  try {
    await buildah(images, ['from', '--quiet', '--pull=never', '--name', name, images.names[image]]);
    const rootfs = (await buildah(images, ['mount', name])).trim();
    let removed = false;
    return {
      rootfs,
      async remove() {
        if (removed) return;
        removed = true;
        await execa('buildah', [...images.buildahFlags, 'umount', name], { reject: false, stdio: 'ignore' });
        await execa('buildah', [...images.buildahFlags, 'rm', name], { reject: false, stdio: 'ignore' });
        unregister();
      },
    };
  } catch (err) {
    removeSync();
    unregister();
    throw err;
  }
}
