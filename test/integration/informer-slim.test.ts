// The informer against a real API server as the agent runs it: the list read
// in pages through real continue tokens, and every object, listed or
// watched, cached as the agent's projection (lib/slim.ts) of what the server
// holds.
import { CoreV1Api, PatchStrategy, setHeaderOptions, type V1Service } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { serviceInformer } from '../../lib/collections.ts';
import { ResilientInformer, type ListPage } from '../../lib/informer.ts';
import { ListError, rawLister } from '../../lib/rawlist.ts';
import { slimService } from '../../lib/slim.ts';
import { ensureNamespace, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { lbService } from '../support/objects.ts';
import { eventually } from '../support/wait.ts';

const NS = 'paged';
const COUNT = 23;
const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);
const status = (port: number, ip = '198.51.100.11') => ({ loadBalancer: { ingress: [{ ip, ipMode: 'Proxy', ports: [{ port, protocol: 'TCP' }] }] } });

describe('informer: paged lists and slim objects', () => {
  let cp: ControlPlane;
  let core: CoreV1Api;
  const informers: ResilientInformer<V1Service>[] = [];

  beforeAll(async () => {
    cp = await startControlPlane();
    core = cp.admin.makeApiClient(CoreV1Api);
    await ensureNamespace(core, NS);
    for (let i = 0; i < COUNT; i++) {
      const name = `svc-${i}`;
      await core.createNamespacedService({ namespace: NS, body: lbService(NS, name, [{ name: 'http', port: 1000 + i }], { loadBalancerSourceRanges: ['203.0.113.0/24'] }) });
      await core.patchNamespacedServiceStatus({ name, namespace: NS, body: { status: status(1000 + i) } }, mergePatch);
    }
  });
  afterAll(async () => {
    await Promise.all(informers.map((i) => i.stop()));
    await cp?.stop();
  });

  it('lists page by page and caches what the agent reads of each object', async () => {
    const pages: ListPage[] = [];
    const informer = new ResilientInformer<V1Service>({
      kc: cp.admin,
      name: 'services',
      path: `/api/v1/namespaces/${NS}/services`,
      list: (page) => {
        pages.push(page);
        return core.listNamespacedService({ namespace: NS, ...page });
      },
      transform: slimService,
      pageSize: 5,
    });
    informers.push(informer);
    informer.start();
    await informer.synced;

    expect(pages.map((p) => p.limit)).toEqual([5, 5, 5, 5, 5]);
    expect(pages[0]!._continue).toBeUndefined();
    expect(pages.slice(1).every((p) => typeof p._continue === 'string' && p._continue !== '')).toBe(true);
    expect(informer.list(NS)).toHaveLength(COUNT);

    // Exactly the projection of what the server holds: nothing missing, nothing more.
    const truth = await core.listNamespacedService({ namespace: NS });
    for (const svc of truth.items) expect(informer.get(svc.metadata!.name!, NS)).toEqual(slimService(svc));
    const cached = informer.get('svc-3', NS)!;
    expect(truth.items[0]!.metadata?.managedFields?.length).toBeGreaterThan(0);
    expect(cached.metadata?.managedFields).toBeUndefined();
    expect(cached.spec?.clusterIP).toBeUndefined();
    expect(cached.spec?.loadBalancerSourceRanges).toEqual(['203.0.113.0/24']);
  });

  it('caches watched changes as slim objects too', async () => {
    const informer = informers[0]!;
    await core.patchNamespacedServiceStatus({ name: 'svc-3', namespace: NS, body: { status: status(2003, '198.51.100.12') } }, mergePatch);
    const seen = await eventually('the new status in the cache', () => {
      const s = informer.get('svc-3', NS);
      return s?.status?.loadBalancer?.ingress?.[0]?.ip === '198.51.100.12' ? s : false;
    });
    const server = await core.readNamespacedService({ name: 'svc-3', namespace: NS });
    expect(seen.metadata?.resourceVersion).toBe(server.metadata?.resourceVersion);
    expect(seen.metadata?.managedFields).toBeUndefined();
    expect(seen.spec?.clusterIP).toBeUndefined();
    // A watch event is plain JSON: the timestamp is text where the list's decoder made a Date.
    expect({ ...seen, metadata: { ...seen.metadata, creationTimestamp: undefined } }).toEqual({
      ...slimService(server),
      metadata: { ...slimService(server).metadata, creationTimestamp: undefined },
    });

    await core.deleteNamespacedService({ name: 'svc-4', namespace: NS });
    await eventually('the deletion in the cache', () => informer.get('svc-4', NS) === undefined);
  });

  it('lists as parsed JSON (the agent\'s way) exactly what client-node\'s model classes hold, page by page; a refused page fails with its status', async () => {
    const raw = rawLister<V1Service>(cp.admin, `/api/v1/namespaces/${NS}/services`);
    const rawItems: V1Service[] = [];
    const tokens: (string | undefined)[] = [];
    let next: string | undefined;
    do {
      const page = await raw(next === undefined ? { limit: 4 } : { limit: 4, _continue: next });
      expect(page.items.length).toBeLessThanOrEqual(4);
      rawItems.push(...page.items);
      next = page.metadata?._continue || undefined;
      tokens.push(next);
    } while (next !== undefined);
    expect(tokens.length).toBeGreaterThan(2);
    const typed = (await core.listNamespacedService({ namespace: NS })).items;
    // The same content; only the timestamp's type differs (a string as JSON has it, a Date from ObjectSerializer), as in watch events.
    const plain = (svc: V1Service) => {
      const slim = slimService(svc);
      return { ...slim, metadata: { ...slim.metadata, creationTimestamp: new Date(slim.metadata!.creationTimestamp!).getTime() } };
    };
    expect(rawItems.map(plain)).toEqual(typed.map(plain));
    expect(typeof rawItems[0]!.metadata!.creationTimestamp).toBe('string');

    const refused = await raw({ limit: 4, _continue: 'not-a-continue-token' }).catch((err: unknown) => err);
    expect(refused).toBeInstanceOf(ListError);
    expect((refused as ListError).code).toBe(400);
    expect((refused as ListError).message).toMatch(/continue/i);
  });

  it("keeps whole objects without managedFields for callers with no transform (the controller's)", async () => {
    const informer = serviceInformer(cp.admin, { pageSize: 7 });
    informers.push(informer);
    informer.start();
    await informer.synced;
    const cached = informer.get('svc-5', NS)!;
    expect(cached.spec?.clusterIP).toBeDefined();
    expect(cached.metadata?.managedFields).toBeUndefined();
    expect(informer.list(NS)).toHaveLength(COUNT - 1);
  });
});
