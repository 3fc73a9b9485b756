// iptables-restore payloads and iptables-save parsing, checked against a
// small in-memory model of `iptables-restore --noflush` (the e2e test checks
// the same against the kernel).
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';

import { driftLogFields, findDrift, healJumps, healText } from '../../agent/iptables/applier.ts';
import { TABLES, type Ruleset, type TableName } from '../../agent/iptables/render.ts';
import { commandsText, parseSave, planText, restoreText, splitRule, type SavedTables } from '../../agent/iptables/restore.ts';
import { MARKS, toInput, worldArb } from './agent-fixtures.ts';
import { buildModel, renderRuleset } from '../support/oracle.ts';

const BUILTIN: Record<string, string[]> = {
  nat: ['PREROUTING', 'INPUT', 'OUTPUT', 'POSTROUTING'],
  filter: ['INPUT', 'FORWARD', 'OUTPUT'],
};

function emptyState(): SavedTables {
  return new Map(Object.entries(BUILTIN).map(([t, chains]) => [t, new Map(chains.map((c) => [c, [] as string[]]))]));
}

function clone(state: SavedTables): SavedTables {
  return new Map([...state].map(([t, chains]) => [t, new Map([...chains].map(([c, r]) => [c, [...r]]))]));
}

/** `iptables-restore --noflush`, as far as pier uses it: atomic per table, strict about missing and referenced chains. */
function restore(state: SavedTables, payload: string): SavedTables {
  const out = clone(state);
  let table: Map<string, string[]> | undefined;
  let name = '';
  for (const line of payload.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    if (line.startsWith('*')) {
      name = line.slice(1);
      table = clone(out).get(name);
      if (!table) throw new Error(`unknown table ${name}`);
    } else if (line === 'COMMIT') {
      out.set(name, table!);
      table = undefined;
    } else if (line.startsWith(':')) {
      const chain = line.slice(1).split(' ')[0]!;
      if (!BUILTIN[name]!.includes(chain)) table!.set(chain, []);
    } else if (line.startsWith('-A ')) {
      const [, chain, ...rest] = line.split(' ');
      const rules = table!.get(chain!);
      if (!rules) throw new Error(`-A to missing chain ${chain}`);
      const target = / -j (\S+)/.exec(line)![1]!;
      if (target.startsWith('PIER-') && !table!.has(target)) throw new Error(`jump to missing chain ${target}`);
      rules.push(rest.join(' '));
    } else if (line.startsWith('-D ') || line.startsWith('-I ')) {
      const [op, chain, ...rest] = line.split(' ');
      const rules = table!.get(chain!);
      if (!rules) throw new Error(`${op} in missing chain ${chain}`);
      if (op === '-I') {
        const at = Number(rest[0]);
        if (!Number.isInteger(at) || at < 1 || at > rules.length + 1) throw new Error(`-I at ${rest[0]} in ${chain}, which holds ${rules.length} rules`);
        rules.splice(at - 1, 0, rest.slice(1).join(' '));
      } else {
        const at = rules.indexOf(rest.join(' '));
        if (at < 0) throw new Error(`-D of a rule ${chain} does not hold: ${rest.join(' ')}`);
        rules.splice(at, 1);
      }
    } else if (line.startsWith('-X ')) {
      const chain = line.slice(3);
      if (!table!.has(chain)) throw new Error(`-X of missing chain ${chain}`);
      if (table!.get(chain)!.length > 0) throw new Error(`-X of non-empty chain ${chain}`);
      for (const [c, rules] of table!) if (rules.some((r) => r.endsWith(`-j ${chain}`))) throw new Error(`-X of ${chain}, still referenced from ${c}`);
      table!.delete(chain);
    } else throw new Error(`unexpected line ${line}`);
  }
  if (table) throw new Error('payload without COMMIT');
  return out;
}

/** What the kernel should hold after a ruleset and its jumps are in place: the jumps first, in order, then what the host had. */
function stateOf(r: Ruleset, host: SavedTables = emptyState()): SavedTables {
  const state = clone(host);
  for (const t of TABLES) {
    const table = state.get(t)!;
    for (const [c, rules] of r.tables[t].chains) table.set(c, [...rules]);
    const jumps = new Map<string, string[]>();
    for (const j of r.tables[t].jumps) jumps.set(j.chain, [...(jumps.get(j.chain) ?? []), j.rule]);
    for (const [c, rules] of jumps) table.set(c, [...rules, ...table.get(c)!]);
  }
  return state;
}

