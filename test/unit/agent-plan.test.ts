// `pier plan` offline: Services without a status get the controller's own
// allocation first, everything the plan leaves out is named, and of two
// objects with one name the later one read is used, as kubectl apply would.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { V1Lease, V1Service } from '@kubernetes/client-node';
import { execa } from 'execa';
import { afterAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { readManifestFiles } from '../../cmd/manifests.ts';
import { allocateOffline } from '../../cmd/offline.ts';
import { PLAN_SPEC } from '../../cmd/plan.ts';
import { allocate, DEFAULT_ALLOCATE_RANGE, DEFAULT_RESERVED_PORTS } from '../../controller/allocate.ts';
import { allocatorConfig, CONTROLLER_SPEC } from '../../cmd/controller.ts';
import { statusPatch } from '../../controller/status.ts';
import { parseConfig } from '../../lib/config.ts';
import { agentLeaseName, LEASE_FORWARDING_IPV4, LEASE_FORWARDING_IPV6 } from '../../lib/contract.ts';
import { endpointSlice, lbService, node } from '../support/objects.ts';

const CLI = fileURLToPath(new URL('../../cmd/cli.ts', import.meta.url));
const defaults = () => allocatorConfig(parseConfig(PLAN_SPEC.options, [], {}).values);

const n1 = node('n1', [{ type: 'InternalIP', address: '192.0.2.11' }, { type: 'InternalIP', address: '2001:db8::11' }]);
const n2 = { ...node('n2', [{ type: 'InternalIP', address: '192.0.2.12' }]), metadata: { name: 'n2', labels: { 'pier.dev/pool': 'edge' } } };
const web = lbService('shop', 'web', [{ name: 'http', port: 80 }, { name: 'dns', port: 53, protocol: 'UDP' }], { ipFamilies: ['IPv4', 'IPv6'] });
const webSlice = endpointSlice('shop', 'web', 'IPv4', [{ address: '198.18.0.5', nodeName: 'n1' }], [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }]);
const edge = { ...lbService('shop', 'edge', [{ name: 'http', port: 8080 }]), metadata: { namespace: 'shop', name: 'edge', annotations: { 'pier.dev/pool': 'edge' } } };
const ssh = lbService('shop', 'ssh', [{ name: 'ssh', port: 22 }]);
const other = lbService('shop', 'other', [{ name: 'http', port: 80 }], { loadBalancerClass: 'example.com/lb' });
const clusterIP: V1Service = { metadata: { namespace: 'default', name: 'kubernetes' }, spec: { type: 'ClusterIP', ports: [{ port: 443 }] } };

