// Kubernetes' own end-to-end specs for LoadBalancer Services, run against pier
// on the real-node cluster (test/cluster/), so that pier is judged by them
// rather than by our reading of them (issue 27).
//
//   node test/upstream/run.ts [--backend iptables|nftables] [--focus REGEX]
//                             [--skip REGEX] [--spec-timeout MINUTES] [--site 0-6]
//                             [--shard K/N] [--json FILE] [--long-after FILE] [--list]
//
// 1. test/upstream/build.sh: e2e.test (`go test -c k8s.io/kubernetes/test/e2e`),
//    the agnhost and CoreDNS images (cached; a warm run costs seconds).
// 2. The specs the focus selects, listed by e2e.test itself (--ginkgo.dry-run).
//    `--list` stops here (no cluster, no root needed).
// 3. startCluster(): two real nodes, kube-proxy in iptables mode; agnhost and
//    CoreDNS imported into every node's containerd; CoreDNS deployed as kind
//    deploys it; pier applied with `kubectl apply -k` (the kind overlay, with
//    PIER_BACKEND from --backend merged into pier-config, as the README tells
//    users to configure it).
// 4. Each spec alone (pier gives each address/protocol/port to the oldest
//    Service, so specs must not overlap), with a timeout, waiting between
//    specs until the previous spec's namespaces are gone.
// 5. A table of every spec and its outcome (and with --json, the same as data
//    for scripts/summary.ts); exit 1 when an applicable spec failed.
//
// --shard K/N runs the K-th of N parts of the specs (shardOf), so that N
// clusters on N lab sites share one backend's specs at the same time. The
// long specs (rolling updates, about 10 minutes) run last; with --long-after
// FILE they wait until FILE exists: scripts/test.sh creates it when vitest is
// done, since those specs count failed requests over a rolling update, and on
// two cores shared with vitest the pods restart slowly enough that an
// externalTrafficPolicy=Local round fell to 91 % beside its real nodes, and to
// 91.5 and 94.5 % beside its integration tests alone (upstream asks 95 %).
//
// Specs that do not apply to pier are skipped by name, with the reason (SKIPPED_BY_NAME).
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { execa } from 'execa';
import { startCluster, type Cluster } from '../cluster/cluster.ts';
import { SITES, siteIndex, type LabSiteIndex } from '../lab/lab.ts';
import { shardOf, specWeight } from './shard.ts';
import { kubectlPath } from '../cluster/controlplane.ts';
import { deployClusterDns } from '../cluster/dns.ts';
import { atExit } from '../support/cleanup.ts';
import { kindOverlay } from '../support/deploy.ts';
import { eventually } from '../support/wait.ts';

const HERE = dirname(fileURLToPath(import.meta.url));
const BUILD = join(HERE, 'build.sh');
const SYSTEM = 'pier-system';

/**
 * What issue 27 asks for: every spec of the `[sig-network] LoadBalancers`
 * containers (test/e2e/network/loadbalancer.go), and the `[sig-network] Services`
 * specs that create LoadBalancer Services (service.go): the multi-protocol one,
 * the two health-check-node-port ones (kube-proxy's part of a LoadBalancer
 * Service, beside pier's rules) and the status lifecycle (a LoadBalancer of
 * another class, whose status pier must leave alone).
 */
const DEFAULT_FOCUS = [
  String.raw`\[sig-network\] LoadBalancers`,
  String.raw`\[sig-network\] Services should serve endpoints on same port and different protocol for internal traffic on Type LoadBalancer`,
  String.raw`\[sig-network\] Services should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes`,
  String.raw`\[sig-network\] Services should fail health check node port if there are only terminating endpoints`,
  String.raw`\[sig-network\] Services should complete a service status lifecycle`,
].join('|');