/** A host with rules of its own in every built-in chain pier jumps from. */
function hostState(): SavedTables {
  const state = emptyState();
  for (const [t, chains] of state) for (const [c, rules] of chains) rules.push(`-s 203.0.113.0/24 -m comment --comment "host ${t} ${c}" -j ACCEPT`, '-j RETURN');
  return state;
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/** Built-in chains in a fixed order, then pier chains sorted: the comparison ignores declaration order. */
function canonical(state: SavedTables) {
  return Object.fromEntries(TABLES.map((t) => [t, Object.fromEntries([...(state.get(t) ?? new Map())].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)))]));
}

const rulesets = (w: Parameters<typeof toInput>[0]) => {
  const m = buildModel(toInput(w));
  return [renderRuleset(m.ipv4, { marks: MARKS }), renderRuleset(m.ipv6, { marks: MARKS })] as const;
};

describe('parseSave', () => {
  it('reads tables, chains (built-in and user, even empty) and rules', () => {
    const text = [
      '# Generated by iptables-save v1.8.9 (nf_tables) on Sat Nov 21 07:18:09 2026',
      '*filter',
      ':INPUT ACCEPT [0:0]',
      ':FORWARD DROP [12:345]',
      ':PIER-FORWARD - [0:0]',
      ':PIER-CANARY - [0:0]',
      '-A FORWARD -j PIER-FORWARD',
      '-A PIER-FORWARD -m conntrack --ctproto 6 --ctorigdst 192.0.2.11 --ctorigdstport 80 -m comment --comment "shop/web:http" -j ACCEPT',
      'COMMIT',
      '# Completed on Sat Nov 21 07:18:09 2026',
      '*nat',
      ':PREROUTING ACCEPT [0:0]',
      '-A PREROUTING -j PIER-SERVICES',
      'COMMIT',
      '',
    ].join('\n');
    const saved = parseSave(text);
    expect([...saved.keys()]).toEqual(['filter', 'nat']);
    expect([...saved.get('filter')!]).toEqual([
      ['INPUT', []],
      ['FORWARD', ['-j PIER-FORWARD']],
      ['PIER-FORWARD', ['-m conntrack --ctproto 6 --ctorigdst 192.0.2.11 --ctorigdstport 80 -m comment --comment "shop/web:http" -j ACCEPT']],
      ['PIER-CANARY', []],
    ]);
    expect(saved.get('nat')!.get('PREROUTING')).toEqual(['-j PIER-SERVICES']);
  });

  it('reads back what planText declares', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        for (const r of rulesets(w)) {
          const text = planText(r);
          const saved = parseSave(text);
          for (const t of TABLES) {
            for (const [c, rules] of r.tables[t].chains) expect(saved.get(t)!.get(c)).toEqual(rules);
            // Jumps are inserted (-I), which a save never shows: the agent puts them at the top.
            for (const j of r.tables[t].jumps) expect(text).toMatch(new RegExp(`^-I ${j.chain} \\d+ ${escapeRegExp(j.rule)}$`, 'm'));
          }
        }
      }),
      { numRuns: 50 },
    );
  });
});

describe('splitRule', () => {
  it('splits on blanks, groups double quotes and honours backslashes', () => {
    expect(splitRule('-m comment --comment "a b" -j X')).toEqual(['-m', 'comment', '--comment', 'a b', '-j', 'X']);
    expect(splitRule('--comment "say \\"hi\\"" -j  Y ')).toEqual(['--comment', 'say "hi"', '-j', 'Y']);
    expect(splitRule('--comment ""')).toEqual(['--comment', '']);
  });
});

