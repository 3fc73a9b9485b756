// The controller benchmarks' stand-in for agents: for each node, a fresh
// agent Lease that says both families forward, renewed by the agent's own
// LeaseRenewer with the agent's defaults, so that the controller allocates
// without real agents running.
import type { KubeConfig } from '@kubernetes/client-node';
import { AGENT_LEASE_DURATION_MS, AGENT_LEASE_RENEW_MS } from '../cmd/agent.ts';
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

export interface FakeAgentOptions {
  renewEveryMs?: number;
  durationSeconds?: number;
  /**
   * Starts each renewer at a random moment within this many ms, as agents
   * started over time renew spread out; 0 starts all at once.
   */
  spreadMs?: number;
}

export function fakeAgent(kc: KubeConfig, name: string, namespace: string, opts: FakeAgentOptions = {}): LeaseRenewer {
  return new LeaseRenewer({
    kc,
    namespace,
    name: agentLeaseName(name),
    holder: name,
    durationSeconds: opts.durationSeconds ?? AGENT_LEASE_DURATION_MS / 1000,
    renewEveryMs: opts.renewEveryMs ?? AGENT_LEASE_RENEW_MS,
    labels: { [AGENT_LEASE_LABEL]: AGENT_LEASE_LABEL_VALUE },
    annotations: () => ({ [LEASE_NODE]: name, [LEASE_FORWARDING_IPV4]: 'true', [LEASE_FORWARDING_IPV6]: 'true', [LEASE_IPTABLES_BACKEND]: 'nft', [LEASE_VERSION]: 'bench' }),
  });
}

export function fakeAgents(kc: KubeConfig, nodeNames: readonly string[], namespace: string, opts: FakeAgentOptions = {}): LeaseRenewer[] {
  return nodeNames.map((name) => {
    const r = fakeAgent(kc, name, namespace, opts);
    if (opts.spreadMs) {
      const t = setTimeout(() => r.start(), Math.random() * opts.spreadMs);
      // Stopped before its start, it never starts.
      const stop = r.stop.bind(r);
      r.stop = () => {
        clearTimeout(t);
        return stop();
      };
    } else {
      r.start();
    }
    return r;
  });
}
