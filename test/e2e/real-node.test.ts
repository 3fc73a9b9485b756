// pier where its users run it: two real nodes (containerd, runc, the CNI
// bridge, kubelet, kube-proxy), a whole control plane (kube-apiserver,
// kube-controller-manager, kube-scheduler), pier's images built from its
// Dockerfiles by buildah and imported into the nodes, installed with the
// README's own commands, read from README.md and run as written
// (test/support/readme.ts, which lists each substitution a test must make):
// the kind quick start's `kubectl apply -k` and `rollout status`, its
// Deployment `hello` exposed and reached with curl, `pier status`, `pier
// trace`, and the uninstall. Real pods answer; the lab's client connects from
// its own namespace.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { V1Service } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCluster, type Cluster } from '../cluster/cluster.ts';
import type { ProbeResult } from '../lab/lab.ts';
import { describeTally, steadyClient as steady, tally } from '../lab/steady.ts';
import { kindOverlay } from '../support/deploy.ts';
import { runReadme } from '../support/readme.ts';
import { eventually } from '../support/wait.ts';

const UDP_FLOW = fileURLToPath(new URL('../lab/udp-flow.ts', import.meta.url));
const SYSTEM = 'pier-system';
const NS = 'default';
/** The agents' Lease in this cluster (the default is 40 s): the API outage and an agent restart below outlast it. */
const AGENT_LEASE_S = 20;

