// Agents will run inside node namespaces and talk to the API server over the
// lab's underlay: the control plane listens on the root namespace's side of
// the host link, and a process in a node namespace reaches it with a
// ServiceAccount token the API server issued.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startControlPlane, type ControlPlane } from '../cluster/controlplane.ts';
import { HOST_V4, Lab } from '../lab/lab.ts';

describe('API server reachable from the lab', () => {
  let lab: Lab;
  let cp: ControlPlane;
  beforeAll(async () => {
    lab = await Lab.create({ nodes: [0], clients: 0, hostLink: true });
    cp = await startControlPlane({ address: HOST_V4 });
  });
  afterAll(async () => {
    await cp?.stop();
    await lab?.destroy();
  });

  it('answers a ServiceAccount from inside a node namespace, with RBAC applied', async () => {
    const kc = await cp.serviceAccount('pier-system', 'probe');
    const file = cp.writeKubeconfig(kc, 'probe');
    const script = `import { CoreV1Api, KubeConfig, VersionApi } from '@kubernetes/client-node';
const kc = new KubeConfig();
kc.loadFromFile(process.argv[1]);
const version = await kc.makeApiClient(VersionApi).getCode();
const denied = await kc.makeApiClient(CoreV1Api).listNode().then(() => 'allowed', (e) => String(e.code));
console.log(JSON.stringify({ server: kc.getCurrentCluster().server, version: version.gitVersion, denied }));`;
    const node = lab.nodes[0]!;
    const { stdout } = await lab.exec(node.ns, process.execPath, ['--input-type=module', '-e', script, file]);
    const out = JSON.parse(stdout) as { server: string; version: string; denied: string };
    expect(out.server).toBe(`https://${HOST_V4}:${new URL(cp.server).port}`);
    expect(out.version).toMatch(/^v1\.\d+\.\d+$/);
    expect(out.denied).toBe('403');
  });
});
