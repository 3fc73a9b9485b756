// The pure parts of the agent's adapters: backend choice, restore error
// messages, jump targets, manifest reading and the forwarding check (on a
// /proc/sys stand-in).
import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { eachFamily } from '../../agent/iptables/applier.ts';
import { jumpTarget } from '../../agent/iptables/restore.ts';
import { chooseFlavour } from '../../agent/iptables/flavour.ts';
import { choiceReason } from '../../agent/backend.ts';
import { describeRestoreFailure, type IptablesFlavour } from '../../agent/iptables/xtables.ts';
import { commandRunner, toolEnv } from '../../lib/run.ts';
import type { Family } from '../../lib/contract.ts';
import { ManifestError, readManifestFiles, readManifests } from '../../cmd/manifests.ts';
import { checkForwarding } from '../../agent/sysctl.ts';

const dir = mkdtempSync(join(tmpdir(), 'pier-adapters-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const file = (name: string, text: string) => {
  const p = join(dir, name);
  mkdirSync(join(p, '..'), { recursive: true });
  writeFileSync(p, text);
  return p;
};

describe('chooseBackend', () => {
  const rules = (n: number) => Array.from({ length: n }, (_, i) => `-A INPUT -s 203.0.113.${i}/32 -j DROP`).join('\n');
  it('trusts kubelet hint chains first, nft before legacy', () => {
    expect(chooseFlavour({ nftMangle: ':KUBE-IPTABLES-HINT - [0:0]', legacyAll: ':KUBE-KUBELET-CANARY - [0:0]', nftAll: '' }).backend).toBe('nft');
    expect(chooseFlavour({ nftMangle: '', legacyAll: `*mangle\n:KUBE-KUBELET-CANARY - [0:0]\n${rules(1)}`, nftAll: rules(50) }).backend).toBe('legacy');
  });
  it('otherwise picks the backend holding more rules, nft on a tie', () => {
    expect(chooseFlavour({ nftMangle: '', legacyAll: rules(12), nftAll: rules(3) })).toMatchObject({ backend: 'legacy', reason: expect.stringContaining('12 against 3') });
    expect(chooseFlavour({ nftMangle: '', legacyAll: rules(2), nftAll: rules(2) }).backend).toBe('nft');
    expect(chooseFlavour({ nftMangle: '', legacyAll: '', nftAll: '' }).reason).toContain('default');
  });
});

describe('choiceReason', () => {
  it('names the flag, the variable or the default, and what auto found', () => {
    expect(choiceReason('--backend')).toBe('set with --backend');
    expect(choiceReason('PIER_BACKEND')).toBe('set with PIER_BACKEND');
    expect(choiceReason('the default')).toBe('the default');
    expect(choiceReason('PIER_BACKEND', 'iptables works')).toBe('auto (set with PIER_BACKEND): iptables works');
    expect(choiceReason('the default', 'kubelet hint chain found with iptables-nft')).toBe('auto (the default): kubelet hint chain found with iptables-nft');
  });
});

describe('describeRestoreFailure', () => {
  it('quotes the payload line iptables-restore names', () => {
    const payload = '*nat\n:PIER-X - [0:0]\n-A PIER-X -j NOPE\nCOMMIT\n';
    const stderr = "iptables-restore v1.8.9 (nf_tables): Chain 'NOPE' does not exist\nError occurred at line: 3\nTry `iptables-restore -h' for more information.\n";
    expect(describeRestoreFailure(stderr, payload)).toBe("iptables-restore v1.8.9 (nf_tables): Chain 'NOPE' does not exist; Error occurred at line: 3 (line 3: -A PIER-X -j NOPE)");
  });
});

describe('eachFamily', () => {
  /** eachFamily over applies that end only when the test lets them; what has started, step by step. */
  function gated(backend: IptablesFlavour) {
    const started: Family[] = [];
    const finish = new Map<Family, () => void>();
    const result = eachFamily(backend, ['ipv4', 'ipv6'], (family) => {
      started.push(family);
      return new Promise<string>((resolve) => finish.set(family, () => resolve(`${family} applied`)));
    });
    return { started, finish: (f: Family) => finish.get(f)!(), result };
  }
  const settle = () => new Promise((resolve) => setImmediate(resolve));

  it('runs the families side by side with nft', async () => {
    const g = gated('nft');
    await settle();
    expect(g.started).toEqual(['ipv4', 'ipv6']);
    g.finish('ipv6');
    g.finish('ipv4');
    expect(await g.result).toEqual(['ipv4 applied', 'ipv6 applied']);
  });

  it('runs them one after the other with legacy, which holds the xtables lock for a whole restore', async () => {
    const g = gated('legacy');
    await settle();
    expect(g.started).toEqual(['ipv4']);
    g.finish('ipv4');
    await settle();
    expect(g.started).toEqual(['ipv4', 'ipv6']);
    g.finish('ipv6');
    expect(await g.result).toEqual(['ipv4 applied', 'ipv6 applied']);
  });
});

describe('commandRunner', () => {
  it("runs every tool with glibc's malloc on huge pages, unless the operator set GLIBC_TUNABLES", async () => {
    expect(toolEnv({})).toEqual({ GLIBC_TUNABLES: 'glibc.malloc.hugetlb=1' });
    expect(toolEnv({ GLIBC_TUNABLES: 'glibc.malloc.arena_max=2' })).toEqual({ GLIBC_TUNABLES: 'glibc.malloc.arena_max=2' });
    const r = await commandRunner()('printenv', ['GLIBC_TUNABLES']);
    expect(r.stdout.trim()).toBe(toolEnv().GLIBC_TUNABLES);
  });
});

describe('a promised input in pieces', () => {
  const pieces = (n: number, taken: { count: number }) =>
    (function* () {
      for (let i = 0; i < n; i++) {
        taken.count++;
        yield `${String(i).padStart(63, '.')}\n`;
      }
    })();

  it('reaches the process whole, in order', async () => {
    const taken = { count: 0 };
    const r = await commandRunner()('sha256sum', [], Promise.resolve(pieces(40_000, taken)));
    const want = createHash('sha256').update([...pieces(40_000, { count: 0 })].join('')).digest('hex');
    expect(r.stdout.split(' ')[0]).toBe(want);
    expect(taken.count).toBe(40_000);
  });

  it('is made only as the process takes it, and a process that is gone takes no more', async () => {
    // 2.5 MB that a process reading nothing for a while cannot all have taken.
    const taken = { count: 0 };
    const run = commandRunner()('sh', ['-c', 'sleep 1; exit 3'], Promise.resolve(pieces(40_000, taken)));
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(taken.count).toBeGreaterThan(0);
    expect(taken.count).toBeLessThan(40_000);
    expect((await run).exitCode).toBe(3);
    const after = taken.count;
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(taken.count).toBe(after);
    expect(after).toBeLessThan(40_000);
  });

  it('that fails kills the process before it reads an end', async () => {
    const failing = function* () {
      // More than one write's worth: the process has read some when the rest fails.
      for (let i = 0; i < 100; i++) yield `${'x'.repeat(1023)}\n`;
      throw new Error('the rest could not be made');
    };
    // Given an end, cat and then sh would exit 0.
    const r = await commandRunner()('sh', ['-c', 'cat >/dev/null; exit 0'], Promise.resolve(failing()));
    expect(r.exitCode).toBe(128 + 9);
    const rejected = await commandRunner()('sh', ['-c', 'cat >/dev/null; exit 0'], Promise.reject(new Error('no input')));
    expect(rejected.exitCode).toBe(128 + 9);
  });
});

describe('jumpTarget', () => {
  it.each([
    ['-j PIER-SERVICES', 'PIER-SERVICES'],
    ['-s 198.19.0.0/16 -g PIER-X', 'PIER-X'],
    ['-j ACCEPT', 'ACCEPT'],
    ['-m comment --comment "x -j y"', undefined],
  ])('%s -> %s', (rule, target) => expect(jumpTarget(rule)).toBe(target));
});

describe('readManifests', () => {
  it('reads multi-document YAML, Lists and JSON from a directory, skipping other kinds and files', () => {
    file('m/a.yaml', 'apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n---\n');
    file('m/b.json', JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [{ apiVersion: 'v1', kind: 'Service', metadata: { name: 's' }, spec: { ports: [{ port: 80 }] } }] }));
    file('m/c.yml', 'apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: e}\naddressType: IPv4\nendpoints: [{addresses: [198.19.1.10]}]\n');
    file('m/notes.txt', 'kind: Service');
    const m = readManifests([join(dir, 'm')]);
    expect([m.nodes.length, m.services.length, m.slices.length]).toEqual([1, 1, 1]);
  });
  it.each([
    ['bad1.yaml', 'kind: Service\nmetadata: {name: s}\nspec: {ports: [{port: "80"}]}\n', /bad1\.yaml: Service s: spec\.ports\[0\]\.port must be an integer, got "80"/],
    ['bad2.yaml', 'kind: EndpointSlice\nmetadata: {name: e}\n', /bad2\.yaml: EndpointSlice e: addressType is missing/],
    ['bad3.yaml', 'kind: Node\nmetadata: {}\n', /bad3\.yaml: metadata\.name is missing \(Node\)/],
    ['bad4.yaml', 'a: [1, 2\n', /bad4\.yaml: not valid YAML or JSON/],
    ['bad5.yaml', '---\nkind: Node\nmetadata: {name: ok}\n---\n- just\n- a list\n', /bad5\.yaml \(document 2\): \(document\) must be an object, got a list/],
    ['bad6.json', '{"kind": "List", "items": [{"kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": {}}}]}', /bad6\.json: Service s: items\[0\]\.spec\.ports must be a list/],
  ])('%s names the file and the field', (name, text, message) => {
    const p = file(name, text);
    expect(() => readManifests([p])).toThrow(ManifestError);
    expect(() => readManifests([p])).toThrow(message);
  });
  it('says when a path does not exist', () => {
    expect(() => readManifests([join(dir, 'nope.yaml')])).toThrow(/nope\.yaml: no such file or directory/);
  });
  it('readManifestFiles skips a bad file whole, names it, and reads every other', () => {
    file('mixed/a.yaml', 'kind: Node\nmetadata: {name: n1}\n');
    // Its first document is fine, its second is not: nothing of the file is kept.
    file('mixed/b.yaml', 'kind: Node\nmetadata: {name: half}\n---\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: eighty}]}\n');
    file('mixed/c.yaml', 'a: [1, 2\n');
    file('mixed/d.json', JSON.stringify({ kind: 'Service', metadata: { name: 'web' }, spec: { ports: [{ port: 80 }] } }));
    const { manifests, errors } = readManifestFiles([join(dir, 'mixed'), join(dir, 'nope.yaml')]);
    expect(manifests.nodes.map((n) => n.metadata?.name)).toEqual(['n1']);
    expect(manifests.services.map((n) => n.metadata?.name)).toEqual(['web']);
    expect(errors).toHaveLength(3);
    expect(errors.map((e) => e.message)).toEqual(expect.arrayContaining([
      expect.stringMatching(/mixed\/b\.yaml \(document 2\): Service s: spec\.ports\[0\]\.port must be an integer/),
      expect.stringMatching(/mixed\/c\.yaml: not valid YAML or JSON/),
      expect.stringMatching(/nope\.yaml: no such file or directory/),
    ]));
  });
});

describe('checkForwarding', () => {
  const root = join(dir, 'proc-sys');
  const sysctl = (key: string, value: string) => file(join('proc-sys', ...key.split('.')), `${value}\n`);
  it('reports on, off with the fix, and missing', async () => {
    sysctl('net.ipv4.ip_forward', '1');
    sysctl('net.ipv6.conf.all.forwarding', '0');
    expect(await checkForwarding('ipv4', { root })).toEqual({ family: 'ipv4', enabled: true });
    const off = await checkForwarding('ipv6', { root });
    expect(off.enabled).toBe(false);
    expect(off.reason).toContain('net.ipv6.conf.all.forwarding is 0');
    expect(off.reason).toContain('--set-sysctls');
    rmSync(join(root, 'net', 'ipv4', 'ip_forward'));
    expect((await checkForwarding('ipv4', { root })).reason).toContain('does not exist');
  });
  it('sets the switch only when asked', async () => {
    sysctl('net.ipv6.conf.all.forwarding', '0');
    expect((await checkForwarding('ipv6', { root, set: true })).enabled).toBe(true);
    expect((await checkForwarding('ipv6', { root })).enabled).toBe(true);
  });
});
