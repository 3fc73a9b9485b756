// Cluster DNS for the test cluster: CoreDNS deployed as kind and k3s deploy it
// (coredns.yaml), so that pods resolve Service names as they do on the
// clusters pier's users run. The kubelets already point pods at CLUSTER_DNS.
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Cluster } from './cluster.ts';
import { CLUSTER_DNS } from './controlplane.ts';

const MANIFEST = join(dirname(fileURLToPath(import.meta.url)), 'coredns.yaml');

/** Applies CoreDNS with `image` (already imported into every node) and waits until it answers. */
export async function deployClusterDns(cluster: Cluster, image: string): Promise<void> {
  const yaml = readFileSync(MANIFEST, 'utf8')
    .replaceAll('__IMAGE__', image)
    .replaceAll('__DNS_V4__', CLUSTER_DNS[0]!)
    .replaceAll('__DNS_V6__', CLUSTER_DNS[1]!);
  await cluster.kubectl(['apply', '-f', '-'], { input: yaml });
  await cluster.kubectl(['-n', 'kube-system', 'rollout', 'status', 'deployment/coredns', '--timeout=180s']);
}
