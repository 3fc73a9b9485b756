// An informer that keeps going. client-node's ListWatch relists on 410 and
// reconnects when a watch ends cleanly, but on any other error (API server
// down, connection refused, a 5xx, a failed list) it reports the error and
// stops for good. This wrapper restarts it with capped exponential backoff,
// keeping the cache and resourceVersion so it resumes rather than relists,
// and never restarts once stop() was called (stop() itself surfaces as an
// AbortError on the error channel).
//
// Memory: lists are read in pages (as client-go's reflector does), so a
// relist of 10,000 objects never holds the whole response text and its
// decoded copy at once; and every object, listed or watched, passes through
// a transform before it is cached (client-go's SetTransform): by default one
// that drops managedFields, or a caller's projection (lib/slim.ts).
import { ListWatch, Watch, type KubeConfig, type KubernetesListObject, type KubernetesObject } from '@kubernetes/client-node';
import type { Logger } from './log.ts';
import { silentLogger } from './log.ts';

export type InformerEvent = 'add' | 'update' | 'delete';

/** One page of a list: at most `limit` objects, from where `_continue` says. */
export interface ListPage {
  limit: number;
  _continue?: string;
}

export interface ResilientInformerOptions<T extends KubernetesObject> {
  kc: KubeConfig;
  /** API path of the collection, e.g. /api/v1/services. */
  path: string;
  /** One page of the collection; the informer follows `metadata._continue` to the end. */
  list: (page: ListPage) => Promise<KubernetesListObject<T>>;
  /**
   * What the cache keeps of each object, listed or watched: a pure function
   * that must keep metadata.name, namespace and resourceVersion, and must not
   * change its argument in place. Default: the object without managedFields.
   */
  transform?: (obj: T) => T;
  /** Objects per list page; default 500, as client-go. */
  pageSize?: number;
  /**
   * Each page of every list (the first and any relist), as it arrives: the
   * very objects, transformed, that the cache will hold once the list is
   * complete. Must not throw or change them. `remaining`: how many objects
   * the list still holds after this page, 0 on its last; undefined when the
   * API server does not say (remainingItemCount is absent from lists with a
   * selector).
   */
  onListPage?: (items: readonly T[], remaining: number | undefined) => void;
  /** A short name for logs: "services". */
  name: string;
  labelSelector?: string;
  fieldSelector?: string;
  log?: Logger;
  backoff?: { initialMs?: number; maxMs?: number };
}

/**
 * Adds allowWatchBookmarks to every watch request, so quiet collections keep a
 * fresh resourceVersion and a reconnect rarely needs a full relist; tells the
 * informer when it first reaches the watch stage, which is when its initial
 * list has landed in the cache; and closes a race in ListWatch.stop(), which
 * only aborts a watch whose response headers have already arrived.
 */
class BookmarkingWatch extends Watch {
  private readonly onWatch: () => void;
  private readonly transform: (obj: any) => any;
  private current: AbortController | undefined;
  private stopped = false;
  constructor(kc: KubeConfig, onWatch: () => void, transform: (obj: any) => any) {
    super(kc);
    this.onWatch = onWatch;
    this.transform = transform;
  }
  override async watch(
    path: string,
    queryParams: Record<string, string | number | boolean | undefined>,
    callback: (phase: string, apiObj: any, watchObj?: any) => void,
    done: (err: any) => void,
  ): Promise<AbortController> {
    if (this.stopped) return new AbortController();
    this.onWatch();
    // Bookmarks and errors carry no object to cache, only a resourceVersion or a status.
    const slim = (phase: string, obj: any) => callback(phase, OBJECT_EVENTS.has(phase) && obj ? this.transform(obj) : obj);
    const controller = await super.watch(path, { ...queryParams, allowWatchBookmarks: true }, slim, done);
    if (this.stopped) controller.abort();
    this.current = controller;
    return controller;
  }
  stop(): void {
    this.stopped = true;
    this.current?.abort();
  }
}

const OBJECT_EVENTS = new Set(['ADDED', 'MODIFIED', 'DELETED']);

/**
 * Server-side apply bookkeeping is often the largest part of an object and
 * pier never reads it; caches of thousands of Services should not hold it.
 * The metadata is copied rather than changed with `delete`, which would turn
 * every cached metadata object into a slow dictionary of about twice the size.
 */
export function dropManagedFields<O extends KubernetesObject>(obj: O): O {
  const meta = obj?.metadata;
  if (!meta || meta.managedFields === undefined) return obj;
  const { managedFields: _, ...rest } = meta;
  return { ...obj, metadata: rest };
}

/**
 * The whole collection, page by page, each object transformed as its page
 * arrives. A continue token that expires mid-way (410: the API server
 * compacted the snapshot the pages come from) starts the list over: the
 * pages must come from one snapshot, or the cache could miss a deletion.
 *
 * The next page is requested before this one is transformed and handed to
 * `onPage`, so that the API server prepares it meanwhile.
 */
