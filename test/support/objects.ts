// Builders for the Kubernetes objects tests create. There is no kubelet or
// controller-manager in the test cluster, so Nodes and EndpointSlices are
// written by the tests themselves, the way those components would.
import type { V1EndpointSlice, V1Node, V1Service } from '@kubernetes/client-node';

export function node(name: string, addresses: { type: 'InternalIP' | 'ExternalIP'; address: string }[], ready = true): V1Node {
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: { name, labels: { 'kubernetes.io/hostname': name } },
    status: {
      addresses: [...addresses, { type: 'Hostname', address: name }],
      conditions: [{ type: 'Ready', status: ready ? 'True' : 'False', reason: ready ? 'KubeletReady' : 'KubeletNotReady', lastHeartbeatTime: new Date(), lastTransitionTime: new Date() }],
    },
  };
}

export function lbService(
  namespace: string,
  name: string,
  ports: { name?: string; port: number; targetPort?: number | string; protocol?: 'TCP' | 'UDP' | 'SCTP' }[],
  extra: Partial<NonNullable<V1Service['spec']>> = {},
): V1Service {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace, name },
    spec: {
      type: 'LoadBalancer',
      loadBalancerClass: 'pier.dev/lb',
      selector: { app: name },
      ports: ports.map((p) => ({ protocol: 'TCP', targetPort: p.port, ...p }) as never),
      ...extra,
    },
  };
}

export function endpointSlice(
  namespace: string,
  service: string,
  addressType: 'IPv4' | 'IPv6',
  endpoints: { address: string; nodeName?: string; ready?: boolean; serving?: boolean; terminating?: boolean }[],
  ports: { name?: string; port: number; protocol?: 'TCP' | 'UDP' | 'SCTP' }[],
  suffix = addressType.toLowerCase(),
): V1EndpointSlice {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { namespace, name: `${service}-${suffix}`, labels: { 'kubernetes.io/service-name': service } },
    addressType,
    endpoints: endpoints.map((e) => ({
      addresses: [e.address],
      nodeName: e.nodeName,
      conditions: { ready: e.ready ?? true, serving: e.serving ?? e.ready ?? true, terminating: e.terminating ?? false },
    })),
    ports: ports.map((p) => ({ protocol: 'TCP', ...p })),
  };
}
