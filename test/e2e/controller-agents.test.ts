// The whole of pier in the lab: one controller process (root namespace,
// against the real API server) and one agent per node namespace. The test
// only does what a user and the kubelet/EndpointSlice controller would:
// create Nodes, Services and EndpointSlices. Statuses come from the
// controller, rules from the agents, answers from the pods.
import { fileURLToPath } from 'node:url';
import { CoreV1Api, DiscoveryV1Api, PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import type { ResultPromise } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureNamespace, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { ECHO_PORT, HOST_V4, Lab } from '../lab/lab.ts';
import { endpointSlice, lbService, node as nodeObject } from '../support/objects.ts';
import { eventually } from '../support/wait.ts';

const CLI = fileURLToPath(new URL('../../lib/cli.ts', import.meta.url));
const NS = 'shop';
const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);

describe('controller and agents together', () => {
  let lab: Lab;
  let cp: ControlPlane;
  let core: CoreV1Api;
  let discovery: DiscoveryV1Api;
  const procs: ResultPromise[] = [];

  beforeAll(async () => {
    lab = await Lab.create({ nodes: [1, 1], clients: 2, hostLink: true });
    cp = await startControlPlane({ address: HOST_V4 });
    core = cp.admin.makeApiClient(CoreV1Api);
    discovery = cp.admin.makeApiClient(DiscoveryV1Api);
    await ensureNamespace(core, NS);
    await ensureNamespace(core, 'pier-system');
    for (const n of lab.nodes) {
      const addrs = [{ type: 'InternalIP' as const, address: n.v4 }, { type: 'InternalIP' as const, address: n.v6 }];
      await core.createNode({ body: nodeObject(n.name, addrs) });
      await core.patchNodeStatus({ name: n.name, body: { status: nodeObject(n.name, addrs).status } }, mergePatch);
      procs.push(
        lab.spawn(n.ns, process.execPath, [CLI, 'agent', '--node-name', n.name, '--kubeconfig', cp.adminKubeconfigPath,
          '--min-sync-interval', '50ms', '--lease-renew-interval', '1s', '--lease-duration', '5s', '--log-level', 'warn']),
      );
    }
    // The controller runs off the nodes, as a Deployment's pod may: here in a host of its own on the underlay.
    procs.push(
      lab.spawn(lab.clients[1]!.ns, process.execPath, [CLI, 'controller', '--kubeconfig', cp.adminKubeconfigPath, '--health-port', '0', '--log-level', 'warn']),
    );
  });

  afterAll(async () => {
    await lab?.destroy();
    await cp?.stop();
  });

  const create = async (name: string, port: number, policy: 'Cluster' | 'Local' = 'Cluster') => {
    await core.createNamespacedService({
      namespace: NS,
      body: lbService(NS, name, [{ name: 'http', port, targetPort: ECHO_PORT }], { externalTrafficPolicy: policy, ipFamilyPolicy: 'PreferDualStack', ipFamilies: ['IPv4', 'IPv6'] }),
    });
    for (const [family, type] of [['v4', 'IPv4'], ['v6', 'IPv6']] as const) {
      await discovery.createNamespacedEndpointSlice({
        namespace: NS,
        body: endpointSlice(NS, name, type, lab.pods.map((p) => ({ address: p[family], nodeName: p.node })), [{ name: 'http', port: ECHO_PORT }]),
      });
    }
  };

  it('serves a new Service on every node address the controller lists, IPv4 and IPv6', async () => {
    await create('web', 80);
    const ingress = await eventually('status from the controller', async () => {
      const svc = await core.readNamespacedService({ name: 'web', namespace: NS });
      const ing = svc.status?.loadBalancer?.ingress ?? [];
      return ing.length === 4 ? ing : false;
    }, { timeoutMs: 30_000 });
    expect(ingress.map((i) => i.ip).sort()).toEqual(lab.nodes.flatMap((n) => [n.v4, n.v6]).sort());
    for (const i of ingress) {
      expect(i.ipMode).toBe('Proxy');
      const r = await eventually(`answer via ${i.ip}`, async () => {
        const [res] = await lab.probe(lab.clients[0]!, i.ip!, i.ports![0]!.port, { timeoutMs: 500 });
        return res?.ok ? res : false;
      }, { timeoutMs: 15_000 });
      expect(lab.pods.map((p) => p.name)).toContain(r.reply!.pod);
    }
  });

  it('measures create -> first answered connection', async () => {
    const samples: number[] = [];
    const node = lab.nodes[0]!;
    for (let i = 0; i < 10; i++) {
      const start = performance.now();
      await create(`lat-${i}`, 1000 + i);
      await eventually(`lat-${i} answered`, async () => {
        const [res] = await lab.probe(lab.clients[0]!, node.v4, 1000 + i, { timeoutMs: 300 });
        return res?.ok === true;
      }, { timeoutMs: 20_000, intervalMs: 20 });
      samples.push(performance.now() - start);
    }
    samples.sort((a, b) => a - b);
    const p50 = samples[Math.floor(samples.length / 2)]!;
    console.log(`create -> first answered connection over ${samples.length} Services: p50 ${p50.toFixed(0)} ms, max ${samples.at(-1)!.toFixed(0)} ms`);
    expect(samples.at(-1)!).toBeLessThan(20_000);
  });
});