export async function listAll<T extends KubernetesObject>(
  list: (page: ListPage) => Promise<KubernetesListObject<T>>,
  transform: (obj: T) => T,
  pageSize: number,
  onPage?: (items: readonly T[], remaining: number | undefined) => void,
): Promise<KubernetesListObject<T>> {
  for (let attempt = 1; ; attempt++) {
    const items: T[] = [];
    let resourceVersion = '';
    let next: string | undefined;
    let request = list({ limit: pageSize });
    try {
      for (;;) {
        const page = await request;
        next = page.metadata?._continue || undefined;
        if (next !== undefined) {
          request = list({ limit: pageSize, _continue: next });
          // Awaited next time round, unless this page fails first.
          request.catch(() => undefined);
        }
        const from = items.length;
        for (const item of page.items ?? []) items.push(transform(item));
        resourceVersion = page.metadata?.resourceVersion ?? resourceVersion;
        onPage?.(items.slice(from), next === undefined ? 0 : page.metadata?.remainingItemCount);
        if (next === undefined) return { apiVersion: 'v1', kind: 'List', metadata: { resourceVersion }, items };
      }
    } catch (err) {
      const code = (err as { code?: unknown; statusCode?: unknown }).code ?? (err as { statusCode?: unknown }).statusCode;
      if (next === undefined || code !== 410 || attempt >= 3) throw err;
    }
  }
}

export class ResilientInformer<T extends KubernetesObject> {
  readonly name: string;
  /** Resolves once the first list is in the cache. */
  readonly synced: Promise<void>;
  private readonly lw: ListWatch<T>;
  private readonly watch: BookmarkingWatch;
  private readonly log: Logger;
  private readonly initialMs: number;
  private readonly maxMs: number;
  private delayMs: number;
  private stopped = false;
  private started = false;
  private restartTimer: NodeJS.Timeout | undefined;
  private markSynced!: () => void;
  private isSynced = false;
  /** Errors since the last successful (re)connect, for health reporting. */
  private consecutiveErrors = 0;
  /** A list ran since the watch last (re)started: after the first, a relist. */
  private listed = false;
  private readonly resumeCallbacks: (() => void)[] = [];

  constructor(opts: ResilientInformerOptions<T>) {
    this.name = opts.name;
    this.log = (opts.log ?? silentLogger).child({ informer: opts.name });
    this.initialMs = opts.backoff?.initialMs ?? 500;
    this.maxMs = opts.backoff?.maxMs ?? 30_000;
    this.delayMs = this.initialMs;
    this.synced = new Promise((resolve) => (this.markSynced = resolve));
    const transform = opts.transform ?? dropManagedFields;
    this.watch = new BookmarkingWatch(opts.kc, () => this.onWatchStage(), transform);
    const pageSize = opts.pageSize ?? 500;
    const list = () => {
      this.listed = true;
      return listAll(opts.list, transform, pageSize, opts.onListPage);
    };
    this.lw = new ListWatch<T>(opts.path, this.watch, list, false, opts.labelSelector, opts.fieldSelector);
    this.lw.on('error', (err) => this.onError(err));
  }

  on(event: InformerEvent, cb: (obj: T) => void): void {
    this.lw.on(event, cb);
  }

  /** Calls `cb` for every add, update and delete. */
  onChange(cb: (obj: T, event: InformerEvent) => void): void {
    this.lw.on('add', (o) => cb(o, 'add'));
    this.lw.on('update', (o) => cb(o, 'update'));
    this.lw.on('delete', (o) => cb(o, 'delete'));
  }

  /**
   * Calls `cb` each time the watch is running again after it failed, or
   * after a relist (its resourceVersion had expired): what the cache held
   * meanwhile may have been stale. Not called for the first list.
   */
  onResume(cb: () => void): void {
    this.resumeCallbacks.push(cb);
  }

  start(): void {
    if (this.started) throw new Error(`informer ${this.name} already started`);
    this.started = true;
    void this.lw.start();
  }

  list(namespace?: string): readonly T[] {
    return this.lw.list(namespace);
  }

  get(name: string, namespace?: string): T | undefined {
    return this.lw.get(name, namespace);
  }

  get hasSynced(): boolean {
    return this.isSynced;
  }

  get errorsSinceLastConnect(): number {
    return this.consecutiveErrors;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.restartTimer);
    this.watch.stop();
    await this.lw.stop();
  }

  private onWatchStage(): void {
    if (this.consecutiveErrors > 0) this.log.info({ errors: this.consecutiveErrors }, 'informer reconnected');
    const resumed = this.isSynced && (this.consecutiveErrors > 0 || this.listed);
    this.listed = false;
    this.consecutiveErrors = 0;
    this.delayMs = this.initialMs;
    if (!this.isSynced) {
      this.isSynced = true;
      this.markSynced();
    }
    if (resumed) {
      for (const cb of this.resumeCallbacks) {
        try {
          cb();
        } catch (err) {
          this.log.error({ err: describe(err) }, 'a resume callback failed');
        }
      }
    }
  }

  private onError(err: unknown): void {
    if (this.stopped) return;
    this.consecutiveErrors++;
    const delay = this.delayMs;
    this.delayMs = Math.min(this.delayMs * 2, this.maxMs);
    // Only the first failure of a streak is a warning; the rest repeat it.
    const level = this.consecutiveErrors === 1 ? 'warn' : 'debug';
    this.log[level]({ err: describe(err), retryInMs: delay }, 'informer failed; restarting');
    clearTimeout(this.restartTimer);
    this.restartTimer = setTimeout(() => {
      if (this.stopped) return;
      void this.lw.start();
    }, delay);
  }
}

function describe(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as Error & { cause?: unknown }).cause;
    const status = (err as Error & { statusCode?: number; code?: number }).statusCode;
    return [err.message, status ? `status ${status}` : '', cause instanceof Error ? cause.message : '']
      .filter(Boolean)
      .join(': ');
  }
  return String(err);
}
