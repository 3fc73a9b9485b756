// The collections pier watches, each as a ready-made ResilientInformer.
import {
  CoordinationV1Api,
  CoreV1Api,
  DiscoveryV1Api,
  type KubeConfig,
  type V1EndpointSlice,
  type V1Lease,
  type V1Node,
  type V1Service,
} from '@kubernetes/client-node';
import { ResilientInformer, type ResilientInformerOptions } from './informer.ts';

type Extra = Pick<ResilientInformerOptions<never>, 'log' | 'backoff' | 'labelSelector' | 'fieldSelector'>;

export function serviceInformer(kc: KubeConfig, extra: Extra = {}): ResilientInformer<V1Service> {
  const core = kc.makeApiClient(CoreV1Api);
  return new ResilientInformer<V1Service>({
    kc,
    name: 'services',
    path: '/api/v1/services',
    list: () => core.listServiceForAllNamespaces({ labelSelector: extra.labelSelector, fieldSelector: extra.fieldSelector }),
    ...extra,
  });
}

export function nodeInformer(kc: KubeConfig, extra: Extra = {}): ResilientInformer<V1Node> {
  const core = kc.makeApiClient(CoreV1Api);
  return new ResilientInformer<V1Node>({
    kc,
    name: 'nodes',
    path: '/api/v1/nodes',
    list: () => core.listNode({ labelSelector: extra.labelSelector, fieldSelector: extra.fieldSelector }),
    ...extra,
  });
}

export function endpointSliceInformer(kc: KubeConfig, extra: Extra = {}): ResilientInformer<V1EndpointSlice> {
  const discovery = kc.makeApiClient(DiscoveryV1Api);
  return new ResilientInformer<V1EndpointSlice>({
    kc,
    name: 'endpointslices',
    path: '/apis/discovery.k8s.io/v1/endpointslices',
    list: () => discovery.listEndpointSliceForAllNamespaces({ labelSelector: extra.labelSelector, fieldSelector: extra.fieldSelector }),
    ...extra,
  });
}

export function leaseInformer(kc: KubeConfig, namespace: string, extra: Extra = {}): ResilientInformer<V1Lease> {
  const coordination = kc.makeApiClient(CoordinationV1Api);
  return new ResilientInformer<V1Lease>({
    kc,
    name: 'leases',
    path: `/apis/coordination.k8s.io/v1/namespaces/${encodeURIComponent(namespace)}/leases`,
    list: () => coordination.listNamespacedLease({ namespace, labelSelector: extra.labelSelector, fieldSelector: extra.fieldSelector }),
    ...extra,
  });
}
