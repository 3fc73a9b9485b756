// The agent's model: which Service ports this node serves, where they point,
// and what is wrong with the ones it cannot serve.
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { isIPv4 } from 'node:net';
import { ipv4Value } from '../../lib/address.ts';
import { compareAddresses, formatAddress, parseAddress, parseCidr, sanitizeComment, type ModelInput, type ServedPort } from '../../agent/engine/model.ts';
import { CLASS, CONFIG, NODE, NODE_V4, NODE_V6, corrupt, corruptionArb, endpointAddress, toInput, worldArb, type World } from './agent-fixtures.ts';
import { buildModel } from '../support/oracle.ts';

function service(name: string, over: { spec?: Partial<NonNullable<V1Service['spec']>>; ingress?: NonNullable<NonNullable<V1Service['status']>['loadBalancer']>['ingress']; annotations?: Record<string, string>; created?: string } = {}): V1Service {
  return {
    metadata: { namespace: 'shop', name, creationTimestamp: new Date(over.created ?? '2024-01-01T00:00:00Z'), ...(over.annotations ? { annotations: over.annotations } : {}) },
    spec: { type: 'LoadBalancer', loadBalancerClass: CLASS, ports: [{ name: 'http', port: 80, protocol: 'TCP' }], ...over.spec },
    status: { loadBalancer: { ingress: over.ingress ?? [{ ip: '192.0.2.11', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }] }] } },
  };
}

function slice(svc: string, endpoints: NonNullable<V1EndpointSlice['endpoints']>, over: Partial<V1EndpointSlice> = {}): V1EndpointSlice {
  return {
    metadata: { namespace: 'shop', name: `${svc}-${Math.abs(hash(JSON.stringify(endpoints)))}`, labels: { 'kubernetes.io/service-name': svc } },
    addressType: 'IPv4',
    ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
    endpoints,
    ...over,
  };
}

function hash(s: string): number {
  let h = 0;
  for (const c of s) h = (h * 31 + c.charCodeAt(0)) | 0;
  return h;
}

function input(services: V1Service[], slices: V1EndpointSlice[], over: Partial<ModelInput> = {}): ModelInput {
  return { nodeName: NODE, nodeAddresses: [...NODE_V4, ...NODE_V6], services, slices, config: CONFIG, ...over };
}

const ready = (ip: string, nodeName = NODE) => ({ addresses: [ip], nodeName, conditions: { ready: true } });