describe('allocateOffline', () => {
  const manifests = { nodes: [n1, n2], services: [web, edge, ssh, other, clusterIP], slices: [webSlice] };

  it('gives a Service without status exactly what the controller writes with healthy agents everywhere', () => {
    const { services } = allocateOffline(manifests, 'n1', defaults());
    // The controller's view of the same cluster, with real, freshly renewed Leases.
    const now = Date.now();
    const leases: V1Lease[] = ['n1', 'n2'].map((n) => ({
      metadata: { name: agentLeaseName(n), namespace: 'pier-system', annotations: { [LEASE_FORWARDING_IPV4]: 'true', [LEASE_FORWARDING_IPV6]: 'true' } },
      spec: { holderIdentity: n, renewTime: new Date(now) as never, leaseDurationSeconds: 20 },
    }));
    const controller = allocate({ ...manifests, leases, now, config: { loadBalancerClass: 'pier.dev/lb', defaultClass: false, defaultPool: 'default', agentNamespace: 'pier-system', reservedPorts: DEFAULT_RESERVED_PORTS, allocateRange: DEFAULT_ALLOCATE_RANGE, maxPortsPerService: 256 } });
    for (const svc of [web, edge, ssh]) {
      const key = `shop/${svc.metadata!.name}`;
      const written = statusPatch(svc, controller.services.get(key)!)!.status.loadBalancer!.ingress;
      expect(services.find((s) => s.metadata?.name === svc.metadata!.name)!.status?.loadBalancer?.ingress, key).toEqual(written);
    }
    expect(services.find((s) => s.metadata?.name === 'web')!.status?.loadBalancer?.ingress?.map((i) => i.ip)).toEqual(['192.0.2.11', '2001:db8::11']);
    // Not pier's: untouched.
    expect(services.find((s) => s.metadata?.name === 'other')).toBe(other);
  });

  it('names what it allocated and every Service it leaves out, with the reason', () => {
    const { notes } = allocateOffline(manifests, 'n1', defaults());
    expect(notes).toEqual(expect.arrayContaining([
      'shop/web: allocated (no status in the manifests): served on 192.0.2.11, 2001:db8::11, ports 80/TCP, 53/UDP',
      expect.stringMatching(/^shop\/ssh: allocated \(no status in the manifests\), but none of its ports can be served: PortReserved: .*22 is reserved/),
      'shop/edge: allocated (no status in the manifests): served on 192.0.2.12, port 8080/TCP',
      'shop/edge: not on node n1: it is in pool "default", not "edge"',
      'shop/other: left out: its loadBalancerClass "example.com/lb" is not pier.dev/lb',
      '1 Service not of type LoadBalancer left out',
    ]));
    expect(notes).toHaveLength(6);
  });

  it('keeps a status the manifests hold, and says when it is not for this node', () => {
    const withStatus = { ...web, status: { loadBalancer: { ingress: [{ ip: '192.0.2.12', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }, { port: 53, protocol: 'UDP' }] }] } } };
    const { services, notes } = allocateOffline({ nodes: [n1, n2], services: [withStatus], slices: [] }, 'n1', defaults());
    expect(services[0]).toBe(withStatus);
    expect(notes).toEqual(['shop/web: not on node n1: its status lists 192.0.2.12, none of them this node\'s']);

    const errored = { ...web, status: { loadBalancer: { ingress: [{ ip: '192.0.2.11', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP', error: 'PortConflict' }, { port: 53, protocol: 'UDP' }] }] } } };
    expect(allocateOffline({ nodes: [n1, n2], services: [errored], slices: [] }, 'n1', defaults()).notes).toEqual([
      'shop/web: its status marks ports not served on node n1: 80/TCP on 192.0.2.11 (PortConflict)',
    ]);
  });

  it('cannot serve what no node can: the controller\'s reason', () => {
    const notReady = node('n1', [{ type: 'InternalIP', address: '192.0.2.11' }], false);
    const { services, notes } = allocateOffline({ nodes: [notReady], services: [web], slices: [] }, 'n1', defaults());
    expect(services[0]!.status?.loadBalancer?.ingress).toEqual([]);
    expect(notes[0]).toMatch(/^shop\/web: cannot be served: NoEligibleNodes: no node can serve IPv4 in pool "default", .*not Ready/);
  });

  it("uses the controller's allocation flags, their names, defaults and checks", () => {
    for (const name of ['default-class', 'default-pool', 'reserved-ports', 'allocate-range', 'max-ports-per-service']) {
      const mine = PLAN_SPEC.options.find((o) => o.name === name);
      expect({ ...mine, env: undefined }, name).toEqual({ ...CONTROLLER_SPEC.options.find((o) => o.name === name), env: undefined });
    }
    const cfg = allocatorConfig(parseConfig(PLAN_SPEC.options, ['--reserved-ports=', '--allocate-range', '41000-41009', '--default-pool', 'edge'], {}).values);
    expect(cfg).toMatchObject({ reservedPorts: [], allocateRange: { from: 41000, to: 41009 }, defaultPool: 'edge' });
    expect(allocateOffline({ nodes: [n1], services: [ssh], slices: [] }, 'n1', { ...defaults(), reservedPorts: [] }).notes).toEqual(['shop/ssh: allocated (no status in the manifests): served on 192.0.2.11, port 22/TCP']);
  });
});

describe('readManifestFiles: each object once', () => {
  const dir = mkdtempSync(join(tmpdir(), 'pier-manifests-unit-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const write = (name: string, objects: object[]) => {
    const p = join(dir, name);
    mkdirSync(join(p, '..'), { recursive: true });
    writeFileSync(p, objects.map((o) => stringify(o)).join('---\n'));
    return p;
  };
  const web81 = lbService('shop', 'web', [{ name: 'http', port: 81 }]);

  it('keeps the later of two objects of one kind and name, where it was read, and names both', () => {
    const a = write('dup/a.yaml', [n1, web, webSlice, ssh]);
    const b = write('dup/b.json', []);
    writeFileSync(b, JSON.stringify({ kind: 'List', items: [web81, { ...webSlice, endpoints: [] }] }));
    const { manifests, errors, duplicates } = readManifestFiles([join(dir, 'dup')]);
    expect(errors).toEqual([]);
    const named = (list: { metadata?: { name?: string } }[]) => list.map((o) => o.metadata?.name);
    expect(named(manifests.services)).toEqual(['ssh', 'web']);
    expect(manifests.services[1]!.spec?.ports?.[0]?.port).toBe(81);
    expect(manifests.slices.map((s) => s.endpoints)).toEqual([[]]);
    expect(named(manifests.nodes)).toEqual(['n1']);
    expect(duplicates.map(({ message, ...d }) => d)).toEqual([
      { kind: 'Service', name: 'shop/web', kept: `${b}, items[0]`, dropped: `${a} (document 2)` },
      { kind: 'EndpointSlice', name: `shop/${webSlice.metadata!.name}`, kept: `${b}, items[1]`, dropped: `${a} (document 3)` },
    ]);
    expect(duplicates[0]!.message).toBe(`Service shop/web in ${a} (document 2) is read again in ${b}, items[0]: the later one is used, as kubectl apply would leave it`);
  });

  it('of three, keeps the last; a Node by its name; no namespace and an empty one are one', () => {
    const bare = (namespace: string | undefined, port: number) => ({ ...lbService('x', 'bare', [{ port }]), metadata: { name: 'bare', ...(namespace === undefined ? {} : { namespace }) } });
    const n1Again = { ...n1, status: { ...n1.status, addresses: [{ type: 'InternalIP', address: '192.0.2.99' }] } };
    const p = write('three.yaml', [web, n1, web81, n1Again, bare(undefined, 1), bare('', 2), lbService('shop', 'web', [{ name: 'http', port: 82 }])]);
    const { manifests, duplicates } = readManifestFiles([p]);
    expect(manifests.services.map((s) => [s.metadata?.name, s.spec?.ports?.[0]?.port])).toEqual([['bare', 2], ['web', 82]]);
    expect(manifests.nodes.map((n) => n.status?.addresses?.map((a) => a.address))).toEqual([['192.0.2.99']]);
    expect(duplicates.map((d) => [d.kind, d.name, d.dropped, d.kept])).toEqual([
      ['Node', 'n1', `${p} (document 2)`, `${p} (document 4)`],
      ['Service', 'shop/web', `${p} (document 1)`, `${p} (document 7)`],
      ['Service', 'shop/web', `${p} (document 3)`, `${p} (document 7)`],
      ['Service', '/bare', `${p} (document 5)`, `${p} (document 6)`],
    ]);
  });

  it('reads no name or namespace with "/" (the API server takes none): pier keys objects by namespace/name', () => {
    // Else shop + a/b and shop/a + b would be one Service to the agent.
    const slash = write('slash/a.yaml', [{ ...web, metadata: { namespace: 'shop', name: 'a/b' } }]);
    const slashNs = write('slash/b.yaml', [{ ...web, metadata: { namespace: 'shop/a', name: 'b' } }]);
    const numberNs = write('slash/c.yaml', [{ ...web, metadata: { namespace: 7, name: 'b' } }]);
    write('slash/d.yaml', [ssh]);
    const { manifests, errors } = readManifestFiles([join(dir, 'slash')]);
    expect(manifests.services.map((s) => s.metadata?.name)).toEqual(['ssh']);
    expect(errors.map((e) => e.message)).toEqual([
      `${slash}: Service a/b: metadata.name must not contain "/"`,
      `${slashNs}: Service b: metadata.namespace must not contain "/"`,
      `${numberNs}: Service b: metadata.namespace must be a string`,
    ]);
  });
});

describe('pier plan', () => {
  const dir = mkdtempSync(join(tmpdir(), 'pier-plan-unit-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const plan = (...args: string[]) => execa(process.execPath, [CLI, 'plan', ...args], { reject: false });

  it('plans Services without status, skips a bad file with its name, and exits 1 at the end', { timeout: 60_000 }, async () => {
    const m = join(dir, 'm');
    mkdirSync(m);
    writeFileSync(join(m, 'a.yaml'), [n1, web, webSlice].map((o) => stringify(o)).join('---\n'));
    writeFileSync(join(m, 'b.yaml'), 'kind: Service\nmetadata: {name: broken}\nspec: {ports: [{port: eighty}]}\n');
    const r = await plan('--node', 'n1', '-f', m);
    expect(r.exitCode).toBe(1);
    expect(r.stdout).toContain('-A PIER-SERVICES -d 192.0.2.11/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 198.18.0.5:8080');
    expect(r.stdout).toMatch(/^-I PREROUTING 1 .*-j PIER-SERVICES$/m);
    expect(r.stderr).toContain(`pier plan: skipped ${join(m, 'b.yaml')}: Service broken: spec.ports[0].port must be an integer`);
    expect(r.stderr).toContain('pier plan: shop/web: allocated (no status in the manifests): served on 192.0.2.11, 2001:db8::11, ports 80/TCP, 53/UDP');
    expect(r.stderr).toContain('1 file skipped');

    rmSync(join(m, 'b.yaml'));
    const ok = await plan('--node', 'n1', '-f', m, '--family', 'ipv6');
    expect(ok.exitCode).toBe(0);
    // IPv6 has no endpoints here: the ports are rejected, and the plan says how.
    expect(ok.stdout).toContain('-A PIER-NOENDPOINTS -d 2001:db8::11/128 -p tcp');
  });

  it('of two Services with one name plans the later, names both, and exits 1 at the end', { timeout: 60_000 }, async () => {
    const m = join(dir, 'dup');
    mkdirSync(m);
    writeFileSync(join(m, 'a.yaml'), [n1, web, webSlice].map((o) => stringify(o)).join('---\n'));
    // A stale copy, read later: its port 8081 is what kubectl apply would leave.
    writeFileSync(join(m, 'b.yaml'), stringify(lbService('shop', 'web', [{ name: 'http', port: 8081 }])));
    const r = await plan('--node', 'n1', '-f', m);
    expect(r.exitCode).toBe(1);
    expect(r.stderr).toContain(`pier plan: warning: Service shop/web in ${join(m, 'a.yaml')} (document 2) is read again in ${join(m, 'b.yaml')}: the later one is used, as kubectl apply would leave it`);
    expect(r.stderr).toContain('pier plan: 1 object read again later (above); the plan uses the later one of each');
    expect(r.stdout).toMatch(/^-A PIER-SERVICES -d 192\.0\.2\.11\/32 -p tcp .*--dport 8081 .*-j DNAT --to-destination 198\.18\.0\.5:8080$/m);
    expect(r.stdout).not.toMatch(/--dport 80 /);
  });

  it('sets the mark bits it is given, in both backends, and refuses one bit for both', { timeout: 60_000 }, async () => {
    const m = join(dir, 'marks.yaml');
    writeFileSync(m, [n1, web, webSlice].map((o) => stringify(o)).join('---\n'));
    const r = await plan('--node', 'n1', '-f', m, '--accept-bit', '4', '--masquerade-bit', '31');
    expect(r.exitCode).toBe(0);
    expect(r.stdout).toContain('-A PIER-SERVICES -d 192.0.2.11/32 -p tcp -m tcp --dport 80 -j CONNMARK --set-xmark 0x80000010/0x80000010');
    expect(r.stdout).toContain('-A PIER-FORWARD -m connmark --mark 0x10/0x10 -j ACCEPT');
    expect(r.stdout).toContain('-A PIER-POSTROUTING -m connmark --mark 0x80000000/0x80000000 -j MASQUERADE');
    const nft = await plan('--node', 'n1', '-f', m, '--backend', 'nftables', '--masquerade-bit', '3');
    expect(nft.exitCode).toBe(0);
    expect(nft.stdout).toContain('ct mark & 0x00000008 != 0 masquerade');
    expect(nft.stdout).toContain('ct mark set ct mark | 0x00000008');
    const same = await plan('--node', 'n1', '-f', m, '--accept-bit', '12');
    expect(same.exitCode).toBe(2);
    expect(same.stderr).toContain('pier plan: --accept-bit and --masquerade-bit are both 12: give them different bits');
    expect(same.stdout).toBe('');
  });

  it('names a Service port whose EndpointSlice lists it under another protocol', { timeout: 60_000 }, async () => {
    const m = join(dir, 'proto.yaml');
    const tcpOnly = endpointSlice('shop', 'web', 'IPv4', [{ address: '198.18.0.5', nodeName: 'n1' }], [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'TCP' }]);
    writeFileSync(m, [n1, web, tcpOnly].map((o) => stringify(o)).join('---\n'));
    const r = await plan('--node', 'n1', '-f', m);
    expect(r.exitCode).toBe(0);
    expect(r.stderr).toContain('pier plan: warning: shop/web port dns: EndpointProtocolMismatch: Service shop/web port dns: its EndpointSlices list port "dns" as TCP, not UDP');
    expect(r.stdout).toContain('-A PIER-NOENDPOINTS -d 192.0.2.11/32 -p udp -m udp --dport 53 -m comment --comment "shop/web:dns" -j REJECT');
  });
});
