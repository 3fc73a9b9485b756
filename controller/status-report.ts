// `pier status`'s pure core: from the objects a one-shot reader lists
// (Services, Nodes, EndpointSlices, agent Leases) to one report per pier
// Service (its addresses, which nodes serve it and why the others do not,
// each port's error and the pier.dev/Ready condition) and to the table and
// JSON a person or a script reads.
//
// Which nodes are eligible comes from the controller's own rules
// (allocate.ts judgeNodes), with one difference a one-shot reader cannot
// avoid: the controller judges agent Leases by when it saw them change
// (lib/lease.ts sightedFreshUntil), while this judges them by renewTime +
// leaseDurationSeconds against the local clock, as of now.
import type { V1EndpointSlice, V1Lease, V1Node, V1Service } from '@kubernetes/client-node';

import { compareText } from '../lib/address.ts';
import type { ChosenSelection } from '../lib/cluster-settings.ts';
import { agentLeaseName, isPierService, LEASE_FORWARDING_IPV4_REASON, LEASE_FORWARDING_IPV6_REASON, READY_CONDITION, type Family } from '../lib/contract.ts';
import { judgeNodes, serviceKey, type AllocatorConfig } from './allocate.ts';

/** Said wherever a node's Lease verdict shows: the controller may see it otherwise for up to a Lease duration. */
export const LEASE_JUDGEMENT =
  "agent Leases judged as of now by renewTime + leaseDurationSeconds on this machine's clock; the controller judges them by when it saw them change, so it may differ for up to a Lease duration";

export interface StatusInput {
  services: V1Service[];
  nodes: V1Node[];
  slices: V1EndpointSlice[];
  leases: V1Lease[];
  /** Milliseconds since the epoch. */
  now: number;
  config: AllocatorConfig;
}

export interface PortReport {
  name?: string;
  /** The spec port. */
  port: number;
  protocol: string;
  /** The external ports the status gives it (differ from `port` only in port-mode allocate). */
  externalPorts: number[];
  /** Per status address where this port is not served. */
  errors: { address: string; error: string }[];
}

export interface NodeFamilyReport {
  node: string;
  family: Family;
  serving: boolean;
  /** The node's addresses the status lists in this family: where it serves, or would if it could. */
  addresses: string[];
  /** Why it does not serve. */
  reason?: string;
}

export interface ServiceReport {
  namespace: string;
  name: string;
  /** status.loadBalancer.ingress, ip (or hostname), in status order. */
  addresses: string[];
  ports: PortReport[];
  /** Nodes that serve at least one family. */
  servingNodes: string[];
  nodes: NodeFamilyReport[];
  /** The pier.dev/Ready condition; status Unknown when the controller has written none. */
  ready: { status: string; reason: string; message: string };
}

export interface StatusReport {
  asOf: string;
  leases: string;
  services: ServiceReport[];
  /** Which Services counted as pier's, and where each setting came from (the command line, the controller's Lease, the default). */
  settings?: Pick<ChosenSelection, 'defaultClass' | 'defaultPool'> & { from: Pick<ChosenSelection['from'], 'defaultClass' | 'defaultPool'> };
}

const FAMILY_NAME: Record<Family, string> = { ipv4: 'IPv4', ipv6: 'IPv6' };
const REASON_ANNOTATION: Record<Family, string> = { ipv4: LEASE_FORWARDING_IPV4_REASON, ipv6: LEASE_FORWARDING_IPV6_REASON };

