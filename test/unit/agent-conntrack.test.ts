import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { deletionArgs, describeCheck, flowBaseline, frontendsToCheck, parseFlows, staleFlows, type FlowEntry, type FlowFrontend } from '../../agent/conntrack.ts';
import type { FamilyModel, ServedPort } from '../../agent/engine/model.ts';

function served(protocol: 'TCP' | 'UDP' | 'SCTP', frontends: [string, number][], endpoints: [string, number][], retained: [string, number][] = []): ServedPort {
  return {
    key: `ipv4/ns/s/${protocol}/${frontends.map((f) => f.join(':')).join(',')}`,
    comment: 'ns/s:dns',
    protocol,
    frontends: frontends.map(([address, port]) => ({ address, port })),
    endpoints: endpoints.map(([address, port]) => ({ address, port, local: true })),
    retained: retained.map(([address, port]) => ({ address, port, local: false })),
    sourceRanges: [],
    restrictSources: false,
    masquerade: true,
    affinity: 0,
  };
}

const model = (...ports: ServedPort[]): FamilyModel => ({ family: 'ipv4', ports });

describe('parseFlows', () => {
  it('reads the original destination and the reply source of UDP, SCTP and TCP entries, IPv4 and IPv6', () => {
    const text = [
      'udp      17 29 src=198.51.100.101 dst=198.51.100.11 sport=40530 dport=5300 [UNREPLIED] src=198.51.100.11 dst=198.51.100.101 sport=5300 dport=40530 mark=0 use=1',
      'udp      17 117 src=198.51.100.101 dst=198.51.100.11 sport=40531 dport=5300 src=198.19.1.5 dst=198.51.100.11 sport=8080 dport=40531 [ASSURED] mark=0 zone=3 use=1',
      'udp      17 29 src=2001:db8:0:1:0:0:0:101 dst=2001:db8:0:1::11 sport=1 dport=53 src=2001:db8:1:1::5 dst=2001:db8:0:1::101 sport=5353 dport=1 mark=0 use=1',
      'sctp     132 431999 ESTABLISHED src=198.51.100.101 dst=198.51.100.11 sport=9 dport=3868 src=198.19.2.5 dst=198.51.100.11 sport=3868 dport=9 [ASSURED] mark=0 use=1',
      'tcp      6 431999 ESTABLISHED src=198.51.100.101 dst=198.51.100.11 sport=9 dport=80 src=198.19.2.5 dst=198.51.100.11 sport=80 dport=9 [ASSURED] mark=0 use=1',
      'udp      17 29 src=not-an-address dst=198.51.100.11 sport=1 dport=53 src=198.51.100.11 dst=198.51.100.101 sport=53 dport=1',
      '',
    ].join('\n');
    expect(parseFlows(text)).toEqual([
      { protocol: 'UDP', origSrc: '198.51.100.101', origDst: '198.51.100.11', origSport: 40530, origDport: 5300, replySrc: '198.51.100.11', replySport: 5300 },
      { protocol: 'UDP', origSrc: '198.51.100.101', origDst: '198.51.100.11', origSport: 40531, origDport: 5300, replySrc: '198.19.1.5', replySport: 8080 },
      // Addresses come out in the canonical text the model uses.
      { protocol: 'UDP', origSrc: '2001:db8:0:1::101', origDst: '2001:db8:0:1::11', origSport: 1, origDport: 53, replySrc: '2001:db8:1:1::5', replySport: 5353 },
      { protocol: 'SCTP', origSrc: '198.51.100.101', origDst: '198.51.100.11', origSport: 9, origDport: 3868, replySrc: '198.19.2.5', replySport: 3868 },
      { protocol: 'TCP', origSrc: '198.51.100.101', origDst: '198.51.100.11', origSport: 9, origDport: 80, replySrc: '198.19.2.5', replySport: 80 },
    ]);
  });
});

