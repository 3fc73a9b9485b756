// A real Kubernetes node in a network namespace: containerd + runc + the CNI
// plugins (Debian packages), kubelet and kube-proxy (built by build.sh from
// the same k8s.io/kubernetes module as the API server). Nothing it starts
// programs the machine's own network namespace or leaves a mount behind:
//  - every process runs in the node's network namespace (a lab node) and in
//    a mount namespace of its own with a private /run and /var/log (node.sh);
//  - every process, containers included, is born in the node's cgroup, which
//    is the kubelet's cgroupRoot, so stop() (or the next run's sweep, after a
//    crash) finds and kills all of it;
//  - state lives in one temporary folder per node.
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CoreV1Api } from '@kubernetes/client-node';
import { execa, type ResultPromise } from 'execa';
import { atExit, isAlive } from '../support/cleanup.ts';
import { ensureBinaries, CLUSTER_DNS, readIfExists, SERVICE_CIDRS, spawnLogged, tail, waitFor, type ControlPlane } from './controlplane.ts';

const HERE = dirname(fileURLToPath(import.meta.url));
const NODE_SH = join(HERE, 'node.sh');
const TMP_PREFIX = 'pier-node-';
/** Where Debian's containernetworking-plugins installs the CNI plugins. */
const CNI_BIN = '/usr/lib/cni';
/** The sandbox image; test/images builds it from the Kubernetes module's pause.c. */
export const PAUSE_IMAGE = 'registry.k8s.io/pause:3.10';

/**
 * Machine-wide sysctls the nodes change: the kubelet's kernel tunables (set
 * at start-up unless protectKernelDefaults) and inotify's per-user limits
 * (INOTIFY_FLOORS). Saved before the first kubelet starts and put back when
 * the last node stops, so a test run changes nothing global.
 */
const KUBELET_SYSCTLS = ['vm/overcommit_memory', 'vm/panic_on_oom', 'kernel/panic', 'kernel/panic_on_oops', 'kernel/keys/root_maxkeys', 'kernel/keys/root_maxbytes', 'fs/inotify/max_user_instances', 'fs/inotify/max_user_watches'];
/**
 * Every kubelet (cAdvisor), containerd and pod takes inotify instances, all
 * counted against root: with the suite's six clusters at once, Debian's 128
 * ran out and a kubelet failed to start ("inotify_init: too many open
 * files"). kind asks its users for the same raise.
 */
const INOTIFY_FLOORS: Record<string, number> = { 'fs/inotify/max_user_instances': 1024, 'fs/inotify/max_user_watches': 524288 };
const SAVED_SYSCTLS = '/run/pier-node-sysctls.json';

/** Exits 0 when the URL in argv[1] answers 2xx: a health check run inside the node's network namespace. */
const HEALTHZ = 'fetch(process.argv[1]).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))';

export type ProxyMode = 'iptables' | 'nftables';

export interface NodeSpec {
  /** The Node's name (kubelet's --hostname-override). */
  name: string;
  /** An existing network namespace: the node's host network. */
  netns: string;
  /** InternalIPs, IPv4 first (kubelet's --node-ip). */
  addresses: string[];
  /** This node's pod subnets, one per family, routed to it by the lab. */
  podCidrs: string[];
  /** Every node's pod subnets (kube-proxy's clusterCIDR; traffic leaving them is masqueraded). */
  clusterCidrs: string[];
  proxyMode: ProxyMode;
}

export interface ExecResult {
  stdout: string;
  stderr: string;
  exitCode: number;
}

