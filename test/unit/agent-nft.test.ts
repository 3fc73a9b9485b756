// pier's nftables table as data: for every frontend of generated models, the
// sets say exactly what the model says (which endpoints, with what chance,
// masqueraded or not, which sources admitted, rejected when empty), and the
// deltas between two tables carry exactly the difference. The kernel side of
// the same (scripts accepted, read back equal) is test/e2e/nft-restore.test.ts.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { parseAddress, parseCidr, type ServedPort } from '../../agent/engine/model.ts';
import { spreadChain } from '../../agent/nftables/names.ts';
import { carriedClients, emptyNft, NftRenderer, nftDrift, nftScript, outermost, parseNftJson, width, type NftRuleset } from '../../agent/nftables/render.ts';
import { MARKS, toInput, worldArb } from './agent-fixtures.ts';
import { buildModel, renderNft } from '../support/oracle.ts';

const PROTO = { TCP: 'tcp', UDP: 'udp', SCTP: 'sctp' } as const;

function inRange(address: string, range: string): boolean {
  const a = parseAddress(address)!;
  const n = parseCidr(range)!;
  if (n.family !== a.family) return false;
  const host = BigInt((a.family === 'ipv4' ? 32 : 128) - n.prefix);
  return a.value >> host === n.value >> host;
}

/** What the table does with a new connection from `client` to frontend `key`, read from its sets as the chains would. */
function verdict(r: NftRuleset, key: string, client: string) {
  const set = (name: string) => r.sets.get(name) ?? new Map<string, string>();
  if (set('restricted').has(key) && ![...set('allowed').keys()].some((k) => k.startsWith(`${key} . `) && inRange(client, k.slice(key.length + 3)))) return 'dropped';
  const service = set('services').get(key);
  if (!service) return set('no-endpoints').has(key) ? 'rejected' : 'untouched';
  const sticky = /goto (affinity-[a-z2-7]{16})$/.exec(service);
  if (sticky) return affinityVerdict(r, sticky[1]!, key, client);
  const [, chain, policy, count] = /goto ((spread|local)-(\d+))$/.exec(service)!;
  const n = Number(count);
  expect(r.spreads.has(chain!)).toBe(true);
  expect(width(r)).toBeGreaterThanOrEqual(n);
  const to = Array.from({ length: n }, (_, i) => set(`endpoints-${i}`).get(key)!.slice(3));
  const masquerade = policy === 'spread' || set('hairpin').has(`${key} . ${client}`);
  return { to: to.sort(), masquerade };
}

/** The same, through a ClientIP port's own chains: where a new client can go, and where each remembered one goes back. */
function affinityVerdict(r: NftRuleset, chain: string, key: string, client: string) {
  const text = (kind: string, name: string) => r.own.get(`${kind} ${name}`)?.text ?? expect.fail(`${kind} ${name} is missing`);
  const body = text('chain', chain);
  const stickies = [...body.matchAll(/goto (sticky-[a-z2-7]{16})/g)].map((m) => m[1]!);
  const checks = [...body.matchAll(/saddr @(clients-[a-z2-7]{16}) goto (sticky-[a-z2-7]{16});/g)].map((m) => [m[1]!, m[2]!] as const);
  const to = [...new Set(stickies)].map((s) => {
    const m = /update @(clients-[a-z2-7]{16}) \{ ip6? saddr \} dnat to \[?([^\]]+?)\]?:(\d+);/.exec(text('chain', s))!;
    // A known client is sent back through the chain that remembers it there.
    expect(checks.some(([c, st]) => c === m[1] && st === s), `${s} is checked first`).toBe(true);
    expect(text('set', m[1]!)).toMatch(/flags dynamic,timeout; timeout \d+s;/);
    return `${m[2]} . ${m[3]}`;
  });
  expect(body.startsWith(`\tchain ${chain} { `)).toBe(true);
  const masquerade = !body.includes('@hairpin') || r.sets.get('hairpin')!.has(`${key} . ${client}`);
  return { to: to.sort(), masquerade };
}

