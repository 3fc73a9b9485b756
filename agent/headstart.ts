// The agent's first sync, begun while the informers list. A cold sync of
// 10,000 Service ports spends ~100-300 ms in JavaScript before its
// iptables-restore can start, about half of it on work that depends on one
// Service and its slices alone (its model, its ports' rules). Pages of
// Services and EndpointSlices arrive over seconds; each Service whose slices
// have shown up is handed to SyncPipeline.warm as soon as the Node's addresses
// are known, so that the first sync is left with what spans Services.
//
// A list returns objects in key order, and a Service's slices are named
// after it, so a Service and its slices arrive in pages at about the same
// point of their lists. A Service is warmed again when another slice of it
// arrives; one whose slices never do is left to the sync (it has no
// endpoints, and little to compute). Nothing here decides what the rules are:
// the sync checks each object by identity and recomputes what does not match.
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import type { Family } from '../lib/contract.ts';
import { serviceId, sliceServiceId, type ServedPort } from './model.ts';
import type { SyncPipeline } from './pipeline.ts';

export class HeadStart {
  private readonly pipeline: SyncPipeline;
  private readonly families: readonly Family[];
  private nodeAddresses: readonly string[] | undefined;
  /** Listed so far, by `namespace/name`. Dropped by done(). */
  private services = new Map<string, V1Service>();
  private slices = new Map<string, V1EndpointSlice[]>();
  private over = false;
  private readonly prepare: ((served: ServedPort) => void) | undefined;

  /**
   * `families`: those the first sync renders iptables rules for; `prepare`
   * gets each served port warmed, for the nftables renderers.
   */
  constructor(pipeline: SyncPipeline, families: readonly Family[], prepare?: (served: ServedPort) => void) {
    this.pipeline = pipeline;
    this.families = families;
    this.prepare = prepare;
  }

  /** This node's addresses, both families, from its Node as listed. */
  node(addresses: readonly string[]): void {
    if (this.over) return;
    this.nodeAddresses = addresses;
    for (const [id, slices] of this.slices) {
      const svc = this.services.get(id);
      if (svc) this.warm(svc, slices);
    }
  }

  servicesListed(page: readonly V1Service[]): void {
    if (this.over) return;
    for (const svc of page) {
      const id = serviceId(svc);
      this.services.set(id, svc);
      const slices = this.slices.get(id);
      if (slices) this.warm(svc, slices);
    }
  }

  slicesListed(page: readonly V1EndpointSlice[]): void {
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
  }

  /** The first sync is here: nothing more to warm, nothing more to hold. */
  done(): void {
    this.over = true;
    this.services = new Map();
    this.slices = new Map();
  }

  private warm(svc: V1Service, slices: readonly V1EndpointSlice[]): void {
    if (!this.nodeAddresses) return;
    const served = this.pipeline.warm(this.nodeAddresses, svc, slices, this.families);
    if (this.prepare) for (const s of served) this.prepare(s);
  }
}