export interface KubeNode {
  readonly name: string;
  readonly spec: NodeSpec;
  /** The node's state folder: containerd's, the kubelet's and kube-proxy's files and logs. */
  readonly dir: string;
  /** Runs a command to completion inside the node (its network, mount namespace and cgroup). */
  exec(file: string, args: string[], opts?: { reject?: boolean; input?: string }): Promise<ExecResult>;
  /** Imports docker-archive or OCI archives into the node's containerd, where the kubelet finds them. */
  importImages(archives: string[]): Promise<void>;
  /** (Re)starts kube-proxy in a mode (its rules of the old mode are flushed first, as `kube-proxy --cleanup` does). */
  setProxyMode(mode: ProxyMode): Promise<void>;
  /** Stops kube-proxy as a crash would, its rules left as they are. */
  stopProxy(): Promise<void>;
  /** Adds again the rule the node starts with (pods leaving the cluster leave as the node): after a test flushed the node's tables. */
  masqueradePods(): Promise<void>;
  /** The last lines of a component's log (containerd, kubelet, kube-proxy). */
  log(component: 'containerd' | 'kubelet' | 'kube-proxy', lines?: number): string;
  stop(): Promise<void>;
}

interface Proc {
  child: ResultPromise;
  log: string;
}

/**
 * What makes a folder and a network namespace a node: the folder (a
 * `pier-node-` one, which sweepStaleNodes() clears after a crashed run), the
 * node's cgroups, the kubelet's sysctls saved, a holder process keeping the
 * node's mount namespace (node.sh), and a way to run commands in it. stop()
 * undoes all of it, also when the test process exits first.
 */
export interface NodeSandbox {
  readonly dir: string;
  /** The folder's name, also the node's cgroup name. */
  readonly id: string;
  /** The prefix that runs a command inside the node (its network and mount namespaces, its cgroups). */
  readonly wrap: readonly string[];
  exec: KubeNode['exec'];
  /** Starts a long-running process inside the node, its output in `<dir>/<name>.log`. */
  spawn(name: string, file: string, args: string[]): Proc;
  readonly stopped: boolean;
  /** Kills everything in the node's cgroups and removes what opening it made. */
  stop(): void;
}

export async function openNodeSandbox(opts: { name: string; netns: string; prefix?: string }): Promise<NodeSandbox> {
  sweepStaleNodes();
  const dir = mkdtempSync(join(tmpdir(), opts.prefix ?? TMP_PREFIX));
  const id = basename(dir);
  writeFileSync(join(dir, 'owner.pid'), String(process.pid));
  const groups = createCgroups(id);
  writeFileSync(join(dir, 'cgroups'), groups.map((g) => g.path).join('\n'));
  const joinGroups = groups.map((g) => g.node).join(':');
  saveKubeletSysctls();

  let stopped = false;
  const stopSync = () => {
    if (stopped) return;
    stopped = true;
    killCgroups(groups.map((g) => g.path));
    removeCgroups(groups.map((g) => g.path));
    rmSync(dir, { recursive: true, force: true });
    restoreKubeletSysctls();
  };
  const unregister = atExit(stopSync);
  const stop = () => {
    stopSync();
    unregister();
  };
  try {
    const holder = spawnLogged(dir, 'holder', NODE_SH, ['hold', joinGroups, opts.netns]);
    await waitFor(`node ${opts.name}'s namespaces`, 10_000, holder, async () => readIfExists(holder.log).includes('ready'));
    const wrap = [NODE_SH, 'run', joinGroups, String(holder.child.pid!), '--'];
    return {
      dir,
      id,
      wrap,
      async exec(file, args, o = {}) {
        const r = await execa(wrap[0]!, [...wrap.slice(1), file, ...args], { reject: o.reject ?? true, input: o.input });
        return { stdout: String(r.stdout), stderr: String(r.stderr), exitCode: r.exitCode ?? -1 };
      },
      spawn: (name, file, args) => spawnLogged(dir, name, wrap[0]!, [...wrap.slice(1), file, ...args]),
      get stopped() {
        return stopped;
      },
      stop,
    };
  } catch (err) {
    const log = tail(readIfExists(join(dir, 'holder.log')), 25);
    stop();
    throw new Error(`node ${opts.name}: ${(err as Error).message}\n--- holder (last lines) ---\n${log}`, { cause: err });
  }
}

