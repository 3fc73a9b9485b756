// `helm template` against `kubectl kustomize`, object by object. The chart
// renders what deploy/ renders but for the differences below, each named
// with why it is right; the tests apply them, check that each one was seen
// (a difference that no longer happens must leave the list), and then want
// the two sets of objects equal.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { kubectlPath } from '../cluster/controlplane.ts';
import { parseYaml, type Obj } from './tools.ts';

const DEPLOY_DIR = fileURLToPath(new URL('../../deploy/', import.meta.url));

export interface Difference {
  name: string;
  why: string;
  /** Rewrites the objects of each side so that the difference goes; returns how many objects it changed. */
  apply(sides: { helm: Obj[]; kustomize: Obj[] }, ctx: { version: string; owner: string }): number;
}

const HELM_LABELS = ['app.kubernetes.io/managed-by', 'app.kubernetes.io/instance', 'app.kubernetes.io/version', 'helm.sh/chart'];
const workloads = (objs: Obj[]) => objs.filter((o) => o.kind === 'Deployment' || o.kind === 'DaemonSet');

export const DIFFERENCES: Difference[] = [
  {
    name: 'the Namespace pier-system: kustomize renders it (with its Pod Security label), the chart does not',
    why:
      'Helm records the release in its namespace before it creates anything, so the namespace must exist first; a chart that ' +
      'also rendered it would clash with `helm install --create-namespace`. deploy/helm/README.md has users create it with the same label.',
    apply({ kustomize }) {
      const i = kustomize.findIndex((o) => o.kind === 'Namespace' && o.metadata?.name === 'pier-system');
      if (i < 0) return 0;
      if (kustomize[i]!.metadata!.labels?.['pod-security.kubernetes.io/enforce'] !== 'privileged') throw new Error('the Namespace lost its Pod Security label');
      kustomize.splice(i, 1);
      return 1;
    },
  },
  {
    name: 'the ValidatingAdmissionPolicies and their Bindings: kustomize gives them metadata.namespace pier-system, the chart none',
    why:
      "They are cluster-scoped; kustomize's namespace transformer does not know these kinds and sets the namespace anyway. The " +
      'API server drops a namespace on a cluster-scoped object, so both install the same; Helm renders them as they are.',
    apply({ kustomize }) {
      let n = 0;
      for (const o of kustomize) {
        if (o.kind === 'ValidatingAdmissionPolicy' || o.kind === 'ValidatingAdmissionPolicyBinding') {
          if (o.metadata?.namespace !== 'pier-system') continue;
          delete o.metadata.namespace;
          n++;
        }
      }
      return n;
    },
  },
  {
    name: "a blank line in the admission policies' folded CEL expressions: kustomize's parser adds one where a more-indented line follows",
    why:
      'deploy/base/admission-policies.yaml writes long CEL expressions as folded scalars (>-) with more-indented continuation lines. ' +
      "By the YAML spec, and as Helm's parser and the API server read them, one line break precedes such a line; kustomize's parser " +
      '(go-yaml v3) makes it two. CEL ignores whitespace: the policies are the same.',
    apply({ kustomize }) {
      let n = 0;
      const fold = (v: unknown): unknown => {
        if (typeof v === 'string' && v.includes('\n\n')) {
          n++;
          return v.replace(/\n\n/g, '\n');
        }
        if (Array.isArray(v)) return v.map(fold);
        if (v !== null && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, fold(x)]));
        return v;
      };
      for (const o of kustomize) if (o.kind === 'ValidatingAdmissionPolicy') o.spec = fold(o.spec);
      return n;
    },
  },
  {
    name: "Helm's labels on every object: app.kubernetes.io/managed-by, instance, version and helm.sh/chart",
    why:
      'The standard labels of a Helm release, saying which release and chart made an object. Only on metadata: selectors and pod ' +
      'templates stay as in deploy/, so both install the same pods and a selector never changes with the chart version.',
    apply({ helm }, { version }) {
      let n = 0;
      for (const o of helm) {
        const labels = o.metadata?.labels ?? {};
        const want = { 'app.kubernetes.io/managed-by': 'Helm', 'app.kubernetes.io/instance': 'pier', 'app.kubernetes.io/version': version, 'helm.sh/chart': `pier-${version}` };
        for (const [k, v] of Object.entries(want)) if (labels[k] !== v) throw new Error(`${o.kind} ${o.metadata?.name}: label ${k}=${labels[k]}, expected ${v}`);
        for (const k of HELM_LABELS) delete labels[k];
        n++;
      }
      return n;
    },
  },
  {
    name: 'the ConfigMap: kustomize names it pier-config-<hash of its content>, the chart pier-config with its checksum on the pods',
    why:
      'Both make a settings change roll the controller and the agents: kustomize by a new name the pods must refer to, Helm (which ' +
      'updates objects in place) by the annotation checksum/config on the pod templates. Helm names objects the same across upgrades.',
    apply({ helm, kustomize }) {
      let n = 0;
      for (const o of kustomize) {
        if (o.kind === 'ConfigMap' && /^pier-config-[a-z0-9]{10}$/.test(o.metadata!.name!)) {
          o.metadata!.name = 'pier-config';
          n++;
        }
        for (const w of workloads([o])) {
          for (const c of w.spec.template.spec.containers) for (const f of c.envFrom ?? []) if (f.configMapRef?.name?.startsWith('pier-config-')) f.configMapRef.name = 'pier-config';
        }
      }
      for (const w of workloads(helm)) {
        const annotations = w.spec.template.metadata.annotations ?? {};
        if (!/^[0-9a-f]{64}$/.test(annotations['checksum/config'] ?? '')) throw new Error(`${w.kind} ${w.metadata?.name}: no checksum/config`);
        delete annotations['checksum/config'];
        if (Object.keys(annotations).length === 0) delete w.spec.template.metadata.annotations;
        n++;
      }
      return n;
    },
  },
  {
    name: 'the images: pier/controller:<version> and pier/agent:<version> in deploy/, ghcr.io/<owner>/pier-controller:<version> and ghcr.io/<owner>/pier-agent:<version> in the chart',
    why:
      "deploy/ names the images as the README builds and loads them without a registry (kind load, ctr images import); the chart's " +
      'defaults are the images the release workflow publishes. The version is the same.',
    apply({ helm, kustomize }, { version, owner }) {
      let n = 0;
      for (const [side, want] of [
        [kustomize, (w: string) => `pier/${w}:${version}`],
        [helm, (w: string) => `ghcr.io/${owner}/pier-${w}:${version}`],
      ] as const) {
        for (const o of workloads(side)) {
          const workload = o.metadata!.name!.replace(/^pier-/, '');
          const c = o.spec.template.spec.containers[0];
          if (c.image !== want(workload)) throw new Error(`${o.kind} ${o.metadata?.name}: image ${c.image}, expected ${want(workload)}`);
          c.image = `pier-${workload}`;
          n++;
        }
      }
      return n;
    },
  },
];

