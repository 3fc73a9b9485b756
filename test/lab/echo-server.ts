// A pod's workload in the lab: answers every TCP connection and every UDP
// datagram with one JSON line naming the pod and the peer address it saw, so
// tests can tell which pod served them and whether the source was preserved.
// Runs as its own process inside a pod namespace (Node strips the types), and
// as the pier/echo:test image's entry point on real nodes (test/images/echo/),
// where the pod's name comes from POD_NAME (the downward API) or the
// hostname, not --name.
import { createSocket } from 'node:dgram';
import { createServer } from 'node:net';
import { hostname } from 'node:os';
import { parseArgs } from 'node:util';

const { values } = parseArgs({ options: { name: { type: 'string' }, port: { type: 'string' } } });
// A pod's hostname is its name, so `kubectl create deployment` needs no env.
const pod = values.name ?? process.env['POD_NAME'] ?? hostname();
const port = Number(values.port ?? '8080');

// Dual-stack sockets report IPv4 peers as ::ffff:a.b.c.d.
const plain = (addr: string | undefined) => (addr ?? '').replace(/^::ffff:(?=\d+\.)/, '');
const answer = (proto: string, peer: string | undefined, peerPort: number | undefined) =>
  `${JSON.stringify({ pod, proto, peer: plain(peer), peerPort })}\n`;

const tcp = createServer((sock) => {
  sock.on('error', () => sock.destroy());
  sock.end(answer('tcp', sock.remoteAddress, sock.remotePort));
});
const udp = createSocket({ type: 'udp6', ipv6Only: false });
udp.on('message', (_msg, rinfo) => udp.send(answer('udp', rinfo.address, rinfo.port), rinfo.port, rinfo.address));

let listening = 0;
const ready = () => {
  if (++listening === 2) process.stdout.write('ready\n');
};
tcp.listen({ port, host: '::', ipv6Only: false }, ready);
udp.bind({ port, address: '::' }, ready);
// As a well-behaved backend does (or a preStop sleep arranges), a pod's echo
// server keeps answering for ECHO_DRAIN_MS after SIGTERM, while the
// EndpointSlice change reaches the load balancers. The lab's own pods exit at once.
const drainMs = Number(process.env['ECHO_DRAIN_MS'] ?? '0');
process.on('SIGINT', () => process.exit(0));
process.on('SIGTERM', () => setTimeout(() => process.exit(0), drainMs));
