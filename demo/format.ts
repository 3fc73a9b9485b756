// What the demo prints, as pure functions: the Service table the way
// `kubectl get svc` prints it (the API server's printer in
// k8s.io/kubernetes pkg/printers/internalversion, kubectl's tabwriter), and
// one line per request.
import type { V1Service } from '@kubernetes/client-node';

export const SERVICE_COLUMNS = ['NAME', 'TYPE', 'CLUSTER-IP', 'EXTERNAL-IP', 'PORT(S)', 'AGE'];

/**
 * The Service rows of `kubectl get svc`, except that EXTERNAL-IP is never
 * clipped: kubectl cuts it to 16 characters unless `-o wide`, which would
 * hide all but the first node address.
 */
export function serviceTable(services: V1Service[], now: Date): string {
  return tabulate([SERVICE_COLUMNS, ...services.map((s) => serviceRow(s, now))]);
}

export function serviceRow(svc: V1Service, now: Date): string[] {
  const created = svc.metadata?.creationTimestamp;
  return [
    svc.metadata?.name ?? '',
    svc.spec?.type ?? '',
    svc.spec?.clusterIPs?.[0] ?? '<none>',
    externalIP(svc),
    portString(svc) || '<none>',
    created ? humanDuration(now.getTime() - new Date(created).getTime()) : '<unknown>',
  ];
}

function externalIP(svc: V1Service): string {
  const specIPs = svc.spec?.externalIPs ?? [];
  switch (svc.spec?.type) {
    case 'ClusterIP':
    case 'NodePort':
      return specIPs.length > 0 ? specIPs.join(',') : '<none>';
    case 'LoadBalancer': {
      // kubectl collects the ingress addresses into a sorted set.
      const lb = [...new Set((svc.status?.loadBalancer?.ingress ?? []).map((i) => i.ip || i.hostname || '').filter(Boolean))].sort();
      const all = [...lb, ...specIPs];
      return all.length > 0 ? all.join(',') : '<pending>';
    }
    case 'ExternalName':
      return svc.spec.externalName ?? '';
    default:
      return '<unknown>';
  }
}

function portString(svc: V1Service): string {
  return (svc.spec?.ports ?? []).map((p) => (p.nodePort ? `${p.port}:${p.nodePort}/${p.protocol}` : `${p.port}/${p.protocol}`)).join(',');
}

/**
 * k8s.io/apimachinery's duration.HumanDuration, which kubectl's AGE uses:
 * precise while small, coarser as it grows.
 */
export function humanDuration(ms: number): string {
  const seconds = Math.trunc(ms / 1000);
  if (seconds < -1) return '<invalid>';
  if (seconds < 0) return '0s';
  if (seconds < 120) return `${seconds}s`;
  const minutes = Math.trunc(ms / 60_000);
  if (minutes < 10) return withRest(minutes, 'm', seconds % 60, 's');
  if (minutes < 180) return `${minutes}m`;
  const hours = Math.trunc(ms / 3_600_000);
  if (hours < 8) return withRest(hours, 'h', minutes % 60, 'm');
  if (hours < 48) return `${hours}h`;
  const days = Math.trunc(hours / 24);
  if (hours < 24 * 8) return withRest(days, 'd', hours % 24, 'h');
  if (hours < 24 * 365 * 2) return `${days}d`;
  if (hours < 24 * 365 * 8) return withRest(Math.trunc(days / 365), 'y', days % 365, 'd');
  return `${Math.trunc(days / 365)}y`;
}

const withRest = (n: number, unit: string, rest: number, restUnit: string) => (rest === 0 ? `${n}${unit}` : `${n}${unit}${rest}${restUnit}`);

/**
 * kubectl's tabwriter (minimum width 6, padding 3): every column but the last
 * is padded to its widest cell plus three spaces.
 */
export function tabulate(rows: string[][]): string {
  const widths: number[] = [];
  for (const row of rows) row.forEach((cell, i) => (widths[i] = Math.max(widths[i] ?? 0, cell.length + 3, 6)));
  return rows.map((row) => row.map((cell, i) => (i === row.length - 1 ? cell : cell.padEnd(widths[i]!))).join('')).join('\n');
}

export interface Answer {
  proto: 'tcp' | 'udp';
  address: string;
  port: number;
  /** The pod that answered and the client address it saw; absent when nothing answered. */
  reply?: { pod: string; peer: string };
  error?: string;
  ms: number;
}

/** One aligned line per request: what was asked, who answered, what they saw. */
export function answerLines(answers: Answer[]): string[] {
  const targets = answers.map((a) => `${a.proto.toUpperCase()}  ${hostPort(a.address, a.port)}`);
  const width = Math.max(0, ...targets.map((t) => t.length));
  return answers.map((a, i) => {
    const what = a.reply ? `answered by ${a.reply.pod}, which saw the client as ${a.reply.peer}` : `NOT ANSWERED (${a.error ?? 'no reply'})`;
    return `  ${targets[i]!.padEnd(width)}  ${what}  (${a.ms.toFixed(1)} ms)`;
  });
}

export function hostPort(address: string, port: number): string {
  return address.includes(':') ? `[${address}]:${port}` : `${address}:${port}`;
}
