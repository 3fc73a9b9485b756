// A real, throw-away Kubernetes control plane: etcd and kube-apiserver built
// from Go modules (build.sh), on loopback or an address the lab's node
// namespaces reach, with RBAC on. By default there is no controller-manager:
// tests create every object themselves. With `controllers`, the control plane
// is whole (kube-controller-manager, kube-scheduler, the Node authorizer and
// the kubernetes Service's endpoints), for real nodes (node.ts) to join.
import { appendFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { CoreV1Api, KubeConfig, PatchStrategy, setHeaderOptions, type V1Node } from '@kubernetes/client-node';
import { execa, type ResultPromise } from 'execa';
import { atExit, isAlive } from '../support/cleanup.ts';
import { freePort } from '../support/ports.ts';
import { createPki, issueClientCert, type Pki } from './pki.ts';

const HERE = dirname(fileURLToPath(import.meta.url));
const TMP_PREFIX = 'pier-cp-';
const exited = new WeakSet<ResultPromise>();
/** What build.sh builds; node.ts runs the last three on each node. */
export const CLUSTER_BINARIES = ['etcd', 'kube-apiserver', 'kubectl', 'kube-controller-manager', 'kube-scheduler', 'kubelet', 'kube-proxy'] as const;

/** Service ranges inside documentation space, disjoint from the lab's pod and node ranges. */
export const SERVICE_CIDRS = ['198.18.0.0/16', '2001:db8:ffff::/112'];
/** kube-dns's ClusterIPs (dns.ts), the kubelets' clusterDNS: the 10th address of each range, as kubeadm and kind choose. */
export const CLUSTER_DNS = ['198.18.0.10', '2001:db8:ffff::a'];

export interface ControlPlaneOptions {
  /** Address kube-apiserver binds to and advertises; default 127.0.0.1. */
  address?: string;
  /** Extra `--flag=value` arguments for kube-apiserver. */
  apiserverArgs?: string[];
  /** Also runs kube-controller-manager and kube-scheduler; needs an `address` pods can reach (not loopback). */
  controllers?: boolean;
}

export interface ControlPlane {
  /** https://address:port of the first API server. */
  readonly server: string;
  readonly address: string;
  readonly caPem: string;
  /** A cluster-admin KubeConfig (static token in system:masters). */
  readonly admin: KubeConfig;
  /** The admin kubeconfig written to disk, for child processes. */
  readonly adminKubeconfigPath: string;
  /** A KubeConfig whose token the API server issued for this ServiceAccount (created if missing). */
  serviceAccount(namespace: string, name: string, opts?: { server?: string; boundPod?: { name: string; uid: string } }): Promise<KubeConfig>;
  /** Writes `kc` to a file in the control plane's temporary folder. */
  writeKubeconfig(kc: KubeConfig, name: string): string;
  /** Kills the first API server (SIGKILL): etcd and every other server stay up. */
  killApiServer(): Promise<void>;
  /** Starts the first API server again, same address and port. */
  restartApiServer(): Promise<void>;
  /** SIGSTOP: the first API server hangs with every connection left open, as a stalled server does. stop() continues it first. */
  pauseApiServer(): void;
  /** SIGCONT after pauseApiServer(); harmless when it runs. */
  resumeApiServer(): void;
  /** Another API server on the same etcd (an HA replica), for changes while the first is down. */
  startExtraApiServer(): Promise<{ server: string; admin: KubeConfig; stop: () => Promise<void> }>;
  /** The CA and keys, for components that join (kubelets, kube-proxy). */
  readonly pki: Pki;
  /** Writes a kubeconfig authenticating with a new client certificate for `cn` in groups `orgs`. */
  clientKubeconfig(name: string, cn: string, orgs?: string[]): Promise<string>;
  /** Stops everything and removes every temporary file. Safe to call twice. */
  stop(): Promise<void>;
}

/** Runs build.sh (a no-op when cached) and returns the folder with the binaries. */
export async function ensureBinaries(): Promise<string> {
  const fromEnv = process.env['PIER_CLUSTER_BIN_DIR'];
  if (fromEnv && CLUSTER_BINARIES.every((b) => existsSync(join(fromEnv, b)))) return fromEnv;
  const { stdout } = await execa('bash', [join(HERE, 'build.sh')], { stderr: 'inherit' });
  return stdout.trim();
}

/** The kubectl built with the control plane (it renders deploy/ with its built-in kustomize). */
export async function kubectlPath(): Promise<string> {
  return join(await ensureBinaries(), 'kubectl');
}

/** Removes what crashed runs left: temporary folders whose owner is gone, and their processes. */
export function sweepStaleControlPlanes(): void {
  const base = tmpdir();
  for (const entry of readdirSync(base)) {
    if (!entry.startsWith(TMP_PREFIX)) continue;
    const dir = join(base, entry);
    const owner = Number(readIfExists(join(dir, 'owner.pid')));
    if (owner && isAlive(owner)) continue;
    for (const line of readIfExists(join(dir, 'children.pid')).split('\n')) {
      const pid = Number(line);
      if (pid && isAlive(pid)) killQuietly(pid, 'SIGKILL');
    }
    rmSync(dir, { recursive: true, force: true });
  }
}

export async function startControlPlane(opts: ControlPlaneOptions = {}): Promise<ControlPlane> {
  sweepStaleControlPlanes();
  const bin = await ensureBinaries();
  const address = opts.address ?? '127.0.0.1';
  if (opts.controllers && (address.startsWith('127.') || address === '::1')) {
    throw new Error('a control plane with controllers needs an address pods can reach, not loopback');
  }
  const dir = mkdtempSync(join(tmpdir(), TMP_PREFIX));
  writeFileSync(join(dir, 'owner.pid'), String(process.pid));
  const children = new Set<ResultPromise>();
  const unregister = atExit(() => {
    for (const c of children) if (c.pid) killQuietly(c.pid, 'SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });

  const spawn = (name: string, file: string, args: string[]) => {
    const { child, log } = spawnLogged(dir, name, file, args);
    children.add(child);
    if (child.pid) appendFileSync(join(dir, 'children.pid'), `${child.pid}\n`);
    void child.then(() => {
      exited.add(child);
      children.delete(child);
    });
    return { child, log };
  };

  let stopped = false;
  const stopAll = async () => {
    if (stopped) return;
    stopped = true;
    // A stopped process handles SIGTERM only once it runs again.
    for (const c of children) c.kill('SIGCONT');
    await Promise.all([...children].map((c) => terminate(c)));
    rmSync(dir, { recursive: true, force: true });
    unregister();
  };

  try {
    const sans = { ips: [...new Set(['127.0.0.1', address, '198.18.0.1'])], dns: ['localhost', 'kubernetes', 'kubernetes.default.svc'] };
    const pki = await createPki(dir, sans);
    const adminToken = randomToken();
    writeFileSync(join(dir, 'tokens.csv'), `${adminToken},pier-test-admin,pier-test-admin,"system:masters"\n`);

    const etcdUrl = await startEtcd(bin, dir, spawn);
    const extraArgs = [...(opts.controllers ? await wholeClusterArgs(pki) : []), ...(opts.apiserverArgs ?? [])];
    const apiArgs = (port: number) => apiserverArgs(dir, pki, etcdUrl, address, port, extraArgs);

    const port = await freePort(address);
    let api = spawn('kube-apiserver', join(bin, 'kube-apiserver'), apiArgs(port));
    const server = `https://${hostPort(address, port)}`;
    await waitReady(server, pki.caPem, adminToken, api);

    const admin = tokenKubeConfig(server, pki.caPem, adminToken, 'pier-test-admin');
    await waitForDefaultNamespace(admin);
    const adminKubeconfigPath = join(dir, 'admin.kubeconfig');
    writeFileSync(adminKubeconfigPath, admin.exportConfig());

    const core = admin.makeApiClient(CoreV1Api);
    const clientKubeconfig = async (name: string, cn: string, orgs: string[] = []) => {
      const { cert, key } = await issueClientCert(pki, name, cn, orgs);
      const file = join(dir, `${name}.kubeconfig`);
      const kc = new KubeConfig();
      kc.loadFromOptions({
        clusters: [{ name: 'pier-test', server, caFile: pki.caCert }],
        users: [{ name: cn, certFile: cert, keyFile: key }],
        contexts: [{ name: 'pier-test', cluster: 'pier-test', user: cn }],
        currentContext: 'pier-test',
      });
      writeFileSync(file, kc.exportConfig(), { mode: 0o600 });
      return file;
    };
    if (opts.controllers) await startControllers(bin, dir, pki, spawn, clientKubeconfig);

    return {
      server,
      address,
      caPem: pki.caPem,
      admin,
      adminKubeconfigPath,
      async serviceAccount(namespace, name, saOpts = {}) {
        await ensureNamespace(core, namespace);
        try {
          await core.createNamespacedServiceAccount({ namespace, body: { metadata: { name } } });
        } catch (err) {
          if (statusOf(err) !== 409) throw err;
        }
        const tr = await core.createNamespacedServiceAccountToken({
          name,
          namespace,
          // A token bound to a scheduled Pod also names its node (userInfo.extra
          // authentication.kubernetes.io/node-name), as a kubelet-projected one does.
          body: {
            spec: {
              audiences: [],
              expirationSeconds: 3600,
              boundObjectRef: saOpts.boundPod && { apiVersion: 'v1', kind: 'Pod', ...saOpts.boundPod },
            },
          },
        });
        const token = tr.status?.token;
        if (!token) throw new Error(`TokenRequest for ${namespace}/${name} returned no token`);
        return tokenKubeConfig(saOpts.server ?? server, pki.caPem, token, `system:serviceaccount:${namespace}:${name}`);
      },
      writeKubeconfig(kc, name) {
        const file = join(dir, `${name}.kubeconfig`);
        writeFileSync(file, kc.exportConfig(), { mode: 0o600 });
        return file;
      },
      async killApiServer() {
        await terminate(api.child, 'SIGKILL');
      },
      pauseApiServer() {
        // setpriv execs kube-apiserver, so this is the server's own pid.
        api.child.kill('SIGSTOP');
      },
      resumeApiServer() {
        api.child.kill('SIGCONT');
      },
      async restartApiServer() {
        // The port was just released; the same one keeps clients' URLs valid.
        api = spawn('kube-apiserver', join(bin, 'kube-apiserver'), apiArgs(port));
        await waitReady(server, pki.caPem, adminToken, api);
      },
      async startExtraApiServer() {
        const extraPort = await freePort(address);
        const extra = spawn(`kube-apiserver-${extraPort}`, join(bin, 'kube-apiserver'), apiArgs(extraPort));
        const extraServer = `https://${hostPort(address, extraPort)}`;
        await waitReady(extraServer, pki.caPem, adminToken, extra);
        return {
          server: extraServer,
          admin: tokenKubeConfig(extraServer, pki.caPem, adminToken, 'pier-test-admin'),
          stop: () => terminate(extra.child),
        };
      },
      pki,
      clientKubeconfig,
      stop: stopAll,
    };
  } catch (err) {
    const logs = readdirSync(dir)
      .filter((f) => f.endsWith('.log'))
      .map((f) => `--- ${f} (last lines) ---\n${tail(readIfExists(join(dir, f)), 30)}`)
      .join('\n');
    await stopAll();
    throw new Error(`control plane failed to start: ${(err as Error).message}\n${logs}`, { cause: err });
  }
}

/**
 * Starts `file` with its output in `<dir>/<name>.log`. setpriv's parent-death
 * signal kills it even if this process is SIGKILLed, when no exit handler can run.
 */
export function spawnLogged(dir: string, name: string, file: string, args: string[]): { child: ResultPromise; log: string } {
  const log = join(dir, `${name}.log`);
  const child = execa('setpriv', ['--pdeathsig', 'SIGKILL', '--', file, ...args], {
    stdin: 'ignore',
    stdout: { file: log, append: true },
    stderr: { file: log, append: true },
    reject: false,
  });
  return { child, log };
}

type Spawn = (name: string, file: string, args: string[]) => { child: ResultPromise; log: string };

async function startEtcd(bin: string, dir: string, spawn: Spawn): Promise<string> {
  const clientPort = await freePort();
  const peerPort = await freePort();
  const client = `http://127.0.0.1:${clientPort}`;
  const peer = `http://127.0.0.1:${peerPort}`;
  const etcd = spawn('etcd', join(bin, 'etcd'), [
    '--name=pier-test',
    `--data-dir=${join(dir, 'etcd')}`,
    `--listen-client-urls=${client}`,
    `--advertise-client-urls=${client}`,
    `--listen-peer-urls=${peer}`,
    `--initial-advertise-peer-urls=${peer}`,
    `--initial-cluster=pier-test=${peer}`,
    '--log-level=warn',
    // A test cluster's data is disposable; fsync would dominate its latency.
    '--unsafe-no-fsync',
  ]);
  await waitFor(`etcd at ${client}`, 30_000, etcd, async () => {
    const res = await fetch(`${client}/health`).catch(() => undefined);
    return res?.ok === true;
  });
  return client;
}

/** The flags of every test API server; a flag in `extra` replaces the default of the same name. */
function apiserverArgs(dir: string, pki: Pki, etcd: string, address: string, port: number, extra: string[]): string[] {
  return [
    `--etcd-servers=${etcd}`,
    `--bind-address=${address}`,
    `--advertise-address=${address}`,
    `--secure-port=${port}`,
    `--cert-dir=${join(dir, 'apiserver-certs')}`,
    `--tls-cert-file=${pki.serverCert}`,
    `--tls-private-key-file=${pki.serverKey}`,
    `--client-ca-file=${pki.caCert}`,
    `--token-auth-file=${join(dir, 'tokens.csv')}`,
    '--authorization-mode=RBAC',
    '--anonymous-auth=false',
    '--service-account-issuer=https://kubernetes.default.svc.cluster.local',
    `--service-account-key-file=${pki.saPublic}`,
    `--service-account-signing-key-file=${pki.saPrivate}`,
    `--service-cluster-ip-range=${SERVICE_CIDRS.join(',')}`,
    '--service-node-port-range=30000-32767',
    '--profiling=false',
    // Nothing in the test cluster uses the kubernetes Service's endpoints,
    // and the reconciler refuses loopback advertise addresses.
    '--endpoint-reconciler-type=none',
  ].filter((flag) => !extra.some((e) => e.split('=')[0] === flag.split('=')[0])).concat(extra);
}

/**
 * kube-apiserver flags of a cluster with nodes: kubelets are authorised as
 * nodes (the Node authorizer, NodeRestriction is on by default), the
 * apiserver authenticates to kubelets for logs and exec, and it publishes its
 * own address as the kubernetes Service's endpoint, which pods reach through
 * kube-proxy.
 */
async function wholeClusterArgs(pki: Pki): Promise<string[]> {
  const kubeletClient = await issueClientCert(pki, 'apiserver-kubelet-client', 'kube-apiserver-kubelet-client', ['system:masters']);
  return [
    '--authorization-mode=Node,RBAC',
    '--endpoint-reconciler-type=lease',
    `--kubelet-client-certificate=${kubeletClient.cert}`,
    `--kubelet-client-key=${kubeletClient.key}`,
    '--kubelet-preferred-address-types=InternalIP',
  ];
}

type ClientKubeconfig = (name: string, cn: string, orgs?: string[]) => Promise<string>;

/**
 * kube-controller-manager (EndpointSlices, Deployments, DaemonSets, node
 * lifecycle, the kube-root-ca.crt ConfigMap pods mount) and kube-scheduler,
 * each with the identity its bootstrap RBAC expects. No serving port: nothing
 * scrapes them, and two control planes must not collide on fixed ports.
 */
async function startControllers(bin: string, dir: string, pki: Pki, spawn: Spawn, kubeconfig: ClientKubeconfig): Promise<void> {
  const common = (kc: string) => [`--kubeconfig=${kc}`, `--authentication-kubeconfig=${kc}`, `--authorization-kubeconfig=${kc}`, '--secure-port=0', '--leader-elect=false', '--v=1'];
  const kcm = await kubeconfig('kube-controller-manager', 'system:kube-controller-manager');
  spawn('kube-controller-manager', join(bin, 'kube-controller-manager'), [
    ...common(kcm),
    '--use-service-account-credentials=true',
    `--service-account-private-key-file=${pki.saPrivate}`,
    `--root-ca-file=${pki.caCert}`,
    `--cluster-signing-cert-file=${pki.caCert}`,
    `--cluster-signing-key-file=${pki.caKey}`,
    '--allocate-node-cidrs=false',
    `--service-cluster-ip-range=${SERVICE_CIDRS.join(',')}`,
    // Kubernetes' long-time default. Without leader election (above) the
    // node lifecycle controller has no outage detection of its own: an API
    // server stopped for longer than this makes it mark every node NotReady
    // when it comes back, before the kubelets' renewals arrive, and pier then
    // rightly withdraws them. The real-node test stops the API server for
    // longer than the agent Lease it deploys pier with (20 s), and less than this.
    '--node-monitor-grace-period=40s',
  ]);
  const scheduler = await kubeconfig('kube-scheduler', 'system:kube-scheduler');
  spawn('kube-scheduler', join(bin, 'kube-scheduler'), common(scheduler));
}

async function waitReady(server: string, ca: string, token: string, api: { child: ResultPromise; log: string }): Promise<void> {
  await waitFor(`kube-apiserver at ${server}`, 90_000, api, async () => (await httpsGet(`${server}/readyz`, ca, token)) === 200);
}

export async function waitFor(what: string, timeoutMs: number, proc: { child: ResultPromise; log: string }, ok: () => Promise<boolean>) {
  const deadline = Date.now() + timeoutMs;
  let exited = false;
  void proc.child.then(() => (exited = true));
  while (Date.now() < deadline) {
    if (exited) throw new Error(`${what} exited early:\n${tail(readIfExists(proc.log), 30)}`);
    if (await ok().catch(() => false)) return;
    await sleep(200);
  }
  throw new Error(`${what} not ready after ${timeoutMs} ms:\n${tail(readIfExists(proc.log), 30)}`);
}

function httpsGet(url: string, ca: string, token: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request(url, { ca, headers: { authorization: `Bearer ${token}` }, timeout: 2000 }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end();
  });
}

async function waitForDefaultNamespace(kc: KubeConfig): Promise<void> {
  const core = kc.makeApiClient(CoreV1Api);
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      await core.readNamespace({ name: 'default' });
      return;
    } catch (err) {
      if (Date.now() > deadline) throw new Error(`namespace default never appeared: ${(err as Error).message}`);
      await sleep(200);
    }
  }
}

export async function ensureNamespace(core: CoreV1Api, name: string): Promise<void> {
  try {
    await core.createNamespace({ body: { metadata: { name } } });
  } catch (err) {
    if (statusOf(err) !== 409) throw err;
  }
}

/**
 * Registers a Node as kubelet would: the object, then its status (addresses,
 * conditions), which the API server ignores on create.
 */
export async function registerNode(core: CoreV1Api, body: V1Node): Promise<void> {
  await core.createNode({ body });
  await core.patchNodeStatus({ name: body.metadata!.name!, body: { status: body.status } }, setHeaderOptions('Content-Type', PatchStrategy.MergePatch));
}

export function tokenKubeConfig(server: string, caPem: string, token: string, user: string): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'pier-test', server, caData: Buffer.from(caPem).toString('base64') }],
    users: [{ name: user, token }],
    contexts: [{ name: 'pier-test', cluster: 'pier-test', user }],
    currentContext: 'pier-test',
  });
  return kc;
}

