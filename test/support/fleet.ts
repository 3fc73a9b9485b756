// Many pier Services at once, for scale tests and benchmarks: created the way
// `kubectl apply` of many objects and the EndpointSlice controller would
// (each Service, then its slices, a bounded number in flight), watched for
// their statuses with one watch instead of a poll per Service, and the
// latency statistics both the e2e test and the benchmark report.
import { CoreV1Api, DiscoveryV1Api, KubeConfig, Watch, type V1Service } from '@kubernetes/client-node';
import { reuseConnections } from '../../lib/connections.ts';
import { endpointSlice, lbService } from './objects.ts';

export type AddressType = 'IPv4' | 'IPv6';

export interface FleetEndpoint {
  address: string;
  nodeName?: string;
}

export interface FleetSpec {
  namespace: string;
  /** Service i is `${prefix}${i}`. */
  prefix: string;
  count: number;
  /** External port of Service i is firstPort + i: distinct, so no Service conflicts with another. */
  firstPort: number;
  /** Index of the first Service (names and ports), so fleets can be added to one another. */
  first?: number;
  targetPort: number;
  /** One EndpointSlice per family; the Service's ipFamilies follow this order. */
  endpoints: Partial<Record<AddressType, FleetEndpoint[]>>;
  /** spec.loadBalancerClass; pier's unless a benchmark wants Services pier must ignore. */
  loadBalancerClass?: string;
}

export interface FleetItem {
  name: string;
  port: number;
}

export function fleetItems(spec: FleetSpec): FleetItem[] {
  const first = spec.first ?? 0;
  return Array.from({ length: spec.count }, (_, k) => ({ name: `${spec.prefix}${first + k}`, port: spec.firstPort + first + k }));
}

/** Runs `fn` over `items` with at most `limit` calls in flight; rejects with the first failure once the rest have settled. */
export async function inParallel<T>(items: readonly T[], limit: number, fn: (item: T, index: number) => Promise<void>): Promise<void> {
  let next = 0;
  let failure: unknown;
  const lane = async () => {
    while (next < items.length && failure === undefined) {
      const i = next++;
      try {
        await fn(items[i]!, i);
      } catch (err) {
        failure ??= err;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(limit, items.length)) }, lane));
  if (failure !== undefined) throw failure;
}

/**
 * A copy of `kc` whose requests share one connection (lib/connections.ts):
 * thousands of creates over client-node's new-connection-per-request would
 * spend much of the API server's CPU on TLS handshakes.
 */
export function sharedConnections(kc: KubeConfig): KubeConfig {
  const copy = new KubeConfig();
  copy.loadFromString(kc.exportConfig());
  return reuseConnections(copy);
}

export class Fleet {
  /** The client the fleet uses, for other requests of the same harness (sharing its connection). */
  readonly kc: KubeConfig;
  private readonly core: CoreV1Api;
  private readonly discovery: DiscoveryV1Api;

  constructor(kc: KubeConfig) {
    this.kc = sharedConnections(kc);
    this.core = this.kc.makeApiClient(CoreV1Api);
    this.discovery = this.kc.makeApiClient(DiscoveryV1Api);
  }

  /**
   * One Service of the fleet and then its EndpointSlices, in that order, as a
   * user and the EndpointSlice controller would. NodePorts are off: pier
   * needs none, and the NodePort range holds only 2,768 of them. Returns
   * the stored Service and when it was stored (before its slices).
   */
  async createOne(spec: FleetSpec, item: FleetItem): Promise<{ service: V1Service; storedAt: number }> {
    const families = Object.keys(spec.endpoints) as AddressType[];
    const service = await this.core.createNamespacedService({
      namespace: spec.namespace,
      body: lbService(spec.namespace, item.name, [{ name: 'http', port: item.port, targetPort: spec.targetPort }], {
        allocateLoadBalancerNodePorts: false,
        ipFamilyPolicy: families.length > 1 ? 'RequireDualStack' : 'SingleStack',
        ipFamilies: families,
        ...(spec.loadBalancerClass ? { loadBalancerClass: spec.loadBalancerClass } : {}),
      }),
    });
    const storedAt = performance.now();
    for (const family of families) {
      await this.discovery.createNamespacedEndpointSlice({
        namespace: spec.namespace,
        body: endpointSlice(spec.namespace, item.name, family, spec.endpoints[family]!, [{ name: 'http', port: spec.targetPort }]),
      });
    }
    return { service, storedAt };
  }

  /** Creates the whole fleet with `concurrency` Services in flight; `onCreated` gets when each Service (not yet its slices) was stored. */
  async create(spec: FleetSpec, opts: { concurrency: number; onCreated?: (item: FleetItem, serviceStoredAt: number) => void }): Promise<FleetItem[]> {
    const items = fleetItems(spec);
    await inParallel(items, opts.concurrency, async (item) => {
      const { storedAt } = await this.createOne(spec, item);
      opts.onCreated?.(item, storedAt);
    });
    return items;
  }

  /** Deletes Services (their slices stay: there is no garbage collector in the test cluster, and nothing reads orphan slices). */
  async deleteServices(namespace: string, names: readonly string[], concurrency: number): Promise<void> {
    await inParallel(names, concurrency, async (name) => {
      await this.core.deleteNamespacedService({ name, namespace });
    });
  }
}

export const hasIngress = (svc: V1Service) => (svc.status?.loadBalancer?.ingress?.length ?? 0) > 0;

