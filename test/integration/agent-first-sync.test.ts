// The agent's first sync comes from complete caches. Its informers' first
// lists land one by one (the Node's, one object, long before a few hundred
// Services); a sync from the Node alone would render a node with no
// Services, and outside --dry-run apply it, dropping every pier rule of a
// restarted agent until the next sync. The agent runs in-process with
// --dry-run against a real API server, so what each sync would apply is
// captured exactly.
import { CoreV1Api, DiscoveryV1Api, PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Agent, type AgentConfig } from '../../agent/agent.ts';
import { ensureNamespace, registerNode, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { endpointSlice, lbService, node } from '../support/objects.ts';
import { eventually } from '../support/wait.ts';

const NS = 'first-sync';
const NODE = 'node-a';
const NODE_IP = '198.51.100.11';
const COUNT = 600;
const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);

describe('agent: the first sync', () => {
  let cp: ControlPlane;
  let agent: Agent | undefined;

  beforeAll(async () => {
    cp = await startControlPlane();
    const core = cp.admin.makeApiClient(CoreV1Api);
    const discovery = cp.admin.makeApiClient(DiscoveryV1Api);
    await ensureNamespace(core, NS);
    await registerNode(core, node(NODE, [{ type: 'InternalIP', address: NODE_IP }]));
    const create = async (i: number) => {
      const name = `svc-${i}`;
      const port = 20000 + i;
      await core.createNamespacedService({ namespace: NS, body: lbService(NS, name, [{ name: 'p', port }], { allocateLoadBalancerNodePorts: false }) });
      await core.patchNamespacedServiceStatus({ name, namespace: NS, body: { status: { loadBalancer: { ingress: [{ ip: NODE_IP, ipMode: 'Proxy', ports: [{ port, protocol: 'TCP' }] }] } } } }, mergePatch);
      await discovery.createNamespacedEndpointSlice({ namespace: NS, body: endpointSlice(NS, name, 'IPv4', [{ address: `198.19.${Math.floor(i / 250)}.${(i % 250) + 1}`, nodeName: NODE }], [{ name: 'p', port: 8080 }]) });
    };
    for (let i = 0; i < COUNT; i += 30) await Promise.all(Array.from({ length: Math.min(30, COUNT - i) }, (_, k) => create(i + k)));
  });
  afterAll(async () => {
    await agent?.stop();
    await cp?.stop();
  });

  it('renders every Service, never a node without them', async () => {
    const payloads: string[] = [];
    const cfg: AgentConfig = {
      nodeName: NODE,
      namespace: 'pier-system',
      defaultClass: false,
      dryRun: true,
      setSysctls: false,
      backend: 'iptables',
      iptablesBackend: 'auto',
      setBy: { backend: 'PIER_BACKEND', iptablesBackend: 'the default' },
      marks: { accept: 0x2000, masquerade: 0x1000 },
      maxPortsPerService: 256,
      minSyncIntervalMs: 0,
      resyncPeriodMs: 60_000,
      healthAddress: '127.0.0.1',
      healthPort: 0,
      leaseDurationSeconds: 20,
      leaseRenewMs: 5000,
    };
    const logged: { msg: string; ports?: number; backendReason?: string }[] = [];
    const log = pino({ level: 'debug' }, { write: (line: string) => void logged.push(JSON.parse(line) as { msg: string }) });
    agent = new Agent(cfg, { kc: cp.admin, log, out: (text) => payloads.push(text) });
    await agent.start();
    await eventually('the agent ready', () => agent!.ready, { timeoutMs: 60_000 });
    await agent.idle();

    const first = payloads.find((p) => p.includes('ipv4, sync 1:'));
    expect(first).toBeDefined();
    // One DNAT per Service: its port, to its endpoint.
    const served = new Set([...first!.matchAll(/--dport (2\d{4}) -j DNAT --to-destination 198\.19\.\d+\.\d+:8080/g)].map((m) => m[1]));
    expect(served.size).toBe(COUNT);
    // The lists came in pages of 500, saying what was left: the rules were rendered ahead from the first pages.
    const ahead = logged.find((l) => l.msg.startsWith("rendered the first sync's rules ahead"));
    expect(ahead?.ports).toBeGreaterThanOrEqual(400);
    expect(ahead?.ports).toBeLessThan(COUNT);
    // The start log says where the backend was set, not a flag nobody gave.
    expect(logged.find((l) => l.msg === 'agent started')?.backendReason).toBe('set with PIER_BACKEND');
  });
});