function expected(p: ServedPort, client: string) {
  // As the iptables backend: a port without endpoints is refused to everyone.
  if (p.endpoints.length === 0) return 'rejected';
  if (p.restrictSources && !p.sourceRanges.some((c) => inRange(client, c))) return 'dropped';
  const to = p.endpoints.map((e) => `${e.address} . ${e.port}`).sort();
  return { to, masquerade: p.masquerade || p.endpoints.some((e) => e.address === client) };
}

describe('renderNft', () => {
  it('serves every frontend of the model as the model says, for clients inside, outside and among the endpoints', () => {
    fc.assert(
      fc.property(worldArb, fc.integer({ min: 0, max: 255 }), (world, h) => {
        const m = buildModel(toInput(world));
        for (const family of ['ipv4', 'ipv6'] as const) {
          const r = renderNft(m[family], MARKS.masquerade);
          for (const p of m[family].ports) {
            const clients = [family === 'ipv4' ? `203.0.113.${h}` : `2001:db8:ffff::${h.toString(16)}`, ...p.sourceRanges.map((c) => c.split('/')[0]!), ...p.endpoints.map((e) => e.address)];
            for (const f of p.frontends) {
              const key = `${f.address} . ${PROTO[p.protocol]} . ${f.port}`;
              for (const c of clients) expect(verdict(r, key, c), `${p.key} ${key} from ${c}`).toEqual(expected(p, c));
            }
          }
          // Nothing beyond the model's frontends, and a chain only for endpoint counts in use.
          const keys = new Set(m[family].ports.flatMap((p) => p.frontends.map((f) => `${f.address} . ${PROTO[p.protocol]} . ${f.port}`)));
          for (const name of ['services', 'no-endpoints', 'restricted']) for (const k of r.sets.get(name)!.keys()) expect(keys.has(k)).toBe(true);
          // Own chains only for ports with affinity: one, and one per endpoint.
          const sticky = m[family].ports.filter((p) => p.endpoints.length > 0 && p.affinity > 0);
          expect([...r.own.values()].filter((o) => o.kind === 'chain').length).toBe(sticky.reduce((n, p) => n + 1 + p.endpoints.length, 0));
          // A map per endpoint index, up to the largest count.
          expect([...r.sets.keys()].filter((s) => s.startsWith('endpoints-')).sort()).toEqual(Array.from({ length: width(r) }, (_, i) => `endpoints-${i}`).sort());
          expect([...r.spreads.keys()].sort()).toEqual([...new Set(m[family].ports.filter((p) => p.endpoints.length > 0 && p.affinity === 0).map((p) => spreadChain(p.endpoints.length, p.masquerade)))].sort());
        }
      }),
      { numRuns: 200 },
    );
  });

  it('keeps only the outermost of nested ranges: the kernel refuses overlapping interval elements', () => {
    expect(outermost(['203.0.113.0/24', '203.0.113.16/28', '198.51.100.7/32', '203.0.113.0/24', '2001:db8::/32'], 'ipv4')).toEqual(['198.51.100.7', '203.0.113.0/24']);
    expect(outermost(['2001:db8:1::/64', '2001:db8::/32', '2001:db8:ffff::5/128', '0.0.0.0/0'], 'ipv6')).toEqual(['2001:db8::/32']);
    expect(outermost(['::/0', '2001:db8::1/128'], 'ipv6')).toEqual(['::/0']);
  });
});