describe('planText', () => {
  it('builds the whole ruleset, jumps included, in an empty namespace', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        for (const r of rulesets(w)) expect(canonical(restore(emptyState(), planText(r)))).toEqual(canonical(stateOf(r)));
      }),
      { numRuns: 100 },
    );
  });

  it("puts the jumps where the agent's full rewrite does: at the top of their chains, ahead of the host's rules", () => {
    const host = hostState();
    fc.assert(
      fc.property(worldArb, (w) => {
        for (const r of rulesets(w)) {
          const planned = restore(host, planText(r));
          // The agent's full rewrite on the same host (restoreText with every jump to insert).
          const jumps = Object.fromEntries(TABLES.map((t) => [t, { remove: [], insert: r.tables[t].jumps }]));
          const applied = restore(host, restoreText(r, { jumps }));
          expect(canonical(planned)).toEqual(canonical(applied));
          expect(canonical(planned)).toEqual(canonical(stateOf(r, host)));
        }
      }),
      { numRuns: 50 },
    );
  });
});

describe('restoreText', () => {
  it('writes nothing when nothing changed, however often it is rendered', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        const [a4, a6] = rulesets(w);
        const [b4, b6] = rulesets(w);
        expect(restoreText(b4, { previous: a4 })).toBe('');
        expect(restoreText(b6, { previous: a6 })).toBe('');
      }),
      { numRuns: 100 },
    );
  });

  it('turns the previous state into the next one, rewriting only chains that changed', () => {
    fc.assert(
      fc.property(worldArb, worldArb, (w1, w2) => {
        const prev = rulesets(w1);
        const next = rulesets(w2);
        for (const i of [0, 1]) {
          const [p, n] = [prev[i]!, next[i]!];
          const payload = restoreText(n, { previous: p });
          expect(canonical(restore(stateOf(p), payload))).toEqual(canonical(stateOf(n)));
          for (const line of payload.split('\n').filter((l) => l.startsWith(':'))) {
            const chain = line.slice(1).split(' ')[0]!;
            const table = TABLES.find((t) => p.tables[t].chains.has(chain) || n.tables[t].chains.has(chain))!;
            expect(p.tables[table].chains.get(chain), `${chain} is rewritten only when it changed`).not.toEqual(n.tables[table].chains.get(chain));
          }
          expect(payload.includes('-A PREROUTING') || payload.includes('-A FORWARD'), 'no jumps in a delta').toBe(false);
        }
      }),
      { numRuns: 150 },
    );
  });

  it('without a previous state rewrites every chain and deletes the pier chains no longer wanted', () => {
    fc.assert(
      fc.property(worldArb, worldArb, (w1, w2) => {
        const prev = rulesets(w1);
        const next = rulesets(w2);
        for (const i of [0, 1]) {
          const state = stateOf(prev[i]!);
          // Someone else's chain, which pier must never delete.
          state.get('nat')!.set('KUBE-SERVICES', []);
          const existingChains = Object.fromEntries(TABLES.map((t) => [t, [...state.get(t)!.keys()].filter((c) => !BUILTIN[t]!.includes(c))]));
          const payload = restoreText(next[i]!, { existingChains });
          const want = stateOf(next[i]!);
          want.get('nat')!.set('KUBE-SERVICES', []);
          expect(canonical(restore(state, payload))).toEqual(canonical(want));
          expect(payload).not.toContain('KUBE-SERVICES');
          for (const t of TABLES) for (const c of next[i]!.tables[t].chains.keys()) expect(payload).toContain(`:${c} - [0:0]`);
        }
      }),
      { numRuns: 100 },
    );
  });

  it('puts jump edits in the same transaction: deletions before any chain is deleted, insertions last and in reverse', () => {
    const [r] = rulesets({ services: [] });
    const jumps = {
      nat: { remove: [{ chain: 'PREROUTING', rule: '-j PIER-OLD' }], insert: r!.tables.nat.jumps },
      filter: { remove: [], insert: [] },
    };
    const lines = restoreText(r!, { existingChains: { nat: ['PIER-OLD'] }, jumps }).split('\n');
    const nat = lines.slice(lines.indexOf('*nat'), lines.indexOf('COMMIT') + 1);
    const at = (prefix: string) => nat.findIndex((l) => l.startsWith(prefix));
    expect(at('-D PREROUTING -j PIER-OLD')).toBeGreaterThan(at('-A '));
    expect(at('-D PREROUTING -j PIER-OLD')).toBeLessThan(at('-X PIER-OLD'));
    expect(nat.slice(-1 - r!.tables.nat.jumps.length, -1)).toEqual([...r!.tables.nat.jumps].reverse().map((j) => `-I ${j.chain} 1 ${j.rule}`));
    // A table with nothing but jump edits still gets its block.
    const onlyJumps = restoreText(r!, { previous: r!, jumps: { filter: { remove: [], insert: r!.tables.filter.jumps } } });
    expect(onlyJumps.split('\n').filter((l) => l !== '')).toEqual(['*filter', ...[...r!.tables.filter.jumps].reverse().map((j) => `-I ${j.chain} 1 ${j.rule}`), 'COMMIT']);
  });

  it('recovers from an outside flush of pier chains', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        for (const r of rulesets(w)) {
          // The jumps survive an `iptables -F PIER-...` of everything, the chains are empty.
          const state = stateOf(r);
          for (const t of TABLES) for (const c of r.tables[t].chains.keys()) state.get(t)!.set(c, []);
          expect(canonical(restore(state, restoreText(r)))).toEqual(canonical(stateOf(r)));
        }
      }),
      { numRuns: 30 },
    );
  });
});

