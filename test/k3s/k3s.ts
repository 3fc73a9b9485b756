// A real k3s server (test/k3s/build.sh's binary) as one node in a lab node's
// network namespace: the k3s quick start's cluster (README), with what
// cannot run here turned off, each for its reason (K3S_DISABLED). Isolated as
// test/cluster/node.ts isolates its nodes, with its pieces (node.sh, the
// node's cgroups, the kubelet's sysctls saved and put back):
//  - every process runs in the node's network namespace and in a mount
//    namespace of its own with a private /run, /var/log and /var/lib
//    (node.sh), and /etc overlaid (below), so k3s's containerd socket,
//    /run/k3s, /var/lib/kubelet and /etc/rancher are the node's alone;
//  - every process, containers included, is born in the node's cgroups (the
//    kubelet's cgroupRoot), so stop(), or after a crash node.ts's sweep
//    (the folder is a `pier-node-*` one, with owner.pid and cgroups), kills
//    all of it;
//  - state lives in one temporary folder.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { readIfExists, SERVICE_CIDRS, tail, waitFor } from '../cluster/controlplane.ts';
import { cniConfig, criRuntimeAndCni, openNodeSandbox, PAUSE_IMAGE, type ExecResult } from '../cluster/node.ts';
import type { LabNode } from '../lab/lab.ts';
import { cacheDir } from '../support/cache.ts';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = join(HERE, '../..');
export const BUILD_SH = join(HERE, 'build.sh');

/** The release build.sh builds (its K3S_VERSION line: one place for it). */
export const K3S_VERSION = /^K3S_VERSION=(\S+)$/m.exec(readFileSync(BUILD_SH, 'utf8'))![1]!;
/** Where build.sh leaves the binary. */
export const K3S_BINARY = join(cacheDir(), 'k3s', K3S_VERSION, 'k3s');

/** Whether the cached binary was built by this build.sh (its `recipe`, a hash of the script, as build.sh computes it). */
export function k3sRecipeIsCurrent(): boolean {
  const want = createHash('sha256').update(readFileSync(BUILD_SH)).digest('hex').slice(0, 16);
  return readIfExists(join(dirname(K3S_BINARY), 'recipe')).trim() === want;
}

/**
 * k3s's parts that cannot run here, turned off, and why. servicelb first: the
 * README's own flag (pier replaces it).
 */
export const K3S_DISABLED: readonly { flag: string; why: string }[] = [
  { flag: '--disable=servicelb', why: 'the README\'s flag: pier takes ServiceLB\'s place' },
  { flag: '--disable=traefik', why: 'its image (rancher/mirrored-library-traefik, installed by a HelmChart) cannot be pulled: no registry is reachable here' },
  { flag: '--disable=coredns', why: 'its image (rancher/mirrored-coredns-coredns) cannot be pulled; nothing here resolves Service names' },
  { flag: '--disable=metrics-server', why: 'its image (rancher/mirrored-metrics-server) cannot be pulled' },
  { flag: '--disable=local-storage', why: 'its image (rancher/local-path-provisioner) cannot be pulled; no volume is used' },
  {
    flag: '--flannel-backend=none',
    why: 'flannel\'s CNI plugin ships in k3s\'s release tarball, not in the Go module\'s cmd/server; the CNI bridge on the node\'s pod subnets (as test/cluster\'s nodes have) stands in, as it did when k3s was run here by hand',
  },
  { flag: '--disable-network-policy', why: 'kube-router\'s network policy controller needs ipset, which this machine lacks; no NetworkPolicy is used' },
];

export interface K3sNode {
  readonly name: string;
  /** The node's state folder: k3s's data dir, its log, the kubeconfig. */
  readonly dir: string;
  /** k3s's kubeconfig (server https://127.0.0.1:6443, reachable inside the node only). */
  readonly kubeconfig: string;
  /** The prefix that runs a command inside the node (its network, mount namespace and cgroups). */
  readonly wrap: readonly string[];
  /** Runs a command to completion inside the node. */
  exec(file: string, args: string[], opts?: { reject?: boolean; input?: string }): Promise<ExecResult>;
  /** kubectl inside the node, as cluster-admin; throws with its stderr when it fails. */
  kubectl(args: string[], opts?: { input?: string }): Promise<string>;
  /** The last lines of k3s's log. */
  log(lines?: number): string;
  stop(): Promise<void>;
}

export interface K3sOptions {
  /** The lab node whose network namespace is the k3s node's host network. */
  node: LabNode;
  /** The kubectl to run inside the node (test/cluster's build). */
  kubectl: string;
  /** docker-archive files k3s imports into its containerd at start (its agent/images folder, as for air-gapped installs). */
  preload: string[];
}