export async function startNode(cp: ControlPlane, spec: NodeSpec): Promise<KubeNode> {
  const bin = await ensureBinaries();
  const box = await openNodeSandbox({ name: spec.name, netns: spec.netns });
  const { dir, id, exec } = box;
  const procs = new Map<string, Proc>();
  const inNode = (name: string, file: string, args: string[]) => {
    const proc = box.spawn(name, file, args);
    procs.set(name, proc);
    return proc;
  };

  try {
    // The lab's nodes have no default route. Packets to a ClusterIP need a
    // route before kube-proxy's nat OUTPUT rules can rewrite them, as the
    // default route gives them on a real node: the uplink, for the Service ranges.
    const uplink = (await exec('ip', ['-o', 'addr', 'show', 'to', spec.addresses[0]!])).stdout.split(/\s+/)[1];
    if (!uplink) throw new Error(`node ${spec.name}: no interface holds ${spec.addresses[0]}`);
    for (const cidr of SERVICE_CIDRS) await exec('ip', ['route', 'add', cidr, 'dev', uplink]);

    // Pods leaving the cluster's pod subnets (to the API server, to clients)
    // leave as the node, as ip-masq-agent or kindnet arrange on real clusters.
    const masqueradePods = async () => {
      for (const cidr of spec.podCidrs) {
        const v6 = cidr.includes(':');
        const others = spec.clusterCidrs.filter((c) => c.includes(':') === v6);
        await exec(v6 ? 'ip6tables' : 'iptables', ['-w', '-t', 'nat', '-A', 'POSTROUTING', '-s', cidr, ...others.flatMap((c) => ['!', '-d', c]), '-j', 'MASQUERADE']);
      }
    };
    await masqueradePods();

    const sock = join(dir, 'containerd.sock');
    writeFileSync(join(dir, 'containerd.toml'), containerdConfig(dir, sock));
    mkdirSync(join(dir, 'net.d'));
    writeFileSync(join(dir, 'net.d', '10-pier-test.conflist'), JSON.stringify(cniConfig('pier-test', spec.podCidrs, dir), null, 2));
    inNode('containerd', 'containerd', ['--config', join(dir, 'containerd.toml')]);
    const ctr = (args: string[]) => exec('ctr', ['--address', sock, '--namespace', 'k8s.io', ...args], { reject: false });
    await waitFor(`containerd on ${spec.name}`, 30_000, procs.get('containerd')!, async () => (await ctr(['version'])).exitCode === 0);

    const kubeletKc = await cp.clientKubeconfig(`kubelet-${spec.name}`, `system:node:${spec.name}`, ['system:nodes']);
    writeFileSync(join(dir, 'kubelet.json'), JSON.stringify(kubeletConfig(spec, id, sock, cp.pki.caCert), null, 2));
    inNode('kubelet', join(bin, 'kubelet'), [
      `--config=${join(dir, 'kubelet.json')}`,
      `--kubeconfig=${kubeletKc}`,
      `--hostname-override=${spec.name}`,
      `--node-ip=${spec.addresses.join(',')}`,
      `--root-dir=${join(dir, 'kubelet')}`,
      '--v=2',
    ]);

    const proxyKc = await cp.clientKubeconfig(`kube-proxy-${spec.name}`, 'system:kube-proxy');
    const startProxy = (mode: ProxyMode) => {
      writeFileSync(join(dir, 'kube-proxy.json'), JSON.stringify(kubeProxyConfig(spec, mode, proxyKc), null, 2));
      return inNode('kube-proxy', join(bin, 'kube-proxy'), [`--config=${join(dir, 'kube-proxy.json')}`, '--v=2']);
    };
    startProxy(spec.proxyMode);

    const core = cp.admin.makeApiClient(CoreV1Api);
    await waitFor(`node ${spec.name} to be Ready`, 120_000, procs.get('kubelet')!, async () => {
      const node = await core.readNode({ name: spec.name });
      return node.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') === true;
    });

    const node: KubeNode = {
      name: spec.name,
      spec,
      dir,
      exec,
      async importImages(archives) {
        for (const archive of archives) {
          const r = await ctr(['images', 'import', archive]);
          if (r.exitCode !== 0) throw new Error(`importing ${archive} into ${spec.name}'s containerd failed: ${r.stderr}`);
        }
      },
      async stopProxy() {
        const proxy = procs.get('kube-proxy')!;
        proxy.child.kill('SIGTERM');
        await proxy.child;
      },
      masqueradePods,
      async setProxyMode(mode) {
        await node.stopProxy();
        await exec(join(bin, 'kube-proxy'), ['--cleanup', `--config=${join(dir, 'kube-proxy.json')}`], { reject: false });
        spec.proxyMode = mode;
        const proxy = startProxy(mode);
        await waitFor(`kube-proxy on ${spec.name} in ${mode} mode`, 30_000, proxy, async () => {
          const r = await exec(process.execPath, ['-e', HEALTHZ, 'http://127.0.0.1:10256/healthz'], { reject: false });
          return r.exitCode === 0;
        });
      },
      log(component, lines = 40) {
        return tail(readIfExists(join(dir, `${component}.log`)), lines);
      },
      async stop() {
        if (box.stopped) return;
        // The kubelet first, so that it does not restart what is killed next.
        for (const name of ['kubelet', 'kube-proxy']) {
          const p = procs.get(name);
          if (!p) continue;
          p.child.kill('SIGTERM');
          const t = setTimeout(() => p.child.kill('SIGKILL'), 5000);
          await p.child;
          clearTimeout(t);
        }
        box.stop();
      },
    };
    return node;
  } catch (err) {
    const logs = ['containerd', 'kubelet', 'kube-proxy', 'holder']
      .map((c) => `--- ${c} (last lines) ---\n${tail(readIfExists(join(dir, `${c}.log`)), 25)}`)
      .join('\n');
    box.stop();
    throw new Error(`node ${spec.name} failed to start: ${(err as Error).message}\n${logs}`, { cause: err });
  }
}