describe('findDrift and healText: the kernel against what was applied', () => {
  const FOREIGN = '-s 203.0.113.9/32 -m comment --comment "not pier" -j RETURN';

  /** Ways the kernel's pier state gets changed behind pier's back, each returning the chains it touched. */
  type Mutation = (state: SavedTables, r: Ruleset, pick: number) => { table: TableName; chain: string }[];
  const pierChainsOf = (r: Ruleset, pick: number) => {
    const all = TABLES.flatMap((table) => [...r.tables[table].chains.keys()].map((chain) => ({ table, chain })));
    return all[pick % all.length]!;
  };
  const mutations: Record<string, Mutation> = {
    'flush a chain': (state, r, pick) => {
      const c = pierChainsOf(r, pick);
      if (r.tables[c.table].chains.get(c.chain)!.length === 0) return [];
      state.get(c.table)!.set(c.chain, []);
      return [c];
    },
    'delete one rule': (state, r, pick) => {
      const c = pierChainsOf(r, pick);
      const rules = state.get(c.table)!.get(c.chain)!;
      if (rules.length === 0) return [];
      rules.splice(pick % rules.length, 1);
      return [c];
    },
    'insert a foreign rule': (state, r, pick) => {
      const c = pierChainsOf(r, pick);
      const rules = state.get(c.table)!.get(c.chain)!;
      rules.splice(pick % (rules.length + 1), 0, FOREIGN);
      return [c];
    },
    'delete an unreferenced chain': (state, r, pick) => {
      const c = pierChainsOf(r, pick);
      const table = state.get(c.table)!;
      if ([...table.values()].some((rules) => rules.some((rule) => rule.endsWith(`-j ${c.chain}`)))) return [];
      table.delete(c.chain);
      return [c];
    },
    'add a stray pier chain with a jump to it': (state) => {
      state.get('filter')!.set('PIER-STRAY', ['-j DROP']);
      state.get('filter')!.get('FORWARD')!.unshift('-j PIER-STRAY');
      return [{ table: 'filter', chain: 'PIER-STRAY' }];
    },
    'delete a jump': (state, r, pick) => {
      const table = TABLES[pick % 2]!;
      const j = r.tables[table].jumps[pick % r.tables[table].jumps.length]!;
      const rules = state.get(table)!.get(j.chain)!;
      rules.splice(rules.indexOf(j.rule), 1);
      return [];
    },
    'duplicate a jump': (state, r, pick) => {
      const table = TABLES[pick % 2]!;
      const j = r.tables[table].jumps[pick % r.tables[table].jumps.length]!;
      state.get(table)!.get(j.chain)!.push(j.rule);
      return [];
    },
    'swap two jumps': (state) => {
      state.get('filter')!.get('OUTPUT')!.reverse();
      return [];
    },
    'flush a whole table': (state, r, pick) => {
      const table = TABLES[pick % 2]!;
      const t = state.get(table)!;
      // As `iptables -t nat -F`, but sparing the other program's chain this test checks is left alone.
      for (const chain of t.keys()) if (chain !== 'KUBE-SERVICES') t.set(chain, []);
      return [...r.tables[table].chains].filter(([, rules]) => rules.length > 0).map(([chain]) => ({ table, chain }));
    },
  };

  it('finds nothing, and writes nothing, when the kernel holds what was applied', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        for (const r of rulesets(w)) {
          expect(findDrift(r, stateOf(r))).toBeUndefined();
          expect(healText(r, stateOf(r))).toEqual({ payload: '', jumpsInserted: 0 });
        }
      }),
      { numRuns: 100 },
    );
  });

  it('names every chain changed from outside, and one restore brings back exactly what was applied, leaving what is not pier\'s', () => {
    fc.assert(
      fc.property(worldArb, fc.subarray(Object.keys(mutations), { minLength: 1 }), fc.nat(), (w, chosen, pick) => {
        for (const r of rulesets(w)) {
          const state = stateOf(r);
          state.get('nat')!.set('KUBE-SERVICES', ['-j RETURN']);
          const want = clone(state);
          const touched = chosen.flatMap((m, i) => mutations[m]!(state, r, pick + i * 7));
          const drift = findDrift(r, state);
          const found = new Set((drift?.chains ?? []).map((c) => `${c.table} ${c.chain}`));
          for (const c of touched) {
            // A later mutation may have undone an earlier one (a rule deleted, then the chain flushed, say).
            const now = state.get(c.table)!.get(c.chain);
            const before = want.get(c.table)!.get(c.chain);
            const same = now !== undefined && before !== undefined && now.join('\n') === before.join('\n');
            expect(found.has(`${c.table} ${c.chain}`), `${chosen.join(', ')}: ${c.table} ${c.chain}`).toBe(!same);
          }
          const { payload } = healText(r, state);
          expect(canonical(restore(state, payload))).toEqual(canonical(want));
          expect(payload).not.toContain('KUBE-SERVICES');
          // Chains left as they were are not written.
          let table = '';
          for (const line of payload.split('\n')) {
            if (line.startsWith('*')) table = line.slice(1);
            if (line.startsWith(':')) expect(found.has(`${table} ${line.slice(1).split(' ')[0]}`), `${line} is written only when it drifted`).toBe(true);
          }
          expect(payload === '', 'a payload exactly when something drifted').toBe(drift === undefined);
        }
      }),
      { numRuns: 200 },
    );
  });

  it('counts rules lost and added per chain, and says a chain is missing or unwanted', () => {
    const [r] = rulesets({ services: [] });
    const state = stateOf(r!);
    const post = state.get('nat')!.get('PIER-POSTROUTING')!;
    post.splice(0, 1);
    post.push(FOREIGN, FOREIGN);
    state.get('filter')!.delete('PIER-CANARY');
    state.get('nat')!.set('PIER-OLD', ['-j RETURN']);
    state.get('nat')!.get('PREROUTING')!.length = 0;
    expect(findDrift(r!, state)).toEqual({
      chains: [
        { table: 'nat', chain: 'PIER-POSTROUTING', state: 'changed', lost: 1, added: 2 },
        { table: 'nat', chain: 'PIER-OLD', state: 'unwanted', lost: 0, added: 1 },
        { table: 'filter', chain: 'PIER-CANARY', state: 'missing', lost: 1, added: 0 },
      ],
      jumps: [{ table: 'nat', missing: 1, unwanted: 0 }],
    });
    // A reordered chain differs with nothing lost or added.
    const swapped = stateOf(r!);
    swapped.get('filter')!.get('PIER-FORWARD')!.reverse();
    expect(findDrift(r!, swapped)!.chains).toEqual([{ table: 'filter', chain: 'PIER-FORWARD', state: 'changed', lost: 0, added: 0 }]);
  });

  it('heals drift and applies a new ruleset in the same payload', () => {
    fc.assert(
      fc.property(worldArb, worldArb, fc.nat(), (w1, w2, pick) => {
        const [a4, a6] = rulesets(w1);
        const [b4, b6] = rulesets(w2);
        for (const [applied, next] of [[a4, b4], [a6, b6]] as const) {
          const state = stateOf(applied);
          mutations['flush a chain']!(state, applied, pick);
          mutations['delete a jump']!(state, applied, pick);
          expect(canonical(restore(state, healText(next, state).payload))).toEqual(canonical(stateOf(next)));
        }
      }),
      { numRuns: 100 },
    );
  });

  it('puts a missing jump back in its rendered place among the others of its chain', () => {
    const [r] = rulesets({ services: [] });
    const state = stateOf(r!);
    const input = state.get('filter')!.get('INPUT')!;
    expect(input).toHaveLength(2);
    input.shift();
    const edits = healJumps(r!, 'filter', state.get('filter'));
    expect(edits.missing).toBe(1);
    // Only INPUT's jumps are touched; OUTPUT's are all there.
    expect(new Set(edits.insert.map((j) => j.chain))).toEqual(new Set(['INPUT']));
    expect(canonical(restore(state, healText(r!, state).payload))).toEqual(canonical(stateOf(r!)));
  });

  it('logs a bounded summary however much drifted', () => {
    const many: Ruleset = {
      family: 'ipv4',
      tables: {
        nat: { chains: new Map(Array.from({ length: 5000 }, (_, i) => [`PIER-SVCS-${i}`, ['-j RETURN', '-j ACCEPT']])), jumps: [] },
        filter: { chains: new Map(), jumps: [] },
      },
    };
    const state = emptyState();
    for (const chain of many.tables.nat.chains.keys()) state.get('nat')!.set(chain, []);
    const fields = driftLogFields(findDrift(many, state)!);
    expect(fields).toMatchObject({ chainsChanged: 5000, chainsMissing: 0, chainsUnwanted: 0, rulesLost: 10000, rulesAdded: 0, moreChains: 4990 });
    expect(fields.chains).toHaveLength(10);
    expect((fields.chains as string[])[0]).toBe('nat PIER-SVCS-0: changed, 2 rules lost, 0 added');
    expect(JSON.stringify(fields).length).toBeLessThan(2000);
  });
});

