// A whole test cluster on one machine, as pier's users run one: the lab's
// network (nodes and a client on an underlay, documentation addresses), a
// control plane with its controllers on the lab's host link, and a real node
// (node.ts) in each lab node's namespace, with pier's images and the test
// images imported into every node's containerd.
import { execa, type Options } from 'execa';
import { CoreV1Api } from '@kubernetes/client-node';
import { Lab, SITES, siteIndex, type LabSiteIndex } from '../lab/lab.ts';
import { ensureImages, type BuiltImages } from '../images/images.ts';
import { kubectlPath, startControlPlane, type ControlPlane } from './controlplane.ts';
import { startNode, type KubeNode, type ProxyMode } from './node.ts';


export interface ClusterOptions {
  nodes?: number;
  proxyMode?: ProxyMode;
  /**
   * The lab's site (lab.ts): clusters can run at once on different sites.
   * Default $PIER_LAB_SITE, else 0: a second test run beside scripts/test.sh
   * (which holds sites 0 to 5) takes site 6.
   */
  site?: LabSiteIndex;
}

export interface Cluster {
  readonly lab: Lab;
  readonly cp: ControlPlane;
  readonly nodes: KubeNode[];
  readonly images: BuiltImages;
  readonly core: CoreV1Api;
  /** kubectl as cluster-admin; throws with kubectl's stderr when it fails. */
  kubectl(args: string[], opts?: Pick<Options, 'input' | 'timeout'>): Promise<string>;
  stop(): Promise<void>;
}

/** The lab site startCluster() takes by default: $PIER_LAB_SITE, else 0. */
export function envSite(): LabSiteIndex {
  const raw = process.env['PIER_LAB_SITE'] ?? '0';
  const site = siteIndex(raw);
  if (site === undefined) throw new Error(`PIER_LAB_SITE=${raw}: no such lab site (0 to ${SITES.length - 1})`);
  return site;
}

export async function startCluster(opts: ClusterOptions = {}): Promise<Cluster> {
  const count = opts.nodes ?? 2;
  // The builds run first: the lab and the control plane should not wait on them.
  const [images, kubectl] = await Promise.all([ensureImages(), kubectlPath()]);
  const lab = await Lab.create({ nodes: Array(count).fill(0), clients: 1, hostLink: true, podBridges: false, site: opts.site ?? envSite() });
  let cp: ControlPlane | undefined;
  const nodes: KubeNode[] = [];
  const stop = async () => {
    await Promise.all(nodes.map((n) => n.stop()));
    await cp?.stop();
    await lab.destroy();
  };
  try {
    cp = await startControlPlane({ address: lab.hostV4, controllers: true });
    const plane = cp;
    const started = await Promise.all(
      lab.nodes.map((n) =>
        startNode(plane, {
          name: n.name,
          netns: n.ns,
          addresses: [n.v4, n.v6],
          podCidrs: [n.podCidrV4, n.podCidrV6],
          clusterCidrs: lab.site.clusterCidrs,
          proxyMode: opts.proxyMode ?? 'iptables',
        }).then((node) => (nodes.push(node), node)),
      ),
    );
    await Promise.all(started.map((n) => n.importImages(Object.values(images.archives))));
    return {
      lab,
      cp: plane,
      nodes: started,
      images,
      core: plane.admin.makeApiClient(CoreV1Api),
      async kubectl(args, kopts = {}) {
        const r = await execa(kubectl, ['--kubeconfig', plane.adminKubeconfigPath, ...args], { ...kopts, reject: false });
        if (r.exitCode !== 0) throw new Error(`kubectl ${args.join(' ')} failed (${r.exitCode}): ${String(r.stderr)}`);
        return String(r.stdout);
      },
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}
