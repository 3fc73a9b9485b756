// The agent's renderer: rules in pier's chains that send each served
// frontend to exactly its endpoints, accept (or filter) the DNATed traffic,
// reject ports without endpoints, and stay cheap to walk and to restore.
// Most checks walk packets through the rendered chains with a small
// interpreter (agent-fixtures.ts) rather than compare rule text.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { parseAddress, parseCidr, type FamilyModel, type ServedPort } from '../../agent/engine/model.ts';
import { chainName } from '../../agent/names.ts';
import { ACCEPT_CHAIN, affinityListName, CANARY_CHAIN, CANARY_RULE, MAX_CHAIN_NAME, TABLES, type Ruleset } from '../../agent/iptables/render.ts';
import { probability, saveString } from '../../agent/iptables/rule.ts';
import { CLIENT, MARKS, PROTO_NUMBERS, corrupt, corruptionArb, destinations, dnatText, toInput, walk, worldArb, type Packet, type World } from './agent-fixtures.ts';
import { buildModel, renderRuleset } from '../support/oracle.ts';

const render = (m: FamilyModel) => renderRuleset(m, { marks: MARKS });

function served(over: Partial<ServedPort> & { key: string }): ServedPort {
  return {
    comment: over.key.split('/').slice(1, 3).join('/') + ':p',
    protocol: 'TCP',
    frontends: [{ address: '192.0.2.11', port: 80 }],
    endpoints: [{ address: '198.18.0.1', port: 8080, local: true }],
    retained: [],
    sourceRanges: [],
    restrictSources: false,
    masquerade: true,
    affinity: 0,
    ...over,
  };
}

const lower = (p: ServedPort) => p.protocol.toLowerCase() as Packet['proto'];

function newConnection(p: ServedPort, f: { address: string; port: number }, src: string): Packet {
  return { src, dst: f.address, proto: lower(p), dport: f.port };
}

function dnatedConnection(p: ServedPort, f: { address: string; port: number }, src: string): Packet {
  const e = p.endpoints[0] ?? { address: f.address, port: f.port };
  return { src, dst: e.address, proto: lower(p), dport: e.port, ct: { new: true, dnat: true, proto: PROTO_NUMBERS[lower(p)]!, origsrc: src, origdst: f.address, origdport: f.port } };
}

function undnatedConnection(proto: Packet['proto'], address: string, port: number, src: string): Packet {
  return { src, dst: address, proto, dport: port, ct: { new: true, dnat: false, proto: PROTO_NUMBERS[proto]!, origsrc: src, origdst: address, origdport: port } };
}

function familyOf(m: FamilyModel): 'ipv4' | 'ipv6' {
  return m.family;
}

function inAny(address: string, cidrs: string[]): boolean {
  const a = parseAddress(address)!;
  return cidrs.some((c) => {
    const n = parseCidr(c)!;
    if (n.family !== a.family) return false;
    const host = BigInt((a.family === 'ipv4' ? 32 : 128) - n.prefix);
    return a.value >> host === n.value >> host;
  });
}

