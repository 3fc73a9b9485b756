// What a Prometheus scrape of the agent and the controller finds: the
// standard process_* and nodejs_* names (not under pier_*_process_), and
// pier_build_info saying which pier runs.
import { afterEach, describe, expect, it } from 'vitest';
import { agentMetrics } from '../../agent/metrics.ts';
import { controllerMetrics } from '../../controller/metrics.ts';
import { startHealthServer } from '../../lib/health.ts';
import { VERSION } from '../../lib/version.ts';

describe('/metrics', () => {
  const closers: (() => Promise<void>)[] = [];
  afterEach(async () => {
    for (const close of closers.splice(0)) await close();
  });

  async function scrape(registry: Parameters<typeof startHealthServer>[0]['registry']): Promise<string> {
    const h = await startHealthServer({ address: '127.0.0.1', port: 0, registry, ready: () => ({ ok: true, detail: 'ok' }) });
    closers.push(h.close);
    const res = await fetch(`http://127.0.0.1:${h.port}/metrics`);
    expect(res.status).toBe(200);
    return res.text();
  }

  const sample = (text: string, name: string) => new RegExp(`^${name}(\\{[^}]*\\})? \\S+$`, 'm').test(text);

  it("shows the agent's process metrics by their standard names and its build", async () => {
    const m = agentMetrics();
    m.buildInfo('iptables', 'nft');
    const text = await scrape(m.registry);
    for (const name of ['process_resident_memory_bytes', 'process_cpu_seconds_total', 'nodejs_heap_size_used_bytes']) expect(sample(text, name), name).toBe(true);
    expect(text).not.toMatch(/process_process|pier_agent_process_/);
    expect(text).toContain(`pier_build_info{version="${VERSION}",component="agent",backend="iptables",iptables_backend="nft"} 1`);
  });

  it('has one build line for the agent, of the backend chosen last', async () => {
    const m = agentMetrics();
    m.buildInfo('iptables', 'legacy');
    m.buildInfo('nftables', '');
    const lines = (await scrape(m.registry)).split('\n').filter((l) => l.startsWith('pier_build_info{'));
    expect(lines).toEqual([`pier_build_info{version="${VERSION}",component="agent",backend="nftables",iptables_backend=""} 1`]);
  });

  it("shows the controller's the same way", async () => {
    const text = await scrape(controllerMetrics().registry);
    expect(sample(text, 'process_resident_memory_bytes')).toBe(true);
    expect(sample(text, 'nodejs_heap_size_used_bytes')).toBe(true);
    expect(text).not.toMatch(/process_process|pier_controller_process_/);
    expect(text).toContain(`pier_build_info{version="${VERSION}",component="controller"} 1`);
  });
});
