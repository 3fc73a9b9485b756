// The agent's informer projections (lib/slim.ts) and the informer's paged
// list (lib/informer.ts). The proof that a projection keeps every field the
// agent reads: the agent's model and rules from projected objects equal those
// from whole objects as the API server returns them, for generated clusters,
// for clusters with one broken Service, and for objects with any one value
// replaced by something of the wrong type.
import type { KubernetesListObject, V1EndpointSlice, V1Node, V1Service } from '@kubernetes/client-node';
import { ObjectSerializer } from '@kubernetes/client-node/dist/gen/models/ObjectSerializer.js';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { nodeAddresses } from '../../agent/agent.ts';
import { type ModelInput } from '../../agent/engine/model.ts';

import { dropManagedFields, listAll, type ListPage } from '../../lib/informer.ts';
import { project, slimEndpointSlice, slimNode, slimService, SERVICE_SHAPE } from '../../lib/slim.ts';
import { CLASS, MARKS, NODE, NODE_V4, corrupt, corruptionArb, toInput, worldArb, type World } from './agent-fixtures.ts';
import { buildModel, renderRuleset } from '../support/oracle.ts';

const clone = <T>(x: T): T => structuredClone(x);

/** What the API server adds to a Service: defaults, bookkeeping, and other controllers' fields. */
function asServerService(svc: V1Service, i: number): V1Service {
  const s = clone(svc);
  s.metadata = {
    ...s.metadata,
    uid: s.metadata?.uid ?? `0000000${i}-0000-4000-8000-000000000000`,
    resourceVersion: String(1000 + i),
    generation: 1,
    labels: { app: s.metadata?.name ?? '', 'app.kubernetes.io/part-of': 'shop' },
    annotations: { ...s.metadata?.annotations, 'kubectl.kubernetes.io/last-applied-configuration': JSON.stringify(svc) },
    managedFields: [{ manager: 'kubectl', operation: 'Update', apiVersion: 'v1', fieldsType: 'FieldsV1', fieldsV1: { 'f:spec': { 'f:ports': {} } } }],
  };
  s.spec = {
    ...s.spec,
    clusterIP: `198.18.0.${i + 1}`,
    clusterIPs: [`198.18.0.${i + 1}`],
    ipFamilies: ['IPv4'],
    ipFamilyPolicy: 'SingleStack',
    selector: { app: s.metadata.name ?? '' },
    sessionAffinity: 'None',
    internalTrafficPolicy: 'Cluster',
    allocateLoadBalancerNodePorts: true,
    ports: s.spec?.ports?.map((p, k) => ({ ...p, nodePort: 30000 + i * 10 + k, appProtocol: 'http' })),
  };
  s.status = {
    ...s.status,
    conditions: [
      { type: 'pier.dev/Ready', status: 'True', reason: 'Serving', message: 'served', lastTransitionTime: new Date(0) },
      { type: 'example.com/Other', status: 'False', reason: 'Other', message: 'another controller', lastTransitionTime: new Date(0) },
    ],
  };
  return s;
}

function asServerSlice(slice: V1EndpointSlice, i: number): V1EndpointSlice {
  const s = clone(slice);
  s.metadata = {
    ...s.metadata,
    uid: `0000000${i}-0000-4000-8000-000000000001`,
    resourceVersion: String(5000 + i),
    generateName: `${s.metadata?.name}-`,
    labels: { ...s.metadata?.labels, 'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io' },
    annotations: { 'endpoints.kubernetes.io/last-change-trigger-time': '2024-01-01T00:00:00Z' },
    ownerReferences: [{ apiVersion: 'v1', kind: 'Service', name: 'x', uid: 'u', controller: true, blockOwnerDeletion: true }],
    managedFields: [{ manager: 'kube-controller-manager', operation: 'Update', fieldsType: 'FieldsV1', fieldsV1: { 'f:endpoints': {} } }],
  };
  s.endpoints = s.endpoints?.map((e, k) => ({ ...e, zone: 'a', hostname: `h${k}`, targetRef: { kind: 'Pod', namespace: 'shop', name: `pod-${k}`, uid: `p${k}` }, hints: { forZones: [{ name: 'a' }] } }));
  return s;
}

