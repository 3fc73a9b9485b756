// The Helm chart's manifests, generated from deploy/ so that the two cannot
// drift: deploy/base and deploy/components are the one source of what pier's
// objects are (RBAC, admission policies, workloads, probes, resources,
// metrics). This reads them with their comments, applies what the
// kustomization does (namespace, the part-of label, the ConfigMap from
// pier.env, the image tags) the way a chart does it, puts Helm expressions
// where a value may change them, and writes:
//
//   deploy/helm/pier/templates/*.yaml   one per source file (and config.yaml from pier.env)
//   deploy/helm/values/{k3s,kind}.yaml  the values that equal deploy/overlays/{k3s,kind}
//
// Hand-written: Chart.yaml, values.yaml (its defaults must equal what deploy/
// says: this fails, naming the value, when they do not), values.schema.json
// (it must describe exactly values.yaml's keys, and refuse unknown keys
// wherever an object's keys are fixed: this fails, naming the key, when it
// does not), _helpers.tpl, NOTES.txt. Anything in deploy/ that this does not know how to carry over (a
// new file, a new pier.env variable, another kind of overlay patch) fails the
// generation rather than being left out.
//
//   node test/helm/generate.ts           writes the files
//   node test/helm/generate.ts --check   writes nothing; exits 1 naming each file that differs
//
// test/unit/helm-chart.test.ts runs the check; test/integration/helm.test.ts
// renders the chart with the real helm and compares it, object by object,
// with `kubectl kustomize`.
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { isMap, isScalar, isSeq, parse, parseAllDocuments, Pair, Scalar, YAMLMap, type Document } from 'yaml';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));
export const CHART_DIR = 'deploy/helm/pier';
export const VALUES_DIR = 'deploy/helm/values';
/** The namespace deploy/base puts everything in; the chart uses the release's. */
const BASE_NAMESPACE = 'pier-system';
/** templates/ files written by hand. */
export const HAND_WRITTEN_TEMPLATES = ['_helpers.tpl', 'NOTES.txt'];

/** What pier.env holds, as chart values: one entry per variable, in the ConfigMap's order. */
interface ConfigValue {
  env: string;
  key: string;
  /** The Helm expression giving the variable's string. */
  expr: string;
  /** The same string from the value, to check the default against pier.env. */
  str: (v: unknown) => string;
}
const CONFIG: ConfigValue[] = [
  { env: 'PIER_DEFAULT_CLASS', key: 'defaultClass', expr: '.Values.defaultClass | toString | quote', str: String },
  { env: 'PIER_DEFAULT_POOL', key: 'defaultPool', expr: '.Values.defaultPool | quote', str: String },
  { env: 'PIER_RESERVED_PORTS', key: 'reservedPorts', expr: 'join "," .Values.reservedPorts | quote', str: (v) => (v as unknown[]).join(',') },
  { env: 'PIER_ALLOCATE_RANGE', key: 'allocateRange', expr: '.Values.allocateRange | quote', str: String },
  // `int`: a number from a values file is a float64 to Helm, which prints 1000000 as 1e+06.
  { env: 'PIER_MAX_PORTS_PER_SERVICE', key: 'maxPortsPerService', expr: '.Values.maxPortsPerService | int | quote', str: String },
  { env: 'PIER_LOG_LEVEL', key: 'logLevel', expr: '.Values.logLevel | quote', str: String },
];
/** Chart values for variables pier.env leaves to the programs' defaults: in the ConfigMap only when set. */
const OPTIONAL_CONFIG = [
  { env: 'PIER_BACKEND', key: 'backend' },
  { env: 'PIER_MAX_ADDRESSES', key: 'maxAddresses' },
];

