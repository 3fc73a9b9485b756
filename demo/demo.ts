// `npm run demo`: pier as its users run it, on a two-node Kubernetes cluster
// on this machine (test/cluster: a lab of network namespaces, a control plane,
// real nodes with containerd, kubelet and kube-proxy). It installs pier with
// the README's `kubectl apply -k`, exposes a Deployment of echo pods as
// LoadBalancer Services with kubectl, and sends real requests from the lab's
// client to the node addresses. Waits for Ctrl-C and removes everything; with
// --exit (or PIER_DEMO_EXIT=1) it stops after the requests, exiting 1 if any
// went unanswered by a pod.
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startCluster, type Cluster } from '../test/cluster/cluster.ts';
import { kubectlPath } from '../test/cluster/controlplane.ts';
import { ensureBuilt, requests, waitForAddresses, waitUntilAnswered, type Target } from './cluster.ts';
import { answerLines, commandLine } from './format.ts';
import { untilSignal } from './signals.ts';

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)));
const exitWhenDone = process.argv.includes('--exit') || process.env['PIER_DEMO_EXIT'] === '1';
const print = (text: string) => process.stdout.write(`${text.trimEnd()}\n`);
const say = (line = '') => print(line === '' ? '' : `[demo] ${line}`);
const seconds = (since: number) => `${((performance.now() - since) / 1000).toFixed(1)} s`;

async function main(): Promise<number> {
  if (process.getuid?.() !== 0) {
    process.stderr.write('[demo] needs root: it creates network namespaces, cgroups and iptables rules (try: sudo ./scripts/demo.sh)\n');
    return 1;
  }
  // The commands it prints name deploy/ as the README does, relative to the checkout.
  process.chdir(ROOT);
  say('pier demo: a two-node Kubernetes cluster on this machine, pier installed as its README says, LoadBalancer Services answering');
  await build();

  let cluster: Cluster | undefined;
  try {
    const starting = performance.now();
    say('starting the cluster (about a minute): network namespaces for two nodes and a client; etcd, kube-apiserver, kube-controller-manager, kube-scheduler; on each node containerd, kubelet, kube-proxy and the images');
    cluster = await startCluster({ nodes: 2, proxyMode: 'iptables' });
    const { lab, cp, core } = cluster;
    const client = lab.clients[0]!;
    say(`cluster up after ${seconds(starting)}:`);
    say(`  lab: network namespaces pierlab-${lab.runId}-*; ${lab.nodes.map((n) => `node ${n.name} ${n.v4} ${n.v6}`).join(', ')}; client ${client.name} ${client.v4} ${client.v6}`);
    say(`  control plane: ${cp.server} (files in ${dirname(cp.adminKubeconfigPath)})`);
    say(`  nodes' files (containerd, kubelet and kube-proxy logs): ${cluster.nodes.map((n) => n.dir).join(' ')}`);
    say(`  kubectl below is ${await kubectlPath()} --kubeconfig ${cp.adminKubeconfigPath}`);

    const c = cluster;
    const kubectl = async (args: string[]) => {
      print(`\n${commandLine(['kubectl', ...args])}`);
      const out = await c.kubectl(args);
      if (out.trim()) print(out);
      return out;
    };

    const installing = performance.now();
    await kubectl(['apply', '-k', 'deploy/overlays/kind']);
    await kubectl(['-n', 'pier-system', 'rollout', 'status', 'deployment/pier-controller', '--timeout=180s']);
    await kubectl(['-n', 'pier-system', 'rollout', 'status', 'daemonset/pier-agent', '--timeout=180s']);
    await kubectl(['get', 'pods', '-A', '-o', 'wide']);
    say();
    say(`pier runs ${seconds(installing)} after the apply: two controller replicas (one leads, the other waits) and one agent on each node, in the node's network`);

    await kubectl(['create', 'deployment', 'web', `--image=${cluster.images.names.echo}`, '--replicas=2', '--port=8080']);
    await kubectl(['rollout', 'status', 'deployment/web', '--timeout=120s']);
    await kubectl(['get', 'pods', '-l', 'app=web', '-o', 'wide']);
    const exposing = performance.now();
    await kubectl(['expose', 'deployment', 'web', '--type=LoadBalancer', '--port=80', '--target-port=8080']);
    await kubectl(['patch', 'service', 'web', '-p', JSON.stringify({ spec: { ipFamilyPolicy: 'PreferDualStack' } })]);
    await kubectl(['expose', 'deployment', 'web', '--name=web-udp', '--type=LoadBalancer', '--protocol=UDP', '--port=80', '--target-port=8080']);

    // web is dual-stack after the patch; web-udp, as kubectl expose makes it, IPv4 only.
    const v4 = lab.nodes.map((n) => n.v4);
    const v6 = lab.nodes.map((n) => n.v6);
    const targets: Target[] = [
      ...[...v4, ...v6].map((host) => ({ proto: 'tcp' as const, host, port: 80 })),
      ...v4.map((host) => ({ proto: 'udp' as const, host, port: 80 })),
    ];
    await Promise.all([waitForAddresses(core, 'web', [...v4, ...v6]), waitForAddresses(core, 'web-udp', v4)]);
    const listed = seconds(exposing);
    await waitUntilAnswered(lab, client, targets);
    say();
    say(`pier's controller wrote every node address into both Services' status ${listed} after the first expose; the agents' rules answered on all of them after ${seconds(exposing)}`);
    await kubectl(['get', 'svc', '-o', 'wide']);

    const pods = (await core.listNamespacedPod({ namespace: 'default', labelSelector: 'app=web' })).items.map((p) => p.metadata!.name!);
    const answers = await requests(lab, client, targets, 2);
    say();
    say(`${answers.length} requests from client ${client.name} (${client.v4}, ${client.v6}), two to each address of web (TCP) and web-udp (UDP).`);
    // What a pod sees, measured: the other node's address, or its own node's pod-bridge gateway (MASQUERADE takes the outgoing interface's address).
    say("With externalTrafficPolicy Cluster (kubectl expose's default) a node also sends to the pod on the other node, so pier masquerades: a pod sees the node that forwarded, by its node address or, from its own node, by the pod bridge's gateway (198.19.<node>.1, 2001:db8:1:<node>::1); externalTrafficPolicy Local keeps the client's address.");
    for (const line of answerLines(answers)) print(line);
    const allAnswered = answers.every((a) => a.reply && pods.includes(a.reply.pod));
    if (!allAnswered) say(`some requests were not answered by a pod of web (${pods.join(', ')})`);
    say();

    if (!exitWhenDone) {
      for (const line of await lookAround(cluster)) print(line);
      say('running. Ctrl-C removes everything');
      const signal = await untilSignal();
      say(`${signal}: removing everything`);
    }
    return allAnswered ? 0 : 1;
  } catch (err) {
    process.stderr.write(`[demo] failed: ${err instanceof Error ? err.message : String(err)}\n`);
    // Everything goes with the cluster; what the pods were doing usually says why.
    const pods = await cluster?.kubectl(['get', 'pods,svc', '-A', '-o', 'wide']).catch(() => undefined);
    if (pods) process.stderr.write(`[demo] kubectl get pods,svc -A -o wide:\n${pods}\n`);
    return 1;
  } finally {
    await cluster?.stop();
    say('removed everything');
  }
}

