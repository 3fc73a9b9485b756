// The Helm chart where its users run it: two real nodes (containerd, runc,
// the CNI bridge, kubelet, kube-proxy) with a whole control plane, pier's
// images built from its Dockerfiles by buildah and imported into the nodes,
// and the real helm (test/helm/build.sh) installing deploy/helm/pier as
// deploy/helm/README.md says: `helm install`, a LoadBalancer Service
// answered through pier, `helm upgrade` of a setting (which rolls the
// controller and every agent) under steady clients on every node address
// with no connection refused, reset or timed out, and `helm uninstall` with
// the cleanup sweep (deploy/cleanup), after which no PIER chain and no pier
// table is left on any node. One cluster for the whole file. The README's
// commands (its "With Helm" block, `helm uninstall`, the cleanup sweep) are
// read from README.md and run as written, with the additions the README
// itself names (test/support/readme.ts lists them).
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { V1Service } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCluster, type Cluster } from '../cluster/cluster.ts';
import { CHART, CHART_VALUES, helm, helmPath } from '../helm/tools.ts';
import { describeTally, steadyClient, tally } from '../lab/steady.ts';
import { runReadme } from '../support/readme.ts';
import { eventually } from '../support/wait.ts';

const SYSTEM = 'pier-system';
const NS = 'default';

