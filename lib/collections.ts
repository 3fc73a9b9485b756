// The collections pier watches, each as a ready-made ResilientInformer. The
// agent passes a transform from lib/slim.ts to keep only what it reads, and
// lists as parsed JSON (lib/rawlist.ts); the controller keeps whole objects
// (without managedFields), listed through client-node's model classes.
import {
  CoordinationV1Api,
  CoreV1Api,
  DiscoveryV1Api,
  type KubeConfig,
  type KubernetesObject,
  type V1EndpointSlice,
  type V1Lease,
  type V1Node,
  type V1Service,
} from '@kubernetes/client-node';
import { ResilientInformer, type ResilientInformerOptions } from './informer.ts';
import { rawLister } from './rawlist.ts';

type Extra<T extends KubernetesObject> = Pick<ResilientInformerOptions<T>, 'log' | 'backoff' | 'labelSelector' | 'fieldSelector' | 'transform' | 'pageSize' | 'onListPage'> & {
  /** List as parsed JSON, the shape watch events have, instead of client-node's model classes (lib/rawlist.ts). */
  raw?: boolean;
};

export function serviceInformer(kc: KubeConfig, extra: Extra<V1Service> = {}): ResilientInformer<V1Service> {
  const core = kc.makeApiClient(CoreV1Api);
  return new ResilientInformer<V1Service>({
    kc,
    name: 'services',
    path: '/api/v1/services',
    list: extra.raw ? rawLister(kc, '/api/v1/services', extra) : (page) => core.listServiceForAllNamespaces({ labelSelector: extra.labelSelector, fieldSelector: extra.fieldSelector, ...page }),
    ...extra,
  });
}

export function nodeInformer(kc: KubeConfig, extra: Extra<V1Node> = {}): ResilientInformer<V1Node> {
  const core = kc.makeApiClient(CoreV1Api);
  return new ResilientInformer<V1Node>({
    kc,
    name: 'nodes',
    path: '/api/v1/nodes',
    list: extra.raw ? rawLister(kc, '/api/v1/nodes', extra) : (page) => core.listNode({ labelSelector: extra.labelSelector, fieldSelector: extra.fieldSelector, ...page }),
    ...extra,
  });
}

export function endpointSliceInformer(kc: KubeConfig, extra: Extra<V1EndpointSlice> = {}): ResilientInformer<V1EndpointSlice> {
  const discovery = kc.makeApiClient(DiscoveryV1Api);
  return new ResilientInformer<V1EndpointSlice>({
    kc,
    name: 'endpointslices',
    path: '/apis/discovery.k8s.io/v1/endpointslices',
    list: extra.raw
      ? rawLister(kc, '/apis/discovery.k8s.io/v1/endpointslices', extra)
      : (page) => discovery.listEndpointSliceForAllNamespaces({ labelSelector: extra.labelSelector, fieldSelector: extra.fieldSelector, ...page }),
    ...extra,
  });
}

export function leaseInformer(kc: KubeConfig, namespace: string, extra: Extra<V1Lease> = {}): ResilientInformer<V1Lease> {
  const coordination = kc.makeApiClient(CoordinationV1Api);
  return new ResilientInformer<V1Lease>({
    kc,
    name: 'leases',
    path: `/apis/coordination.k8s.io/v1/namespaces/${encodeURIComponent(namespace)}/leases`,
    list: (page) => coordination.listNamespacedLease({ namespace, labelSelector: extra.labelSelector, fieldSelector: extra.fieldSelector, ...page }),
    ...extra,
  });
}
