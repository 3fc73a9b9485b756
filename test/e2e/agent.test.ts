// The agent end to end: a real API server, a two-node lab, one `pier agent`
// process inside each node namespace, and real TCP and UDP from clients.
// The tests write Service status themselves, exactly as docs/architecture.md section 1
// specifies, so that each case controls precisely what the agent sees
// (controller-agents.test.ts runs the two together). Every case runs once per
// rule backend (--backend iptables, then nftables), each in a lab of its own.
import { chmodSync, copyFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  CoordinationV1Api,
  CoreV1Api,
  DiscoveryV1Api,
  EventsV1Api,
  PatchStrategy,
  setHeaderOptions,
  type EventsV1Event,
  type V1Service,
} from '@kubernetes/client-node';
import type { ResultPromise } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { agentLeaseName, LEASE_BACKEND, LEASE_FORWARDING_IPV4, LEASE_FORWARDING_IPV4_REASON, LEASE_IPTABLES_BACKEND } from '../../lib/contract.ts';
import { ensureNamespace, startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { ECHO_PORT, HOST_V4, Lab, type Endpoint, type LabNode, type ProbeResult } from '../lab/lab.ts';
import { createLabService, registerLabNodes, type LabServicePort } from '../lab/pier.ts';
import { isAlive } from '../support/cleanup.ts';
import { endpointSlice } from '../support/objects.ts';
import { eventually } from '../support/wait.ts';

const CLI = fileURLToPath(new URL('../../cmd/cli.ts', import.meta.url));
const NS = 'shop';
const RESYNC = '2s';
const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);
/** What the ForwardPolicyDrop Event asks for on a host whose FORWARD policy drops, in both families. */
const DNAT_ACCEPT = ['-I', 'FORWARD', '1', '-m', 'conntrack', '--ctstate', 'DNAT', '-j', 'ACCEPT'];

/**
 * `nft list table` as comparable text: the kernel lists a hash set's
 * elements in hash order and chains in the order they were added (a full
 * write and a history of small changes differ there), so elements and
 * chains are sorted; handles and counters are dropped, and so are the
 * clients the packet path put into affinity sets (they expire).
 */
function normaliseNft(text: string): string {
  const flat = text
    .replace(/,\n\s*/g, ', ')
    .replace(/\n\t\telements = \{[^}]* expires [^}]*\}/g, '')
    .replace(/ # handle \d+/g, '')
    .replace(/counter packets \d+ bytes \d+/g, 'counter')
    .replace(/\{ ([^{}\n]*) \}/g, (_, items: string) => `{ ${items.split(', ').sort().join(', ')} }`);
  const head: string[] = [];
  const blocks: string[][] = [];
  let block: string[] | undefined;
  for (const l of flat.split('\n')) {
    if (/^\t(chain|set|map) /.test(l)) blocks.push((block = []));
    if (block) block.push(l);
    else if (l.trim() !== '') head.push(l);
    if (l === '\t}') block = undefined;
  }
  return [...head.filter((l) => l !== '}'), ...blocks.map((b) => b.join('\n')).sort(), '}'].join('\n');
}

/** A frontend as nft prints it in a set or map element: `address . proto . port`. */
const nftFrontend = (ip: string, proto: 'tcp' | 'udp', port: number) => new RegExp(`${ip.replace(/\./g, '\\.')} \\. ${proto} \\. ${port}\\b`);