/** Asserts what every packet to every frontend of `m` meets in `r`. */
function checkBehaviour(m: FamilyModel, r: Ruleset): void {
  const nat = r.tables.nat.chains;
  const filter = r.tables.filter.chains;
  const client = CLIENT[familyOf(m)];
  for (const p of m.ports) {
    for (const f of p.frontends) {
      const what = `${p.key} via ${f.address}:${f.port}`;
      const reached = destinations(nat, newConnection(p, f, client));
      const noEp = walk(filter, 'PIER-NOENDPOINTS', undnatedConnection(lower(p), f.address, f.port, client));
      if (p.endpoints.length === 0) {
        expect(reached, what).toEqual([]);
        expect(noEp.verdict, what).toBe('REJECT');
        continue;
      }
      expect(noEp.verdict, what).toBe('CONTINUE');
      // Each endpoint is one branch of the spread, and nothing else is.
      expect(reached.map((d) => d.to).sort(), what).toEqual(p.endpoints.map((e) => dnatText(e.address, e.port)).sort());
      expect(reached.every((d) => d.marked === p.masquerade), `${what}: marked iff masquerade`).toBe(true);
      for (const d of reached) expect(Math.abs(d.chance - 1 / p.endpoints.length), `${what}: even spread`).toBeLessThan(1e-6);
      // ClientIP affinity: a client one endpoint's list remembers goes there, without a draw.
      for (const e of p.endpoints) {
        const back = destinations(nat, { ...newConnection(p, f, client), remembered: new Set([affinityListName(p, e)]) });
        expect(back.map((d) => d.to), `${what}: a client ${e.address} remembers`).toEqual(p.affinity > 0 ? [dnatText(e.address, e.port)] : reached.map((d) => d.to));
      }
      if (!p.masquerade) {
        // Hairpin: a pod reaching itself through the frontend is masqueraded.
        for (const e of p.endpoints) {
          expect(destinations(nat, newConnection(p, f, e.address)).every((d) => d.marked), `${what} hairpin from ${e.address}`).toBe(true);
        }
      }
      // nat marks the connection of a port any source may use: FORWARD accepts it by that mark.
      expect(reached.every((d) => (d.ctmark & MARKS.accept) === (p.restrictSources ? 0 : MARKS.accept)), `${what}: marked in nat iff unrestricted`).toBe(true);
      const fwd = walk(filter, 'PIER-FORWARD', { ...dnatedConnection(p, f, client), ctmark: reached[0]!.ctmark });
      // What FORWARD never sees (a client on the node, an endpoint on the
      // host network) meets the same ranges in PIER-SOURCES, which only drops.
      const local = walk(filter, 'PIER-SOURCES', dnatedConnection(p, f, client));
      // A connection accepted once is marked; its later packets, either way, meet one rule and no port's.
      expect(fwd.ctmark & MARKS.accept, `${what}: marked iff accepted`).toBe(fwd.verdict === 'ACCEPT' ? MARKS.accept : 0);
      const later = walk(filter, 'PIER-FORWARD', { ...dnatedConnection(p, f, client), ctmark: MARKS.accept });
      expect([later.verdict, later.rules], `${what}: a later packet`).toEqual(['ACCEPT', 1]);
      if (!p.restrictSources) {
        expect([fwd.verdict, fwd.rules], what).toEqual(['ACCEPT', 1]);
        expect(local.verdict, `${what}: no ranges, nothing to check`).toBe('CONTINUE');
      } else {
        expect(inAny(client, p.sourceRanges)).toBe(false);
        expect(fwd.verdict, `${what} from a stranger`).toBe('DROP');
        expect(local.verdict, `${what} from a stranger on the node`).toBe('DROP');
        for (const cidr of p.sourceRanges) {
          const inside = cidr.split('/')[0]!;
          expect(walk(filter, 'PIER-FORWARD', dnatedConnection(p, f, inside)).verdict, `${what} from ${inside}`).toBe('ACCEPT');
          expect(walk(filter, 'PIER-SOURCES', dnatedConnection(p, f, inside)).verdict, `${what} from ${inside} on the node`).toBe('CONTINUE');
        }
      }
      // A connection nobody DNATed leaves PIER-SOURCES at its first rule.
      expect(walk(filter, 'PIER-SOURCES', undnatedConnection(lower(p), f.address, f.port, client)).rules, what).toBe(1);
    }
  }
}