describe('flowBaseline and frontendsToCheck', () => {
  const dns = served('UDP', [['198.51.100.11', 53], ['198.51.100.12', 53]], [['198.19.2.5', 5353], ['198.19.1.5', 5353]]);
  const web = served('TCP', [['198.51.100.11', 80]], [['198.19.1.5', 8080]], [['198.19.2.9', 8080]]);

  it('checks every frontend at first, with its endpoints, sorted, and (TCP only) the other endpoints its slices list; keeps TCP ports as they are', () => {
    const sctp = served('SCTP', [['198.51.100.11', 3868]], [], [['198.19.1.9', 3868]]);
    const baseline = flowBaseline(model(dns, web, sctp));
    expect([...baseline.tcp.values()]).toEqual([web]);
    expect([...baseline.tcp.values()][0]).toBe(web);
    expect(frontendsToCheck(undefined, baseline)).toEqual([
      { protocol: 'UDP', address: '198.51.100.11', port: 53, endpoints: ['198.19.1.5|5353', '198.19.2.5|5353'], retained: [] },
      { protocol: 'UDP', address: '198.51.100.12', port: 53, endpoints: ['198.19.1.5|5353', '198.19.2.5|5353'], retained: [] },
      { protocol: 'SCTP', address: '198.51.100.11', port: 3868, endpoints: [], retained: [] },
      { protocol: 'TCP', address: '198.51.100.11', port: 80, endpoints: ['198.19.1.5|8080'], retained: ['198.19.2.9|8080'] },
    ]);
  });

  it('checks every frontend when nothing was cleaned yet, and none when nothing changed', () => {
    const now = flowBaseline(model(dns, web));
    expect(frontendsToCheck(undefined, now)).toHaveLength(3);
    expect(frontendsToCheck(now, flowBaseline(model(dns, web)))).toEqual([]);
    // An equal plan rebuilt from scratch (a new object) changes nothing either.
    expect(frontendsToCheck(now, flowBaseline(model({ ...dns, endpoints: [...dns.endpoints].reverse() })))).toEqual([]);
  });

  it('makes the baseline of one model once; the same baseline twice checks nothing', () => {
    const m = model(dns, web);
    const baseline = flowBaseline(m);
    expect(flowBaseline(m)).toBe(baseline);
    expect(frontendsToCheck(baseline, baseline)).toEqual([]);
    expect(flowBaseline(model(dns, web))).not.toBe(baseline);
  });

  it('checks new frontends, frontends whose endpoints changed, and gone ones with no endpoint left', () => {
    const before = flowBaseline(model(dns));
    const moved = served('UDP', [['198.51.100.11', 53], ['198.51.100.13', 53]], [['198.19.1.5', 5353]]);
    const checks = frontendsToCheck(before, flowBaseline(model(moved)));
    expect(checks).toEqual([
      { protocol: 'UDP', address: '198.51.100.11', port: 53, endpoints: ['198.19.1.5|5353'], retained: [] },
      { protocol: 'UDP', address: '198.51.100.13', port: 53, endpoints: ['198.19.1.5|5353'], retained: [] },
      { protocol: 'UDP', address: '198.51.100.12', port: 53, endpoints: [], retained: [] },
    ]);
  });

  it('checks a TCP frontend only when an endpoint left its slices, not when one turned draining or came; never a gone one', () => {
    const before = flowBaseline(model(web));
    const tcp = (endpoints: [string, number][], retained: [string, number][] = []) => frontendsToCheck(before, flowBaseline(model(served('TCP', [['198.51.100.11', 80]], endpoints, retained))));
    // 198.19.1.5 draining (retained), a new pod ready: every flow may stay.
    expect(tcp([['198.19.1.7', 8080]], [['198.19.1.5', 8080], ['198.19.2.9', 8080]])).toEqual([]);
    // The not ready 198.19.2.9 left the slices: checked.
    expect(tcp([['198.19.1.5', 8080]])).toEqual([{ protocol: 'TCP', address: '198.51.100.11', port: 80, endpoints: ['198.19.1.5|8080'], retained: [] }]);
    // The ready one left: checked.
    expect(tcp([], [['198.19.2.9', 8080]])).toHaveLength(1);
    // The Service (or its address) left this node: its connections are not the agent's to end.
    expect(frontendsToCheck(before, flowBaseline(model()))).toEqual([]);
  });
});

