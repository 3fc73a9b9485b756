// The controller's Prometheus metrics. One registry per controller instance
// so tests can run several in one process.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { VERSION } from '../lib/version.ts';

export function controllerMetrics() {
  const registry = new Registry();
  // Unprefixed: process_* and nodejs_* are the names every Node.js dashboard and alert queries.
  collectDefaultMetrics({ register: registry });
  const buildInfo = new Gauge({
    name: 'pier_build_info',
    help: 'Always 1; the labels say which pier runs.',
    labelNames: ['version', 'component'] as const,
    registers: [registry],
  });
  buildInfo.set({ version: VERSION, component: 'controller' }, 1);
  return {
    registry,
    services: new Gauge({
      name: 'pier_controller_services',
      help: "pier's Services by state: serving (every port on every address), partial, unserved.",
      labelNames: ['state'] as const,
      registers: [registry],
    }),
    problems: new Gauge({
      name: 'pier_controller_allocation_problems',
      help: 'Problems the last allocation found (each is a Warning Event on its Service), by reason.',
      labelNames: ['reason'] as const,
      registers: [registry],
    }),
    allocateDuration: new Histogram({
      name: 'pier_controller_allocate_duration_seconds',
      help: 'Time to compute the allocation of every Service from the caches.',
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
      registers: [registry],
    }),
    writes: new Counter({
      name: 'pier_controller_status_writes_total',
      help: 'Writes to Services by kind (status, annotation, clear) and result (ok, conflict, error).',
      labelNames: ['kind', 'result'] as const,
      registers: [registry],
    }),
    leader: new Gauge({
      name: 'pier_controller_leader',
      help: '1 while this replica is the leader (the only one that writes), else 0.',
      registers: [registry],
    }),
    queueDepth: new Gauge({
      name: 'pier_controller_queue_depth',
      help: 'Services waiting for a worker.',
      registers: [registry],
    }),
    eventsPending: new Gauge({
      name: 'pier_controller_events_pending',
      help: 'Events waiting for the status writes to pause (at most 30 s), or being written.',
      registers: [registry],
    }),
    lastAllocation: new Gauge({
      name: 'pier_controller_last_allocation_timestamp_seconds',
      help: 'Unix time of the last allocation.',
      registers: [registry],
    }),
  };
}

export type ControllerMetrics = ReturnType<typeof controllerMetrics>;