/** The HTTP status of a client-node ApiException, or undefined. */
export function statusOf(err: unknown): number | undefined {
  const code = (err as { code?: unknown })?.code;
  return typeof code === 'number' ? code : undefined;
}

async function terminate(child: ResultPromise, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  if (exited.has(child)) return;
  child.kill(signal);
  const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
  await child.catch(() => undefined);
  clearTimeout(timer);
}

function killQuietly(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch {
    // already gone
  }
}

function hostPort(address: string, port: number): string {
  return address.includes(':') ? `[${address}]:${port}` : `${address}:${port}`;
}

function randomToken(): string {
  return Buffer.from(crypto.getRandomValues(new Uint8Array(24))).toString('hex');
}

export function readIfExists(file: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}

export function tail(text: string, lines: number): string {
  return text.trimEnd().split('\n').slice(-lines).join('\n');
}

/** The API server's own /metrics, apiserver_request_total summed by verb and resource. */
export async function apiserverRequests(cp: ControlPlane): Promise<Map<string, number>> {
  const token = cp.admin.getCurrentUser()?.token ?? '';
  const url = new URL(`${cp.server}/metrics`);
  const text = await new Promise<string>((resolve, reject) => {
    const req = request(url, { ca: cp.caPem, headers: { authorization: `Bearer ${token}` }, timeout: 30_000 }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error('metrics timeout')));
    req.on('error', reject);
    req.end();
  });
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (!line.startsWith('apiserver_request_total{')) continue;
    const labels = Object.fromEntries([...line.matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1]!, m[2]!]));
    const key = `${labels['verb']} ${labels['resource'] || '(non-resource)'}${labels['subresource'] ? `/${labels['subresource']}` : ''}`;
    out.set(key, (out.get(key) ?? 0) + Number(line.slice(line.lastIndexOf(' ') + 1)));
  }
  return out;
}
