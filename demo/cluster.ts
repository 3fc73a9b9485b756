// The demo's view of its cluster (test/cluster): the builds it may have to
// wait for, and the two things it waits on after `kubectl expose`: the
// addresses in a Service's status, and answers.
import type { CoreV1Api } from '@kubernetes/client-node';
import { ensureBinaries } from '../test/cluster/controlplane.ts';
import { ensureImages } from '../test/images/images.ts';
import type { Endpoint, Lab } from '../test/lab/lab.ts';
import { eventually } from '../test/support/wait.ts';
import type { Answer } from './format.ts';

export interface Target {
  proto: 'tcp' | 'udp';
  host: string;
  port: number;
}

/**
 * Kubernetes (test/cluster/build.sh) and the images (test/images/build.sh),
 * side by side as startCluster would; both are cached, so this costs a second
 * unless it is the first run. Returns how long each took.
 */
export async function ensureBuilt(): Promise<{ kubernetes: number; images: number }> {
  const started = performance.now();
  const took = (p: Promise<unknown>) => p.then(() => performance.now() - started);
  const [kubernetes, images] = await Promise.all([took(ensureBinaries()), took(ensureImages())]);
  return { kubernetes, images };
}

/** Until the Service's status lists exactly these addresses (the controller writes them). */
export async function waitForAddresses(core: CoreV1Api, name: string, want: string[]): Promise<void> {
  const sorted = [...want].sort().join();
  await eventually(
    `the Service ${name}'s status to list ${want.join(', ')}`,
    async () => {
      const svc = await core.readNamespacedService({ namespace: 'default', name });
      return (svc.status?.loadBalancer?.ingress ?? []).map((i) => i.ip).sort().join() === sorted;
    },
    { timeoutMs: 60_000, intervalMs: 200 },
  );
}

/** Until every target answers from `client`, i.e. every agent has programmed its node. */
export async function waitUntilAnswered(lab: Lab, client: Endpoint, targets: Target[]): Promise<void> {
  await Promise.all(
    targets.map((t) =>
      eventually(
        `an answer from ${t.proto} ${t.host}:${t.port}`,
        async () => (await lab.probe(client, t.host, t.port, { proto: t.proto, timeoutMs: 1000 }))[0]?.ok === true,
        { timeoutMs: 60_000, intervalMs: 200 },
      ),
    ),
  );
}

/** `count` requests to each target, one after the other. */
export async function requests(lab: Lab, client: Endpoint, targets: Target[], count: number): Promise<Answer[]> {
  const answers: Answer[] = [];
  for (const t of targets) {
    for (const r of await lab.probe(client, t.host, t.port, { proto: t.proto, count, timeoutMs: 2000 })) {
      answers.push({ proto: t.proto, address: t.host, port: t.port, ms: r.ms, reply: r.reply, error: r.error });
    }
  }
  return answers;
}
