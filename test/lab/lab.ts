// The network lab: hosts made of network namespaces, wired the way a small
// bare-metal cluster is, in documentation address ranges only.
//
//   root ns ──(optional veth pl<run>, .254 / ::fe, for the API server)──┐
//                                        underlay ns: bridge br0
//           ┌──────────────────────┬────────────┴─────────┐
//      node n1 (198.51.100.11)   node n2 (198.51.100.12)   client c1 (198.51.100.101)
//      bridge "pods"          bridge "pods"
//       pod n1-p1, n1-p2       pod n2-p1 ...
//
// A lab belongs to a site, which fixes its addresses (SITES):
//   site 0 (default): underlay 198.51.100.0/24, 2001:db8:0:1::/64;
//                     node i's pods 198.19.i.0/24, 2001:db8:1:i::/64
//   site 1:           underlay 198.19.192.0/24, 2001:db8:0:2::/64;
//                     node i's pods 198.19.(128+i).0/24, 2001:db8:1:(128+i)::/64
//   sites 2 to 6:     underlay 198.19.(191+s).0/24, 2001:db8:0:(s+1)::/64;
//                     node i's pods 198.19.(184+8s+i).0/24 (up to 7 nodes)
// scripts/test.sh runs the upstream specs on sites 1 to 4 while vitest runs:
// the tests use sites 0 and 5; site 6 is for a second run beside a suite
// (PIER_LAB_SITE, test/cluster/cluster.ts).
// (Not 203.0.113.0/24: this workplace serves its package mirrors from it.)
// Pod subnets are routed between nodes (and from clients) via node
// addresses. Every pod runs echo-server.ts on port 8080, TCP and UDP.
//
// Labs without a host link never share a routing table, so any number can
// coexist. A host link routes the site's underlay in the machine's own
// namespace: one lab per site at a time (takeHostLink), so two clusters with
// an API server each can run at once, one per site.
//
// Names carry a run id and a registry file records the owning process, so a
// later run can sweep what a crashed run left without touching a live one.
import { mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { execa, execaSync, type ResultPromise } from 'execa';
import { atExit, isAlive } from '../support/cleanup.ts';

const HERE = dirname(fileURLToPath(import.meta.url));
export const NS_PREFIX = 'pierlab-';
const REGISTRY = '/run/pierlab';
export const ECHO_PORT = 8080;

export interface LabSpec {
  /** Pods per node; the array's length is the number of nodes. */
  nodes: number[];
  clients?: number;
  /** Creates a veth from the root namespace onto the underlay (address lab.hostV4 / lab.hostV6), for an API server the nodes can reach. */
  hostLink?: boolean;
  /** The address plan (SITES); default 0. Labs with a host link at once need different sites. */
  site?: LabSiteIndex;
  /**
   * false: nodes get no "pods" bridge (their pod count must be 0), since a
   * real node's CNI plugin makes its own on the same subnets. Pod subnets are
   * routed between nodes either way.
   */
  podBridges?: boolean;
}

export type LabSiteIndex = 0 | 1 | 2 | 3 | 4 | 5 | 6;

export interface LabSite {
  index: LabSiteIndex;
  /** The underlay's /24 and /64 without their host part: '198.51.100', '2001:db8:0:1'. */
  net4: string;
  net6: string;
  underlayV4: string;
  underlayV6: string;
  hostV4: string;
  hostV6: string;
  /** Node i's pod subnets are 198.19.(podBase+i).0/24 and 2001:db8:1:(podBase+i)::/64, inside clusterCidrs. */
  podBase: number;
  /** What a cluster on this site takes as its pod ranges (kube-proxy's clusterCIDR): the pod subnets, never the underlay. */
  clusterCidrs: string[];
  /** More nodes would take pod subnets that are not the site's. */
  maxNodes: number;
  /** Held while a lab of this site has a host link. Site 0's is the path older runs use, so they still wait for us. */
  hostLinkLock: string;
}

const makeSite = (index: LabSiteIndex, net4: string, net6: string, podBase: number, clusterCidrs: string[], maxNodes: number, hostLinkLock: string): LabSite => ({
  index,
  clusterCidrs,
  maxNodes,
  net4,
  net6,
  underlayV4: `${net4}.0/24`,
  underlayV6: `${net6}::/64`,
  hostV4: `${net4}.254`,
  hostV6: `${net6}::fe`,
  podBase,
  hostLinkLock,
});

export const SITES: readonly LabSite[] = [
  makeSite(0, '198.51.100', '2001:db8:0:1', 0, ['198.19.0.0/16', '2001:db8:1::/48'], 90, '/run/pierlab.host-link'),
  makeSite(1, '198.19.192', '2001:db8:0:2', 128, ['198.19.128.0/18', '2001:db8:1::/48'], 63, '/run/pierlab.host-link.1'),
  // Small sites, so that a test run can start a cluster per upstream-spec shard beside its own (scripts/test.sh).
  ...([2, 3, 4, 5, 6] as const).map((s) => makeSite(s, `198.19.${191 + s}`, `2001:db8:0:${s + 1}`, 184 + 8 * s, [`198.19.${184 + 8 * s}.0/21`, '2001:db8:1::/48'], 7, `/run/pierlab.host-link.${s}`)),
];

/** The lab site a flag or variable names, or undefined when `raw` names none. */
export function siteIndex(raw: string): LabSiteIndex | undefined {
  return /^\d+$/.test(raw) && SITES[Number(raw)] ? (Number(raw) as LabSiteIndex) : undefined;
}

/** Site 0's addresses, for code written before sites; a Lab's own are lab.hostV4 etc. */
export const UNDERLAY_V4 = SITES[0]!.underlayV4;
export const UNDERLAY_V6 = SITES[0]!.underlayV6;
export const HOST_V4 = SITES[0]!.hostV4;
export const HOST_V6 = SITES[0]!.hostV6;

export interface Endpoint {
  name: string;
  ns: string;
  v4: string;
  v6: string;
}
export interface LabPod extends Endpoint {
  node: string;
}
export interface LabNode extends Endpoint {
  index: number;
  podCidrV4: string;
  podCidrV6: string;
  pods: LabPod[];
}

export interface ProbeResult {
  ok: boolean;
  ms: number;
  /** When the attempt began, epoch ms. */
  at?: number;
  reply?: { pod: string; proto: string; peer: string; peerPort: number };
  error?: string;
}

export interface ProbeOptions {
  proto?: 'tcp' | 'udp';
  count?: number;
  timeoutMs?: number;
  intervalMs?: number;
  /** TCP: the source port of every attempt. */
  sport?: number;
}

/** The underlay's address of host number `h` (nodes 10+i, clients 100+j, the host link 254). */
const underlayAddr = (s: LabSite, h: number) => ({ v4: `${s.net4}.${h}`, v6: `${s.net6}::${h}` });
/** Node i's (from 1) underlay addresses on site `s`: .11, .12, … */
export const nodeAddr = (s: LabSite, i: number) => underlayAddr(s, 10 + i);
const podNet = (s: LabSite, i: number) => {
  const n = s.podBase + i;
  return { v4: `198.19.${n}.0/24`, v6: `2001:db8:1:${n}::/64`, gw4: `198.19.${n}.1`, gw6: `2001:db8:1:${n}::1` };
};
const podAddr = (s: LabSite, i: number, k: number) => {
  const n = s.podBase + i;
  return { v4: `198.19.${n}.${10 + k}`, v6: `2001:db8:1:${n}::${10 + k}` };
};
/** More would overlap: node 91 takes client 1's .101, client 154 the host link's .254. */
const MAX_CLIENTS = 153;

export class Lab {
  readonly runId: string;
  readonly site: LabSite;
  readonly nodes: LabNode[] = [];
  readonly clients: Endpoint[] = [];
  readonly underlayNs: string;
  /** The root namespace's side of hostLink, when requested. */
  readonly hostLink: string | undefined;
  private readonly namespaces: string[] = [];
  private readonly procs = new Set<ResultPromise>();
  private unregister: () => void = () => {};
  private destroyed = false;
  private ownsHostLink = false;

  private constructor(runId: string, site: LabSite, hostLink: boolean) {
    this.runId = runId;
    this.site = site;
    this.underlayNs = `${NS_PREFIX}${runId}-ul`;
    this.hostLink = hostLink ? `pl${runId}` : undefined;
  }

  get pods(): LabPod[] {
    return this.nodes.flatMap((n) => n.pods);
  }

  /** The root namespace's address on the host link (its site's). */
  get hostV4(): string {
    return this.site.hostV4;
  }
  get hostV6(): string {
    return this.site.hostV6;
  }
  get underlayV4(): string {
    return this.site.underlayV4;
  }
  get underlayV6(): string {
    return this.site.underlayV6;
  }

  static async create(spec: LabSpec): Promise<Lab> {
    const site = SITES[spec.site ?? 0];
    if (!site) throw new Error(`no lab site ${spec.site}`);
    if (spec.nodes.length > site.maxNodes || (spec.clients ?? 1) > MAX_CLIENTS) throw new Error(`a lab of site ${site.index} has at most ${site.maxNodes} nodes and ${MAX_CLIENTS} clients`);
    sweepStaleLabs();
    const runId = `${process.pid.toString(36)}${Math.random().toString(36).slice(2, 5)}`;
    const lab = new Lab(runId, site, spec.hostLink ?? false);
    mkdirSync(REGISTRY, { recursive: true });
    writeFileSync(join(REGISTRY, runId), String(process.pid));
    lab.unregister = atExit(() => lab.destroySync());
    try {
      await lab.build(spec);
    } catch (err) {
      lab.destroySync();
      throw err;
    }
    return lab;
  }

  private async build(spec: LabSpec): Promise<void> {
    const ul = this.underlayNs;
    await this.addNs(ul);
    await ip(ul, 'link', 'add', 'br0', 'type', 'bridge');
    await ip(ul, 'link', 'set', 'br0', 'up');

    const site = this.site;
    if (this.hostLink) {
      await takeHostLink(site);
      this.ownsHostLink = true;
      await assertFreeInRootNamespace(site.underlayV4, site.hostV4);
      await assertFreeInRootNamespace(site.underlayV6, site.hostV6);
      await execa('ip', ['link', 'add', this.hostLink, 'type', 'veth', 'peer', 'name', 'host', 'netns', ul]);
      await execa('ip', ['addr', 'add', `${site.hostV4}/24`, 'dev', this.hostLink]);
      await execa('ip', ['-6', 'addr', 'add', `${site.hostV6}/64`, 'dev', this.hostLink, 'nodad']);
      // Its link-local too, as noDad() does for the lab's namespaces: this one link's own setting, not the machine's.
      writeFileSync(`/proc/sys/net/ipv6/conf/${this.hostLink}/accept_dad`, '0');
      await execa('ip', ['link', 'set', this.hostLink, 'up']);
      await ip(ul, 'link', 'set', 'host', 'master', 'br0', 'up');
    }

    for (const [idx, podCount] of spec.nodes.entries()) {
      const i = idx + 1;
      const name = `n${i}`;
      const ns = `${NS_PREFIX}${this.runId}-${name}`;
      const net = podNet(site, i);
      const node: LabNode = { name, ns, index: i, ...nodeAddr(site, i), podCidrV4: net.v4, podCidrV6: net.v6, pods: [] };
      await this.addHost(ns, name, node.v4, node.v6);
      await sysctl(ns, { 'net.ipv4.ip_forward': '1', 'net.ipv6.conf.all.forwarding': '1' });
      this.nodes.push(node);
      if (spec.podBridges === false) {
        if (podCount > 0) throw new Error('a lab without pod bridges has no lab pods');
        continue;
      }
      await ip(ns, 'link', 'add', 'pods', 'type', 'bridge');
      await ip(ns, 'addr', 'add', `${net.gw4}/24`, 'dev', 'pods');
      await ip(ns, '-6', 'addr', 'add', `${net.gw6}/64`, 'dev', 'pods', 'nodad');
      await ip(ns, 'link', 'set', 'pods', 'up');
      for (let k = 1; k <= podCount; k++) {
        const podName = `${name}-p${k}`;
        const podNs = `${NS_PREFIX}${this.runId}-${podName}`;
        const pod: LabPod = { name: podName, ns: podNs, node: name, ...podAddr(site, i, k) };
        await this.addNs(podNs);
        await execa('ip', ['link', 'add', 'eth0', 'netns', podNs, 'type', 'veth', 'peer', 'name', `p${k}`, 'netns', ns]);
        await ip(ns, 'link', 'set', `p${k}`, 'master', 'pods', 'up');
        // As CNI bridge plugins do (hairpinMode): with br_netfilter, a pod
        // reaching itself through a DNAT is bridged back out of its own port.
        await ip(ns, 'link', 'set', `p${k}`, 'type', 'bridge_slave', 'hairpin', 'on');
        await ip(podNs, 'addr', 'add', `${pod.v4}/24`, 'dev', 'eth0');
        await ip(podNs, '-6', 'addr', 'add', `${pod.v6}/64`, 'dev', 'eth0', 'nodad');
        await ip(podNs, 'link', 'set', 'eth0', 'up');
        await ip(podNs, 'route', 'add', 'default', 'via', net.gw4);
        await ip(podNs, '-6', 'route', 'add', 'default', 'via', net.gw6);
        node.pods.push(pod);
      }
    }

    for (let j = 1; j <= (spec.clients ?? 1); j++) {
      const name = `c${j}`;
      const ns = `${NS_PREFIX}${this.runId}-${name}`;
      const client: Endpoint = { name, ns, ...underlayAddr(site, 100 + j) };
      await this.addHost(ns, name, client.v4, client.v6);
      this.clients.push(client);
    }

    // Pod subnets are routed through their node, from every other node and client.
    for (const host of [...this.nodes, ...this.clients]) {
      for (const node of this.nodes) {
        if (node === host) continue;
        await ip(host.ns, 'route', 'add', node.podCidrV4, 'via', node.v4);
        await ip(host.ns, '-6', 'route', 'add', node.podCidrV6, 'via', node.v6);
      }
    }

    await Promise.all(this.pods.map((p) => this.startEcho(p)));
  }

  /** A namespace with loopback up, attached to the underlay bridge as eth0. */
  private async addHost(ns: string, port: string, v4: string, v6: string): Promise<void> {
    await this.addNs(ns);
    await execa('ip', ['link', 'add', 'eth0', 'netns', ns, 'type', 'veth', 'peer', 'name', port, 'netns', this.underlayNs]);
    await ip(this.underlayNs, 'link', 'set', port, 'master', 'br0', 'up');
    await ip(ns, 'addr', 'add', `${v4}/24`, 'dev', 'eth0');
    await ip(ns, '-6', 'addr', 'add', `${v6}/64`, 'dev', 'eth0', 'nodad');
    await ip(ns, 'link', 'set', 'eth0', 'up');
  }

  private async addNs(ns: string): Promise<void> {
    await execa('ip', ['netns', 'add', ns]);
    this.namespaces.push(ns);
    await ip(ns, 'link', 'set', 'lo', 'up');
    await noDad(ns);
  }

  /**
   * An echo server on a node's own network, as a hostNetwork pod runs:
   * it answers as `<node>-host` on ECHO_PORT at the node's addresses.
   */
  async hostEcho(node: LabNode): Promise<void> {
    await this.startEcho({ ns: node.ns, name: `${node.name}-host` });
  }

  private async startEcho(pod: { ns: string; name: string }): Promise<void> {
    const proc = this.spawn(pod.ns, process.execPath, [join(HERE, 'echo-server.ts'), '--name', pod.name, '--port', String(ECHO_PORT)]);
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`echo server in ${pod.name} not ready in 10 s`)), 10_000);
      proc.stdout?.on('data', (d: Buffer) => {
        if (d.toString().includes('ready')) {
          clearTimeout(timer);
          resolve();
        }
      });
      proc.catch((err: unknown) => {
        clearTimeout(timer);
        reject(new Error(`echo server in ${pod.name} exited: ${(err as Error).message}`));
      });
    });
  }

  /** Runs a command to completion inside `ns`. */
  exec(ns: string, file: string, args: string[], opts: { reject?: boolean; input?: string } = {}) {
    return execa('ip', ['netns', 'exec', ns, file, ...args], { reject: opts.reject ?? true, input: opts.input });
  }

  /**
   * Starts a long-running process inside `ns`. It is killed at teardown, and
   * by the kernel if this process dies first (parent-death signal).
   */
  spawn(ns: string, file: string, args: string[], opts: { env?: Record<string, string> } = {}): ResultPromise {
    const proc = execa('ip', ['netns', 'exec', ns, 'setpriv', '--pdeathsig', 'SIGKILL', '--', file, ...args], {
      stdin: 'ignore',
      buffer: false,
      env: opts.env,
      reject: false,
    });
    this.procs.add(proc);
    void proc.then(() => this.procs.delete(proc));
    return proc;
  }

  /**
   * The TCP retransmissions `ns`'s kernel has counted (/proc/net is per
   * namespace). A lost SYN or SYN-ACK shows in `syn` even when the connection
   * then succeeded, and whatever the client process's scheduling did.
   */
  async tcpRetransmits(ns: string): Promise<{ syn: number; segments: number }> {
    const read = async (file: string, prefix: string, field: string) => {
      const [names, values] = (await this.exec(ns, 'cat', [file])).stdout.split('\n').filter((l) => l.startsWith(`${prefix}:`));
      const i = names!.split(' ').indexOf(field);
      if (i < 0) throw new Error(`${file} in ${ns} has no ${prefix} ${field}`);
      return Number(values!.split(' ')[i]);
    };
    return { syn: await read('/proc/net/netstat', 'TcpExt', 'TCPSynRetrans'), segments: await read('/proc/net/snmp', 'Tcp', 'RetransSegs') };
  }

  /** Connects from `from` to host:port with probe.ts and returns one result per attempt. */
  async probe(from: Endpoint, host: string, port: number, opts: ProbeOptions = {}): Promise<ProbeResult[]> {
    const args = [
      join(HERE, 'probe.ts'),
      '--proto', opts.proto ?? 'tcp',
      '--host', host,
      '--port', String(port),
      '--count', String(opts.count ?? 1),
      '--timeout', String(opts.timeoutMs ?? 2000),
      '--interval', String(opts.intervalMs ?? 0),
      ...(opts.sport ? ['--sport', String(opts.sport)] : []),
    ];
    const { stdout } = await this.exec(from.ns, process.execPath, args);
    return stdout
      .split('\n')
      .filter((l) => l.trim() !== '')
      .map((l) => JSON.parse(l) as ProbeResult);
  }

  async destroy(): Promise<void> {
    if (this.destroyed) return;
    await Promise.all(
      [...this.procs].map(async (p) => {
        p.kill('SIGTERM');
        const t = setTimeout(() => p.kill('SIGKILL'), 3000);
        await p.catch(() => undefined);
        clearTimeout(t);
      }),
    );
    this.destroySync();
  }

  /** Synchronous teardown, also used at exit: kill, delete namespaces and links, unregister. */
  private destroySync(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    for (const p of this.procs) p.kill('SIGKILL');
    for (const ns of [...this.namespaces].reverse()) removeNamespace(ns);
    if (this.hostLink) execaSync('ip', ['link', 'del', this.hostLink], { reject: false });
    rmSync(join(REGISTRY, this.runId), { force: true });
    if (this.ownsHostLink) rmSync(this.site.hostLinkLock, { recursive: true, force: true });
    this.unregister();
  }
}

