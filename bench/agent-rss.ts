// The agent's memory at scale, in a process of its own (bench/agent.ts runs
// this, compiled to JavaScript as the agent ships, and reads the JSON line it
// prints). It holds what a real agent holds: the agent's module graph,
// Services and EndpointSlices as the agent's informers cache them (each list
// page's JSON text parsed, as lib/rawlist.ts does, then projected by
// lib/slim.ts, kept in per-namespace maps),
// and pier's sync state after a full sync into a scratch namespace through
// the Applier, then a no-op and a one-Service change as a watch event
// delivers it (plain JSON, projected the same way). bench/agent-rss-live.ts
// measures the same against a real API server.
//
//   node --expose-gc agent-rss.js <network namespace> <ports> <backend>
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';

const [ns = '', portsArg = '10000', backendArg = 'nft'] = process.argv.slice(2);
const n = Number(portsArg);
const gc = (globalThis as { gc?: () => void }).gc;
if (!gc || !ns) throw new Error('usage: node --expose-gc agent-rss.js <netns> <ports> <backend>');

interface Stage {
  rss: number;
  heapTotal: number;
  heapUsed: number;
  external: number;
}

async function settle(): Promise<Stage> {
  for (let i = 0; i < 3; i++) {
    gc!();
    await new Promise((r) => setTimeout(r, 50));
  }
  const m = process.memoryUsage();
  return { rss: m.rss, heapTotal: m.heapTotal, heapUsed: m.heapUsed, external: m.external };
}

const stages: Record<string, Stage> = {};
stages['node'] = await settle();

// The agent's own module graph (client-node, prom-client, pino, pier's lib),
// then what this measurement drives directly.
await import('../agent/agent.ts');
const { SyncPipeline } = await import('../test/support/pipeline.ts');
const { Applier } = await import('../agent/iptables/applier.ts');
const { Xtables } = await import('../agent/iptables/xtables.ts');
const { commandRunner } = await import('../lib/run.ts');
const { LOAD_BALANCER_CLASS } = await import('../lib/contract.ts');
const { slimEndpointSlice, slimService } = await import('../lib/slim.ts');
stages['modules'] = await settle();

const NODE = 'bench-node';
const NODE_IP = '198.51.100.11';
const time = '2024-05-01T10:00:00Z';
const uid = (kind: number, i: number) => `${kind.toString(16).padStart(8, '0')}-0000-4000-8000-${i.toString(16).padStart(12, '0')}`;

/** A Service as the API server returns it: defaults filled in, managed fields of the client that applied it and of pier's controller. */
function serviceJson(i: number): object {
  const name = `svc-${i}`;
  const port = 20000 + i;
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {
      name,
      namespace: 'bench',
      uid: uid(1, i),
      resourceVersion: String(100000 + i),
      creationTimestamp: time,
      labels: { app: name },
      managedFields: [
        {
          manager: 'kubectl-client-side-apply',
          operation: 'Update',
          apiVersion: 'v1',
          time,
          fieldsType: 'FieldsV1',
          fieldsV1: { 'f:metadata': { 'f:labels': { '.': {}, 'f:app': {} } }, 'f:spec': { 'f:loadBalancerClass': {}, 'f:ports': { '.': {}, 'k:{"port":80,"protocol":"TCP"}': { '.': {}, 'f:name': {}, 'f:port': {}, 'f:protocol': {}, 'f:targetPort': {} } }, 'f:selector': {}, 'f:type': {} } },
        },
        { manager: 'pier-controller', operation: 'Update', apiVersion: 'v1', time, fieldsType: 'FieldsV1', fieldsV1: { 'f:status': { 'f:loadBalancer': { 'f:ingress': {} } } }, subresource: 'status' },
      ],
    },
    spec: {
      ports: [{ name: 'p', protocol: 'TCP', port, targetPort: 8080, nodePort: 30000 + (i % 2767) }],
      selector: { app: name },
      clusterIP: `10.96.${(i >> 8) & 255}.${i & 255}`,
      clusterIPs: [`10.96.${(i >> 8) & 255}.${i & 255}`],
      type: 'LoadBalancer',
      sessionAffinity: 'None',
      externalTrafficPolicy: 'Cluster',
      ipFamilies: ['IPv4'],
      ipFamilyPolicy: 'SingleStack',
      allocateLoadBalancerNodePorts: true,
      loadBalancerClass: LOAD_BALANCER_CLASS,
      internalTrafficPolicy: 'Cluster',
    },
    status: { loadBalancer: { ingress: [{ ip: NODE_IP, ipMode: 'Proxy', ports: [{ port, protocol: 'TCP' }] }] } },
  };
}