describe('addresses', () => {
  it('prints IPv6 the way inet_ntop (and so iptables-save) does', () => {
    const cases: [string, string][] = [
      ['2001:DB8:0:0:0:0:0:1', '2001:db8::1'],
      ['2001:db8:0:1:0:0:1:1', '2001:db8:0:1::1:1'],
      ['2001:0:0:1:0:0:1:1', '2001::1:0:0:1:1'], // the first of two equal runs
      ['2001:db8:1:1:1:1:0:1', '2001:db8:1:1:1:1:0:1'], // a single zero group stays
      ['::ffff:192.0.2.1', '::ffff:192.0.2.1'],
      ['::1.2.3.4', '::1.2.3.4'],
      ['::1', '::1'],
      ['::', '::'],
      ['1::', '1::'],
      ['2001:db8::', '2001:db8::'],
    ];
    for (const [input, want] of cases) expect(parseAddress(input)?.text, input).toBe(want);
  });

  it('rejects what is not a plain address', () => {
    for (const bad of ['', 'bogus', '192.0.2.01', '192.0.2.1 ', '256.0.0.1', 'fe80::1%eth0', '1::2::3', '198.18.0.1/32', '1.2.3']) {
      expect(parseAddress(bad), bad).toBeUndefined();
    }
  });

  it('reads a dotted quad in place exactly as node:net accepts it, with its value', () => {
    const quadChars = fc.array(fc.constantFrom('0', '1', '2', '5', '9', '.', '.', 'x', ':'), { maxLength: 17 }).map((cs) => cs.join(''));
    const octet = fc.integer({ min: 0, max: 255 });
    const quad = fc.tuple(octet, octet, octet, octet);
    fc.assert(
      fc.property(fc.oneof(quadChars, quad.map((q) => q.join('.')), fc.string()), (text) => {
        const v = ipv4Value(text);
        expect(v >= 0, text).toBe(isIPv4(text));
        if (v >= 0) expect(v).toBe(text.split('.').reduce((acc, o) => acc * 256 + Number(o), 0));
      }),
      { numRuns: 2000 },
    );
    for (const bad of ['01.2.3.4', '1.2.3.', '.1.2.3', '1..2.3', '1.2.3.4.5', '256.1.1.1', '1.2.3.4 ', '1.2.3.1000']) expect(ipv4Value(bad), bad).toBe(-1);
  });

  it('orders addresses numerically, IPv4 before IPv6, anything else last by text', () => {
    const v4 = fc.tuple(fc.integer({ min: 0, max: 255 }), fc.integer({ min: 0, max: 255 })).map(([a, b]) => `198.${a}.${b}.1`);
    const v6 = fc.tuple(fc.integer({ min: 0, max: 0xffff }), fc.integer({ min: 0, max: 0xffff })).map(([a, b]) => formatAddress('ipv6', (0x20010db8n << 96n) | (BigInt(a) << 16n) | BigInt(b)));
    const rank = (t: string) => {
      const p = parseAddress(t);
      return p ? [p.family === 'ipv4' ? 0 : 1, p.value] as const : ([2, 0n] as const);
    };
    fc.assert(
      fc.property(fc.oneof(v4, v6, fc.constantFrom('bogus', 'zz', '')), fc.oneof(v4, v6, fc.constantFrom('bogus', 'zz', '')), (a, b) => {
        const [fa, va] = rank(a);
        const [fb, vb] = rank(b);
        const want = fa !== fb ? Math.sign(fa - fb) : fa === 2 ? (a < b ? -1 : a > b ? 1 : 0) : va < vb ? -1 : va > vb ? 1 : 0;
        expect(Math.sign(compareAddresses(a, b)), `${a} vs ${b}`).toBe(want);
      }),
    );
  });

  it('normalises CIDRs: host bits zeroed, bare addresses become host routes', () => {
    expect(parseCidr('198.51.100.77/24')?.text).toBe('198.51.100.0/24');
    expect(parseCidr('198.51.100.77')?.text).toBe('198.51.100.77/32');
    expect(parseCidr('2001:db8:1:2::5/48')?.text).toBe('2001:db8:1::/48');
    expect(parseCidr('2001:db8::5')?.text).toBe('2001:db8::5/128');
    for (const bad of ['198.51.100.0/33', '2001:db8::/129', '198.51.100.0/', '198.51.100.0/x', 'x/24']) expect(parseCidr(bad), bad).toBeUndefined();
  });

  it('round-trips every IPv6 value through its text', () => {
    fc.assert(
      fc.property(fc.array(fc.constantFrom(0, 0, 0, 1, 0xffff, 0xdb8), { minLength: 8, maxLength: 8 }), (words) => {
        const value = words.reduce((acc, w) => (acc << 16n) | BigInt(w), 0n);
        const text = formatAddress('ipv6', value);
        expect(parseAddress(text)?.value).toBe(value);
        expect(parseAddress(text)?.text).toBe(text);
      }),
    );
  });

  it('sanitises comments to what iptables accepts, at most 255 characters', () => {
    expect(sanitizeComment('shop/web:http')).toBe('shop/web:http');
    expect(sanitizeComment('a b"c\\d\'e')).toBe('a_b_c_d_e');
    expect(sanitizeComment('x'.repeat(300))).toHaveLength(255);
  });
});

