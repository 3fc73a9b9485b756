// The applier against real iptables in a scratch namespace: how much it runs
// for each kind of change, and how it recovers from what others do to the
// tables (stale chains and jumps, a flush, a failing partial write).
import { execa } from 'execa';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { Applier, eachFamily, removeAll } from '../../agent/iptables/applier.ts';
import { Xtables } from '../../agent/iptables/xtables.ts';
import { commandRunner, type Input, type Runner } from '../../lib/run.ts';

import { type Ruleset } from '../../agent/iptables/render.ts';
import { MARKS } from '../unit/agent-fixtures.ts';
import { parseSave } from '../../agent/iptables/restore.ts';
import { LOAD_BALANCER_CLASS, type Family } from '../../lib/contract.ts';
import { scratchNamespace, type Scratch } from '../lab/scratch.ts';
import { inputText } from '../support/input.ts';
import { buildModel, renderRuleset } from '../support/oracle.ts';

const NODE_IP = '198.51.100.11';
const NODE_IP6 = '2001:db8::11';

/** A ruleset for `n` single-port Services; `moved` shifts one Service's endpoint. */
function ruleset(n: number, moved = 0, family: Family = 'ipv4'): Ruleset {
  const v6 = family === 'ipv6';
  const nodeIp = v6 ? NODE_IP6 : NODE_IP;
  const endpoint = (net: number, host: number) => (v6 ? `2001:db8:${net}::${host.toString(16)}` : `198.19.${net}.${host}`);
  const services = Array.from({ length: n }, (_, i) => ({
    metadata: { namespace: 'shop', name: `s${i}` },
    spec: { type: 'LoadBalancer', loadBalancerClass: LOAD_BALANCER_CLASS, ports: [{ name: 'p', port: 1000 + i, protocol: 'TCP', targetPort: 8080 }] },
    status: { loadBalancer: { ingress: [{ ip: nodeIp, ipMode: 'Proxy', ports: [{ port: 1000 + i, protocol: 'TCP' }] }] } },
  }));
  const slices = services.map((s, i) => ({
    metadata: { namespace: 'shop', name: `${s.metadata.name}-a`, labels: { 'kubernetes.io/service-name': s.metadata.name } },
    addressType: v6 ? 'IPv6' : 'IPv4',
    endpoints: [{ addresses: [endpoint(1, (i === 0 ? moved : 0) + 10 + (i % 200))], nodeName: 'n1', conditions: { ready: true } }, { addresses: [endpoint(2, 10 + (i % 200))], nodeName: 'n2', conditions: { ready: true } }],
    ports: [{ name: 'p', port: 8080, protocol: 'TCP' }],
  }));
  const model = buildModel({
    nodeName: 'n1',
    nodeAddresses: [nodeIp],
    services: services as never,
    slices: slices as never,
    config: { loadBalancerClass: LOAD_BALANCER_CLASS, defaultClass: false, maxPortsPerService: 256 },
  });
  return renderRuleset(model[family], { marks: MARKS });
}

/** pier's chains, their rules, and the jumps into them, from iptables-save output. */
function pierLines(save: string): string[] {
  const out: string[] = [];
  for (const [table, chains] of parseSave(save)) {
    for (const [chain, rules] of chains) {
      if (chain.startsWith('PIER-')) out.push(`${table} :${chain}`);
      for (const r of rules) if (chain.startsWith('PIER-') || r.includes('PIER-')) out.push(`${table} -A ${chain} ${r}`);
    }
  }
  return out.sort();
}

/** Pids of the processes running in a network namespace. */
async function processesIn(ns: string): Promise<number[]> {
  const { stdout } = await execa('ip', ['netns', 'pids', ns]);
  return stdout.split('\n').filter(Boolean).map(Number);
}