export function buildStatusReport(input: StatusInput): StatusReport {
  const judged = judgeNodes({ services: input.services, nodes: input.nodes, slices: input.slices, leases: input.leases, now: input.now, config: input.config });
  const leases = new Map<string, V1Lease>();
  for (const l of input.leases) if (l.metadata?.namespace === input.config.agentNamespace) leases.set(l.metadata.name ?? '', l);

  const services: ServiceReport[] = [];
  for (const svc of input.services) {
    const key = serviceKey(svc);
    if (!isPierService(svc, input.config)) continue;
    // A Service allocate() cannot read has no node judgements; its condition says why.
    const judgements = judged.get(key) ?? [];
    const ingress = svc.status?.loadBalancer?.ingress ?? [];
    const inStatus = new Set(ingress.map((i) => i.ip).filter((ip): ip is string => typeof ip === 'string'));
    const requested = svc.spec?.loadBalancerIP;

    const nodes: NodeFamilyReport[] = judgements.map((j) => {
      const listed = j.addresses.filter((a) => inStatus.has(a));
      const out: NodeFamilyReport = { node: j.node, family: j.family, serving: false, addresses: listed };
      if (j.excluded) {
        let reason = j.excluded.why;
        const lease = leases.get(agentLeaseName(j.node));
        if (j.excluded.kind === 'agentStale' && lease) reason += ` (${describeRenewal(lease, input.now)})`;
        const said = lease?.metadata?.annotations?.[REASON_ANNOTATION[j.family]];
        if (j.excluded.kind === 'notForwarding' && said) reason += `: ${said}`;
        // The status still naming it means the controller has not caught up, or sees the Lease otherwise.
        if (listed.length > 0) reason += `; the status still lists ${listed.join(', ')}`;
        out.reason = reason;
      } else if (listed.length > 0) {
        out.serving = true;
      } else if (requested) {
        out.reason = `it does not have spec.loadBalancerIP ${requested}`;
      } else {
        out.reason = `it is eligible, but the status lists none of its ${FAMILY_NAME[j.family]} addresses (${j.addresses.join(', ') || 'none'}) yet: is the controller running?`;
      }
      return out;
    });

    const ports: PortReport[] = (svc.spec?.ports ?? []).map((sp, index) => {
      const external = new Set<number>();
      const errors: { address: string; error: string }[] = [];
      for (const ing of ingress) {
        const entry = ing.ports?.[index];
        if (!entry) continue;
        if (entry.error) errors.push({ address: ing.ip ?? ing.hostname ?? '', error: entry.error });
        else if (typeof entry.port === 'number') external.add(entry.port);
      }
      const out: PortReport = { port: sp.port, protocol: sp.protocol ?? 'TCP', externalPorts: [...external].sort((a, b) => a - b), errors };
      if (sp.name) out.name = sp.name;
      return out;
    });

    const cond = (svc.status?.conditions ?? []).find((c) => c.type === READY_CONDITION);
    services.push({
      namespace: svc.metadata?.namespace ?? '',
      name: svc.metadata?.name ?? '',
      addresses: ingress.map((i) => i.ip ?? i.hostname ?? '').filter((a) => a !== ''),
      ports,
      servingNodes: [...new Set(nodes.filter((n) => n.serving).map((n) => n.node))],
      nodes,
      ready: cond
        ? { status: cond.status, reason: cond.reason ?? '', message: cond.message ?? '' }
        : { status: 'Unknown', reason: 'NoCondition', message: `the controller has written no ${READY_CONDITION} condition yet` },
    });
  }
  services.sort((a, b) => compareText(a.namespace, b.namespace) || compareText(a.name, b.name));
  return { asOf: new Date(input.now).toISOString(), leases: LEASE_JUDGEMENT, services };
}

function describeRenewal(lease: V1Lease, now: number): string {
  const renew = lease.spec?.renewTime;
  const seconds = lease.spec?.leaseDurationSeconds;
  if (!renew) return 'it has no renewTime';
  const at = new Date(renew).getTime();
  if (Number.isNaN(at)) return 'its renewTime is not a time';
  return `renewed ${formatAge(now - at)} ago, valid for ${seconds ? `${seconds}s` : 'no time'}`;
}