function asServer(input: ModelInput): ModelInput {
  return { ...input, services: input.services.map(asServerService), slices: input.slices.map(asServerSlice) };
}

function slimmed(input: ModelInput): ModelInput {
  return { ...input, services: input.services.map(slimService), slices: input.slices.map(slimEndpointSlice) };
}

/** What the agent computes from an input: the model, and both families' rules. */
function agentView(input: ModelInput) {
  const model = buildModel(input);
  return { model, ipv4: renderRuleset(model.ipv4, { marks: MARKS }), ipv6: renderRuleset(model.ipv6, { marks: MARKS }) };
}

/** Every path to a value in an object, for replacing one. */
function paths(value: unknown, prefix: (string | number)[] = []): (string | number)[][] {
  if (value === null || typeof value !== 'object') return [prefix];
  const out: (string | number)[][] = prefix.length > 0 ? [prefix] : [];
  for (const [k, v] of Object.entries(value)) out.push(...paths(v, [...prefix, Array.isArray(value) ? Number(k) : k]));
  return out;
}

function replaceAt(root: unknown, path: (string | number)[], value: unknown): void {
  let at = root as Record<string | number, unknown>;
  for (const k of path.slice(0, -1)) at = at[k] as Record<string | number, unknown>;
  at[path[path.length - 1]!] = value;
}

const wrongValue = fc.oneof(fc.constant(null), fc.string({ maxLength: 4 }), fc.integer({ min: -2, max: 70000 }), fc.boolean(), fc.constant([]), fc.constant({}), fc.constant([1, 'x']));

describe('slim projections keep what the agent reads', () => {
  it('the model and rules from slim objects equal those from whole objects', () => {
    fc.assert(
      fc.property(worldArb, (world) => {
        const full = asServer(toInput(world));
        expect(agentView(slimmed(full))).toEqual(agentView(full));
      }),
      { numRuns: 200 },
    );
  });

  it('a broken Service is reported the same way from slim objects', () => {
    fc.assert(
      fc.property(worldArb, corruptionArb, (world, c) => {
        const full = asServer(toInput(world));
        corrupt(world, full, c);
        const view = agentView(slimmed(full));
        expect(view).toEqual(agentView(full));
      }),
      { numRuns: 200 },
    );
  });

  it('any one value of the wrong type meets the model as it would in the whole object', () => {
    fc.assert(
      fc.property(worldArb, fc.nat(), fc.nat(), wrongValue, (world, which, where, value) => {
        const full = asServer(toInput(world));
        const objects: object[] = [...full.services, ...full.slices];
        const target = objects[which % objects.length]!;
        const all = paths(target);
        replaceAt(target, all[where % all.length]!, clone(value));
        expect(agentView(slimmed(full))).toEqual(agentView(full));
      }),
      { numRuns: 300 },
    );
  });

  it('a status port whose protocol disagrees with the spec is reported the same way', () => {
    const world: World = {
      services: [
        {
          name: 'web', namespace: 'shop', cls: CLASS, local: false, ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: 8080 }],
          ingress: [NODE_V4[0]!], errors: [[false]], external: [80], ranges: [], rangesInAnnotation: false,
          endpoints: [{ v6: false, host: 5, node: NODE, ready: true, serving: true, terminating: false }], slices: 1, created: 0, affinity: undefined,
        },
      ],
    };
    const full = asServer(toInput(world));
    full.services[0]!.status!.loadBalancer!.ingress![0]!.ports![0]!.protocol = 'UDP';
    const view = agentView(slimmed(full));
    expect(view.model.problems.map((p) => p.reason)).toEqual(['StatusPortMismatch']);
    expect(view).toEqual(agentView(full));
  });

  it('objects as the list call decodes them (client-node model classes, Dates) project to the same model', () => {
    fc.assert(
      fc.property(worldArb, (world) => {
        const full = asServer(toInput(world));
        const plain: ModelInput = JSON.parse(JSON.stringify(full));
        const decoded: ModelInput = {
          ...plain,
          services: ObjectSerializer.deserialize(plain.services, 'Array<V1Service>', ''),
          slices: ObjectSerializer.deserialize(plain.slices, 'Array<V1EndpointSlice>', ''),
        };
        expect(agentView(slimmed(decoded))).toEqual(agentView(plain));
      }),
      { numRuns: 50 },
    );
  });

  it("keeps the Node's addresses and uid", () => {
    const node: V1Node = {
      metadata: { name: NODE, uid: 'n-uid', resourceVersion: '7', labels: { 'kubernetes.io/hostname': NODE }, managedFields: [{ manager: 'kubelet' }] },
      spec: { podCIDR: '198.19.0.0/24', providerID: 'x' },
      status: {
        addresses: [
          { type: 'InternalIP', address: '198.51.100.11' },
          { type: 'ExternalIP', address: '203.0.113.11' },
          { type: 'Hostname', address: NODE },
        ],
        conditions: [{ type: 'Ready', status: 'True' }],
        images: [{ names: ['registry.example/app:1'], sizeBytes: 1 }],
        nodeInfo: { kubeletVersion: 'v1.34.0' } as never,
      },
    };
    const slim = slimNode(node);
    expect(nodeAddresses(slim)).toEqual(nodeAddresses(node));
    expect(slim.metadata).toEqual({ name: NODE, uid: 'n-uid', resourceVersion: '7' });
    expect(slim.status).toEqual({ addresses: node.status!.addresses });
  });
});