describe.each(['iptables', 'nftables'] as const)('pier agent in the lab, %s backend', (backend) => {
  const nft = backend === 'nftables';
  let lab: Lab;
  let cp: ControlPlane;
  let core: CoreV1Api;
  let discovery: DiscoveryV1Api;
  let kubeconfig: string;
  const agents = new Map<string, ResultPromise>();
  const agentLogs = new Map<string, string>();

  const startAgent = (n: LabNode) => {
    const proc = lab.spawn(n.ns, process.execPath, [
      CLI, 'agent',
      '--node-name', n.name,
      '--kubeconfig', kubeconfig,
      '--min-sync-interval', '100ms',
      '--resync-period', RESYNC,
      '--lease-renew-interval', '500ms',
      '--lease-duration', '5s',
      '--log-level', 'info',
      '--backend', backend,
    ]);
    agentLogs.set(n.name, '');
    proc.stderr?.on('data', (d: Buffer) => agentLogs.set(n.name, (agentLogs.get(n.name) ?? '') + d.toString()));
    agents.set(n.name, proc);
    return proc;
  };
  const ready = (n: LabNode) =>
    eventually(`agent on ${n.name} ready`, async () => (await fetch(`http://${n.v4}:10265/readyz`).catch(() => undefined))?.ok, { timeoutMs: 30_000 });

  const client = (i: number): Endpoint => lab.clients[i]!;
  const nodeIps = (family: 'v4' | 'v6') => lab.nodes.map((n) => n[family]);
  const save = async (n: LabNode, family: 'v4' | 'v6' = 'v4') =>
    (await lab.exec(n.ns, family === 'v4' ? 'iptables-save' : 'ip6tables-save', [])).stdout;
  /** pier's rules on a node as text: iptables-save, or pier's nftables table (which names each Service port in a comment). */
  const rules = async (n: LabNode, family: 'v4' | 'v6' = 'v4') =>
    nft ? (await lab.exec(n.ns, 'nft', ['list', 'table', family === 'v4' ? 'ip' : 'ip6', 'pier'])).stdout : save(n, family);
  /** Whether pier's rules on `n` DNAT the TCP frontend at `port` (iptables' nat rules name no Service: a served connection would pay for the comment). */
  const servesPort = async (n: LabNode, port: number, family: 'v4' | 'v6' = 'v4') =>
    nft ? nftFrontend(n[family], 'tcp', port).test(await rules(n, family)) : new RegExp(`-p tcp -m tcp --dport ${port} .*-j (DNAT|PIER-SVC-)`).test(await save(n, family));
  /** pier's nftables tables of both families in `ns`, normalised. */
  const nftTables = async (ns: string, where: Lab = lab) => {
    const out: string[] = [];
    for (const family of ['ip', 'ip6']) out.push(normaliseNft((await where.exec(ns, 'nft', ['list', 'table', family, 'pier'])).stdout));
    return out.join('\n');
  };

  /** Creates a Service with its slices and writes the status a controller would. */
  const createService = (name: string, ports: LabServicePort[], pods: { v4: string; v6: string; node: string }[], extra: Partial<NonNullable<V1Service['spec']>> = {}, statusFor: LabNode[] = lab.nodes) =>
    createLabService({ core, discovery }, NS, name, ports, pods, { nodes: statusFor, extra });

  const answered = (results: ProbeResult[]) => results.filter((r) => r.ok).map((r) => r.reply!.pod);
  const probeUntilOk = (from: Endpoint, host: string, port: number, proto: 'tcp' | 'udp' = 'tcp') =>
    eventually(`${proto} ${host}:${port} answered`, async () => {
      const [r] = await lab.probe(from, host, port, { proto, timeoutMs: 500 });
      return r?.ok ? r : false;
    }, { timeoutMs: 20_000 });

  beforeAll(async () => {
    lab = await Lab.create({ nodes: [2, 2], clients: 2, hostLink: true });
    cp = await startControlPlane({ address: HOST_V4 });
    core = cp.admin.makeApiClient(CoreV1Api);
    discovery = cp.admin.makeApiClient(DiscoveryV1Api);
    await ensureNamespace(core, NS);
    await ensureNamespace(core, 'pier-system');
    kubeconfig = cp.adminKubeconfigPath;
    await registerLabNodes(core, lab);
    // n1 is a strict host: FORWARD policy DROP with only the CNI's own
    // accepts (pod to pod, other nodes to its pods), plus rules of its own
    // that pier must leave alone. pier's DNATed traffic must still flow.
    const [n1, n2] = lab.nodes as [LabNode, LabNode];
    const host: [string, string[]][] = [
      ['iptables', ['-P', 'FORWARD', 'DROP']],
      ['iptables', ['-A', 'FORWARD', '-s', '198.19.0.0/16', '-d', '198.19.0.0/16', '-j', 'ACCEPT']],
      ['iptables', ['-A', 'FORWARD', '-s', `${n2.v4}/32`, '-d', n1.podCidrV4, '-j', 'ACCEPT']],
      ['iptables', ['-A', 'FORWARD', '-s', n1.podCidrV4, '-d', `${n2.v4}/32`, '-j', 'ACCEPT']],
      ['iptables', ['-N', 'HOST-OWN']],
      ['iptables', ['-A', 'HOST-OWN', '-s', '203.0.113.0/24', '-j', 'DROP']],
      ['iptables', ['-A', 'INPUT', '-j', 'HOST-OWN']],
      ['iptables', ['-t', 'nat', '-A', 'POSTROUTING', '-s', n1.podCidrV4, '!', '-d', '198.19.0.0/16', '-j', 'MASQUERADE']],
      ['ip6tables', ['-P', 'FORWARD', 'DROP']],
      ['ip6tables', ['-A', 'FORWARD', '-s', '2001:db8:1::/48', '-d', '2001:db8:1::/48', '-j', 'ACCEPT']],
      ['ip6tables', ['-A', 'FORWARD', '-s', `${n2.v6}/128`, '-d', n1.podCidrV6, '-j', 'ACCEPT']],
      ['ip6tables', ['-A', 'FORWARD', '-s', n1.podCidrV6, '-d', `${n2.v6}/128`, '-j', 'ACCEPT']],
    ];
    for (const [tool, args] of host) await lab.exec(n1.ns, tool, args);
    hostRulesBefore = await ruleLines(n1);
    for (const n of lab.nodes) startAgent(n);
    await Promise.all(lab.nodes.map(ready));
    if (nft) {
      // An accept in pier's table cannot override n1's FORWARD drop: its
      // agent says so, and the host's admin adds the accept the Event names
      // (a rule of the host's own, which pier cleanup leaves alone).
      const events = cp.admin.makeApiClient(EventsV1Api);
      forwardDrop = await eventually('ForwardPolicyDrop event on n1', async () =>
        (await events.listNamespacedEvent({ namespace: 'default' })).items.find((e) => e.reason === 'ForwardPolicyDrop' && e.regarding?.name === n1.name),
      ).catch((err: unknown) => err as Error);
      for (const tool of ['iptables', 'ip6tables']) await lab.exec(n1.ns, tool, DNAT_ACCEPT);
      for (const tool of ['iptables-save', 'ip6tables-save']) {
        const at = hostRulesBefore.findIndex((l) => l.startsWith(`${tool} filter -A FORWARD `));
        hostRulesBefore.splice(at, 0, `${tool} filter -A FORWARD -m conntrack --ctstate DNAT -j ACCEPT`);
      }
    }
  });
  let hostRulesBefore: string[] = [];
  /** nftables backend: n1's agent's Event about the FORWARD policy DROP, or why it did not come. */
  let forwardDrop: EventsV1Event | Error | undefined;
  /** Every chain declaration and rule of both families and tables, without counters. */
  const ruleLines = async (n: LabNode, where: Lab = lab) => {
    const lines: string[] = [];
    for (const tool of ['iptables-save', 'ip6tables-save']) {
      for (const table of ['nat', 'filter']) {
        const out = (await where.exec(n.ns, tool, ['-t', table])).stdout;
        for (const l of out.split('\n')) {
          // A table nobody used yet is not printed at all; an ACCEPT policy is the same as no table.
          if (/^:(PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) ACCEPT/.test(l)) continue;
          if (l.startsWith('-') || l.startsWith(':')) lines.push(`${tool} ${table} ${l.replace(/ ?\[\d+:\d+\]/, '')}`);
        }
      }
    }
    return lines;
  };

  afterAll(async () => {
    for (const [name, log] of agentLogs) if (/"level":"(error|fatal)"/.test(log)) console.log(`--- agent ${name} errors ---\n${log.split('\n').filter((l) => /"level":"(error|fatal)"/.test(l)).slice(-10).join('\n')}`);
    await lab?.destroy();
    await cp?.stop();
  });

  if (nft) {
    it('reports the strict host\'s FORWARD policy DROP, which its table cannot override, in a Node Event and its log', async () => {
      const [n1, n2] = lab.nodes as [LabNode, LabNode];
      if (forwardDrop instanceof Error) throw forwardDrop;
      expect(forwardDrop?.type).toBe('Warning');
      expect(forwardDrop?.note).toContain('ip filter FORWARD');
      expect(forwardDrop?.note).toContain('ip6 filter FORWARD');
      expect(forwardDrop?.note).toContain('--ctstate DNAT -j ACCEPT');
      const said = (n: LabNode) => (agentLogs.get(n.name) ?? '').includes("pier's nftables table cannot accept across tables");
      expect(said(n1)).toBe(true);
      // n2's FORWARD accepts: nothing to report.
      expect(said(n2)).toBe(false);
      // The remedy (beforeAll) is the host's: pier wrote no iptables rule.
      expect(await ruleLines(n1)).toEqual(hostRulesBefore);
    });
  }

  it('serves IPv4 and IPv6, TCP and UDP, on every node address, spread over the pods (Cluster policy)', async () => {
    await createService('web', [{ name: 'http', port: 80 }, { name: 'dns', port: 53, protocol: 'UDP' }], lab.pods);
    for (const family of ['v4', 'v6'] as const) {
      for (const [proto, port] of [['tcp', 80], ['udp', 53]] as const) {
        for (const ip of nodeIps(family)) {
          await probeUntilOk(client(0), ip, port, proto);
          const results = await lab.probe(client(0), ip, port, { proto, count: 40, timeoutMs: 1000 });
          const pods = answered(results);
          expect(pods, `${proto} ${ip}:${port}`).toHaveLength(40);
          const distinct = new Set(pods);
          expect(distinct.size, `${proto} ${ip}:${port} spread`).toBeGreaterThanOrEqual(2);
          // Cluster: pods behind the other node answer too.
          const nodeOfIp = lab.nodes.find((n) => n[family] === ip)!;
          expect([...distinct].some((p) => !p.startsWith(`${nodeOfIp.name}-`)), `remote pods answer via ${ip}`).toBe(true);
          // Masqueraded: pods see a node address, not the client.
          expect(results.every((r) => r.reply!.peer !== client(0)[family])).toBe(true);
        }
      }
    }
  });

  if (!nft) {
    it('a connection\'s packets, both ways, meet two rules of PIER-FORWARD and no port\'s: nat marked it at its first', async () => {
      // n1's FORWARD policy is DROP: every packet of these connections must be accepted by pier.
      const n1 = lab.nodes[0]!;
      const k = 20;
      for (const [family, save] of [['v4', 'iptables'], ['v6', 'ip6tables']] as const) {
        for (const table of ['filter', 'nat']) await lab.exec(n1.ns, save, ['-t', table, '-Z']);
        const results = await lab.probe(client(0), n1[family], 80, { count: k, timeoutMs: 1000 });
        expect(results.filter((r) => !r.ok), family).toEqual([]);
        const counted = (await lab.exec(n1.ns, `${save}-save`, ['-c'])).stdout
          .split('\n')
          .map((l) => /^\[(\d+):\d+\] -A (\S+) (.*)$/.exec(l))
          .filter((m) => m !== null)
          .map(([, packets, chain, rule]) => ({ packets: Number(packets), chain: chain!, rule: rule! }));
        const marked = counted.filter((r) => r.chain.startsWith('PIER-SVC') && / --dport 80 .*-j CONNMARK/.test(r.rule));
        const head = counted.find((r) => r.chain === 'PIER-FORWARD' && r.rule.includes('-m connmark'))!;
        // Each connection is marked once, by nat, which sees only its first packet...
        expect(marked.reduce((n, r) => n + r.packets, 0), family).toBe(k);
        // ...and all its packets (the handshake's, the reply's, the close's, either way) meet the mark.
        expect(head.packets, family).toBeGreaterThanOrEqual(5 * k);
        const perPort = counted.filter((r) => (r.rule.includes('--ctorigdst') || r.chain.startsWith('PIER-FWD-') || r.chain === 'PIER-ACCEPT') && r.packets > 0);
        expect(perPort, family).toEqual([]);
      }
    });
  }

  it('Local policy: only local pods answer, and they see the client address', async () => {
    await createService('local', [{ name: 'http', port: 81 }], lab.pods, { externalTrafficPolicy: 'Local' });
    for (const family of ['v4', 'v6'] as const) {
      for (const n of lab.nodes) {
        await probeUntilOk(client(0), n[family], 81);
        const results = await lab.probe(client(0), n[family], 81, { count: 30, timeoutMs: 1000 });
        expect(results.every((r) => r.ok)).toBe(true);
        expect(new Set(answered(results))).toEqual(new Set(n.pods.map((p) => p.name)));
        expect(new Set(results.map((r) => r.reply!.peer))).toEqual(new Set([client(0)[family]]));
      }
    }
  });

  it('session affinity ClientIP: each client sticks to one pod, TCP and UDP, v4 and v6, Cluster and Local, switched live', async () => {
    const ports: LabServicePort[] = [{ name: 'http', port: 94 }, { name: 'dns', port: 95, protocol: 'UDP' }];
    const sticky = { sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 300 } } };
    await createService('sticky', ports, lab.pods, sticky);
    const patch = (spec: object) => core.patchNamespacedService({ name: 'sticky', namespace: NS, body: { spec } }, mergePatch);
    /** Per client, the pods that answered 20 connections to each node address; every connection must be answered. */
    const seen = async (family: 'v4' | 'v6', proto: 'tcp' | 'udp', n: LabNode) => {
      const port = proto === 'tcp' ? 94 : 95;
      await probeUntilOk(client(0), n[family], port, proto);
      const out: Set<string>[] = [];
      for (const c of [0, 1]) {
        const results = await lab.probe(client(c), n[family], port, { proto, count: 20, timeoutMs: 1000 });
        expect(results.filter((r) => !r.ok), `${proto} ${n[family]}:${port} from client ${c}`).toEqual([]);
        out.push(new Set(answered(results)));
      }
      return out;
    };
    const eachFrontend = async (check: (family: 'v4' | 'v6', proto: 'tcp' | 'udp', n: LabNode) => Promise<void>) => {
      for (const family of ['v4', 'v6'] as const) for (const proto of ['tcp', 'udp'] as const) for (const n of lab.nodes) await check(family, proto, n);
    };
    /**
     * Waits until every frontend shows `sticky` (each agent syncs on its
     * own), then checks each once more: a client that sticks only now and
     * then must fail.
     */
    const settle = async (what: string, sticky: boolean, local = false) => {
      // A UDP probe whose source port a flow of the last phase still holds is
      // that flow (conntrack), not a new connection, and keeps its pod:
      // affinity decides new flows only. Those flows go first.
      for (const n of lab.nodes) {
        for (const family of ['ipv4', 'ipv6']) await lab.exec(n.ns, 'conntrack', ['-D', '-f', family, '-p', 'udp', '--orig-port-dst', '95'], { reject: false });
      }
      const ok = (pods: Set<string>[], n: LabNode) =>
        pods.every((p) => (sticky ? p.size === 1 && (!local || n.pods.some((x) => p.has(x.name))) : p.size > 1));
      await eachFrontend(async (family, proto, n) => void (await eventually(`${what}: ${proto} ${n[family]}`, async () => ok(await seen(family, proto, n), n), { timeoutMs: 20_000 })));
      // Without affinity, four pods and 20 connections: one pod alone is a 4^-19 chance.
      await eachFrontend(async (family, proto, n) => expect(ok(await seen(family, proto, n), n), `${what}: ${proto} ${n[family]}`).toBe(true));
    };
    await settle('affinity on', true);
    await patch({ sessionAffinity: 'None', sessionAffinityConfig: null });
    await settle('affinity off', false);
    // On again, with Local policy: a client sticks to one of the node's own pods.
    await patch({ ...sticky, externalTrafficPolicy: 'Local' });
    await settle('affinity on, Local', true, true);
    // An agent restart (its first sync rewrites every rule) forgets no client.
    const n1 = lab.nodes[0]!;
    const remembered = await Promise.all((['v4', 'v6'] as const).map((f) => seen(f, 'tcp', n1)));
    agents.get(n1.name)!.kill('SIGKILL');
    await agents.get(n1.name)!.catch(() => undefined);
    startAgent(n1);
    await ready(n1);
    expect(await Promise.all((['v4', 'v6'] as const).map((f) => seen(f, 'tcp', n1))), 'after the agent restarted').toEqual(remembered);
    // The pod a client sticks to leaves: the client moves to another, and sticks there.
    const [before] = await seen('v4', 'tcp', n1);
    const left = lab.pods.filter((p) => p.name !== [...before!][0]);
    for (const [family, type] of [['v4', 'IPv4'], ['v6', 'IPv6']] as const) {
      const body = endpointSlice(NS, 'sticky', type, left.map((p) => ({ address: p[family], nodeName: p.node })), ports.map((p) => ({ name: p.name, port: ECHO_PORT, protocol: p.protocol })));
      await discovery.replaceNamespacedEndpointSlice({ name: body.metadata!.name!, namespace: NS, body });
    }
    await eventually('client moved', async () => {
      const [after] = await seen('v4', 'tcp', n1);
      return after!.size === 1 && !after!.has([...before!][0]!);
    });
  });

  it('hairpin: a pod reaches itself through its node address', async () => {
    const pod = lab.nodes[0]!.pods[0]!;
    await createService('hairpin', [{ name: 'http', port: 82 }], [pod], { externalTrafficPolicy: 'Local' });
    const r = await probeUntilOk(pod, lab.nodes[0]!.v4, 82);
    expect(r.reply!.pod).toBe(pod.name);
  });

  it('source ranges: a client inside the range is served, one outside is not', async () => {
    await createService('ranged', [{ name: 'http', port: 83 }], lab.pods, {
      loadBalancerSourceRanges: [`${client(0).v4}/32`, `${client(0).v6}/128`],
    });
    for (const family of ['v4', 'v6'] as const) {
      const ip = lab.nodes[0]![family];
      await probeUntilOk(client(0), ip, 83);
      const [outside] = await lab.probe(client(1), ip, 83, { timeoutMs: 1500 });
      expect(outside!.ok, `${family} outside the range`).toBe(false);
    }
  });

  it('source ranges also hold where FORWARD is not crossed: a client on the node, an endpoint on the host network', async () => {
    const n1 = lab.nodes[0]!;
    const ranges = [`${client(0).v4}/32`, `${client(0).v6}/128`];
    // The node's own connections are DNATed in nat OUTPUT and leave without crossing FORWARD.
    await createService('ranged-local', [{ name: 'http', port: 88 }], lab.pods, { loadBalancerSourceRanges: ranges });
    for (const family of ['v4', 'v6'] as const) {
      await probeUntilOk(client(0), n1[family], 88);
      const [own] = await lab.probe(n1, n1[family], 88, { timeoutMs: 1500 });
      expect(own!.ok, `${family} from the node, outside the range`).toBe(false);
    }
    // Listed, the node is served: what dropped it was the range.
    const listed = [...ranges, `${n1.v4}/32`, `${n1.v6}/128`];
    await core.patchNamespacedService({ name: 'ranged-local', namespace: NS, body: { spec: { loadBalancerSourceRanges: listed } } }, mergePatch);
    for (const family of ['v4', 'v6'] as const) await probeUntilOk(n1, n1[family], 88);

    // An endpoint on the host network: DNATed to the node's own address, the
    // connection is delivered through INPUT.
    await lab.hostEcho(n1);
    const host = { name: `${n1.name}-host`, v4: n1.v4, v6: n1.v6, node: n1.name };
    await createService('ranged-host', [{ name: 'http', port: 89 }], [host], { loadBalancerSourceRanges: ranges }, [n1]);
    for (const family of ['v4', 'v6'] as const) {
      const inside = await probeUntilOk(client(0), n1[family], 89);
      expect(inside.reply!.pod).toBe(host.name);
      const [outside] = await lab.probe(client(1), n1[family], 89, { timeoutMs: 1500 });
      expect(outside!.ok, `${family} to the host network, outside the range`).toBe(false);
    }
  });

  it('no endpoints: every connection is refused at once, also past the kernel\'s ICMP burst of 6 a client', async () => {
    await createService('empty', [{ name: 'http', port: 84 }], []);
    const n1 = lab.nodes[0]!;
    // An ICMP-refused 7th SYN would be answered only by its retransmit, a second later.
    for (const family of ['v4', 'v6'] as const) {
      await eventually(`${family} REJECT rule for the empty service`, async () =>
        nft ? nftFrontend(n1[family], 'tcp', 84).test(await rules(n1, family)) : (await save(n1, family)).includes('shop/empty:http'),
      );
      const rs = await lab.probe(client(0), n1[family], 84, { count: 12, timeoutMs: 3000 });
      expect(rs.map((r) => r.error), family).toEqual(Array(12).fill('ECONNREFUSED'));
      expect(Math.max(...rs.map((r) => r.ms)), family).toBeLessThan(500);
    }
  });

  it('skips Services with bad input with a Warning Event and a metric, and keeps serving the others', async () => {
    // The API server validates most fields (CIDRs, addresses, protocols), so
    // what reaches an agent is a status that disagrees with the spec (written
    // by a buggy or foreign controller) or a Service that is too large.
    await createService('skewed', [{ name: 'http', port: 86 }], lab.pods);
    const ingress = lab.nodes.map((n) => ({ ip: n.v4, ipMode: 'Proxy', ports: [{ port: 86, protocol: 'UDP' }] }));
    await core.patchNamespacedServiceStatus({ name: 'skewed', namespace: NS, body: { status: { loadBalancer: { ingress } } } }, mergePatch);
    // 1,000 ports: far over --max-ports-per-service.
    const many = Array.from({ length: 1000 }, (_, i) => ({ name: `p${i}`, port: 20000 + i }));
    await createService('huge', many, lab.pods.slice(0, 1));
    const events = cp.admin.makeApiClient(EventsV1Api);
    const warning = (name: string, reason: string) =>
      eventually(`${reason} event on ${name}`, async () =>
        (await events.listNamespacedEvent({ namespace: NS })).items.find((e) => e.regarding?.name === name && e.reason === reason),
      );
    const skewed = await warning('skewed', 'StatusPortMismatch');
    expect(skewed.type).toBe('Warning');
    expect(skewed.note).toContain('"UDP"');
    const huge = await warning('huge', 'TooManyPorts');
    expect(huge.note).toContain('1000');
    const n = lab.nodes[0]!;
    const [r86] = await lab.probe(client(0), n.v4, 86, { timeoutMs: 1000 });
    expect(r86!.ok).toBe(false);
    expect(await servesPort(n, 20000)).toBe(false);
    const [r80] = await lab.probe(client(0), n.v4, 80);
    expect(r80!.ok).toBe(true);
    const metrics = await (await fetch(`http://${n.v4}:10265/metrics`)).text();
    expect(metrics).toMatch(/pier_agent_service_problems\{reason="StatusPortMismatch"\} 1/);
    expect(metrics).toMatch(/pier_agent_service_problems\{reason="TooManyPorts"\} 1/);
    expect(metrics).toMatch(/pier_agent_sync_duration_seconds_count\{family="ipv4",mode="partial"\} [1-9]/);
    expect(metrics).toMatch(/pier_agent_forwarding\{family="ipv6"\} 1/);
    expect(metrics).toMatch(new RegExp(`pier_agent_rules\\{family="ipv4",table="${nft ? 'pier' : 'nat'}"\\} [1-9]\\d*`));
    await core.deleteNamespacedService({ name: 'huge', namespace: NS });
    await core.deleteNamespacedService({ name: 'skewed', namespace: NS });
  });

  it('a deleted Service loses its rules at the next sync; the others keep theirs', async () => {
    await createService('doomed', [{ name: 'http', port: 85 }], lab.pods);
    await probeUntilOk(client(0), lab.nodes[0]!.v4, 85);
    expect(await servesPort(lab.nodes[0]!, 85)).toBe(true);
    await core.deleteNamespacedService({ name: 'doomed', namespace: NS });
    for (const n of lab.nodes) {
      await eventually(`doomed gone from ${n.name}`, async () => !(await servesPort(n, 85)), { timeoutMs: 5000 });
      await eventually(`doomed gone from ${n.name} (v6)`, async () => !(await servesPort(n, 85, 'v6')), { timeoutMs: 5000 });
    }
    const [r] = await lab.probe(client(0), lab.nodes[0]!.v4, 80);
    expect(r!.ok).toBe(true);
  });

  it('applied every change so far as a change: none failed and fell back to a whole rewrite', () => {
    const fellBack = nft ? "changing pier's nftables table failed" : 'partial restore failed';
    for (const n of lab.nodes) expect(agentLogs.get(n.name), `agent on ${n.name}`).not.toContain(fellBack);
  });

  it('survives SIGKILL and restart with zero failed connections, and re-applying changes nothing', async () => {
    const n = lab.nodes[0]!;
    const normalise = (text: string) => text.split('\n').filter((l) => !l.startsWith('#')).map((l) => l.replace(/\[\d+:\d+\]/, '[0:0]')).join('\n');
    const snapshot = async () => (nft ? nftTables(n.ns) : normalise(await save(n)));
    const before = await snapshot();
    expect(await servesPort(n, 80)).toBe(true);
    const loop = lab.probe(client(0), n.v4, 80, { count: 150, intervalMs: 20, timeoutMs: 1000 });
    await new Promise((r) => setTimeout(r, 500));
    agents.get(n.name)!.kill('SIGKILL');
    await agents.get(n.name)!.catch(() => undefined);
    startAgent(n);
    await ready(n);
    const results = await loop;
    expect(results.filter((r) => !r.ok)).toEqual([]);
    expect(await snapshot()).toBe(before);
  });

  it('heals an outside flush of the nat table within the resync period', async () => {
    const n = lab.nodes[1]!;
    if (nft) {
      const drifts = () => (agentLogs.get(n.name) ?? '').split('\n').filter((l) => l.includes("pier's nftables table was changed from outside; replacing it")).length;
      const changes: [string, string[], string[], (listed: string) => boolean][] = [
        ['table deleted', ['delete', 'table', 'ip', 'pier'], ['list', 'tables'], (l) => !l.includes('table ip pier')],
        ['nat-prerouting flushed', ['flush', 'chain', 'ip', 'pier', 'nat-prerouting'], ['list', 'chain', 'ip', 'pier', 'nat-prerouting'], (l) => !l.includes('vmap')],
        ['a map element deleted', ['delete', 'element', 'ip', 'pier', 'services', `{ ${n.v4} . tcp . 80 }`], ['list', 'map', 'ip', 'pier', 'services'], (l) => !nftFrontend(n.v4, 'tcp', 80).test(l)],
      ];
      for (const [what, change, list, gone] of changes) {
        const logged = drifts();
        await lab.exec(n.ns, 'nft', change);
        const start = Date.now();
        // Read back at once: the agent may heal at any moment after.
        expect(gone((await lab.exec(n.ns, 'nft', list)).stdout), what).toBe(true);
        await probeUntilOk(client(0), n.v4, 80);
        expect(Date.now() - start, what).toBeLessThan(2000 + 3000);
        await eventually(`the drift logged after ${what}`, () => drifts() > logged, { timeoutMs: 2000 });
      }
      return;
    }
    // Flush and read back in one go: the agent may heal at any moment after.
    const flushed = await lab.exec(n.ns, 'sh', ['-c', 'iptables -t nat -F && iptables-save -t nat']);
    expect(flushed.stdout.split('\n').filter((l) => l.startsWith('-A '))).toEqual([]);
    const start = Date.now();
    await probeUntilOk(client(0), n.v4, 80);
    expect(Date.now() - start).toBeLessThan(2000 + 3000);
  });

  it('pier plan, from manifests of the same objects, yields exactly the agent\'s ruleset on an empty host', async () => {
    const n = lab.nodes[1]!;
    const dir = mkdtempSync(join(tmpdir(), 'pier-plan-'));
    try {
      const svcs = (await core.listNamespacedService({ namespace: NS })).items;
      const slices = (await discovery.listNamespacedEndpointSlice({ namespace: NS })).items;
      const nodeObj = await core.readNode({ name: n.name });
      // As `kubectl get -o yaml` would write them: a List, single objects, and JSON.
      writeFileSync(join(dir, 'services.yaml'), stringify({ apiVersion: 'v1', kind: 'List', items: svcs.map((x) => ({ apiVersion: 'v1', kind: 'Service', ...x })) }));
      writeFileSync(join(dir, 'slices.yaml'), slices.map((x) => stringify({ apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', ...x })).join('---\n'));
      writeFileSync(join(dir, 'node.json'), JSON.stringify({ apiVersion: 'v1', kind: 'Node', ...nodeObj }));
      writeFileSync(join(dir, 'README.txt'), 'not a manifest: skipped like kubectl apply -f does');
      if (nft) {
        // One nft -f script per family, on an empty host and on one with
        // rules of its own (n1's, restored), gives the table the agent holds
        // and leaves the host's iptables rules as they are.
        const strict = lab.nodes[0]!;
        writeFileSync(join(dir, 'node1.json'), JSON.stringify({ apiVersion: 'v1', kind: 'Node', ...(await core.readNode({ name: strict.name })) }));
        for (const target of [n, strict]) {
          const scratch = await Lab.create({ nodes: [], clients: 1 });
          try {
            const c = scratch.clients[0]!;
            if (target === strict) {
              for (const tool of ['iptables', 'ip6tables']) await scratch.exec(c.ns, `${tool}-restore`, [], { input: (await lab.exec(strict.ns, `${tool}-save`, [])).stdout });
            }
            for (const family of ['ipv4', 'ipv6'] as const) {
              const plan = await lab.exec(c.ns, process.execPath, [CLI, 'plan', '--node', target.name, '--family', family, '--backend', 'nftables', '-f', dir]);
              // execa strips the last newline, and nft refuses a comment that ends the input without one.
              await scratch.exec(c.ns, 'nft', ['-f', '-'], { input: `${plan.stdout}\n` });
            }
            const planned = await nftTables(c.ns, scratch);
            for (const [proto, port] of [['tcp', 80], ['udp', 53], ['tcp', 81], ['tcp', 83], ['tcp', 84], ['tcp', 88]] as const) {
              expect(planned, `${proto} ${port} planned for ${target.name}`).toMatch(nftFrontend(target.v4, proto, port));
            }
            expect(planned, `plan --backend nftables for ${target.name}`).toBe(await nftTables(target.ns));
            expect(await ruleLines({ ...target, ns: c.ns }, scratch), `host rules of ${target.name}`).toEqual(await ruleLines(target));
          } finally {
            await scratch.destroy();
          }
        }
        rmSync(join(dir, 'node1.json'));
      } else {
        const agentRules = (await ruleLines(n)).filter((l) => l.includes('PIER-'));
        for (const format of ['restore', 'commands'] as const) {
          const scratch = await Lab.create({ nodes: [], clients: 1 });
          try {
            const c = scratch.clients[0]!;
            for (const family of ['ipv4', 'ipv6'] as const) {
              const plan = await lab.exec(c.ns, process.execPath, [CLI, 'plan', '--node', n.name, '--family', family, '--format', format, '-f', dir]);
              if (format === 'restore') {
                await scratch.exec(c.ns, family === 'ipv4' ? 'iptables-restore' : 'ip6tables-restore', ['--noflush'], { input: plan.stdout });
              } else {
                await scratch.exec(c.ns, 'sh', ['-e'], { input: plan.stdout });
              }
            }
            const planned = (await (async () => {
              const lines: string[] = [];
              for (const tool of ['iptables-save', 'ip6tables-save']) for (const table of ['nat', 'filter']) {
                const out = (await scratch.exec(c.ns, tool, ['-t', table])).stdout;
                for (const l of out.split('\n')) if ((l.startsWith('-') || l.startsWith(':')) && l.includes('PIER-')) lines.push(`${tool} ${table} ${l.replace(/ ?\[\d+:\d+\]/, '')}`);
              }
              return lines;
            })());
            expect(planned.length).toBeGreaterThan(20);
            expect(planned, `plan --format ${format}`).toEqual(agentRules);
          } finally {
            await scratch.destroy();
          }
        }
        // On a host with rules of its own, too: n1, the strict host (beforeAll). Its
        // rules without pier's, restored into a fresh namespace, and the plan on
        // top must give n1's whole ruleset, pier's jumps ahead of the host's rules
        // in PREROUTING, INPUT, FORWARD, OUTPUT and POSTROUTING, as its agent has it.
        const strict = lab.nodes[0]!;
        writeFileSync(join(dir, 'node1.json'), JSON.stringify({ apiVersion: 'v1', kind: 'Node', ...(await core.readNode({ name: strict.name })) }));
        const strictRules = await ruleLines(strict);
        for (const format of ['restore', 'commands'] as const) {
          const scratch = await Lab.create({ nodes: [], clients: 1 });
          try {
            const c = scratch.clients[0]!;
            for (const [family, tool] of [['ipv4', 'iptables'], ['ipv6', 'ip6tables']] as const) {
              const hostOnly = (await lab.exec(strict.ns, `${tool}-save`, [])).stdout.split('\n').filter((l) => !l.includes('PIER-')).join('\n');
              await scratch.exec(c.ns, `${tool}-restore`, [], { input: hostOnly });
              const plan = await lab.exec(c.ns, process.execPath, [CLI, 'plan', '--node', strict.name, '--family', family, '--format', format, '-f', dir]);
              if (format === 'restore') await scratch.exec(c.ns, `${tool}-restore`, ['--noflush'], { input: plan.stdout });
              else await scratch.exec(c.ns, 'sh', ['-e'], { input: plan.stdout });
            }
            const planned = await ruleLines({ ...strict, ns: c.ns }, scratch);
            expect(planned.filter((l) => l.includes('PIER-')).length).toBeGreaterThan(20);
            expect(planned, `plan --format ${format} on a host with rules`).toEqual(strictRules);
          } finally {
            await scratch.destroy();
          }
        }
        rmSync(join(dir, 'node1.json'));
      }

      writeFileSync(join(dir, 'broken.yaml'), 'apiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: x}\nspec:\n  ports:\n  - port: eighty\n');
      const bad = await lab.exec(lab.clients[1]!.ns, process.execPath, [CLI, 'plan', '--node', n.name, '--backend', backend, '-f', dir], { reject: false });
      expect(bad.exitCode).not.toBe(0);
      expect(bad.stderr).toContain('broken.yaml');
      expect(bad.stderr).toContain('spec.ports[0].port');
      // The other files are still planned.
      expect(bad.stdout).toContain(nft ? 'dnat to' : '-j DNAT');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('--dry-run prints the rules without NET_ADMIN and leaves the kernel alone', async () => {
    const c = lab.clients[1]!;
    const dir = mkdtempSync(join(tmpdir(), 'pier-dryrun-'));
    chmodSync(dir, 0o755);
    const readable = join(dir, 'kubeconfig');
    copyFileSync(kubeconfig, readable);
    chmodSync(readable, 0o644);
    const kernel = async () => (await lab.exec(c.ns, 'iptables-save', [])).stdout.replace(/^#.*$/gm, '') + (await lab.exec(c.ns, 'nft', ['list', 'ruleset'])).stdout;
    const saveBefore = await kernel();
    // nobody, with every capability dropped: iptables would fail outright here.
    const proc = lab.spawn(c.ns, 'setpriv', [
      '--reuid=65534', '--regid=65534', '--clear-groups', '--inh-caps=-all', '--bounding-set=-all', '--',
      process.execPath, CLI, 'agent', '--dry-run', '--node-name', lab.nodes[1]!.name, '--kubeconfig', readable,
      '--health-port', '0', '--min-sync-interval', '100ms', '--backend', backend,
    ]);
    let out = '';
    proc.stdout?.on('data', (d: Buffer) => (out += d.toString()));
    const complete = nft
      ? () => out.includes('table ip pier {') && out.includes('table ip6 pier {') && out.includes('dnat to')
      : () => out.includes('ip6tables-restore') && out.includes('COMMIT') && out.includes('-j DNAT');
    await eventually('dry-run output for both families', complete, { timeoutMs: 20_000 });
    proc.kill('SIGTERM');
    await proc;
    if (nft) expect(out).toMatch(nftFrontend(lab.nodes[1]!.v4, 'tcp', 80));
    else expect(out).toContain(`--dport 80 `);
    expect(out).toMatch(nft ? /# pier agent --dry-run: node n2, ipv4, sync 1: complete ruleset for nft -f/ : /# pier agent --dry-run: node n2, ipv4, sync 1: complete ruleset/);
    const saveAfter = await kernel();
    expect(saveAfter).toBe(saveBefore);
    rmSync(dir, { recursive: true, force: true });
  });

  it('reports forwarding switched off in its Lease and a Node Event, and keeps running', async () => {
    const n = lab.nodes[1]!;
    const coordination = cp.admin.makeApiClient(CoordinationV1Api);
    const events = cp.admin.makeApiClient(EventsV1Api);
    const lease = () => coordination.readNamespacedLease({ name: agentLeaseName(n.name), namespace: 'pier-system' });
    expect((await lease()).metadata?.annotations?.[LEASE_FORWARDING_IPV4]).toBe('true');
    expect((await lease()).metadata?.annotations?.[LEASE_BACKEND]).toBe(backend);
    // Only the iptables backend has a flavour.
    expect((await lease()).metadata?.annotations?.[LEASE_IPTABLES_BACKEND]).toMatch(nft ? /^$/ : /^(nft|legacy)$/);
    await lab.exec(n.ns, 'sysctl', ['-q', '-w', 'net.ipv4.ip_forward=0']);
    try {
      const l = await eventually('lease to report ipv4 forwarding off', async () => {
        const l = await lease();
        return l.metadata?.annotations?.[LEASE_FORWARDING_IPV4] === 'false' ? l : false;
      }, { timeoutMs: 10_000 });
      expect(l.metadata?.annotations?.[LEASE_FORWARDING_IPV4_REASON]).toContain('net.ipv4.ip_forward is 0');
      const ev = await eventually('ForwardingDisabled event on the Node', async () => {
        const list = await events.listNamespacedEvent({ namespace: 'default' });
        return list.items.find((e) => e.reason === 'ForwardingDisabled' && e.regarding?.name === n.name);
      });
      expect(ev.type).toBe('Warning');
      expect(ev.note).toContain('ipv4');
      expect(isAlive(agents.get(n.name)!.pid!)).toBe(true);
    } finally {
      await lab.exec(n.ns, 'sysctl', ['-q', '-w', 'net.ipv4.ip_forward=1']);
    }
    await eventually('lease to report ipv4 forwarding back on', async () => (await lease()).metadata?.annotations?.[LEASE_FORWARDING_IPV4] === 'true', { timeoutMs: 10_000 });
  });

  it('pier cleanup leaves the ruleset exactly as it was before pier ran', async () => {
    const n = lab.nodes[0]!;
    agents.get(n.name)!.kill('SIGTERM');
    await agents.get(n.name);
    const tables = async () => (await lab.exec(n.ns, 'nft', ['list', 'ruleset'])).stdout;
    // SIGTERM left the rules.
    if (nft) expect((await tables()).match(/^table ip6? pier \{/gm)).toHaveLength(2);
    else expect((await ruleLines(n)).some((l) => l.includes('PIER-'))).toBe(true);
    const r = await lab.exec(n.ns, process.execPath, [CLI, 'cleanup']);
    expect(r.stdout).toMatch(nft ? /nftables: removed 2 pier tables/ : /removed [1-9]\d* chains/);
    expect(await tables()).not.toMatch(/table ip6? pier/);
    expect(await ruleLines(n)).toEqual(hostRulesBefore);
  });
});
