// `npm run demo`: pier's whole job on this machine, for a person to watch.
// A real control plane and a two-node lab of network namespaces, pier's
// controller and one agent per node, one LoadBalancer Service with two pods,
// then real requests from the lab's client through the node addresses. Waits
// for Ctrl-C and removes everything; with --exit (or PIER_DEMO_EXIT=1) it
// stops after the requests, exiting 1 if any went unanswered by a pod.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CoordinationV1Api, CoreV1Api, DiscoveryV1Api, type V1LoadBalancerIngress } from '@kubernetes/client-node';
import { ensureBinaries, ensureNamespace, startControlPlane, type ControlPlane } from '../test/cluster/controlplane.ts';
import { HOST_V4, Lab } from '../test/lab/lab.ts';
import { registerLabNodes } from '../test/lab/pier.ts';
import { atExit } from '../test/support/cleanup.ts';
import { eventually } from '../test/support/wait.ts';
import { createService, NAMESPACE, publishEndpoints, SERVICE, waitForIngress, waitForPier } from './cluster.ts';
import { answerLines, serviceTable, type Answer } from './format.ts';
import { startPier, type Pier } from './pier.ts';
import { untilSignal } from './signals.ts';

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)));
const exitWhenDone = process.argv.includes('--exit') || process.env['PIER_DEMO_EXIT'] === '1';
const say = (line = '') => process.stdout.write(line === '' ? '\n' : `[demo] ${line}\n`);
const seconds = (since: number) => `${((performance.now() - since) / 1000).toFixed(1)} s`;

async function main(): Promise<number> {
  if (process.getuid?.() !== 0) {
    process.stderr.write('[demo] needs root: it creates network namespaces and iptables rules (try: sudo ./scripts/demo.sh)\n');
    return 1;
  }
  say('pier demo: a Kubernetes control plane, two nodes, pier controller and agents, one LoadBalancer Service');
  const bin = await binaries();

  let lab: Lab | undefined;
  let cp: ControlPlane | undefined;
  let pier: Pier | undefined;
  let logDir: string | undefined;
  try {
    lab = await Lab.create({ nodes: [1, 1], clients: 1, hostLink: true });
    const client = lab.clients[0]!;
    say(`lab (network namespaces pierlab-${lab.runId}-*): ${lab.nodes.map((n) => `node ${n.name} ${n.v4} ${n.v6}`).join(', ')}; client ${client.name} ${client.v4} ${client.v6}`);
    say(`pods ${lab.pods.map((p) => `${p.name} ${p.v4}`).join(', ')}, each an echo server on 8080 that answers with its name and the address it sees`);

    cp = await startControlPlane({ address: HOST_V4 });
    say(`control plane: etcd and kube-apiserver at ${cp.server} (files in ${dirname(cp.adminKubeconfigPath)})`);
    const core = cp.admin.makeApiClient(CoreV1Api);
    const discovery = cp.admin.makeApiClient(DiscoveryV1Api);

    await registerLabNodes(core, lab);
    say(`playing kubelet (the lab has none): Nodes ${lab.nodes.map((n) => n.name).join(' and ')}, Ready, with their addresses as InternalIPs`);

    await ensureNamespace(core, 'pier-system');
    logDir = mkdtempSync(join(tmpdir(), 'pier-demo-'));
    const demoDir = logDir;
    atExit(() => rmSync(demoDir, { recursive: true, force: true }));
    const started = performance.now();
    pier = startPier(lab, cp.adminKubeconfigPath, logDir);
    await waitForPier(cp.admin.makeApiClient(CoordinationV1Api), lab);
    say(`pier is up after ${seconds(started)}: the controller (on this machine) leads; the agents on ${lab.nodes.map((n) => n.name).join(' and ')} (in their namespaces) report nodes that forward IPv4 and IPv6`);

    const created = performance.now();
    await createService(core);
    say(`created Service ${NAMESPACE}/${SERVICE}: LoadBalancer, class pier.dev/lb, IPv4 and IPv6, 80/TCP and 80/UDP to the pods' 8080, externalTrafficPolicy Local`);
    await publishEndpoints(discovery, lab);
    say(`playing the EndpointSlice controller (the lab has none): slices ${SERVICE}-ipv4 and ${SERVICE}-ipv6 list ${lab.pods.map((p) => p.name).join(' and ')}`);

    const { ingress } = await waitForIngress(core, lab.nodes.length * 2);
    say(`the controller wrote ${ingress.length} addresses into the Service's status after ${seconds(created)}`);
    await waitUntilServed(lab, ingress);
    say(`the agents' rules answer on every node address ${seconds(created)} after the Service was created`);

    const svc = await core.readNamespacedService({ name: SERVICE, namespace: NAMESPACE });
    say(`\`kubectl get svc -n ${NAMESPACE}\` (EXTERNAL-IP in full, as with -o wide):`);
    say();
    process.stdout.write(`${serviceTable([svc], new Date())}\n\n`);

    const answers = await requests(lab, ingress);
    say(`${answers.length} requests from client ${client.name} to the node addresses; with the Local policy each node sends to its own pod, which sees the client's own address:`);
    for (const line of answerLines(answers)) process.stdout.write(`${line}\n`);
    const pods = new Set(lab.pods.map((p) => p.name));
    const allAnswered = answers.every((a) => a.reply && pods.has(a.reply.pod));
    if (!allAnswered) say('some requests were not answered by a pod');
    say();

    if (!exitWhenDone) {
      for (const line of lookAround(lab, cp, bin, pier, logDir, ingress)) process.stdout.write(`${line}\n`);
      say('running. Ctrl-C removes everything');
      const signal = await untilSignal();
      say(`${signal}: removing everything`);
    }
    return allAnswered ? 0 : 1;
  } catch (err) {
    process.stderr.write(`[demo] failed: ${err instanceof Error ? err.message : String(err)}\n`);
    // The logs go with everything else; their last lines usually say why.
    for (const [name, file] of Object.entries(pier?.logs ?? {})) process.stderr.write(`[demo] last lines of the ${name} log:\n${tail(file, 5)}\n`);
    return 1;
  } finally {
    await pier?.stop();
    await lab?.destroy();
    await cp?.stop();
    if (logDir) rmSync(logDir, { recursive: true, force: true });
    say('removed everything');
  }
}

