// pier itself in the demo: the controller as a process on this machine (it
// only needs the API server), and one agent per lab node inside that node's
// network namespace, where it programs the node's iptables. Their JSON logs
// go to files a person can tail while the demo runs.
import { createWriteStream } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import type { Lab } from '../test/lab/lab.ts';
import { atExit } from '../test/support/cleanup.ts';

const CLI = fileURLToPath(new URL('../lib/cli.ts', import.meta.url));

export interface Pier {
  /** Log file per process: controller, agent-<node>. */
  logs: Record<string, string>;
  /** Stops the controller; the agents stop with the lab. */
  stop(): Promise<void>;
}

export function startPier(lab: Lab, kubeconfig: string, logDir: string): Pier {
  const logs: Record<string, string> = { controller: join(logDir, 'controller.log') };
  // The parent-death signal ends the controller even if the demo is SIGKILLed.
  const controller = execa(
    'setpriv',
    ['--pdeathsig', 'SIGKILL', '--', process.execPath, CLI, 'controller', '--kubeconfig', kubeconfig, '--health-address', '127.0.0.1', '--health-port', '0'],
    { stdin: 'ignore', stdout: { file: logs['controller']! }, stderr: { file: logs['controller']! }, reject: false },
  );
  const unregister = atExit(() => controller.kill('SIGKILL'));

  for (const n of lab.nodes) {
    const file = join(logDir, `agent-${n.name}.log`);
    logs[`agent-${n.name}`] = file;
    const agent = lab.spawn(n.ns, process.execPath, [CLI, 'agent', '--node-name', n.name, '--kubeconfig', kubeconfig]);
    const out = createWriteStream(file);
    agent.stdout?.pipe(out, { end: false });
    agent.stderr?.pipe(out, { end: false });
    void agent.finally(() => out.end());
  }

  return {
    logs,
    async stop() {
      controller.kill('SIGTERM');
      const force = setTimeout(() => controller.kill('SIGKILL'), 10_000);
      await controller;
      clearTimeout(force);
      unregister();
    },
  };
}
