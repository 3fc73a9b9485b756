import { describe, expect, it } from 'vitest';
import { closingLine, tallyUpstream, tallyVitest, unrunReadme } from '../../scripts/summary.ts';
import { README_RUNS } from '../support/readme.ts';

const file = (name: string, status: string, tests: [string, string][], message = '') => ({
  name: `/r/${name}`,
  status,
  message,
  assertionResults: tests.map(([fullName, s]) => ({ fullName, status: s })),
});

describe('the closing line', () => {
  it('counts a failed beforeAll, a file that did not load and a failed afterAll as failures, by name', () => {
    const t = tallyVitest(
      {
        testResults: [
          file('hook.test.ts', 'failed', [['x', 'skipped'], ['y', 'skipped']]),
          file('import.test.ts', 'failed', [], "Cannot find module './missing.ts'"),
          file('after.test.ts', 'failed', [['ok', 'passed']]),
          file('fine.test.ts', 'passed', [['a', 'passed'], ['b', 'skipped']]),
          file('one.test.ts', 'failed', [['bad', 'failed'], ['good', 'passed']]),
        ],
      },
      '/r',
    );
    expect(closingLine(t)).toBe('tests: 3 passed, 4 failed, 3 skipped');
    expect(t.failed).toEqual([
      expect.stringMatching(/^hook\.test\.ts: failed outside its tests/),
      "import.test.ts: Cannot find module './missing.ts'",
      expect.stringMatching(/^after\.test\.ts: failed outside its tests/),
      'one.test.ts > bad',
    ]);
    expect(t.skipped).toEqual(['hook.test.ts > x (not run: its file failed)', 'hook.test.ts > y (not run: its file failed)', 'fine.test.ts > b']);
  });

  it('adds the upstream specs: a failed or timed-out spec, a missing report and a run that stopped early are failures', () => {
    const run = tallyUpstream(
      {
        backend: 'nftables',
        shard: '2/2',
        complete: false,
        outcomes: [
          { spec: '[sig-network] LoadBalancers a', state: 'passed', detail: '' },
          { spec: '[sig-network] LoadBalancers b', state: 'failed', detail: 'expected 1\nto be 2' },
          { spec: '[sig-network] LoadBalancers c', state: 'timed out', detail: '' },
          { spec: '[sig-network] LoadBalancers d', state: 'skipped', detail: 'not applicable' },
        ],
      },
      'x.json',
    );
    expect(run.failed).toEqual(['upstream nftables 2/2 > LoadBalancers b: failed: expected 1', 'upstream nftables 2/2 > LoadBalancers c: timed out', 'upstream nftables 2/2: stopped before every spec of its shard had an outcome (see its .log)']);
    expect(run.skipped).toEqual(['upstream nftables 2/2 > LoadBalancers d']);
    expect(closingLine(tallyUpstream(undefined, 'gone.json'))).toBe('tests: 0 passed, 1 failed, 0 skipped');
  });

  it('lists the README runs that did not run to the end as skipped, naming their test', () => {
    const ids = Object.keys(README_RUNS);
    expect(unrunReadme(ids.join('\n')).skipped).toEqual([]);
    const t = unrunReadme(ids.filter((id) => !id.startsWith('k3s-')).join('\n'));
    expect(t.skipped.length).toBeGreaterThan(0);
    for (const s of t.skipped) expect(s).toMatch(/^README run k3s-\S+ \(test\/e2e\/k3s\.test\.ts\): its commands did not run here$/);
  });
});
