// The test control plane is a real one, and the resilient informer survives
// it going away: objects created through the API show up in the informer,
// the Service status subresource takes a merge patch, RBAC denies an
// unprivileged ServiceAccount, and an informer whose API server is killed
// mid-watch converges to the server's state once it is back, including
// changes made (through a second API server on the same etcd) while it was down.
import {
  CoreV1Api,
  DiscoveryV1Api,
  PatchStrategy,
  setHeaderOptions,
  type KubernetesObject,
  VersionApi,
  type V1Service,
} from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { endpointSliceInformer, nodeInformer, serviceInformer } from '../../lib/collections.ts';
import type { ResilientInformer } from '../../lib/informer.ts';
import { startControlPlane, statusOf, type ControlPlane } from '../cluster/controlplane.ts';
import { endpointSlice, lbService, node } from '../support/objects.ts';
import { eventually } from '../support/wait.ts';

const NS = 'default';
const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);

describe('control plane and resilient informer', () => {
  let cp: ControlPlane;
  let core: CoreV1Api;
  let discovery: DiscoveryV1Api;
  const informers: ResilientInformer<KubernetesObject>[] = [];

  beforeAll(async () => {
    cp = await startControlPlane();
    core = cp.admin.makeApiClient(CoreV1Api);
    discovery = cp.admin.makeApiClient(DiscoveryV1Api);
  });
  afterAll(async () => {
    await Promise.all(informers.map((i) => i.stop()));
    await cp?.stop();
  });

  const track = <T extends KubernetesObject>(i: ResilientInformer<T>) => {
    informers.push(i as unknown as ResilientInformer<KubernetesObject>);
    i.start();
    return i;
  };

  it('serves a stamped version and RBAC-protected API', async () => {
    const version = await cp.admin.makeApiClient(VersionApi).getCode();
    expect(version.gitVersion).toMatch(/^v1\.3\d\.\d+$/);

    const sa = await cp.serviceAccount('pier-test', 'nobody');
    const denied = await sa.makeApiClient(CoreV1Api).listServiceForAllNamespaces().then(
      () => 200,
      (err: unknown) => statusOf(err),
    );
    expect(denied).toBe(403);
  });

  it('shows created objects through informers and takes a status patch', async () => {
    await core.createNode({ body: node('node-a', [{ type: 'InternalIP', address: '198.51.100.11' }]) });
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'web', [{ name: 'http', port: 80 }]) });
    await discovery.createNamespacedEndpointSlice({
      namespace: NS,
      body: endpointSlice(NS, 'web', 'IPv4', [{ address: '198.19.1.10', nodeName: 'node-a' }], [{ name: 'http', port: 8080 }]),
    });

    const services = track(serviceInformer(cp.admin));
    const nodes = track(nodeInformer(cp.admin));
    const slices = track(endpointSliceInformer(cp.admin));
    await Promise.all([services.synced, nodes.synced, slices.synced]);

    expect(services.get('web', NS)?.spec?.type).toBe('LoadBalancer');
    // The server keeps managedFields; the cache drops them (pier never reads them).
    expect((await core.readNamespacedService({ name: 'web', namespace: NS })).metadata?.managedFields?.length).toBeGreaterThan(0);
    expect(services.get('web', NS)?.metadata?.managedFields).toBeUndefined();
    expect(nodes.get('node-a')?.metadata?.name).toBe('node-a');
    expect(slices.get('web-ipv4', NS)?.endpoints?.[0]?.addresses).toEqual(['198.19.1.10']);

    const status = { loadBalancer: { ingress: [{ ip: '198.51.100.11', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }] }] } };
    await core.patchNamespacedServiceStatus({ name: 'web', namespace: NS, body: { status } }, mergePatch);
    const seen = await eventually('status in the informer cache', () => services.get('web', NS)?.status?.loadBalancer?.ingress?.[0]);
    expect(seen).toMatchObject({ ip: '198.51.100.11', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }] });
    // The status subresource ignores spec changes and vice versa.
    const svc = await core.readNamespacedService({ name: 'web', namespace: NS });
    expect(svc.spec?.ports?.[0]?.port).toBe(80);
  });

  it('converges after the API server is killed mid-watch and objects change while it is down', async () => {
    const services = informers[0] as unknown as ResilientInformer<V1Service>;
    const replica = await cp.startExtraApiServer();
    try {
      const viaReplica = replica.admin.makeApiClient(CoreV1Api);
      await cp.killApiServer();

      // While the informer's server is down: create, update and delete through the replica.
      await viaReplica.createNamespacedService({ namespace: NS, body: lbService(NS, 'made-while-down', [{ port: 81 }]) });
      await viaReplica.createNamespacedService({ namespace: NS, body: lbService(NS, 'doomed', [{ port: 82 }]) });
      await viaReplica.patchNamespacedService(
        { name: 'web', namespace: NS, body: { metadata: { labels: { changed: 'while-down' } } } },
        mergePatch,
      );
      // Give the informer time to notice and fail at least once.
      await eventually('informer to notice the outage', () => services.errorsSinceLastConnect > 0, { timeoutMs: 60_000 });

      await cp.restartApiServer();
      await core.deleteNamespacedService({ name: 'doomed', namespace: NS });
      await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'made-after', [{ port: 83 }]) });

      const truth = async () => {
        const list = await core.listServiceForAllNamespaces();
        return new Map(list.items.map((s) => [`${s.metadata!.namespace}/${s.metadata!.name}`, s.metadata!.resourceVersion]));
      };
      const cached = () => new Map(services.list().map((s) => [`${s.metadata!.namespace}/${s.metadata!.name}`, s.metadata!.resourceVersion]));
      await eventually('informer cache to equal the server', async () => {
        const want = await truth();
        const got = cached();
        return JSON.stringify([...got].sort()) === JSON.stringify([...want].sort()) ? got : false;
      }, { timeoutMs: 60_000 });

      expect(services.get('made-while-down', NS)).toBeDefined();
      expect(services.get('made-after', NS)).toBeDefined();
      expect(services.get('doomed', NS)).toBeUndefined();
      expect(services.get('web', NS)?.metadata?.labels?.['changed']).toBe('while-down');
    } finally {
      await replica.stop();
    }
  });

  it('never restarts after stop()', async () => {
    const services = track(serviceInformer(cp.admin, { backoff: { initialMs: 50, maxMs: 100 } }));
    await services.synced;
    await services.stop();
    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'after-stop', [{ port: 84 }]) });
    await new Promise((r) => setTimeout(r, 1500));
    expect(services.get('after-stop', NS)).toBeUndefined();
    expect(services.errorsSinceLastConnect).toBe(0);
  });
});
