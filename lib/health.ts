// /healthz, /readyz and /metrics on one small HTTP server, for probes and
// Prometheus. Liveness means "the process is serving"; readiness is what
// the component says it is (the agent: after its first successful sync).
import { createServer, type Server } from 'node:http';
import type { Registry } from 'prom-client';

export interface HealthOptions {
  address: string;
  port: number;
  registry: Registry;
  ready: () => { ok: boolean; detail: string };
  live?: () => { ok: boolean; detail: string };
}

export async function startHealthServer(opts: HealthOptions): Promise<{ server: Server; port: number; close: () => Promise<void> }> {
  const server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const reply = (code: number, body: string, type = 'text/plain; charset=utf-8') => {
      res.writeHead(code, { 'content-type': type });
      res.end(body);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return reply(405, 'method not allowed\n');
    if (path === '/healthz' || path === '/livez') {
      const l = opts.live?.() ?? { ok: true, detail: 'ok' };
      return reply(l.ok ? 200 : 503, `${l.detail}\n`);
    }
    if (path === '/readyz') {
      const r = opts.ready();
      return reply(r.ok ? 200 : 503, `${r.detail}\n`);
    }
    if (path === '/metrics') {
      opts.registry.metrics().then(
        (text) => reply(200, text, opts.registry.contentType),
        (err: unknown) => reply(500, `${(err as Error).message}\n`),
      );
      return;
    }
    reply(404, 'not found: try /healthz, /readyz or /metrics\n');
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.address, () => resolve());
  });
  const addr = server.address();
  return {
    server,
    port: typeof addr === 'object' && addr ? addr.port : opts.port,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}
