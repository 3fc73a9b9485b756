import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { KubeConfigError, loadKubeConfig } from '../../lib/kube.ts';

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