describe('pier on real nodes, deployed as the README says', () => {
  let cluster: Cluster;

  const svc = (name: string) => cluster.core.readNamespacedService({ namespace: NS, name });
  const ingressIps = (s: V1Service) => (s.status?.loadBalancer?.ingress ?? []).map((i) => i.ip!).sort();
  const client = () => cluster.lab.clients[0]!;
  const probe = (host: string, port: number, opts: { proto?: 'tcp' | 'udp'; count?: number; timeoutMs?: number; intervalMs?: number } = {}) =>
    cluster.lab.probe(client(), host, port, opts);
  const answeredBy = (results: ProbeResult[]) => results.map((r) => (r.ok ? r.reply!.pod : `failed: ${r.error}`));
  const podNames = async (selector: string, node?: string) => {
    const out = await cluster.kubectl(['get', 'pods', '-n', NS, '-l', selector, '-o', 'jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.phase}{"\\n"}{end}']);
    return out
      .split('\n')
      .filter(Boolean)
      .map((l) => l.split(' '))
      .filter(([, n, phase]) => phase === 'Running' && (node === undefined || n === node))
      .map(([name]) => name!);
  };

  /**
   * A client connecting every 20 ms until stopped (test/lab/steady.ts); an
   * attempt may take 3 s, so that a lost SYN is retransmitted and counted
   * (synRetransmits) instead of cut short. Its attempts are tallied by how
   * they failed: refused, reset, timed out.
   */
  const steadyClient = (host: string, port: number, proto: 'tcp' | 'udp' = 'tcp') => steady(cluster.lab, client(), host, port, { proto, intervalMs: 20, timeoutMs: 3000 });
  /**
   * Service `name` (pods `app=<name>`, two): its status lists every node's
   * address, in Proxy mode, and TCP to each node's `port` is answered by its
   * pods. Returns the node addresses and the pods.
   */
  const expectServedOnEveryNode = async (name: string, port: number) => {
    const nodeV4 = cluster.lab.nodes.map((n) => n.v4).sort();
    const status = await eventually('the Service status to list both nodes', async () => {
      const s = await svc(name);
      return ingressIps(s).join() === nodeV4.join() ? s : undefined;
    }, { timeoutMs: 30_000 });
    expect(status.status?.loadBalancer?.ingress?.every((i) => i.ipMode === 'Proxy')).toBe(true);
    const pods = await podNames(`app=${name}`);
    expect(pods).toHaveLength(2);
    for (const node of cluster.lab.nodes) {
      const results = await eventually(`TCP answers on ${node.v4}:${port}`, async () => {
        const r = await probe(node.v4, port, { count: 10 });
        return r.every((x) => x.ok) ? r : undefined;
      }, { timeoutMs: 20_000, intervalMs: 250 });
      for (const pod of answeredBy(results)) expect(pods).toContain(pod);
    }
    return { nodeV4, pods };
  };
  /** What went wrong, for assertions: every count that must be 0. */
  const failures = (rs: readonly ProbeResult[]) => {
    const { refused, reset, timeout, other } = tally(rs);
    return { refused, reset, timeout, other };
  };
  const NO_FAILURES = { refused: 0, reset: 0, timeout: 0, other: 0 };
  /** When each failed attempt came, after which kill (if any): to line failures up with the logs. */
  /** When attempt `r` began, and how long after the last of `kills` before it. */
  const sinceKill = (r: ProbeResult, kills: readonly number[]) => {
    const k = kills.filter((x) => x <= r.at!).at(-1);
    return `${new Date(r.at!).toISOString()}${k === undefined ? '' : ` (${r.at! - k} ms after kill ${kills.indexOf(k) + 1})`}`;
  };
  const whenFailed = (rs: readonly ProbeResult[], kills: readonly number[]) => rs.filter((r) => !r.ok).map((r) => `${r.error} ${sinceKill(r, kills)}`);
  /** Answered attempts that took a second or more: a retransmitted SYN, when, and which pod answered it. */
  const whenSlow = (rs: readonly ProbeResult[], kills: readonly number[]) =>
    rs.filter((r) => r.ok && r.ms >= 900).map((r) => `slow: ${Math.round(r.ms)} ms, answered by ${r.reply?.pod ?? '?'}, began ${sinceKill(r, kills)}`);

  /** Packets `node`'s conntrack has called invalid so far (conntrack -S, every CPU). */
  const conntrackInvalid = async (node: Cluster['nodes'][number]) =>
    [...(await node.exec('conntrack', ['-S'])).stdout.matchAll(/\binvalid=(\d+)/g)].reduce((n, m) => n + Number(m[1]), 0);
  /** A node's TCP entries to `port` whose replies come from no current pod of `app`: what a lost SYN may have followed. */
  const staleEntries = async (node: Cluster['nodes'][number], port: number, app: string) => {
    const pods = (await cluster.kubectl(['get', 'pods', '-n', NS, '-l', `app=${app}`, '-o', 'jsonpath={.items[*].status.podIP}'])).split(' ').filter(Boolean);
    const lines = (await node.exec('conntrack', ['-L', '-p', 'tcp', '--orig-port-dst', String(port)], { reject: false })).stdout.split('\n');
    return lines.filter((l) => {
      const reply = [...l.matchAll(/src=(\S+)/g)][1]?.[1];
      return reply !== undefined && !pods.includes(reply) && !cluster.lab.nodes.some((n) => n.v4 === reply || n.v6 === reply);
    });
  };
  /** SYNs the client's kernel has retransmitted so far: each one a packet lost on the way to a pod or back. */
  const synRetransmits = async () => (await cluster.lab.tcpRetransmits(client().ns)).syn;

  /** One UDP flow from the client, one fixed source port, a datagram every 50 ms; its replies as they arrive. */
  const udpFlow = (host: string, port: number, sport: number) => {
    const proc = cluster.lab.spawn(client().ns, process.execPath, [UDP_FLOW, '--host', host, '--port', String(port), '--sport', String(sport), '--interval', '50']);
    const replies: { at: number; pod: string }[] = [];
    let partial = '';
    proc.stdout!.on('data', (d: Buffer) => {
      const lines = (partial + d.toString()).split('\n');
      partial = lines.pop()!;
      for (const l of lines) {
        const r = JSON.parse(l) as { at: number; pod: string; started?: boolean };
        if (!r.started) replies.push(r);
      }
    });
    return {
      replies,
      async stop() {
        proc.kill('SIGTERM');
        await proc;
      },
    };
  };
  /** Polls a node's IPv4 nat table until `test` holds; when it did, an upper bound on when the rules were in place. */
  const natUntil = async (node: Cluster['nodes'][number], what: string, test: (save: string) => boolean) => {
    await eventually(what, async () => test((await node.exec('iptables-save', ['-t', 'nat'])).stdout), { timeoutMs: 30_000, intervalMs: 20 });
    return Date.now();
  };

  const work = mkdtempSync(join(tmpdir(), 'pier-real-node-'));
  beforeAll(async () => {
    cluster = await startCluster({ nodes: 2, proxyMode: 'iptables' });
    // The README's kind quick start, as written: `kubectl apply -k deploy/overlays/kind`, then its rollout status.
    await runReadme('kind-install', { kubeconfig: cluster.cp.adminKubeconfigPath });
    // Then the change the README asks for a cluster whose API server is no
    // kind-control-plane: the agents given the API server's own address (one
    // test below depends on it).
    await cluster.kubectl(['apply', '-k', kindOverlay(join(work, 'overlay'), { apiServer: new URL(cluster.cp.server).host })]);
    // An agent Lease of 20 s (renewed every 5 s) instead of the default 40 s:
    // the API outage and the third agent restart below must outlast it.
    await cluster.kubectl(['-n', SYSTEM, 'set', 'env', 'daemonset/pier-agent', `PIER_LEASE_DURATION=${AGENT_LEASE_S}s`, 'PIER_LEASE_RENEW_INTERVAL=5s']);
    await cluster.kubectl(['-n', SYSTEM, 'rollout', 'status', 'deployment/pier-controller', '--timeout=180s']);
    await cluster.kubectl(['-n', SYSTEM, 'rollout', 'status', 'daemonset/pier-agent', '--timeout=180s']);
  });

  afterAll(async () => {
    await cluster?.stop();
    rmSync(work, { recursive: true, force: true });
  });

  it('runs as pods: two controller replicas and one agent on each node, all ready', async () => {
    const out = await cluster.kubectl(['get', 'pods', '-n', SYSTEM, '-o', 'jsonpath={range .items[*]}{.metadata.labels.app\\.kubernetes\\.io/name} {.spec.nodeName} {.status.containerStatuses[0].ready}{"\\n"}{end}']);
    const pods = out.split('\n').filter(Boolean).map((l) => l.split(' '));
    expect(pods.filter(([app]) => app === 'pier-controller').map(([, , ready]) => ready)).toEqual(['true', 'true']);
    expect(pods.filter(([app]) => app === 'pier-agent').map(([, node, ready]) => `${node} ${ready}`).sort()).toEqual(['n1 true', 'n2 true']);
  });

  it('the nodes keep their kubelets apart: each has a device-plugin socket of its own at the path no flag moves', async () => {
    // Shared, two kubelets starting at once raced for it ("bind: address
    // already in use"), and the second's clean-up deleted the first's.
    const sockets = await Promise.all(
      cluster.nodes.map(async (n) => (await n.exec('stat', ['-c', '%d:%i', '/var/lib/kubelet/device-plugins/kubelet.sock'])).stdout.trim()),
    );
    expect(new Set(sockets).size, sockets.join(' ')).toBe(cluster.nodes.length);
  });

  it('the README\'s kind quick start: kubectl create deployment hello + expose --type=LoadBalancer, get svc, curl; the node addresses in the status, TCP answered by the pods', async () => {
    const kubeconfig = cluster.cp.adminKubeconfigPath;
    // The image built here stands in for nginx (test/support/readme.ts says why).
    await runReadme('kind-hello', { kubeconfig, env: { IMAGE: cluster.images.names.echo } });
    await cluster.kubectl(['rollout', 'status', 'deployment/hello', '--timeout=120s']);
    const { nodeV4, pods } = await expectServedOnEveryNode('hello', 8080);
    // `kubectl get svc hello` lists the node addresses; the README's curl, from this machine, is answered by a hello pod.
    const [getSvc, curl] = await runReadme('kind-curl', { kubeconfig });
    const [header, row] = getSvc!.stdout.split('\n').map((l) => l.trim().split(/\s+/));
    expect(header![3]).toBe('EXTERNAL-IP');
    expect(row![3]!.split(',').sort()).toEqual(nodeV4);
    expect(pods).toContain((JSON.parse(curl!.stdout) as { pod: string }).pod);
  });

  it('the README\'s pier status -n NAMESPACE and pier trace CLIENT ADDRESS:PORT/PROTO --node NODE on that install, with no other flag', async () => {
    const kubeconfig = cluster.cp.adminKubeconfigPath;
    const nodeV4 = cluster.lab.nodes.map((n) => n.v4).sort();
    // The kind overlay makes pier the default: status learns it from the cluster, with no --default-class.
    const [status] = await runReadme('status', { kubeconfig, env: { NAMESPACE: NS } });
    const rows = status!.stdout.split('\n').map((l) => l.trim().split(/\s+/));
    expect(rows[0]).toEqual(['NAMESPACE', 'NAME', 'ADDRESSES', 'PORTS', 'NODES', 'READY', 'REASON']);
    const hello = rows.find(([ns, name]) => ns === NS && name === 'hello');
    expect(hello, status!.stdout).toBeDefined();
    expect(hello![2]!.split(',').sort()).toEqual(nodeV4);
    expect(hello![3]).toBe('8080/TCP');
    expect(hello![4]!.split(',').sort()).toEqual(cluster.lab.nodes.map((n) => n.name).sort());
    expect(hello![5]).toBe('True');

    // trace, from the live cluster: a connection from the lab's client to n1:8080 is DNATed to one of hello's pods (exit 0: delivered).
    const labNode = cluster.lab.nodes[0]!;
    const [trace] = await runReadme('trace', { kubeconfig, env: { CLIENT: client().v4, FRONTEND: `${labNode.v4}:8080/tcp`, NODE: labNode.name } });
    expect(trace!.stdout).toContain('DNAT to one of 2 endpoints');
    const podIps = (await cluster.kubectl(['get', 'pods', '-n', NS, '-l', 'app=hello', '-o', 'jsonpath={.items[*].status.podIP}'])).split(' ').filter(Boolean);
    expect(podIps).toHaveLength(2);
    for (const ip of podIps) expect(trace!.stdout).toContain(ip);
  });

  it('kubectl create deployment + expose --type=LoadBalancer: the node addresses in the status, TCP answered by the pods', async () => {
    await cluster.kubectl(['create', 'deployment', 'echo', `--image=${cluster.images.names.echo}`, '--replicas=2', '--port=8080']);
    await cluster.kubectl(['rollout', 'status', 'deployment/echo', '--timeout=120s']);
    await cluster.kubectl(['expose', 'deployment', 'echo', '--type=LoadBalancer', '--port=80', '--target-port=8080']);
    await expectServedOnEveryNode('echo', 80);
  });

  it('UDP and IPv6: a UDP Service from kubectl expose, and the TCP one made dual-stack, answered on every node address', async () => {
    await cluster.kubectl(['expose', 'deployment', 'echo', '--name=echo-udp', '--type=LoadBalancer', '--protocol=UDP', '--port=5300', '--target-port=8080']);
    await cluster.kubectl(['patch', 'service', 'echo', '--type=merge', '-p', JSON.stringify({ spec: { ipFamilyPolicy: 'PreferDualStack' } })]);
    const all = cluster.lab.nodes.flatMap((n) => [n.v4, n.v6]).sort();
    await eventually('the TCP Service to list every node address of both families', async () => ingressIps(await svc('echo')).join() === all.join(), { timeoutMs: 30_000 });
    const pods = await podNames('app=echo');
    for (const node of cluster.lab.nodes) {
      for (const [host, port, proto] of [[node.v6, 80, 'tcp'], [node.v4, 5300, 'udp']] as const) {
        const results = await eventually(`${proto} answers on ${host}:${port}`, async () => {
          const r = await probe(host, port, { proto, count: 5, timeoutMs: 1000 });
          return r.every((x) => x.ok) ? r : undefined;
        }, { timeoutMs: 20_000, intervalMs: 250 });
        for (const pod of answeredBy(results)) expect(pods).toContain(pod);
      }
    }
  });

  it('UDP flows from one source port: one begun before its Service, and one pinned to a pod that is deleted, are answered by a current pod once the rules change', async () => {
    const [labNode] = cluster.lab.nodes;
    const node = cluster.nodes[0]!;
    const flow = udpFlow(labNode!.v4, 5400, 40600);
    try {
      await new Promise((r) => setTimeout(r, 1000));
      expect(flow.replies).toEqual([]);
      await cluster.kubectl(['expose', 'deployment', 'echo', '--name=echo-late', '--type=LoadBalancer', '--protocol=UDP', '--port=5400', '--target-port=8080']);
      const served = await natUntil(node, 'DNAT for 5400', (s) => /--dport 5400 .*-j DNAT/.test(s));
      await eventually('the early flow answered', () => flow.replies.length > 0, { timeoutMs: 10_000 });
      const first = flow.replies[0]!;
      // The flow is answered at all: without the conntrack clean-up its entry would pin it to no answer for 30 s and more.
      console.log(`[real-node] UDP flow begun before its Service: first reply ${first.at - served} ms after the rules`);

      // The pod the flow is pinned to goes; its server still answers while it drains (ECHO_DRAIN_MS).
      const ip = await cluster.kubectl(['get', 'pod', first.pod, '-n', NS, '-o', 'jsonpath={.status.podIP}']);
      await cluster.kubectl(['delete', 'pod', first.pod, '-n', NS, '--wait=false']);
      const moved = await natUntil(node, `no DNAT to ${ip}`, (s) => /--dport 5400 /.test(s) && !s.includes(`--to-destination ${ip}:`));
      const other = await eventually('the flow answered by another pod', () => flow.replies.find((r) => r.at > moved && r.pod !== first.pod), { timeoutMs: 10_000 });
      console.log(`[real-node] UDP flow pinned to a deleted pod: answered by ${other.pod} ${other.at - moved} ms after the rules`);
      expect(flow.replies.filter((r) => r.pod === first.pod && r.at > moved + 200)).toEqual([]);
    } finally {
      await flow.stop();
    }
    await cluster.kubectl(['rollout', 'status', 'deployment/echo', '--timeout=120s']);
  });

  it('a flush of each of pier\'s chains in turn, on a node: the next verifying sync puts back exactly what was there, and the Services answer', async () => {
    // A short resync period, set as a user would; the agents roll to take it.
    await cluster.kubectl(['-n', SYSTEM, 'set', 'env', 'daemonset/pier-agent', 'PIER_RESYNC_PERIOD=2s']);
    await cluster.kubectl(['-n', SYSTEM, 'rollout', 'status', 'daemonset/pier-agent', '--timeout=180s']);
    const node = cluster.nodes[0]!;
    const labNode = cluster.lab.nodes[0]!;
    const pierLines = async (save: 'iptables-save' | 'ip6tables-save') =>
      (await node.exec(save, [])).stdout
        .split('\n')
        .filter((l) => l.includes('PIER-'))
        .map((l) => l.replace(/ \[\d+:\d+\]$/, ''));
    const before = { v4: await pierLines('iptables-save'), v6: await pierLines('ip6tables-save') };
    const chains = (lines: string[], table: string) => {
      const save = lines.join('\n');
      return [...new Set([...save.matchAll(/^:(PIER-[A-Z0-9-]+)/gm)].map((m) => m[1]!))].map((chain) => ({ table, chain }));
    };
    // Which table a chain is in: ask the kernel.
    const flushable: { family: 'v4' | 'v6'; table: string; chain: string }[] = [];
    for (const family of ['v4', 'v6'] as const) {
      for (const table of ['nat', 'filter']) {
        const lines = (await node.exec(family === 'v4' ? 'iptables-save' : 'ip6tables-save', ['-t', table])).stdout.split('\n');
        for (const c of chains(lines, table)) if (lines.some((l) => l.startsWith(`-A ${c.chain} `))) flushable.push({ family, ...c });
      }
    }
    expect(flushable.filter((c) => c.family === 'v4').length).toBeGreaterThanOrEqual(5);
    for (const c of flushable) {
      await node.exec(c.family === 'v4' ? 'iptables' : 'ip6tables', ['-t', c.table, '-F', c.chain]);
      const healedIn = Date.now();
      await eventually(`${c.family} ${c.table} ${c.chain} healed`, async () => (await pierLines(c.family === 'v4' ? 'iptables-save' : 'ip6tables-save')).join('\n') === before[c.family].join('\n'), {
        timeoutMs: 15_000,
        intervalMs: 100,
      });
      console.log(`[real-node] ${c.family} ${c.table} ${c.chain} flushed: healed in ${Date.now() - healedIn} ms (resync every 2 s)`);
      const [r] = await probe(c.family === 'v4' ? labNode.v4 : labNode.v6, 80, { timeoutMs: 1000 });
      expect(r?.ok, `${c.chain}: answered after healing`).toBe(true);
    }
    // Beside kube-proxy's own rules nothing reads as drift once healed: no rewrite at every resync.
    const drift = async () => {
      const text = await (await fetch(`http://${labNode.v4}:10265/metrics`)).text();
      return text.split('\n').filter((l) => l.startsWith('pier_agent_drift_total{')).reduce((n, l) => n + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
    };
    const settled = await drift();
    expect(settled).toBeGreaterThanOrEqual(flushable.length);
    await new Promise((r) => setTimeout(r, 5000));
    expect(await drift()).toBe(settled);
    console.log(`[real-node] flushed and healed ${flushable.length} pier chains one by one: ${flushable.map((c) => `${c.family} ${c.table} ${c.chain}`).join(', ')}`);
  });

  it('the API server stopped for longer than the agents\' Lease duration, under a steady client: no probe fails and the status keeps every address', async () => {
    const labNode = cluster.lab.nodes[0]!;
    const statusBefore = ingressIps(await svc('echo'));
    const synsBefore = await synRetransmits();
    const steady = steadyClient(labNode.v4, 80);
    await steady.started;
    // Longer than the agents' Lease (20 s, set above) and the controller's leader
    // Lease (15 s); shorter than kube-controller-manager's node monitor grace
    // period (40 s, test/cluster/controlplane.ts), after which Kubernetes itself
    // marks the nodes NotReady.
    cluster.cp.pauseApiServer();
    try {
      await new Promise((r) => setTimeout(r, 25_000));
    } finally {
      cluster.cp.resumeApiServer();
    }
    // The controller's first judgement after the outage comes within a few seconds of it.
    await new Promise((r) => setTimeout(r, 10_000));
    const results = await steady.stop();
    console.log(`[real-node] API server stopped 25 s: ${describeTally(tally(results))}`);
    expect(results.length).toBeGreaterThan(200);
    expect(failures(results), whenFailed(results, []).slice(0, 8).join('\n')).toEqual(NO_FAILURES);
    expect((await synRetransmits()) - synsBefore).toBe(0);
    expect(ingressIps(await svc('echo'))).toEqual(statusBefore);
  });

  it('externalTrafficPolicy Local: only the node with the pod is listed, and the pod sees the client address', async () => {
    await cluster.kubectl(['create', 'deployment', 'solo', `--image=${cluster.images.names.echo}`, '--replicas=1', '--port=8080']);
    await cluster.kubectl(['rollout', 'status', 'deployment/solo', '--timeout=120s']);
    await cluster.kubectl(['expose', 'deployment', 'solo', '--type=LoadBalancer', '--port=8081', '--target-port=8080']);
    await cluster.kubectl(['patch', 'service', 'solo', '--type=merge', '-p', JSON.stringify({ spec: { externalTrafficPolicy: 'Local' } })]);
    const out = await cluster.kubectl(['get', 'pods', '-n', NS, '-l', 'app=solo', '-o', 'jsonpath={.items[0].metadata.name} {.items[0].spec.nodeName}']);
    const [pod, nodeName] = out.split(' ');
    const home = cluster.lab.nodes.find((n) => n.name === nodeName)!;
    await eventually('the Local Service to list only its pod\'s node', async () => ingressIps(await svc('solo')).join() === home.v4, { timeoutMs: 30_000 });
    // The Service began with Cluster policy (masqueraded): the patch reaches
    // the agent's rules at its next sync, which the status does not wait for.
    const t0 = Date.now();
    await eventually(`${home.v4}:8081 to answer with the client's own address`, async () => {
      const [r] = await probe(home.v4, 8081, { count: 1, timeoutMs: 1000 });
      return r?.ok && r.reply?.peer === client().v4;
    }, { timeoutMs: 20_000, intervalMs: 250 });
    console.log(`[real-node] Local policy in the rules ${Date.now() - t0} ms after the status listed only ${home.v4}`);
    const results = await probe(home.v4, 8081, { count: 5, timeoutMs: 1000 });
    expect(results.map((r) => r.error ?? 'ok')).toEqual(Array(5).fill('ok'));
    expect(results.map((r) => r.reply?.pod)).toEqual(Array(5).fill(pod));
    expect(results.map((r) => r.reply?.peer)).toEqual(Array(5).fill(client().v4));
  });

  it('scale to 0: refused at once on every node; scale up again: answered', async () => {
    await cluster.kubectl(['scale', 'deployment/echo', '--replicas=0']);
    try {
      await eventually('the echo pods to be gone', async () => (await podNames('app=echo')).length === 0, { timeoutMs: 60_000, intervalMs: 250 });
      for (const node of cluster.lab.nodes) {
        // While the agent moves from DNAT to REJECT, a SYN may still meet the old rule.
        await eventually(`${node.v4}:80 to refuse`, async () => {
          const r = await probe(node.v4, 80, { count: 3, timeoutMs: 2000 });
          return r.every((x) => x.error === 'ECONNREFUSED') ? r : undefined;
        }, { timeoutMs: 10_000, intervalMs: 250 });
        // Then what a client sees: REJECTed, every SYN answered by a refusal, none left to time out.
        const synsBefore = await synRetransmits();
        const results = await probe(node.v4, 80, { count: 5, timeoutMs: 5000 });
        expect(results.map((r) => r.error)).toEqual(Array(5).fill('ECONNREFUSED'));
        expect((await synRetransmits()) - synsBefore, 'SYNs retransmitted').toBe(0);
      }
    } finally {
      // The later tests need the pods back, whatever happened here.
      await cluster.kubectl(['scale', 'deployment/echo', '--replicas=2']);
    }
    await cluster.kubectl(['rollout', 'status', 'deployment/echo', '--timeout=120s']);
    for (const node of cluster.lab.nodes) {
      await eventually(`${node.v4}:80 to answer again`, async () => (await probe(node.v4, 80, { count: 3, timeoutMs: 1000 })).every((x) => x.ok), { timeoutMs: 20_000, intervalMs: 250 });
    }
  });

  it('a rolling restart of the echo Deployment under a steady client loses no more connections through pier than through kube-proxy\'s NodePort', async () => {
    // `kubectl create deployment` gives no readiness probe: a new pod would
    // count as ready before its server listens, and whichever proxy reacts
    // faster sends it connections sooner (measured: pier refused 14 of 383,
    // kube-proxy, a second behind, 5 of 381). A Deployment meant to roll
    // without loss has one; the pods also drain for ECHO_DRAIN_MS (their image).
    const probeSpec = { tcpSocket: { port: 8080 }, periodSeconds: 1 };
    await cluster.kubectl(['patch', 'deployment', 'echo', '--type=json', '-p', JSON.stringify([{ op: 'add', path: '/spec/template/spec/containers/0/readinessProbe', value: probeSpec }])]);
    await cluster.kubectl(['rollout', 'status', 'deployment/echo', '--timeout=180s']);
    const nodePort = (await svc('echo')).spec!.ports![0]!.nodePort!;
    const node = cluster.lab.nodes[0]!;
    const viaPier = steadyClient(node.v4, 80);
    const viaNodePort = steadyClient(node.v4, nodePort);
    await Promise.all([viaPier.started, viaNodePort.started]);
    await cluster.kubectl(['rollout', 'restart', 'deployment/echo']);
    await cluster.kubectl(['rollout', 'status', 'deployment/echo', '--timeout=180s']);
    // Until the old pods' endpoints have surely left every slice.
    await new Promise((r) => setTimeout(r, 3000));
    const [pier, kubeProxy] = await Promise.all([viaPier.stop(), viaNodePort.stop()]);
    const failed = (rs: ProbeResult[]) => rs.filter((r) => !r.ok).length;
    console.log(`[real-node] rolling restart: pier ${describeTally(tally(pier))}; NodePort ${describeTally(tally(kubeProxy))}`);
    expect(pier.length).toBeGreaterThan(50);
    expect(failed(pier)).toBeLessThanOrEqual(failed(kubeProxy));
  });

  it('a rolling update of the agent DaemonSet under a steady client fails no connection and loses no SYN', async () => {
    const synsBefore = await synRetransmits();
    const clients = cluster.lab.nodes.flatMap((n) => [steadyClient(n.v4, 80), steadyClient(n.v6, 80)]);
    await Promise.all(clients.map((c) => c.started));
    const before = await cluster.kubectl(['get', 'pods', '-n', SYSTEM, '-l', 'app.kubernetes.io/name=pier-agent', '-o', 'jsonpath={.items[*].metadata.uid}']);
    await cluster.kubectl(['-n', SYSTEM, 'rollout', 'restart', 'daemonset/pier-agent']);
    await cluster.kubectl(['-n', SYSTEM, 'rollout', 'status', 'daemonset/pier-agent', '--timeout=180s']);
    const results = await Promise.all(clients.map((c) => c.stop()));
    const after = await cluster.kubectl(['get', 'pods', '-n', SYSTEM, '-l', 'app.kubernetes.io/name=pier-agent', '-o', 'jsonpath={.items[*].metadata.uid}']);
    // Every agent pod was replaced while the clients ran.
    expect(after.split(' ').filter((uid) => before.split(' ').includes(uid))).toEqual([]);
    const syns = (await synRetransmits()) - synsBefore;
    console.log(`[real-node] agent rolling update: ${results.map((rs) => describeTally(tally(rs))).join('; ')}; SYNs retransmitted: ${syns}`);
    for (const rs of results) {
      expect(rs.length).toBeGreaterThan(50);
      expect(failures(rs), whenFailed(rs, []).slice(0, 8).join('\n')).toEqual(NO_FAILURES);
    }
    expect(syns).toBe(0);
  });

  /** Kills a pod's first container with SIGKILL through its node's containerd, as the kernel's OOM killer or a crash would end it; the kubelet starts it again. */
  const killContainer = async (namespace: string, pod: string) => {
    const out = await cluster.kubectl(['get', 'pod', '-n', namespace, pod, '-o', 'jsonpath={.spec.nodeName} {.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount}']);
    const [nodeName, containerId, restarts] = out.split(' ');
    const node = cluster.nodes.find((n) => n.name === nodeName)!;
    const id = containerId!.replace(/^containerd:\/\//, '');
    await node.exec('ctr', ['--address', join(node.dir, 'containerd.sock'), '--namespace', 'k8s.io', 'task', 'kill', '--signal', 'SIGKILL', id]);
    return Number(restarts);
  };
  const restartCount = async (namespace: string, pod: string) =>
    Number(await cluster.kubectl(['get', 'pod', '-n', namespace, pod, '-o', 'jsonpath={.status.containerStatuses[0].restartCount}']));
  it('the agent container SIGKILLed on a node three times, the kubelet starting it again (the third time after its 20 s back-off, past the agent\'s Lease), under a steady client: no connection refused, reset or timed out, and no SYN lost', async () => {
    // Issue 27. The third restart comes after the agent's Lease (20 s, set above) ran
    // out: the controller has withdrawn the node from the statuses, while the
    // rules left in place still serve it, and lists it again once the new
    // agent renews the Lease. That agent must not sync from the statuses
    // before the controller's answer (it did: 12 connections refused, 0.23 s).
    const labNode = cluster.lab.nodes[0]!;
    const statusBefore = ingressIps(await svc('echo'));
    const pod = (await cluster.kubectl(['get', 'pods', '-n', SYSTEM, '-l', 'app.kubernetes.io/name=pier-agent', '--field-selector', `spec.nodeName=${labNode.name}`, '-o', 'jsonpath={.items[0].metadata.name}'])).trim();
    const synsBefore = await synRetransmits();
    const invalidBefore = await conntrackInvalid(cluster.nodes[0]!);
    const steady = steadyClient(labNode.v4, 80);
    await steady.started;
    const kills: number[] = [];
    const logs: string[] = [];
    try {
      for (let i = 0; i < 3; i++) {
        await new Promise((r) => setTimeout(r, 1000));
        kills.push(Date.now());
        const restarts = await killContainer(SYSTEM, pod);
        // The kubelet starts the first again at once, later ones after its back-off (10 s, 20 s).
        await eventually(`the agent on ${labNode.name} restarted (${i + 1})`, async () => (await restartCount(SYSTEM, pod)) > restarts, { timeoutMs: 90_000, intervalMs: 100 });
        await eventually(`the agent on ${labNode.name} ready again (${i + 1})`, async () => (await fetch(`http://${labNode.v4}:10265/readyz`).catch(() => undefined))?.ok, { timeoutMs: 30_000, intervalMs: 100 });
        logs.push(`--- after kill ${i + 1} at ${new Date(kills.at(-1)!).toISOString()} ---\n${await cluster.kubectl(['-n', SYSTEM, 'logs', pod, '--tail=20'])}`);
      }
      await new Promise((r) => setTimeout(r, 2000));
    } finally {
      await steady.stop();
    }
    const results = steady.results;
    const syns = (await synRetransmits()) - synsBefore;
    console.log(`[real-node] agent container SIGKILLed 3 times: ${describeTally(tally(results))}; SYNs retransmitted: ${syns}`);
    if (results.some((r) => !r.ok)) console.log(`${whenFailed(results, kills).join('\n')}\n${logs.join('\n')}\n--- kube-proxy on ${labNode.name} ---\n${cluster.nodes[0]!.log('kube-proxy', 30)}`);
    expect(results.length).toBeGreaterThan(100);
    // What CI's tail shows of a failure: when each attempt failed, and what the agents said about their start.
    // A lone lost SYN, others around it answered, was one flow's conntrack entry: an earlier
    // connection's, open to a pod gone in the rolling restart (conntrack.ts). Listed if any is left.
    const said = logs.join('\n').split('\n').filter((l) => /run out|answer|full rewrite|"level":(40|50)/.test(l));
    const invalid = `conntrack invalid on ${labNode.name}: +${(await conntrackInvalid(cluster.nodes[0]!)) - invalidBefore}; SYNs retransmitted: ${syns}`;
    const stale = (await staleEntries(cluster.nodes[0]!, 80, 'echo')).slice(0, 5).map((l) => `stale: ${l}`);
    const why = [...whenFailed(results, kills).slice(0, 8), ...whenSlow(results, kills).slice(0, 8), invalid, ...stale, ...said.map((l) => l.slice(0, 300))].join('\n');
    expect(failures(results), why).toEqual(NO_FAILURES);
    expect(syns, why).toBe(0);
    expect(ingressIps(await svc('echo'))).toEqual(statusBefore);
  });

  it('the leading controller SIGKILLed under steady clients on every node address: the other replica takes over, no connection fails and every status stays', async () => {
    const statusBefore = ingressIps(await svc('echo'));
    const leader = (await cluster.kubectl(['-n', SYSTEM, 'get', 'lease', 'pier-controller', '-o', 'jsonpath={.spec.holderIdentity}'])).trim();
    expect(leader).toMatch(/^pier-controller-/);
    const synsBefore = await synRetransmits();
    const clients = cluster.lab.nodes.flatMap((n) => [steadyClient(n.v4, 80), steadyClient(n.v6, 80)]);
    await Promise.all(clients.map((c) => c.started));
    const kills = [Date.now()];
    // Killed, it cannot release its Lease; its pod then goes, so that the kubelet does not start it again.
    await killContainer(SYSTEM, leader);
    await cluster.kubectl(['-n', SYSTEM, 'delete', 'pod', leader, '--grace-period=0', '--force', '--wait=false']);
    // The Lease (15 s, deploy/) runs out; another replica leads, then writes nothing new.
    await eventually('another controller to lead', async () => {
      const holder = (await cluster.kubectl(['-n', SYSTEM, 'get', 'lease', 'pier-controller', '-o', 'jsonpath={.spec.holderIdentity}'])).trim();
      return holder !== '' && holder !== leader;
    }, { timeoutMs: 60_000, intervalMs: 500 });
    await new Promise((r) => setTimeout(r, 5000));
    const results = await Promise.all(clients.map((c) => c.stop()));
    await cluster.kubectl(['-n', SYSTEM, 'rollout', 'status', 'deployment/pier-controller', '--timeout=120s']);
    const syns = (await synRetransmits()) - synsBefore;
    console.log(`[real-node] controller failover: ${results.map((rs) => describeTally(tally(rs))).join('; ')}; SYNs retransmitted: ${syns}`);
    for (const rs of results) {
      expect(rs.length).toBeGreaterThan(50);
      expect(failures(rs), whenFailed(rs, kills).slice(0, 8).join('\n')).toEqual(NO_FAILURES);
    }
    expect(syns).toBe(0);
    expect(ingressIps(await svc('echo'))).toEqual(statusBefore);
  });

  /** pier's rules on every node, by backend: its iptables chains and its nftables tables. */
  const pierRules = async () => {
    const out = { iptables: [] as string[], nftables: [] as string[] };
    for (const node of cluster.nodes) {
      for (const save of ['iptables-save', 'ip6tables-save']) {
        const { stdout } = await node.exec(save, []);
        out.iptables.push(...stdout.split('\n').filter((l) => l.includes('PIER-')).map((l) => `${node.name} ${save}: ${l}`));
      }
      const { stdout } = await node.exec('nft', ['list', 'tables']);
      out.nftables.push(...stdout.split('\n').filter((l) => /^table ip6? pier$/.test(l)).map((l) => `${node.name}: ${l}`));
    }
    return out;
  };

  /** Rolls the agents out with PIER_BACKEND set, under steady clients on every node address; what they saw. */
  const switchBackend = async (backend: 'iptables' | 'nftables') => {
    const clients = cluster.lab.nodes.flatMap((n) => [steadyClient(n.v4, 80), steadyClient(n.v6, 80)]);
    await Promise.all(clients.map((c) => c.started));
    await cluster.kubectl(['-n', SYSTEM, 'set', 'env', 'daemonset/pier-agent', `PIER_BACKEND=${backend}`]);
    await cluster.kubectl(['-n', SYSTEM, 'rollout', 'status', 'daemonset/pier-agent', '--timeout=180s']);
    // The new agents' first syncs, then their removal of the other backend's rules.
    const other = backend === 'iptables' ? 'nftables' : 'iptables';
    await eventually(`no pier ${other} rules left`, async () => (await pierRules())[other].length === 0, { timeoutMs: 30_000, intervalMs: 500 });
    return Promise.all(clients.map((c) => c.stop()));
  };

  it('switching the agents to --backend nftables under steady clients: served throughout but for a moment, and no pier iptables chain left behind', async () => {
    expect((await pierRules()).iptables.length).toBeGreaterThan(0);
    const synsBefore = await synRetransmits();
    const results = await switchBackend('nftables');
    const failed = results.map((rs) => rs.filter((r) => !r.ok));
    // Known gap (issue 18): in 2 of ~35 switches one address refused connections
    // at once (ECONNREFUSED, 8 and 11 in a row, ~200 ms; IPv6 on n1 the last
    // time); printed, with the agents' logs, until understood.
    const when = (f: ProbeResult[]) => (f[0] ? ` (${f[0].error}, ${new Date(f[0].at!).toISOString()} to ${new Date(f.at(-1)!.at!).toISOString()})` : '');
    console.log(`[real-node] backend switch: failed ${failed.map((f, i) => `${f.length} of ${results[i]!.length}${when(f)}`).join(', ')}; SYNs retransmitted: ${(await synRetransmits()) - synsBefore}`);
    if (failed.some((f) => f.length > 0)) {
      console.log(await cluster.kubectl(['-n', SYSTEM, 'logs', '-l', 'app.kubernetes.io/name=pier-agent', '--tail=40', '--prefix']));
    }
    for (const rs of results) {
      expect(rs.length).toBeGreaterThan(50);
      // Served again right after: the last half second of each client answered.
      expect(rs.slice(-25).filter((r) => !r.ok)).toEqual([]);
    }
    expect((await pierRules()).nftables).toHaveLength(2 * cluster.nodes.length);
    const lease = await cluster.kubectl(['-n', SYSTEM, 'get', 'leases', '-l', 'pier.dev/component=agent', '-o', 'jsonpath={.items[*].metadata.annotations.pier\\.dev/backend}']);
    expect(lease.split(' ').sort()).toEqual(cluster.nodes.map(() => 'nftables'));
  });

  // pier's nftables backend beside kube-proxy in both modes (the agents were switched above), then its iptables backend.
  it.each([
    ['nftables', 'iptables'],
    ['nftables', 'nftables'],
    ['iptables', 'iptables'],
    ['iptables', 'nftables'],
  ] as const)('pier\'s %s backend beside kube-proxy in %s mode: ClusterIP and NodePort keep working, and kube-proxy leaves pier\'s addresses alone', async (backend, mode) => {
    if ((await pierRules())[backend].length === 0) {
      for (const rs of await switchBackend(backend)) expect(rs.filter((r) => !r.ok)).toEqual([]);
    }
    for (const node of cluster.nodes) if (node.spec.proxyMode !== mode) await node.setProxyMode(mode);
    const s = await svc('echo');
    const clusterIps = s.spec!.clusterIPs!;
    const nodePort = s.spec!.ports![0]!.nodePort!;
    const pods = await podNames('app=echo');
    for (const labNode of cluster.lab.nodes) {
      for (const ip of clusterIps) {
        const r = await eventually(`ClusterIP ${ip}:80 from ${labNode.name}`, async () => {
          const rs = await cluster.lab.probe(labNode, ip, 80, { count: 3, timeoutMs: 1000 });
          return rs.every((x) => x.ok) ? rs : undefined;
        }, { timeoutMs: 30_000, intervalMs: 500 });
        for (const pod of answeredBy(r)) expect(pods).toContain(pod);
      }
      for (const [host, port] of [[labNode.v4, nodePort], [labNode.v4, 80], [labNode.v6, 80]] as const) {
        const r = await eventually(`${host}:${port} from the client`, async () => {
          const rs = await probe(host, port, { count: 3, timeoutMs: 1000 });
          return rs.every((x) => x.ok) ? rs : undefined;
        }, { timeoutMs: 30_000, intervalMs: 500 });
        for (const pod of answeredBy(r)) expect(pods).toContain(pod);
      }
    }
    // ipMode Proxy: kube-proxy programs nothing for the load-balancer addresses, so pier alone serves them.
    for (const node of cluster.nodes) {
      const rules = mode === 'iptables'
        ? (await node.exec('iptables-save', ['-t', 'nat'])).stdout + (await node.exec('ip6tables-save', ['-t', 'nat'])).stdout
        : (await node.exec('nft', ['list', 'ruleset'])).stdout;
      expect(rules).toMatch(mode === 'iptables' ? /KUBE-SERVICES/ : /table ip kube-proxy/);
      // How kube-proxy spells "this address, TCP port 80" in its own rules; the ClusterIPs show the spelling is right.
      const kubeProxyRules =
        mode === 'iptables'
          ? rules.split('\n').filter((l) => l.startsWith('-A KUBE-')).join('\n')
          : // kube-proxy's own tables only: pier's nftables table names its addresses too.
            rules.split(/^(?=table )/m).filter((t) => /^table ip6? kube-proxy \{/.test(t)).join('');
      const spelled = (address: string) => (mode === 'iptables' ? `-d ${address}/${address.includes(':') ? 128 : 32} -p tcp` : `${address} . tcp . 80 `);
      for (const ip of clusterIps) expect(kubeProxyRules).toContain(spelled(ip));
      for (const labNode of cluster.lab.nodes) {
        for (const address of [labNode.v4, labNode.v6]) expect(kubeProxyRules).not.toContain(spelled(address));
      }
    }
  });

  it('a node\'s tables flushed with its kube-proxy stopped: its agent, restarted, reaches the API server by the address PIER_API_SERVER gives and puts its rules back', async () => {
    // Issue 27: through the kubernetes Service (kube-proxy's rules) an agent
    // that starts on such a node never gets its lists, and heals nothing.
    const node = cluster.nodes[0]!;
    const labNode = cluster.lab.nodes[0]!;
    const agentPod = async () =>
      (await cluster.kubectl(['-n', SYSTEM, 'get', 'pods', '-l', 'app.kubernetes.io/name=pier-agent', '--field-selector', `spec.nodeName=${node.name}`, '-o', 'jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[0].ready} {.metadata.deletionTimestamp}{"\\n"}{end}']))
        .split('\n')
        .filter(Boolean)
        .map((l) => l.split(' '));
    const [old] = await agentPod();
    const answered = async (host: string) => (await probe(host, 80, { count: 3, timeoutMs: 1000 })).every((r) => r.ok);
    expect(await answered(labNode.v4)).toBe(true);
    const kubernetesService = async () => {
      const r = await node.exec(process.execPath, ['-e', "require('net').connect(443, '198.18.0.1').setTimeout(2000, () => process.exit(2)).on('connect', () => process.exit(0)).on('error', () => process.exit(1))"], { reject: false });
      return r.exitCode === 0;
    };
    expect(await kubernetesService()).toBe(true);

    await node.stopProxy();
    try {
      // Every table on the node: kube-proxy's, the kubelet's and pier's.
      await node.exec('nft', ['flush', 'ruleset']);
      expect(await kubernetesService()).toBe(false);
      await cluster.kubectl(['-n', SYSTEM, 'delete', 'pod', old![0]!, '--wait=false']);
      // Ready is the new agent's first sync done: it listed Services, slices and its Node.
      const fresh = await eventually('a new agent on the node, ready', async () => (await agentPod()).find(([name, ready, deleting]) => name !== old![0] && ready === 'true' && !deleting), { timeoutMs: 90_000, intervalMs: 500 });
      const log = await cluster.kubectl(['-n', SYSTEM, 'logs', fresh[0]!]);
      const credentials = log.split('\n').find((l) => l.includes('using Kubernetes credentials'));
      expect(credentials).toContain(`"server":"${cluster.cp.server}"`);
      // kube-proxy is still away: the node has no rule for the kubernetes Service.
      expect(await kubernetesService()).toBe(false);
      await eventually(`${labNode.v4}:80 and [${labNode.v6}]:80 answered`, async () => (await answered(labNode.v4)) && (await answered(labNode.v6)), { timeoutMs: 30_000, intervalMs: 500 });
    } finally {
      await node.masqueradePods();
      await node.setProxyMode(node.spec.proxyMode);
    }
    await eventually('the kubernetes Service on the node again', kubernetesService, { timeoutMs: 30_000, intervalMs: 500 });
  });

  it('uninstalls as the README says: kubectl delete -k, then deploy/cleanup leaves no PIER chain and no pier table on any node', async () => {
    const chains = async () => {
      const r = await pierRules();
      return [...r.iptables, ...r.nftables];
    };
    expect((await chains()).length).toBeGreaterThan(0);
    const kubeconfig = cluster.cp.adminKubeconfigPath;
    // The README's uninstall, as written but for the overlay ("or the overlay/base you applied": the kind one here).
    await runReadme('uninstall-kind', { kubeconfig });
    // The agents stop; their rules stay (an upgrade must drop no traffic).
    expect((await chains()).length).toBeGreaterThan(0);
    // The sweep: apply deploy/cleanup, its rollout status, delete it.
    await runReadme('uninstall-sweep', { kubeconfig });
    expect(await chains()).toEqual([]);
  });
});