describe('Applier', () => {
  let s: Scratch;
  let calls: { file: string; args: string[]; input?: string | Promise<Input>; result: Promise<unknown> }[];
  let failNextRestore: boolean;
  let xt: Xtables;
  const save = (family: Family) => (family === 'ipv4' ? 'iptables-save' : 'ip6tables-save');
  const pierState = async (family: Family = 'ipv4') => pierLines((await s.exec(save(family), [])).stdout);
  /** What the applier makes of an empty namespace: the reference state. */
  const expected = async (rs: Ruleset, family: Family = 'ipv4') => {
    const t = await scratchNamespace();
    try {
      await new Applier(new Xtables(family, 'nft', commandRunner(['ip', 'netns', 'exec', t.ns]))).apply(rs);
      return pierLines((await t.exec(save(family), [])).stdout);
    } finally {
      await t.destroy();
    }
  };

  beforeEach(async () => {
    s = await scratchNamespace();
    calls = [];
    failNextRestore = false;
    const inner = commandRunner(['ip', 'netns', 'exec', s.ns]);
    const counting: Runner = (file, args, input) => {
      if (failNextRestore && file.endsWith('-restore')) {
        failNextRestore = false;
        const result = Promise.resolve({ exitCode: 2, stdout: '', stderr: 'iptables-restore: simulated failure\nError occurred at line: 2\n' });
        calls.push({ file, args, input, result });
        return result;
      }
      const result = inner(file, args, input);
      calls.push({ file, args, input, result });
      return result;
    };
    xt = new Xtables('ipv4', 'nft', counting);
  });
  afterEach(async () => s?.destroy());

  it('runs nothing for an unchanged ruleset and one restore with only the changed chains for a change', async () => {
    const a = new Applier(xt);
    expect((await a.apply(ruleset(50))).mode).toBe('full');
    calls.length = 0;
    expect(await a.apply(ruleset(50))).toMatchObject({ mode: 'noop', payloadBytes: 0 });
    expect(calls).toEqual([]);
    const r = await a.apply(ruleset(50, 100));
    expect(r.mode).toBe('partial');
    expect(calls.map((c) => c.file)).toEqual(['iptables-nft-restore']);
    const declared = (await inputText(calls[0]!.input))!.split('\n').filter((l) => l.startsWith(':'));
    expect(declared.length).toBeGreaterThan(0);
    expect(declared.length).toBeLessThan(4);
    expect(await pierState()).toEqual(await expected(ruleset(50, 100)));
  });

  it('removes stale pier chains and jumps on the first sync, and leaves everything else', async () => {
    await s.exec('iptables-restore', ['--noflush'], {
      input: ['*nat', ':PIER-OLD - [0:0]', ':HOST-OWN - [0:0]', '-A PIER-OLD -j RETURN', '-A PREROUTING -j PIER-OLD', '-A PREROUTING -j HOST-OWN', 'COMMIT', ''].join('\n'),
    });
    const a = new Applier(xt);
    await a.apply(ruleset(5));
    const state = await pierState();
    expect(state.some((l) => l.includes('PIER-OLD'))).toBe(false);
    expect(state).toEqual(await expected(ruleset(5)));
    const nat = (await s.exec('iptables-save', ['-t', 'nat'])).stdout;
    expect(nat).toContain('-A PREROUTING -j HOST-OWN');
    expect(nat).toContain(':HOST-OWN');
  });

  it('uses a save read ahead for the first sync, and reads again when the tables changed meanwhile', async () => {
    // As at an agent's start: pier's chains from its last run are there, the
    // save is read while the informers list, then the first sync applies.
    await new Applier(new Xtables('ipv4', 'nft', commandRunner(['ip', 'netns', 'exec', s.ns]))).apply(ruleset(5));
    const a = new Applier(xt);
    await a.prepare();
    const saves = () => calls.filter((c) => c.file.endsWith('-save')).length;
    expect(saves()).toBe(1);
    await a.prepare(); // the sync's own call keeps the recent save
    expect(saves()).toBe(1);
    // Meanwhile `pier cleanup` (or a person) removes pier's chains: the
    // restore built from the earlier save deletes a chain that is gone, and fails.
    await removeAll(new Xtables('ipv4', 'nft', commandRunner(['ip', 'netns', 'exec', s.ns])));
    const r = await a.apply(ruleset(3));
    expect(r.mode).toBe('full');
    expect(saves()).toBe(2);
    expect(calls.filter((c) => c.file.endsWith('-restore'))).toHaveLength(2);
    expect(await pierState()).toEqual(await expected(ruleset(3)));
  });

  it("starts the first rewrite's iptables-restore ahead, where it waits for its payload and holds nothing", async () => {
    const a = new Applier(xt);
    await a.prepare();
    const restores = () => calls.filter((c) => c.file.endsWith('-restore'));
    expect(restores()).toHaveLength(1);
    expect(typeof restores()[0]!.input).toBe('object');
    expect(await processesIn(s.ns)).toHaveLength(1);
    // Waiting, it keeps nobody else from changing the tables.
    await s.exec('iptables', ['-t', 'nat', '-N', 'HOST-OWN']);
    expect((await a.apply(ruleset(5))).mode).toBe('full');
    expect(restores()).toHaveLength(1);
    expect(await restores()[0]!.result).toMatchObject({ exitCode: 0 });
    expect(await pierState()).toEqual(await expected(ruleset(5)));
    expect(await processesIn(s.ns)).toEqual([]);
  });

  it('lets a restore started ahead exit unused when the agent stops, and replaces one that died', async () => {
    const before = (await s.exec('iptables-save', [])).stdout.split('\n').filter((l) => l.startsWith('-') || l.startsWith(':'));
    const a = new Applier(xt);
    await a.prepare();
    a.close();
    const restores = () => calls.filter((c) => c.file.endsWith('-restore'));
    expect(await restores()[0]!.result).toMatchObject({ exitCode: 0 });
    expect(await processesIn(s.ns)).toEqual([]);
    expect((await s.exec('iptables-save', [])).stdout.split('\n').filter((l) => l.startsWith('-') || l.startsWith(':'))).toEqual(before);

    const b = new Applier(xt);
    await b.prepare();
    const [pid] = await processesIn(s.ns);
    process.kill(pid!, 'SIGKILL');
    expect(await restores()[1]!.result).toMatchObject({ exitCode: 137 });
    const saves = calls.filter((c) => c.file.endsWith('-save')).length;
    expect((await b.apply(ruleset(4))).mode).toBe('full');
    // A new process for the payload, and the save read ahead still serves.
    expect(restores()).toHaveLength(3);
    expect(calls.filter((c) => c.file.endsWith('-save'))).toHaveLength(saves);
    expect(await pierState()).toEqual(await expected(ruleset(4)));
  });

  it('falls back to a full rewrite when a partial write fails', async () => {
    const a = new Applier(xt);
    await a.apply(ruleset(20));
    failNextRestore = true;
    const r = await a.apply(ruleset(20, 50));
    expect(r.mode).toBe('full');
    expect(r.reason).toMatch(/partial restore failed: .*simulated failure/);
    expect(await pierState()).toEqual(await expected(ruleset(20, 50)));
  });

  it('heals an outside flush at the next verifying sync, and not before', async () => {
    const a = new Applier(xt);
    await a.apply(ruleset(10));
    await s.exec('iptables', ['-t', 'nat', '-F']);
    expect((await a.apply(ruleset(10))).mode).toBe('noop'); // an event-driven sync trusts its memory
    calls.length = 0;
    const r = await a.apply(ruleset(10), { verify: true });
    expect(r).toMatchObject({ mode: 'partial', jumpsInserted: 3 });
    expect(r.drift!.chains.map((c) => `${c.table} ${c.chain} ${c.state}`).sort()).toEqual(
      [...ruleset(10).tables.nat.chains].filter(([, rules]) => rules.length > 0).map(([c]) => `nat ${c} changed`).sort(),
    );
    expect(r.drift!.jumps).toEqual([{ table: 'nat', missing: 3, unwanted: 0 }]);
    expect(calls.map((c) => c.file)).toEqual(['iptables-nft-save', 'iptables-nft-restore']);
    expect(await pierState()).toEqual(await expected(ruleset(10)));
  });

  it('puts back a jump someone deleted, at a verifying sync', async () => {
    const a = new Applier(xt);
    const rs = ruleset(3);
    await a.apply(rs);
    const jump = rs.tables.filter.jumps[0]!;
    await s.exec('iptables', ['-t', 'filter', '-D', jump.chain, ...jump.rule.match(/"[^"]*"|\S+/g)!.map((w) => w.replace(/^"|"$/g, ''))]);
    const r = await a.apply(rs, { verify: true });
    expect(r).toMatchObject({ mode: 'partial', jumpsInserted: 1, drift: { chains: [], jumps: [{ table: 'filter', missing: 1, unwanted: 0 }] } });
    expect(await pierState()).toEqual(await expected(rs));
  });

  for (const backend of ['nft', 'legacy'] as const) {
    it(`a verifying sync over an intact kernel (${backend}) reads one iptables-save and writes nothing; a changed chain, a foreign rule and a stray chain are rewritten in one restore`, async () => {
      const bin = backend === 'nft' ? 'iptables-nft' : 'iptables-legacy';
      const mine: Runner = (file, args, input) => {
        const result = commandRunner(['ip', 'netns', 'exec', s.ns])(file, args, input);
        calls.push({ file, args, input, result });
        return result;
      };
      const a = new Applier(new Xtables('ipv4', backend, mine));
      const rs = ruleset(300);
      await a.apply(rs);
      const kernel = async () => (await s.exec(`${bin}-save`, [])).stdout.split('\n').filter((l) => l.startsWith('-') || l.startsWith(':')).map((l) => l.replace(/\[\d+:\d+\]/, ''));
      const before = await kernel();
      calls.length = 0;
      expect(await a.apply(rs, { verify: true })).toEqual({ family: 'ipv4', mode: 'noop', payloadBytes: 0, jumpsInserted: 0, drift: undefined });
      expect(calls.map((c) => c.file)).toEqual([`${bin}-save`]);

      const [leaf] = [...rs.tables.nat.chains].find(([c]) => c.startsWith('PIER-SVCS-'))!;
      await s.exec(bin, ['-t', 'nat', '-D', leaf, '2']);
      await s.exec(bin, ['-t', 'filter', '-I', 'PIER-FORWARD', '2', '-s', '203.0.113.9/32', '-j', 'ACCEPT']);
      await s.exec(bin, ['-t', 'filter', '-N', 'PIER-STRAY']);
      calls.length = 0;
      const r = await a.apply(rs, { verify: true });
      expect(r.mode).toBe('partial');
      expect(r.drift).toEqual({
        chains: [
          { table: 'nat', chain: leaf, state: 'changed', lost: 1, added: 0 },
          { table: 'filter', chain: 'PIER-FORWARD', state: 'changed', lost: 0, added: 1 },
          { table: 'filter', chain: 'PIER-STRAY', state: 'unwanted', lost: 0, added: 0 },
        ],
        jumps: [],
      });
      expect(calls.map((c) => c.file)).toEqual([`${bin}-save`, `${bin}-restore`]);
      // Only the three chains are named in the payload.
      expect((await inputText(calls[1]!.input))!.split('\n').filter((l) => l.startsWith(':'))).toEqual([`:${leaf} - [0:0]`, ':PIER-FORWARD - [0:0]', ':PIER-STRAY - [0:0]']);
      expect(await kernel()).toEqual(before);
      await removeAll(new Xtables('ipv4', backend, mine));
    });
  }

  it('rewrites both families side by side through nft, each ending exactly as it would alone', async () => {
    // Restores whose payload has been handed over and that have not finished.
    let running = 0;
    let most = 0;
    const inner = commandRunner(['ip', 'netns', 'exec', s.ns]);
    const watching: Runner = (file, args, input) => {
      const result = inner(file, args, input);
      if (!file.endsWith('-restore') || input === undefined) return result;
      void Promise.resolve(input).then(() => {
        most = Math.max(most, ++running);
        void result.finally(() => running--);
      });
      return result;
    };
    const appliers = { ipv4: new Applier(new Xtables('ipv4', 'nft', watching)), ipv6: new Applier(new Xtables('ipv6', 'nft', watching)) };
    const want = (moved: number) => ({ ipv4: ruleset(1500, moved, 'ipv4'), ipv6: ruleset(1500, moved, 'ipv6') });
    // As the agent starts: saves read and restores started ahead, then both rewrites.
    await Promise.all([appliers.ipv4.prepare(), appliers.ipv6.prepare()]);
    const first = await eachFamily('nft', ['ipv4', 'ipv6'], (f) => appliers[f].apply(want(0)[f]));
    expect(first.map((r) => r.mode)).toEqual(['full', 'full']);
    expect(most).toBe(2);
    // Then a change to each, side by side as well.
    const second = await eachFamily('nft', ['ipv4', 'ipv6'], (f) => appliers[f].apply(want(7)[f]));
    expect(second.map((r) => r.mode)).toEqual(['partial', 'partial']);
    for (const f of ['ipv4', 'ipv6'] as const) expect(await pierState(f)).toEqual(await expected(want(7)[f], f));
  });

  it('cleanup removes exactly what pier added', async () => {
    await s.exec('iptables', ['-A', 'FORWARD', '-s', '203.0.113.0/24', '-j', 'DROP']);
    const before = (await s.exec('iptables-save', [])).stdout.split('\n').filter((l) => l.startsWith('-'));
    const a = new Applier(xt);
    await a.apply(ruleset(30));
    const removed = await removeAll(xt);
    expect(removed.chains).toBeGreaterThan(5);
    expect(removed.jumps).toBe(ruleset(30).tables.nat.jumps.length + ruleset(30).tables.filter.jumps.length);
    expect(await pierState()).toEqual([]);
    expect((await s.exec('iptables-save', [])).stdout.split('\n').filter((l) => l.startsWith('-'))).toEqual(before);
  });
});