describe('buildModel examples', () => {
  it('serves a Cluster Service on this node with its ready endpoints', () => {
    const m = buildModel(input([service('web')], [slice('web', [ready('198.18.0.1'), ready('198.18.0.2', 'n2'), { addresses: ['198.18.0.3'], conditions: { ready: false } }])]));
    expect(m.problems).toEqual([]);
    expect(m.ipv6.ports).toEqual([]);
    expect(m.ipv4.ports).toEqual<ServedPort[]>([
      {
        key: 'ipv4/shop/web/http/TCP',
        comment: 'shop/web:http',
        protocol: 'TCP',
        frontends: [{ address: '192.0.2.11', port: 80 }],
        endpoints: [
          { address: '198.18.0.1', port: 8080, local: true },
          { address: '198.18.0.2', port: 8080, local: false },
        ],
        // Listed but not ready: no new connection goes there; one already made is left alone.
        retained: [{ address: '198.18.0.3', port: 8080, local: false }],
        sourceRanges: [],
        restrictSources: false,
        masquerade: true,
        affinity: 0,
      },
    ]);
  });

  it('ignores Services of other classes, without a class, or of another type, silently', () => {
    const services = [
      service('other', { spec: { loadBalancerClass: 'other.dev/lb' } }),
      service('none', { spec: { loadBalancerClass: undefined } }),
      service('nodeport', { spec: { type: 'NodePort' } }),
    ];
    const m = buildModel(input(services, []));
    expect(m).toEqual({ ipv4: { family: 'ipv4', ports: [] }, ipv6: { family: 'ipv6', ports: [] }, problems: [] });
    const asDefault = buildModel(input(services, [], { config: { ...CONFIG, defaultClass: true } }));
    expect(asDefault.ipv4.ports.map((p) => p.key)).toEqual(['ipv4/shop/none/http/TCP']);
  });

  it('serves only ingress addresses of this node and only status ports without an error', () => {
    const svc = service('dns', {
      spec: { ports: [{ name: 'udp', port: 53, protocol: 'UDP' }, { name: 'tcp', port: 53, protocol: 'TCP' }] },
      ingress: [
        { ip: '192.0.2.11', ipMode: 'Proxy', ports: [{ port: 53, protocol: 'UDP' }, { port: 53, protocol: 'TCP', error: 'PortConflict' }] },
        { ip: '2001:db8:0::11', ipMode: 'Proxy', ports: [{ port: 5353, protocol: 'UDP' }, { port: 53, protocol: 'TCP' }] },
        { ip: '192.0.2.21', ipMode: 'Proxy', ports: [{ port: 53, protocol: 'UDP' }, { port: 53, protocol: 'TCP' }] },
      ],
    });
    const m = buildModel(input([svc], []));
    expect(m.problems).toEqual([]);
    expect(m.ipv4.ports.map((p) => [p.key, p.frontends])).toEqual([['ipv4/shop/dns/udp/UDP', [{ address: '192.0.2.11', port: 53 }]]]);
    expect(m.ipv6.ports.map((p) => [p.key, p.frontends])).toEqual([
      ['ipv6/shop/dns/tcp/TCP', [{ address: '2001:db8::11', port: 53 }]],
      ['ipv6/shop/dns/udp/UDP', [{ address: '2001:db8::11', port: 5353 }]],
    ]);
  });

  it('with Local keeps this node\'s endpoints, falls back to serving terminating ones, and skips FQDN slices', () => {
    const svc = service('web', { spec: { externalTrafficPolicy: 'Local' } });
    const slices = [
      slice('web', [ready('198.18.0.9', 'n2'), { addresses: ['198.18.0.1'], nodeName: NODE, conditions: { ready: false, serving: true, terminating: true } }, { addresses: ['198.18.0.2'], nodeName: NODE, conditions: { ready: false, serving: false, terminating: true } }]),
      slice('web', [{ addresses: ['db.example.com'] }], { addressType: 'FQDN' }),
    ];
    const served = buildModel(input([svc], slices)).ipv4.ports[0]!;
    expect(served.masquerade).toBe(false);
    expect(served.endpoints).toEqual([{ address: '198.18.0.1', port: 8080, local: true }]);
    // The rest stay listed: the other node's ready one and the one that stopped serving keep their connections.
    expect(served.retained).toEqual([
      { address: '198.18.0.2', port: 8080, local: true },
      { address: '198.18.0.9', port: 8080, local: false },
    ]);
  });

  it('deduplicates an endpoint listed by two slices and splits endpoints by their address family', () => {
    const svc = service('web', { ingress: [{ ip: '192.0.2.11', ports: [{ port: 80, protocol: 'TCP' }] }, { ip: '2001:db8::11', ports: [{ port: 80, protocol: 'TCP' }] }] });
    const slices = [slice('web', [ready('198.18.0.1'), ready('2001:db8:1::1')]), slice('web', [ready('198.18.0.1'), ready('2001:DB8:1:0::1')], { addressType: 'IPv6' })];
    const m = buildModel(input([svc], slices));
    expect(m.ipv4.ports[0]!.endpoints).toEqual([{ address: '198.18.0.1', port: 8080, local: true }]);
    expect(m.ipv6.ports[0]!.endpoints).toEqual([{ address: '2001:db8:1::1', port: 8080, local: true }]);
  });

  it('matches the target port by name and protocol', () => {
    const svc = service('web', {
      spec: { ports: [{ name: 'a', port: 80, protocol: 'TCP' }, { name: 'b', port: 81, protocol: 'UDP' }] },
      ingress: [{ ip: '192.0.2.11', ports: [{ port: 80, protocol: 'TCP' }, { port: 81, protocol: 'UDP' }] }],
    });
    const sl = slice('web', [ready('198.18.0.1')], { ports: [{ name: 'b', port: 9001, protocol: 'UDP' }, { name: 'a', port: 9000, protocol: 'TCP' }, { name: 'a', port: 9999, protocol: 'UDP' }] });
    const ports = buildModel(input([svc], [sl])).ipv4.ports;
    expect(ports.map((p) => [p.key, p.endpoints.map((e) => e.port)])).toEqual([
      ['ipv4/shop/web/a/TCP', [9000]],
      ['ipv4/shop/web/b/UDP', [9001]],
    ]);
  });

  it('reads source ranges from the spec, else from the annotation, normalised and split by family', () => {
    const spec = buildModel(input([service('a', { spec: { loadBalancerSourceRanges: ['203.0.113.77/24', '2001:db8:5::1/48', '198.51.100.1'] }, ingress: [{ ip: '192.0.2.11', ports: [{ port: 80, protocol: 'TCP' }] }, { ip: '2001:db8::11', ports: [{ port: 80, protocol: 'TCP' }] }] })], []));
    expect(spec.ipv4.ports[0]).toMatchObject({ sourceRanges: ['198.51.100.1/32', '203.0.113.0/24'], restrictSources: true });
    expect(spec.ipv6.ports[0]).toMatchObject({ sourceRanges: ['2001:db8:5::/48'], restrictSources: true });

    const ann = buildModel(input([service('a', { annotations: { 'service.beta.kubernetes.io/load-balancer-source-ranges': ' 203.0.113.0/24 ,198.51.100.0/24,' } })], []));
    expect(ann.ipv4.ports[0]).toMatchObject({ sourceRanges: ['198.51.100.0/24', '203.0.113.0/24'], restrictSources: true });
  });

  it('closes a family the allow list does not mention, and opens one it lists as /0', () => {
    const m = buildModel(input([service('a', { spec: { loadBalancerSourceRanges: ['0.0.0.0/0'] }, ingress: [{ ip: '192.0.2.11', ports: [{ port: 80, protocol: 'TCP' }] }, { ip: '2001:db8::11', ports: [{ port: 80, protocol: 'TCP' }] }] })], []));
    expect(m.ipv4.ports[0]).toMatchObject({ sourceRanges: [], restrictSources: false });
    expect(m.ipv6.ports[0]).toMatchObject({ sourceRanges: [], restrictSources: true });
  });
});

