// The lab is real before pier touches it: a client reaches a pod behind each
// node by plain routing, over IPv4 and IPv6, TCP and UDP, and the pod names
// itself and reports the client's own address.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ECHO_PORT, Lab, listLabNamespaces, sweepStaleLabs, type ProbeResult } from '../lab/lab.ts';

describe('network lab', () => {
  let lab: Lab;
  beforeAll(async () => {
    lab = await Lab.create({ nodes: [2, 2], clients: 1 });
  });
  afterAll(async () => {
    await lab?.destroy();
  });

  for (const family of ['v4', 'v6'] as const) {
    for (const proto of ['tcp', 'udp'] as const) {
      it(`client reaches a pod on every node over ${family} ${proto}`, async () => {
        const client = lab.clients[0]!;
        for (const node of lab.nodes) {
          const pod = node.pods[0]!;
          const [res] = await lab.probe(client, pod[family], ECHO_PORT, { proto });
          expect(res, `${pod.name} ${family} ${proto}`).toMatchObject({
            ok: true,
            reply: { pod: pod.name, proto, peer: client[family] },
          });
        }
      });
    }
  }

  it('answers over IPv6 as soon as it is made: the first SYN through a new node is not lost', async () => {
    const fresh = await Lab.create({ nodes: [1], clients: 1 });
    try {
      // Under the first retransmit (1 s): a tentative link-local address on
      // the new links lost the first SYN in 10 of 12 labs (noDad in lab.ts).
      const [res] = await fresh.probe(fresh.clients[0]!, fresh.pods[0]!.v6, ECHO_PORT, { proto: 'tcp', timeoutMs: 900 });
      expect(res).toMatchObject({ ok: true, reply: { pod: fresh.pods[0]!.name } });
    } finally {
      await fresh.destroy();
    }
  });

  it('pods on different nodes reach each other through their nodes', async () => {
    const [a, b] = [lab.nodes[0]!.pods[0]!, lab.nodes[1]!.pods[1]!];
    const [res] = await lab.probe(a, b.v6, ECHO_PORT, { proto: 'tcp' });
    expect(res).toMatchObject({ ok: true, reply: { pod: b.name, peer: a.v6 } });
  });

  it('a port nobody listens on is refused, not answered', async () => {
    const [res] = await lab.probe(lab.clients[0]!, lab.pods[0]!.v4, ECHO_PORT + 1, { proto: 'tcp' });
    expect(res).toMatchObject({ ok: false, error: 'ECONNREFUSED' });
  });

  it('names every namespace after this run and tears them all down', async () => {
    const mine = listLabNamespaces().filter((n) => n.includes(lab.runId));
    // underlay + 2 nodes + 4 pods + 1 client
    expect(mine).toHaveLength(8);
    const scratch = await Lab.create({ nodes: [1], clients: 1, hostLink: true });
    const scratchNs = listLabNamespaces().filter((n) => n.includes(scratch.runId));
    expect(scratchNs).toHaveLength(4);
    await scratch.destroy();
    expect(listLabNamespaces().filter((n) => n.includes(scratch.runId))).toEqual([]);
    // The other lab survived the second one's start-up sweep.
    expect(listLabNamespaces().filter((n) => n.includes(lab.runId))).toHaveLength(8);
  });
});

describe('lab sweep', () => {
  it('removes what a SIGKILLed run left behind, and nothing of a live run', async () => {
    const live = await Lab.create({ nodes: [1], clients: 0 });
    try {
      const labModule = new URL('../lab/lab.ts', import.meta.url).href;
      const script = `const { Lab } = await import(${JSON.stringify(labModule)});
const lab = await Lab.create({ nodes: [1], clients: 1, hostLink: true });
process.stdout.write(lab.runId + '\\n');
setInterval(() => {}, 1000);`;
      const child = execa(process.execPath, ['--input-type=module', '-e', script], { reject: false, buffer: false });
      const runId = await new Promise<string>((resolve, reject) => {
        child.stdout!.once('data', (d: Buffer) => resolve(d.toString().trim()));
        void child.then((r) => reject(new Error(`child exited early: ${r.stderr ?? ''}`)));
      });
      child.kill('SIGKILL');
      await child;
      const leftovers = listLabNamespaces().filter((n) => n.includes(runId));
      expect(leftovers.length).toBeGreaterThan(0); // the crash really left something
      const hostLinkLeft = await execa('ip', ['link', 'show', `pl${runId}`], { reject: false });
      expect(hostLinkLeft.exitCode).toBe(0);

      const removed = sweepStaleLabs();
      expect(removed).toEqual(expect.arrayContaining(leftovers));
      expect(listLabNamespaces().filter((n) => n.includes(runId))).toEqual([]);
      expect((await execa('ip', ['link', 'show', `pl${runId}`], { reject: false })).exitCode).not.toBe(0);
      expect(listLabNamespaces().filter((n) => n.includes(live.runId)).length).toBe(3);
    } finally {
      await live.destroy();
    }
  });
});

describe('lab sites', () => {
  it('two labs with a host link at once, one per site, each reached from the root namespace through its own link', async () => {
    const made = await Promise.allSettled([
      Lab.create({ nodes: [0, 0], clients: 1, hostLink: true, site: 0 }),
      // Site 5: sites 1 to 4 may hold the upstream specs' clusters of the same run (scripts/test.sh).
      Lab.create({ nodes: [0, 0], clients: 1, hostLink: true, site: 5 }),
    ]);
    const labs = made.flatMap((m) => (m.status === 'fulfilled' ? [m.value] : []));
    try {
      for (const m of made) if (m.status === 'rejected') throw m.reason;
      const addresses = labs.flatMap((l) => [l.hostV4, l.hostV6, ...[...l.nodes, ...l.clients].flatMap((e) => [e.v4, e.v6]), ...l.nodes.flatMap((n) => [n.podCidrV4, n.podCidrV6])]);
      expect(new Set(addresses).size, 'the sites share an address or a pod subnet').toBe(addresses.length);

      const probe = fileURLToPath(new URL('../lab/probe.ts', import.meta.url));
      for (const lab of labs) {
        for (const node of lab.nodes) {
          await lab.hostEcho(node);
          for (const [address, host] of [[node.v4, lab.hostV4], [node.v6, lab.hostV6]] as const) {
            // From the root namespace itself: the source it picks shows which link the route took.
            const { stdout } = await execa(process.execPath, [probe, '--proto', 'tcp', '--host', address, '--port', String(ECHO_PORT)]);
            const res = JSON.parse(stdout) as ProbeResult;
            expect(res, `site ${lab.site.index} ${node.name} at ${address}`).toMatchObject({ ok: true, reply: { pod: `${node.name}-host`, peer: host } });
          }
        }
      }
    } finally {
      await Promise.all(labs.map((l) => l.destroy()));
    }
    for (const lab of labs) {
      expect(listLabNamespaces().filter((n) => n.includes(lab.runId))).toEqual([]);
      expect((await execa('ip', ['link', 'show', lab.hostLink!], { reject: false })).exitCode).not.toBe(0);
      // Released: another run may hold it by now, but not this process.
      const holder = (() => {
        try {
          return readFileSync(`${lab.site.hostLinkLock}/owner`, 'utf8');
        } catch {
          return '';
        }
      })();
      expect(holder).not.toBe(String(process.pid));
    }
  });
});