describe('staleFlows', () => {
  const check: FlowFrontend = { protocol: 'UDP', address: '198.51.100.11', port: 53, endpoints: ['198.19.1.5|5353'], retained: [] };
  const entry = (sport: number, replySrc: string, replySport: number, over: Partial<FlowEntry> = {}): FlowEntry => ({
    protocol: 'UDP',
    origSrc: '198.51.100.101',
    origDst: '198.51.100.11',
    origSport: sport,
    origDport: 53,
    replySrc,
    replySport,
    ...over,
  });

  it('deletes un-NATed flows and flows to a removed endpoint, grouped by reply source; keeps flows to a current endpoint', () => {
    const entries = [
      entry(1000, '198.51.100.11', 53), // began before the DNAT existed
      entry(1001, '198.51.100.11', 53),
      entry(1002, '198.19.2.5', 5353), // pinned to a removed endpoint
      entry(1003, '198.19.1.5', 5353), // current: kept
      entry(1004, '198.19.1.5', 9999), // the endpoint's address, another port: stale
      entry(1005, '198.51.100.11', 54, { origDport: 54 }), // another frontend, not checked
      entry(1006, '198.51.100.11', 53, { protocol: 'SCTP' }), // another protocol
    ];
    expect(staleFlows(entries, [check])).toEqual([
      { protocol: 'UDP', address: '198.51.100.11', port: 53, replySrc: '198.51.100.11', replySport: 53, entries: 2 },
      { protocol: 'UDP', address: '198.51.100.11', port: 53, replySrc: '198.19.2.5', replySport: 5353, entries: 1 },
      { protocol: 'UDP', address: '198.51.100.11', port: 53, replySrc: '198.19.1.5', replySport: 9999, entries: 1 },
    ]);
  });

  it('TCP: deletes flows DNATed to an endpoint no longer listed; keeps those to a listed one (ready or retained) and un-NATed ones', () => {
    const tcp: FlowFrontend = { protocol: 'TCP', address: '198.51.100.11', port: 80, endpoints: ['198.19.1.7|8080'], retained: ['198.19.1.5|8080'] };
    const at = (sport: number, replySrc: string, replySport: number): FlowEntry => ({ protocol: 'TCP', origSrc: '198.51.100.101', origDst: '198.51.100.11', origSport: sport, origDport: 80, replySrc, replySport });
    const entries = [
      at(1000, '198.19.1.7', 8080), // ready: kept
      at(1001, '198.19.1.5', 8080), // draining: its pod's to end
      at(1002, '198.19.2.5', 8080), // gone from the slices: deleted
      at(1003, '198.19.2.5', 8080),
      at(1004, '198.51.100.11', 80), // the node's own (no DNAT): kept
    ];
    expect(staleFlows(entries, [tcp])).toEqual([{ protocol: 'TCP', address: '198.51.100.11', port: 80, replySrc: '198.19.2.5', replySport: 8080, entries: 2 }]);
  });

  it('never deletes a flow that leads to a current endpoint of its frontend, and only touches checked frontends', () => {
    const addr = fc.constantFrom('198.51.100.11', '198.51.100.12', '198.19.1.5', '198.19.2.5');
    const port = fc.constantFrom(53, 5353, 54);
    const proto = fc.constantFrom('UDP' as const, 'SCTP' as const, 'TCP' as const);
    const entryArb = fc.record({ protocol: proto, origSrc: fc.constant('198.51.100.101'), origDst: addr, origSport: fc.integer({ min: 1, max: 65535 }), origDport: port, replySrc: addr, replySport: port });
    const keysArb = fc.uniqueArray(fc.tuple(addr, port).map(([a, p]) => `${a}|${p}`)).map((e) => e.sort());
    const checkArb = fc.record({ protocol: proto, address: addr, port, endpoints: keysArb, retained: keysArb }).map((c) => (c.protocol === 'TCP' ? c : { ...c, retained: [] }));
    fc.assert(
      fc.property(fc.array(entryArb, { maxLength: 30 }), fc.uniqueArray(checkArb, { selector: (c) => `${c.protocol} ${c.address} ${c.port}`, maxLength: 5 }), (entries, checks) => {
        const deletions = staleFlows(entries, checks);
        const hit = (e: FlowEntry) => deletions.some((d) => d.protocol === e.protocol && d.address === e.origDst && d.port === e.origDport && d.replySrc === e.replySrc && d.replySport === e.replySport);
        for (const e of entries) {
          const c = checks.find((c) => c.protocol === e.protocol && c.address === e.origDst && c.port === e.origDport);
          const kept = c ? [...c.endpoints, ...c.retained].includes(`${e.replySrc}|${e.replySport}`) : false;
          const unNated = e.replySrc === e.origDst && e.replySport === e.origDport;
          expect(hit(e)).toBe(c !== undefined && !kept && !(e.protocol === 'TCP' && unNated));
        }
        expect(deletions.reduce((n, d) => n + d.entries, 0)).toBe(entries.filter(hit).length);
      }),
    );
  });
});

describe('deletionArgs and describeCheck', () => {
  it('names the frontend and the reply source exactly, so nothing else matches', () => {
    expect(deletionArgs('ipv6', { protocol: 'UDP', address: '2001:db8:0:1::11', port: 53, replySrc: '2001:db8:1:2::5', replySport: 5353, entries: 3 })).toEqual([
      '-D', '-f', 'ipv6', '-p', 'udp', '--orig-dst', '2001:db8:0:1::11', '--orig-port-dst', '53', '--reply-src', '2001:db8:1:2::5', '--reply-port-src', '5353',
    ]);
  });

  it('says what a check deletes, as a comment', () => {
    expect(describeCheck({ protocol: 'UDP', address: '2001:db8:0:1::11', port: 53, endpoints: ['2001:db8:1:2::5|5353', '2001:db8:1:3::5|5353'], retained: [] })).toBe(
      '# conntrack: delete the udp flows to [2001:db8:0:1::11]:53: those not DNATed to [2001:db8:1:2::5]:5353, [2001:db8:1:3::5]:5353\n',
    );
    expect(describeCheck({ protocol: 'SCTP', address: '198.51.100.11', port: 3868, endpoints: [], retained: [] })).toBe(
      '# conntrack: delete the sctp flows to 198.51.100.11:3868: every one of them (the frontend has no endpoint)\n',
    );
    expect(describeCheck({ protocol: 'TCP', address: '198.51.100.11', port: 80, endpoints: ['198.19.1.5|8080'], retained: ['198.19.2.9|8080'] })).toBe(
      '# conntrack: delete the tcp flows to 198.51.100.11:80: those DNATed to an endpoint its slices no longer list (kept: those to 198.19.1.5:8080, 198.19.2.9:8080)\n',
    );
  });
});
