// A list page as the API server sends it: parsed JSON, not client-node's
// model classes. The generated clients pass every object of a list through
// ObjectSerializer, which walks each field's type metadata and builds a class
// instance per nested object; listing 10,000 Services and 10,000
// EndpointSlices in pages of 500 took 3.3-3.6 s of CPU that way against
// 1.9-2.2 s parsed as JSON (one core, the agent's Node flags; bench/README.md).
// Watch events already arrive as parsed JSON (client-node's Watch does not
// deserialize), so whoever reads a cache already handles this shape: a list
// read this way only makes the two paths agree.
//
// The request is made the way client-node's Watch makes its own: the
// kubeconfig's authentication applied to a RequestContext, whose undici
// dispatcher carries the TLS settings (and proxy, if any).
import { HttpMethod, RequestContext, type KubeConfig, type KubernetesListObject, type KubernetesObject } from '@kubernetes/client-node';
import { fetch } from 'undici';
import type { ListPage } from './informer.ts';

export interface RawListOptions {
  labelSelector?: string;
  fieldSelector?: string;
}

/** An error the API server answered with; `code` is the HTTP status, as client-node's ApiException has it. */
export class ListError extends Error {
  readonly code: number;
  constructor(message: string, code: number) {
    super(message);
    this.name = 'ListError';
    this.code = code;
  }
}

/** Lists `path` (e.g. /api/v1/services) one page at a time, as ResilientInformer's `list` option wants it. */
export function rawLister<T extends KubernetesObject>(kc: KubeConfig, path: string, opts: RawListOptions = {}): (page: ListPage) => Promise<KubernetesListObject<T>> {
  return async (page) => {
    const cluster = kc.getCurrentCluster();
    if (!cluster) throw new Error('the kubeconfig names no current cluster');
    const url = new URL(cluster.server.replace(/\/+$/, '') + path);
    url.searchParams.set('limit', String(page.limit));
    if (page._continue !== undefined) url.searchParams.set('continue', page._continue);
    if (opts.labelSelector !== undefined) url.searchParams.set('labelSelector', opts.labelSelector);
    if (opts.fieldSelector !== undefined) url.searchParams.set('fieldSelector', opts.fieldSelector);
    const ctx = new RequestContext(url.toString(), HttpMethod.GET);
    ctx.setHeaderParam('Accept', 'application/json');
    await kc.applySecurityAuthentication(ctx);
    const res = await fetch(url, { method: 'GET', headers: ctx.getHeaders(), dispatcher: ctx.getDispatcher() });
    const text = await res.text();
    if (!res.ok) throw new ListError(`list ${path}: HTTP ${res.status}: ${statusMessage(text)}`, res.status);
    const list = JSON.parse(text) as KubernetesListObject<T> & { metadata?: { continue?: string } };
    // The generated clients name it `_continue`; listAll reads that.
    if (list.metadata?.continue) list.metadata._continue = list.metadata.continue;
    return list;
  };
}

/** The message of a Status the API server answered with, or the start of whatever it sent. */
function statusMessage(text: string): string {
  try {
    const status = JSON.parse(text) as { message?: unknown };
    if (typeof status.message === 'string') return status.message;
  } catch {
    // not JSON
  }
  return text.slice(0, 200);
}
