// `pier plan` offline: Services without a status get the controller's own
// allocation first, and everything the plan leaves out is named.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { V1Lease, V1Service } from '@kubernetes/client-node';
import { execa } from 'execa';
import { afterAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { allocatorConfig, allocateOffline, PLAN_SPEC } from '../../agent/plan.ts';
import { allocate, DEFAULT_ALLOCATE_RANGE, DEFAULT_RESERVED_PORTS } from '../../controller/allocate.ts';
import { CONTROLLER_SPEC } from '../../controller/main.ts';
import { statusPatch } from '../../controller/status.ts';
import { parseConfig } from '../../lib/config.ts';
import { agentLeaseName, LEASE_FORWARDING_IPV4, LEASE_FORWARDING_IPV6 } from '../../lib/contract.ts';
import { endpointSlice, lbService, node } from '../support/objects.ts';

const CLI = fileURLToPath(new URL('../../lib/cli.ts', import.meta.url));
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
    expect(r.stdout).toContain('-A PIER-SERVICES -d 192.0.2.11/32 -p tcp -m comment --comment "shop/web:http" -m tcp --dport 80 -j DNAT --to-destination 198.18.0.5:8080');
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

  it('names a Service port whose EndpointSlice lists it under another protocol', { timeout: 60_000 }, async () => {
    const m = join(dir, 'proto.yaml');
    const tcpOnly = endpointSlice('shop', 'web', 'IPv4', [{ address: '198.18.0.5', nodeName: 'n1' }], [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'TCP' }]);
    writeFileSync(m, [n1, web, tcpOnly].map((o) => stringify(o)).join('---\n'));
    const r = await plan('--node', 'n1', '-f', m);
    expect(r.exitCode).toBe(0);
    expect(r.stderr).toContain('pier plan: warning: shop/web port dns: EndpointProtocolMismatch: Service shop/web port dns: its EndpointSlices list port "dns" as TCP, not UDP');
    expect(r.stdout).toContain('-A PIER-NOENDPOINTS -d 192.0.2.11/32 -p udp -m comment --comment "shop/web:dns" -m udp --dport 53 -j REJECT');
  });
});
