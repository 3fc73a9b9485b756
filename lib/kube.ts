// Where pier finds its Kubernetes credentials, in the order a person expects:
// an explicit --kubeconfig, then $KUBECONFIG, then the in-cluster
// ServiceAccount, then ~/.kube/config. Failing all, one error lists what was
// tried, because "no cluster" with no detail is the least useful message there is.
// --api-server then points them at the API server's own address, so that a
// node's pier needs no kube-proxy rule to reach it (chooseApiServer).
import { existsSync, readFileSync } from 'node:fs';
import { connect } from 'node:net';
import { homedir } from 'node:os';
import { join } from 'node:path';
import {
  KubeConfig,
  Observable,
  PatchStrategy,
  setHeaderOptions,
  type ConfigurationOptions,
  type ObservableMiddleware,
  type RequestContext,
} from '@kubernetes/client-node';
import { reuseConnections } from './connections.ts';
import type { Logger } from './log.ts';
import { ExplainedError } from './errors.ts';

export const IN_CLUSTER_TOKEN = '/var/run/secrets/kubernetes.io/serviceaccount/token';

export class KubeConfigError extends ExplainedError {
  override name = 'KubeConfigError';
}

export interface KubeConfigSource {
  /** The --kubeconfig flag, if given. */
  kubeconfig?: string | undefined;
  env?: Readonly<Record<string, string | undefined>>;
  /** Overridable for tests. */
  inClusterTokenPath?: string;
  home?: string;
}

export interface LoadedKubeConfig {
  kc: KubeConfig;
  /** Human-readable origin, for the start-up log line. */
  source: string;
}

export function loadKubeConfig(src: KubeConfigSource = {}): LoadedKubeConfig {
  const env = src.env ?? process.env;
  const tried: string[] = [];

  if (src.kubeconfig) return { kc: fromFiles([src.kubeconfig], '--kubeconfig'), source: `--kubeconfig ${src.kubeconfig}` };
  tried.push('--kubeconfig: not given');

  const fromEnv = env['KUBECONFIG'];
  if (fromEnv) {
    const files = fromEnv.split(':').filter((f) => f !== '');
    return { kc: fromFiles(files, 'KUBECONFIG'), source: `KUBECONFIG ${fromEnv}` };
  }
  tried.push('KUBECONFIG: not set');

  const tokenPath = src.inClusterTokenPath ?? IN_CLUSTER_TOKEN;
  const host = env['KUBERNETES_SERVICE_HOST'];
  if (host) {
    if (!existsSync(tokenPath)) {
      throw new KubeConfigError(
        `KUBERNETES_SERVICE_HOST is set (${host}) but the ServiceAccount token ${tokenPath} is missing: ` +
          'is automountServiceAccountToken disabled for this pod?',
      );
    }
    const kc = new KubeConfig();
    kc.loadFromCluster();
    return { kc: checked(kc, 'in-cluster ServiceAccount'), source: 'in-cluster ServiceAccount' };
  }
  tried.push('in-cluster: KUBERNETES_SERVICE_HOST not set');

  const home = join(src.home ?? homedir(), '.kube', 'config');
  if (existsSync(home)) return { kc: fromFiles([home], home), source: home };
  tried.push(`${home}: not found`);

  throw new KubeConfigError(`no Kubernetes credentials found (${tried.join('; ')})`);
}

function fromFiles(files: string[], origin: string): KubeConfig {
  const kc = new KubeConfig();
  for (const file of files) {
    let text: string;
    try {
      text = readFileSync(file, 'utf8');
    } catch (err) {
      throw new KubeConfigError(`${origin}: cannot read ${file}: ${(err as Error).message}`);
    }
    try {
      const next = new KubeConfig();
      next.loadFromString(text);
      // kubectl's merge rule for a KUBECONFIG list: the first file to name a
      // cluster, user, context or current-context wins.
      const has = <T extends { name: string }>(list: T[], name: string) => list.some((x) => x.name === name);
      for (const c of next.clusters) if (!has(kc.clusters, c.name)) kc.addCluster(c);
      for (const u of next.users) if (!has(kc.users, u.name)) kc.addUser(u);
      for (const c of next.contexts) if (!has(kc.contexts, c.name)) kc.addContext(c);
      if (!kc.getCurrentContext() && next.getCurrentContext()) kc.setCurrentContext(next.getCurrentContext());
    } catch (err) {
      throw new KubeConfigError(`${origin}: ${file} is not a valid kubeconfig: ${(err as Error).message}`);
    }
  }
  return checked(kc, `${origin} (${files.join(':')})`);
}

