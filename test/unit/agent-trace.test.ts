// `pier trace`'s decision (agent/trace.ts): a packet walked through the
// rendered ruleset, on hand-made Services for each case it explains, and on
// generated worlds against the model it was rendered from. The command
// itself runs once per exit code. test/e2e/trace.test.ts holds the answers
// equal to real packets.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { execa } from 'execa';
import fc from 'fast-check';
import { afterAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { inCidr } from '../../agent/iptables/interp.ts';
import type { ServedPort } from '../../agent/engine/model.ts';
import { parseFrontend, trace, traceWorld, TraceUsageError, verdictText, type TracePacket, type TraceWorld } from '../../agent/iptables/trace.ts';
import { endpointSlice, lbService, node } from '../support/objects.ts';
import { CLIENT, MARKS, NODE_V4, NODE_V6, toInput, worldArb } from './agent-fixtures.ts';

const NS = 'shop';
const N1 = { v4: '192.0.2.11', v6: '2001:db8::11' };
const OUTSIDE = '198.51.100.7';
const INSIDE = '203.0.113.9';

interface Pod {
  v4: string;
  v6: string;
  node: string;
}
const pods: Pod[] = [
  { v4: '198.18.1.10', v6: '2001:db8:1:1::10', node: 'n1' },
  { v4: '198.18.1.11', v6: '2001:db8:1:1::11', node: 'n1' },
  { v4: '198.18.2.10', v6: '2001:db8:1:2::10', node: 'n2' },
];

function service(name: string, port: number, eps: Pod[], extra: Partial<NonNullable<V1Service['spec']>> = {}, opts: { error?: string; protocol?: 'TCP' | 'UDP' } = {}) {
  const protocol = opts.protocol ?? 'TCP';
  const svc = lbService(NS, name, [{ name: 'http', port, protocol }], extra);
  svc.status = {
    loadBalancer: { ingress: [N1.v4, N1.v6].map((ip) => ({ ip, ipMode: 'Proxy', ports: [{ port, protocol, ...(opts.error ? { error: opts.error } : {}) }] })) },
  };
  const slices: V1EndpointSlice[] = (['v4', 'v6'] as const).map((f) =>
    endpointSlice(NS, name, f === 'v4' ? 'IPv4' : 'IPv6', eps.map((p) => ({ address: p[f], nodeName: p.node })), [{ name: 'http', port: 8080, protocol }]),
  );
  return { svc, slices };
}

const parts = [
  service('web', 80, pods),
  service('dns', 53, pods, {}, { protocol: 'UDP' }),
  service('local', 81, pods, { externalTrafficPolicy: 'Local' }),
  service('ranged', 83, pods, { loadBalancerSourceRanges: ['203.0.113.0/24', '2001:db8:ffff::/48'] }),
  // More ranges than fit inline: the check moves to a chain of the port's own.
  service('many-ranges', 87, pods, { loadBalancerSourceRanges: Array.from({ length: 9 }, (_, i) => `203.0.113.${i * 16}/28`) }),
  service('empty', 84, []),
  service('errored', 85, pods, {}, { error: 'PortConflict' }),
  service('foreign', 86, pods, { loadBalancerClass: 'other.dev/lb' }),
  service('classless', 88, pods, { loadBalancerClass: undefined }),
  // An endpoint on the host network: the node's own address.
  service('host', 89, [{ v4: N1.v4, v6: N1.v6, node: 'n1' }], { loadBalancerSourceRanges: ['203.0.113.0/24'] }),
  // Ten endpoints: their rules move to a PIER-SVC- chain of the port's own.
  service('sticky', 91, pods, { sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 600 } } }),
  service('big', 90, Array.from({ length: 10 }, (_, i) => ({ v4: `198.18.3.${i + 1}`, v6: `2001:db8:1:3::${i + 1}`, node: 'n2' }))),
];

const world: TraceWorld = traceWorld({
  nodeName: 'n1',
  nodeAddresses: [N1.v4, N1.v6],
  services: parts.map((p) => p.svc),
  slices: parts.flatMap((p) => p.slices),
  config: { loadBalancerClass: 'pier.dev/lb', defaultClass: false, maxPortsPerService: 256 },
  marks: MARKS,
});

const tcp = (client: string, address: string, port: number, more: Partial<TracePacket> = {}): TracePacket => ({ client, address, port, protocol: 'TCP', ...more });
const lastHop = (hops: { chain: string; rule: string }[]) => hops.at(-1)!;