describe('buildModel bad input', () => {
  const good = service('good', { ingress: [{ ip: '192.0.2.11', ipMode: 'Proxy', ports: [{ port: 8000, protocol: 'TCP' }] }] });
  const goodSlice = slice('good', [ready('198.18.0.50')]);
  const goodPlans = buildModel(input([good], [goodSlice])).ipv4.ports;

  const cases: { name: string; svc: V1Service; slices?: V1EndpointSlice[]; reason: string; mentions: string; served?: string[] }[] = [
    { name: 'an invalid source range skips the Service', svc: service('bad', { spec: { loadBalancerSourceRanges: ['203.0.113.0/24', '203.0.113.0/33'] } }), reason: 'InvalidSourceRange', mentions: '203.0.113.0/33', served: [] },
    { name: 'an invalid annotation range skips the Service', svc: service('bad', { annotations: { 'service.beta.kubernetes.io/load-balancer-source-ranges': '203.0.113.0/24,everyone' } }), reason: 'InvalidSourceRange', mentions: 'everyone', served: [] },
    { name: 'a malformed endpoint address skips that endpoint', svc: service('bad'), slices: [slice('bad', [ready('198.18.0.300'), ready('198.18.0.7')])], reason: 'InvalidEndpointAddress', mentions: '198.18.0.300', served: ['ipv4/shop/bad/http/TCP'] },
    {
      name: 'a slice port of another protocol leaves the port without endpoints, rejected',
      svc: service('bad'),
      slices: [slice('bad', [ready('198.18.0.7')], { ports: [{ name: 'http', port: 8080, protocol: 'UDP' }] })],
      reason: 'EndpointProtocolMismatch',
      mentions: 'as UDP, not TCP',
      served: ['ipv4/shop/bad/http/TCP'],
    },
    { name: 'an endpoint port out of range skips the slice', svc: service('bad'), slices: [slice('bad', [ready('198.18.0.7')], { ports: [{ name: 'http', port: 70000, protocol: 'TCP' }] })], reason: 'InvalidEndpointPort', mentions: '70000', served: ['ipv4/shop/bad/http/TCP'] },
    {
      name: 'an unknown protocol skips that port',
      svc: service('bad', { spec: { ports: [{ name: 'icmp', port: 1, protocol: 'ICMP' }, { name: 'http', port: 80, protocol: 'TCP' }] }, ingress: [{ ip: '192.0.2.11', ports: [{ port: 1, protocol: 'ICMP' }, { port: 81, protocol: 'TCP' }] }] }),
      reason: 'UnsupportedProtocol',
      mentions: 'ICMP',
      served: ['ipv4/shop/bad/http/TCP'],
    },
    { name: 'too many ports skip the Service', svc: service('bad', { spec: { ports: Array.from({ length: 7 }, (_, i) => ({ name: `p${i}`, port: 100 + i, protocol: 'TCP' })) } }), reason: 'TooManyPorts', mentions: '7 ports', served: [] },
    { name: 'a missing status port skips that port there', svc: service('bad', { ingress: [{ ip: '192.0.2.11', ports: [] }] }), reason: 'StatusPortMissing', mentions: '192.0.2.11', served: [] },
    { name: 'a status port out of range skips that port there', svc: service('bad', { ingress: [{ ip: '192.0.2.11', ports: [{ port: 0, protocol: 'TCP' }] }] }), reason: 'StatusPortInvalid', mentions: 'status port 0', served: [] },
    { name: 'a status protocol that differs skips that port there', svc: service('bad', { ingress: [{ ip: '192.0.2.11', ports: [{ port: 81, protocol: 'UDP' }] }] }), reason: 'StatusPortMismatch', mentions: 'UDP', served: [] },
    { name: 'a younger Service claiming a served frontend loses it', svc: service('bad', { created: '2025-01-01T00:00:00Z', ingress: [{ ip: '192.0.2.11', ports: [{ port: 8000, protocol: 'TCP' }] }] }), reason: 'FrontendConflict', mentions: 'shop/good', served: [] },
    {
      name: 'a Service that fails to read halfway is skipped whole',
      svc: service('bad', {
        spec: {
          ports: [
            { name: 'http', port: 80, protocol: 'TCP' },
            {
              get name(): string {
                throw new Error('unreadable port');
              },
              port: 81,
            },
          ],
        },
        ingress: [{ ip: '192.0.2.11', ports: [{ port: 80, protocol: 'TCP' }, { port: 81, protocol: 'TCP' }] }],
      }),
      reason: 'InvalidService',
      mentions: 'unreadable port',
      served: [],
    },
    { name: 'a Service whose fields have the wrong types is skipped', svc: { ...service('bad'), spec: { type: 'LoadBalancer', loadBalancerClass: CLASS, ports: 'http' as never } }, reason: 'InvalidService', mentions: 'shop/bad', served: [] },
  ];

  for (const c of cases) {
    it(`${c.name}, reports it, and leaves other Services alone`, () => {
      const m = buildModel(input([good, c.svc], [goodSlice, ...(c.slices ?? [])]));
      const problem = m.problems.find((p) => p.service === 'shop/bad');
      expect(problem, JSON.stringify(m.problems)).toMatchObject({ reason: c.reason });
      expect(problem!.message).toContain(c.mentions);
      expect(problem!.message).toContain('shop/bad');
      expect(m.problems.every((p) => p.service === 'shop/bad')).toBe(true);
      expect(m.ipv4.ports.filter((p) => p.key.includes('/good/'))).toEqual(goodPlans);
      expect(m.ipv4.ports.filter((p) => p.key.includes('/bad/')).map((p) => p.key)).toEqual(c.served);
    });
  }

  it('never throws, whatever the objects hold', () => {
    const junk = fc.anything({ maxDepth: 4 });
    fc.assert(
      fc.property(fc.array(junk, { maxLength: 4 }), fc.array(junk, { maxLength: 4 }), (services, slices) => {
        const withShape = services.map((s, i) => (i % 2 === 0 && typeof s === 'object' && s !== null ? { ...service(`j${i}`), spec: { ...(s as object), type: 'LoadBalancer', loadBalancerClass: CLASS } } : s));
        const m = buildModel(input([good, ...(withShape as V1Service[])], [goodSlice, ...(slices as V1EndpointSlice[])]));
        expect(m.ipv4.ports.filter((p) => p.key.includes('/good/'))).toEqual(goodPlans);
      }),
      { numRuns: 300 },
    );
  });
});