/** Each file the chart is made of, and when Helm renders it. */
const SOURCES: { from: string; to: string; when?: string }[] = [
  { from: 'deploy/base/controller-rbac.yaml', to: 'controller-rbac.yaml' },
  { from: 'deploy/base/agent-rbac.yaml', to: 'agent-rbac.yaml' },
  { from: 'deploy/base/admission-policies.yaml', to: 'admission-policies.yaml' },
  { from: 'deploy/base/controller.yaml', to: 'controller.yaml' },
  { from: 'deploy/base/agent.yaml', to: 'agent.yaml' },
  { from: 'deploy/components/metrics/services.yaml', to: 'metrics-services.yaml', when: '.Values.metrics.service.enabled' },
  { from: 'deploy/components/service-monitor/service-monitors.yaml', to: 'service-monitors.yaml', when: '.Values.metrics.serviceMonitor.enabled' },
  { from: 'deploy/components/pod-monitor/pod-monitors.yaml', to: 'pod-monitors.yaml', when: '.Values.metrics.podMonitor.enabled' },
];
/** deploy/base resources the chart leaves out, and why (deploy/helm/README.md). */
const LEFT_OUT: Record<string, string> = {
  'namespace.yaml': 'Helm needs the release namespace before it installs anything: `helm install --create-namespace` or `kubectl create namespace`',
};
/** Components and the chart value that renders each. */
const COMPONENTS: Record<string, string> = { metrics: 'metrics.service', 'service-monitor': 'metrics.serviceMonitor', 'pod-monitor': 'metrics.podMonitor' };

/** The tree generate() reads: the repository, or a copy of it in the tests. */
let tree = ROOT;
const read = (file: string) => readFileSync(join(tree, file), 'utf8');
const header = (from: string) =>
  [`# Generated from ${from} by test/helm/generate.ts: edit that file, then run`, '# `node test/helm/generate.ts` (deploy/helm/README.md).'].join('\n');

function fail(message: string): never {
  throw new Error(`test/helm/generate.ts: ${message}`);
}

function valueAt(values: unknown, path: string): unknown {
  let v = values;
  for (const k of path.split('.')) {
    if (v === null || typeof v !== 'object' || !(k in v)) fail(`${CHART_DIR}/values.yaml has no ${path}`);
    v = (v as Record<string, unknown>)[k];
  }
  return v;
}