function tail(file: string, lines: number): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(none)';
  }
}

/** Builds kube-apiserver, etcd and kubectl on the first run (build.sh's progress goes to stderr); returns their folder. */
async function binaries(): Promise<string> {
  const slow = setTimeout(() => say('building kube-apiserver, etcd and kubectl from Go modules (first run only, several minutes)'), 2000);
  try {
    return await ensureBinaries();
  } finally {
    clearTimeout(slow);
  }
}

/** Until every node address answers a TCP connection from the client, i.e. every agent has programmed its node. */
async function waitUntilServed(lab: Lab, ingress: V1LoadBalancerIngress[]): Promise<void> {
  await Promise.all(
    ingress.map((i) =>
      eventually(`an answer through ${i.ip}`, async () => {
        const [res] = await lab.probe(lab.clients[0]!, i.ip!, i.ports![0]!.port, { timeoutMs: 500 });
        return res?.ok === true;
      }, { timeoutMs: 30_000, intervalMs: 200 }),
    ),
  );
}

/** TCP to every address the controller listed, and UDP to one address per family. */
async function requests(lab: Lab, ingress: V1LoadBalancerIngress[]): Promise<Answer[]> {
  const v4 = ingress.filter((i) => !i.ip!.includes(':'));
  const v6 = ingress.filter((i) => i.ip!.includes(':'));
  const asks: { proto: 'tcp' | 'udp'; i: V1LoadBalancerIngress }[] = [
    ...ingress.map((i) => ({ proto: 'tcp' as const, i })),
    ...[v4[0], v6.at(-1)].filter((i) => i !== undefined).map((i) => ({ proto: 'udp' as const, i })),
  ];
  const answers: Answer[] = [];
  for (const { proto, i } of asks) {
    const port = i.ports!.find((p) => p.protocol === proto.toUpperCase())!.port;
    const [res] = await lab.probe(lab.clients[0]!, i.ip!, port, { proto, timeoutMs: 2000 });
    answers.push({ proto, address: i.ip!, port, ms: res?.ms ?? 0, reply: res?.reply, error: res?.error });
  }
  return answers;
}

function lookAround(lab: Lab, cp: ControlPlane, bin: string, pier: Pier, logDir: string, ingress: V1LoadBalancerIngress[]): string[] {
  const kubectl = `${join(bin, 'kubectl')} --kubeconfig ${cp.adminKubeconfigPath}`;
  const [first, ...others] = lab.nodes;
  const target = ingress[0]!;
  const manifests = join(logDir, 'cluster.yaml');
  return [
    '[demo] look around from another shell, as root, while this runs:',
    `  the API      ${kubectl} get nodes,svc,endpointslices,leases -A`,
    `  the rules    ip netns exec ${first!.ns} iptables-save | grep PIER    (ip6tables-save for IPv6; ${others.map((n) => `${n.name} is ${n.ns}`).join(', ')})`,
    `  a request    ip netns exec ${lab.clients[0]!.ns} ${process.execPath} ${join(ROOT, 'test/lab/probe.ts')} --host ${target.ip} --port ${target.ports![0]!.port}`,
    `  pier plan    ${kubectl} get nodes,svc,endpointslices -A -o yaml > ${manifests} && ${join(ROOT, 'scripts/pier')} plan --node ${first!.name} -f ${manifests}`,
    `  the logs     ${Object.values(pier.logs).join('  ')}`,
  ];
}

process.exit(await main());
