// Agent Leases judged by observation, with real parts: the controller and
// two agents in the lab against a real kube-apiserver, a steady client on
// both node addresses. The API server is stopped (SIGSTOP: every connection
// stays open, nothing answers) for longer than the agents' Lease duration,
// then continued: the Service keeps its addresses and no connection fails,
// whether the controller kept leading through the outage or stepped down and
// led again. An agent that is really gone (killed) is still withdrawn
// within its Lease duration and the controller's check.
import { setTimeout as sleep } from 'node:timers/promises';
import { CoreV1Api, DiscoveryV1Api, Watch, type V1Service } from '@kubernetes/client-node';
import type { ResultPromise } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureNamespace, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { ECHO_PORT, HOST_V4, Lab } from '../lab/lab.ts';
import { registerLabNodes, spawnAgents, spawnController } from '../lab/pier.ts';
import { endpointSlice, lbService } from '../support/objects.ts';
import { eventually } from '../support/wait.ts';

const NS = 'outage';
const AGENT_LEASE_MS = 3000;
const RESYNC_MS = 2000;
/** The controller steps down when it could not renew its own Lease for this long. */
const RENEW_DEADLINE_MS = 10_000;

const ips = (svc: V1Service | undefined) => (svc?.status?.loadBalancer?.ingress ?? []).map((i) => i.ip ?? '').sort();

/** Every status the Service's watch delivers, reconnecting from the last resourceVersion so none is missed. */
class StatusLog {
  readonly seen: { at: number; ips: string[] }[] = [];
  private abort: AbortController | undefined;
  private stopped = false;
  private resourceVersion = '';
  private readonly cp: ControlPlane;
  constructor(cp: ControlPlane) {
    this.cp = cp;
  }

  async start(): Promise<void> {
    const list = await this.cp.admin.makeApiClient(CoreV1Api).listNamespacedService({ namespace: NS, fieldSelector: 'metadata.name=web' });
    this.resourceVersion = list.metadata?.resourceVersion ?? '';
    await this.watch();
  }

  private async watch(): Promise<void> {
    if (this.stopped) return;
    this.abort = await new Watch(this.cp.admin).watch(
      `/api/v1/namespaces/${NS}/services`,
      { fieldSelector: 'metadata.name=web', resourceVersion: this.resourceVersion, allowWatchBookmarks: true },
      (phase, obj: V1Service) => {
        this.resourceVersion = obj?.metadata?.resourceVersion ?? this.resourceVersion;
        if (phase === 'MODIFIED' || phase === 'ADDED') this.seen.push({ at: performance.now(), ips: ips(obj) });
      },
      () => {
        if (!this.stopped) setTimeout(() => void this.watch().catch(() => undefined), 200);
      },
    ).catch(() => {
      if (!this.stopped) setTimeout(() => void this.watch().catch(() => undefined), 200);
      return undefined;
    });
  }

  stop(): void {
    this.stopped = true;
    this.abort?.abort();
  }
}