/** Builds Kubernetes and the images when the build cache (~/.cache/pier) lacks them (their progress goes to stderr), and says how long it took. */
async function build(): Promise<void> {
  const announce = setTimeout(
    () => say('building Kubernetes (etcd, kube-apiserver, kubectl, kube-controller-manager, kube-scheduler, kubelet, kube-proxy; 6 to 30 minutes on two cores) and the images (pier/agent, pier/controller, pause, echo; 2 to 4 minutes): on the first run, and later only what changed; progress on stderr'),
    3000,
  );
  const took = await ensureBuilt();
  clearTimeout(announce);
  // A cached build answers in about a second.
  const built = ([['Kubernetes', took.kubernetes], ['the images', took.images]] as const).filter(([, ms]) => ms > 3000);
  const minutes = (ms: number) => `${Math.floor(ms / 60_000)} min ${Math.round((ms % 60_000) / 1000)} s`;
  if (built.length === 0) say(`Kubernetes and the images are built already (${process.env.PIER_CACHE_DIR ?? '~/.cache/pier'})`);
  else say(`built ${built.map(([what, ms]) => `${what} in ${minutes(ms)}`).join(' and ')}; later runs reuse the build cache`);
}

async function lookAround({ lab, cp, nodes }: Cluster): Promise<string[]> {
  const [first, ...others] = lab.nodes;
  const manifests = join(dirname(cp.adminKubeconfigPath), 'cluster.yaml');
  return [
    '[demo] look around from another shell, as root, while this runs:',
    `  kubectl       alias kubectl='${await kubectlPath()} --kubeconfig ${cp.adminKubeconfigPath}'`,
    '                kubectl get nodes,pods,svc,endpointslices -A -o wide',
    `  pier's logs   kubectl -n pier-system logs -l app.kubernetes.io/name=pier-agent --prefix    (or deployment/pier-controller)`,
    `  the rules     ip netns exec ${first!.ns} iptables-save | grep PIER    (ip6tables-save for IPv6; ${others.map((n) => `${n.name} is ${n.ns}`).join(', ')})`,
    `  a request     ip netns exec ${lab.clients[0]!.ns} ${process.execPath} ${join(ROOT, 'test/lab/probe.ts')} --host ${first!.v4} --port 80    (--proto udp)`,
    `  pier plan     kubectl get nodes,svc,endpointslices -A -o yaml > ${manifests} && ${join(ROOT, 'scripts/pier')} plan --default-class --node ${first!.name} -f ${manifests}`,
    `  node logs     ${nodes.map((n) => join(n.dir, 'kubelet.log')).join(' ')}    (containerd.log, kube-proxy.log beside them)`,
  ];
}

process.exit(await main());
