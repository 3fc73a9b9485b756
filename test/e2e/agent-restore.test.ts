// Rendered rulesets against the real iptables, nft and legacy backends, in a
// scratch network namespace: every payload is accepted, and what
// iptables-save prints back is, rule for rule, the text the renderer wrote.
// That string equality is what lets the applier compare the kernel's state
// with its own without parsing rules.
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Family } from '../../lib/contract.ts';
import { TABLES, type Ruleset } from '../../agent/iptables/render.ts';
import { parseSave, planText, restoreText, type SavedTables } from '../../agent/iptables/restore.ts';
import { scratchNamespace, type Scratch } from '../lab/scratch.ts';
import { MARKS, modelArb } from '../unit/agent-fixtures.ts';
import { renderRuleset } from '../support/oracle.ts';

const BACKENDS = [
  { name: 'nft', bin: { ipv4: 'iptables-nft', ipv6: 'ip6tables-nft' } },
  { name: 'legacy', bin: { ipv4: 'iptables-legacy', ipv6: 'ip6tables-legacy' } },
] as const;

const BUILTIN = new Set(['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING']);

/** The kernel's view worth comparing: pier chains, and built-in chains that hold rules. */
function view(saved: SavedTables) {
  return Object.fromEntries(
    TABLES.map((t) => [t, Object.fromEntries([...(saved.get(t) ?? new Map<string, string[]>())].filter(([c, rules]) => !BUILTIN.has(c) || rules.length > 0).sort(([a], [b]) => (a < b ? -1 : 1)))]),
  );
}

function expectedView(r: Ruleset) {
  const saved: SavedTables = new Map();
  for (const t of TABLES) {
    const table = new Map<string, string[]>([...r.tables[t].chains].map(([c, rules]) => [c, [...rules]]));
    for (const j of r.tables[t].jumps) table.set(j.chain, [...(table.get(j.chain) ?? []), j.rule]);
    saved.set(t, table);
  }
  return view(saved);
}

const inputArb = modelArb.map((m) => ({ ipv4: renderRuleset(m.ipv4, { marks: MARKS }), ipv6: renderRuleset(m.ipv6, { marks: MARKS }) }));

