// What Agent.sync does with the iptables backend, in one object for the
// tests and benchmarks: the engine's model, then each family's renderer
// handed the engine's record of what changed.
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import type { Family } from '../../lib/contract.ts';
import { Engine, familyChanges, type EngineConfig, type EngineInput, type EngineResult } from '../../agent/engine/engine.ts';
import { HeadStart } from '../../agent/engine/headstart.ts';
import { servedFamily, type FamilyModel, type Model, type ServedPort } from '../../agent/engine/model.ts';
import type { RenderConfig, Ruleset } from '../../agent/iptables/render.ts';
import { IptablesRenderer } from '../../agent/iptables/renderer.ts';

export interface PipelineConfig extends EngineConfig {
  render: RenderConfig;
}

export interface HeadStartSetup {
  /** Those whose iptables rules are rendered ahead. */
  families: readonly Family[];
  prepare?: (served: ServedPort) => void;
  rehearse?: (model: Model) => void;
}

export class SyncPipeline {
  readonly engine: Engine;
  private readonly renderers: Record<Family, IptablesRenderer>;
  private last: EngineResult | undefined;

  constructor(config: PipelineConfig) {
    this.engine = new Engine(config);
    this.renderers = { ipv4: new IptablesRenderer('ipv4', config.render), ipv6: new IptablesRenderer('ipv6', config.render) };
  }

  /** Syncs redone from an empty state, model and rules. */
  get restarts(): number {
    return this.engine.restarts + this.renderers.ipv4.restarts + this.renderers.ipv6.restarts;
  }

  model(input: EngineInput): Model {
    this.last = this.engine.update(input);
    return this.last.model;
  }

  /** The engine's record of how the last model's `family` came to be. */
  changes(family: Family): ReturnType<typeof familyChanges> {
    return this.last && familyChanges(this.last.changes, family);
  }

  /** The family's rules, with the engine's record when `model` is the last one it made. */
  ruleset(model: FamilyModel): Ruleset {
    const last = this.last;
    const changes = last && last.model[model.family] === model ? familyChanges(last.changes, model.family) : undefined;
    return this.renderers[model.family].render(model, changes);
  }

  warm(nodeAddresses: readonly string[], svc: V1Service, slices: readonly V1EndpointSlice[], families: readonly Family[]): readonly ServedPort[] {
    const served = this.engine.warm(nodeAddresses, svc, slices);
    for (const s of served) this.prepare(s, families);
    return served;
  }

  headStart(setup: HeadStartSetup): HeadStart {
    const rehearse = setup.rehearse;
    return new HeadStart(this.engine, {
      prepare: (served) => {
        this.prepare(served, setup.families);
        setup.prepare?.(served);
      },
      rehearse:
        rehearse &&
        ((result) => {
          this.last = result;
          rehearse(result.model);
        }),
    });
  }

  private prepare(served: ServedPort, families: readonly Family[]): void {
    const family = servedFamily(served);
    if (served.frontends.length > 0 && families.includes(family)) this.renderers[family].prepare(served);
  }
}