describe('NftRenderer', () => {
  const copy = (r: NftRuleset): NftRuleset => ({ ...r, sets: new Map([...r.sets].map(([s, items]) => [s, new Map(items)])), spreads: new Map(r.spreads), own: new Map(r.own) });
  /** Applies a delta's commands to a copy of `prev`, as the kernel would, refusing what the kernel would refuse. */
  function applied(prev: NftRuleset, delta: string): NftRuleset {
    const out = copy(prev);
    const flushed = new Set<string>();
    for (const line of delta.split('\n')) {
      let o = /^flush chain ip6? pier (\S+)$/.exec(line);
      if (o) {
        expect(out.own.has(`chain ${o[1]}`), line).toBe(true);
        flushed.add(`chain ${o[1]}`);
      }
      o = /^\t(set|chain) ((?:clients|sticky|affinity)-\S+) \{/.exec(line);
      if (o) {
        const k = `${o[1]} ${o[2]}`;
        expect(out.own.has(k) && !flushed.has(k), line).toBe(false);
        out.own.set(k, { ...(out.own.get(k) ?? { kind: o[1] as 'set' | 'chain', name: o[2]!, rules: 0, order: 0 }), text: `${line}\n` });
      }
      o = /^delete (set|chain) ip6? pier ((?:clients|sticky|affinity)-\S+)$/.exec(line);
      if (o) expect(out.own.delete(`${o[1]} ${o[2]}`), line).toBe(true);
      let m = /^\tmap (endpoints-\d+) \{/.exec(line);
      if (m) {
        expect(out.sets.has(m[1]!), line).toBe(false);
        out.sets.set(m[1]!, new Map());
      }
      m = /^delete map ip6? pier (endpoints-\d+)$/.exec(line);
      if (m) expect(out.sets.delete(m[1]!), line).toBe(true);
      m = /^(add|delete) element ip6? pier (\S+) \{ (.*) \}$/.exec(line);
      if (m) {
        const set = out.sets.get(m[2]!)!;
        for (const item of m[3]!.split(', ')) {
          const key = item.replace(/ comment ".*$/, '').replace(/ : .*$/, '');
          if (m[1] === 'delete') expect(set.delete(key), line).toBe(true);
          else {
            expect(set.has(key), line).toBe(false);
            set.set(key, item.slice(key.length));
          }
        }
      }
      m = /^\tchain ((?:spread|local)-\d+) \{/.exec(line);
      if (m) {
        expect(out.spreads.has(m[1]!), line).toBe(false);
        out.spreads.set(m[1]!, 1);
      }
      m = /^delete chain ip6? pier ((?:spread|local)-\d+)$/.exec(line);
      if (m) out.spreads.delete(m[1]!);
    }
    // Nothing names an own chain or set that is gone.
    const named = [...out.sets.get('services')!.values(), ...[...out.own.values()].map((x) => x.text)].flatMap((t) => [...t.matchAll(/(?:goto |@)((?:clients|sticky|affinity)-[a-z2-7]{16})/g)].map((x) => x[1]!));
    for (const n of named) expect(out.own.has(`chain ${n}`) || out.own.has(`set ${n}`), `${n} exists`).toBe(true);
    return out;
  }
  const sameSets = (a: NftRuleset, b: NftRuleset) => {
    expect([...a.sets.keys()].sort()).toEqual([...b.sets.keys()].sort());
    for (const [s, items] of b.sets) expect([...a.sets.get(s)!].sort(), s).toEqual([...items].sort());
    expect([...a.spreads.keys()].sort()).toEqual([...b.spreads.keys()].sort());
    expect(new Map([...a.own].map(([k, o]) => [k, o.text]))).toEqual(new Map([...b.own].map(([k, o]) => [k, o.text])));
  };

  it('carries from one model to the next exactly the difference, ends where a new renderer starts, and says nothing when nothing changed', () => {
    fc.assert(
      fc.property(fc.array(worldArb, { minLength: 2, maxLength: 4 }), (worlds) => {
        for (const family of ['ipv4', 'ipv6'] as const) {
          const r = new NftRenderer(family, MARKS.masquerade);
          // Asked for no transaction (a table written whole): the same states and versions.
          const whole = new NftRenderer(family, MARKS.masquerade);
          let kernel = emptyNft(family, MARKS.masquerade);
          let version = 0;
          for (const w of worlds) {
            const model = buildModel(toInput(w))[family];
            const u = r.update(model);
            expect(u.since).toBe(version);
            kernel = applied(kernel, u.delta!);
            const v = whole.update(model, { transaction: false });
            expect([v.delta, v.version]).toEqual([u.delta === '' ? '' : undefined, u.version]);
            sameSets(v.state, kernel);
            sameSets(kernel, renderNft(model, MARKS.masquerade));
            sameSets(u.state, kernel);
            version = u.version;
            // The same model again, and a rebuilt one whose plans are new objects with the same content.
            expect(r.update(model).delta).toBe('');
            const again = r.update(buildModel(toInput(w))[family]);
            expect(again.delta).toBe('');
            expect(again.version).toBe(version);
          }
        }
      }),
      { numRuns: 150 },
    );
  });

  it('writes a whole table that replaces the old one in the same transaction', () => {
    const r = renderNft(buildModel(toInput(fc.sample(worldArb, { numRuns: 1, seed: 3 })[0]!)).ipv4, MARKS.masquerade);
    expect(nftScript(r).split('\n').slice(0, 3)).toEqual(['add table ip pier', 'delete table ip pier', 'table ip pier {']);
  });
});

describe('carriedClients', () => {
  it('carries the remembered clients of the affinity sets still wanted, with what is left of their timeouts', () => {
    const port: ServedPort = {
      key: 'ipv4/shop/web/http/TCP', comment: 'shop/web:http', protocol: 'TCP', frontends: [{ address: '192.0.2.11', port: 80 }],
      endpoints: [{ address: '198.18.0.1', port: 8080, local: true }], retained: [], sourceRanges: [], restrictSources: false, masquerade: true, affinity: 600,
    };
    const r = renderNft({ family: 'ipv4', ports: [port] }, MARKS.masquerade);
    const [set] = [...r.own.values()].filter((o) => o.kind === 'set').map((o) => o.name);
    const listed = JSON.stringify({
      nftables: [
        { metainfo: { version: '1.0.6' } },
        { set: { family: 'ip', name: set, table: 'pier', type: 'ipv4_addr', elem: [{ elem: { val: '198.51.100.1', expires: 99 } }, { elem: { val: '198.51.100.2', expires: 0 } }] } },
        { set: { family: 'ip', name: 'clients-gone', table: 'pier', type: 'ipv4_addr', elem: [{ elem: { val: '198.51.100.3', expires: 50 } }] } },
        { map: { family: 'ip', name: 'services', table: 'pier', elem: [] } },
      ],
    });
    expect(carriedClients(listed, r)).toBe(`add element ip pier ${set} { 198.51.100.1 expires 99s }\n`);
    expect(carriedClients(listed, renderNft({ family: 'ipv4', ports: [{ ...port, affinity: 0 }] }, MARKS.masquerade))).toBe('');
  });
});

describe('nftDrift', () => {
  it('finds nothing in a table read back as written, and names what is missing or foreign', () => {
    const r = emptyNft('ipv4', MARKS.masquerade);
    r.sets.get('services')!.set('192.0.2.11 . tcp . 80', ' comment "shop/web:http" : goto spread-1');
    r.sets.set('endpoints-0', new Map([['192.0.2.11 . tcp . 80', ' : 198.18.0.1 . 8080']]));
    r.sets.get('allowed')!.set('192.0.2.11 . tcp . 80 . 203.0.113.0/24', '');
    r.spreads.set('spread-1', 1);
    const chain = (name: string, rules: number) => [{ chain: { name } }, ...Array.from({ length: rules }, () => ({ rule: { chain: name } }))];
    const json = (services: unknown[]) =>
      JSON.stringify({
        nftables: [
          { table: { name: 'pier' } },
          { map: { name: 'services', elem: services } },
          { map: { name: 'endpoints-0', elem: [[{ concat: ['192.0.2.11', 'tcp', 80] }, { concat: ['198.18.0.1', 8080] }]] } },
          ...['hairpin', 'no-endpoints', 'restricted'].map((name) => ({ set: { name } })),
          { set: { name: 'allowed', elem: [{ concat: ['192.0.2.11', 'tcp', 80, { prefix: { addr: '203.0.113.0', len: 24 } }] }] } },
          ...chain('filter-prerouting', 1), ...chain('filter-input', 2), ...chain('filter-output', 3),
          ...chain('nat-prerouting', 1), ...chain('nat-output', 1), ...chain('nat-postrouting', 1), ...chain('spread-1', 2), ...chain('pick-0', 1),
        ],
      });
    const service = [{ elem: { val: { concat: ['192.0.2.11', 'tcp', 80] }, comment: 'shop/web:http' } }, { goto: { target: 'spread-1' } }];
    expect(nftDrift(r, parseNftJson(json([service])))).toEqual([]);
    expect(nftDrift(r, parseNftJson(json([])))).toEqual(['set services: 1 missing, 0 unwanted']);
    const other = [[{ concat: ['192.0.2.11', 'tcp', 81] }, { goto: { target: 'spread-1' } }]];
    expect(nftDrift(r, parseNftJson(json([service, ...other])))).toEqual(['set services: 0 missing, 1 unwanted']);
  });
});
