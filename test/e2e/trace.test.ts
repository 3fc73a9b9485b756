// `pier trace` against real packets: a two-node lab with a real API server
// and `pier agent` on each node; for a table of cases, trace's answer (from
// the live cluster, and from the same objects as manifests) must be what
// real TCP and UDP connections do: delivered or not (refused, or silently
// dropped), which pods answer, and the source address the pods see.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CoreV1Api, DiscoveryV1Api, type V1Service } from '@kubernetes/client-node';
import { execa, type ResultPromise } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import type { Verdict } from '../../agent/iptables/trace.ts';
import { ensureNamespace, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { HOST_V4, Lab, type Endpoint, type LabNode } from '../lab/lab.ts';
import { CLI, createLabService, registerLabNodes, spawnAgents, stopProcesses, type LabServicePort } from '../lab/pier.ts';
import { eventually } from '../support/wait.ts';

const NS = 'trace';

interface Case {
  name: string;
  from: () => Endpoint;
  /** The node whose address is the frontend; trace walks its rules. */
  node: () => LabNode;
  family: 'v4' | 'v6';
  port: number;
  proto?: 'tcp' | 'udp';
  /** What the test expects trace to say, so that a trace that agrees with wrong packets still fails. */
  expect: Verdict['outcome'];
}

describe('pier trace agrees with real packets', () => {
  let lab: Lab;
  let cp: ControlPlane;
  let core: CoreV1Api;
  let kubeconfig: string;
  let agents: ResultPromise[] = [];
  let manifests = '';

  const n = (i: number) => () => lab.nodes[i]!;
  const client = (i: number) => () => lab.clients[i]!;
  const pod = (node: number, k: number) => () => lab.nodes[node]!.pods[k]!;
  /** Every address a node may masquerade to: its underlay addresses and its pod gateways. */
  const nodeOwn = (node: LabNode) => [node.v4, node.v6, node.podCidrV4.replace(/\.0\/24$/, '.1'), node.podCidrV6.replace(/::\/64$/, '::1')];
  const podByAddress = (a: string) => lab.pods.find((p) => p.v4 === a || p.v6 === a)?.name ?? `${a} (no pod)`;

  const createService = (name: string, ports: LabServicePort[], pods: { v4: string; v6: string; node: string }[], extra: Partial<NonNullable<V1Service['spec']>> = {}, portError?: string) =>
    createLabService({ core, discovery: cp.admin.makeApiClient(DiscoveryV1Api) }, NS, name, ports, pods, { nodes: lab.nodes, extra, portError });

  beforeAll(async () => {
    lab = await Lab.create({ nodes: [2, 2], clients: 2, hostLink: true });
    cp = await startControlPlane({ address: HOST_V4 });
    core = cp.admin.makeApiClient(CoreV1Api);
    kubeconfig = cp.adminKubeconfigPath;
    await ensureNamespace(core, NS);
    await ensureNamespace(core, 'pier-system');
    await registerLabNodes(core, lab);
    const [c0] = lab.clients as [Endpoint];
    await createService('cluster', [{ name: 'http', port: 80 }, { name: 'dns', port: 53, protocol: 'UDP' }], lab.pods);
    await createService('local', [{ name: 'http', port: 81 }], lab.pods, { externalTrafficPolicy: 'Local' });
    await createService('hairpin', [{ name: 'http', port: 82 }], [lab.pods[0]!], { externalTrafficPolicy: 'Local' });
    await createService('ranged', [{ name: 'http', port: 83 }], lab.pods, { loadBalancerSourceRanges: [`${c0.v4}/32`, `${c0.v6}/128`] });
    await createService('empty', [{ name: 'http', port: 84 }], []);
    await createService('errored', [{ name: 'http', port: 85 }], lab.pods, {}, 'PortConflict');
    await createService('foreign', [{ name: 'http', port: 86 }], lab.pods, { loadBalancerClass: 'other.dev/lb' });

    agents = spawnAgents(lab, kubeconfig, ['--min-sync-interval', '100ms']);
    // Every pier Service's rules on both nodes, both families, before any probe.
    for (const node of lab.nodes) {
      for (const tool of ['iptables-save', 'ip6tables-save']) {
        await eventually(`${tool} on ${node.name} holds every Service`, async () => {
          const text = (await lab.exec(node.ns, tool, [])).stdout;
          // By port: the nat rules name no Service.
          return [80, 53, 81, 82, 83, 84].every((port) => text.includes(`--dport ${port} `));
        }, { timeoutMs: 30_000 });
      }
    }

    // The same objects as manifests, as `kubectl get -o yaml` writes them.
    manifests = mkdtempSync(join(tmpdir(), 'pier-trace-'));
    const items = [
      ...(await core.listNode()).items.map((x) => ({ apiVersion: 'v1', kind: 'Node', ...x })),
      ...(await core.listNamespacedService({ namespace: NS })).items.map((x) => ({ apiVersion: 'v1', kind: 'Service', ...x })),
      ...(await cp.admin.makeApiClient(DiscoveryV1Api).listNamespacedEndpointSlice({ namespace: NS })).items.map((x) => ({ apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', ...x })),
    ];
    writeFileSync(join(manifests, 'cluster.yaml'), stringify({ apiVersion: 'v1', kind: 'List', items }));
  });

  afterAll(async () => {
    await stopProcesses(agents);
    await lab?.destroy();
    await cp?.stop();
    if (manifests) rmSync(manifests, { recursive: true, force: true });
  });

  const cases: Case[] = [
    { name: 'Cluster, TCP over IPv4', from: client(0), node: n(0), family: 'v4', port: 80, expect: 'delivered' },
    { name: 'Cluster, UDP over IPv6', from: client(0), node: n(1), family: 'v6', port: 53, proto: 'udp', expect: 'delivered' },
    { name: 'Local, IPv4', from: client(0), node: n(0), family: 'v4', port: 81, expect: 'delivered' },
    { name: 'Local, IPv6', from: client(1), node: n(1), family: 'v6', port: 81, expect: 'delivered' },
    { name: 'hairpin: a pod to its own Local Service through its node', from: pod(0, 0), node: n(0), family: 'v4', port: 82, expect: 'delivered' },
    { name: 'hairpin: a pod to a Cluster Service through its node', from: pod(0, 1), node: n(0), family: 'v6', port: 80, expect: 'delivered' },
    { name: 'a client on the node, Cluster', from: n(0), node: n(0), family: 'v4', port: 80, expect: 'delivered' },
    { name: 'a client on the node, Local', from: n(1), node: n(1), family: 'v6', port: 81, expect: 'delivered' },
    { name: 'source ranges: inside', from: client(0), node: n(0), family: 'v4', port: 83, expect: 'delivered' },
    { name: 'source ranges: outside', from: client(1), node: n(0), family: 'v4', port: 83, expect: 'dropped' },
    { name: 'source ranges: outside, IPv6', from: client(1), node: n(1), family: 'v6', port: 83, expect: 'dropped' },
    { name: 'source ranges: a client on the node, outside', from: n(0), node: n(0), family: 'v4', port: 83, expect: 'dropped' },
    { name: 'no endpoints', from: client(0), node: n(0), family: 'v4', port: 84, expect: 'rejected' },
    { name: 'a port with an error in status', from: client(0), node: n(1), family: 'v4', port: 85, expect: 'unserved' },
    { name: 'a Service of a foreign loadBalancerClass', from: client(0), node: n(0), family: 'v6', port: 86, expect: 'unserved' },
  ];

  const runTrace = async (args: string[]) => {
    const r = await execa(process.execPath, [CLI, 'trace', ...args, '-o', 'json'], { reject: false });
    expect(r.stderr).toBe('');
    const verdict = JSON.parse(r.stdout) as Verdict;
    expect(r.exitCode, `exit code for ${verdict.outcome}`).toBe(verdict.outcome === 'delivered' ? 0 : 1);
    return verdict;
  };

  for (const c of cases) {
    it(c.name, async () => {
      const from = c.from();
      const node = c.node();
      const proto = c.proto ?? 'tcp';
      const frontend = `${c.family === 'v6' ? `[${node.v6}]` : node.v4}:${c.port}/${proto}`;
      const clientAddress = from[c.family];
      // No controller runs here, so no Lease says whether pier is the default: the flag does (else trace says it assumed).
      const verdict = await runTrace([clientAddress, frontend, '--node', node.name, '--kubeconfig', kubeconfig, '--default-class=false']);
      // Manifests of the same objects give the same answer.
      expect(await runTrace([clientAddress, frontend, '--node', node.name, '-f', manifests])).toEqual(verdict);
      expect(verdict.outcome, verdict.reason).toBe(c.expect);
      // Every rule trace cites is one the kernel holds on that node, word for word.
      const saved = (await lab.exec(node.ns, c.family === 'v4' ? 'iptables-save' : 'ip6tables-save', [])).stdout.split('\n');
      const cited = [...verdict.hops, ...verdict.endpoints.flatMap((e) => e.hops)].map((h) => `-A ${h.chain} ${h.rule}`);
      expect(cited.length).toBeGreaterThan(0);
      for (const line of cited) expect(saved, line).toContain(line);

      const delivered = verdict.outcome === 'delivered';
      const results = await lab.probe(from, node[c.family], c.port, { proto, count: delivered ? 40 : 2, timeoutMs: delivered ? 2000 : 1500 });
      if (!delivered) {
        expect(results.filter((r) => r.ok), verdict.reason).toEqual([]);
        // Refused answers at once; a drop leaves the client waiting.
        if (proto === 'tcp' && verdict.outcome === 'rejected') expect(results.map((r) => r.error)).toEqual(['ECONNREFUSED', 'ECONNREFUSED']);
        if (verdict.outcome === 'dropped') expect(results.map((r) => r.error)).toEqual(['timeout', 'timeout']);
        return;
      }
      expect(results.filter((r) => !r.ok)).toEqual([]);
      // Which pods answer: exactly the endpoints trace names (40 tries miss one of four at 25% with p < 1e-4).
      const predicted = new Set(verdict.endpoints.map((e) => podByAddress(e.address)));
      expect(new Set(results.map((r) => r.reply!.pod))).toEqual(predicted);
      const sum = verdict.endpoints.reduce((s, e) => s + e.probability, 0);
      expect(sum).toBeCloseTo(1, 6);
      // The source the pods saw.
      for (const e of verdict.endpoints) {
        const seen = new Set(results.filter((r) => r.reply!.pod === podByAddress(e.address)).map((r) => r.reply!.peer));
        if (e.sourceSeen.kind === 'client') expect(seen, `${e.address} sees the client`).toEqual(new Set([clientAddress]));
        else {
          expect(e.sourceSeen.node).toBe(node.name);
          for (const peer of seen) expect(nodeOwn(node), `${e.address} saw ${peer}`).toContain(peer);
          if (!verdict.fromNode) expect(seen.has(clientAddress)).toBe(false);
        }
      }
    });
  }
});
