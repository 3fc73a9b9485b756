// deploy/ as a cluster sees it: rendered by kubectl's built-in kustomize,
// applied with server-side apply, and the environment the manifests give the
// controller and the agent, so tests run both programs the way the cluster
// would start them.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { KubernetesObject, V1ConfigMap, V1Container, V1DaemonSet, V1Deployment } from '@kubernetes/client-node';
import { execa } from 'execa';
import { parseAllDocuments } from 'yaml';
import { kubectlPath } from '../cluster/controlplane.ts';

export const DEPLOY_DIR = fileURLToPath(new URL('../../deploy/', import.meta.url));
/** The installs; `cleanup` is the uninstall's node sweep. */
export const KUSTOMIZATIONS = ['base', 'overlays/k3s', 'overlays/kind'] as const;

/**
 * deploy/overlays/kind adapted as the README tells a user to: a kustomization
 * of it in `dir` that gives the agents the API server's own address
 * (PIER_API_SERVER; the test cluster's is no `kind-control-plane`) and merges
 * `config` into pier-config. Returns `dir`, for `kubectl apply -k`.
 */
export function kindOverlay(dir: string, opts: { apiServer: string; config?: Record<string, string> }): string {
  mkdirSync(dir, { recursive: true });
  const literals = Object.entries(opts.config ?? {}).map(([k, v]) => `${k}=${v}`);
  writeFileSync(
    join(dir, 'kustomization.yaml'),
    [
      'apiVersion: kustomize.config.k8s.io/v1beta1',
      'kind: Kustomization',
      // kustomize takes no absolute path here.
      `resources: [${JSON.stringify(relative(dir, join(DEPLOY_DIR, 'overlays', 'kind')))}]`,
      ...(literals.length > 0 ? ['configMapGenerator:', '  - name: pier-config', '    behavior: merge', `    literals: ${JSON.stringify(literals)}`] : []),
      'patches:',
      '  - path: agent-api-server.yaml',
      '',
    ].join('\n'),
  );
  writeFileSync(
    join(dir, 'agent-api-server.yaml'),
    JSON.stringify({
      apiVersion: 'apps/v1',
      kind: 'DaemonSet',
      metadata: { name: 'pier-agent', namespace: 'pier-system' },
      spec: { template: { spec: { containers: [{ name: 'agent', env: [{ name: 'PIER_API_SERVER', value: opts.apiServer }] }] } } },
    }),
  );
  return dir;
}

export interface Rendered {
  yaml: string;
  objects: KubernetesObject[];
}

export async function render(kustomization: (typeof KUSTOMIZATIONS)[number] | 'cleanup'): Promise<Rendered> {
  const { stdout } = await execa(await kubectlPath(), ['kustomize', join(DEPLOY_DIR, kustomization)]);
  const objects = parseAllDocuments(stdout).map((d) => d.toJSON() as KubernetesObject).filter(Boolean);
  return { yaml: stdout, objects };
}

/**
 * `kubectl apply --server-side` of `yaml`; with `dryRun`, the server validates
 * and admits but stores nothing. `forceConflicts` takes over fields another
 * manager owns: after the README's client-side `kubectl apply -k`, its manager
 * (kubectl-client-side-apply) owns the workloads' env fieldRefs, which the
 * server completes (apiVersion: v1), so even deploy/base's own rendering
 * conflicts there, and an overlay also on envFrom (its pier-config-<hash>).
 */
export async function apply(kubeconfig: string, yaml: string, opts: { dryRun?: boolean; forceConflicts?: boolean } = {}): Promise<string> {
  const args = ['--kubeconfig', kubeconfig, 'apply', '--server-side', '--field-manager=pier-tests', '-f', '-'];
  if (opts.dryRun) args.push('--dry-run=server');
  if (opts.forceConflicts) args.push('--force-conflicts');
  const { stdout } = await execa(await kubectlPath(), args, { input: yaml });
  return stdout;
}

export function find<T extends KubernetesObject>(objects: KubernetesObject[], kind: string, name?: string): T {
  const found = objects.find((o) => o.kind === kind && (name === undefined || o.metadata?.name === name));
  if (!found) throw new Error(`no ${kind}${name ? ` ${name}` : ''} in the rendered manifests`);
  return found as T;
}

export function containerOf(objects: KubernetesObject[], kind: 'Deployment' | 'DaemonSet', name: string): V1Container {
  const workload = find<V1Deployment | V1DaemonSet>(objects, kind, name);
  const container = workload.spec?.template.spec?.containers[0];
  if (!container) throw new Error(`${kind} ${name} has no container`);
  return container;
}

/**
 * The environment a container of `kind/name` starts with: its ConfigMap
 * envFrom, then its env (literal values and the downward-API fields pier
 * uses, resolved from `pod`). Anything else fails loudly, so a manifest
 * change the tests cannot reproduce does not pass unnoticed.
 */
export function containerEnv(
  objects: KubernetesObject[],
  kind: 'Deployment' | 'DaemonSet',
  name: string,
  pod: { name: string; namespace: string; nodeName?: string },
): Record<string, string> {
  const container = containerOf(objects, kind, name);
  const env: Record<string, string> = {};
  for (const from of container.envFrom ?? []) {
    const ref = from.configMapRef?.name;
    if (!ref || from.prefix || from.secretRef) throw new Error(`${kind} ${name}: unsupported envFrom ${JSON.stringify(from)}`);
    Object.assign(env, find<V1ConfigMap>(objects, 'ConfigMap', ref).data);
  }
  const fields: Record<string, string | undefined> = {
    'metadata.name': pod.name,
    'metadata.namespace': pod.namespace,
    'spec.nodeName': pod.nodeName,
  };
  for (const e of container.env ?? []) {
    if (e.value !== undefined) env[e.name] = e.value;
    else if (e.valueFrom?.fieldRef && fields[e.valueFrom.fieldRef.fieldPath] !== undefined) env[e.name] = fields[e.valueFrom.fieldRef.fieldPath]!;
    else throw new Error(`${kind} ${name}: cannot resolve env ${e.name} (${JSON.stringify(e.valueFrom)})`);
  }
  return env;
}