export async function startK3s(opts: K3sOptions): Promise<K3sNode> {
  if (!existsSync(K3S_BINARY)) throw new Error(`no k3s at ${K3S_BINARY}: bash test/k3s/build.sh`);
  const { node } = opts;
  // A `pier-node-` folder: node.ts's sweep kills what a crashed run left in its cgroups.
  const box = await openNodeSandbox({ name: node.name, netns: node.ns, prefix: 'pier-node-k3s-' });
  const { dir, id, wrap, exec } = box;
  const k3sLog = join(dir, 'k3s.log');

  try {
    // k3s writes /etc/rancher/node/password (and /etc/rancher/node/id), a
    // path no flag moves: /etc is overlaid in the node's mount namespace, so
    // what k3s writes there lands in the node's folder.
    mkdirSync(join(dir, 'etc/upper'), { recursive: true });
    mkdirSync(join(dir, 'etc/work'));
    await exec('mount', ['-t', 'overlay', 'pier-k3s-etc', '-o', `lowerdir=/etc,upperdir=${join(dir, 'etc/upper')},workdir=${join(dir, 'etc/work')}`, '/etc']);

    // The lab's nodes have no default route; the Service ranges need one for
    // kube-proxy's nat OUTPUT rules to rewrite (as node.ts does).
    for (const cidr of SERVICE_CIDRS) await exec('ip', ['route', 'add', cidr, 'dev', 'eth0']);

    const data = join(dir, 'data');
    // k3s's containerd configuration, as a template of its own
    // (agent/etc/containerd/config.toml.tmpl, k3s's documented override):
    // k3s's template plus what this machine needs (node.ts's containerd
    // has the same): restrict_oom_score_adj, since root here lacks
    // CAP_SYS_RESOURCE; the CNI bridge, as no flannel writes a CNI config.
    mkdirSync(join(data, 'agent/etc/containerd'), { recursive: true });
    writeFileSync(join(data, 'agent/etc/containerd/config.toml.tmpl'), containerdTemplate(join(dir, 'net.d')));
    mkdirSync(join(dir, 'net.d'));
    writeFileSync(join(dir, 'net.d', '10-pier-k3s.conflist'), JSON.stringify(cniConfig('pier-k3s', [node.podCidrV4, node.podCidrV6], dir), null, 2));
    // Air-gap images k3s imports at start: the sandbox image and the test pods' image.
    mkdirSync(join(data, 'agent/images'), { recursive: true });
    for (const archive of opts.preload) symlinkSync(archive, join(data, 'agent/images', basename(archive)));

    const kubeconfig = join(dir, 'k3s.yaml');
    const args = [
      'server',
      `--data-dir=${data}`,
      `--write-kubeconfig=${kubeconfig}`,
      `--node-name=${node.name}`,
      `--node-ip=${node.v4},${node.v6}`,
      // Dual-stack, in documentation ranges (k3s's defaults, 10.42/16 and 10.43/16, are not).
      `--cluster-cidr=${node.podCidrV4},${node.podCidrV6}`,
      `--service-cidr=${SERVICE_CIDRS.join(',')}`,
      ...K3S_DISABLED.map((d) => d.flag),
      // The sandbox image test/images builds (k3s's rancher/mirrored-pause cannot be pulled).
      `--pause-image=${PAUSE_IMAGE}`,
      // Containers in the node's cgroups, so that stop() finds them.
      `--kubelet-arg=cgroup-root=/${id}`,
      // Zeros leave the machine-wide conntrack table size and timeouts alone (kube-proxy, and k3s's own sysctls from the same values).
      '--kube-proxy-arg=conntrack-max-per-core=0',
      '--kube-proxy-arg=conntrack-min=0',
      '--kube-proxy-arg=conntrack-tcp-timeout-established=0s',
      '--kube-proxy-arg=conntrack-tcp-timeout-close-wait=0s',
    ];
    // env -u: k3s picks the systemd cgroup driver when INVOCATION_ID is set (a systemd unit); this node has none.
    const k3s = box.spawn('k3s', 'env', ['-u', 'INVOCATION_ID', K3S_BINARY, ...args]);

    const kubectl: K3sNode['kubectl'] = async (kargs, o = {}) => {
      const r = await exec(opts.kubectl, ['--kubeconfig', kubeconfig, ...kargs], { reject: false, input: o.input });
      if (r.exitCode !== 0) throw new Error(`kubectl ${kargs.join(' ')} failed (${r.exitCode}): ${r.stderr}`);
      return r.stdout;
    };
    await waitFor(`k3s on ${node.name} to be Ready`, 240_000, k3s, async () => {
      if (!existsSync(kubeconfig)) return false;
      const out = await kubectl(['get', 'node', node.name, '-o', 'jsonpath={.status.conditions[?(@.type=="Ready")].status}']);
      return out === 'True';
    });

    return {
      name: node.name,
      dir,
      kubeconfig,
      wrap,
      exec,
      kubectl,
      log: (lines = 40) => tail(readIfExists(k3sLog), lines),
      async stop() {
        if (box.stopped) return;
        k3s.child.kill('SIGTERM');
        const t = setTimeout(() => k3s.child.kill('SIGKILL'), 10_000);
        await k3s.child;
        clearTimeout(t);
        box.stop();
      },
    };
  } catch (err) {
    const logs = `--- k3s (last lines) ---\n${tail(readIfExists(k3sLog), 40)}`;
    box.stop();
    throw new Error(`k3s on ${node.name} failed to start: ${(err as Error).message}\n${logs}`, { cause: err });
  }
}

function containerdTemplate(cniConfDir: string): string {
  return [
    '# pier\'s test: k3s\'s own template (pkg/agent/templates) with this machine\'s needs; see test/k3s/k3s.ts.',
    'version = 2',
    // Snapshotters that would probe or need the machine's block devices.
    'disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.fuse-overlayfs", "io.containerd.snapshotter.v1.stargz", "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]',
    '[plugins."io.containerd.internal.v1.opt"]',
    '  path = "{{ .NodeConfig.Containerd.Opt }}"',
    '[plugins."io.containerd.grpc.v1.cri"]',
    '  stream_server_address = "127.0.0.1"',
    '  stream_server_port = "10010"',
    '  sandbox_image = "{{ .NodeConfig.AgentConfig.PauseImage }}"',
    '  enable_cdi = false',
    '  restrict_oom_score_adj = true',
    ...criRuntimeAndCni(cniConfDir),
    '  [plugins."io.containerd.grpc.v1.cri".registry]',
    '    config_path = "{{ .NodeConfig.Containerd.Registry }}"',
    '',
  ].join('\n');
}
