// scripts/go-env.sh, as a fresh Debian machine runs it: with no go at all (or
// one too old, like bookworm's 1.19) it fetches the official toolchain that
// the pinned modules need from a Go module proxy, checks it against the
// checksum database's record, and puts it first on PATH; with a go new enough
// it fetches nothing.
// The proxy here is the Go module download cache, which has the proxy's
// layout (the zip and the sumdb lookup) and is served as file://: the real
// ~70 MB zip, checked by the real record, without a download per run. When
// the cache lacks it, the machine's go downloads it once (`go mod download`
// checks it against sum.golang.org in full); on a machine with no go the
// tests are skipped, as nothing can vouch for the record there.
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa, execaSync } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const MACHINE_GO = '/usr/local/go/bin/go';
const FRESH_PATH = '/usr/bin:/bin';

/** The highest `go` or `toolchain` version of the two pinned modules, as x.y.z. */
function pinnedGo(): string {
  const versions = ['test/cluster/build/go.mod', 'test/upstream/build/go.mod'].flatMap((f) =>
    [...readFileSync(join(ROOT, f), 'utf8').matchAll(/^(?:go |toolchain go)(\d+\.\d+(?:\.\d+)?)\s*$/gm)].map((m) =>
      m[1]!.split('.').length === 2 ? `${m[1]}.0` : m[1]!,
    ),
  );
  const key = (v: string) => v.split('.').map(Number);
  return versions.sort((a, b) => {
    const [x, y] = [key(a), key(b)];
    for (let i = 0; i < 3; i++) if (x[i] !== y[i]) return x[i]! - y[i]!;
    return 0;
  }).at(-1)!;
}

const WANT = pinnedGo();
const MODULE_VERSION = `v0.0.1-go${WANT}.linux-amd64`;
const machineGo = existsSync(MACHINE_GO);
const machineVersion = machineGo ? execaSync(MACHINE_GO, ['version'], { env: { GOTOOLCHAIN: 'local' } }).stdout : '';
/** "go version go1.26.8 linux/amd64" is at least WANT. */
const machineNewEnough = /go(\d+\.\d+(?:\.\d+)?)/.exec(machineVersion)?.[1]?.localeCompare(WANT, 'en', { numeric: true }) ?? -1;
const modCache = machineGo ? execaSync(MACHINE_GO, ['env', 'GOMODCACHE']).stdout.trim() : '';
const download = join(modCache, 'cache', 'download');
const zip = join(download, 'golang.org', 'toolchain', '@v', `${MODULE_VERSION}.zip`);
const lookup = join(download, 'sumdb', 'sum.golang.org', 'lookup', `golang.org/toolchain@${MODULE_VERSION}`);
const haveFixture = modCache !== '' && (machineGo || (existsSync(zip) && existsSync(lookup)));

/**
 * Sources go-env.sh in a clean environment and reports which go it chose.
 * --norc: bash reads ~/.bashrc when its stdin is a socket, as Node's pipes
 * are, and this machine's puts /usr/local/go/bin on PATH there.
 */
async function goEnv(env: Record<string, string>) {
  return execa('bash', ['--norc', '-c', 'source scripts/go-env.sh && command -v go && go version'], {
    cwd: ROOT,
    env: { PATH: FRESH_PATH, HOME: process.env.HOME ?? '/root', GOTOOLCHAIN: 'local', ...env },
    extendEnv: false,
    reject: false,
  });
}

describe.skipIf(process.arch !== 'x64' || !haveFixture)(`scripts/go-env.sh fetches Go ${WANT} when the machine has none new enough`, () => {
  const tmp = mkdtempSync(join(tmpdir(), 'pier-go-env-'));
  const cache = join(tmp, 'cache');

  beforeAll(async () => {
    if (!existsSync(zip) || !existsSync(lookup)) {
      await execa(MACHINE_GO, ['mod', 'download', '-json', `golang.org/toolchain@${MODULE_VERSION}`], { cwd: tmp, env: { GOTOOLCHAIN: 'local', GOFLAGS: '' } });
    }
    expect(existsSync(zip) && existsSync(lookup)).toBe(true);
  });
  afterAll(() => rmSync(tmp, { recursive: true, force: true }));

  it('with no go on PATH: fetches, verifies and unpacks the toolchain, and puts it first', async () => {
    expect((await execa('bash', ['--norc', '-c', 'command -v go'], { env: { PATH: FRESH_PATH }, extendEnv: false, reject: false })).exitCode).not.toBe(0);
    const r = await goEnv({ PIER_MACHINE_GOROOT: '', PIER_GO_CACHE_DIR: cache, GOPROXY: `file://${download}` });
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout.split('\n')).toEqual([join(cache, WANT, 'bin', 'go'), `go version go${WANT} linux/amd64`]);
    // The compiler and linker came out executable too, and no half-unpacked folder is left.
    const tools = join(cache, WANT, 'pkg', 'tool', 'linux_amd64');
    for (const t of ['compile', 'link', 'asm']) expect((await execa(join(tools, t), ['-V=full'], { reject: false })).stdout).toContain(`go${WANT}`);
    expect(readdirSync(cache)).toEqual([WANT]);
  });

  it('with a go too old (bookworm 1.19): uses the one already fetched, fetching nothing', async () => {
    const old = join(tmp, 'old-go');
    mkdirSync(join(old, 'bin'), { recursive: true });
    writeFileSync(join(old, 'bin', 'go'), '#!/bin/sh\necho "go version go1.19.8 linux/amd64"\n', { mode: 0o755 });
    const r = await goEnv({ PIER_MACHINE_GOROOT: old, PIER_GO_CACHE_DIR: cache, GOPROXY: 'off' });
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout.split('\n')).toEqual([join(cache, WANT, 'bin', 'go'), `go version go${WANT} linux/amd64`]);
  });

  it('refuses a zip that does not match the checksum database and keeps nothing of it', async () => {
    const proxy = join(tmp, 'bad-proxy');
    const at = join(proxy, 'golang.org', 'toolchain', '@v');
    mkdirSync(at, { recursive: true });
    symlinkSync(zip, join(at, `${MODULE_VERSION}.zip`));
    const record = readFileSync(lookup, 'utf8').replace(/(golang\.org\/toolchain \S+ h1:)\S+/, '$1AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=');
    const badLookup = join(proxy, 'sumdb', 'sum.golang.org', 'lookup', 'golang.org', `toolchain@${MODULE_VERSION}`);
    mkdirSync(join(badLookup, '..'), { recursive: true });
    writeFileSync(badLookup, record);
    const badCache = join(tmp, 'bad-cache');
    const r = await goEnv({ PIER_MACHINE_GOROOT: '', PIER_GO_CACHE_DIR: badCache, GOPROXY: `file://${proxy}` });
    expect(r.exitCode).not.toBe(0);
    expect(r.stderr).toContain('the checksum database says h1:AAAA');
    expect(readdirSync(badCache)).toEqual([]);
  });

  it.skipIf(machineNewEnough < 0)('with the machine go new enough: uses it and fetches nothing', async () => {
    const unused = join(tmp, 'unused-cache');
    const r = await goEnv({ PIER_GO_CACHE_DIR: unused, GOPROXY: 'off' });
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout.split('\n')).toEqual([MACHINE_GO, machineVersion]);
    expect(existsSync(unused)).toBe(false);
  });
});
