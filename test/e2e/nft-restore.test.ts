// Rendered nftables tables against the real nft, in a scratch network
// namespace: every script is accepted, and what `nft -j list table` shows
// afterwards is what the renderer meant (nftDrift finds nothing), whether the
// table was written whole or reached through a delta. That is what lets the
// agent change a few elements per sync and still judge drift by reading back.
// Deltas go through a resident nft (NftSession), as the agent sends them.
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { commandRunner, type Runner } from '../../lib/run.ts';
import { createScript, elementScripts, NFT_FAMILY, NFT_TABLE, NftRenderer, nftDrift, nftScript, parseNftJson, type NftRuleset } from '../../agent/nftables/render.ts';
import { NftApplier } from '../../agent/nftables/applier.ts';
import { NftSession } from '../../agent/nftables/session.ts';
import type { Family } from '../../lib/contract.ts';
import { scratchNamespace, type Scratch } from '../lab/scratch.ts';
import { inputText } from '../support/input.ts';
import { MARKS, modelArb, toInput, worldArb } from '../unit/agent-fixtures.ts';
import { buildModel, renderNft } from '../support/oracle.ts';

describe('pier tables through nft', () => {
  let s: Scratch;
  let session: NftSession;
  beforeAll(async () => {
    s = await scratchNamespace();
    session = new NftSession(commandRunner(['nsenter', `--net=/run/netns/${s.ns}`]).start!);
  });
  afterAll(async () => {
    session?.close();
    await s?.destroy();
  });

  const nft = (script: string) => s.exec('nft', ['-f', '-'], { input: script });
  const drift = async (family: Family, want: NftRuleset) =>
    nftDrift(want, parseNftJson((await s.exec('nft', ['-j', 'list', 'table', NFT_FAMILY[family], NFT_TABLE])).stdout));

  it('accepts every table, written whole or reached through a delta, and reads back exactly what was meant', async () => {
    let runs = 0;
    let deltas = 0;
    await fc.assert(
      fc.asyncProperty(modelArb, modelArb, async (a, b) => {
        runs++;
        for (const family of ['ipv4', 'ipv6'] as const) {
          const r = new NftRenderer(family, MARKS.masquerade);
          const first = r.update(a[family]);
          await nft(nftScript(first.state));
          expect(await drift(family, first.state), `${family} whole`).toEqual([]);
          const { delta, state } = r.update(b[family]);
          if (delta !== '') {
            deltas++;
            await session.run(delta!);
          }
          expect(await drift(family, state), `${family} delta\n${delta}`).toEqual([]);
          // Written whole over an existing table: the same state again.
          await nft(nftScript(state));
          expect(await drift(family, state), `${family} rewrite`).toEqual([]);
          // Written where no table is: created empty, then its elements in parts side by side.
          await s.exec('nft', ['delete', 'table', NFT_FAMILY[family], NFT_TABLE]);
          await nft(createScript(state));
          await Promise.all(elementScripts(state, 2).map((e) => nft(e)));
          expect(await drift(family, state), `${family} fresh`).toEqual([]);
        }
      }),
      { numRuns: 25 },
    );
    expect(runs).toBe(25);
    // The property is only worth something if most pairs did change something.
    expect(deltas).toBeGreaterThan(25);
  }, 600_000);

  it('a resident nft reports what it refuses, in nft\'s words, changes nothing then, and outlives its process', async () => {
    const want = renderNft(buildModel(toInput({ services: [] })).ipv4, MARKS.masquerade);
    await nft(nftScript(want));
    const add = 'add element ip pier no-endpoints { 192.0.2.11 . tcp . 80 }';
    // The second command fails: the transaction as a whole is refused.
    await expect(session.run(`${add}\nadd element ip pier no-such-set { 192.0.2.11 . tcp . 81 }`)).rejects.toThrow(/nft refused the transaction: .*No such file or directory/);
    const elements = async () => (await s.exec('nft', ['list', 'set', 'ip', 'pier', 'no-endpoints'])).stdout;
    expect(await elements()).not.toContain('192.0.2.11');
    await session.run(add);
    expect(await elements()).toContain('192.0.2.11 . tcp . 80');
    // Its process gone under way: that transaction fails, and the next starts another.
    await expect(session.run('quit')).rejects.toThrow(/nft -i exited \(code 0\)/);
    await session.run('add element ip pier no-endpoints { 192.0.2.11 . tcp . 82 }');
    expect(await elements()).toContain('192.0.2.11 . tcp . 82');
  });

  it('a first write creates the table and fills it in parts; over a table, or when a part fails, it replaces it whole', async () => {
    const w = fc.sample(worldArb.filter((x) => buildModel(toInput(x)).ipv4.ports.filter((p) => p.endpoints.length > 0).length > 3), { numRuns: 1, seed: 11 })[0]!;
    const model = buildModel(toInput(w)).ipv4;
    const want = new NftRenderer('ipv4', MARKS.masquerade).update(model);
    const base = commandRunner(['nsenter', `--net=/run/netns/${s.ns}`]);
    /** The real nft, each script it was given recorded; `after` runs once a script succeeded. */
    const recording = (after?: (script: string) => Promise<void>) => {
      const scripts: string[] = [];
      const run: Runner = async (file, args, input) => {
        const text = await inputText(input);
        // An empty script (a part told there is nothing to write) does nothing.
        if (text) scripts.push(text);
        const r = await base(file, args, text);
        if (r.exitCode === 0 && text !== undefined) await after?.(text);
        return r;
      };
      return { run, scripts };
    };
    await s.exec('nft', ['delete', 'table', 'ip', NFT_TABLE]).catch(() => undefined);

    const boot = recording();
    const first = new NftApplier('ipv4', boot.run);
    expect(await first.apply(want)).toMatchObject({ mode: 'full' });
    expect(boot.scripts[0]).toMatch(/^create table ip pier \{ comment "[^"]+"; \}\n/);
    expect(boot.scripts.length).toBeGreaterThanOrEqual(2);
    for (const part of boot.scripts.slice(1)) expect(part).toMatch(/^(add element ip pier \S+ \{ [^\n]+ \}\n)+$/);
    expect(await drift('ipv4', want.state)).toEqual([]);
    // The table as a whole write leaves it, its comment too.
    const listed = async () => (await s.exec('nft', ['list', 'table', 'ip', NFT_TABLE])).stdout.split('\n').slice(0, 2).join('\n');
    const head = await listed();
    expect(head).toBe('table ip pier {\n\tcomment "pier: LoadBalancer frontends of this node; managed by pier agent"');

    // An agent's restart: the table is there, and is replaced in one transaction.
    const restart = recording();
    const restarted = new NftApplier('ipv4', restart.run);
    expect(await restarted.apply(want)).toMatchObject({ mode: 'full' });
    expect(restart.scripts.map((x) => x.split('\n')[0])).toEqual(['create table ip pier { comment "pier: LoadBalancer frontends of this node; managed by pier agent"; }', 'add table ip pier']);
    expect(await drift('ipv4', want.state)).toEqual([]);
    expect(await listed()).toBe(head);
    // Its later whole writes (here: the table deleted from outside) replace it in one transaction.
    await s.exec('nft', ['delete', 'table', 'ip', NFT_TABLE]);
    const again = recording();
    const later = new NftApplier('ipv4', again.run);
    const renderer = new NftRenderer('ipv4', MARKS.masquerade);
    await later.apply(renderer.update(model));
    await s.exec('nft', ['delete', 'table', 'ip', NFT_TABLE]);
    const before = again.scripts.length;
    expect(await later.apply(renderer.update(model), { verify: true })).toMatchObject({ mode: 'full', reason: 'drift' });
    expect(again.scripts.slice(before).map((x) => x.split('\n')[0])).toEqual(['add table ip pier']);
    expect(await drift('ipv4', want.state)).toEqual([]);

    // The table deleted under way, between the create and the parts: those fail, and it is written whole.
    await s.exec('nft', ['delete', 'table', 'ip', NFT_TABLE]);
    const raced = recording(async (script) => {
      if (script.startsWith('create table')) await s.exec('nft', ['delete', 'table', 'ip', NFT_TABLE]);
    });
    const racing = new NftApplier('ipv4', raced.run);
    expect(await racing.apply(want)).toMatchObject({ mode: 'full' });
    expect(raced.scripts.at(-1)!.split('\n')[0]).toBe('add table ip pier');
    expect(await drift('ipv4', want.state)).toEqual([]);
    for (const a of [first, restarted, later, racing]) a.close();
  });

  it('sees what another program changed in the table', async () => {
    const w = fc.sample(worldArb.filter((x) => buildModel(toInput(x)).ipv4.ports.some((p) => p.endpoints.length > 0)), { numRuns: 1, seed: 7 })[0]!;
    const want = renderNft(buildModel(toInput(w)).ipv4, MARKS.masquerade);
    await nft(nftScript(want));
    expect(await drift('ipv4', want)).toEqual([]);
    await s.exec('nft', ['flush', 'chain', 'ip', NFT_TABLE, 'nat-prerouting']);
    expect(await drift('ipv4', want)).toContain('chain nat-prerouting: 0 rules, wrote 1');
    await nft(nftScript(want));
    await s.exec('nft', ['flush', 'map', 'ip', NFT_TABLE, 'services']);
    expect((await drift('ipv4', want)).join('\n')).toMatch(/^set services: [1-9]\d* missing, 0 unwanted$/m);
    await s.exec('nft', ['add', 'chain', 'ip', NFT_TABLE, 'stray']);
    expect(await drift('ipv4', want)).toContain('chain stray: not pier\'s');
  });
});