/** Stable JSON, keys sorted, to compare defaults with what deploy/ says. */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v !== null && typeof v === 'object') {
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical((v as Record<string, unknown>)[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v);
}

/**
 * Markers put into the YAML where Helm template text goes, replaced once the
 * document is written out. Three shapes: `key: MARK` (the value replaced),
 * `MARK: null` (lines added to a map) and `- MARK` (lines added to a list).
 */
class Templater {
  private next = 0;
  private readonly subs = new Map<string, (col: number, key: string | undefined, dash: string) => string[]>();

  private readonly values: unknown;

  constructor(values: unknown) {
    this.values = values;
  }

  private mark(sub: (col: number, key: string | undefined, dash: string) => string[]): string {
    const m = `__PIER_TEMPLATE_${this.next++}__`;
    this.subs.set(m, sub);
    return m;
  }

  /** Checks that the chart's default for `path` is what deploy/ has. */
  expectDefault(path: string, inDeploy: unknown, where: string): void {
    const v = valueAt(this.values, path);
    if (canonical(v) !== canonical(inDeploy)) {
      fail(`${CHART_DIR}/values.yaml: ${path} is ${canonical(v)}, but ${where} says ${canonical(inDeploy)}; make them equal`);
    }
  }

  /** `key: {{ expr }}`. */
  inline(expr: string): string {
    return this.mark((col, key, dash) => [`${' '.repeat(col - dash.length)}${dash}${key}: {{ ${expr} }}`]);
  }

  /** `key:` and the YAML of a value, indented under it. */
  toYaml(path: string): string {
    return this.mark((col, key, dash) => [`${' '.repeat(col - dash.length)}${dash}${key}:`, `${' '.repeat(col + 2)}{{- toYaml .Values.${path} | nindent ${col + 2} }}`]);
  }

  /** Template lines added where the marker stands, each indented to its column. */
  lines(make: (col: number) => string[]): string {
    return this.mark((col, key, dash) => {
      // `- MARK` stands for items of a list: they start where its dash does.
      const at = key === undefined ? col - dash.length : col;
      return make(at).map((l) => ' '.repeat(at) + l);
    });
  }

  render(text: string): string {
    const out = text.split('\n').flatMap((line) => {
      const m = /^( *)(- )?(?:([^\s:][^:]*): )?(__PIER_TEMPLATE_\d+__)(?:: null)?$/.exec(line);
      if (!m) {
        if (line.includes('__PIER_TEMPLATE_')) fail(`a marker in an unexpected place: ${line}`);
        return [line];
      }
      const [, indent, dash = '', key, marker] = m;
      const sub = this.subs.get(marker!)!;
      return sub(indent!.length + dash.length, key, dash);
    });
    return out.join('\n');
  }
}

/** A map's pair for `key`, created (after `after`, when given) if missing. */
function pairOf(map: YAMLMap, key: string, after?: string): Pair {
  const found = map.items.find((p) => isScalar(p.key) && p.key.value === key);
  if (found) return found as Pair;
  const pair = new Pair(new Scalar(key), null);
  const i = after === undefined ? -1 : map.items.findIndex((p) => isScalar(p.key) && p.key.value === after);
  if (i >= 0) map.items.splice(i + 1, 0, pair);
  else map.items.push(pair);
  return pair;
}

function mapAt(doc: Document, path: (string | number)[]): YAMLMap {
  const node = doc.getIn(path, true);
  if (!isMap(node)) fail(`${doc.get('kind')} ${String(doc.getIn(['metadata', 'name']))}: no map at ${path.join('.')}`);
  return node;
}

/** Sets the value at `path` to a marker, after checking what is there (`expect`, when given). */
function replace(doc: Document, path: (string | number)[], marker: string, expect?: (v: unknown) => void): void {
  const parent = mapAt(doc, path.slice(0, -1));
  const key = path.at(-1) as string;
  if (expect) expect(parent.toJSON()[key]);
  pairOf(parent, key).value = new Scalar(marker);
}

function namespaced(kind: string): boolean {
  return !['Namespace', 'ClusterRole', 'ClusterRoleBinding', 'ValidatingAdmissionPolicy', 'ValidatingAdmissionPolicyBinding'].includes(kind);
}

/** The chart's version of one object of deploy/. */
function templateObject(doc: Document, t: Templater, from: string, images: Record<string, string>): void {
  const kind = String(doc.get('kind'));
  const name = String(doc.getIn(['metadata', 'name']));
  const what = `${from}: ${kind} ${name}`;
  const metadata = mapAt(doc, ['metadata']);
  if (namespaced(kind)) {
    const ns = metadata.get('namespace');
    if (ns !== undefined && ns !== BASE_NAMESPACE) fail(`${what} is in namespace ${String(ns)}, not ${BASE_NAMESPACE}`);
    pairOf(metadata, 'namespace', 'name').value = new Scalar(t.inline('.Release.Namespace'));
  }
  // The kustomization's part-of label is in pier.labels, with Helm's own.
  const labels = pairOf(metadata, 'labels');
  if (!isMap(labels.value)) labels.value = new YAMLMap();
  const labelMap = labels.value as YAMLMap;
  labelMap.delete('app.kubernetes.io/part-of');
  labelMap.items.push(new Pair(new Scalar(t.lines((col) => [`{{- include "pier.labels" . | nindent ${col} }}`])), new Scalar(null)));

  if (kind === 'RoleBinding' || kind === 'ClusterRoleBinding') {
    const subjects = doc.get('subjects', true);
    if (!isSeq(subjects)) fail(`${what}: no subjects`);
    for (const s of subjects.items) {
      if (!isMap(s)) continue;
      if (s.get('namespace') !== BASE_NAMESPACE) fail(`${what}: a subject outside ${BASE_NAMESPACE}`);
      s.set('namespace', new Scalar(t.inline('.Release.Namespace')));
    }
  }

  const workload = ({ Deployment: 'controller', DaemonSet: 'agent' } as const)[kind as 'Deployment' | 'DaemonSet'];
  if (workload) {
    const expected = `pier-${workload}`;
    if (name !== expected) fail(`${what}: the chart knows the workloads pier-controller and pier-agent only`);
    const pod = ['spec', 'template', 'spec'];
    // pier-config changes in place under Helm (kustomize renames it, with a
    // hash): its checksum on the pods rolls them when it changes.
    const templateMeta = mapAt(doc, ['spec', 'template', 'metadata']);
    const annotations = pairOf(templateMeta, 'annotations', 'labels');
    if (!isMap(annotations.value)) annotations.value = new YAMLMap();
    (annotations.value as YAMLMap).items.push(
      new Pair(new Scalar('checksum/config'), new Scalar(t.inline('include (print $.Template.BasePath "/config.yaml") . | sha256sum'))),
    );
    if (workload === 'controller') {
      replace(doc, ['spec', 'replicas'], t.inline(`.Values.controller.replicas`), (v) => t.expectDefault('controller.replicas', v, what));
      replace(doc, [...pod, 'affinity'], t.toYaml('controller.affinity'), (v) => t.expectDefault('controller.affinity', v, what));
    }
    replace(doc, [...pod, 'tolerations'], t.toYaml(`${workload}.tolerations`), (v) => t.expectDefault(`${workload}.tolerations`, v, what));
    const podSpec = mapAt(doc, pod);
    if (podSpec.has('nodeSelector')) fail(`${what}: a nodeSelector in deploy/ (the chart's ${workload}.nodeSelector is empty by default)`);
    t.expectDefault(`${workload}.nodeSelector`, {}, `${what} (no nodeSelector)`);
    podSpec.items.splice(
      podSpec.items.findIndex((p) => isScalar(p.key) && p.key.value === 'tolerations') + 1,
      0,
      new Pair(new Scalar(t.lines((col) => [`{{- with .Values.${workload}.nodeSelector }}`, 'nodeSelector:', `  {{- toYaml . | nindent ${col + 2} }}`, '{{- end }}'])), new Scalar(null)),
    );
    const containers = doc.getIn([...pod, 'containers'], true);
    if (!isSeq(containers) || containers.items.length !== 1) fail(`${what}: expected one container`);
    const c = ['spec', 'template', 'spec', 'containers', 0];
    replace(doc, [...c, 'image'], t.inline(`include "pier.image" (list $ .Values.${workload}.image)`), (v) => {
      if (v !== images[workload]) fail(`${what}: image ${String(v)}, expected ${images[workload]} (the kustomization's images)`);
    });
    replace(doc, [...c, 'imagePullPolicy'], t.inline(`.Values.${workload}.image.pullPolicy`), (v) => t.expectDefault(`${workload}.image.pullPolicy`, v, what));
    replace(doc, [...c, 'resources'], t.toYaml(`${workload}.resources`), (v) => t.expectDefault(`${workload}.resources`, v, what));
    if (workload === 'agent') {
      // deploy/overlays/*/agent-api-server.yaml, as a value.
      const env = doc.getIn([...c, 'env'], true);
      if (!isSeq(env)) fail(`${what}: no env`);
      if ((env.toJSON() as { name: string }[]).some((e) => e.name === 'PIER_API_SERVER')) fail(`${what}: PIER_API_SERVER is set in deploy/base (the chart's agent.apiServer)`);
      t.expectDefault('agent.apiServer', '', `${what} (no PIER_API_SERVER)`);
      // First, where the overlays' strategic-merge patch puts it.
      env.items.unshift(new Scalar(t.lines(() => ['{{- with .Values.agent.apiServer }}', '- name: PIER_API_SERVER', '  value: {{ . | quote }}', '{{- end }}'])));
    }
  }

  const monitor = ({ ServiceMonitor: ['serviceMonitor', 'endpoints'], PodMonitor: ['podMonitor', 'podMetricsEndpoints'] } as const)[kind as 'ServiceMonitor' | 'PodMonitor'];
  if (monitor) {
    const [value, endpointsKey] = monitor;
    labelMap.items.push(
      new Pair(new Scalar(t.lines((col) => [`{{- with .Values.metrics.${value}.labels }}`, `{{- toYaml . | nindent ${col} }}`, '{{- end }}'])), new Scalar(null)),
    );
    const endpoints = doc.getIn(['spec', endpointsKey], true);
    if (!isSeq(endpoints)) fail(`${what}: no spec.${endpointsKey}`);
    endpoints.items.forEach((_, i) => {
      replace(doc, ['spec', endpointsKey, i, 'interval'], t.inline(`.Values.metrics.${value}.interval | quote`), (v) => t.expectDefault(`metrics.${value}.interval`, v, what));
    });
  }
}

/** The chart's template for one source file. */
function templateFile(source: (typeof SOURCES)[number], values: unknown, images: Record<string, string>): string {
  const text = read(source.from);
  if (text.includes('{{') || text.includes('}}')) fail(`${source.from} contains {{ or }}, which Helm would read as template text`);
  const t = new Templater(values);
  const docs = parseAllDocuments(text);
  const parts: string[] = [];
  for (const doc of docs) {
    if (doc.errors.length > 0) fail(`${source.from}: ${doc.errors[0]!.message}`);
    templateObject(doc as Document, t, source.from, images);
    parts.push(doc.toString({ lineWidth: 0, flowCollectionPadding: false, directives: false }));
  }
  let body = t.render(parts.join('---\n')).replace(/\n+$/, '\n');
  if (source.when) {
    body = `{{- if ${source.when} }}\n${body}{{- end }}\n`;
  }
  return `${header(source.from)}\n${body}`;
}

/** pier.env as variable → value. */
function readEnv(file: string): [string, string][] {
  return read(file)
    .split('\n')
    .filter((l) => l.trim() !== '' && !l.startsWith('#'))
    .map((l) => {
      const i = l.indexOf('=');
      if (i < 0) fail(`${file}: not NAME=value: ${l}`);
      return [l.slice(0, i), l.slice(i + 1)];
    });
}

/** templates/config.yaml: the ConfigMap pier-config, from pier.env's variables. */
function configTemplate(values: unknown, kustomization: Kustomization): string {
  const generators = kustomization.configMapGenerator ?? [];
  if (generators.length !== 1 || generators[0]!.name !== 'pier-config' || canonical(generators[0]!.envs) !== canonical(['pier.env'])) {
    fail('deploy/base/kustomization.yaml: expected one configMapGenerator, pier-config from pier.env');
  }
  const env = readEnv('deploy/base/pier.env');
  const names = env.map(([k]) => k);
  for (const name of names) if (!CONFIG.some((c) => c.env === name)) fail(`deploy/base/pier.env sets ${name}, which the chart has no value for: add it to CONFIG`);
  if (canonical(names) !== canonical(CONFIG.map((c) => c.env))) fail(`deploy/base/pier.env lists ${names.join(', ')}; CONFIG lists ${CONFIG.map((c) => c.env).join(', ')}: make them the same, in the same order`);
  for (const [name, value] of env) {
    const c = CONFIG.find((x) => x.env === name)!;
    const got = c.str(valueAt(values, c.key));
    if (got !== value) fail(`${CHART_DIR}/values.yaml: ${c.key} gives ${name}=${got}, but deploy/base/pier.env says ${value}`);
  }
  for (const o of OPTIONAL_CONFIG) if (valueAt(values, o.key) !== '') fail(`${CHART_DIR}/values.yaml: ${o.key} must default to "" (pier.env does not set ${o.env})`);
  const all = [...CONFIG.map((c) => c.env), ...OPTIONAL_CONFIG.map((o) => o.env)];
  return [
    header('deploy/base/pier.env'),
    '# Every setting of both programs in one place, read by the controller and the',
    '# agents through envFrom. Its checksum is on their pods, so a change rolls them.',
    'apiVersion: v1',
    'kind: ConfigMap',
    'metadata:',
    '  name: pier-config',
    '  namespace: {{ .Release.Namespace }}',
    '  labels:',
    '    {{- include "pier.labels" . | nindent 4 }}',
    'data:',
    ...CONFIG.map((c) => `  ${c.env}: {{ ${c.expr} }}`),
    ...OPTIONAL_CONFIG.flatMap((o) => [`  {{- with .Values.${o.key} }}`, `  ${o.env}: {{ . | quote }}`, '  {{- end }}']),
    '  {{- range $name, $value := .Values.extraConfig }}',
    `  {{- if has $name (list ${all.map((e) => JSON.stringify(e)).join(' ')}) }}`,
    '  {{- fail (printf "extraConfig.%s: set it with its own value (values.yaml)" $name) }}',
    '  {{- end }}',
    '  {{ $name }}: {{ $value | toString | quote }}',
    '  {{- end }}',
    '',
  ].join('\n');
}

interface Kustomization {
  namespace?: string;
  resources?: string[];
  components?: string[];
  labels?: { pairs: Record<string, string>; includeSelectors?: boolean; includeTemplates?: boolean }[];
  configMapGenerator?: { name: string; behavior?: string; envs?: string[]; literals?: string[] }[];
  images?: { name: string; newTag?: string; newName?: string; digest?: string }[];
  patches?: { path?: string; patch?: string; target?: unknown }[];
}

/** Checks deploy/base/kustomization.yaml against what the generation assumes; returns the images it names. */
function checkBase(values: unknown): { kustomization: Kustomization; images: Record<string, string> } {
  const k = parse(read('deploy/base/kustomization.yaml')) as Kustomization;
  if (k.namespace !== BASE_NAMESPACE) fail(`deploy/base/kustomization.yaml: namespace ${k.namespace}, expected ${BASE_NAMESPACE}`);
  if (canonical(k.labels) !== canonical([{ pairs: { 'app.kubernetes.io/part-of': 'pier' }, includeSelectors: false }])) {
    fail('deploy/base/kustomization.yaml: its labels changed; carry them into pier.labels (templates/_helpers.tpl) and here');
  }
  const resources = k.resources ?? [];
  const known = [...SOURCES.filter((s) => s.from.startsWith('deploy/base/')).map((s) => s.from.slice('deploy/base/'.length)), ...Object.keys(LEFT_OUT)];
  for (const r of resources) if (!known.includes(r)) fail(`deploy/base/kustomization.yaml lists ${r}, which the chart does not carry: add it to SOURCES`);
  for (const r of known) if (!resources.includes(r)) fail(`SOURCES names deploy/base/${r}, which deploy/base/kustomization.yaml does not list`);
  const chart = parse(read(`${CHART_DIR}/Chart.yaml`)) as { version: string; appVersion: string };
  const pkg = JSON.parse(read('package.json')) as { version: string };
  if (chart.appVersion !== pkg.version || chart.version !== pkg.version) fail(`${CHART_DIR}/Chart.yaml: version ${chart.version}, appVersion ${chart.appVersion}; package.json says ${pkg.version}`);
  const images: Record<string, string> = {};
  for (const workload of ['controller', 'agent']) {
    const image = (k.images ?? []).find((i) => i.name === `pier/${workload}`);
    if (!image || image.newName || image.digest || image.newTag !== pkg.version) fail(`deploy/base/kustomization.yaml: expected pier/${workload} with newTag ${pkg.version} only`);
    images[workload] = `pier/${workload}`;
    expectValue(values, `${workload}.image.tag`, '');
  }
  return { kustomization: k, images };
}

function expectValue(values: unknown, path: string, want: unknown): void {
  if (canonical(valueAt(values, path)) !== canonical(want)) fail(`${CHART_DIR}/values.yaml: ${path} must default to ${canonical(want)}`);
}

/** The values that make the chart what an overlay makes deploy/base: its pier-config literals and its agent-api-server patch. */
function overlayValues(overlay: string, values: unknown): string {
  const dir = `deploy/overlays/${overlay}`;
  const k = parse(read(`${dir}/kustomization.yaml`)) as Kustomization;
  const out: Record<string, unknown> = {};
  if (canonical(k.resources) !== canonical(['../../base'])) fail(`${dir}: expected resources [../../base]`);
  if (k.components?.length) fail(`${dir}: components are not carried into values yet`);
  for (const g of k.configMapGenerator ?? []) {
    if (g.name !== 'pier-config' || g.behavior !== 'merge' || g.envs) fail(`${dir}: only literals merged into pier-config are carried into values`);
    for (const literal of g.literals ?? []) {
      const i = literal.indexOf('=');
      const [name, value] = [literal.slice(0, i), literal.slice(i + 1)];
      const c = CONFIG.find((x) => x.env === name) ?? OPTIONAL_CONFIG.find((x) => x.env === name);
      if (!c) {
        ((out['extraConfig'] ??= {}) as Record<string, string>)[name] = value;
        continue;
      }
      const def = valueAt(values, c.key);
      out[c.key] = typeof def === 'boolean' ? value === 'true' : typeof def === 'number' ? Number(value) : Array.isArray(def) ? (value === '' ? [] : value.split(',')) : value;
    }
  }
  for (const p of k.patches ?? []) {
    if (!p.path || p.patch || p.target) fail(`${dir}: only patches from a file are carried into values`);
    const patch = parse(read(`${dir}/${p.path}`)) as {
      kind: string;
      metadata: { name: string };
      spec: { template: { spec: { containers: { name: string; env: { name: string; value: string }[] }[] } } };
    };
    const containers = patch.spec?.template?.spec?.containers ?? [];
    const env = containers[0]?.env ?? [];
    const expected = { kind: 'DaemonSet', metadata: { name: 'pier-agent', namespace: BASE_NAMESPACE }, spec: { template: { spec: { containers: [{ name: 'agent', env }] } } } };
    if (canonical({ ...patch, apiVersion: undefined }) !== canonical({ ...expected, apiVersion: undefined }) || env.length !== 1 || env[0]!.name !== 'PIER_API_SERVER') {
      fail(`${dir}/${p.path}: only a patch setting PIER_API_SERVER in the agent's env is carried into values (agent.apiServer)`);
    }
    out['agent'] = { apiServer: env[0]!.value };
  }
  const lines = [
    `# Generated from ${dir} by test/helm/generate.ts: edit the overlay, then run`,
    '# `node test/helm/generate.ts` (deploy/helm/README.md).',
    `# The chart as deploy/${dir.slice('deploy/'.length)} makes deploy/base:`,
    `#   helm install pier deploy/helm/pier -n pier-system -f deploy/helm/values/${overlay}.yaml`,
  ];
  for (const [key, value] of Object.entries(out)) {
    if (key === 'agent') lines.push('agent:', `  apiServer: ${JSON.stringify((value as { apiServer: string }).apiServer)}`);
    else if (key === 'extraConfig') lines.push('extraConfig:', ...Object.entries(value as Record<string, string>).map(([n, v]) => `  ${n}: ${JSON.stringify(v)}`));
    else lines.push(`${key}: ${JSON.stringify(value)}`);
  }
  return lines.join('\n') + '\n';
}

/** A JSON Schema node, as values.schema.json writes them (draft-07). */
interface Schema {
  $ref?: string;
  type?: string | string[];
  anyOf?: Schema[];
  oneOf?: Schema[];
  properties?: Record<string, Schema>;
  additionalProperties?: boolean | Schema;
  definitions?: Record<string, Schema>;
}

const SCHEMA = `${CHART_DIR}/values.schema.json`;

/**
 * values.schema.json against values.yaml: every key of values.yaml has its
 * entry and every entry its key (walking each object whose keys the schema
 * fixes); every such object refuses other keys (additionalProperties: false,
 * so that a typo such as `--set backnd=x` fails); every other object (a map
 * the user fills: nodeSelector, labels, extraConfig…) says what its entries
 * are; every value has a type. The types of the defaults themselves are
 * helm lint's to check (test/integration/helm.test.ts).
 */
function checkSchema(values: unknown): void {
  const root = JSON.parse(read(SCHEMA)) as Schema & { $schema?: string };
  if (root.$schema !== 'http://json-schema.org/draft-07/schema#') fail(`${SCHEMA}: $schema must be draft-07 (http://json-schema.org/draft-07/schema#), which Helm 3 and 4 both validate`);
  const resolve = (node: Schema, path: string): Schema => {
    if (!node.$ref) return node;
    const m = /^#\/definitions\/([^/]+)$/.exec(node.$ref);
    const target = m && root.definitions?.[m[1]!];
    if (!target) fail(`${SCHEMA}: ${path}: $ref ${node.$ref} names no definition`);
    return resolve(target, path);
  };
  const walk = (value: unknown, node: Schema, path: string) => {
    const s = resolve(node, path || '(root)');
    const name = path || '(root)';
    if (s.type === undefined && !s.anyOf && !s.oneOf) fail(`${SCHEMA}: ${name} has no type`);
    if (value === null || typeof value !== 'object' || Array.isArray(value)) return;
    if (!s.properties) {
      if (s.additionalProperties === undefined) fail(`${SCHEMA}: ${name} is a map the user fills: say what its entries are (additionalProperties)`);
      return;
    }
    if (s.additionalProperties !== false) fail(`${SCHEMA}: ${name} has fixed keys, so it must refuse others (additionalProperties: false)`);
    const at = (k: string) => (path ? `${path}.${k}` : k);
    for (const [k, v] of Object.entries(value)) {
      if (!(k in s.properties)) fail(`${CHART_DIR}/values.yaml has ${at(k)}, which ${SCHEMA} does not describe: add it there`);
      walk(v, s.properties[k]!, at(k));
    }
    for (const k of Object.keys(s.properties)) if (!(k in value)) fail(`${SCHEMA} describes ${at(k)}, which ${CHART_DIR}/values.yaml does not have`);
  };
  walk(values, root, '');
}

/** Every generated file, path (from the repository's root) → content. */
export function generate(root = ROOT): Map<string, string> {
  tree = root;
  try {
    return generateFrom(root);
  } finally {
    tree = ROOT;
  }
}

function generateFrom(root: string): Map<string, string> {
  const values = parse(read(`${CHART_DIR}/values.yaml`)) as unknown;
  checkSchema(values);
  const { kustomization, images } = checkBase(values);
  const files = new Map<string, string>();
  for (const s of SOURCES) files.set(`${CHART_DIR}/templates/${s.to}`, templateFile(s, values, images));
  files.set(`${CHART_DIR}/templates/config.yaml`, configTemplate(values, kustomization));
  // Every component is in the chart, behind its value.
  for (const dir of readdirSync(join(root, 'deploy/components'))) {
    const valuePath = COMPONENTS[dir];
    if (!valuePath) fail(`deploy/components/${dir} is not in the chart: add it to SOURCES and COMPONENTS`);
    valueAt(values, `${valuePath}.enabled`);
    const k = parse(read(`deploy/components/${dir}/kustomization.yaml`)) as Kustomization & { kind: string };
    for (const r of k.resources ?? []) if (!SOURCES.some((s) => s.from === `deploy/components/${dir}/${r}`)) fail(`deploy/components/${dir} lists ${r}, which the chart does not carry`);
  }
  for (const overlay of readdirSync(join(root, 'deploy/overlays'))) files.set(`${VALUES_DIR}/${overlay}.yaml`, overlayValues(overlay, values));
  return files;
}

/** Generated files whose content on disk differs (or that are missing), and files in templates/ nobody generates. */
export function stale(root = ROOT, files = generate(root)): string[] {
  const out: string[] = [];
  for (const [file, content] of files) {
    const path = join(root, file);
    if (!existsSync(path) || readFileSync(path, 'utf8') !== content) out.push(file);
  }
  for (const dir of [`${CHART_DIR}/templates`, VALUES_DIR]) {
    if (!existsSync(join(root, dir))) continue;
    for (const f of readdirSync(join(root, dir))) {
      const file = `${dir}/${f}`;
      if (!files.has(file) && !(dir.endsWith('templates') && HAND_WRITTEN_TEMPLATES.includes(f))) out.push(`${file} (not generated: remove it)`);
    }
  }
  return out;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const files = generate();
  if (process.argv.includes('--check')) {
    const bad = stale(ROOT, files);
    if (bad.length > 0) {
      console.error(`out of date (run \`node test/helm/generate.ts\`):\n  ${bad.join('\n  ')}`);
      process.exit(1);
    }
  } else {
    const { mkdirSync } = await import('node:fs');
    for (const [file, content] of files) {
      mkdirSync(join(ROOT, file, '..'), { recursive: true });
      writeFileSync(join(ROOT, file), content);
    }
    console.error(`wrote ${[...files.keys()].join(', ')}`);
  }
}
