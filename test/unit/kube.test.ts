import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { apiServerUrl } from '../../lib/command.ts';
import { chooseApiServer, KubeConfigError, loadKubeConfig } from '../../lib/kube.ts';

const dir = mkdtempSync(join(tmpdir(), 'pier-kube-test-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function kubeconfig(file: string, cluster: string, server: string, context = cluster): string {
  const path = join(dir, file);
  writeFileSync(
    path,
    [
      'apiVersion: v1',
      'kind: Config',
      `current-context: ${context}`,
      'clusters:',
      `- name: ${cluster}`,
      '  cluster:',
      `    server: ${server}`,
      'users:',
      `- name: ${cluster}-user`,
      '  user:',
      '    token: abc',
      'contexts:',
      `- name: ${cluster}`,
      '  context:',
      `    cluster: ${cluster}`,
      `    user: ${cluster}-user`,
      '',
    ].join('\n'),
  );
  return path;
}

const nowhere = { env: {}, home: join(dir, 'no-home'), inClusterTokenPath: join(dir, 'no-token') };

describe('loadKubeConfig', () => {
  it('prefers --kubeconfig over KUBECONFIG', () => {
    const a = kubeconfig('a.yaml', 'a', 'https://192.0.2.1:6443');
    const b = kubeconfig('b.yaml', 'b', 'https://192.0.2.2:6443');
    const { kc, source } = loadKubeConfig({ ...nowhere, kubeconfig: a, env: { KUBECONFIG: b } });
    expect(kc.getCurrentCluster()?.server).toBe('https://192.0.2.1:6443');
    expect(source).toContain(a);
  });

  it('merges a KUBECONFIG list with the first file winning', () => {
    const a = kubeconfig('m1.yaml', 'same', 'https://192.0.2.1:6443');
    const b = kubeconfig('m2.yaml', 'same', 'https://192.0.2.2:6443');
    const { kc } = loadKubeConfig({ ...nowhere, env: { KUBECONFIG: `${a}:${b}` } });
    expect(kc.getCurrentCluster()?.server).toBe('https://192.0.2.1:6443');
  });

  it('falls back to ~/.kube/config', () => {
    const home = join(dir, 'home');
    mkdirSync(join(home, '.kube'), { recursive: true });
    copyFileSync(kubeconfig('home.yaml', 'home', 'https://192.0.2.3:6443'), join(home, '.kube', 'config'));
    const { kc } = loadKubeConfig({ ...nowhere, home });
    expect(kc.getCurrentCluster()?.server).toBe('https://192.0.2.3:6443');
  });

  it('explains everything it tried when nothing works', () => {
    expect(() => loadKubeConfig(nowhere)).toThrow(KubeConfigError);
    expect(() => loadKubeConfig(nowhere)).toThrow(/--kubeconfig: not given; KUBECONFIG: not set; in-cluster: KUBERNETES_SERVICE_HOST not set; .*: not found/);
  });

  it('names the file that cannot be read or parsed', () => {
    expect(() => loadKubeConfig({ ...nowhere, kubeconfig: join(dir, 'missing.yaml') })).toThrow(/--kubeconfig: cannot read .*missing\.yaml/);
    const bad = join(dir, 'bad.yaml');
    writeFileSync(bad, 'clusters: [');
    expect(() => loadKubeConfig({ ...nowhere, kubeconfig: bad })).toThrow(/bad\.yaml is not a valid kubeconfig/);
  });

  it('rejects a kubeconfig whose context names no cluster', () => {
    const p = kubeconfig('dangling.yaml', 'x', 'https://192.0.2.1:6443', 'elsewhere');
    expect(() => loadKubeConfig({ ...nowhere, kubeconfig: p })).toThrow(/no current-context|names no known cluster/);
  });

  it('says when in-cluster credentials are half there', () => {
    expect(() => loadKubeConfig({ ...nowhere, env: { KUBERNETES_SERVICE_HOST: '198.18.0.1' } })).toThrow(
      /KUBERNETES_SERVICE_HOST is set \(198\.18\.0\.1\) but the ServiceAccount token .* is missing/,
    );
  });
});

describe('--api-server', () => {
  it('reads host:port, [v6]:port and https URLs, and refuses the rest', () => {
    expect(apiServerUrl('127.0.0.1:6444')).toBe('https://127.0.0.1:6444');
    expect(apiServerUrl('[2001:db8::1]:6443')).toBe('https://[2001:db8::1]:6443');
    expect(apiServerUrl('https://kind-control-plane:6443')).toBe('https://kind-control-plane:6443');
    expect(apiServerUrl('https://api.example:443')).toBe('https://api.example');
    for (const bad of ['http://127.0.0.1:6443', 'https://a:6443/path', '127.0.0.1:99999', ':6443', 'https://u@a:1']) expect(apiServerUrl(bad), bad).toBeUndefined();
  });

  it('points the credentials at the first address that accepts a connection, and keeps their own when none does', async () => {
    const listening = createServer((s) => s.destroy());
    await new Promise<void>((resolve) => listening.listen(0, '127.0.0.1', resolve));
    const open = (listening.address() as AddressInfo).port;
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const refused = (closed.address() as AddressInfo).port;
    await new Promise<void>((resolve) => closed.close(() => resolve()));
    try {
      const { kc } = loadKubeConfig({ kubeconfig: kubeconfig('api.yaml', 'c', 'https://198.18.0.1:443') });
      const choice = await chooseApiServer(kc, [`https://127.0.0.1:${refused}`, `https://127.0.0.1:${open}`]);
      expect(choice).toMatchObject({ chosen: true, server: `https://127.0.0.1:${open}` });
      expect(choice.passed).toEqual([expect.stringMatching(new RegExp(`^https://127.0.0.1:${refused}: .*ECONNREFUSED`))]);
      expect(kc.getCurrentCluster()?.server).toBe(`https://127.0.0.1:${open}`);

      const { kc: other } = loadKubeConfig({ kubeconfig: kubeconfig('api2.yaml', 'd', 'https://198.18.0.1:443') });
      const none = await chooseApiServer(other, [`https://127.0.0.1:${refused}`]);
      expect(none).toMatchObject({ chosen: false, server: 'https://198.18.0.1:443' });
      expect(other.getCurrentCluster()?.server).toBe('https://198.18.0.1:443');
    } finally {
      listening.close();
    }
  });
});