describe('commandsText', () => {
  /** POSIX shell words, as far as commandsText quotes: single quotes and bare words. */
  function shellWords(line: string): string[] {
    const words: string[] = [];
    const re = /'((?:[^']|'\\'')*)'|(\S+)/g;
    for (const m of line.matchAll(re)) words.push(m[1] !== undefined ? m[1].replaceAll(`'\\''`, `'`) : m[2]!);
    return words;
  }

  it('is one iptables or ip6tables command per chain and rule, that together rebuild the plan', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        for (const r of rulesets(w)) {
          const lines = commandsText(r).trimEnd().split('\n');
          const bin = r.family === 'ipv6' ? 'ip6tables' : 'iptables';
          let count = 0;
          // Arguments as the shell would pass them, per table and chain.
          const args = new Map<string, string[][]>();
          for (const line of lines) {
            const [b, dashT, table, op, chain, ...rest] = shellWords(line);
            expect([b, dashT]).toEqual([bin, '-t']);
            const key = `${table} ${chain}`;
            if (op === '-N') args.set(key, []);
            else if (op === '-I') {
              // Jumps, at the top of built-in chains, as planText puts them.
              const rules = args.get(key) ?? [];
              const at = Number(rest[0]);
              expect(at).toBeGreaterThanOrEqual(1);
              expect(at).toBeLessThanOrEqual(rules.length + 1);
              rules.splice(at - 1, 0, rest.slice(1));
              args.set(key, rules);
            } else {
              expect(op).toBe('-A');
              if (!args.has(key)) args.set(key, []);
              args.get(key)!.push(rest);
            }
            count++;
          }
          let expected = 0;
          for (const t of TABLES) {
            expected += r.tables[t].chains.size + r.tables[t].jumps.length;
            for (const rules of r.tables[t].chains.values()) expected += rules.length;
          }
          expect(count).toBe(expected);
          for (const t of TABLES) {
            for (const [c, rules] of r.tables[t].chains) expect(args.get(`${t} ${c}`)).toEqual(rules.map(splitRule));
            for (const j of r.tables[t].jumps) expect(args.get(`${t} ${j.chain}`)).toContainEqual(splitRule(j.rule));
            // In each built-in chain, the jumps in the ruleset's order, as the agent leaves them.
            for (const chain of new Set(r.tables[t].jumps.map((j) => j.chain))) {
              expect(args.get(`${t} ${chain}`)).toEqual(r.tables[t].jumps.filter((j) => j.chain === chain).map((j) => splitRule(j.rule)));
            }
          }
        }
      }),
      { numRuns: 50 },
    );
  });
});
