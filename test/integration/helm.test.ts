// The Helm chart (deploy/helm/pier) with the real helm (test/helm/build.sh
// builds helm 4 and helm 3 from their Go modules): `helm lint` with both
// majors, which must also render the same objects, values.schema.json
// refusing a typo'd key and a bad value with both, `helm template` compared
// object by object with `kubectl kustomize` of deploy/ (the differences
// named in test/helm/compare.ts, each with why), the values doing what
// values.yaml says, and the chart installed, upgraded and uninstalled on a
// real kube-apiserver with the prometheus-operator's ServiceMonitor and
// PodMonitor CRDs, so that the server validates every object, the monitors
// too (the kustomize components by server-side dry run). Real nodes: test/e2e/helm.test.ts.
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CoreV1Api, type V1DaemonSet, type V1Deployment } from '@kubernetes/client-node';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { kubectlPath, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { compare, DIFFERENCES, kustomize, sorted } from '../helm/compare.ts';
import { CHART, CHART_VALUES, helm, helm3Path, helmPath, parseYaml, prometheusCrdsDir, template, type Obj } from '../helm/tools.ts';

const ROOT = new URL('../../', import.meta.url).pathname;
const SYSTEM = 'pier-system';
const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string; repository: { url: string } };
const OWNER = /github\.com\/([^/]+)\//.exec(pkg.repository.url)![1]!.toLowerCase();
const ctx = { version: pkg.version, owner: OWNER };
const KIND = join(CHART_VALUES, 'kind.yaml');
const K3S = join(CHART_VALUES, 'k3s.yaml');
const MONITORS = ['--set', 'metrics.serviceMonitor.enabled=true', '--set', 'metrics.podMonitor.enabled=true'];
/** The values helm lint is run with: the defaults, the k3s and kind values, everything switched on. */
const LINTED = [[], ['-f', K3S], ['-f', KIND, ...MONITORS, '--set', 'backend=nftables', '--set', `agent.image.digest=sha256:${'a'.repeat(64)}`, '--set', 'maxAddresses=4']];

const find = (objs: Obj[], kind: string, name: string) => {
  const o = objs.find((x) => x.kind === kind && x.metadata?.name === name);
  if (!o) throw new Error(`no ${kind} ${name}`);
  return o;
};
const config = (objs: Obj[]) => find(objs, 'ConfigMap', 'pier-config').data as Record<string, string>;
const checksum = (objs: Obj[], kind: string, name: string) => find(objs, kind, name).spec.template.metadata.annotations['checksum/config'] as string;
/** `kind.group` for kubectl get, so that a kind another API group also has is not mistaken. */
const resourceOf = (o: Obj) => (o.apiVersion!.includes('/') ? `${o.kind}.${o.apiVersion!.split('/')[0]}` : o.kind!);
const namespaceOf = (o: Obj) => (o.metadata!.namespace ? ['-n', o.metadata!.namespace] : []);
const container = (objs: Obj[], kind: 'Deployment' | 'DaemonSet', name: string) => find(objs, kind, name).spec.template.spec.containers[0];