describe('slim projections drop the rest', () => {
  it('leaves out bookkeeping and fields the agent never reads, and keeps cache keys', () => {
    const full = asServer(toInput(fc.sample(worldArb, { numRuns: 1, seed: 7 })[0]!));
    const svc = slimService(full.services[0]!);
    expect(svc.metadata?.managedFields).toBeUndefined();
    expect(svc.metadata?.labels).toBeUndefined();
    expect(svc.spec?.clusterIPs).toBeUndefined();
    expect(svc.status?.conditions).toBeUndefined();
    expect(Object.keys(svc.metadata ?? {}).sort()).toEqual(expect.arrayContaining(['name', 'namespace', 'resourceVersion', 'uid']));
    const slice = slimEndpointSlice(full.slices[0]!);
    expect(slice.metadata?.ownerReferences).toBeUndefined();
    expect(slice.endpoints?.[0]?.targetRef).toBeUndefined();
    expect(slice.metadata?.resourceVersion).toBe(full.slices[0]!.metadata?.resourceVersion);
    const size = (x: unknown) => JSON.stringify(x).length;
    expect(size(full.services.map(slimService))).toBeLessThan(size(full.services) / 3);
    expect(size(full.slices.map(slimEndpointSlice))).toBeLessThan(size(full.slices) / 2);
  });

  it('never changes its argument, and projects a projection to itself', () => {
    fc.assert(
      fc.property(worldArb, (world) => {
        const full = asServer(toInput(world));
        const before = clone(full);
        const once = slimmed(full);
        expect(full).toEqual(before);
        expect(slimmed(once)).toEqual(once);
      }),
      { numRuns: 50 },
    );
  });

  it('keeps a value of an unexpected form as it is', () => {
    expect(project({ spec: { ports: 'eighty' } }, SERVICE_SHAPE)).toEqual({ spec: { ports: 'eighty' } });
    expect(project({ spec: 'x', status: null }, SERVICE_SHAPE)).toEqual({ spec: 'x', status: null });
    expect(project({ metadata: ['a'] }, SERVICE_SHAPE)).toEqual({ metadata: ['a'] });
    expect(project(undefined, SERVICE_SHAPE)).toBeUndefined();
  });
});