/** An EndpointSlice as the EndpointSlice controller writes it; two endpoints; `generation` moves the first. */
function sliceJson(i: number, generation = 0): object {
  const name = `svc-${i}`;
  const address = (k: number) => `198.19.${(Math.floor((i * 2 + k) / 250) + (k === 0 ? generation : 0)) % 250}.${((i * 2 + k) % 250) + 1}`;
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {
      name: `${name}-x7k2p`,
      generateName: `${name}-`,
      namespace: 'bench',
      uid: uid(2, i),
      resourceVersion: String(200000 + i + generation),
      generation: 1 + generation,
      creationTimestamp: time,
      labels: { 'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io', 'kubernetes.io/service-name': name, app: name },
      annotations: { 'endpoints.kubernetes.io/last-change-trigger-time': time },
      ownerReferences: [{ apiVersion: 'v1', kind: 'Service', name, uid: uid(1, i), controller: true, blockOwnerDeletion: true }],
      managedFields: [
        {
          manager: 'kube-controller-manager',
          operation: 'Update',
          apiVersion: 'discovery.k8s.io/v1',
          time,
          fieldsType: 'FieldsV1',
          fieldsV1: {
            'f:addressType': {},
            'f:endpoints': {},
            'f:metadata': { 'f:annotations': { '.': {}, 'f:endpoints.kubernetes.io/last-change-trigger-time': {} }, 'f:generateName': {}, 'f:labels': { '.': {}, 'f:app': {}, 'f:endpointslice.kubernetes.io/managed-by': {}, 'f:kubernetes.io/service-name': {} }, 'f:ownerReferences': { '.': {}, [`k:{"uid":"${uid(1, i)}"}`]: {} } },
            'f:ports': {},
          },
        },
      ],
    },
    addressType: 'IPv4',
    endpoints: [0, 1].map((k) => ({
      addresses: [address(k)],
      conditions: { ready: true, serving: true, terminating: false },
      nodeName: NODE,
      targetRef: { kind: 'Pod', namespace: 'bench', name: `${name}-7d9f8-${k}`, uid: uid(3, i * 2 + k) },
    })),
    ports: [{ name: 'p', protocol: 'TCP', port: 8080 }],
  };
}

/** client-node's ListWatch cache: namespace -> name -> object, listed by spreading the maps. */
class Cache<T extends { metadata?: { namespace?: string; name?: string } }> {
  private readonly objects = new Map<string, Map<string, T>>();
  set(obj: T): void {
    const space = obj.metadata?.namespace ?? '';
    let m = this.objects.get(space);
    if (!m) this.objects.set(space, (m = new Map()));
    m.set(obj.metadata?.name ?? '', obj);
  }
  list(): T[] {
    const all: T[] = [];
    for (const m of this.objects.values()) all.push(...m.values());
    return all;
  }
}

/** A list, in pages of 500 as the informer reads it, each page parsed from the response text as lib/rawlist.ts does. */
function* listOf<T>(kind: string, item: (i: number) => object): Generator<T> {
  for (let start = 0; start < n; start += 500) {
    const items: string[] = [];
    for (let i = start; i < Math.min(n, start + 500); i++) items.push(JSON.stringify(item(i)));
    const text = `{"apiVersion":"v1","kind":"${kind}","metadata":{"resourceVersion":"300000"},"items":[${items.join(',')}]}`;
    yield* (JSON.parse(text) as { items: T[] }).items;
  }
}

const services = new Cache<V1Service>();
const slices = new Cache<V1EndpointSlice>();
for (const s of listOf<V1Service>('ServiceList', serviceJson)) services.set(slimService(s));
for (const s of listOf<V1EndpointSlice>('EndpointSliceList', sliceJson)) slices.set(slimEndpointSlice(s));
stages['objects'] = await settle();

const pipeline = new SyncPipeline({ nodeName: NODE, model: { loadBalancerClass: LOAD_BALANCER_CLASS, defaultClass: false, maxPortsPerService: 256 }, render: { marks: { accept: 0x2000, masquerade: 0x1000 } } });
const applier = new Applier(new Xtables('ipv4', backendArg as 'nft' | 'legacy', commandRunner(['ip', 'netns', 'exec', ns])));
/** What Agent.sync does for one family. */
async function sync(): Promise<string> {
  void applier.prepare();
  const model = pipeline.model({ nodeAddresses: [NODE_IP], services: services.list(), slices: slices.list() });
  return (await applier.apply(pipeline.ruleset(model.ipv4))).mode;
}
const modes = [await sync()];
stages['synced'] = await settle();
modes.push(await sync());
// A watch event: the changed slice arrives as plain JSON.
slices.set(slimEndpointSlice(JSON.parse(JSON.stringify(sliceJson(0, 1))) as V1EndpointSlice));
modes.push(await sync());
stages['steady'] = await settle();

process.stdout.write(`${JSON.stringify({ ports: n, modes, stages })}\n`);