export interface Seen {
  /** performance.now() when the watch delivered the first version that passed the predicate. */
  at: number;
  /** That version's resourceVersion: watch events arrive in this order. */
  resourceVersion: string;
  svc: V1Service;
}

interface Waiter {
  missing: Set<string>;
  done: (err?: Error) => void;
}

/**
 * One watch on a namespace's Services, remembering when each first passed a
 * predicate (by default: has ingress). Started before the Services are
 * created, so no transition is missed; resumes from the last
 * resourceVersion when the watch ends, and lists again after a 410.
 */
export class StatusWatch {
  readonly seen = new Map<string, Seen>();
  private readonly kc: KubeConfig;
  private readonly namespace: string;
  private readonly predicate: (svc: V1Service) => boolean;
  private resourceVersion = '';
  private abort: AbortController | undefined;
  private stopped = false;
  private readonly waiters = new Set<Waiter>();
  private failure: Error | undefined;

  private constructor(kc: KubeConfig, namespace: string, predicate: (svc: V1Service) => boolean) {
    this.kc = kc;
    this.namespace = namespace;
    this.predicate = predicate;
  }

  static async start(kc: KubeConfig, namespace: string, predicate: (svc: V1Service) => boolean = hasIngress): Promise<StatusWatch> {
    const w = new StatusWatch(kc, namespace, predicate);
    await w.list();
    await w.watch();
    return w;
  }

  private async list(): Promise<void> {
    const list = await this.kc.makeApiClient(CoreV1Api).listNamespacedService({ namespace: this.namespace });
    for (const svc of list.items) this.observe(svc);
    this.resourceVersion = list.metadata?.resourceVersion ?? '';
  }

  private observe(svc: V1Service): void {
    const name = svc.metadata?.name ?? '';
    if (this.seen.has(name) || !this.predicate(svc)) return;
    this.seen.set(name, { at: performance.now(), resourceVersion: svc.metadata?.resourceVersion ?? '', svc });
    for (const w of this.waiters) if (w.missing.delete(name) && w.missing.size === 0) w.done();
  }

  private async watch(): Promise<void> {
    if (this.stopped) return;
    this.abort = await new Watch(this.kc).watch(
      `/api/v1/namespaces/${encodeURIComponent(this.namespace)}/services`,
      { resourceVersion: this.resourceVersion, allowWatchBookmarks: true },
      (type, obj: V1Service) => {
        if (obj?.metadata?.resourceVersion) this.resourceVersion = obj.metadata.resourceVersion;
        if (type === 'ADDED' || type === 'MODIFIED') this.observe(obj);
        if (type === 'ERROR') this.resourceVersion = '';
      },
      (err) => {
        if (this.stopped) return;
        // An expired resourceVersion (410, or an ERROR event) means the
        // history is gone: list again. Anything else resumes where it was.
        const gone = this.resourceVersion === '' || (err as { statusCode?: number })?.statusCode === 410;
        void (gone ? this.list() : Promise.resolve())
          .then(() => this.watch())
          .catch((e: unknown) => {
            this.failure = e as Error;
            for (const w of this.waiters) w.done(this.failure);
          });
      },
    );
  }

  /** Resolves once every name in `names` has been seen; rejects after `timeoutMs` naming how many are missing. */
  async waitFor(names: readonly string[], timeoutMs: number): Promise<Seen[]> {
    if (this.failure) throw this.failure;
    const missing = new Set(names.filter((n) => !this.seen.has(n)));
    if (missing.size > 0) {
      await new Promise<void>((resolve, reject) => {
        const waiter: Waiter = {
          missing,
          done: (err) => {
            clearTimeout(timer);
            this.waiters.delete(waiter);
            if (err) reject(err);
            else resolve();
          },
        };
        const timer = setTimeout(() => {
          const first = [...missing].slice(0, 3).join(', ');
          waiter.done(new Error(`${missing.size} of ${names.length} Services in ${this.namespace} still without status after ${timeoutMs} ms (first: ${first})`));
        }, timeoutMs);
        this.waiters.add(waiter);
      });
    }
    return names.map((n) => this.seen.get(n)!);
  }

  stop(): void {
    this.stopped = true;
    this.abort?.abort();
    for (const w of this.waiters) w.done(new Error('status watch stopped'));
  }
}

/** The latest of `seen` in watch order (resourceVersions of one collection compare as integers). */
export function lastSeen(seen: readonly Seen[]): Seen {
  return seen.reduce((a, b) => (BigInt(b.resourceVersion) > BigInt(a.resourceVersion) ? b : a));
}

export interface Summary {
  n: number;
  p50: number;
  p99: number;
  max: number;
}

/**
 * Nearest-rank percentile: the smallest sample with at least p % of the
 * samples at or below it, i.e. sorted[ceil(p/100 * n) - 1]. With 50 samples
 * p50 is the 25th and p99 the 50th (the largest); with 100, p99 is the 99th.
 */
export function percentile(samples: readonly number[], p: number): number {
  if (samples.length === 0) return NaN;
  const sorted = [...samples].sort((a, b) => a - b);
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));
  return sorted[rank - 1]!;
}

export function summarize(samples: readonly number[]): Summary {
  return { n: samples.length, p50: percentile(samples, 50), p99: percentile(samples, 99), max: samples.length ? Math.max(...samples) : NaN };
}
