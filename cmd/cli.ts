#!/usr/bin/env node
// The single `pier` executable. Each subcommand's argument handling is a
// module of cmd/; this file only dispatches and prints usage.
import { ExplainedError } from '../lib/errors.ts';
import { VERSION } from '../lib/version.ts';

interface Command {
  summary: string;
  /** Loads the command's module only when it runs, so that, say, `pier check` never loads the controller. */
  run: (argv: string[]) => Promise<number>;
}

const COMMANDS: Record<string, Command> = {
  controller: {
    summary: 'assign node addresses and ports to LoadBalancer Services (cluster-wide, leader-elected)',
    run: async (argv) => (await import('./controller.ts')).runController(argv),
  },
  agent: {
    summary: "program this node's iptables for the Services assigned to it (DaemonSet, host network)",
    run: async (argv) => (await import('./agent.ts')).runAgent(argv),
  },
  plan: {
    summary: 'print the iptables-restore input the agent would apply, from manifests on disk, with no cluster',
    run: async (argv) => (await import('./plan.ts')).runPlan(argv),
  },
  trace: {
    summary: "explain what a client's connection to a frontend meets in the rules pier installs on a node",
    run: async (argv) => (await import('./trace.ts')).runTrace(argv),
  },
  cleanup: {
    summary: 'remove every pier chain and rule from this node, IPv4 and IPv6',
    run: async (argv) => (await import('./cleanup.ts')).runCleanup(argv),
  },
  check: {
    summary: 'report whether this node can forward: sysctls, iptables backend, nat and filter tables',
    run: async (argv) => (await import('./check.ts')).runCheck(argv),
  },
  status: {
    summary: 'per pier LoadBalancer Service on a live cluster: addresses, the nodes that serve it and why others do not, port errors',
    run: async (argv) => (await import('./status.ts')).runStatus(argv),
  },
};

export function usage(): string {
  const width = Math.max(...Object.keys(COMMANDS).map((c) => c.length));
  const lines = Object.entries(COMMANDS).map(([name, c]) => `  ${name.padEnd(width)}  ${c.summary}`);
  return [
    `pier ${VERSION}: LoadBalancer Services for bare-metal and local Kubernetes`,
    '',
    'Usage: pier <command> [flags]',
    '',
    'Commands:',
    ...lines,
    '',
    'Run `pier <command> --help` for the flags of a command.',
    '',
  ].join('\n');
}

export async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    process.stdout.write(usage());
    return name === undefined ? 2 : 0;
  }
  if (name === '--version' || name === 'version') {
    process.stdout.write(`${VERSION}\n`);
    return 0;
  }
  const cmd = COMMANDS[name];
  if (!cmd) {
    process.stderr.write(`pier: unknown command ${JSON.stringify(name)}\n\n${usage()}`);
    return 2;
  }
  return cmd.run(rest);
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    // Errors pier explains itself get one line; anything else is a bug and keeps its stack.
    const known = err instanceof ExplainedError;
    process.stderr.write(`pier: ${known ? (err as Error).message : err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exitCode = 1;
  },
);