/** Specs that do not apply to pier: not run, reported as skipped with the reason. */
const SKIPPED_BY_NAME: { match: RegExp; reason: string }[] = [
  {
    match: /should handle load balancer cleanup finalizer for service/,
    reason: 'not applicable: pier adds no service.kubernetes.io/load-balancer-cleanup finalizer by design (deleting a Service needs nothing from pier)',
  },
  {
    match: /LoadBalancers ExternalTrafficPolicy: Local .*should only target nodes with endpoints/,
    reason:
      "not applicable on dual-stack nodes: it probes kube-proxy's health-check NodePort of an IPv4 Service on every InternalIP of each node, the IPv6 one too, where kube-proxy serves it on IPv4 only (pkg/proxy/healthcheck: one listener per Service family); no load balancer can change that",
  },
  {
    match: /LoadBalancers ExternalTrafficPolicy: Local .*should (work for type=LoadBalancer|work from pods)/,
    reason: "not applicable: upstream skips it for ipMode Proxy (loadbalancer.go: \"LoadBalancer uses 'Proxy' IPMode\"); pier's ingress is ipMode Proxy",
  },
];

interface Args {
  backend: 'iptables' | 'nftables';
  focus: string;
  skip?: string;
  specTimeoutMin: number;
  /** The lab's address plan (test/lab/lab.ts): runs at once need one each. */
  site: LabSiteIndex;
  /** This run's part of the specs, [K, N] with 1 <= K <= N. */
  shard: [number, number];
  /** Where to write the outcomes as JSON (UpstreamResult). */
  json?: string;
  /** The long specs wait until this file exists. */
  longAfter?: string;
  list: boolean;
}