describe('the Helm chart on real nodes', () => {
  let cluster: Cluster;
  let home: string;
  /** The values the README's helm install passes here (test/support/readme.ts), for helm upgrade: the kind values, the images loaded into the nodes, the API server's own address. */
  let values: string[];
  /** How a README command reaches this cluster and this helm's own folders: environment, never its text. */
  let readmeEnv: { kubeconfig: string; env: Record<string, string> };

  const run = (args: string[]) => helm(home, args, { kubeconfig: cluster.cp.adminKubeconfigPath });
  const client = () => cluster.lab.clients[0]!;
  const svc = (name: string) => cluster.core.readNamespacedService({ namespace: NS, name });
  const ingressIps = (s: V1Service) => (s.status?.loadBalancer?.ingress ?? []).map((i) => i.ip!).sort();
  const podUids = async (app: string) =>
    (await cluster.kubectl(['get', 'pods', '-n', SYSTEM, '-l', `app.kubernetes.io/name=${app}`, '-o', 'jsonpath={.items[*].metadata.uid}'])).split(' ').filter(Boolean);

  /** pier's rules on every node: its iptables chains and its nftables tables. */
  const pierRules = async () => {
    const out: string[] = [];
    for (const node of cluster.nodes) {
      for (const save of ['iptables-save', 'ip6tables-save']) {
        out.push(...(await node.exec(save, [])).stdout.split('\n').filter((l) => l.includes('PIER-')).map((l) => `${node.name} ${save}: ${l}`));
      }
      out.push(...(await node.exec('nft', ['list', 'tables'])).stdout.split('\n').filter((l) => /^table ip6? pier$/.test(l)).map((l) => `${node.name}: ${l}`));
    }
    return out;
  };

  beforeAll(async () => {
    home = mkdtempSync(join(tmpdir(), 'pier-helm-e2e-'));
    // helm waited for here, under the hook's timeout, while the cluster starts
    // (scripts/test.sh may still be building it); after, so that a failure
    // leaves a cluster afterAll can stop.
    const helmBuilt = helmPath();
    helmBuilt.catch(() => {});
    cluster = await startCluster({ nodes: 2, proxyMode: 'iptables' });
    await helmBuilt;
    const apiServer = new URL(cluster.cp.server).host;
    // No registry here: the images built by buildah, imported into every node
    // under the names the README's --set gives (pier/agent, pier/controller, the chart's version as tag).
    expect([cluster.images.names.agent, cluster.images.names.controller]).toEqual(['docker.io/pier/agent:0.1.0', 'docker.io/pier/controller:0.1.0']);
    values = [
      '-f', join(CHART_VALUES, 'kind.yaml'),
      '--set', 'controller.image.repository=pier/controller', '--set', 'agent.image.repository=pier/agent',
      // The test cluster's API server is no kind-control-plane (README, "Quick start on kind").
      '--set', `agent.apiServer=${apiServer}`,
    ];
    readmeEnv = {
      kubeconfig: cluster.cp.adminKubeconfigPath,
      env: { API_SERVER: apiServer, HELM_CACHE_HOME: `${home}/cache`, HELM_CONFIG_HOME: `${home}/config`, HELM_DATA_HOME: `${home}/data` },
    };
  });

  afterAll(async () => {
    await cluster?.stop();
    if (home) rmSync(home, { recursive: true, force: true });
  });

  it('helm install into a namespace made as deploy/helm/README.md says: two controllers and an agent per node, ready; a LoadBalancer Service answered through pier', async () => {
    // The README's "With Helm" block: the namespace, its label, helm install (with the kind values and the images loaded into the nodes).
    const started = Date.now();
    await runReadme('helm-install', readmeEnv);
    await cluster.kubectl(['-n', SYSTEM, 'rollout', 'status', 'deployment/pier-controller', '--timeout=180s']);
    await cluster.kubectl(['-n', SYSTEM, 'rollout', 'status', 'daemonset/pier-agent', '--timeout=180s']);
    console.log(`[helm] helm install and the rollouts took ${Date.now() - started} ms`);
    expect(JSON.parse(await run(['get', 'values', 'pier', '--namespace', SYSTEM, '-o', 'json']))).toMatchObject({ agent: { apiServer: new URL(cluster.cp.server).host, image: { repository: 'pier/agent' } }, controller: { image: { repository: 'pier/controller' } } });
    const out = await cluster.kubectl(['get', 'pods', '-n', SYSTEM, '-o', 'jsonpath={range .items[*]}{.metadata.labels.app\\.kubernetes\\.io/name} {.spec.nodeName} {.status.containerStatuses[0].ready}{"\\n"}{end}']);
    const pods = out.split('\n').filter(Boolean).map((l) => l.split(' '));
    expect(pods.filter(([app]) => app === 'pier-controller').map(([, , ready]) => ready)).toEqual(['true', 'true']);
    expect(pods.filter(([app]) => app === 'pier-agent').map(([, node, ready]) => `${node} ${ready}`).sort()).toEqual(['n1 true', 'n2 true']);
    // The metrics Services list every pod: the agents on the nodes' addresses.
    const endpoints = await cluster.kubectl(['get', 'endpointslices', '-n', SYSTEM, '-l', 'kubernetes.io/service-name=pier-agent-metrics', '-o', 'jsonpath={.items[*].endpoints[*].addresses[0]}']);
    expect(endpoints.split(' ').filter((a) => !a.includes(':')).sort()).toEqual(cluster.lab.nodes.map((n) => n.v4).sort());
    const metrics = await (await fetch(`http://${cluster.lab.nodes[0]!.v4}:10265/metrics`)).text();
    expect(metrics).toMatch(/^pier_agent_/m);

    await cluster.kubectl(['create', 'deployment', 'echo', `--image=${cluster.images.names.echo}`, '--replicas=2', '--port=8080']);
    await cluster.kubectl(['rollout', 'status', 'deployment/echo', '--timeout=120s']);
    await cluster.kubectl(['expose', 'deployment', 'echo', '--type=LoadBalancer', '--port=80', '--target-port=8080']);
    await cluster.kubectl(['patch', 'service', 'echo', '--type=merge', '-p', JSON.stringify({ spec: { ipFamilyPolicy: 'PreferDualStack' } })]);
    const all = cluster.lab.nodes.flatMap((n) => [n.v4, n.v6]).sort();
    await eventually('the Service status to list every node address', async () => ingressIps(await svc('echo')).join() === all.join(), { timeoutMs: 30_000 });
    const echoPods = (await cluster.kubectl(['get', 'pods', '-n', NS, '-l', 'app=echo', '-o', 'jsonpath={.items[*].metadata.name}'])).split(' ');
    for (const address of all) {
      const results = await eventually(`TCP answers on ${address}:80`, async () => {
        const r = await cluster.lab.probe(client(), address, 80, { count: 5, timeoutMs: 1000 });
        return r.every((x) => x.ok) ? r : undefined;
      }, { timeoutMs: 20_000, intervalMs: 250 });
      for (const r of results) expect(echoPods).toContain(r.reply!.pod);
    }
  });

  it('helm upgrade of a setting rolls the controllers and every agent under steady clients on every node address: no connection refused, reset or timed out, no SYN lost', async () => {
    const before = { agent: await podUids('pier-agent'), controller: await podUids('pier-controller') };
    const synsBefore = (await cluster.lab.tcpRetransmits(client().ns)).syn;
    // A new connection every 20 ms; 3 s per attempt, so a lost SYN is retransmitted and counted rather than cut short.
    const clients = cluster.lab.nodes.flatMap((n) => [n.v4, n.v6]).map((address) => ({ address, c: steadyClient(cluster.lab, client(), address, 80, { intervalMs: 20, timeoutMs: 3000 }) }));
    await Promise.all(clients.map(({ c }) => c.started));
    const started = Date.now();
    await run(['upgrade', 'pier', CHART, '--namespace', SYSTEM, ...values, '--set', 'logLevel=debug', '--wait', '--timeout', '4m']);
    const took = Date.now() - started;
    // The agents' rollout is one node at a time; --wait saw it through. A little more traffic after.
    await new Promise((r) => setTimeout(r, 2000));
    const results = await Promise.all(clients.map(async ({ address, c }) => ({ address, rs: await c.stop() })));
    const syns = (await cluster.lab.tcpRetransmits(client().ns)).syn - synsBefore;
    console.log(`[helm] helm upgrade (logLevel=debug) took ${took} ms: ${results.map(({ address, rs }) => `${address}: ${describeTally(tally(rs))}`).join('; ')}; SYNs retransmitted: ${syns}`);
    if (results.some(({ rs }) => rs.some((r) => !r.ok))) {
      console.log(await cluster.kubectl(['-n', SYSTEM, 'logs', '-l', 'app.kubernetes.io/name=pier-agent', '--tail=40', '--prefix']));
    }

    // Every pod was replaced: the ConfigMap's checksum on the pod templates changed.
    const after = { agent: await podUids('pier-agent'), controller: await podUids('pier-controller') };
    expect(after.agent.filter((uid) => before.agent.includes(uid))).toEqual([]);
    expect(after.controller.filter((uid) => before.controller.includes(uid))).toEqual([]);
    expect(after.agent).toHaveLength(2);
    expect(JSON.parse(await cluster.kubectl(['-n', SYSTEM, 'get', 'configmap', 'pier-config', '-o', 'json'])).data.PIER_LOG_LEVEL).toBe('debug');
    const history = JSON.parse(await run(['history', 'pier', '--namespace', SYSTEM, '-o', 'json'])) as { revision: number; status: string }[];
    expect(history.map((h) => `${h.revision} ${h.status}`)).toEqual(['1 superseded', '2 deployed']);

    for (const { address, rs } of results) {
      const t = tally(rs);
      expect(rs.length, address).toBeGreaterThan(100);
      expect({ refused: t.refused, reset: t.reset, timeout: t.timeout, other: t.other }, address).toEqual({ refused: 0, reset: 0, timeout: 0, other: 0 });
    }
    expect(syns).toBe(0);
  });

  it('helm uninstall stops pier and leaves its rules; the cleanup sweep (deploy/cleanup) then leaves no PIER chain and no pier table on any node', async () => {
    expect((await pierRules()).length).toBeGreaterThan(0);
    // The README's `helm uninstall pier -n pier-system`, as written (no --wait: the pods may take a moment to go).
    await runReadme('helm-uninstall', readmeEnv);
    const helmObjects = () => cluster.kubectl(['get', 'all,configmaps,serviceaccounts,roles,rolebindings,poddisruptionbudgets', '-n', SYSTEM, '-l', 'app.kubernetes.io/managed-by=Helm', '-o', 'name']);
    await eventually('no object of the release left', async () => (await helmObjects()) === '', { timeoutMs: 120_000, intervalMs: 500 });
    expect(await helmObjects()).toBe('');
    for (const kind of ['clusterroles', 'clusterrolebindings', 'validatingadmissionpolicies', 'validatingadmissionpolicybindings']) {
      expect(await cluster.kubectl(['get', kind, '-l', 'app.kubernetes.io/part-of=pier', '-o', 'name']), kind).toBe('');
    }
    await eventually('the agents gone', async () => (await podUids('pier-agent')).length === 0, { timeoutMs: 60_000, intervalMs: 500 });
    // The rules outlive the agents on purpose (an upgrade must drop no traffic): the Service still answers.
    expect((await pierRules()).length).toBeGreaterThan(0);
    const [r] = await cluster.lab.probe(client(), cluster.lab.nodes[0]!.v4, 80, { timeoutMs: 1000 });
    expect(r?.ok).toBe(true);

    // Then the README's sweep, as written: apply deploy/cleanup, its rollout status, delete it.
    await runReadme('helm-uninstall-sweep', readmeEnv);
    expect(await pierRules()).toEqual([]);
    await cluster.kubectl(['delete', 'namespace', SYSTEM, '--timeout=120s']);
  });
});
