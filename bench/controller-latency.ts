// Create -> first answered connection with many Services present, in the
// network lab: the controller in a host of its own, an agent in each node
// namespace, a background fleet whose every listed address is answered
// before measuring, then Services created one at a time while a client
// keeps connecting to the address each will get. The same helpers as the
// end-to-end test (test/lab/pier.ts, test/support/fleet.ts).
import { CoreV1Api } from '@kubernetes/client-node';
import { setTimeout as sleep } from 'node:timers/promises';
import type { V1Service } from '@kubernetes/client-node';
import { ensureNamespace, startControlPlane, type ControlPlane } from '../test/cluster/controlplane.ts';
import { HOST_V4, Lab } from '../test/lab/lab.ts';
import {
  labFleetSpec,
  measureCreateToAnswer,
  probeAll,
  registerLabNodes,
  spawnAgents,
  spawnController,
  stopProcesses,
  target,
  type LatencySample,
} from '../test/lab/pier.ts';
import { Fleet, StatusWatch, summarize, type Summary } from '../test/support/fleet.ts';

const AGENT_HEALTH_PORT = 10265;

export interface AgentSetting {
  label: string;
  args: string[];
}

export interface LatencyResult {
  setting: AgentSetting;
  samples: LatencySample[];
  summary: Summary;
  failures: number;
  /** Services the status lists none of the probed addresses for (must be 0). */
  unlisted: number;
}

export interface LatencyRun {
  background: number;
  /** Background fleet: creating it, until every status, until every listed address answered. */
  createMs: number;
  statusMs: number;
  answeredMs: number;
  results: LatencyResult[];
}

const listed = (svc: V1Service | undefined) =>
  (svc?.status?.loadBalancer?.ingress ?? []).flatMap((i) => (i.ports ?? []).filter((p) => !p.error).map((p) => target(i.ip!, p.port)));

export async function latencyInLab(opts: { background: number; samples: number; concurrency: number; settings: AgentSetting[]; log: (s: string) => void }): Promise<LatencyRun> {
  let lab: Lab | undefined;
  let cp: ControlPlane | undefined;
  try {
    lab = await Lab.create({ nodes: [1, 1], clients: 2, hostLink: true });
    cp = await startControlPlane({ address: HOST_V4 });
    const core = cp.admin.makeApiClient(CoreV1Api);
    for (const ns of ['pier-system', 'fleet', 'measure']) await ensureNamespace(core, ns);
    await registerLabNodes(core, lab);
    const controller = spawnController(lab, lab.clients[1]!, cp.adminKubeconfigPath);
    const fleet = new Fleet(cp.admin);
    const client = lab.clients[0]!;
    const run: LatencyRun = { background: opts.background, createMs: 0, statusMs: 0, answeredMs: 0, results: [] };

    for (const [k, setting] of opts.settings.entries()) {
      const agents = spawnAgents(lab, cp.adminKubeconfigPath, setting.args);
      await agentsReady(lab);
      const background = labFleetSpec(lab, { namespace: 'fleet', prefix: 'bg-', count: opts.background, firstPort: 20000 });
      let targets: string[];
      const t0 = performance.now();
      if (k === 0) {
        const watch = await StatusWatch.start(fleet.kc, 'fleet');
        try {
          const items = await fleet.create(background, { concurrency: opts.concurrency });
          run.createMs = performance.now() - t0;
          const seen = await watch.waitFor(items.map((i) => i.name), 300_000);
          run.statusMs = Math.max(...seen.map((s) => s.at)) - t0;
          targets = seen.flatMap((s) => listed(s.svc));
        } finally {
          watch.stop();
        }
      } else {
        targets = (await core.listNamespacedService({ namespace: 'fleet' })).items.flatMap(listed);
      }
      // Every listed address of every background Service answers: the agents hold all their rules.
      const outcomes = await probeAll(lab, client, targets, { deadlineMs: 120_000, concurrency: 32 });
      const bad = outcomes.filter((o) => !o.ok);
      if (bad.length > 0) throw new Error(`${bad.length} of ${targets.length} background addresses never answered (first: ${bad[0]!.target} ${bad[0]!.error})`);
      if (k === 0) run.answeredMs = performance.now() - t0;
      opts.log(`  ${setting.label}: ${opts.background} background Services answered on all ${targets.length} listed addresses; measuring ${opts.samples}`);

      const addresses = lab.nodes.flatMap((n) => [n.v4, n.v6]);
      const spec = labFleetSpec(lab, { namespace: 'measure', prefix: `s${k}-`, count: opts.samples, firstPort: 1000 + k * opts.samples });
      const samples = await measureCreateToAnswer(lab, fleet, spec, { from: client, addresses });
      const stored = new Map((await core.listNamespacedService({ namespace: 'measure' })).items.map((s) => [s.metadata!.name!, s]));
      const unlisted = samples.filter((x) => x.ok && !listed(stored.get(x.name)).includes(x.target)).length;
      const ok = samples.filter((x) => x.ok);
      run.results.push({ setting, samples, summary: summarize(ok.map((x) => x.ms)), failures: samples.length - ok.length, unlisted });
      await stopProcesses(agents);
    }
    await stopProcesses([controller]);
    return run;
  } finally {
    await lab?.destroy();
    await cp?.stop();
  }
}

/** Each agent reports ready after its first successful sync. */
async function agentsReady(lab: Lab, timeoutMs = 60_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (const n of lab.nodes) {
    for (;;) {
      const res = await fetch(`http://${n.v4}:${AGENT_HEALTH_PORT}/readyz`).catch(() => undefined);
      if (res?.ok) break;
      if (performance.now() > deadline) throw new Error(`agent on ${n.name} not ready after ${timeoutMs} ms`);
      await sleep(100);
    }
  }
}