describe('dropManagedFields', () => {
  it('copies the metadata without managedFields and leaves its argument alone', () => {
    const svc: V1Service = { metadata: { name: 'a', namespace: 'n', resourceVersion: '1', managedFields: [{ manager: 'm' }] }, spec: { type: 'LoadBalancer' } };
    const out = dropManagedFields(svc);
    expect(out).toEqual({ metadata: { name: 'a', namespace: 'n', resourceVersion: '1' }, spec: { type: 'LoadBalancer' } });
    expect(svc.metadata?.managedFields).toHaveLength(1);
    const bare: V1Service = { metadata: { name: 'b' } };
    expect(dropManagedFields(bare)).toBe(bare);
  });
});

describe('listAll', () => {
  /** A collection served in pages from a snapshot, as the API server does; `expireAt` makes that continue token fail once with 410. */
  function pager(items: V1Service[], opts: { expireAt?: number; firstFails?: number } = {}) {
    const calls: ListPage[] = [];
    let expire = opts.expireAt;
    let firstFails = opts.firstFails ?? 0;
    const list = async (page: ListPage): Promise<KubernetesListObject<V1Service>> => {
      calls.push(page);
      const start = page._continue === undefined ? 0 : Number(page._continue);
      if (start === 0 && firstFails-- > 0) throw Object.assign(new Error('Gone'), { code: 410 });
      if (page._continue !== undefined && start === expire) {
        expire = undefined;
        throw Object.assign(new Error('Expired: the continue token is too old'), { code: 410 });
      }
      const end = Math.min(items.length, start + page.limit);
      return { metadata: { resourceVersion: '99', ...(end < items.length ? { _continue: String(end) } : {}) }, items: items.slice(start, end) };
    };
    return { list, calls };
  }
  const items = Array.from({ length: 23 }, (_, i): V1Service => ({ metadata: { name: `s${i}`, namespace: 'n', resourceVersion: String(i), managedFields: [{}] } }));

  it('follows continue tokens to the end and transforms every item', async () => {
    const p = pager(items);
    const out = await listAll(p.list, dropManagedFields, 10);
    expect(out.items.map((i) => i.metadata?.name)).toEqual(items.map((i) => i.metadata?.name));
    expect(out.items.every((i) => i.metadata?.managedFields === undefined)).toBe(true);
    expect(out.metadata?.resourceVersion).toBe('99');
    expect(p.calls).toEqual([{ limit: 10 }, { limit: 10, _continue: '10' }, { limit: 10, _continue: '20' }]);
  });

  it('hands over each page as it arrives, the next one already requested, as the very objects the list returns', async () => {
    const p = pager(items);
    const handed: { names: string[]; requested: number; objects: V1Service[] }[] = [];
    const out = await listAll(p.list, dropManagedFields, 10, (page) => handed.push({ names: page.map((i) => i.metadata!.name!), requested: p.calls.length, objects: [...page] }));
    expect(handed.map((h) => h.names)).toEqual([0, 10, 20].map((from) => items.slice(from, from + 10).map((i) => i.metadata!.name!)));
    // Pages 2 and 3 were on their way while pages 1 and 2 were handed over.
    expect(handed.map((h) => h.requested)).toEqual([2, 3, 3]);
    expect(handed.flatMap((h) => h.objects)).toEqual(out.items);
    handed.flatMap((h) => h.objects).forEach((o, i) => expect(o).toBe(out.items[i]));
  });

  it('starts over when a continue token expires, so all pages come from one snapshot', async () => {
    const p = pager(items, { expireAt: 20 });
    const out = await listAll(p.list, (x) => x, 10);
    expect(out.items).toHaveLength(23);
    expect(p.calls.map((c) => c._continue)).toEqual([undefined, '10', '20', undefined, '10', '20']);
  });

  it('leaves a failing first page to the informer', async () => {
    const p = pager(items, { firstFails: 1 });
    await expect(listAll(p.list, (x) => x, 10)).rejects.toThrow('Gone');
  });
});