function checkStructure(r: Ruleset): void {
  for (const table of TABLES) {
    const { chains, jumps } = r.tables[table];
    expect(chains.get(CANARY_CHAIN)).toEqual([CANARY_RULE]);
    const referenced = new Set<string>();
    for (const [name, rules] of chains) {
      expect(name.startsWith('PIER-'), name).toBe(true);
      expect(name.length, name).toBeLessThanOrEqual(MAX_CHAIN_NAME);
      for (const rule of rules) {
        // A comment names a Service port, after the matches that pick the port.
        if (rule.includes('-m comment')) expect(rule, rule).toMatch(/-m comment --comment ("[A-Za-z0-9._:/-]{1,255}"|[A-Za-z0-9_-]{1,255}) /);
        expect(rule, rule).not.toMatch(/-m comment .*(--dport|-m conntrack|-m mark|-m connmark|-m statistic)/);
        // Every connection pier serves takes nat rules: none of them pays for a comment.
        if (table === 'nat' && name !== CANARY_CHAIN) expect(rule, rule).not.toContain('-m comment');
        const target = /(?:^| )-j (\S+)/.exec(rule)![1]!;
        if (target.startsWith('PIER-')) {
          expect(chains.has(target), `${rule} jumps to a chain that exists`).toBe(true);
          referenced.add(target);
        }
        if (table === 'nat') expect(target, `nat never drops: ${rule}`).not.toMatch(/^(DROP|REJECT)$/);
      }
    }
    for (const j of jumps) referenced.add(/(?:^| )-j (\S+)/.exec(j.rule)![1]!);
    // PIER-ACCEPT is there for the tree even when no port needs it yet.
    for (const name of chains.keys()) if (name !== CANARY_CHAIN && name !== ACCEPT_CHAIN) expect(referenced.has(name), `${name} is reachable`).toBe(true);
  }
}

describe('rule text', () => {
  it('prints probabilities as the kernel stores and iptables-save prints them', () => {
    expect(probability(2)).toBe('0.50000000000');
    expect(probability(3)).toBe('0.33333333349');
    expect(probability(10)).toBe('0.10000000009');
    // round(2^31 / 4096) = 2^19: exactly halfway between two 11-digit values, printed to even.
    expect(probability(4096)).toBe('0.00024414062');
  });

  it('quotes the way xtables_save_string does', () => {
    expect(saveString('abc_D-1')).toBe('abc_D-1');
    expect(saveString('shop/web:http')).toBe('"shop/web:http"');
    expect(saveString('a"b')).toBe('"a\\"b"');
  });

  it('names chains stably, under 28 characters, and without collisions', () => {
    expect(chainName('PIER-SVC-', 'x')).toBe(chainName('PIER-SVC-', 'x'));
    const names = new Set<string>();
    for (let i = 0; i < 20_000; i++) {
      const name = chainName('PIER-SVCS-', `ipv6/namespace-${i % 97}/service-${i}/port-${i % 13}/TCP`);
      expect(name).toMatch(/^PIER-SVCS-[A-Z2-7]{16}$/);
      expect(name.length).toBeLessThanOrEqual(28);
      names.add(name);
    }
    expect(names.size).toBe(20_000);
  });
});

