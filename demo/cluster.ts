// The demo's Kubernetes objects. The test cluster has no kubelet and no
// controller-manager, so the demo writes what they would (the Nodes through
// registerLabNodes, the EndpointSlices naming the Service's pods here). The
// Service itself is what a user writes.
import { CoordinationV1Api, CoreV1Api, DiscoveryV1Api, type V1LoadBalancerIngress, type V1Service } from '@kubernetes/client-node';
import { agentLeaseName, LEADER_LEASE_NAME, LEASE_FORWARDING_IPV4, LEASE_FORWARDING_IPV6 } from '../lib/contract.ts';
import { ensureNamespace, statusOf } from '../test/cluster/controlplane.ts';
import { ECHO_PORT, type Lab } from '../test/lab/lab.ts';
import { endpointSlice, lbService } from '../test/support/objects.ts';
import { eventually } from '../test/support/wait.ts';

export const NAMESPACE = 'demo';
export const SERVICE = 'web';
export const SERVICE_PORT = 80;


/**
 * The user's part: a dual-stack LoadBalancer Service of pier's class, TCP and
 * UDP on port 80 to the pods' 8080. Local traffic policy, so that each node
 * sends to its own pod and the pod sees the client's real address.
 */
export async function createService(core: CoreV1Api): Promise<void> {
  await ensureNamespace(core, NAMESPACE);
  await core.createNamespacedService({
    namespace: NAMESPACE,
    body: lbService(
      NAMESPACE,
      SERVICE,
      [
        { name: 'http', port: SERVICE_PORT, targetPort: ECHO_PORT, protocol: 'TCP' },
        { name: 'echo-udp', port: SERVICE_PORT, targetPort: ECHO_PORT, protocol: 'UDP' },
      ],
      { externalTrafficPolicy: 'Local', ipFamilyPolicy: 'PreferDualStack', ipFamilies: ['IPv4', 'IPv6'] },
    ),
  });
}

/** Plays the EndpointSlice controller: one slice per family listing every lab pod as ready. */
export async function publishEndpoints(discovery: DiscoveryV1Api, lab: Lab): Promise<void> {
  for (const [family, type] of [['v4', 'IPv4'], ['v6', 'IPv6']] as const) {
    await discovery.createNamespacedEndpointSlice({
      namespace: NAMESPACE,
      body: endpointSlice(
        NAMESPACE,
        SERVICE,
        type,
        lab.pods.map((p) => ({ address: p[family], nodeName: p.node })),
        [
          { name: 'http', port: ECHO_PORT, protocol: 'TCP' },
          { name: 'echo-udp', port: ECHO_PORT, protocol: 'UDP' },
        ],
      ),
    });
  }
}

/** Waits until the controller lists `count` addresses, every port served (no error). */
export async function waitForIngress(core: CoreV1Api, count: number): Promise<{ svc: V1Service; ingress: V1LoadBalancerIngress[] }> {
  return eventually(
    `the controller to write ${count} addresses into ${NAMESPACE}/${SERVICE}'s status`,
    async () => {
      const svc = await core.readNamespacedService({ name: SERVICE, namespace: NAMESPACE });
      const ingress = svc.status?.loadBalancer?.ingress ?? [];
      const served = ingress.length === count && ingress.every((i) => (i.ports ?? []).length > 0 && i.ports!.every((p) => !p.error));
      return served ? { svc, ingress } : false;
    },
    { timeoutMs: 60_000, intervalMs: 100 },
  );
}

/**
 * Until pier is up, as the API shows it: the controller holds its leader
 * Lease and every agent's Lease says its node forwards IPv4 and IPv6.
 */
export async function waitForPier(leases: CoordinationV1Api, lab: Lab, namespace = 'pier-system'): Promise<void> {
  await eventually(
    'the controller to lead and every agent to report a node that forwards',
    async () => {
      const read = (name: string) =>
        leases.readNamespacedLease({ name, namespace }).catch((err: unknown) => {
          if (statusOf(err) === 404) return undefined;
          throw err;
        });
      const leader = await read(LEADER_LEASE_NAME);
      if (!leader?.spec?.holderIdentity) return false;
      for (const n of lab.nodes) {
        const a = (await read(agentLeaseName(n.name)))?.metadata?.annotations ?? {};
        if (a[LEASE_FORWARDING_IPV4] !== 'true' || a[LEASE_FORWARDING_IPV6] !== 'true') return false;
      }
      return true;
    },
    { timeoutMs: 60_000, intervalMs: 100 },
  );
}