/** kubectl's AGE style: 45s, 3m10s, 2h5m, 4d. */
export function formatAge(ms: number): string {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 120) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 10) return `${m}m${s % 60 ? `${s % 60}s` : ''}`;
  if (m < 180) return `${m}m`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h${m % 60 ? `${m % 60}m` : ''}`;
  return `${Math.floor(h / 24)}d`;
}

// ---------------------------------------------------------------------------
// Output

export const TABLE_HEADER = ['NAMESPACE', 'NAME', 'ADDRESSES', 'PORTS', 'NODES', 'READY', 'REASON'] as const;

/** How a port reads in the table: `80/TCP`, `40001/TCP->80` (allocated), `443/TCP(PortConflict)`. */
export function portCell(p: PortReport): string {
  const ext = p.externalPorts.length === 0 ? [p.port] : p.externalPorts;
  const mapped = ext.length === 1 && ext[0] === p.port ? `${p.port}/${p.protocol}` : `${ext.join('|')}/${p.protocol}->${p.port}`;
  const errors = [...new Set(p.errors.map((e) => e.error))];
  return errors.length === 0 ? mapped : `${mapped}(${errors.join(',')})`;
}

/** kubectl's way with long lists: the first few, then "+ N more...". */
function listCell(items: string[], empty: string, max = 3): string {
  if (items.length === 0) return empty;
  if (items.length <= max) return items.join(',');
  return `${items.slice(0, max).join(',')} + ${items.length - max} more...`;
}

export function tableRows(report: StatusReport): string[][] {
  return report.services.map((s) => [
    s.namespace,
    s.name,
    listCell(s.addresses, '<pending>'),
    s.ports.map(portCell).join(',') || '<none>',
    listCell(s.servingNodes, '<none>'),
    s.ready.status,
    s.ready.reason || '<none>',
  ]);
}

/** Columns padded to their widest cell, three spaces apart, as kubectl prints them. */
export function alignColumns(rows: readonly (readonly string[])[]): string {
  const widths: number[] = [];
  for (const row of rows) row.forEach((cell, i) => (widths[i] = Math.max(widths[i] ?? 0, cell.length)));
  return rows.map((row) => row.map((cell, i) => (i === row.length - 1 ? cell : cell.padEnd(widths[i]!))).join('   ')).join('\n') + '\n';
}

/** The per-Service explanations under the table: nodes that do not serve, ports with errors, a condition that is not True. */
export function notes(s: ServiceReport): string[] {
  const lines: string[] = [];
  const byNode = new Map<string, NodeFamilyReport[]>();
  for (const n of s.nodes) byNode.set(n.node, [...(byNode.get(n.node) ?? []), n]);
  for (const [node, fams] of byNode) {
    const out = fams.filter((f) => !f.serving);
    if (out.length === 0) continue;
    const reasons = [...new Set(out.map((f) => f.reason))];
    // One line when every family fails for the same reason, else one per family.
    if (out.length === fams.length && reasons.length === 1) lines.push(`node ${node} does not serve it: ${reasons[0]}`);
    else for (const f of out) lines.push(`node ${node} does not serve it over ${FAMILY_NAME[f.family]}: ${f.reason}`);
  }
  for (const p of s.ports) {
    const byError = new Map<string, string[]>();
    for (const e of p.errors) byError.set(e.error, [...(byError.get(e.error) ?? []), e.address]);
    for (const [error, addresses] of byError) lines.push(`port ${p.port}/${p.protocol}${p.name ? ` (${p.name})` : ''}: ${error} on ${addresses.join(', ')}`);
  }
  if (s.ready.status !== 'True') lines.push(`${READY_CONDITION} ${s.ready.status} ${s.ready.reason}: ${s.ready.message}`);
  return lines;
}

export function formatTable(report: StatusReport): string {
  let text = alignColumns([[...TABLE_HEADER], ...tableRows(report)]);
  for (const s of report.services) {
    const lines = notes(s);
    if (lines.length > 0) text += `\n${s.namespace}/${s.name}:\n${lines.map((l) => `  ${l}\n`).join('')}`;
  }
  if (report.services.some((s) => s.nodes.length > 0)) text += `\nNodes as of ${report.asOf}: ${report.leases}.\n`;
  return text;
}

export function formatJson(report: StatusReport): string {
  return `${JSON.stringify(report, null, 2)}\n`;
}
