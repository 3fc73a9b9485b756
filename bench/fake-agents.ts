// The controller benchmarks' stand-in for agents: for each node, a fresh
// agent Lease that says both families forward, renewed as the agent does by
// default, so that the controller allocates without real agents running.
import type { KubeConfig } from '@kubernetes/client-node';
import {
  AGENT_LEASE_LABEL,
  AGENT_LEASE_LABEL_VALUE,
  LEASE_FORWARDING_IPV4,
  LEASE_FORWARDING_IPV6,
  LEASE_IPTABLES_BACKEND,
  LEASE_NODE,
  LEASE_VERSION,
  agentLeaseName,
} from '../lib/contract.ts';
import { LeaseRenewer } from '../lib/lease.ts';

export function fakeAgents(kc: KubeConfig, nodeNames: readonly string[], namespace: string): LeaseRenewer[] {
  return nodeNames.map((name) => {
    const r = new LeaseRenewer({
      kc,
      namespace,
      name: agentLeaseName(name),
      holder: name,
      durationSeconds: 20,
      renewEveryMs: 5000,
      labels: { [AGENT_LEASE_LABEL]: AGENT_LEASE_LABEL_VALUE },
      annotations: () => ({ [LEASE_NODE]: name, [LEASE_FORWARDING_IPV4]: 'true', [LEASE_FORWARDING_IPV6]: 'true', [LEASE_IPTABLES_BACKEND]: 'nft', [LEASE_VERSION]: 'bench' }),
    });
    r.start();
    return r;
  });
}