describe('renderRuleset examples', () => {
  it('lays out a single-endpoint Cluster port without a chain of its own', () => {
    const r = render({ family: 'ipv4', ports: [served({ key: 'ipv4/shop/web/http/TCP', comment: 'shop/web:http' })] });
    expect([...r.tables.nat.chains]).toEqual([
      ['PIER-CANARY', [CANARY_RULE]],
      [
        'PIER-POSTROUTING',
        ['-m connmark --mark 0x1000/0x1000 -j MASQUERADE'],
      ],
      [
        'PIER-SERVICES',
        [
          '-d 192.0.2.11/32 -p tcp -m tcp --dport 80 -j CONNMARK --set-xmark 0x3000/0x3000',
          '-d 192.0.2.11/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 198.18.0.1:8080',
        ],
      ],
    ]);
    expect(r.tables.nat.jumps).toEqual([
      { chain: 'PREROUTING', rule: '-j PIER-SERVICES' },
      { chain: 'OUTPUT', rule: '-j PIER-SERVICES' },
      { chain: 'POSTROUTING', rule: '-j PIER-POSTROUTING' },
    ]);
    expect(r.tables.filter.chains.get('PIER-FORWARD')).toEqual([
      '-m connmark --mark 0x2000/0x2000 -j ACCEPT',
      '-m conntrack ! --ctstate DNAT -j RETURN',
    ]);
    expect(r.tables.filter.chains.get('PIER-ACCEPT')).toEqual([
      '-j CONNMARK --set-xmark 0x2000/0x2000',
      '-j ACCEPT',
    ]);
  });

  it('spreads over several endpoints with decreasing probabilities, IPv6 in brackets', () => {
    const endpoints = [1, 2, 3].map((i) => ({ address: `2001:db8:1::${i}`, port: 8080, local: false }));
    const r = render({ family: 'ipv6', ports: [served({ key: 'ipv6/shop/web/http/TCP', comment: 'shop/web:http', frontends: [{ address: '2001:db8::11', port: 443 }], endpoints })] });
    const rules = [...r.tables.nat.chains.values()].flat();
    expect(rules.filter((x) => x.includes('DNAT'))).toEqual([
      '-d 2001:db8::11/128 -p tcp -m tcp --dport 443 -m statistic --mode random --probability 0.33333333349 -j DNAT --to-destination [2001:db8:1::1]:8080',
      '-d 2001:db8::11/128 -p tcp -m tcp --dport 443 -m statistic --mode random --probability 0.50000000000 -j DNAT --to-destination [2001:db8:1::2]:8080',
      '-d 2001:db8::11/128 -p tcp -m tcp --dport 443 -j DNAT --to-destination [2001:db8:1::3]:8080',
    ]);
  });

  it('keeps a ClientIP client on its endpoint: a recent list per endpoint, checked before the spread', () => {
    const endpoints = [1, 2].map((i) => ({ address: `198.18.0.${i}`, port: 8080, local: false }));
    const p = served({ key: 'ipv4/shop/web/http/TCP', endpoints, affinity: 600 });
    const [a, b] = endpoints.map((e) => affinityListName(p, e));
    expect(a).toMatch(/^[A-Z2-7]{16}-PIER-AFF$/);
    // Five rules: more than sit in the tree's root, so in a range chain, which matches no address.
    const head = '-p tcp -m tcp --dport 80';
    const mask = '--mask 255.255.255.255 --rsource';
    expect([...render({ family: 'ipv4', ports: [p] }).tables.nat.chains.values()].flat().filter((x) => x.startsWith(head))).toEqual([
      `${head} -j CONNMARK --set-xmark 0x3000/0x3000`,
      `${head} -m recent --update --seconds 600 --reap --name ${a} ${mask} -j DNAT --to-destination 198.18.0.1:8080`,
      `${head} -m recent --update --seconds 600 --reap --name ${b} ${mask} -j DNAT --to-destination 198.18.0.2:8080`,
      `${head} -m statistic --mode random --probability 0.50000000000 -m recent --set --name ${a} ${mask} -j DNAT --to-destination 198.18.0.1:8080`,
      `${head} -m recent --set --name ${b} ${mask} -j DNAT --to-destination 198.18.0.2:8080`,
    ]);
    const v6 = served({ key: 'ipv6/shop/web/http/TCP', frontends: [{ address: '2001:db8::11', port: 80 }], endpoints: [{ address: '2001:db8:1::1', port: 8080, local: true }], affinity: 10800 });
    expect(render({ family: 'ipv6', ports: [v6] }).tables.nat.chains.get('PIER-SERVICES')![2]).toBe(
      `-d 2001:db8::11/128 -p tcp -m tcp --dport 80 -m recent --set --name ${affinityListName(v6, v6.endpoints[0]!)} --mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff --rsource -j DNAT --to-destination [2001:db8:1::1]:8080`,
    );
  });

  it('gives a port with many endpoints its own PIER-SVC chain', () => {
    const endpoints = Array.from({ length: 12 }, (_, i) => ({ address: `198.18.0.${i + 1}`, port: 8080, local: false }));
    const r = render({ family: 'ipv4', ports: [served({ key: 'ipv4/shop/web/http/TCP', endpoints })] });
    const svc = [...r.tables.nat.chains.keys()].filter((c) => c.startsWith('PIER-SVC-'));
    expect(svc).toEqual([chainName('PIER-SVC-', 'svc|ipv4/shop/web/http/TCP')]);
    // The connection mark, a DNAT per endpoint.
    expect(r.tables.nat.chains.get(svc[0]!)).toHaveLength(13);
  });

  it('marks only hairpin traffic for Local, and filters sources in a chain of its own when the list is long', () => {
    const ranges = ['198.51.100.0/24', '203.0.113.0/25', '203.0.113.128/26', '203.0.113.192/27', '203.0.113.224/28', '203.0.113.240/29', '203.0.113.248/30', '203.0.113.252/31'];
    const p = served({ key: 'ipv4/shop/db/pg/TCP', comment: 'shop/db:pg', masquerade: false, sourceRanges: ranges, restrictSources: true });
    const r = render({ family: 'ipv4', ports: [p] });
    expect(r.tables.nat.chains.get('PIER-SERVICES')).toEqual([
      '-s 198.18.0.1/32 -d 192.0.2.11/32 -p tcp -m tcp --dport 80 -j CONNMARK --set-xmark 0x1000/0x1000',
      '-d 192.0.2.11/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 198.18.0.1:8080',
    ]);
    const src = chainName('PIER-SRC-', 'src|ipv4/shop/db/pg/TCP');
    expect(r.tables.filter.chains.get(src)).toEqual([
      ...ranges.map((c) => `-m conntrack --ctorigsrc ${c} -m comment --comment "shop/db:pg" -j PIER-ACCEPT`),
      '-m comment --comment "shop/db:pg" -j DROP',
    ]);
    const local = chainName('PIER-LSRC-', 'lsrc|ipv4/shop/db/pg/TCP');
    expect(r.tables.filter.chains.get(local)).toEqual([
      ...ranges.map((c) => `-m conntrack --ctorigsrc ${c} -m comment --comment "shop/db:pg" -j RETURN`),
      '-m comment --comment "shop/db:pg" -j DROP',
    ]);
    checkBehaviour({ family: 'ipv4', ports: [p] }, r);
  });

  it('rejects frontends without endpoints in the filter table only: TCP with a reset, the others with ICMP', () => {
    const udp = served({ key: 'ipv4/shop/web/http/UDP', protocol: 'UDP', endpoints: [] });
    const tcp = served({ key: 'ipv4/shop/web/http/TCP', protocol: 'TCP', frontends: [{ address: '192.0.2.11', port: 81 }], endpoints: [] });
    const r = render({ family: 'ipv4', ports: [udp, tcp] });
    expect(r.tables.nat.chains.get('PIER-SERVICES')).toEqual([]);
    expect(r.tables.filter.chains.get('PIER-NOENDPOINTS')).toEqual([
      '-d 192.0.2.11/32 -p tcp -m tcp --dport 81 -m comment --comment "shop/web:p" -j REJECT --reject-with tcp-reset',
      '-d 192.0.2.11/32 -p udp -m udp --dport 80 -m comment --comment "shop/web:p" -j REJECT --reject-with icmp-port-unreachable',
    ]);
    const v6 = served({ key: 'ipv6/shop/web/http/UDP', protocol: 'UDP', frontends: [{ address: '2001:db8::11', port: 80 }], endpoints: [] });
    expect(render({ family: 'ipv6', ports: [v6] }).tables.filter.chains.get('PIER-NOENDPOINTS')).toEqual([
      '-d 2001:db8::11/128 -p udp -m udp --dport 80 -m comment --comment "shop/web:p" -j REJECT --reject-with icmp6-port-unreachable',
    ]);
  });

  it('refuses marks that are no single bit, or one bit for both', () => {
    expect(() => renderRuleset({ family: 'ipv4', ports: [] }, { marks: { accept: 0, masquerade: 0x1000 } })).toThrow(RangeError);
    expect(() => renderRuleset({ family: 'ipv4', ports: [] }, { marks: { accept: 0x3000, masquerade: 0x4000 } })).toThrow(RangeError);
    expect(() => renderRuleset({ family: 'ipv4', ports: [] }, { marks: { accept: 0x2000, masquerade: 0x2000 } })).toThrow(/both 0x2000/);
  });

  it('a port with source ranges and Cluster policy is marked for masquerade only; bit 31 prints unsigned', () => {
    const p = served({ key: 'ipv4/shop/db/pg/TCP', comment: 'shop/db:pg', sourceRanges: ['198.51.100.0/24'], restrictSources: true });
    const r = renderRuleset({ family: 'ipv4', ports: [p] }, { marks: { accept: 0x80000000, masquerade: 0x1 } });
    expect(r.tables.nat.chains.get('PIER-SERVICES')![0]).toBe('-d 192.0.2.11/32 -p tcp -m tcp --dport 80 -j CONNMARK --set-xmark 0x1/0x1');
    expect(r.tables.filter.chains.get('PIER-FORWARD')![0]).toBe('-m connmark --mark 0x80000000/0x80000000 -j ACCEPT');
    expect(r.tables.nat.chains.get('PIER-POSTROUTING')).toEqual(['-m connmark --mark 0x1/0x1 -j MASQUERADE']);
  });
});