function checked(kc: KubeConfig, origin: string): KubeConfig {
  const ctx = kc.getCurrentContext();
  if (!ctx) throw new KubeConfigError(`${origin}: no current-context`);
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new KubeConfigError(`${origin}: context ${JSON.stringify(ctx)} names no known cluster`);
  if (!cluster.server) throw new KubeConfigError(`${origin}: cluster ${JSON.stringify(cluster.name)} has no server address`);
  return kc;
}

export type ConnectProbe = (host: string, port: number, timeoutMs: number) => Promise<void>;

const tcpConnect: ConnectProbe = (host, port, timeoutMs) =>
  new Promise((resolve, reject) => {
    const socket = connect({ host, port, timeout: timeoutMs });
    socket.once('connect', () => (socket.destroy(), resolve()));
    socket.once('timeout', () => (socket.destroy(), reject(new Error(`no answer in ${timeoutMs} ms`))));
    socket.once('error', (err) => (socket.destroy(), reject(err)));
  });

export interface ChosenApiServer {
  /** The server now in the credentials. */
  server: string;
  /** Each candidate tried before it, with why it was passed over. */
  passed: string[];
  /** false: none answered, and the credentials keep their own server. */
  chosen: boolean;
}

/**
 * Points the credentials at the first of `servers` (https origins, as
 * apiServers() reads them) that accepts a TCP connection. Why a list: a
 * distribution's node-local address differs by node role (k3s servers listen
 * on 127.0.0.1:6443, its agents' proxy on 127.0.0.1:6444), and one manifest
 * serves every node. When none answers, the credentials keep their server
 * (in a pod, the kubernetes Service), which beats not starting.
 */
export async function chooseApiServer(kc: KubeConfig, servers: readonly string[], probe: ConnectProbe = tcpConnect): Promise<ChosenApiServer> {
  const current = kc.getCurrentCluster();
  if (!current) throw new KubeConfigError('no current cluster to point at an API server');
  const passed: string[] = [];
  for (const server of servers) {
    const { hostname, port } = new URL(server);
    try {
      await probe(hostname.replace(/^\[(.*)\]$/, '$1'), Number(port || 443), 1000);
    } catch (err) {
      passed.push(`${server}: ${(err as Error).message}`);
      continue;
    }
    kc.clusters = kc.clusters.map((c) => (c.name === current.name ? { ...c, server } : c));
    return { server, passed, chosen: true };
  }
  return { server: current.server, passed, chosen: false };
}

/** A long-running command's credentials: loaded, pointed at the first --api-server that answers, connections shared. */
export async function connectCluster(opts: { kubeconfig: string | undefined; apiServers: readonly string[] }, log: Logger): Promise<KubeConfig> {
  const { kc, source } = loadKubeConfig({ kubeconfig: opts.kubeconfig });
  let passed: string[] = [];
  if (opts.apiServers.length > 0) {
    const choice = await chooseApiServer(kc, opts.apiServers);
    passed = choice.passed;
    if (!choice.chosen) log.warn({ passed, server: choice.server }, "no --api-server address accepted a connection; using the credentials' own server");
  }
  reuseConnections(kc);
  log.info({ kubeconfig: source, server: kc.getCurrentCluster()?.server, ...(passed.length > 0 && { passed }) }, 'using Kubernetes credentials');
  return kc;
}

export interface RequestOptions {
  /** Abort the request after this long: a hung connection must not stall a loop that has a deadline. */
  timeoutMs?: number;
  /** Abort the request when this fires (a leader that stepped down must not finish a write). */
  signal?: AbortSignal;
  /** Send the body as a JSON merge patch. */
  mergePatch?: boolean;
}

/** Per-request options client-node has no parameter for. Build them per call: the timeout starts when the request does. */
export function requestOptions(opts: RequestOptions): ConfigurationOptions<ObservableMiddleware> {
  const cancel: ObservableMiddleware = {
    pre: (ctx: RequestContext) => {
      const signals: AbortSignal[] = [];
      if (opts.timeoutMs !== undefined) signals.push(AbortSignal.timeout(opts.timeoutMs));
      if (opts.signal) signals.push(opts.signal);
      if (signals.length > 0) ctx.setSignal(AbortSignal.any(signals));
      return new Observable(Promise.resolve(ctx));
    },
    post: (res) => new Observable(Promise.resolve(res)),
  };
  const base: ConfigurationOptions<ObservableMiddleware> = { middleware: [cancel], middlewareMergeStrategy: 'append' };
  return opts.mergePatch ? setHeaderOptions('Content-Type', PatchStrategy.MergePatch, base) : base;
}
