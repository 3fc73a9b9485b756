// `pier status`'s pure core: which nodes serve a Service and why the others
// do not (in the controller's own words), port errors and the condition, as
// table rows, notes and JSON; and its short flags.
import type { V1EndpointSlice, V1Lease, V1Node, V1Service } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';

import { allocate, defaultAllocatorConfig } from '../../controller/allocate.ts';
import { expandShortFlags } from '../../cmd/status.ts';
import { alignColumns, buildStatusReport, formatAge, formatTable, notes, portCell, tableRows, type StatusInput } from '../../controller/status-report.ts';
import { EXCLUDE_FROM_LB_LABEL, LEASE_FORWARDING_IPV4, LEASE_FORWARDING_IPV4_REASON, LEASE_FORWARDING_IPV6, POOL, READY_CONDITION } from '../../lib/contract.ts';

const NOW = Date.parse('2025-06-01T12:00:00Z');
const config = defaultAllocatorConfig();

function node(name: string, v4: string, opts: { ready?: boolean; labels?: Record<string, string>; v6?: string } = {}): V1Node {
  return {
    metadata: { name, labels: { 'kubernetes.io/hostname': name, ...opts.labels } },
    status: {
      addresses: [{ type: 'InternalIP', address: v4 }, ...(opts.v6 ? [{ type: 'InternalIP', address: opts.v6 }] : [])],
      conditions: [{ type: 'Ready', status: opts.ready === false ? 'False' : 'True' }],
    },
  };
}

function lease(nodeName: string, opts: { ageMs?: number; v4?: boolean; v6?: boolean; v4Reason?: string } = {}): V1Lease {
  return {
    metadata: {
      name: `pier-agent-${nodeName}`,
      namespace: 'pier-system',
      annotations: {
        [LEASE_FORWARDING_IPV4]: String(opts.v4 ?? true),
        [LEASE_FORWARDING_IPV6]: String(opts.v6 ?? true),
        ...(opts.v4Reason ? { [LEASE_FORWARDING_IPV4_REASON]: opts.v4Reason } : {}),
      },
    },
    spec: { holderIdentity: nodeName, leaseDurationSeconds: 20, renewTime: new Date(NOW - (opts.ageMs ?? 3000)) as never },
  };
}

function service(name: string, extra: Partial<NonNullable<V1Service['spec']>> = {}, status?: V1Service['status'], annotations?: Record<string, string>): V1Service {
  return {
    metadata: { namespace: 'shop', name, creationTimestamp: new Date(NOW - 100_000) as never, ...(annotations ? { annotations } : {}) },
    spec: { type: 'LoadBalancer', loadBalancerClass: 'pier.dev/lb', ipFamilies: ['IPv4'], ports: [{ name: 'http', port: 80, protocol: 'TCP' }], ...extra },
    ...(status ? { status } : {}),
  };
}

const ready = (status: 'True' | 'False', reason: string, message: string) => [{ type: READY_CONDITION, status, reason, message, lastTransitionTime: new Date(NOW) }];

// n1 serves; each other node shows one reason it may not.
const nodes = [
  node('n1', '198.51.100.11'),
  node('n2', '198.51.100.12'),
  node('n3', '198.51.100.13'),
  node('n4', '198.51.100.14', { labels: { [POOL]: 'edge' } }),
  node('n5', '198.51.100.15', { labels: { [EXCLUDE_FROM_LB_LABEL]: '' } }),
  node('n6', '198.51.100.16', { ready: false }),
  node('n7', '198.51.100.17'),
];
const leases = [
  lease('n1'),
  lease('n2', { ageMs: 90_000 }),
  lease('n3', { v4: false, v4Reason: 'net.ipv4.ip_forward is 0' }),
  lease('n4'),
  lease('n5'),
  lease('n6'),
];