/**
 * Only one lab per site at a time can link to the root namespace (the site's
 * underlay prefix is routed there). A second one — another test file, the
 * demo — waits for the first to go; a lock whose owner died is taken over.
 */
async function takeHostLink(site: LabSite): Promise<void> {
  const lock = site.hostLinkLock;
  let announced = false;
  for (;;) {
    try {
      mkdirSync(lock);
      writeFileSync(join(lock, 'owner'), String(process.pid));
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    let owner = 0;
    try {
      owner = Number(readFileSync(join(lock, 'owner'), 'utf8'));
    } catch {
      // Just created; its owner is about to write its pid.
    }
    const young = Date.now() - (statSync(lock, { throwIfNoEntry: false })?.mtimeMs ?? 0) < 5000;
    if (owner === process.pid) throw new Error(`this process already holds a lab with a host link at site ${site.index}`);
    if ((owner && !isAlive(owner)) || (!owner && !young)) {
      rmSync(lock, { recursive: true, force: true });
      continue;
    }
    if (!announced) console.error(`[lab] waiting for the lab of process ${owner} to release site ${site.index}'s host link`);
    announced = true;
    await sleep(250);
  }
}

/**
 * The host link puts the underlay prefix into the machine's own routing
 * table. If the machine already routes that prefix somewhere (this
 * workplace's machines sit on 192.0.2.0/24), replies would leave through the
 * real interface, so refuse instead.
 */
async function assertFreeInRootNamespace(prefix: string, probe: string): Promise<void> {
  const family = probe.includes(':') ? '-6' : '-4';
  const { stdout } = await execa('ip', [family, 'route', 'show', 'match', probe]);
  const clash = stdout.split('\n').filter((l) => l.trim() !== '' && !l.startsWith('default'));
  if (clash.length > 0) {
    throw new Error(`lab underlay ${prefix} is already routed in the root namespace (${clash.join('; ')}); refusing to add the host link`);
  }
}

function ip(ns: string, ...args: string[]) {
  return execa('ip', ['-n', ns, ...args]);
}

function sysctl(ns: string, settings: Record<string, string>) {
  return execa('ip', ['netns', 'exec', ns, 'sysctl', '-q', '-w', ...Object.entries(settings).map(([key, value]) => `${key}=${value}`)]);
}

/**
 * No duplicate address detection for the links made in `ns` from now on:
 * the lab's addresses are unique by construction, and while a node's or a
 * pod's link-local address was tentative (1-2 s after its link came up) the
 * first IPv6 connection through that node went unanswered or waited for a
 * SYN retransmit (10 of 12 labs probed right after creation). The global
 * addresses already skip it (`nodad`).
 */
function noDad(ns: string) {
  return sysctl(ns, { 'net.ipv6.conf.all.accept_dad': '0', 'net.ipv6.conf.default.accept_dad': '0' });
}

function removeNamespace(ns: string): void {
  const pids = execaSync('ip', ['netns', 'pids', ns], { reject: false }).stdout;
  for (const pid of String(pids ?? '').split('\n').map(Number).filter(Boolean)) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  execaSync('ip', ['netns', 'del', ns], { reject: false });
}

/** Lists the lab namespaces on this machine (any run). */
export function listLabNamespaces(): string[] {
  const out = execaSync('ip', ['netns', 'list'], { reject: false }).stdout;
  return String(out ?? '')
    .split('\n')
    .map((l) => l.split(' ')[0] ?? '')
    .filter((n) => n.startsWith(NS_PREFIX));
}

/**
 * Removes namespaces, root links and registry entries of lab runs whose owner
 * process is gone. Only names with the lab's prefix are considered.
 */
export function sweepStaleLabs(): string[] {
  const removed: string[] = [];
  const ownerAlive = (runId: string) => {
    try {
      const pid = Number(readFileSync(join(REGISTRY, runId), 'utf8'));
      return pid > 0 && isAlive(pid);
    } catch {
      return false;
    }
  };
  const runs = new Set<string>();
  for (const ns of listLabNamespaces()) {
    const runId = ns.slice(NS_PREFIX.length).split('-')[0] ?? '';
    if (ownerAlive(runId)) continue;
    runs.add(runId);
    removeNamespace(ns);
    removed.push(ns);
  }
  let registered: string[] = [];
  try {
    registered = readdirSync(REGISTRY);
  } catch {
    // no registry yet
  }
  for (const runId of registered) if (!ownerAlive(runId)) runs.add(runId);
  for (const runId of runs) {
    execaSync('ip', ['link', 'del', `pl${runId}`], { reject: false });
    rmSync(join(REGISTRY, runId), { force: true });
  }
  return removed;
}
