// Keeps connecting to each target until a pod answers, as a client waiting
// for a new load balancer would. Prints `{"ready":true}` once running (so a
// caller can start its clock after this process's start-up), then one JSON
// line per target as soon as it is answered or its deadline passes, and
// exits. Runs inside a client namespace; one process can watch thousands of
// targets, `--concurrency` of them at a time.
//
//   node prober.ts --targets 198.51.100.11:80,[2001:db8:0:1::11]:80
//                  [--interval 10] [--timeout 300] [--deadline 30000] [--concurrency 32]
import { connect } from 'node:net';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: {
    targets: { type: 'string' },
    interval: { type: 'string', default: '10' },
    timeout: { type: 'string', default: '300' },
    deadline: { type: 'string', default: '30000' },
    concurrency: { type: 'string', default: '32' },
  },
});
if (!values.targets) {
  process.stderr.write('prober: --targets host:port,... is required\n');
  process.exit(2);
}
const intervalMs = Number(values.interval);
const timeoutMs = Number(values.timeout);
const deadlineMs = Number(values.deadline);

interface Target {
  text: string;
  host: string;
  port: number;
}

function parseTarget(text: string): Target {
  const m = /^\[?([^\]]+?)\]?:(\d+)$/.exec(text.trim());
  if (!m) throw new Error(`prober: bad target ${JSON.stringify(text)}`);
  return { text, host: m[1]!, port: Number(m[2]) };
}

/** One connection: the pod's reply line, or why there was none. */
function attempt(t: Target): Promise<{ reply?: { pod: string; peer: string }; error?: string }> {
  return new Promise((resolve) => {
    let data = '';
    const sock = connect({ host: t.host, port: t.port, timeout: timeoutMs });
    const finish = (r: { reply?: { pod: string; peer: string }; error?: string }) => {
      sock.destroy();
      resolve(r);
    };
    sock.setEncoding('utf8');
    sock.on('data', (d) => (data += d));
    sock.on('end', () => {
      try {
        finish({ reply: JSON.parse(data.trim()) });
      } catch {
        finish({ error: `unparsable reply ${JSON.stringify(data)}` });
      }
    });
    sock.on('timeout', () => finish({ error: 'timeout' }));
    sock.on('error', (err: NodeJS.ErrnoException) => finish({ error: err.code ?? err.message }));
  });
}

async function untilAnswered(t: Target): Promise<void> {
  const start = performance.now();
  let attempts = 0;
  let last = '';
  for (;;) {
    attempts++;
    const r = await attempt(t);
    if (r.reply) {
      process.stdout.write(`${JSON.stringify({ target: t.text, ok: true, attempts, ms: performance.now() - start, pod: r.reply.pod, peer: r.reply.peer })}\n`);
      return;
    }
    last = r.error ?? '';
    if (performance.now() - start > deadlineMs) {
      process.stdout.write(`${JSON.stringify({ target: t.text, ok: false, attempts, ms: performance.now() - start, error: last })}\n`);
      return;
    }
    await new Promise((r2) => setTimeout(r2, intervalMs));
  }
}

const targets = values.targets.split(',').filter((s) => s !== '').map(parseTarget);
process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
let next = 0;
const lane = async () => {
  while (next < targets.length) await untilAnswered(targets[next++]!);
};
await Promise.all(Array.from({ length: Math.max(1, Math.min(Number(values.concurrency), targets.length)) }, lane));