const web = service(
  'web',
  { ports: [{ name: 'http', port: 80, protocol: 'TCP' }, { name: 'https', port: 443, protocol: 'TCP' }] },
  {
    loadBalancer: {
      ingress: [
        { ip: '198.51.100.11', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }, { port: 443, protocol: 'TCP', error: 'PortConflict' }] },
        // n2's address is still listed: the controller has not yet seen its Lease expire.
        { ip: '198.51.100.12', ipMode: 'Proxy', ports: [{ port: 80, protocol: 'TCP' }, { port: 443, protocol: 'TCP', error: 'PortConflict' }] },
      ],
    },
    conditions: ready('False', 'PartiallyServed', 'served on 198.51.100.11, 198.51.100.12 except: port 443/TCP (https) is not served on 198.51.100.11, 198.51.100.12: held by shop/old, which is older'),
  },
);
const game = service(
  'game',
  { ports: [{ port: 7777, protocol: 'UDP' }], externalTrafficPolicy: 'Local' },
  {
    loadBalancer: { ingress: [{ ip: '198.51.100.11', ipMode: 'Proxy', ports: [{ port: 40000, protocol: 'UDP' }] }] },
    conditions: ready('True', 'Serving', 'served on 198.51.100.11, 1 port 40000/UDP -> 7777'),
  },
  { 'pier.dev/port-mode': 'allocate' },
);
const fresh = service('fresh');
const other = { ...service('other'), spec: { ...service('other').spec, loadBalancerClass: 'example.com/lb' } };
const slices: V1EndpointSlice[] = [
  {
    metadata: { namespace: 'shop', name: 'game-1', labels: { 'kubernetes.io/service-name': 'game' } },
    addressType: 'IPv4',
    endpoints: [{ addresses: ['198.19.1.5'], nodeName: 'n1', conditions: { ready: true } }],
  },
];

const input: StatusInput = { services: [web, game, fresh, other], nodes, slices, leases, now: NOW, config };

