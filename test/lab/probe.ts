// The lab's client: makes `count` TCP connections or UDP exchanges to
// host:port, one at a time, and prints one JSON line per attempt with who
// answered, what source address they saw, and how long it took. Runs as its
// own process inside a client (or node) namespace.
import { createSocket } from 'node:dgram';
import { connect, isIPv6 } from 'node:net';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: {
    proto: { type: 'string', default: 'tcp' },
    host: { type: 'string' },
    port: { type: 'string' },
    count: { type: 'string', default: '1' },
    timeout: { type: 'string', default: '2000' },
    interval: { type: 'string', default: '0' },
    payload: { type: 'string', default: 'ping' },
    /** TCP: connect from this source port (to reuse one, as a busy client's port range does). */
    sport: { type: 'string' },
  },
});
if (!values.host || !values.port) {
  process.stderr.write('probe: --host and --port are required\n');
  process.exit(2);
}
const host = values.host;
const port = Number(values.port);
const timeoutMs = Number(values.timeout);

interface Attempt {
  ok: boolean;
  ms: number;
  /** When the attempt began, epoch ms: to line failures up with the agents' logs. */
  at?: number;
  reply?: unknown;
  error?: string;
}

function tcpOnce(): Promise<Attempt> {
  const start = performance.now();
  return new Promise((resolve) => {
    let data = '';
    const sock = connect({ host, port, timeout: timeoutMs, ...(values.sport ? { localPort: Number(values.sport) } : {}) });
    const finish = (a: Omit<Attempt, 'ms'>) => {
      sock.destroy();
      resolve({ ...a, ms: Math.round((performance.now() - start) * 1000) / 1000 });
    };
    sock.setEncoding('utf8');
    sock.on('data', (d) => (data += d));
    sock.on('end', () => finish(parse(data)));
    sock.on('timeout', () => finish({ ok: false, error: 'timeout' }));
    sock.on('error', (err: NodeJS.ErrnoException) => finish({ ok: false, error: err.code ?? err.message }));
  });
}

function udpOnce(): Promise<Attempt> {
  const start = performance.now();
  return new Promise((resolve) => {
    const sock = createSocket(isIPv6(host) ? 'udp6' : 'udp4');
    const timer = setTimeout(() => finish({ ok: false, error: 'timeout' }), timeoutMs);
    const finish = (a: Omit<Attempt, 'ms'>) => {
      clearTimeout(timer);
      sock.close();
      resolve({ ...a, ms: Math.round((performance.now() - start) * 1000) / 1000 });
    };
    sock.on('message', (msg) => finish(parse(msg.toString('utf8'))));
    // An ICMP port unreachable surfaces as ECONNREFUSED on a connected socket.
    sock.on('error', (err: NodeJS.ErrnoException) => finish({ ok: false, error: err.code ?? err.message }));
    sock.connect(port, host, () => sock.send(values.payload!));
  });
}

function parse(text: string): Omit<Attempt, 'ms'> {
  try {
    return { ok: true, reply: JSON.parse(text.trim()) };
  } catch {
    return { ok: false, error: `unparsable reply ${JSON.stringify(text)}` };
  }
}

const once = values.proto === 'udp' ? udpOnce : tcpOnce;
const count = Number(values.count);
const interval = Number(values.interval);
for (let i = 0; i < count; i++) {
  const at = Date.now();
  process.stdout.write(`${JSON.stringify({ at, ...(await once()) })}\n`);
  if (interval > 0 && i + 1 < count) await new Promise((r) => setTimeout(r, interval));
}