describe('trace', () => {
  it('Cluster: DNAT spread evenly over every endpoint, masqueraded, accepted in PIER-FORWARD', () => {
    const v = trace(world, tcp(OUTSIDE, N1.v4, 80));
    expect(v.outcome).toBe('delivered');
    expect(v.service).toBe('shop/web:http');
    expect(v.fromNode).toBe(false);
    expect(v.hops[0]).toEqual({ table: 'nat', chain: 'PREROUTING', rule: '-j PIER-SERVICES' });
    expect(v.endpoints.map((e) => [e.address, e.local])).toEqual(pods.map((p) => [p.v4, p.node === 'n1']));
    for (const e of v.endpoints) {
      expect(e.probability).toBeCloseTo(1 / 3, 8);
      expect(e).toMatchObject({ outcome: 'delivered', via: 'FORWARD', masqueraded: true, sourceSeen: { kind: 'node', node: 'n1' } });
      expect(e.hops[0]!.rule).toContain(`-j DNAT --to-destination ${e.address}:8080`);
      // Many frontends on one address: the nat tree has chains of their own below PIER-SERVICES.
      const chains = e.hops.map((h) => `${h.table} ${h.chain.replace(/-[A-Z2-7]{16}$/, '-*')}`);
      expect(chains).toEqual(['nat PIER-SVCS-*', 'filter FORWARD', 'filter PIER-FORWARD', 'nat POSTROUTING', 'nat PIER-POSTROUTING']);
      // Any source may use the port: nat marked the connection, and FORWARD accepts it by that mark.
      expect(e.hops[2]!.rule).toMatch(/^-m connmark --mark 0x2000\/0x2000 .*-j ACCEPT$/);
      expect(lastHop(e.hops).rule).toMatch(/-j MASQUERADE$/);
    }
    expect(v.hops.filter((h) => h.table === 'nat' && /--dport 80 .*-j CONNMARK --set-xmark 0x3000\/0x3000$/.test(h.rule))).toHaveLength(1);
    expect(v.problems).toEqual([]);
  });

  it('IPv6 and UDP take the same path with their own rules', () => {
    const v = trace(world, { client: '2001:db8:ffff::7', address: N1.v6, port: 53, protocol: 'UDP' });
    expect(v).toMatchObject({ outcome: 'delivered', family: 'ipv6', frontend: '[2001:db8::11]:53/UDP', service: 'shop/dns:http' });
    expect(v.endpoints.map((e) => e.address)).toEqual(pods.map((p) => p.v6));
    expect(v.endpoints[0]!.hops[0]!.rule).toContain('-p udp');
    expect(v.endpoints[0]!.hops[0]!.rule).toContain(`-j DNAT --to-destination [${pods[0]!.v6}]:8080`);
  });

  it('many endpoints: a chain of their own, the same effective probabilities', () => {
    const v = trace(world, tcp(OUTSIDE, N1.v4, 90));
    expect(v.outcome).toBe('delivered');
    expect(v.endpoints).toHaveLength(10);
    for (const e of v.endpoints) expect(e.probability).toBeCloseTo(0.1, 8);
    expect(v.endpoints.reduce((s, e) => s + e.probability, 0)).toBeCloseTo(1, 9);
    expect(lastHop(v.hops)).toMatchObject({ chain: expect.stringMatching(/^PIER-SVC-/) });
    expect(lastHop(v.hops).rule).toMatch(/-j CONNMARK --set-xmark 0x3000\/0x3000$/);
    expect(v.endpoints[0]!.hops[0]!.chain).toMatch(/^PIER-SVC-/);
  });

  it('Local: only this node\'s endpoints, the client\'s address kept; a pod reaching itself is masqueraded', () => {
    const v = trace(world, tcp(OUTSIDE, N1.v4, 81));
    expect(v.outcome).toBe('delivered');
    expect(v.endpoints.map((e) => e.address)).toEqual([pods[0]!.v4, pods[1]!.v4]);
    for (const e of v.endpoints) {
      expect(e.probability).toBeCloseTo(0.5, 8);
      expect(e).toMatchObject({ local: true, masqueraded: false, sourceSeen: { kind: 'client', address: OUTSIDE } });
    }
    expect(v.reason).toContain(`the endpoint sees the client ${OUTSIDE}`);

    const hairpin = trace(world, tcp(pods[0]!.v4, N1.v4, 81));
    expect(hairpin.fromNode).toBe(false);
    // The mark comes before the spread: whichever pod answers, the reply must come back through this node.
    expect(hairpin.hops.at(-1)!.rule).toMatch(new RegExp(`^-s ${pods[0]!.v4}/32 .* -j CONNMARK --set-xmark 0x1000/0x1000$`));
    for (const e of hairpin.endpoints) expect(e).toMatchObject({ masqueraded: true, sourceSeen: { kind: 'node', node: 'n1' } });
  });

  it('a client on the node: nat OUTPUT, and filter OUTPUT instead of FORWARD', () => {
    for (const packet of [tcp(N1.v4, N1.v4, 80), tcp('198.18.1.1', N1.v4, 80, { fromNode: true })]) {
      const v = trace(world, packet);
      expect(v.fromNode).toBe(true);
      expect(v.outcome).toBe('delivered');
      expect(v.hops[0]!.chain).toBe('OUTPUT');
      for (const e of v.endpoints) expect(e.via).toBe('OUTPUT');
    }
    const local = trace(world, tcp(N1.v6, N1.v6, 81));
    expect(local.endpoints.every((e) => e.sourceSeen.kind === 'client' && e.sourceSeen.address === N1.v6)).toBe(true);
  });

  it('source ranges: admitted inside; outside dropped in PIER-FORWARD, or PIER-SOURCES for a client on the node', () => {
    const inside = trace(world, tcp(INSIDE, N1.v4, 83));
    expect(inside.outcome).toBe('delivered');
    const admitted = inside.endpoints[0]!.hops.filter((h) => h.table === 'filter');
    expect(admitted.at(-3)!.rule).toMatch(/--ctorigsrc 203\.0\.113\.0\/24 .*-j PIER-ACCEPT$/);
    expect(lastHop(admitted)).toMatchObject({ chain: 'PIER-ACCEPT', rule: expect.stringMatching(/-j ACCEPT$/) });

    const outside = trace(world, tcp(OUTSIDE, N1.v4, 83));
    expect(outside.outcome).toBe('dropped');
    expect(outside.reason).toMatch(/dropped in PIER-FWD-[A-Z2-7]{16} \(from PIER-FORWARD\): 198\.51\.100\.7 is not in the Service's source ranges \(203\.0\.113\.0\/24\)$/);
    for (const e of outside.endpoints) {
      expect(e.outcome).toBe('dropped');
      expect(lastHop(e.hops).chain).toMatch(/^PIER-FWD-/);
      expect(lastHop(e.hops).rule).toMatch(/-j DROP$/);
    }

    const own = trace(world, tcp(N1.v4, N1.v4, 83));
    expect(own.outcome).toBe('dropped');
    expect(own.reason).toMatch(/dropped in PIER-SRCS-[A-Z2-7]{16} \(from PIER-SOURCES\)/);

    const v6 = trace(world, tcp('2001:db8:ffff:1::1', N1.v6, 83));
    expect(v6.outcome).toBe('delivered');
    expect(trace(world, tcp('2001:db8:fffe::1', N1.v6, 83)).outcome).toBe('dropped');
  });

  it('a long range list is checked in the port\'s own chain, and the drop is named there', () => {
    expect(trace(world, tcp('203.0.113.129', N1.v4, 87)).outcome).toBe('delivered');
    const v = trace(world, tcp('203.0.113.250', N1.v4, 87));
    expect(v.outcome).toBe('dropped');
    expect(v.reason).toMatch(/dropped in PIER-SRC-[A-Z2-7]{16} \(from PIER-FORWARD\)/);
  });

  it('an endpoint on the host network: the connection goes to INPUT, where the ranges are checked', () => {
    const inside = trace(world, tcp(INSIDE, N1.v4, 89));
    expect(inside.outcome).toBe('delivered');
    expect(inside.endpoints[0]).toMatchObject({ address: N1.v4, via: 'INPUT' });
    const outside = trace(world, tcp(OUTSIDE, N1.v4, 89));
    expect(outside.outcome).toBe('dropped');
    expect(outside.reason).toMatch(/dropped in PIER-SRCS-[A-Z2-7]{16} \(from PIER-SOURCES\)/);
  });

  it('ClientIP affinity: a new client is spread as usual, and the text says a returning one goes back', () => {
    const v = trace(world, tcp(OUTSIDE, N1.v4, 91));
    expect(v.affinity).toBe(600);
    expect(v.endpoints.map((e) => e.probability.toFixed(3))).toEqual(['0.333', '0.333', '0.333']);
    expect(v.endpoints.every((e) => e.hops.some((h) => / -m recent --set --name \S+-PIER-AFF .* -j DNAT /.test(h.rule)))).toBe(true);
    expect(verdictText(v)).toContain('session affinity ClientIP: a client seen within 600 s goes back to the endpoint it used last');
    expect(trace(world, tcp(OUTSIDE, N1.v4, 80)).affinity).toBeUndefined();
  });

  it('no endpoints: REJECT in PIER-NOENDPOINTS', () => {
    const v = trace(world, tcp(OUTSIDE, N1.v4, 84));
    expect(v.outcome).toBe('rejected');
    expect(v.endpoints).toEqual([]);
    expect(lastHop(v.hops)).toMatchObject({ table: 'filter', chain: 'PIER-NOENDPOINTS' });
    expect(lastHop(v.hops).rule).toContain('-j REJECT --reject-with tcp-reset');
    expect(v.reason).toContain('shop/empty:http has no usable endpoint');
    // From the node, the same REJECT in OUTPUT.
    expect(lastHop(trace(world, tcp(N1.v4, N1.v4, 84)).hops).chain).toBe('PIER-NOENDPOINTS');
  });

  it('no rule: says why from the Services (an error in status, a foreign class, no class), else that the host gets it', () => {
    const errored = trace(world, tcp(OUTSIDE, N1.v4, 85));
    expect(errored.outcome).toBe('unserved');
    expect(errored.reason).toContain('Service shop/errored port http has the error "PortConflict" in its status for 192.0.2.11');
    expect(trace(world, tcp(OUTSIDE, N1.v4, 86)).reason).toContain('loadBalancerClass "other.dev/lb", not pier\'s (pier.dev/lb)');
    expect(trace(world, tcp(OUTSIDE, N1.v4, 88)).reason).toContain('names no loadBalancerClass, and pier serves those only with --default-class');
    // The right port on the wrong protocol is no frontend either.
    expect(trace(world, { ...tcp(OUTSIDE, N1.v4, 80), protocol: 'UDP' }).reason).toBe('pier has no rule for this; the packet goes to the host');
    const nothing = trace(world, tcp(OUTSIDE, N1.v4, 9999));
    expect(nothing).toMatchObject({ outcome: 'unserved', reason: 'pier has no rule for this; the packet goes to the host', endpoints: [] });
    expect(trace(world, tcp(OUTSIDE, '192.0.2.99', 80)).reason).toBe('pier has no rule for this: 192.0.2.99 is not an address of node n1 (192.0.2.11)');
  });

  it('names the agent\'s problems with the Service that claims the frontend', () => {
    const { svc, slices } = service('skewed', 80, pods);
    svc.status!.loadBalancer!.ingress![0]!.ports![0]!.protocol = 'UDP';
    const w = traceWorld({ nodeName: 'n1', nodeAddresses: [N1.v4], services: [svc], slices, config: world.config, marks: MARKS });
    const v = trace(w, { ...tcp(OUTSIDE, N1.v4, 80), protocol: 'UDP' });
    expect(v.outcome).toBe('unserved');
    expect(v.reason).toContain('StatusPortMismatch');
    expect(v.problems.map((p) => p.reason)).toEqual(['StatusPortMismatch']);
  });

  it('names an unnamed port by its number and protocol, not its index', () => {
    const { svc, slices } = service('plain', 80, pods, { loadBalancerClass: undefined });
    delete svc.spec!.ports![0]!.name;
    for (const s of slices) delete s.ports![0]!.name;
    const w = traceWorld({ nodeName: 'n1', nodeAddresses: [N1.v4], services: [svc], slices, config: world.config, marks: MARKS });
    const v = trace(w, tcp(OUTSIDE, N1.v4, 80));
    expect(v.reason).toContain('Service shop/plain port 80/TCP names no loadBalancerClass');
    expect(v.reason).not.toContain('port 0');
    // Served (pier the default), a problem of that port is named the same way.
    svc.status!.loadBalancer!.ingress![0]!.ports![0]!.protocol = 'UDP';
    const served = traceWorld({ nodeName: 'n1', nodeAddresses: [N1.v4], services: [svc], slices, config: { ...world.config, defaultClass: true }, marks: MARKS });
    const skewed = trace(served, { ...tcp(OUTSIDE, N1.v4, 80), protocol: 'UDP' });
    expect(skewed.problems).toMatchObject([{ service: 'shop/plain', port: '80/TCP', reason: 'StatusPortMismatch' }]);
    expect(verdictText(skewed)).toContain('note: shop/plain port 80/TCP: StatusPortMismatch: Service shop/plain port 80/TCP: status protocol "UDP"');
  });

  it('refuses a client and a frontend of different families', () => {
    expect(() => trace(world, tcp(OUTSIDE, N1.v6, 80))).toThrow(TraceUsageError);
    expect(() => trace(world, tcp('nonsense', N1.v4, 80))).toThrow(/not an IP address/);
  });

  it('prints the rules met, the endpoints with their chances, and the verdict', () => {
    const text = verdictText(trace(world, tcp(OUTSIDE, N1.v4, 81)));
    expect(text).toContain(`${OUTSIDE} -> 192.0.2.11:81/TCP on node n1\n`);
    expect(text).toContain('  nat PREROUTING: -j PIER-SERVICES\n');
    expect(text).toMatch(/ {4} 50\.0% {2}198\.18\.1\.10:8080, on this node\n/);
    expect(text).toContain(`then, whichever endpoint: delivered via FORWARD, source kept: the endpoint sees ${OUTSIDE}`);
    expect(text.trimEnd().split('\n').at(-1)).toMatch(/^delivered: shop\/local:http: DNAT to one of 2 endpoints/);
    expect(verdictText(trace(world, tcp(OUTSIDE, N1.v4, 84)))).toMatch(/\nrejected: shop\/empty:http has no usable endpoint/);
  });
});

describe('parseFrontend', () => {
  it('reads <address>:<port>/<proto>, IPv6 bracketed, TCP by default', () => {
    expect(parseFrontend('192.0.2.11:80/tcp')).toEqual({ address: '192.0.2.11', port: 80, protocol: 'TCP' });
    expect(parseFrontend('[2001:db8:0::11]:443/UDP')).toEqual({ address: '2001:db8::11', port: 443, protocol: 'UDP' });
    expect(parseFrontend('192.0.2.11:5000')).toEqual({ address: '192.0.2.11', port: 5000, protocol: 'TCP' });
    expect(parseFrontend('192.0.2.11:36412/sctp').protocol).toBe('SCTP');
  });

  it('names what is wrong', () => {
    for (const [text, message] of [
      ['192.0.2.11', 'is not <address>:<port>'],
      ['2001:db8::11:80/tcp', 'is not <address>:<port>'],
      ['[192.0.2.11]:80/tcp', 'only IPv6 addresses go in brackets'],
      ['192.0.2.300:80/tcp', 'is not an IP address'],
      ['192.0.2.11:0/tcp', 'port 0 is not in 1-65535'],
      ['192.0.2.11:70000/tcp', 'port 70000 is not in 1-65535'],
      ['192.0.2.11:80/icmp', 'protocol icmp is not tcp, udp or sctp'],
    ] as const) {
      expect(() => parseFrontend(text), text).toThrow(message);
    }
  });
});

describe('trace on generated worlds agrees with the model', () => {
  it('every frontend: its endpoints and nothing else, evenly; masquerade as the policy says; ranges and REJECT as listed', () => {
    fc.assert(
      fc.property(worldArb, (w) => {
        const input = toInput(w);
        const tw = traceWorld({ ...input, marks: MARKS });
        for (const family of ['ipv4', 'ipv6'] as const) {
          for (const served of tw.model[family].ports) {
            for (const f of served.frontends) {
              const client = CLIENT[family];
              const v = trace(tw, { client, address: f.address, port: f.port, protocol: served.protocol });
              expect(v.service).toBe(served.comment);
              checkAgainstPlan(v, served, client);
              // A client inside the first listed range is admitted.
              if (served.restrictSources && served.sourceRanges.length > 0 && served.endpoints.length > 0) {
                const inside = served.sourceRanges[0]!.split('/')[0]!;
                if (![...NODE_V4, ...NODE_V6].includes(inside)) expect(trace(tw, { client: inside, address: f.address, port: f.port, protocol: served.protocol }).outcome).toBe('delivered');
              }
            }
          }
        }
      }),
      { numRuns: 60 },
    );
  });
});

function checkAgainstPlan(v: ReturnType<typeof trace>, served: ServedPort, client: string): void {
  if (served.endpoints.length === 0) {
    expect(v.outcome).toBe('rejected');
    return;
  }
  expect(v.endpoints.map((e) => `${e.address}:${e.port}`)).toEqual(served.endpoints.map((e) => `${e.address}:${e.port}`));
  for (const e of v.endpoints) expect(e.probability).toBeCloseTo(1 / served.endpoints.length, 6);
  const admitted = !served.restrictSources || served.sourceRanges.some((r) => inCidr(client, r));
  expect(v.outcome).toBe(admitted ? 'delivered' : 'dropped');
  if (admitted) for (const e of v.endpoints) expect(e.masqueraded).toBe(served.masquerade);
}

describe('pier trace (the command)', () => {
  const cli = fileURLToPath(new URL('../../cmd/cli.ts', import.meta.url));
  const dir = mkdtempSync(join(tmpdir(), 'pier-trace-unit-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const items = [node('n1', [{ type: 'InternalIP', address: N1.v4 }, { type: 'InternalIP', address: N1.v6 }]), ...parts.flatMap((p) => [p.svc, ...p.slices])];
  writeFileSync(join(dir, 'all.yaml'), items.map((x) => stringify(x)).join('---\n'));
  const pier = (...args: string[]) => execa(process.execPath, [cli, 'trace', ...args], { reject: false });

  it('exits 0 when delivered, 1 when not, 2 on usage errors; -o json is the verdict', async () => {
    const ok = await pier(INSIDE, `${N1.v4}:83/tcp`, '--node', 'n1', '-f', dir);
    expect(ok.exitCode).toBe(0);
    expect(ok.stdout).toContain('delivered: shop/ranged:http');
    const dropped = await pier(OUTSIDE, `${N1.v4}:83/tcp`, '--node', 'n1', '-f', dir, '-o', 'json');
    expect(dropped.exitCode).toBe(1);
    expect(JSON.parse(dropped.stdout)).toEqual(JSON.parse(JSON.stringify(trace(world, tcp(OUTSIDE, N1.v4, 83)))));
    const usage = await pier(OUTSIDE, '--node', 'n1', '-f', dir);
    expect(usage.exitCode).toBe(2);
    expect(usage.stderr).toContain('CLIENT and FRONTEND are required');
    const family = await pier(OUTSIDE, `[${N1.v6}]:80/tcp`, '--node', 'n1', '-f', dir);
    expect(family.exitCode).toBe(2);
    expect(family.stderr).toContain('different address families');
    // It walks the iptables rules: a --backend it would not follow is refused.
    const backend = await pier(INSIDE, `${N1.v4}:83/tcp`, '--node', 'n1', '-f', dir, '--backend', 'nftables');
    expect(backend.exitCode).toBe(2);
    expect(backend.stderr).toContain('unknown option --backend');
    const noNode = await pier(OUTSIDE, `${N1.v4}:80/tcp`, '--node', 'n9', '-f', dir);
    expect(noNode.exitCode).toBe(1);
    expect(noNode.stderr).toContain('no Node named "n9" (Nodes found: n1)');
  });

  it('reads manifests as pier plan does: a Service without status first gets the controller\'s allocation', async () => {
    const fresh = mkdtempSync(join(tmpdir(), 'pier-trace-unit-'));
    try {
      const { svc, slices } = service('fresh', 8081, pods);
      delete svc.status;
      const objects = [node('n1', [{ type: 'InternalIP', address: N1.v4 }]), svc, ...slices];
      writeFileSync(join(fresh, 'all.yaml'), objects.map((x) => stringify(x)).join('---\n'));
      writeFileSync(join(fresh, 'broken.yaml'), 'kind: Service\nmetadata: [\n');
      const r = await pier(OUTSIDE, `${N1.v4}:8081/tcp`, '--node', 'n1', '-f', fresh);
      expect(r.stderr).toContain('pier trace: skipped');
      expect(r.stderr).toContain('broken.yaml');
      expect(r.stderr).toContain('shop/fresh: allocated (no status in the manifests)');
      expect(r.stdout).toContain('delivered: shop/fresh:http');
      expect(r.exitCode).toBe(0);
    } finally {
      rmSync(fresh, { recursive: true, force: true });
    }
  });
});
