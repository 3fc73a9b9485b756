// The agent's Prometheus metrics. One registry per agent instance so tests
// can run several in one process.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { VERSION } from '../lib/version.ts';

export function agentMetrics() {
  const registry = new Registry();
  // Unprefixed: process_* and nodejs_* are the names every Node.js dashboard and alert queries.
  collectDefaultMetrics({ register: registry });
  const buildInfo = new Gauge({
    name: 'pier_build_info',
    help: 'Always 1; the labels say which pier runs and which rules it writes (iptables_backend only for the iptables backend).',
    labelNames: ['version', 'component', 'backend', 'iptables_backend'] as const,
    registers: [registry],
  });
  return {
    registry,
    /** Sets pier_build_info once the backend is chosen (it is, once, before the first sync). */
    buildInfo: (backend: string, iptablesBackend: string) => {
      buildInfo.reset();
      buildInfo.set({ version: VERSION, component: 'agent', backend, iptables_backend: iptablesBackend }, 1);
    },
    syncDuration: new Histogram({
      name: 'pier_agent_sync_duration_seconds',
      help: 'Time to render and apply one family, by how much was written (noop, partial, full).',
      labelNames: ['family', 'mode'] as const,
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers: [registry],
    }),
    rules: new Gauge({
      name: 'pier_agent_rules',
      help: 'Rules pier holds per family and table, jumps from built-in chains included.',
      labelNames: ['family', 'table'] as const,
      registers: [registry],
    }),
    chains: new Gauge({
      name: 'pier_agent_chains',
      help: 'Chains pier holds per family and table.',
      labelNames: ['family', 'table'] as const,
      registers: [registry],
    }),
    syncErrors: new Counter({
      name: 'pier_agent_sync_errors_total',
      help: 'Syncs of a family that failed (the previous rules stay in place).',
      labelNames: ['family'] as const,
      registers: [registry],
    }),
    forwarding: new Gauge({
      name: 'pier_agent_forwarding',
      help: '1 when this node can forward the family (sysctl on, iptables usable), else 0.',
      labelNames: ['family'] as const,
      registers: [registry],
    }),
    lastSuccess: new Gauge({
      name: 'pier_agent_last_successful_sync_timestamp_seconds',
      help: 'Unix time of the last sync in which every family applied.',
      registers: [registry],
    }),
    conntrackDeleted: new Counter({
      name: 'pier_agent_conntrack_deleted_total',
      help: 'Conntrack entries of UDP and SCTP flows deleted because a rule change left them pinned to an old outcome.',
      labelNames: ['family', 'protocol'] as const,
      registers: [registry],
    }),
    conntrackErrors: new Counter({
      name: 'pier_agent_conntrack_errors_total',
      help: 'Failed clean-ups of stale conntrack entries (retried; the rules are in place).',
      labelNames: ['family'] as const,
      registers: [registry],
    }),
    drift: new Counter({
      name: 'pier_agent_drift_total',
      help: 'pier chains (kind="chain") and jumps into them (kind="jump") that a verifying resync found changed from outside, and rewrote.',
      labelNames: ['family', 'table', 'kind'] as const,
      registers: [registry],
    }),
    problems: new Gauge({
      name: 'pier_agent_service_problems',
      help: 'Service ports skipped because of bad input, by reason.',
      labelNames: ['reason'] as const,
      registers: [registry],
    }),
  };
}

export type AgentMetrics = ReturnType<typeof agentMetrics>;
