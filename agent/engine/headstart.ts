// The agent's first sync, begun while the informers list. A cold sync of
// 10,000 Service ports spends ~100-300 ms in JavaScript before its
// iptables-restore can start, about half of it on work that depends on one
// Service and its slices alone (its model, its ports' rules). Pages of
// Services and EndpointSlices arrive over seconds; each Service whose slices
// have shown up is handed to Engine.warm as soon as the Node's addresses
// are known, so that the first sync is left with what spans Services.
//
// A list returns objects in key order, and a Service's slices are named
// after it, so a Service and its slices arrive in pages at about the same
// point of their lists. A Service is warmed again when another slice of it
// arrives; one whose slices never do is left to the sync (it has no
// endpoints, and little to compute). Nothing here decides what the rules are:
// the sync checks each object by identity and recomputes what does not match.
//
// What spans Services (claims, dispatch trees) is rehearsed once, when each
// list says at most one page is left: the engine runs over everything listed
// so far, and the first sync settles only the last pages, as it would a
// burst of events (bench:agent at 10,000 ports: it takes what is computed
// on the sync's path from 82-195 ms to 35-115 ms). The lists'
// remainingItemCount is a hint, not relied upon: without it nothing is
// rehearsed, and a wrong count only moves when.
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { serviceId, sliceServiceId, type ServedPort } from './model.ts';
import type { Engine, EngineResult } from './engine.ts';

export interface HeadStartOptions {
  /** Each served port warmed, for the backend's renderers to render ahead. */
  prepare?: (served: ServedPort) => void;
  /** The rehearsal's model, to render as the first sync will (see above). */
  rehearse?: (result: EngineResult) => void;
}

export class HeadStart {
  private readonly engine: Engine;
  private nodeAddresses: readonly string[] | undefined;
  /** Listed so far, by `namespace/name`. Dropped by done(). */
  private services = new Map<string, V1Service>();
  private slices = new Map<string, V1EndpointSlice[]>();
  private over = false;
  private readonly prepare: ((served: ServedPort) => void) | undefined;
  private readonly onRehearse: ((result: EngineResult) => void) | undefined;
  /** Per list, whether its last page said at most one more page is left. */
  private readonly lastPageNext = { services: false, slices: false };
  private rehearsed = false;

  constructor(engine: Engine, opts: HeadStartOptions) {
    this.engine = engine;
    this.prepare = opts.prepare;
    this.onRehearse = opts.rehearse;
  }

  /** This node's addresses, both families, from its Node as listed. */
  node(addresses: readonly string[]): void {
    if (this.over) return;
    this.nodeAddresses = addresses;
    for (const [id, slices] of this.slices) {
      const svc = this.services.get(id);
      if (svc) this.warm(svc, slices);
    }
    this.maybeRehearse();
  }

  /** `remaining`: what the list holds after this page (see ResilientInformerOptions.onListPage). */
  servicesListed(page: readonly V1Service[], remaining?: number): void {
    if (this.over) return;
    for (const svc of page) {
      const id = serviceId(svc);
      this.services.set(id, svc);
      const slices = this.slices.get(id);
      if (slices) this.warm(svc, slices);
    }
    this.lastPageNext.services = onePageLeft(page, remaining);
    this.maybeRehearse();
  }

  slicesListed(page: readonly V1EndpointSlice[], remaining?: number): void {
    if (this.over) return;
    const touched = new Set<string>();
    for (const slice of page) {
      const id = sliceServiceId(slice);
      if (id === undefined) continue;
      const list = this.slices.get(id);
      if (list) list.push(slice);
      else this.slices.set(id, [slice]);
      touched.add(id);
    }
    for (const id of touched) {
      const svc = this.services.get(id);
      if (svc) this.warm(svc, this.slices.get(id)!);
    }
    this.lastPageNext.slices = onePageLeft(page, remaining);
    this.maybeRehearse();
  }

  /** The first sync is here: nothing more to warm, nothing more to hold. */
  done(): void {
    this.over = true;
    this.services = new Map();
    this.slices = new Map();
  }

  /** Once, when both lists have at most one page left and the node's addresses are known. */
  private maybeRehearse(): void {
    if (this.rehearsed || !this.onRehearse || !this.nodeAddresses) return;
    if (!this.lastPageNext.services || !this.lastPageNext.slices) return;
    this.rehearsed = true;
    this.onRehearse(this.engine.update({ nodeAddresses: this.nodeAddresses, services: [...this.services.values()], slices: [...this.slices.values()].flat() }));
  }

  private warm(svc: V1Service, slices: readonly V1EndpointSlice[]): void {
    if (!this.nodeAddresses) return;
    const served = this.engine.warm(this.nodeAddresses, svc, slices);
    if (this.prepare) for (let i = 0; i < served.length; i++) this.prepare(served[i]!);
  }
}

/** Whether a list that sent `page` has at most one page like it left; unknown counts as no. */
function onePageLeft(page: readonly unknown[], remaining: number | undefined): boolean {
  return remaining !== undefined && remaining <= page.length;
}