describe('the Helm chart with the real helm', () => {
  let home: string;
  let work: string;

  beforeAll(async () => {
    home = mkdtempSync(join(tmpdir(), 'pier-helm-home-'));
    work = mkdtempSync(join(tmpdir(), 'pier-helm-work-'));
    // Waited for here, under the hook's timeout: scripts/test.sh may still be building them.
    await Promise.all([helmPath(), helm3Path()]);
  });
  afterAll(() => {
    if (home) rmSync(home, { recursive: true, force: true });
    if (work) rmSync(work, { recursive: true, force: true });
  });

  it.each([
    [4, /^v4\.3\.1/],
    [3, /^v3\.22\.0/],
  ] as const)('passes helm %i lint --strict with its defaults, the k3s and kind values, and everything switched on', async (major, version) => {
    expect(await helm(home, ['version', '--short'], { major })).toMatch(version);
    for (const args of LINTED) {
      const out = await helm(home, ['lint', '--strict', CHART, ...args], { major });
      expect(out, args.join(' ')).toMatch(/1 chart\(s\) linted, 0 chart\(s\) failed/);
    }
  });

  it('renders the same objects with helm 3 as with helm 4, object by object', async () => {
    for (const args of [...LINTED, ['-f', KIND, '--set', 'metrics.service.enabled=false', '--set-json', 'reservedPorts=[]', '--set', 'maxAddresses=all']]) {
      const [four, three] = await Promise.all([template(home, args, 4), template(home, args, 3)]);
      const byKey = (objs: Obj[]) => new Map(objs.map((o) => [`${o.kind} ${o.metadata?.namespace ?? ''}/${o.metadata?.name}`, o]));
      const [a, b] = [byKey(four.objects), byKey(three.objects)];
      expect([...b.keys()].sort(), args.join(' ')).toEqual([...a.keys()].sort());
      expect(a.size, args.join(' ')).toBe(four.objects.length);
      for (const [key, o] of a) expect(b.get(key), `${key} (${args.join(' ')})`).toEqual(o);
    }
  });

  // values.schema.json: Helm validates the values against it before rendering, in lint, template, install and upgrade alike.
  it.each([3, 4] as const)('helm %i refuses, by values.schema.json, a typo\'d value and a value outside its set, naming it', async (major) => {
    const refused = async (args: string[]) => {
      const lint = helm(home, ['lint', '--strict', CHART, ...args], { major });
      await expect(lint, `lint ${args.join(' ')}`).rejects.toThrow(/values don't meet the specifications of the schema/);
      const err = await template(home, args, major).then(
        () => undefined,
        (e: Error) => e.message,
      );
      expect(err, `template ${args.join(' ')}`).toMatch(/values don't meet the specifications of the schema\(s\) in the following chart\(s\):\npier:/);
      return err!;
    };
    expect(await refused(['--set', 'backnd=x'])).toMatch(/additional properties 'backnd' not allowed/);
    expect(await refused(['--set', 'agent.apiServr=10.0.0.1:6443'])).toMatch(/at '\/agent': additional properties 'apiServr' not allowed/);
    expect(await refused(['--set', 'backend=ipvs'])).toMatch(/at '\/backend': value must be one of '', 'iptables', 'nftables', 'auto'/);
    expect(await refused(['--set', 'logLevel=verbose'])).toMatch(/at '\/logLevel': value must be one of/);
    expect(await refused(['--set', 'controller.image.pullPolicy=Sometimes'])).toMatch(/at '\/controller\/image\/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'/);
    expect(await refused(['--set', 'maxPortsPerService=1000000'])).toMatch(/at '\/maxPortsPerService': maximum: got .*, want 65,535/);
    expect(await refused(['--set', 'defaultClass=yes'])).toMatch(/at '\/defaultClass': got string, want boolean/);
    expect(await refused(['--set', 'extraConfig.RESYNC=30s'])).toMatch(/'RESYNC' does not match pattern '\^PIER_/);
    // A typo in a values file too, and in a value only k3s/kind set.
    const typo = join(work, `typo-${major}.yaml`);
    writeFileSync(typo, 'agent:\n  apiserver: 127.0.0.1:6443\n');
    expect(await refused(['-f', typo])).toMatch(/additional properties 'apiserver' not allowed/);
  });

  it.each([
    ['its defaults', 'base', ['metrics'], []],
    ['deploy/helm/values/kind.yaml', 'overlays/kind', ['metrics'], ['-f', KIND]],
    ['deploy/helm/values/k3s.yaml', 'overlays/k3s', ['metrics'], ['-f', K3S]],
    ['kind.yaml without the metrics Services', 'overlays/kind', [], ['-f', KIND, '--set', 'metrics.service.enabled=false']],
    ['kind.yaml with the ServiceMonitors and PodMonitors', 'overlays/kind', ['metrics', 'service-monitor', 'pod-monitor'], ['-f', KIND, ...MONITORS]],
  ])('renders with %s what kubectl kustomize renders of deploy/%s with the components %j, but for the named differences', async (_what, resource, components, args) => {
    const chart = await template(home, args);
    const kust = await kustomize(join(work, `${resource.replace('/', '-')}-${components.join('-')}`), resource, components);
    const result = compare(chart.objects, kust.objects, ctx);
    const why = DIFFERENCES.map((d) => `- ${d.name}: ${d.why}`).join('\n');
    // Every named difference still exists: one that no longer happens leaves the list.
    for (const d of DIFFERENCES) expect(result.applied.get(d.name), `difference not seen: ${d.name}`).toBeGreaterThan(0);
    expect(result.onlyHelm, `objects only helm renders (named differences:\n${why})`).toEqual([]);
    expect(result.onlyKustomize, 'objects only kustomize renders').toEqual([]);
    for (const [key, [h, k]] of result.differing) expect(sorted(h), key).toEqual(sorted(k));
    expect(chart.objects.length).toBe(kust.objects.length - 1);
    const kinds = new Set(chart.objects.map((o) => o.kind));
    for (const kind of ['ClusterRole', 'Role', 'ValidatingAdmissionPolicy', 'ValidatingAdmissionPolicyBinding', 'PodDisruptionBudget', 'Deployment', 'DaemonSet', 'ConfigMap']) expect(kinds).toContain(kind);
  });

  it('sees a real difference: a chart that differs from deploy/ in a probe fails the comparison', async () => {
    const chart = await template(home, ['-f', KIND]);
    const kust = await kustomize(join(work, 'negative'), 'overlays/kind', ['metrics']);
    find(chart.objects, 'DaemonSet', 'pier-agent').spec.template.spec.containers[0].readinessProbe.periodSeconds = 6;
    const result = compare(chart.objects, kust.objects, ctx);
    expect([...result.differing.keys()]).toEqual(['DaemonSet pier-system/pier-agent']);
  });

  it('does what values.yaml says: images by tag or digest, settings into pier-config (rolling both workloads), scheduling, resources, monitors', async () => {
    const base = (await template(home)).objects;
    expect(container(base, 'DaemonSet', 'pier-agent').image).toBe(`ghcr.io/${OWNER}/pier-agent:${pkg.version}`);

    const digest = `sha256:${'0123456789abcdef'.repeat(4)}`;
    const images = (await template(home, ['--set', `agent.image.digest=${digest}`, '--set', 'controller.image.tag=9.9.9', '--set', 'controller.image.repository=registry.example/pier-controller'])).objects;
    expect(container(images, 'DaemonSet', 'pier-agent').image).toBe(`ghcr.io/${OWNER}/pier-agent@${digest}`);
    expect(container(images, 'Deployment', 'pier-controller').image).toBe('registry.example/pier-controller:9.9.9');
    // values.schema.json refuses it before _helpers.tpl's own check would.
    await expect(template(home, ['--set', 'agent.image.digest=latest'])).rejects.toThrow(/at '\/agent\/image\/digest': 'latest' does not match pattern/);

    // Settings: one ConfigMap for both; a change rolls both (the checksum), a change of anything else rolls nothing.
    const valuesFile = join(work, 'settings.yaml');
    writeFileSync(valuesFile, 'maxPortsPerService: 65535\nreservedPorts: [22, 6443]\nextraConfig:\n  PIER_RESYNC_PERIOD: 30s\n');
    const settings = (await template(home, ['-f', valuesFile, '--set', 'backend=nftables', '--set', 'defaultClass=true', '--set', 'defaultPool=edge', '--set', 'allocateRange=30000-30999', '--set', 'logLevel=debug'])).objects;
    expect(config(settings)).toEqual({
      PIER_DEFAULT_CLASS: 'true',
      PIER_DEFAULT_POOL: 'edge',
      PIER_RESERVED_PORTS: '22,6443',
      PIER_ALLOCATE_RANGE: '30000-30999',
      PIER_MAX_PORTS_PER_SERVICE: '65535',
      PIER_LOG_LEVEL: 'debug',
      PIER_BACKEND: 'nftables',
      PIER_RESYNC_PERIOD: '30s',
    });
    expect(config((await template(home, ['--set-json', 'reservedPorts=[]'])).objects)['PIER_RESERVED_PORTS']).toBe('');
    for (const [kind, name] of [['Deployment', 'pier-controller'], ['DaemonSet', 'pier-agent']] as const) {
      expect(checksum(settings, kind, name)).not.toBe(checksum(base, kind, name));
      expect(checksum(images, kind, name)).toBe(checksum(base, kind, name));
    }
    // The checksum is the rendered ConfigMap's.
    const rendered = (await helm(home, ['template', 'pier', CHART, '--namespace', SYSTEM, '--show-only', 'templates/config.yaml'])).replace(/^---\n# Source: [^\n]*\n/, '');
    expect(createHash('sha256').update(rendered.replace(/\n$/, '')).digest('hex')).toBe(checksum(base, 'DaemonSet', 'pier-agent'));
    await expect(template(home, ['--set', 'extraConfig.PIER_BACKEND=nftables'])).rejects.toThrow(/extraConfig\.PIER_BACKEND: set it with its own value/);

    const scheduling = (await template(home, [
      '--set-json', 'agent.tolerations=[{"key":"dedicated","operator":"Equal","value":"edge","effect":"NoSchedule"}]',
      '--set-json', 'agent.nodeSelector={"pier.dev/pool":"edge"}',
      '--set-json', 'controller.nodeSelector={"node-role.kubernetes.io/control-plane":""}',
      '--set', 'controller.replicas=3',
      '--set', 'agent.resources.limits.memory=1Gi',
      '--set', 'agent.apiServer=10.0.0.1:6443',
    ])).objects;
    const agent = find(scheduling, 'DaemonSet', 'pier-agent') as V1DaemonSet;
    expect(agent.spec!.template.spec!.tolerations).toEqual([{ key: 'dedicated', operator: 'Equal', value: 'edge', effect: 'NoSchedule' }]);
    expect(agent.spec!.template.spec!.nodeSelector).toEqual({ 'pier.dev/pool': 'edge' });
    expect(agent.spec!.template.spec!.containers[0]!.resources).toEqual({ requests: { cpu: '50m', memory: '128Mi' }, limits: { memory: '1Gi' } });
    expect(agent.spec!.template.spec!.containers[0]!.env).toContainEqual({ name: 'PIER_API_SERVER', value: '10.0.0.1:6443' });
    const ctl = find(scheduling, 'Deployment', 'pier-controller') as V1Deployment;
    expect(ctl.spec!.replicas).toBe(3);
    expect(ctl.spec!.template.spec!.nodeSelector).toEqual({ 'node-role.kubernetes.io/control-plane': '' });
    expect(find(base, 'Deployment', 'pier-controller').spec.template.spec.nodeSelector).toBeUndefined();

    const monitors = (await template(home, [...MONITORS, '--set', 'metrics.serviceMonitor.labels.release=prom', '--set', 'metrics.podMonitor.interval=15s'])).objects;
    for (const name of ['pier-agent', 'pier-controller']) {
      expect(find(monitors, 'ServiceMonitor', name).metadata!.labels).toMatchObject({ release: 'prom', 'app.kubernetes.io/name': name });
      expect(find(monitors, 'ServiceMonitor', name).spec.endpoints[0].interval).toBe('30s');
      expect(find(monitors, 'PodMonitor', name).spec.podMetricsEndpoints[0].interval).toBe('15s');
    }
    expect(base.filter((o) => o.kind === 'ServiceMonitor' || o.kind === 'PodMonitor')).toEqual([]);
    expect(base.filter((o) => o.kind === 'Service').map((o) => o.metadata!.name).sort()).toEqual(['pier-agent-metrics', 'pier-controller-metrics']);

    // Kubernetes older than 1.30 has no ValidatingAdmissionPolicy v1.
    await expect(template(home, ['--kube-version', '1.29.0'])).rejects.toThrow(/kubeVersion/);
  });

  describe('on a real API server with the prometheus-operator CRDs', () => {
    let cp: ControlPlane;
    let kubectl: (args: string[], input?: string) => Promise<string>;

    beforeAll(async () => {
      cp = await startControlPlane();
      const bin = await kubectlPath();
      kubectl = async (args, input) => {
        const r = await execa(bin, ['--kubeconfig', cp.adminKubeconfigPath, ...args], { reject: false, ...(input === undefined ? {} : { input }) });
        if (r.exitCode !== 0) throw new Error(`kubectl ${args.join(' ')} failed (${r.exitCode}): ${r.stderr}`);
        return r.stdout;
      };
      const crds = await prometheusCrdsDir();
      await kubectl(['apply', '--server-side', '-f', join(crds, 'monitoring.coreos.com_servicemonitors.yaml'), '-f', join(crds, 'monitoring.coreos.com_podmonitors.yaml')]);
      await kubectl(['wait', '--for=condition=Established', '--timeout=60s', 'crd/servicemonitors.monitoring.coreos.com', 'crd/podmonitors.monitoring.coreos.com']);
    });
    afterAll(async () => {
      await cp?.stop();
    });

    it('installs the chart (monitors too) into a namespace made as deploy/helm/README.md says, upgrades it, and uninstalls every object', async () => {
      await kubectl(['create', 'namespace', SYSTEM]);
      await kubectl(['label', 'namespace', SYSTEM, 'pod-security.kubernetes.io/enforce=privileged']);
      const kc = { kubeconfig: cp.adminKubeconfigPath };
      await helm(home, ['install', 'pier', CHART, '--namespace', SYSTEM, '-f', KIND, ...MONITORS], kc);
      const rendered = (await template(home, ['-f', KIND, ...MONITORS])).objects;
      // Every object is in the cluster as rendered: the server kept every field (none was unknown to its schema).
      for (const o of rendered) {
        const live = JSON.parse(await kubectl(['get', resourceOf(o), o.metadata!.name!, ...namespaceOf(o), '-o', 'json'])) as Obj;
        expect(live.metadata!.labels?.['app.kubernetes.io/managed-by'], `${o.kind} ${o.metadata!.name}`).toBe('Helm');
        for (const field of ['spec', 'rules', 'subjects', 'roleRef', 'data']) {
          if (o[field] !== undefined) expect(live[field], `${o.kind} ${o.metadata!.name} ${field}`).toMatchObject(o[field]);
        }
      }
      // The API server validates the monitors against the operator's schema: a bad interval is refused.
      await expect(helm(home, ['upgrade', 'pier', CHART, '--namespace', SYSTEM, '-f', KIND, ...MONITORS, '--set', 'metrics.serviceMonitor.interval=soon'], kc)).rejects.toThrow(
        /spec\.endpoints\[0\]\.interval.*should match|Invalid value: "soon"/s,
      );
      // The pods the workloads would make pass Pod Security (privileged namespace) and get their priority classes.
      const core = cp.admin.makeApiClient(CoreV1Api);
      for (const [kind, name] of [['Deployment', 'pier-controller'], ['DaemonSet', 'pier-agent']] as const) {
        const t = find(rendered, kind, name).spec.template;
        const pod = await core.createNamespacedPod({ namespace: SYSTEM, body: { metadata: { name: `${name}-dry-run`, labels: t.metadata.labels }, spec: t.spec }, dryRun: 'All' });
        expect(pod.spec?.priority, `${kind} ${name}`).toBeGreaterThan(1_000_000_000);
      }

      await helm(home, ['upgrade', 'pier', CHART, '--namespace', SYSTEM, '-f', KIND, ...MONITORS, '--set', 'logLevel=debug'], kc);
      expect(JSON.parse(await kubectl(['-n', SYSTEM, 'get', 'configmap', 'pier-config', '-o', 'json'])).data.PIER_LOG_LEVEL).toBe('debug');
      const history = JSON.parse(await helm(home, ['history', 'pier', '--namespace', SYSTEM, '-o', 'json'], kc)) as { revision: number; status: string }[];
      expect(history.map((h) => h.status)).toEqual(['superseded', 'failed', 'deployed']);

      await helm(home, ['uninstall', 'pier', '--namespace', SYSTEM, '--wait'], kc);
      for (const o of rendered) {
        const left = await kubectl(['get', resourceOf(o), o.metadata!.name!, ...namespaceOf(o), '--ignore-not-found', '-o', 'name']);
        expect(left, `${o.kind} ${o.metadata!.name} left after helm uninstall`).toBe('');
      }
      // The namespace is the user's: it stays. (This API server has no namespace controller to finish deleting it; it goes with the control plane.)
      await core.readNamespace({ name: SYSTEM });
    });

    it('admits deploy/ with the metrics, ServiceMonitor and PodMonitor components by server-side dry run, and refuses a bad monitor', async () => {
      const kust = await kustomize(join(work, 'server'), 'overlays/kind', ['metrics', 'service-monitor', 'pod-monitor']);
      const out = await kubectl(['apply', '--server-side', '--dry-run=server', '--field-manager=pier-tests', '-f', '-'], kust.yaml);
      for (const o of ['service/pier-agent-metrics', 'service/pier-controller-metrics', 'servicemonitor.monitoring.coreos.com/pier-agent', 'podmonitor.monitoring.coreos.com/pier-controller']) {
        expect(out).toContain(`${o} serverside-applied (server dry run)`);
      }
      const bad = parseYaml(kust.yaml).find((o) => o.kind === 'PodMonitor')!;
      bad.spec.podMetricsEndpoints[0].scheme = 'gopher';
      await expect(kubectl(['apply', '--server-side', '--dry-run=server', '--field-manager=pier-tests', '-f', '-'], JSON.stringify(bad))).rejects.toThrow(/scheme/);
      // The metrics Services select the workloads' pods by the labels those pods carry.
      const objs = parseYaml(kust.yaml);
      for (const name of ['pier-agent', 'pier-controller']) {
        const svc = find(objs, 'Service', `${name}-metrics`);
        const workload = objs.find((o) => (o.kind === 'Deployment' || o.kind === 'DaemonSet') && o.metadata!.name === name)!;
        expect(workload.spec.template.metadata.labels).toMatchObject(svc.spec.selector);
        const port = workload.spec.template.spec.containers[0].ports.find((p: { name: string }) => p.name === 'metrics');
        expect(svc.spec.ports[0]).toMatchObject({ port: port.containerPort, targetPort: 'metrics' });
        expect(svc.spec.clusterIP).toBe('None');
        expect(svc.metadata!.labels).toMatchObject(find(objs, 'ServiceMonitor', name).spec.selector.matchLabels);
        expect(workload.spec.template.metadata.labels).toMatchObject(find(objs, 'PodMonitor', name).spec.selector.matchLabels);
      }
    });
  });
});