const id = (o: Obj) => `${o.kind} ${o.metadata?.namespace ? `${o.metadata.namespace}/` : ''}${o.metadata?.name}`;

export interface Comparison {
  /** Objects only one side has, after the differences. */
  onlyHelm: string[];
  onlyKustomize: string[];
  /** Objects both have whose content differs: id → [helm, kustomize]. */
  differing: Map<string, [Obj, Obj]>;
  /** How many objects each difference changed. */
  applied: Map<string, number>;
}

export function compare(helmObjects: readonly Obj[], kustomizeObjects: readonly Obj[], ctx: { version: string; owner: string }): Comparison {
  const helm = structuredClone([...helmObjects]);
  const kustomize = structuredClone([...kustomizeObjects]);
  const applied = new Map<string, number>();
  for (const d of DIFFERENCES) applied.set(d.name, d.apply({ helm, kustomize }, ctx));
  const byId = (objs: Obj[]) => new Map(objs.map((o) => [id(o), o]));
  const h = byId(helm);
  const k = byId(kustomize);
  if (h.size !== helm.length || k.size !== kustomize.length) throw new Error('two objects of one kind and name on one side');
  const differing = new Map<string, [Obj, Obj]>();
  for (const [key, o] of h) {
    const other = k.get(key);
    if (other && JSON.stringify(sorted(o)) !== JSON.stringify(sorted(other))) differing.set(key, [o, other]);
  }
  return {
    onlyHelm: [...h.keys()].filter((x) => !k.has(x)).sort(),
    onlyKustomize: [...k.keys()].filter((x) => !h.has(x)).sort(),
    differing,
    applied,
  };
}

/** A value with its object keys sorted, to compare as text. */
export function sorted(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sorted);
  if (v !== null && typeof v === 'object') return Object.fromEntries(Object.keys(v).sort().map((k) => [k, sorted((v as Record<string, unknown>)[k])]));
  return v;
}

/**
 * `kubectl kustomize` of a kustomization in `dir` made of `resource` (a
 * folder of deploy/, e.g. overlays/kind) and `components` (folders of
 * deploy/components), as a user's own overlay would be.
 */
export async function kustomize(dir: string, resource: string, components: string[] = []): Promise<{ yaml: string; objects: Obj[] }> {
  mkdirSync(dir, { recursive: true });
  const rel = (p: string) => JSON.stringify(relative(dir, join(DEPLOY_DIR, p)));
  writeFileSync(
    join(dir, 'kustomization.yaml'),
    [
      'apiVersion: kustomize.config.k8s.io/v1beta1',
      'kind: Kustomization',
      `resources: [${rel(resource)}]`,
      ...(components.length > 0 ? [`components: [${components.map((c) => rel(`components/${c}`)).join(', ')}]`] : []),
      '',
    ].join('\n'),
  );
  const { stdout } = await execa(await kubectlPath(), ['kustomize', dir]);
  return { yaml: stdout, objects: parseYaml(stdout) };
}