function containerdConfig(dir: string, sock: string): string {
  const q = JSON.stringify;
  return [
    'version = 2',
    `root = ${q(join(dir, 'containerd', 'root'))}`,
    `state = ${q(join(dir, 'containerd', 'state'))}`,
    // Snapshotters that would probe or need the machine's block devices.
    'disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]',
    '[grpc]',
    `  address = ${q(sock)}`,
    '[ttrpc]',
    `  address = ${q(`${sock}.ttrpc`)}`,
    '[debug]',
    '  address = ""',
    '[metrics]',
    '  address = ""',
    '[plugins."io.containerd.internal.v1.opt"]',
    `  path = ${q(join(dir, 'containerd', 'opt'))}`,
    '[plugins."io.containerd.grpc.v1.cri"]',
    `  sandbox_image = ${q(PAUSE_IMAGE)}`,
    // Pod network namespaces under the node's state, not the machine's /run/netns.
    '  netns_mounts_under_state_dir = true',
    '  enable_cdi = false',
    // Root here lacks CAP_SYS_RESOURCE (this workplace's machines drop it from
    // the bounding set), so no process may lower its oom_score_adj: runc
    // failed every sandbox with "failed to update /proc/self/oom_score_adj:
    // Permission denied". containerd then clamps each container's value to
    // its own, as it does for rootless nodes.
    '  restrict_oom_score_adj = true',
    ...criRuntimeAndCni(join(dir, 'net.d')),
    '',
  ].join('\n');
}

/** The CRI plugin's runtime (runc, overlayfs, cgroupfs) and CNI sections of a containerd config, for the nodes' and k3s's. */
export function criRuntimeAndCni(cniConfDir: string): string[] {
  const q = JSON.stringify;
  return [
    '  [plugins."io.containerd.grpc.v1.cri".containerd]',
    '    snapshotter = "overlayfs"',
    '    default_runtime_name = "runc"',
    '    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]',
    '      runtime_type = "io.containerd.runc.v2"',
    '      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]',
    '        SystemdCgroup = false',
    '  [plugins."io.containerd.grpc.v1.cri".cni]',
    `    bin_dir = ${q(CNI_BIN)}`,
    `    conf_dir = ${q(cniConfDir)}`,
  ];
}

