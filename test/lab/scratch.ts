// A single empty network namespace for tests that program iptables without
// any traffic (rendering checks, restore benchmarks). Same naming and
// registry as the lab, so the lab's sweep cleans up after a crashed run too.
import { Lab } from './lab.ts';

export interface Scratch {
  ns: string;
  /** Runs `file args` inside the namespace; rejects on a non-zero exit unless reject is false. */
  exec(file: string, args: string[], opts?: { reject?: boolean; input?: string }): ReturnType<Lab['exec']>;
  destroy(): Promise<void>;
}

export async function scratchNamespace(): Promise<Scratch> {
  const lab = await Lab.create({ nodes: [], clients: 0 });
  return {
    ns: lab.underlayNs,
    exec: (file, args, opts) => lab.exec(lab.underlayNs, file, args, opts),
    destroy: () => lab.destroy(),
  };
}
