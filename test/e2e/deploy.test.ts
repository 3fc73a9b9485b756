// deploy/ against the real API server: every kustomization renders and is
// admitted by server-side apply, and the controller and the agents do their
// whole job in the lab with tokens of their own ServiceAccounts, under
// exactly the RBAC and admission policies deploy/ defines, started with the
// environment the manifests give them. The same tokens are refused what pier
// must never do: read Secrets, change a Service's spec, write another node's
// Lease or Events.
import { fileURLToPath } from 'node:url';
import {
  CoordinationV1Api,
  CoreV1Api,
  DiscoveryV1Api,
  EventsV1Api,
  PatchStrategy,
  setHeaderOptions,
  V1MicroTime,
  type KubeConfig,
  type KubernetesObject,
  type V1DaemonSet,
  type V1Deployment,
  type V1Lease,
} from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { apiServerUrl } from '../../lib/command.ts';
import { LEADER_LEASE_NAME, LEASE_FORWARDING_IPV6, agentLeaseName } from '../../lib/contract.ts';
import { ensureNamespace, startControlPlane, statusOf, type ControlPlane } from '../cluster/controlplane.ts';
import { ECHO_PORT, HOST_V4, Lab } from '../lab/lab.ts';
import { apply, containerEnv, containerOf, find, KUSTOMIZATIONS, render, type Rendered } from '../support/deploy.ts';
import { runReadme } from '../support/readme.ts';
import { endpointSlice, lbService } from '../support/objects.ts';
import { registerLabNodes } from '../lab/pier.ts';
import { eventually } from '../support/wait.ts';

const CLI = fileURLToPath(new URL('../../cmd/cli.ts', import.meta.url));
const SYSTEM = 'pier-system';
const NS = 'shop';
const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);

/** The HTTP status a call failed with (0 when it succeeded). */
async function statusOfCall(call: () => Promise<unknown>): Promise<number> {
  try {
    await call();
    return 0;
  } catch (err) {
    const status = statusOf(err);
    if (status === undefined) throw err;
    return status;
  }
}

