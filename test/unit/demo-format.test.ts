// The demo's table against what kubectl prints. The duration cases are
// apimachinery's own tests for duration.HumanDuration (v0.37.1); the layout
// cases follow kubectl's tabwriter (minimum width 6, padding 3).
import type { V1Service } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { answerLines, humanDuration, serviceTable, tabulate } from '../../demo/format.ts';

const s = 1000;
const m = 60 * s;
const h = 60 * m;
const d = 24 * h;
const y = 365 * d;

describe('humanDuration (kubectl AGE)', () => {
  it.each([
    [s, '1s'], [70 * s, '70s'], [190 * s, '3m10s'], [70 * m, '70m'], [47 * h, '47h'], [49 * h, '2d1h'],
    [(8 * 24 + 2) * h, '8d'], [367 * d, '367d'], [2 * y + 25 * h, '2y1d'], [8 * y + 2 * h, '8y'],
  ])('%d ms is %s', (ms, want) => expect(humanDuration(ms)).toBe(want));

  it.each([
    [-2 * s, '<invalid>'], [-2 * s + 1, '0s'], [0, '0s'], [s - 1, '0s'], [2 * m - 1, '119s'], [2 * m, '2m'], [2 * m + s, '2m1s'],
    [10 * m - 1, '9m59s'], [10 * m, '10m'], [10 * m + s, '10m'], [3 * h - 1, '179m'], [3 * h, '3h'], [3 * h + m, '3h1m'],
    [8 * h - 1, '7h59m'], [8 * h, '8h'], [8 * h + 59 * m, '8h'], [2 * d - 1, '47h'], [2 * d, '2d'], [2 * d + h, '2d1h'],
    [8 * d - 1, '7d23h'], [8 * d, '8d'], [8 * d + 23 * h, '8d'], [2 * y - 1, '729d'], [2 * y, '2y'], [2 * y + 23 * h + 59 * m, '2y'],
    [2 * y + d - 1, '2y'], [2 * y + d, '2y1d'], [3 * y, '3y'], [5 * y, '5y'],
  ])('boundary %d ms is %s', (ms, want) => expect(humanDuration(ms)).toBe(want));
});

describe('tabulate', () => {
  it('pads every column but the last to its widest cell plus three, at least six', () => {
    expect(tabulate([['NAME', 'A', 'AGE'], ['kubernetes', 'B', '5d']])).toBe('NAME         A     AGE\nkubernetes   B     5d');
  });
});

const now = new Date('2026-01-01T00:10:00Z');
const svc = (extra: Partial<V1Service['spec']>, ingress: { ip?: string; hostname?: string }[] = []): V1Service => ({
  metadata: { name: 'web', creationTimestamp: new Date('2026-01-01T00:09:30Z') },
  spec: { type: 'LoadBalancer', clusterIPs: ['198.18.0.10', '2001:db8:ffff::a'], ports: [{ port: 80, nodePort: 31234, protocol: 'TCP' }, { port: 80, nodePort: 31235, protocol: 'UDP' }], ...extra },
  status: { loadBalancer: { ingress } },
});

describe('serviceTable (kubectl get svc)', () => {
  it('lists every ingress address, sorted as kubectl sorts them, never clipped; ports as port:nodePort/proto; the first cluster IP', () => {
    const table = serviceTable([svc({}, [{ ip: '2001:db8:0:1::12' }, { ip: '198.51.100.12' }, { ip: '198.51.100.11' }, { ip: '198.51.100.11' }])], now);
    expect(table.split('\n')).toEqual([
      'NAME   TYPE           CLUSTER-IP    EXTERNAL-IP                                    PORT(S)                     AGE',
      'web    LoadBalancer   198.18.0.10   198.51.100.11,198.51.100.12,2001:db8:0:1::12   80:31234/TCP,80:31235/UDP   30s',
    ]);
  });

  it('says <pending> with no address yet, adds spec.externalIPs after the status, prints hostnames', () => {
    const row = (v: V1Service) => serviceTable([v], now).split('\n')[1]!.split(/\s+/)[3];
    expect(row(svc({}))).toBe('<pending>');
    expect(row(svc({ externalIPs: ['203.0.113.9'] }, [{ ip: '198.51.100.11' }]))).toBe('198.51.100.11,203.0.113.9');
    expect(row(svc({}, [{ hostname: 'lb.example' }]))).toBe('lb.example');
  });

  it('prints ClusterIP Services as kubectl does: <none> outside, port/proto without a node port', () => {
    const line = serviceTable([svc({ type: 'ClusterIP', clusterIPs: ['198.18.0.1'], ports: [{ port: 443, protocol: 'TCP' }] })], now).split('\n')[1]!;
    expect(line.split(/\s+/)).toEqual(['web', 'ClusterIP', '198.18.0.1', '<none>', '443/TCP', '30s']);
  });
});

describe('answerLines', () => {
  it('aligns the targets, brackets IPv6, and says plainly what went unanswered', () => {
    expect(
      answerLines([
        { proto: 'tcp', address: '198.51.100.11', port: 80, ms: 1.234, reply: { pod: 'n1-p1', peer: '198.51.100.101' } },
        { proto: 'udp', address: '2001:db8:0:1::12', port: 80, ms: 2000, error: 'timeout' },
      ]),
    ).toEqual([
      '  TCP  198.51.100.11:80       answered by n1-p1, which saw the client as 198.51.100.101  (1.2 ms)',
      '  UDP  [2001:db8:0:1::12]:80  NOT ANSWERED (timeout)  (2000.0 ms)',
    ]);
  });
});