describe('renderRuleset properties', () => {
  const families = (w: World) => {
    const m = buildModel(toInput(w));
    return [m.ipv4, m.ipv6];
  };

  it('sends every frontend to exactly its endpoints, and filters and rejects as the model says', () => {
    fc.assert(
      fc.property(worldArb, (world) => {
        for (const m of families(world)) {
          const r = render(m);
          checkStructure(r);
          checkBehaviour(m, r);
          // A port without affinity pays nothing for it.
          const recent = TABLES.some((t) => [...r.tables[t].chains.values()].some((rules) => rules.some((x) => x.includes('-m recent'))));
          expect(recent).toBe(m.ports.some((p) => p.affinity > 0 && p.endpoints.length > 0));
        }
      }),
      { numRuns: 200 },
    );
  });

  it('leaves alone what it does not serve: errored ports, foreign classes, other nodes\' addresses', () => {
    let checked = 0;
    fc.assert(
      fc.property(worldArb, (world) => {
        const [v4, v6] = families(world).map(render) as [Ruleset, Ruleset];
        for (const s of world.services) {
          s.ingress.forEach((ip, i) => {
            s.ports.forEach((p, j) => {
              if (s.cls === 'pier.dev/lb' && !s.errors[i]?.[j] && !ip.endsWith('21')) return;
              const proto = p.protocol.toLowerCase() as Packet['proto'];
              const r = ip.includes(':') ? v6 : v4;
              const client = ip.includes(':') ? CLIENT.ipv6 : CLIENT.ipv4;
              expect(destinations(r.tables.nat.chains, { src: client, dst: ip, proto, dport: s.external[j]! })).toEqual([]);
              const pkt = undnatedConnection(proto, ip, s.external[j]!, client);
              expect(walk(r.tables.filter.chains, 'PIER-NOENDPOINTS', pkt).verdict).toBe('CONTINUE');
              expect(walk(r.tables.filter.chains, 'PIER-FORWARD', { ...pkt, ct: { ...pkt.ct!, dnat: true } }).verdict).toBe('CONTINUE');
              expect(walk(r.tables.filter.chains, 'PIER-SOURCES', { ...pkt, ct: { ...pkt.ct!, dnat: true } }).verdict).toBe('CONTINUE');
              checked++;
            });
          });
        }
      }),
      { numRuns: 200 },
    );
    expect(checked).toBeGreaterThan(100);
  });

  it('is deterministic and independent of the order of ports, frontends and endpoints', () => {
    fc.assert(
      fc.property(worldArb, fc.integer({ min: 1 }), (world, seed) => {
        for (const m of families(world)) {
          const r = render(m);
          expect(render(structuredClone(m))).toEqual(r);
          const rev = <T>(a: T[]) => (seed % 2 === 0 ? [...a].reverse() : [...a.slice(1), ...a.slice(0, 1)]);
          const mixed: FamilyModel = { family: m.family, ports: rev(m.ports).map((p) => ({ ...p, endpoints: rev(p.endpoints), frontends: rev(p.frontends) })) };
          expect(render(mixed)).toEqual(r);
        }
      }),
      { numRuns: 150 },
    );
  });

  it('keeps every other Service\'s traffic where it was when one Service is broken', () => {
    fc.assert(
      fc.property(worldArb, corruptionArb, (world, c) => {
        const clean = buildModel(toInput(world));
        const input = toInput(world);
        const victim = corrupt(world, input, c);
        fc.pre(victim !== undefined);
        const broken = buildModel(input);
        for (const family of ['ipv4', 'ipv6'] as const) {
          const others = { family, ports: clean[family].ports.filter((p) => !p.key.includes(`/${victim}/`)) };
          // The others' behaviour, checked against the ruleset rendered with the broken Service in it.
          checkBehaviour(others, render(broken[family]));
        }
      }),
      { numRuns: 200 },
    );
  });
});

