// Where pier finds its Kubernetes credentials, in the order a person expects:
// an explicit --kubeconfig, then $KUBECONFIG, then the in-cluster
// ServiceAccount, then ~/.kube/config. Failing all, one error lists what was
// tried, because "no cluster" with no detail is the least useful message there is.
import { existsSync, readFileSync } from 'node:fs';
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

export const IN_CLUSTER_TOKEN = '/var/run/secrets/kubernetes.io/serviceaccount/token';

export class KubeConfigError extends Error {
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