describe('deploy/ against a real API server', () => {
  let lab: Lab;
  let cp: ControlPlane;
  let core: CoreV1Api;
  let base: Rendered;
  let controllerKc: KubeConfig;
  const agentKc = new Map<string, KubeConfig>();

  beforeAll(async () => {
    lab = await Lab.create({ nodes: [1, 1], clients: 2, hostLink: true });
    cp = await startControlPlane({ address: HOST_V4 });
    core = cp.admin.makeApiClient(CoreV1Api);
    base = await render('base');
  });

  afterAll(async () => {
    await lab?.destroy();
    await cp?.stop();
  });

  it('renders every kustomization as the issue asks: least privilege, hardened pods, one place for configuration', async () => {
    for (const k of KUSTOMIZATIONS) {
      const { objects } = await render(k);
      const ctl = find<V1Deployment>(objects, 'Deployment', 'pier-controller');
      const agent = find<V1DaemonSet>(objects, 'DaemonSet', 'pier-agent');
      for (const o of objects) if (o.kind !== 'Namespace' && !o.kind?.startsWith('Cluster') && !o.kind?.startsWith('ValidatingAdmission')) expect(o.metadata?.namespace, `${o.kind} ${o.metadata?.name}`).toBe(SYSTEM);

      // No rule anywhere reaches Secrets, or anything with a wildcard.
      for (const role of objects.filter((o) => o.kind === 'Role' || o.kind === 'ClusterRole') as { rules: { resources: string[]; verbs: string[]; apiGroups: string[] }[] }[]) {
        for (const rule of role.rules) {
          expect(rule.resources).not.toContain('secrets');
          expect([...rule.resources, ...rule.verbs, ...rule.apiGroups]).not.toContain('*');
        }
      }

      expect(ctl.spec?.replicas).toBe(2);
      const c = containerOf(objects, 'Deployment', 'pier-controller');
      expect(c.args).toEqual(['controller']);
      expect(c.image).toBe('pier/controller:0.1.0');
      expect(ctl.spec?.template.spec?.securityContext?.runAsNonRoot).toBe(true);
      expect(c.securityContext).toMatchObject({ allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ['ALL'] } });
      expect(c.resources?.requests && c.resources.limits).toBeTruthy();
      expect(c.livenessProbe?.httpGet?.path).toBe('/healthz');
      expect(c.readinessProbe?.httpGet?.path).toBe('/readyz');

      const spec = agent.spec!.template.spec!;
      const a = containerOf(objects, 'DaemonSet', 'pier-agent');
      expect(a.args).toEqual(['agent']);
      expect(a.image).toBe('pier/agent:0.1.0');
      expect(spec.hostNetwork).toBe(true);
      expect(spec.priorityClassName).toBe('system-node-critical');
      expect(spec.tolerations).toContainEqual({ operator: 'Exists' });
      expect(a.securityContext?.privileged).toBe(false);
      expect(a.securityContext?.capabilities?.add?.sort()).toEqual(['NET_ADMIN', 'NET_RAW']);
      expect(a.volumeMounts).toContainEqual(expect.objectContaining({ mountPath: '/run/xtables.lock' }));
      expect(a.env).toContainEqual({ name: 'NODE_NAME', valueFrom: { fieldRef: { fieldPath: 'spec.nodeName' } } });
      expect(agent.spec?.updateStrategy?.type).toBe('RollingUpdate');
      expect(a.livenessProbe?.httpGet?.path).toBe('/healthz');
      expect(a.readinessProbe?.httpGet?.path).toBe('/readyz');

      // One ConfigMap feeds both programs; the overlays for k3s and kind make pier the default class.
      const config = containerEnv(objects, 'DaemonSet', 'pier-agent', { name: 'p', namespace: SYSTEM, nodeName: 'n' });
      expect(containerEnv(objects, 'Deployment', 'pier-controller', { name: 'p', namespace: SYSTEM })).toMatchObject({ PIER_DEFAULT_CLASS: config['PIER_DEFAULT_CLASS'] });
      expect(config['PIER_DEFAULT_CLASS']).toBe(k === 'base' ? 'false' : 'true');
      // The API server's own address, for the agents alone (the controller is an ordinary pod), read by the node's resolver.
      const apiServer = { base: undefined, 'overlays/k3s': '127.0.0.1:6443,127.0.0.1:6444', 'overlays/kind': 'kind-control-plane:6443' }[k];
      expect(config['PIER_API_SERVER']).toBe(apiServer);
      for (const s of apiServer?.split(',') ?? []) expect(apiServerUrl(s), s).toBeDefined();
      expect(containerEnv(objects, 'Deployment', 'pier-controller', { name: 'p', namespace: SYSTEM })['PIER_API_SERVER']).toBeUndefined();
      expect(spec.dnsPolicy).toBe('Default');
    }
  });

  it('is admitted by the API server: base applied as the README writes it (kubectl apply -k deploy/base), every kustomization by server-side dry run', async () => {
    const [install] = await runReadme('apply-base', { kubeconfig: cp.adminKubeconfigPath });
    for (const o of base.objects) expect(install!.stdout, `${o.kind} ${o.metadata?.name}`).toContain(`/${o.metadata?.name} created`);
    for (const k of KUSTOMIZATIONS) {
      // Forced: the README's client-side apply owns the env fields these differ in (test/support/deploy.ts).
      const out = await apply(cp.adminKubeconfigPath, (await render(k)).yaml, { dryRun: true, forceConflicts: true });
      expect(out).toMatch(/daemonset\.apps\/pier-agent serverside-applied \(server dry run\)/);
    }
    // No kubelet or controller-manager here: create the pods the workloads
    // would, from their templates, by server dry run, so pod-level admission
    // (Pod Security, priority classes, the ServiceAccount) is checked too.
    for (const [kind, name] of [['Deployment', 'pier-controller'], ['DaemonSet', 'pier-agent']] as const) {
      const template = find<V1Deployment | V1DaemonSet>(base.objects, kind, name).spec!.template;
      const pod = await core.createNamespacedPod({
        namespace: SYSTEM,
        body: { metadata: { name: `${name}-dry-run`, labels: template.metadata?.labels }, spec: template.spec },
        dryRun: 'All',
      });
      expect(pod.spec?.priority, `${kind} ${name}`).toBeGreaterThan(1_000_000_000);
    }

    // The uninstall's sweep: `pier cleanup` on every node, with no API access.
    const cleanup = await render('cleanup');
    await apply(cp.adminKubeconfigPath, cleanup.yaml);
    const sweep = find<V1DaemonSet>(cleanup.objects, 'DaemonSet', 'pier-cleanup').spec!.template;
    expect(sweep.spec?.initContainers?.[0]?.args).toEqual(['cleanup']);
    expect(sweep.spec?.automountServiceAccountToken).toBe(false);
    // The controller-manager would have created the namespace's default ServiceAccount.
    await core.createNamespacedServiceAccount({ namespace: 'pier-cleanup', body: { metadata: { name: 'default' } } });
    await core.createNamespacedPod({ namespace: 'pier-cleanup', body: { metadata: { name: 'pier-cleanup-dry-run' }, spec: sweep.spec }, dryRun: 'All' });
    await core.deleteNamespace({ name: 'pier-cleanup' });
  });

  it('runs the controller and the agents with their own tokens and the manifests environment, and they serve a Service', async () => {
    await ensureNamespace(core, NS);
    controllerKc = await cp.serviceAccount(SYSTEM, 'pier-controller');
    await registerLabNodes(core, lab);
    for (const n of lab.nodes) {
      // The DaemonSet's pod on this node, as the scheduler would have placed
      // it; its bound token names the node, as a kubelet-projected one does.
      const pod = await core.createNamespacedPod({
        namespace: SYSTEM,
        body: { metadata: { name: `pier-agent-${n.name}` }, spec: { nodeName: n.name, serviceAccountName: 'pier-agent', containers: [{ name: 'agent', image: 'pier/agent:0.1.0' }] } },
      });
      const kc = await cp.serviceAccount(SYSTEM, 'pier-agent', { boundPod: { name: pod.metadata!.name!, uid: pod.metadata!.uid! } });
      agentKc.set(n.name, kc);
      const env = containerEnv(base.objects, 'DaemonSet', 'pier-agent', { name: pod.metadata!.name!, namespace: SYSTEM, nodeName: n.name });
      lab.spawn(n.ns, process.execPath, [CLI, 'agent', '--kubeconfig', cp.writeKubeconfig(kc, `agent-${n.name}`), '--min-sync-interval', '100ms', '--lease-renew-interval', '1s', '--resync-period', '2s'], { env });
    }
    const ctlEnv = containerEnv(base.objects, 'Deployment', 'pier-controller', { name: 'pier-controller-0', namespace: SYSTEM });
    lab.spawn(lab.clients[1]!.ns, process.execPath, [CLI, 'controller', '--kubeconfig', cp.writeKubeconfig(controllerKc, 'controller')], { env: ctlEnv });

    await core.createNamespacedService({
      namespace: NS,
      body: lbService(NS, 'web', [{ name: 'http', port: 80, targetPort: ECHO_PORT }], { ipFamilyPolicy: 'PreferDualStack', ipFamilies: ['IPv4', 'IPv6'] }),
    });
    const discovery = cp.admin.makeApiClient(DiscoveryV1Api);
    for (const [family, type] of [['v4', 'IPv4'], ['v6', 'IPv6']] as const) {
      await discovery.createNamespacedEndpointSlice({
        namespace: NS,
        body: endpointSlice(NS, 'web', type, lab.pods.map((p) => ({ address: p[family], nodeName: p.node })), [{ name: 'http', port: ECHO_PORT }]),
      });
    }
    const ingress = await eventually('status from the controller', async () => {
      const ing = (await core.readNamespacedService({ name: 'web', namespace: NS })).status?.loadBalancer?.ingress ?? [];
      return ing.length === 4 ? ing : false;
    }, { timeoutMs: 60_000 });
    expect(ingress.map((i) => i.ip).sort()).toEqual(lab.nodes.flatMap((n) => [n.v4, n.v6]).sort());
    const answeredBy = new Set<string>();
    for (const i of ingress) {
      const r = await eventually(`an answer through ${i.ip}`, async () => {
        const [res] = await lab.probe(lab.clients[0]!, i.ip!, 80, { timeoutMs: 500 });
        return res?.ok ? res : false;
      }, { timeoutMs: 20_000 });
      answeredBy.add(r.reply!.pod);
    }
    expect([...answeredBy].every((p) => lab.pods.some((pod) => pod.name === p))).toBe(true);

    // Leases: the leader's, and each agent's own, held by its node.
    const coordination = cp.admin.makeApiClient(CoordinationV1Api);
    expect((await coordination.readNamespacedLease({ name: LEADER_LEASE_NAME, namespace: SYSTEM })).spec?.holderIdentity).toBe('pier-controller-0');
    for (const n of lab.nodes) expect((await coordination.readNamespacedLease({ name: agentLeaseName(n.name), namespace: SYSTEM })).spec?.holderIdentity).toBe(n.name);

    // The controller's Events about the Service went through.
    const events = cp.admin.makeApiClient(EventsV1Api);
    await eventually('an Event from the controller', async () =>
      (await events.listNamespacedEvent({ namespace: NS })).items.some((e) => e.reportingController === 'pier.dev/controller' && e.regarding?.name === 'web'));

    // An agent's Warning about its Node goes through its own policy, and the
    // controller, reading that agent's Lease, stops advertising the family.
    const second = lab.nodes[1]!;
    await lab.exec(second.ns, 'sysctl', ['-q', '-w', 'net.ipv6.conf.all.forwarding=0']);
    try {
      await eventually('the agent to report IPv6 forwarding off', async () =>
        (await coordination.readNamespacedLease({ name: agentLeaseName(second.name), namespace: SYSTEM })).metadata?.annotations?.[LEASE_FORWARDING_IPV6] === 'false');
      const warning = await eventually('a ForwardingDisabled Event on the Node', async () =>
        (await events.listNamespacedEvent({ namespace: 'default' })).items.find((e) => e.reason === 'ForwardingDisabled' && e.regarding?.name === second.name));
      expect(warning.reportingInstance).toBe(second.name);
      await eventually('the node IPv6 address withdrawn', async () =>
        !((await core.readNamespacedService({ name: 'web', namespace: NS })).status?.loadBalancer?.ingress ?? []).some((i) => i.ip === second.v6));
    } finally {
      await lab.exec(second.ns, 'sysctl', ['-q', '-w', 'net.ipv6.conf.all.forwarding=1']);
    }
  });

  it('refuses those same tokens what pier must never do', async () => {
    const [first, second] = lab.nodes as [typeof lab.nodes[0], typeof lab.nodes[0]];
    const agent = agentKc.get(first.name)!;
    const callers = { controller: controllerKc, agent };

    for (const [who, kc] of Object.entries(callers)) {
      const api = kc.makeApiClient(CoreV1Api);
      expect(await statusOfCall(() => api.listSecretForAllNamespaces()), `${who} lists Secrets`).toBe(403);
      expect(await statusOfCall(() => api.listNamespacedSecret({ namespace: SYSTEM })), `${who} lists pier's Secrets`).toBe(403);
      expect(await statusOfCall(() => api.readNamespacedSecret({ name: 'any', namespace: NS })), `${who} reads a Secret`).toBe(403);
      for (const body of [{ spec: { ports: [{ name: 'http', port: 81, targetPort: ECHO_PORT, protocol: 'TCP' }] } }, { spec: { externalTrafficPolicy: 'Local' } }, { metadata: { labels: { owned: 'yes' } } }]) {
        expect(await statusOfCall(() => api.patchNamespacedService({ name: 'web', namespace: NS, body }, mergePatch)), `${who} patches ${JSON.stringify(body)}`).toBe(403);
      }
      expect(await statusOfCall(() => api.patchNode({ name: first.name, body: { metadata: { labels: { owned: 'yes' } } } }, mergePatch)), `${who} patches a Node`).toBe(403);
    }
    // What the controller may write to a Service: its port-mapping annotation, nothing else.
    const ctlCore = controllerKc.makeApiClient(CoreV1Api);
    expect(await statusOfCall(() => ctlCore.patchNamespacedService({ name: 'web', namespace: NS, body: { metadata: { annotations: { 'pier.dev/port-mapping': '{}' } } } }, mergePatch))).toBe(0);
    expect(await statusOfCall(() => ctlCore.patchNamespacedService({ name: 'web', namespace: NS, body: { metadata: { annotations: { 'example.com/other': 'x' } } } }, mergePatch))).toBe(403);
    expect(await statusOfCall(() => agent.makeApiClient(CoreV1Api).patchNamespacedServiceStatus({ name: 'web', namespace: NS, body: { status: { loadBalancer: {} } } }, mergePatch))).toBe(403);

    // Leases: each agent its own, the controller only the leader's.
    const lease = (name: string, holder: string): V1Lease => ({ metadata: { name, namespace: SYSTEM }, spec: { holderIdentity: holder, leaseDurationSeconds: 20, renewTime: new V1MicroTime() } });
    const agentLeases = agent.makeApiClient(CoordinationV1Api);
    // The real agent renews every second: a conflict (409) would hide the answer, so read again until there is none.
    const forgeSecond = async () => {
      for (;;) {
        const current = await agentLeases.readNamespacedLease({ name: agentLeaseName(second.name), namespace: SYSTEM });
        const status = await statusOfCall(() => agentLeases.replaceNamespacedLease({ name: agentLeaseName(second.name), namespace: SYSTEM, body: { ...current, spec: { ...current.spec, renewTime: new V1MicroTime() } } }));
        if (status !== 409) return status;
      }
    };
    expect(await forgeSecond()).toBe(403);
    expect(await statusOfCall(() => agentLeases.createNamespacedLease({ namespace: SYSTEM, body: lease('pier-agent-ghost', 'ghost') }))).toBe(403);
    expect(await statusOfCall(() => agentLeases.createNamespacedLease({ namespace: SYSTEM, body: lease(LEADER_LEASE_NAME + '-x', first.name) }))).toBe(403);
    expect(await statusOfCall(() => agentLeases.createNamespacedLease({ namespace: NS, body: lease(agentLeaseName(first.name), first.name) }))).toBe(403);
    const ctlLeases = controllerKc.makeApiClient(CoordinationV1Api);
    expect(await statusOfCall(() => ctlLeases.createNamespacedLease({ namespace: SYSTEM, body: lease('pier-agent-ghost', 'ghost') }))).toBe(403);
    // An agent token not bound to a pod names no node: no Lease at all.
    const unbound = (await cp.serviceAccount(SYSTEM, 'pier-agent')).makeApiClient(CoordinationV1Api);
    expect(await statusOfCall(() => unbound.createNamespacedLease({ namespace: SYSTEM, body: lease('pier-agent-ghost', 'ghost') }))).toBe(403);

    // Events: the agent reports as itself only.
    const event = (instance: string): KubernetesObject & Record<string, unknown> => ({
      metadata: { name: `pier-test.${instance}`, namespace: 'default' },
      eventTime: new V1MicroTime(),
      reportingController: 'pier.dev/agent',
      reportingInstance: instance,
      action: 'Check',
      reason: 'Test',
      type: 'Normal',
      regarding: { kind: 'Node', name: first.name, apiVersion: 'v1' },
    });
    const agentEvents = agent.makeApiClient(EventsV1Api);
    expect(await statusOfCall(() => agentEvents.createNamespacedEvent({ namespace: 'default', body: event(second.name) as never }))).toBe(403);
    expect(await statusOfCall(() => agentEvents.createNamespacedEvent({ namespace: 'default', body: event(first.name) as never }))).toBe(0);
  });
});