function parse(): Args {
  const { values } = parseArgs({
    options: {
      backend: { type: 'string', default: 'iptables' },
      focus: { type: 'string', default: DEFAULT_FOCUS },
      skip: { type: 'string' },
      'spec-timeout': { type: 'string', default: '20' },
      site: { type: 'string', default: '0' },
      shard: { type: 'string', default: '1/1' },
      json: { type: 'string' },
      'long-after': { type: 'string' },
      list: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    console.log('usage: node test/upstream/run.ts [--backend iptables|nftables] [--focus REGEX] [--skip REGEX] [--spec-timeout MINUTES] [--site 0-6] [--shard K/N] [--json FILE] [--long-after FILE] [--list]');
    process.exit(0);
  }
  if (values.backend !== 'iptables' && values.backend !== 'nftables') {
    console.error(`--backend: ${values.backend} is neither iptables nor nftables`);
    process.exit(2);
  }
  const specTimeoutMin = Number(values['spec-timeout']);
  if (!(specTimeoutMin > 0)) {
    console.error(`--spec-timeout: ${values['spec-timeout']} is not a positive number of minutes`);
    process.exit(2);
  }
  const site = siteIndex(values.site!);
  if (site === undefined) {
    console.error(`--site: ${values.site} is not a lab site (0 to ${SITES.length - 1})`);
    process.exit(2);
  }
  const shard = /^(\d+)\/(\d+)$/.exec(values.shard!)?.slice(1).map(Number);
  if (!shard || !(shard[0]! >= 1 && shard[0]! <= shard[1]!)) {
    console.error(`--shard: ${values.shard} is not K/N with 1 <= K <= N`);
    process.exit(2);
  }
  return { backend: values.backend, focus: values.focus!, skip: values.skip, specTimeoutMin, site, shard: [shard[0]!, shard[1]!], json: values.json, longAfter: values['long-after'], list: values.list! };
}

interface Upstream {
  e2eTest: string;
  kubernetesVersion: string;
  images: Record<'agnhost' | 'coredns', { name: string; archive: string }>;
}

const log = (msg: string) => console.error(`[upstream] ${msg}`);

async function build(): Promise<Upstream> {
  const r = await execa('bash', [BUILD], { stdin: 'ignore', stderr: 'inherit', reject: false });
  if (r.exitCode !== 0) throw new Error(`test/upstream/build.sh exited with ${r.exitCode} (its log is above)`);
  return JSON.parse(readFileSync(r.stdout.trim(), 'utf8')) as Upstream;
}

// --- ginkgo's JSON report (the part read here) -----------------------------------

interface SpecReport {
  ContainerHierarchyTexts: string[] | null;
  LeafNodeText: string;
  LeafNodeType: string;
  State: string;
  RunTime?: number;
  Failure?: { Message: string; Location?: { FileName: string; LineNumber: number } };
}

function readReport(file: string): SpecReport[] {
  const reports = JSON.parse(readFileSync(file, 'utf8')) as { SpecReports: SpecReport[] | null }[];
  return reports.flatMap((r) => r.SpecReports ?? []).filter((s) => s.LeafNodeType === 'It');
}

/** The text --ginkgo.focus matches: the containers' texts and the spec's, joined by spaces. */
const fullText = (s: SpecReport) => [...(s.ContainerHierarchyTexts ?? []), s.LeafNodeText].join(' ');
const escapeRegex = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** The framework's common flags: no cloud provider, kubectl from the same build, no log dumps over SSH. */
function e2eFlags(kubeconfig: string, kubectl: string): string[] {
  return [
    `--kubeconfig=${kubeconfig}`,
    '--provider=skeleton',
    `--kubectl-path=${kubectl}`,
    '--node-os-distro=debian',
    '--dump-logs-on-failure=false',
    '--ginkgo.no-color',
  ];
}

async function listSpecs(up: Upstream, args: Args, work: string, kubectl: string): Promise<SpecReport[]> {
  const report = join(work, 'dry-run.json');
  const flags = [...e2eFlags(join(work, 'no-kubeconfig'), kubectl), '--ginkgo.dry-run', `--ginkgo.focus=${args.focus}`, `--ginkgo.json-report=${report}`];
  if (args.skip) flags.push(`--ginkgo.skip=${args.skip}`);
  const r = await execa(up.e2eTest, flags, { reject: false, all: true, cwd: work });
  if (!existsSync(report)) throw new Error(`e2e.test --ginkgo.dry-run wrote no report (exit ${r.exitCode}):\n${String(r.all).split('\n').slice(-30).join('\n')}`);
  // A dry run reports the selected specs as passed and the others as skipped.
  return readReport(report).filter((s) => s.State === 'passed');
}

// --- the cluster ---------------------------------------------------------------

async function importImages(cluster: Cluster, up: Upstream): Promise<void> {
  await Promise.all(
    cluster.nodes.map(async (node) => {
      await node.importImages([up.images.agnhost.archive, up.images.coredns.archive]);
      // The e2e manifest's pause (3.10.2) for specs that run it as a container: the nodes' sandbox image, tagged.
      const ctr = ['--address', join(node.dir, 'containerd.sock'), '--namespace', 'k8s.io', 'images'];
      await node.exec('ctr', [...ctr, 'tag', '--force', 'registry.k8s.io/pause:3.10', 'registry.k8s.io/pause:3.10.2'], { reject: false });
    }),
  );
}

/** The kind overlay as a user adapts it (README, Configuration): the agents given the API server's address, the backend in pier-config. */
async function deployPier(cluster: Cluster, backend: Args['backend'], work: string): Promise<void> {
  const dir = kindOverlay(join(work, 'pier-overlay'), { apiServer: new URL(cluster.cp.server).host, config: { PIER_BACKEND: backend } });
  await cluster.kubectl(['apply', '-k', dir]);
  await cluster.kubectl(['-n', SYSTEM, 'rollout', 'status', 'deployment/pier-controller', '--timeout=180s']);
  await cluster.kubectl(['-n', SYSTEM, 'rollout', 'status', 'daemonset/pier-agent', '--timeout=180s']);
}

const BASE_NAMESPACES = new Set(['default', 'kube-system', 'kube-public', 'kube-node-lease', SYSTEM]);

/** The e2e namespaces still present (a spec's namespace is deleted at its end, asynchronously). */
async function leftoverNamespaces(cluster: Cluster): Promise<string[]> {
  const out = await cluster.kubectl(['get', 'namespaces', '-o', 'jsonpath={range .items[*]}{.metadata.name}{"\\n"}{end}']);
  return out.split('\n').filter((n) => n && !BASE_NAMESPACES.has(n));
}

// --- running and reporting -------------------------------------------------------

interface Outcome {
  spec: string;
  state: 'passed' | 'failed' | 'skipped' | 'timed out' | 'error';
  detail: string;
  seconds?: number;
}

async function runSpec(cluster: Cluster, up: Upstream, spec: string, index: number, args: Args, work: string, kubectl: string): Promise<Outcome> {
  const dir = join(work, `spec-${String(index).padStart(2, '0')}`);
  mkdirSync(dir);
  const report = join(dir, 'report.json');
  const timeoutMs = args.specTimeoutMin * 60_000;
  const started = Date.now();
  const proc = execa(
    up.e2eTest,
    [
      ...e2eFlags(cluster.cp.adminKubeconfigPath, kubectl),
      // Ginkgo matches the focus against the suite's description, a space and the spec's text.
      `--ginkgo.focus=(?:^| )${escapeRegex(spec)}$`,
      `--ginkgo.json-report=${report}`,
      `--report-dir=${dir}`,
      `--ginkgo.timeout=${args.specTimeoutMin}m`,
      '--ginkgo.v',
    ],
    { reject: false, all: true, cwd: dir, timeout: timeoutMs + 120_000, forceKillAfterDelay: 10_000 },
  );
  // Interrupted, the run stops its cluster (atExit): the spec must not outlive it.
  const unregister = atExit(() => proc.kill('SIGKILL'));
  const r = await proc;
  unregister();
  writeFileSync(join(dir, 'output.log'), String(r.all ?? ''));
  const seconds = Math.round((Date.now() - started) / 1000);
  if (!existsSync(report)) {
    const last = String(r.all ?? '').trim().split('\n').slice(-5).join(' | ');
    return { spec, state: r.timedOut ? 'timed out' : 'error', detail: `e2e.test exited ${r.exitCode ?? r.signal} without a report: ${last}`, seconds };
  }
  const s = readReport(report).find((x) => fullText(x) === spec);
  if (!s) return { spec, state: 'error', detail: `the report has no spec by this name (exit ${r.exitCode})`, seconds };
  const firstLine = (m?: string) => (m ?? '').trim().split('\n')[0] ?? '';
  const where = s.Failure?.Location ? ` (${s.Failure.Location.FileName.replace(/^.*\/test\/e2e\//, 'test/e2e/')}:${s.Failure.Location.LineNumber})` : '';
  switch (s.State) {
    case 'passed':
      return { spec, state: 'passed', detail: '', seconds };
    case 'skipped':
      if (!s.Failure) return { spec, state: 'error', detail: 'not run: the focus did not select it', seconds };
      return { spec, state: 'skipped', detail: `upstream: ${firstLine(s.Failure?.Message)}`, seconds };
    case 'timedout':
      return { spec, state: 'timed out', detail: firstLine(s.Failure?.Message) + where, seconds };
    default:
      return { spec, state: 'failed', detail: `${s.State === 'failed' ? '' : `${s.State}: `}${firstLine(s.Failure?.Message)}${where}`, seconds };
  }
}

/** What --json writes: scripts/summary.ts counts these in the run's closing line. */
export interface UpstreamResult {
  backend: string;
  shard: string;
  /** false when the run stopped before every spec of its shard had an outcome (the cluster failed to start, say). */
  complete: boolean;
  outcomes: Outcome[];
}

function printTable(outcomes: Outcome[], backend: string): void {
  const short = (s: string) => s.replace(/^\[sig-network\] /, '');
  const rows = outcomes.map((o) => [short(o.spec), o.state + (o.seconds !== undefined ? ` (${o.seconds} s)` : ''), o.detail]);
  const w0 = Math.min(110, Math.max(4, ...rows.map((r) => r[0]!.length)));
  const w1 = Math.max(7, ...rows.map((r) => r[1]!.length));
  const line = (a: string, b: string, c: string) => `${a.padEnd(w0)}  ${b.padEnd(w1)}  ${c}`;
  console.log(`\nUpstream Kubernetes LoadBalancer specs against pier (backend ${backend}):\n`);
  console.log(line('spec', 'outcome', 'detail'));
  console.log(line('-'.repeat(w0), '-'.repeat(w1), '-'.repeat(6)));
  for (const r of rows) console.log(line(r[0]!, r[1]!, r[2]!));
  const count = (st: Outcome['state']) => outcomes.filter((o) => o.state === st).length;
  console.log(`\n${count('passed')} passed, ${count('failed') + count('timed out') + count('error')} failed, ${count('skipped')} skipped, of ${outcomes.length}`);
}

async function main(): Promise<number> {
  const args = parse();
  const work = mkdtempSync(join(tmpdir(), 'pier-upstream-'));
  log(`work folder (reports, each spec's output): ${work}`);
  const [up, kubectl] = await Promise.all([build(), kubectlPath()]);
  const listed = await listSpecs(up, args, work, kubectl);
  if (listed.length === 0) throw new Error(`no spec matches --focus ${args.focus}`);
  // In file order (ginkgo's dry run shuffles the top-level containers).
  const skipReason = (spec: string) => SKIPPED_BY_NAME.find((s) => s.match.test(spec))?.reason;
  const all = listed.map(fullText).sort();
  // The long ones last (sort is stable: name order otherwise).
  const specs = shardOf(all, args.shard, (spec) => (skipReason(spec) ? 0 : specWeight(spec))).sort((a, b) => specWeight(a) - specWeight(b));
  const part = args.shard[1] > 1 ? `, shard ${args.shard.join('/')}: ${specs.length} of ${all.length}` : '';
  log(`${specs.length} specs (e2e.test ${up.kubernetesVersion}${part}):\n${specs.map((s) => `  ${skipReason(s) ? 'skip ' : 'run  '} ${s}`).join('\n')}`);
  if (args.list) return 0;

  const outcomes: Outcome[] = [];
  let cluster: Cluster | undefined;
  try {
    log(`starting the real-node cluster (2 nodes, kube-proxy in iptables mode, lab site ${args.site})`);
    cluster = await startCluster({ nodes: 2, proxyMode: 'iptables', site: args.site });
    await importImages(cluster, up);
    await deployClusterDns(cluster, up.images.coredns.name);
    log(`deploying pier (deploy/overlays/kind, PIER_BACKEND=${args.backend})`);
    await deployPier(cluster, args.backend, work);

    for (const [i, spec] of specs.entries()) {
      const reason = skipReason(spec);
      if (reason) {
        outcomes.push({ spec, state: 'skipped', detail: reason });
        continue;
      }
      // A spec alone: the previous one's namespaces (and Services) gone first.
      await eventually('the previous spec\'s namespaces to be deleted', async () => (await leftoverNamespaces(cluster!)).length === 0, { timeoutMs: 300_000, intervalMs: 2000 }).catch(async (err: unknown) => {
        log(`warning: ${(err as Error).message}: ${(await leftoverNamespaces(cluster!)).join(', ')}`);
      });
      if (args.longAfter && specWeight(spec) > 1 && !existsSync(args.longAfter)) {
        log(`waiting for ${args.longAfter} before the long specs`);
        await eventually(`${args.longAfter} to exist`, () => existsSync(args.longAfter!), { timeoutMs: 3 * 3600_000, intervalMs: 2000 });
      }
      log(`[${i + 1}/${specs.length}] ${spec}`);
      const o = await runSpec(cluster, up, spec, i, args, work, kubectl);
      log(`[${i + 1}/${specs.length}] ${o.state}${o.detail ? `: ${o.detail}` : ''}`);
      outcomes.push(o);
    }
  } finally {
    if (outcomes.length > 0) printTable(outcomes, args.backend);
    if (args.json) {
      const result: UpstreamResult = { backend: args.backend, shard: args.shard.join('/'), complete: outcomes.length === specs.length, outcomes };
      writeFileSync(args.json, `${JSON.stringify(result, null, 2)}\n`);
    }
    log('stopping the cluster');
    await cluster?.stop();
  }
  const failed = outcomes.some((o) => o.state === 'failed' || o.state === 'timed out' || o.state === 'error');
  // ~110 MB a run: kept only when there is a failure to read in it.
  if (failed) log(`each spec's output and junit report, kept: ${work}/spec-*/`);
  else rmSync(work, { recursive: true, force: true });
  return failed ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(`[upstream] ${(err as Error).stack ?? String(err)}`);
    process.exit(1);
  },
);