// ---------------------------------------------------------------------------
// Properties over generated worlds

/** What the model should say about a world, computed straight from the generator's terms. */
function expected(world: World) {
  const out = new Map<string, { frontends: string[]; endpoints: string[]; retained: string[]; masquerade: boolean; affinity: number; restrict: boolean; ranges: string[] }>();
  const here = new Map([...NODE_V4, ...NODE_V6].map((a) => [a, parseAddress(a)!.text]));
  for (const s of world.services) {
    if (s.cls !== CLASS) continue;
    const ranges = s.ranges.map((r) => parseCidr(r)!);
    s.ports.forEach((p, j) => {
      for (const family of ['ipv4', 'ipv6'] as const) {
        const frontends = s.ingress.flatMap((ip, i) => (here.has(ip) && parseAddress(ip)!.family === family && !s.errors[i]?.[j] ? [`${here.get(ip)}:${s.external[j]}`] : []));
        if (frontends.length === 0) continue;
        const mine = s.endpoints.filter((e) => (e.v6 ? 'ipv6' : 'ipv4') === family && (!s.local || e.node === NODE));
        const readyOnes = mine.filter((e) => e.ready !== false);
        const chosen = readyOnes.length > 0 ? readyOnes : mine.filter((e) => e.serving === true && e.terminating === true);
        const key = (e: (typeof mine)[number]) => `${parseAddress(endpointAddress(e))!.text}:${p.targetPort}`;
        const chosenKeys = new Set(chosen.map(key));
        // Every other endpoint of the family the slices list, whatever its node or condition.
        const listed = s.endpoints.filter((e) => (e.v6 ? 'ipv6' : 'ipv4') === family).map(key);
        const open = ranges.some((r) => r.family === family && r.prefix === 0);
        const restrict = ranges.length > 0 && !open;
        out.set(`${family}/${s.namespace}/${s.name}/${p.name || j}/${p.protocol}`, {
          frontends: [...new Set(frontends)].sort(),
          endpoints: [...chosenKeys].sort(),
          retained: [...new Set(listed.filter((k) => !chosenKeys.has(k)))].sort(),
          masquerade: !s.local,
          affinity: s.affinity === undefined ? 0 : s.affinity === 'default' ? 10800 : s.affinity,
          restrict,
          ranges: restrict ? [...new Set(ranges.filter((r) => r.family === family).map((r) => r.text))].sort() : [],
        });
      }
    });
  }
  return out;
}