describe('scale', () => {
  // 10,000 single-endpoint ports on one address, scattered over the port
  // space: the shape that needs the most tree chains per rule.
  function bigModel(endpointsPerPort: number, seed: number): FamilyModel {
    const ports: ServedPort[] = [];
    const used = new Set<number>();
    let s = seed;
    for (let i = 0; ports.length < 10_000; i++) {
      s = (Math.imul(s, 1103515245) + 12345) & 0x7fffffff;
      const port = 1 + (s % 65535);
      if (used.has(port)) continue;
      used.add(port);
      ports.push(
        served({
          key: `ipv4/ns/s${i}/p/TCP`,
          comment: `ns/s${i}:p`,
          frontends: [{ address: '192.0.2.11', port }],
          endpoints: Array.from({ length: endpointsPerPort }, (_, k) => ({ address: `198.18.${(i >> 8) & 255}.${(i + k) & 255}`, port: 8080, local: true })),
          masquerade: i % 3 !== 0,
        }),
      );
    }
    return { family: 'ipv4', ports };
  }

  for (const eps of [1, 3]) {
    it(`keeps a new connection to a few dozen rules and the chains under two thousand for 10,000 ports (${eps} endpoint(s) each)`, () => {
      const m = bigModel(eps, 7 + eps);
      const r = render(m);
      const nat = r.tables.nat.chains;
      let worst = 0;
      let worstFwd = 0;
      for (const p of m.ports) {
        const f = p.frontends[0]!;
        const w = walk(nat, 'PIER-SERVICES', newConnection(p, f, CLIENT.ipv4));
        expect(w.verdict).toBe('DNAT');
        worst = Math.max(worst, w.rules);
        worstFwd = Math.max(worstFwd, walk(r.tables.filter.chains, 'PIER-FORWARD', { ...dnatedConnection(p, f, CLIENT.ipv4), ctmark: w.ctmark }).rules);
      }
      expect(worst).toBeLessThanOrEqual(70);
      expect(worstFwd).toBeLessThanOrEqual(70);
      // The filter table holds trees for restricted ports only; nat a rule more per port for the connection mark.
      expect(nat.size + r.tables.filter.chains.size).toBeLessThan(eps === 1 ? 1800 : 3200);
      expect(r.tables.filter.chains.size).toBeLessThan(700);
      checkStructure(r);
    });
  }

  it('rewrites only the chains on a changed port\'s path', () => {
    const m = bigModel(1, 3);
    const before = render(m);
    const changed = { ...m, ports: m.ports.map((p, i) => (i === 5000 ? { ...p, endpoints: [{ address: '198.18.255.1', port: 9090, local: true }] } : p)) };
    const after = render(changed);
    let differ = 0;
    for (const [name, rules] of after.tables.nat.chains) if (JSON.stringify(before.tables.nat.chains.get(name)) !== JSON.stringify(rules)) differ++;
    expect(differ).toBe(1);
    expect([...after.tables.nat.chains.keys()]).toEqual([...before.tables.nat.chains.keys()]);
  });
});