/** bridge + host-local on the node's pod subnets (as kind's and k3s's default CNIs do), portmap for hostPorts; IPAM state under `dir`. */
export function cniConfig(name: string, podCidrs: readonly string[], dir: string) {
  return {
    cniVersion: '1.0.0',
    name,
    plugins: [
      {
        type: 'bridge',
        bridge: 'cni0',
        isGateway: true,
        ipMasq: false,
        hairpinMode: true,
        ipam: {
          type: 'host-local',
          ranges: podCidrs.map((subnet) => [{ subnet }]),
          routes: podCidrs.map((c) => ({ dst: c.includes(':') ? '::/0' : '0.0.0.0/0' })),
          dataDir: join(dir, 'ipam'),
        },
      },
      { type: 'portmap', capabilities: { portMappings: true } },
    ],
  };
}

function kubeletConfig(spec: NodeSpec, cgroupRoot: string, sock: string, caFile: string) {
  return {
    apiVersion: 'kubelet.config.k8s.io/v1beta1',
    kind: 'KubeletConfiguration',
    authentication: { anonymous: { enabled: false }, webhook: { enabled: true }, x509: { clientCAFile: caFile } },
    authorization: { mode: 'Webhook' },
    address: spec.addresses[0],
    readOnlyPort: 0,
    healthzBindAddress: '127.0.0.1',
    containerRuntimeEndpoint: `unix://${sock}`,
    cgroupDriver: 'cgroupfs',
    cgroupRoot: `/${cgroupRoot}`,
    // This workplace's machines mount cgroup v1; kubelets since 1.35 refuse it unless told.
    failCgroupV1: false,
    failSwapOn: false,
    // Two nodes share one machine: neither may evict for what the other uses.
    evictionHard: { 'memory.available': '1Mi', 'nodefs.available': '0%', 'imagefs.available': '0%', 'nodefs.inodesFree': '0%' },
    imageGCHighThresholdPercent: 100,
    imageGCLowThresholdPercent: 99,
    resolvConf: '/etc/resolv.conf',
    // Pods resolve Service names once dns.ts has deployed CoreDNS; until then a lookup times out, as on a cluster whose DNS is down.
    clusterDNS: CLUSTER_DNS,
    clusterDomain: 'cluster.local',
    serializeImagePulls: false,
    syncFrequency: '10s',
    nodeStatusReportFrequency: '10s',
    maxPods: 50,
  };
}

function kubeProxyConfig(spec: NodeSpec, mode: ProxyMode, kubeconfig: string) {
  return {
    apiVersion: 'kubeproxy.config.k8s.io/v1alpha1',
    kind: 'KubeProxyConfiguration',
    clientConnection: { kubeconfig },
    hostnameOverride: spec.name,
    mode,
    clusterCIDR: spec.clusterCidrs.join(','),
    healthzBindAddress: '127.0.0.1:10256',
    metricsBindAddress: '127.0.0.1:10249',
    // Zeros leave the machine-wide conntrack table size and timeouts alone.
    conntrack: { maxPerCore: 0, min: 0, tcpEstablishedTimeout: '0s', tcpCloseWaitTimeout: '0s' },
  };
}

interface NodeCgroup {
  /** The node's group in one hierarchy: the kubelet's cgroupRoot. */
  path: string;
  /** Its child that holds the node's own processes (containerd, kubelet...): cgroup v2 allows no processes beside child groups. */
  node: string;
}

/** Every mounted cgroup hierarchy (v1 controllers, the v2 unified one). */
function cgroupMounts(): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' '))
    .filter((f) => {
      const sep = f.indexOf('-');
      return sep > 0 && (f[sep + 1] === 'cgroup' || f[sep + 1] === 'cgroup2');
    })
    .map((f) => f[4]!);
}