for (const backend of BACKENDS) {
  describe(`rulesets through iptables (${backend.name})`, () => {
    let s: Scratch;
    beforeAll(async () => {
      s = await scratchNamespace();
    });
    afterAll(async () => {
      await s?.destroy();
    });

    const restore = (family: Family, input: string, args: string[] = ['--noflush']) => s.exec(`${backend.bin[family]}-restore`, args, { input });
    const save = async (family: Family) => parseSave((await s.exec(`${backend.bin[family]}-save`, [])).stdout);
    // Without --noflush, restoring the two tables empty flushes every chain and deletes every user chain.
    const reset = (family: Family) => restore(family, '*nat\nCOMMIT\n*filter\nCOMMIT\n', []);

    it('accepts every plan, and saves back exactly the rendered rules; deltas and full rewrites reach the next state exactly', async () => {
      let runs = 0;
      await fc.assert(
        fc.asyncProperty(inputArb, inputArb, async (a, b) => {
          runs++;
          for (const family of ['ipv4', 'ipv6'] as const) {
            const [prev, next] = [a[family], b[family]];
            await reset(family);
            const plan = planText(prev);
            await restore(family, plan, ['--noflush', '--test']);
            await restore(family, plan);
            expect(view(await save(family)), `${family} plan`).toEqual(expectedView(prev));

            const delta = restoreText(next, { previous: prev });
            if (delta !== '') await restore(family, delta);
            expect(view(await save(family)), `${family} delta`).toEqual(expectedView(next));

            // And back, the way the applier recovers: everything rewritten, strays deleted.
            const saved = await save(family);
            const existingChains = Object.fromEntries(TABLES.map((t) => [t, [...(saved.get(t)?.keys() ?? [])]]));
            await restore(family, restoreText(prev, { existingChains }));
            expect(view(await save(family)), `${family} full`).toEqual(expectedView(prev));
          }
        }),
        { numRuns: 12 },
      );
      expect(runs).toBe(12);
    });

    it('writes nothing for an unchanged ruleset and rejects a payload that breaks a rule', async () => {
      const [r] = fc.sample(inputArb, { numRuns: 1, seed: 42 });
      const ruleset = r!.ipv4;
      await reset('ipv4');
      await restore('ipv4', planText(ruleset));
      expect(restoreText(ruleset, { previous: ruleset })).toBe('');
      // The same check can fail: a rule the kernel prints differently is caught by the comparison.
      const nat = new Map(ruleset.tables.nat.chains);
      nat.set('PIER-CANARY', ['-d 192.0.2.1 -m comment --comment x -j RETURN']);
      const drifted: Ruleset = { ...ruleset, tables: { ...ruleset.tables, nat: { ...ruleset.tables.nat, chains: nat } } };
      await restore('ipv4', restoreText(drifted, { previous: ruleset }));
      expect(view(await save('ipv4'))).not.toEqual(expectedView(drifted));
      const bad = await restore('ipv4', '*nat\n:PIER-X - [0:0]\n-A PIER-X -p tcp -j DNAT --to-destination 1.2.3.4:99999\nCOMMIT\n', ['--noflush', '--test']).catch((e: unknown) => e as { exitCode: number });
      expect(bad.exitCode).not.toBe(0);
    });

    it('applies 10,000 ports and saves them back identically', async () => {
      const ports = Array.from({ length: 10_000 }, (_, i) => ({
        key: `ipv4/ns/s${i}/p/TCP`,
        comment: `ns/s${i}:p`,
        protocol: (['TCP', 'UDP', 'SCTP'] as const)[i % 3]!,
        frontends: [{ address: `192.0.2.${11 + (i % 2)}`, port: 1 + ((i * 7919) % 65535) }],
        endpoints: Array.from({ length: 1 + (i % 4) }, (_, k) => ({ address: `198.18.${(i >> 8) & 255}.${(i + k) & 255}`, port: 8080, local: true })),
        retained: [],
        sourceRanges: i % 10 === 0 ? ['203.0.113.0/24'] : [],
        restrictSources: i % 10 === 0,
        masquerade: i % 2 === 0,
        affinity: 0,
      }));
      const ruleset = renderRuleset({ family: 'ipv4', ports }, { marks: MARKS });
      await reset('ipv4');
      const t0 = performance.now();
      await restore('ipv4', planText(ruleset));
      const t1 = performance.now();
      const saved = await save('ipv4');
      const t2 = performance.now();
      expect(view(saved)).toEqual(expectedView(ruleset));
      let rules = 0;
      for (const t of TABLES) for (const r of ruleset.tables[t].chains.values()) rules += r.length;
      console.log(`${backend.name}: 10,000 ports -> ${ruleset.tables.nat.chains.size} nat + ${ruleset.tables.filter.chains.size} filter chains, ${rules} rules; restore ${Math.round(t1 - t0)} ms, save ${Math.round(t2 - t1)} ms`);
      // One port changes: the delta is a chain or two, not the table.
      const changed = renderRuleset({ family: 'ipv4', ports: ports.map((p, i) => (i === 4321 ? { ...p, endpoints: [{ address: '198.18.255.254', port: 9090, local: true }] } : p)) }, { marks: MARKS });
      const delta = restoreText(changed, { previous: ruleset });
      expect(delta.split('\n').filter((l) => l.startsWith(':')).length).toBeLessThanOrEqual(2);
      const t3 = performance.now();
      await restore('ipv4', delta);
      console.log(`${backend.name}: one-port delta ${Math.round(performance.now() - t3)} ms`);
      expect(view(await save('ipv4'))).toEqual(expectedView(changed));
    });
  });
}
