// `pier status` as a user runs it, against a real API server: Nodes, agent
// Leases (fresh, expired, forwarding off), Services with the status and
// condition the controller would write, and EndpointSlices, all created
// through the API; the table and the JSON it prints; a user holding exactly
// the RBAC the README lists; and the one-line errors for a forbidden user
// and an unreachable server. Last, a controller process run with
// --default-class: status and a live trace learn it from its Lease.
import { fileURLToPath } from 'node:url';
import { CoordinationV1Api, CoreV1Api, DiscoveryV1Api, KubeConfig, PatchStrategy, RbacAuthorizationV1Api, V1MicroTime, setHeaderOptions, type V1Lease } from '@kubernetes/client-node';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  AGENT_LEASE_LABEL,
  AGENT_LEASE_LABEL_VALUE,
  LEADER_DEFAULT_CLASS,
  LEADER_LEASE_NAME,
  LEASE_FORWARDING_IPV4,
  LEASE_FORWARDING_IPV4_REASON,
  LEASE_FORWARDING_IPV6,
  READY_CONDITION,
  agentLeaseName,
} from '../../lib/contract.ts';
import type { StatusReport } from '../../controller/status-report.ts';
import { ensureNamespace, registerNode, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { startController } from '../support/controller.ts';
import { endpointSlice, lbService, node } from '../support/objects.ts';
import { freePort } from '../support/ports.ts';
import { eventually } from '../support/wait.ts';

const CLI = fileURLToPath(new URL('../../cmd/cli.ts', import.meta.url));
const NS = 'shop';
const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);