describe('pier status report', () => {
  const report = buildStatusReport(input);

  it("lists pier's Services only, in namespace/name order", () => {
    expect(report.services.map((s) => s.name)).toEqual(['fresh', 'game', 'web']);
  });

  it('gives one table row per Service: addresses, ports with errors, serving nodes, the condition', () => {
    expect(tableRows(report)).toEqual([
      ['shop', 'fresh', '<pending>', '80/TCP', '<none>', 'Unknown', 'NoCondition'],
      ['shop', 'game', '198.51.100.11', '40000/UDP->7777', 'n1', 'True', 'Serving'],
      ['shop', 'web', '198.51.100.11,198.51.100.12', '80/TCP,443/TCP(PortConflict)', 'n1', 'False', 'PartiallyServed'],
    ]);
  });

  it('says why each node does not serve, with the Lease and forwarding details', () => {
    const s = report.services.find((x) => x.name === 'web')!;
    expect(notes(s)).toEqual([
      'node n2 does not serve it: its pier agent Lease has expired (renewed 90s ago, valid for 20s); the status still lists 198.51.100.12',
      'node n3 does not serve it: its pier agent cannot forward IPv4: net.ipv4.ip_forward is 0',
      'node n4 does not serve it: it is in pool "edge", not "default"',
      `node n5 does not serve it: it is labelled ${EXCLUDE_FROM_LB_LABEL}`,
      'node n6 does not serve it: it is not Ready',
      'node n7 does not serve it: it has no pier agent Lease',
      'port 443/TCP (https): PortConflict on 198.51.100.11, 198.51.100.12',
      `${READY_CONDITION} False PartiallyServed: served on 198.51.100.11, 198.51.100.12 except: port 443/TCP (https) is not served on 198.51.100.11, 198.51.100.12: held by shop/old, which is older`,
    ]);
  });

  it('names a Local Service without an endpoint on a node, and an eligible node the status does not list', () => {
    const gameNotes = notes(report.services.find((x) => x.name === 'game')!);
    expect(gameNotes).toContain('node n2 does not serve it: its pier agent Lease has expired (renewed 90s ago, valid for 20s)');
    const freshNotes = notes(report.services.find((x) => x.name === 'fresh')!);
    expect(freshNotes[0]).toBe('node n1 does not serve it: it is eligible, but the status lists none of its IPv4 addresses (198.51.100.11) yet: is the controller running?');
    // n1 serves game; no other fresh, forwarding node in the pool has one of its endpoints.
    const local = buildStatusReport({ ...input, leases: [...leases.filter((l) => l.metadata?.name !== 'pier-agent-n2'), lease('n2')] });
    expect(notes(local.services.find((x) => x.name === 'game')!)).toContain(
      'node n2 does not serve it: it has no serving endpoint of the Service (externalTrafficPolicy: Local)',
    );
  });

  it('splits a node by family when only one family fails', () => {
    const dual = service('dual', { ipFamilies: ['IPv4', 'IPv6'], ipFamilyPolicy: 'PreferDualStack' }, {
      loadBalancer: { ingress: [{ ip: '198.51.100.11', ports: [{ port: 80, protocol: 'TCP' }] }, { ip: '2001:db8::11', ports: [{ port: 80, protocol: 'TCP' }] }] },
    });
    const r = buildStatusReport({ ...input, services: [dual], nodes: [node('n1', '198.51.100.11', { v6: '2001:db8::11' })], leases: [lease('n1', { v6: false })] });
    const s = r.services[0]!;
    expect(s.servingNodes).toEqual(['n1']);
    expect(notes(s)).toEqual([
      'node n1 does not serve it over IPv6: its pier agent cannot forward IPv6; the status still lists 2001:db8::11',
      `${READY_CONDITION} Unknown NoCondition: the controller has written no ${READY_CONDITION} condition yet`,
    ]);
  });

  it("agrees with allocate(): with the controller's own status, exactly the eligible nodes serve", () => {
    const services = [web, game, fresh].map((svc) => {
      const a = allocate({ ...input, services: [svc] }).services.get(`shop/${svc.metadata!.name}`)!;
      return { ...svc, status: { loadBalancer: { ingress: a.ingress } } };
    });
    const r = buildStatusReport({ ...input, services });
    // Neither an eligible node missing from the status nor an excluded one still in it.
    for (const n of r.services.flatMap((s) => s.nodes)) expect(n.reason ?? '').not.toMatch(/it is eligible|status still lists/);
    expect(r.services.map((s) => s.servingNodes)).toEqual([['n1'], ['n1'], ['n1']]);
  });

  it('prints an aligned table, the notes and how Leases were judged', () => {
    const text = formatTable(report);
    const lines = text.split('\n');
    expect(lines[0]).toBe('NAMESPACE   NAME    ADDRESSES                     PORTS                          NODES    READY     REASON');
    expect(lines[3]).toBe('shop        web     198.51.100.11,198.51.100.12   80/TCP,443/TCP(PortConflict)   n1       False     PartiallyServed');
    expect(text).toContain('\nshop/web:\n  node n2 does not serve it:');
    expect(text).toContain('agent Leases judged as of now by renewTime + leaseDurationSeconds');
    expect(text).toContain(`Nodes as of ${new Date(NOW).toISOString()}`);
  });

  it('gives scripts the same in JSON', () => {
    const json = JSON.parse(JSON.stringify(report)) as typeof report;
    const s = json.services.find((x) => x.name === 'web')!;
    expect(s.addresses).toEqual(['198.51.100.11', '198.51.100.12']);
    expect(s.ports[1]).toEqual({ name: 'https', port: 443, protocol: 'TCP', externalPorts: [], errors: [{ address: '198.51.100.11', error: 'PortConflict' }, { address: '198.51.100.12', error: 'PortConflict' }] });
    expect(s.nodes.find((n) => n.node === 'n1')).toEqual({ node: 'n1', family: 'ipv4', serving: true, addresses: ['198.51.100.11'] });
    expect(s.ready.reason).toBe('PartiallyServed');
  });
});

describe('status formatting helpers', () => {
  it('aligns columns kubectl-style', () => {
    expect(alignColumns([['A', 'BB', 'C'], ['aaa', 'b', 'c']])).toBe('A     BB   C\naaa   b    c\n');
  });
  it('shows allocated ports and errors in the PORTS cell', () => {
    expect(portCell({ port: 80, protocol: 'TCP', externalPorts: [80], errors: [] })).toBe('80/TCP');
    expect(portCell({ port: 53, protocol: 'UDP', externalPorts: [40001], errors: [{ address: 'x', error: 'PortReserved' }] })).toBe('40001/UDP->53(PortReserved)');
  });
  it('formats ages as kubectl does', () => {
    expect([formatAge(5_000), formatAge(150_000), formatAge(3 * 3_600_000 + 60_000), formatAge(5 * 86_400_000)]).toEqual(['5s', '2m30s', '3h1m', '5d']);
  });
  it('expands kubectl short flags', () => {
    expect(expandShortFlags(['-n', 'shop', '-ojson', '-A', '--kubeconfig', 'k', '-n=x'])).toEqual(['--namespace', 'shop', '--output=json', '--all-namespaces', '--kubeconfig', 'k', '--namespace=x']);
  });
});