function createCgroups(id: string): NodeCgroup[] {
  return cgroupMounts().map((mount) => {
    const path = join(mount, id);
    mkdirSync(join(path, 'node'), { recursive: true });
    // A v1 cpuset group starts with no CPUs or memory nodes; copy its parent's.
    for (const file of ['cpuset.cpus', 'cpuset.mems']) {
      if (!existsSync(join(mount, file))) continue;
      const value = readFileSync(join(mount, file), 'utf8');
      writeFileSync(join(path, file), value);
      writeFileSync(join(path, 'node', file), value);
    }
    return { path, node: join(path, 'node') };
  });
}

/** Kills every process in the groups and below, until none is left. */
function killCgroups(paths: string[]): void {
  for (let round = 0; round < 50; round++) {
    const pids = new Set<number>();
    for (const path of paths) for (const group of walk(path)) for (const pid of readIfExists(join(group, 'cgroup.procs')).split('\n')) if (pid) pids.add(Number(pid));
    if (pids.size === 0) return;
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 100);
  }
}

function removeCgroups(paths: string[]): void {
  for (const path of paths) {
    for (const group of walk(path).reverse()) {
      for (let attempt = 0; attempt < 20; attempt++) {
        try {
          rmdirSync(group);
          break;
        } catch (err) {
          const code = (err as NodeJS.ErrnoException).code;
          if (code === 'ENOENT') break;
          // EBUSY while the kernel finishes tearing down the last task.
          Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 100);
        }
      }
    }
  }
}

/** A group and all its descendants, parents first. */
function walk(path: string): string[] {
  if (!existsSync(path)) return [];
  const out = [path];
  for (const entry of readdirSync(path, { withFileTypes: true })) if (entry.isDirectory()) out.push(...walk(join(path, entry.name)));
  return out;
}

function saveKubeletSysctls(): void {
  if (!existsSync(SAVED_SYSCTLS)) {
    const saved = Object.fromEntries(KUBELET_SYSCTLS.map((k) => [k, readIfExists(join('/proc/sys', k)).trim()]));
    writeFileSync(SAVED_SYSCTLS, JSON.stringify(saved));
  }
  for (const [key, floor] of Object.entries(INOTIFY_FLOORS)) {
    const file = join('/proc/sys', key);
    if (Number(readIfExists(file).trim()) < floor) writeFileSync(file, String(floor));
  }
}

/** Puts the kubelet's sysctls back once no node of any live run is left. */
function restoreKubeletSysctls(): void {
  if (liveNodeDirs().length > 0 || !existsSync(SAVED_SYSCTLS)) return;
  const saved = JSON.parse(readFileSync(SAVED_SYSCTLS, 'utf8')) as Record<string, string>;
  for (const [key, value] of Object.entries(saved)) {
    try {
      if (value !== '') writeFileSync(join('/proc/sys', key), value);
    } catch {
      // keep restoring the rest
    }
  }
  rmSync(SAVED_SYSCTLS, { force: true });
}

function nodeDirs(): string[] {
  return readdirSync(tmpdir())
    .filter((e) => e.startsWith(TMP_PREFIX))
    .map((e) => join(tmpdir(), e));
}

function liveNodeDirs(): string[] {
  return nodeDirs().filter((d) => {
    const owner = Number(readIfExists(join(d, 'owner.pid')));
    return owner > 0 && isAlive(owner);
  });
}

/** Removes what crashed runs left: their nodes' processes (containers included), cgroups and folders. */
export function sweepStaleNodes(): void {
  const live = new Set(liveNodeDirs());
  for (const dir of nodeDirs()) {
    if (live.has(dir)) continue;
    const id = basename(dir);
    const paths = cgroupMounts().map((m) => join(m, id));
    killCgroups(paths);
    removeCgroups(paths);
    rmSync(dir, { recursive: true, force: true });
  }
  restoreKubeletSysctls();
}
