// One long UDP flow, as a DNS resolver, a game client or a QUIC connection
// makes it: datagrams from one fixed source port to host:port every
// `interval` ms, for as long as the process runs. Prints one JSON line per
// reply, `{ at, pod, peer }` (at: Date.now() when it arrived), so a test can
// tell who served the flow and from when. Runs inside a client namespace.
import { createSocket } from 'node:dgram';
import { isIPv6 } from 'node:net';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: {
    host: { type: 'string' },
    port: { type: 'string' },
    sport: { type: 'string' },
    interval: { type: 'string', default: '100' },
  },
});
if (!values.host || !values.port || !values.sport) {
  process.stderr.write('udp-flow: --host, --port and --sport are required\n');
  process.exit(2);
}
const host = values.host;
const port = Number(values.port);
// Unconnected: an ICMP port unreachable must not end the flow, as it would a connected socket.
const sock = createSocket(isIPv6(host) ? 'udp6' : 'udp4');
sock.on('message', (msg) => {
  try {
    const r = JSON.parse(msg.toString('utf8').trim()) as { pod?: string; peer?: string };
    process.stdout.write(`${JSON.stringify({ at: Date.now(), pod: r.pod, peer: r.peer })}\n`);
  } catch {
    // Not an echo server's reply: ignore.
  }
});
sock.on('error', (err) => process.stderr.write(`udp-flow: ${err.message}\n`));
sock.bind(Number(values.sport), () => {
  let seq = 0;
  const send = () => sock.send(String(seq++), port, host);
  send();
  setInterval(send, Number(values.interval));
  process.stdout.write(`${JSON.stringify({ at: Date.now(), started: true })}\n`);
});
process.on('SIGTERM', () => process.exit(0));
