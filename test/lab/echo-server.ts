// A pod's workload in the lab: answers every TCP connection and every UDP
// datagram with one JSON line naming the pod and the peer address it saw, so
// tests can tell which pod served them and whether the source was preserved.
// Runs as its own process inside a pod namespace (Node strips the types).
import { createSocket } from 'node:dgram';
import { createServer } from 'node:net';
import { parseArgs } from 'node:util';

const { values } = parseArgs({ options: { name: { type: 'string' }, port: { type: 'string' } } });
const pod = values.name ?? 'unnamed';
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
for (const sig of ['SIGTERM', 'SIGINT'] as const) process.on(sig, () => process.exit(0));
