// How test/upstream/run.ts --shard K/N splits the specs over N clusters.

/** Rolling-update specs each take about 10 minutes, the others about one. */
export const specWeight = (spec: string) => (/connectivity disruption during rolling update/.test(spec) ? 10 : 1);

/**
 * The specs of shard k of n: heaviest first, each to the lightest shard so far
 * (ties to the lower shard), so that the rolling-update specs land on
 * different shards. Specs that weigh nothing (skipped by name) all go to
 * shard 1, so each is reported once. Returned in the order given.
 */
export function shardOf(specs: string[], [k, n]: [number, number], weight: (spec: string) => number): string[] {
  const load = Array<number>(n).fill(0);
  const home = new Map<string, number>();
  const heaviestFirst = specs.map((spec, i) => ({ spec, i, w: weight(spec) })).sort((a, b) => b.w - a.w || a.i - b.i);
  for (const { spec, w } of heaviestFirst) {
    const s = w === 0 ? 0 : load.indexOf(Math.min(...load));
    load[s]! += w;
    home.set(spec, s);
  }
  return specs.filter((spec) => home.get(spec) === k - 1);
}
