import { describe, expect, it } from 'vitest';
import { shardOf, specWeight } from '../upstream/shard.ts';

const specs = [
  'LoadBalancers should be able to change the type and ports of a TCP service',
  'LoadBalancers should handle load balancer cleanup finalizer for service',
  'LoadBalancers should not have connectivity disruption during rolling update with externalTrafficPolicy=Cluster',
  'LoadBalancers should not have connectivity disruption during rolling update with externalTrafficPolicy=Local',
  'LoadBalancers should only allow access from service loadbalancer source ranges',
  'Services should complete a service status lifecycle',
  'Services should serve endpoints on same port and different protocol',
];
const skipped = (s: string) => s.includes('cleanup finalizer');
const weight = (s: string) => (skipped(s) ? 0 : specWeight(s));

describe('shardOf', () => {
  it('puts every spec in exactly one shard, in the order given', () => {
    for (const n of [1, 2, 3, 5]) {
      const parts = Array.from({ length: n }, (_, k) => shardOf(specs, [k + 1, n], weight));
      expect(parts.flat().sort()).toEqual([...specs].sort());
      for (const part of parts) expect(part).toEqual(specs.filter((s) => part.includes(s)));
    }
  });

  it('spreads the ten-minute rolling-update specs over two shards, the short ones after them, and reports skipped specs once, in shard 1', () => {
    const [a, b] = [shardOf(specs, [1, 2], weight), shardOf(specs, [2, 2], weight)];
    expect(a.filter((s) => /rolling update/.test(s))).toHaveLength(1);
    expect(b.filter((s) => /rolling update/.test(s))).toHaveLength(1);
    const load = (part: string[]) => part.reduce((sum, s) => sum + weight(s), 0);
    expect(Math.abs(load(a) - load(b))).toBeLessThanOrEqual(1);
    expect(a.filter(skipped)).toHaveLength(1);
    expect(b.filter(skipped)).toHaveLength(0);
  });

  it('is the whole list with one shard', () => {
    expect(shardOf(specs, [1, 1], weight)).toEqual(specs);
  });
});