describe('controller: agent Leases across an API outage', () => {
  let lab: Lab;
  let cp: ControlPlane;
  let core: CoreV1Api;
  let agents: ResultPromise[] = [];
  const controllerLog: string[] = [];
  let addresses: string[] = [];

  beforeAll(async () => {
    lab = await Lab.create({ nodes: [1, 1], clients: 2, hostLink: true });
    cp = await startControlPlane({ address: HOST_V4 });
    core = cp.admin.makeApiClient(CoreV1Api);
    for (const ns of [NS, 'pier-system']) await ensureNamespace(core, ns);
    await registerLabNodes(core, lab);
    agents = spawnAgents(lab, cp.adminKubeconfigPath, ['--min-sync-interval', '50ms', '--lease-renew-interval', '500ms', '--lease-duration', `${AGENT_LEASE_MS}ms`]);
    const controller = spawnController(lab, lab.clients[1]!, cp.adminKubeconfigPath, [
      '--log-level', 'info',
      '--resync-period', `${RESYNC_MS}ms`,
      '--leader-elect-lease-duration', '15s',
      '--leader-elect-renew-deadline', `${RENEW_DEADLINE_MS}ms`,
      '--leader-elect-retry-period', '500ms',
    ]);
    controller.stderr?.on('data', (d: Buffer) => controllerLog.push(...d.toString().trimEnd().split('\n')));

    await core.createNamespacedService({ namespace: NS, body: lbService(NS, 'web', [{ name: 'http', port: 80, targetPort: ECHO_PORT }]) });
    await cp.admin.makeApiClient(DiscoveryV1Api).createNamespacedEndpointSlice({
      namespace: NS,
      body: endpointSlice(NS, 'web', 'IPv4', lab.pods.map((p) => ({ address: p.v4, nodeName: p.node })), [{ name: 'http', port: ECHO_PORT }]),
    });
    addresses = lab.nodes.map((n) => n.v4).sort();
    await eventually('both node addresses in the status', async () => {
      const got = ips(await core.readNamespacedService({ name: 'web', namespace: NS }));
      return JSON.stringify(got) === JSON.stringify(addresses);
    }, { timeoutMs: 30_000 });
    for (const ip of addresses) {
      await eventually(`an answer via ${ip}`, async () => (await lab.probe(lab.clients[0]!, ip, 80, { timeoutMs: 500 }))[0]?.ok, { timeoutMs: 15_000 });
    }
  });

  afterAll(async () => {
    // Never leave the API server stopped, whatever failed.
    cp?.resumeApiServer();
    await lab?.destroy();
    await cp?.stop();
  });

  const outage = (stopMs: number, what: string) =>
    it(`keeps the Service's addresses and every connection when the API server stops for ${stopMs / 1000} s (agent Lease ${AGENT_LEASE_MS / 1000} s): ${what}`, async () => {
      const log = new StatusLog(cp);
      await log.start();
      const from = controllerLog.length;
      // A steady client on both addresses, from 1 s before the stop until 2 Lease durations after it ends.
      const intervalMs = 20;
      const count = Math.ceil((1000 + stopMs + 2 * AGENT_LEASE_MS + 1000) / (intervalMs + 2));
      const probes = addresses.map((ip) => lab.probe(lab.clients[0]!, ip, 80, { count, intervalMs, timeoutMs: 1000 }));
      try {
        await sleep(1000);
        cp.pauseApiServer();
        await sleep(stopMs);
      } finally {
        cp.resumeApiServer();
      }
      const results = await Promise.all(probes);
      const after = ips(await core.readNamespacedService({ name: 'web', namespace: NS }));
      log.stop();

      const failed = results.flatMap((r, k) => r.filter((x) => !x.ok).map((x) => `${addresses[k]}: ${x.error}`));
      const total = results.reduce((n, r) => n + r.length, 0);
      console.log(`API server stopped ${stopMs} ms: ${total} connections, ${failed.length} failed; statuses seen: ${JSON.stringify(log.seen.map((s) => s.ips))}`);
      console.log(controllerLog.slice(from).filter((l) => /resumed|leading|leader|Lease|NoEligible/.test(l)).join('\n'));
      expect(failed).toEqual([]);
      expect(log.seen.filter((s) => JSON.stringify(s.ips) !== JSON.stringify(addresses))).toEqual([]);
      expect(after).toEqual(addresses);
    });

  outage(6000, 'the controller keeps leading, its own renewal hanging');
  outage(RENEW_DEADLINE_MS + 4000, 'the controller steps down and leads again');

  it(`withdraws a node whose agent is killed within the Lease duration and the resync period`, async () => {
    const killed = lab.nodes[0]!;
    const t0 = performance.now();
    agents[0]!.kill('SIGKILL');
    await agents[0]!.catch(() => undefined);
    const remaining = addresses.filter((a) => a !== killed.v4);
    await eventually(`${killed.v4} withdrawn`, async () => JSON.stringify(ips(await core.readNamespacedService({ name: 'web', namespace: NS }))) === JSON.stringify(remaining), {
      timeoutMs: 30_000,
      intervalMs: 50,
    });
    const ms = performance.now() - t0;
    console.log(`agent on ${killed.name} killed: withdrawn after ${Math.round(ms)} ms`);
    expect(ms).toBeLessThan(AGENT_LEASE_MS + RESYNC_MS);
    const svc = await core.readNamespacedService({ name: 'web', namespace: NS });
    expect(svc.status?.conditions?.find((c) => c.type === 'pier.dev/Ready')?.status).toBe('True');
  });
});