function summary(servedPorts: ServedPort[]) {
  return new Map(
    servedPorts.map((p) => [
      p.key,
      {
        frontends: p.frontends.map((f) => `${f.address}:${f.port}`).sort(),
        endpoints: p.endpoints.map((e) => `${e.address}:${e.port}`).sort(),
        retained: p.retained.map((e) => `${e.address}:${e.port}`).sort(),
        masquerade: p.masquerade,
        affinity: p.affinity,
        restrict: p.restrictSources,
        ranges: [...p.sourceRanges].sort(),
      },
    ]),
  );
}

function shuffled<T>(list: T[], seed: number): T[] {
  const out = [...list];
  let s = seed || 1;
  for (let i = out.length - 1; i > 0; i--) {
    s = (Math.imul(s, 1103515245) + 12345) & 0x7fffffff;
    const j = s % (i + 1);
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

describe('buildModel properties', () => {
  it('serves exactly the non-errored ports of this node\'s ingress entries, with the endpoints the rules call for', () => {
    fc.assert(
      fc.property(worldArb, (world) => {
        const m = buildModel(toInput(world));
        expect(m.problems).toEqual([]);
        expect(new Map([...summary(m.ipv4.ports), ...summary(m.ipv6.ports)])).toEqual(expected(world));
        for (const p of m.ipv4.ports) for (const x of [...p.frontends, ...p.endpoints]) expect(x.address).not.toContain(':');
        for (const p of m.ipv6.ports) for (const x of [...p.frontends, ...p.endpoints]) expect(x.address).toContain(':');
        for (const p of [...m.ipv4.ports, ...m.ipv6.ports]) {
          if (!p.masquerade) expect(p.endpoints.every((e) => e.local)).toBe(true);
          expect(p.comment).toMatch(/^[A-Za-z0-9._:/-]{1,255}$/);
        }
      }),
      { numRuns: 200 },
    );
  });

  it('is deterministic and independent of the order objects arrive in', () => {
    fc.assert(
      fc.property(worldArb, fc.integer(), (world, seed) => {
        const base = toInput(world);
        const first = buildModel(base);
        expect(buildModel(toInput(world))).toEqual(first);
        const mixed: ModelInput = {
          ...base,
          nodeAddresses: shuffled(base.nodeAddresses, seed),
          services: shuffled(base.services, seed + 1),
          slices: shuffled(base.slices, seed + 2).map((s, i) => ({ ...s, endpoints: shuffled(s.endpoints ?? [], seed + i) })),
        };
        expect(buildModel(mixed)).toEqual(first);
      }),
      { numRuns: 150 },
    );
  });

  it('turns every kind of bad input into a Problem for that Service only', () => {
    const hits = new Map<string, number>();
    fc.assert(
      fc.property(worldArb, corruptionArb, (world, c) => {
        const clean = buildModel(toInput(world));
        const bad = toInput(world);
        const victim = corrupt(world, bad, c);
        fc.pre(victim !== undefined);
        hits.set(c.kind, (hits.get(c.kind) ?? 0) + 1);
        const m = buildModel(bad);
        const reasons = m.problems.filter((p) => p.service === victim).map((p) => p.reason);
        expect(reasons, JSON.stringify(m.problems)).toContain(c.kind);
        expect(m.problems.filter((p) => p.service !== victim)).toEqual([]);
        const others = (ports: ServedPort[]) => ports.filter((p) => !p.key.includes(`/${victim}/`));
        expect(others(m.ipv4.ports)).toEqual(others(clean.ipv4.ports));
        expect(others(m.ipv6.ports)).toEqual(others(clean.ipv6.ports));
      }),
      { numRuns: 300 },
    );
    // Every kind of corruption was tried, many times.
    expect([...hits.values()].every((n) => n >= 10) && hits.size === 7, JSON.stringify([...hits])).toBe(true);
  });
});
