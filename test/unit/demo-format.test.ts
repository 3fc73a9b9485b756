// What the demo prints: the commands it runs, as a person would type them,
// and one line per request.
import { describe, expect, it } from 'vitest';
import { answerLines, commandLine } from '../../demo/format.ts';

describe('commandLine', () => {
  it('leaves plain arguments alone and single-quotes the rest, as a shell reads them', () => {
    expect(commandLine(['kubectl', 'apply', '-k', 'deploy/overlays/kind'])).toBe('$ kubectl apply -k deploy/overlays/kind');
    expect(commandLine(['kubectl', 'create', 'deployment', 'web', '--image=docker.io/pier/echo:test', '--replicas=2'])).toBe(
      '$ kubectl create deployment web --image=docker.io/pier/echo:test --replicas=2',
    );
    expect(commandLine(['kubectl', 'patch', 'service', 'web', '-p', '{"spec":{"ipFamilyPolicy":"PreferDualStack"}}'])).toBe(
      `$ kubectl patch service web -p '{"spec":{"ipFamilyPolicy":"PreferDualStack"}}'`,
    );
    expect(commandLine(['echo', "it's", ''])).toBe(`$ echo 'it'\\''s' ''`);
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
