// What the agent keeps of each object its informers cache, in the spirit of
// client-go's SetTransform: at 10,000 Services a whole Service or
// EndpointSlice (uids, ownerReferences, targetRefs, clusterIPs, labels,
// timestamps, other controllers' conditions) costs several times the fields
// the agent reads. A shape names what is kept: `true` keeps a value as it
// is, `'intern'` keeps it too but shares one copy of each distinct string
// (for values repeated in every object: a node name, the class, a node
// address), an object keeps those keys of an object, a one-element array
// projects every element of a list.
//
// Projection never throws and never changes a value it keeps: where the
// object does not have the expected form (a list that is not a list, a
// string where an object should be) the value is kept as it is, so that the
// model meets the same malformation, and reports it the same way, as it
// would in the whole object. Only keys that are present are copied.
//
// The shapes below are what agent/model.ts, agent/pipeline.ts, agent/agent.ts
// and lib/contract.ts read; a field read there and not listed here is a bug
// that test/unit/slim.test.ts exists to catch. The controller reads far more
// (every condition, NodePorts, annotations) and keeps whole objects.
import type { KubernetesObject, V1EndpointSlice, V1Node, V1Service } from '@kubernetes/client-node';
import { SOURCE_RANGES_ANNOTATION } from './contract.ts';

export type Shape = true | 'intern' | readonly [Shape] | { readonly [key: string]: Shape };

/** Kept of every object: ListWatch keys its cache by namespace and name and compares resourceVersions. */
const META = { name: true, namespace: 'intern', resourceVersion: true } as const;

export const SERVICE_SHAPE: Shape = {
  metadata: {
    ...META,
    // Events name the Service by uid; uid and resourceVersion also break ties in the model's order.
    uid: true,
    // The oldest Service wins a frontend both claim.
    creationTimestamp: true,
    annotations: { [SOURCE_RANGES_ANNOTATION]: true },
  },
  spec: {
    type: 'intern',
    loadBalancerClass: 'intern',
    externalTrafficPolicy: 'intern',
    loadBalancerSourceRanges: true,
    sessionAffinity: 'intern',
    sessionAffinityConfig: { clientIP: { timeoutSeconds: true } },
    ports: [{ name: 'intern', protocol: 'intern', port: true }],
  },
  status: { loadBalancer: { ingress: [{ ip: 'intern', ports: [{ port: true, protocol: 'intern', error: 'intern' }] }] } },
};

export const ENDPOINT_SLICE_SHAPE: Shape = {
  metadata: { ...META, labels: { 'kubernetes.io/service-name': true } },
  addressType: 'intern',
  ports: [{ name: 'intern', protocol: 'intern', port: true }],
  endpoints: [{ addresses: true, nodeName: 'intern', conditions: { ready: true, serving: true, terminating: true } }],
};

export const NODE_SHAPE: Shape = {
  // Events about the Node name it by uid.
  metadata: { ...META, uid: true },
  status: { addresses: [{ type: true, address: true }] },
};

/**
 * One copy of each distinct interned string. Interned fields take few
 * values (nodes, classes, namespaces, protocols); the bound only keeps a
 * cluster that breaks that from growing the table without end.
 */
const interned = new Map<string, string>();
const MAX_INTERNED = 50_000;

function intern(value: unknown): unknown {
  if (typeof value !== 'string') return value;
  const known = interned.get(value);
  if (known !== undefined) return known;
  if (interned.size < MAX_INTERNED) interned.set(value, value);
  return value;
}

/** `value` reduced to `shape`. */
export function project(value: unknown, shape: Shape): unknown {
  if (shape === 'intern') return intern(value);
  if (shape === true || value === null || typeof value !== 'object') return value;
  if (Array.isArray(shape)) {
    if (!Array.isArray(value)) return value;
    const out = new Array<unknown>(value.length);
    for (let i = 0; i < value.length; i++) out[i] = project(value[i], shape[0]);
    return out;
  }
  if (Array.isArray(value)) return value;
  const src = value as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const key in shape as Record<string, Shape>) {
    if (Object.hasOwn(src, key) && src[key] !== undefined) out[key] = project(src[key], (shape as Record<string, Shape>)[key]!);
  }
  return out;
}

/** An informer transform keeping `shape` of each object. */
export function slimmer<T extends KubernetesObject>(shape: Shape): (obj: T) => T {
  return (obj) => project(obj, shape) as T;
}

export const slimService = slimmer<V1Service>(SERVICE_SHAPE);
export const slimEndpointSlice = slimmer<V1EndpointSlice>(ENDPOINT_SLICE_SHAPE);
export const slimNode = slimmer<V1Node>(NODE_SHAPE);