describe('pier status against the API server', () => {
  let cp: ControlPlane;

  const status = (args: string[], kubeconfig = cp.adminKubeconfigPath) =>
    execa(process.execPath, [CLI, 'status', '--kubeconfig', kubeconfig, ...args], { reject: false, stdin: 'ignore', env: { KUBECONFIG: '' }, timeout: 60_000 });

  function agentLease(nodeName: string, ageMs: number, v4: boolean, reason?: string): V1Lease {
    return {
      metadata: {
        name: agentLeaseName(nodeName),
        namespace: 'pier-system',
        labels: { [AGENT_LEASE_LABEL]: AGENT_LEASE_LABEL_VALUE },
        annotations: { [LEASE_FORWARDING_IPV4]: String(v4), [LEASE_FORWARDING_IPV6]: 'true', ...(reason ? { [LEASE_FORWARDING_IPV4_REASON]: reason } : {}) },
      },
      spec: { holderIdentity: nodeName, leaseDurationSeconds: 3600, renewTime: new V1MicroTime(Date.now() - ageMs) },
    };
  }

  beforeAll(async () => {
    cp = await startControlPlane();
    const core = cp.admin.makeApiClient(CoreV1Api);
    const coordination = cp.admin.makeApiClient(CoordinationV1Api);
    const discovery = cp.admin.makeApiClient(DiscoveryV1Api);
    for (const ns of ['pier-system', NS, 'other']) await ensureNamespace(core, ns);
    await registerNode(core, node('n1', [{ type: 'InternalIP', address: '198.51.100.11' }]));
    await registerNode(core, node('n2', [{ type: 'InternalIP', address: '198.51.100.12' }]));
    await registerNode(core, node('n3', [{ type: 'InternalIP', address: '198.51.100.13' }]));
    // Durations of an hour: whether a Lease is fresh must not depend on how long this test takes.
    await coordination.createNamespacedLease({ namespace: 'pier-system', body: agentLease('n1', 1000, true) });
    await coordination.createNamespacedLease({ namespace: 'pier-system', body: agentLease('n2', 2 * 3600_000, true) });
    await coordination.createNamespacedLease({ namespace: 'pier-system', body: agentLease('n3', 1000, false, 'net.ipv4.ip_forward is 0') });

    const now = new Date();
    const cond = (s: 'True' | 'False', reason: string, message: string) => [{ type: READY_CONDITION, status: s, reason, message, lastTransitionTime: now }];
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'web', [{ name: 'http', port: 80 }, { name: 'https', port: 443 }]) });
    await core.patchNamespacedServiceStatus(
      {
        name: 'web',
        namespace: NS,
        body: {
          status: {
            loadBalancer: {
              ingress: [
                { ip: '198.51.100.11', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }, { port: 443, protocol: 'TCP', error: 'PortConflict' }] },
                { ip: '198.51.100.12', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }, { port: 443, protocol: 'TCP', error: 'PortConflict' }] },
              ],
            },
            conditions: cond('False', 'PartiallyServed', 'served on 198.51.100.11, 198.51.100.12 except: port 443/TCP (https) is not served: held by other/old, which is older'),
          },
        },
      },
      mergePatch,
    );
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'dns', [{ port: 53, protocol: 'UDP' }], { externalTrafficPolicy: 'Local' }) });
    await core.patchNamespacedServiceStatus(
      {
        name: 'dns',
        namespace: NS,
        body: {
          status: {
            loadBalancer: { ingress: [{ ip: '198.51.100.11', ipMode: 'Proxy', ports: [{ port: 53, protocol: 'UDP' }] }] },
            conditions: cond('True', 'Serving', 'served on 198.51.100.11, 1 port 53/UDP'),
          },
        },
      },
      mergePatch,
    );
    await discovery.createNamespacedEndpointSlice({ namespace: NS, body: endpointSlice(NS, 'dns', 'IPv4', [{ address: '198.19.1.5', nodeName: 'n1' }], [{ port: 53, protocol: 'UDP' }]) });
    // Not pier's: another class, and a Service in another namespace.
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'foreign', [{ port: 80 }], { loadBalancerClass: 'example.com/lb' }) });
    await core.createNamespacedService({ namespace: 'other', body: lbService('other', 'old', [{ port: 443 }]) });
  });
  afterAll(async () => cp?.stop());

  it('prints a table of the namespace: addresses, ports with errors, serving nodes and why the others do not', async () => {
    const r = await status(['-n', NS]);
    // No controller has run yet: the defaults, and one line that says so.
    expect(r.stderr).toBe(
      'pier status: no controller Lease pier-system/pier-controller (is the controller running, with leader election, in that namespace?): assuming --default-class=false --default-pool=default --max-addresses=16; give them to override',
    );
    expect(r.exitCode).toBe(0);
    const lines = r.stdout.split('\n');
    expect(lines.slice(0, 3)).toEqual([
      'NAMESPACE   NAME   ADDRESSES                     PORTS                          NODES   READY   REASON',
      'shop        dns    198.51.100.11                 53/UDP                         n1      True    Serving',
      'shop        web    198.51.100.11,198.51.100.12   80/TCP,443/TCP(PortConflict)   n1      False   PartiallyServed',
    ]);
    expect(r.stdout).toContain(
      [
        'shop/dns:',
        '  node n2 does not serve it: its pier agent Lease has expired (renewed 120m ago, valid for 3600s)',
        '  node n3 does not serve it: its pier agent cannot forward IPv4: net.ipv4.ip_forward is 0',
        '',
        'shop/web:',
        '  node n2 does not serve it: its pier agent Lease has expired (renewed 120m ago, valid for 3600s); the status still lists 198.51.100.12',
        '  node n3 does not serve it: its pier agent cannot forward IPv4: net.ipv4.ip_forward is 0',
        '  port 443/TCP (https): PortConflict on 198.51.100.11, 198.51.100.12',
        `  ${READY_CONDITION} False PartiallyServed: served on 198.51.100.11, 198.51.100.12 except: port 443/TCP (https) is not served: held by other/old, which is older`,
      ].join('\n'),
    );
    expect(r.stdout).toContain('agent Leases judged as of now by renewTime + leaseDurationSeconds');
    expect(r.stdout).not.toContain('foreign');
  });

  it('gives scripts JSON across every namespace with -A -o json', async () => {
    const r = await status(['-A', '-o', 'json']);
    expect(r.exitCode).toBe(0);
    const report = JSON.parse(r.stdout) as StatusReport;
    expect(report.services.map((s) => `${s.namespace}/${s.name}`)).toEqual(['other/old', 'shop/dns', 'shop/web']);
    const web = report.services.find((s) => s.name === 'web')!;
    expect(web.addresses).toEqual(['198.51.100.11', '198.51.100.12']);
    expect(web.servingNodes).toEqual(['n1']);
    expect(web.ports).toEqual([
      { name: 'http', port: 80, protocol: 'TCP', externalPorts: [80], errors: [] },
      { name: 'https', port: 443, protocol: 'TCP', externalPorts: [], errors: [{ address: '198.51.100.11', error: 'PortConflict' }, { address: '198.51.100.12', error: 'PortConflict' }] },
    ]);
    expect(web.nodes.map((n) => [n.node, n.serving])).toEqual([['n1', true], ['n2', false], ['n3', false]]);
    expect(web.ready).toMatchObject({ status: 'False', reason: 'PartiallyServed' });
    const old = report.services.find((s) => s.name === 'old')!;
    expect(old.addresses).toEqual([]);
    expect(old.ready.status).toBe('Unknown');
    expect(old.nodes.find((n) => n.node === 'n1')?.reason).toMatch(/^it is eligible, but the status lists none of its IPv4 addresses/);
  });

  it('works with exactly the permissions the README lists', async () => {
    const rbac = cp.admin.makeApiClient(RbacAuthorizationV1Api);
    await rbac.createClusterRole({
      body: {
        metadata: { name: 'pier-status-reader' },
        rules: [
          { apiGroups: [''], resources: ['services', 'nodes'], verbs: ['list'] },
          { apiGroups: ['discovery.k8s.io'], resources: ['endpointslices'], verbs: ['list'] },
        ],
      },
    });
    await rbac.createClusterRoleBinding({
      body: { metadata: { name: 'pier-status-reader' }, roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'pier-status-reader' }, subjects: [{ kind: 'User', name: 'reader', apiGroup: 'rbac.authorization.k8s.io' }] },
    });
    await rbac.createNamespacedRole({ namespace: 'pier-system', body: { metadata: { name: 'pier-status-reader' }, rules: [{ apiGroups: ['coordination.k8s.io'], resources: ['leases'], verbs: ['list'] }] } });
    await rbac.createNamespacedRoleBinding({
      namespace: 'pier-system',
      body: { metadata: { name: 'pier-status-reader' }, roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'pier-status-reader' }, subjects: [{ kind: 'User', name: 'reader', apiGroup: 'rbac.authorization.k8s.io' }] },
    });
    const reader = await cp.clientKubeconfig('reader', 'reader');
    const withRbac = async () => {
      const r = await status(['-A', '-o', 'json'], reader);
      return r.exitCode === 0 ? r : undefined;
    };
    // RBAC changes reach the authorizer's cache within a moment.
    let ok;
    for (let i = 0; i < 50 && !(ok = await withRbac()); i++) await new Promise((res) => setTimeout(res, 200));
    expect(ok, 'pier status with the README RBAC').toBeDefined();
    expect((JSON.parse(ok!.stdout) as StatusReport).services).toHaveLength(3);
  });

  it('names what it may not read, and exits 1, for a user without permissions', async () => {
    const nobody = await cp.clientKubeconfig('nobody', 'nobody');
    const r = await status(['-n', NS], nobody);
    expect(r.exitCode).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr).toMatch(/^pier status: cannot list \S+ .*HTTP 403: .*forbidden.*pier status needs list on services, nodes and endpointslices/m);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
  });

  it('says the API server cannot be reached, and exits 1', async () => {
    const port = await freePort();
    const kc = new KubeConfig();
    const a = cp.admin;
    kc.loadFromOptions({ clusters: a.clusters.map((c) => ({ ...c, server: `https://127.0.0.1:${port}` })), users: a.users, contexts: a.contexts, currentContext: a.currentContext });
    const unreachable = cp.writeKubeconfig(kc, 'unreachable');
    const r = await status(['-n', NS], unreachable);
    expect(r.exitCode).toBe(1);
    expect(r.stderr).toMatch(new RegExp(`^pier status: cannot list \\S+ .*cannot reach https://127\\.0\\.0\\.1:${port}: .*ECONNREFUSED`, 'm'));
  });

  it("learns from the controller's Lease that pier is the default: status lists, and trace serves, a Service without a class, no flag given", async () => {
    const core = cp.admin.makeApiClient(CoreV1Api);
    const coordination = cp.admin.makeApiClient(CoordinationV1Api);
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'plain', [{ port: 8080 }], { loadBalancerClass: undefined }) });
    const names = (stdout: string) => (JSON.parse(stdout) as StatusReport).services.map((s) => s.name);
    expect(names((await status(['-n', NS, '-o', 'json'])).stdout)).not.toContain('plain');

    const controller = await startController(cp.adminKubeconfigPath, ['--default-class', '--leader-elect-id', 'c-1']);
    try {
      const lease = await eventually('the leader Lease', async () => {
        const l = await coordination.readNamespacedLease({ name: LEADER_LEASE_NAME, namespace: 'pier-system' }).catch(() => undefined);
        return l?.metadata?.annotations?.[LEADER_DEFAULT_CLASS] ? l : undefined;
      }, { timeoutMs: 30_000 });
      expect(lease.metadata?.annotations?.[LEADER_DEFAULT_CLASS], controller.log()).toBe('true');

      const r = await status(['-n', NS, '-o', 'json']);
      expect(r.stderr).toBe('');
      const report = JSON.parse(r.stdout) as StatusReport;
      expect(report.services.map((s) => s.name)).toContain('plain');
      expect(report.settings).toEqual({ defaultClass: true, defaultPool: 'default', from: { defaultClass: 'controller', defaultPool: 'controller' } });
      // A flag given beats the cluster.
      const overridden = await status(['-n', NS, '-o', 'json', '--default-class=false']);
      expect(names(overridden.stdout)).not.toContain('plain');
      expect((JSON.parse(overridden.stdout) as StatusReport).settings?.from.defaultClass).toBe('flag');

      // The controller serves it on n1 (fresh Lease, forwarding); a live trace follows the Lease too.
      await eventually('plain on n1', async () => {
        const svc = await core.readNamespacedService({ name: 'plain', namespace: NS });
        return svc.status?.loadBalancer?.ingress?.some((i) => i.ip === '198.51.100.11');
      }, { timeoutMs: 30_000 });
      const trace = (...extra: string[]) =>
        execa(process.execPath, [CLI, 'trace', '203.0.113.7', '198.51.100.11:8080/tcp', '--node', 'n1', '--kubeconfig', cp.adminKubeconfigPath, ...extra], { reject: false, stdin: 'ignore', env: { KUBECONFIG: '' }, timeout: 60_000 });
      const learned = await trace();
      expect(learned.stderr).toBe('');
      // No endpoints: pier's rules reject it, which is pier serving it.
      expect(learned.stdout).toMatch(/\nrejected: shop\/plain:8080 has no usable endpoint/);
      const flagged = await trace('--default-class=false');
      expect(flagged.stdout).toContain('Service shop/plain port 8080/TCP names no loadBalancerClass, and pier serves those only with --default-class');
    } finally {
      await controller.stop();
    }
  });
});
