// The README's commands, read from README.md itself so that the README and
// the tests cannot drift apart (issue 30: "every command in it is run by a
// test"), and run as written.
//
// - readmeCommands(): every command a reader is told to run: each command
//   line of a fenced ```sh/bash/shell/console block, each `$ ` line of an
//   untagged block (a transcript), and each inline code span in the prose
//   that begins with a command (kubectl, helm, pier, ./scripts/…). A small
//   hand-written parser: no Markdown library is a dependency (package.json),
//   and fences, `$ ` lines and code spans are all it needs to know; adding
//   one (marked, micromark) for this would put a runtime-sized package in
//   the tests for twenty lines.
// - README_RUNS: the registry of runs. Each names the README section, the
//   commands it runs (as the README writes them), the test that runs them,
//   and, visibly, each substitution a test must make and why. Tests call
//   runReadme(id) / spawnReadme(id); test/unit/readme-commands.test.ts checks
//   that every README command is claimed by a run whose test file calls it,
//   or listed in README_NOT_RUN with the reason it cannot run here.
// - runReadme(): runs each command with `bash -c` on the README's own text
//   (after the listed substitutions), from the repository's root. Running
//   shell text is acceptable here because the text is our own README's;
//   nothing from the cluster is ever put into it: values a test supplies
//   (the image built here, a node's name, the kubeconfig) go in environment
//   variables, and a substitution only ever writes a fixed `"$VARIABLE"`.
import { appendFileSync, chmodSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa, type Options, type ResultPromise } from 'execa';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));
export const README = join(ROOT, 'README.md');

export interface ReadmeCommand {
  /** The heading the command sits under: its section. */
  section: string;
  /** A fenced block's command line, a transcript's `$ ` line, or a code span in the prose. */
  kind: 'block' | 'transcript' | 'inline';
  /** The command as written, trailing `# comment` and `$ ` prompt removed, backslash continuations joined. */
  text: string;
  /** The line as written (comment included), what runReadme runs. */
  line: string;
  /** 1-based line in README.md. */
  lineNo: number;
}

/** A fenced block with no shell tag whose lines read like commands yet are no transcript (no `$ `): a listing. */
export interface ReadmeListing {
  section: string;
  lineNo: number;
  firstLine: string;
}

const SHELL_TAGS = new Set(['sh', 'bash', 'shell', 'console', 'shell-session', 'zsh']);
/** What a code span or an untagged block's line starts with when it is a command. */
const COMMAND_WORDS = /^(?:sudo\s+)?(?:kubectl|helm|pier|\.?\/?scripts\/\S+|docker|podman|buildah|kind|ctr|k3s|curl|sysctl|iptables-save|ip6tables-save|iptables|nft|ln|kustomize|npm|npx|node|bash|git|make|go|apt-get|systemctl)(?:\s|$)/;

/** `line` without a trailing `# comment` (a `#` after whitespace, outside quotes). */
function stripComment(line: string): string {
  let quote = '';
  for (let i = 0; i < line.length; i++) {
    const c = line[i]!;
    if (quote) {
      if (c === quote) quote = '';
      else if (c === '\\' && quote === '"') i++;
    } else if (c === "'" || c === '"') quote = c;
    else if (c === '\\') i++;
    else if (c === '#' && (i === 0 || /\s/.test(line[i - 1]!))) return line.slice(0, i).trimEnd();
  }
  return line.trimEnd();
}

/** Every command in `markdown` (README.md by default), in order, and the listings that look like commands. */
export function parseReadme(markdown: string = readFileSync(README, 'utf8')): { commands: ReadmeCommand[]; listings: ReadmeListing[] } {
  const lines = markdown.split('\n');
  const commands: ReadmeCommand[] = [];
  const listings: ReadmeListing[] = [];
  let section = '';
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    const fence = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)/.exec(line);
    if (fence) {
      // CommonMark: the block ends at a fence of the same character, at least as long.
      const [, marker, tag] = fence;
      const close = new RegExp(`^ {0,3}${marker![0] === '`' ? '`' : '~'}{${marker!.length},}\\s*$`);
      const start = i;
      const body: string[] = [];
      for (i++; i < lines.length && !close.test(lines[i]!); i++) body.push(lines[i]!);
      const language = tag!.toLowerCase();
      if (SHELL_TAGS.has(language)) {
        for (let j = 0; j < body.length; j++) {
          let raw = body[j]!;
          const lineNo = start + 2 + j;
          // Backslash continuations are one command.
          while (/\\$/.test(raw) && j + 1 < body.length) raw = `${raw.slice(0, -1).trimEnd()} ${body[++j]!.trim()}`;
          const prompt = /^\s*\$ /.test(raw);
          const withoutPrompt = prompt ? raw.replace(/^\s*\$ /, '') : raw;
          const text = stripComment(withoutPrompt).trim();
          // `console` blocks are transcripts: only their `$ ` lines are commands.
          if (text === '' || (language === 'console' && !prompt)) continue;
          commands.push({ section, kind: 'block', text, line: withoutPrompt.trim(), lineNo });
        }
      } else if (language === '') {
        let transcript = false;
        body.forEach((raw, j) => {
          const m = /^\s*\$ (.*)$/.exec(raw);
          if (!m) return;
          transcript = true;
          commands.push({ section, kind: 'transcript', text: stripComment(m[1]!).trim(), line: m[1]!.trim(), lineNo: start + 2 + j });
        });
        const looksLikeCommand = body.find((l) => COMMAND_WORDS.test(l.trim()));
        if (!transcript && looksLikeCommand !== undefined) listings.push({ section, lineNo: start + 1, firstLine: looksLikeCommand.trim() });
      }
      continue;
    }
    const heading = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (heading) {
      section = heading[1]!;
      continue;
    }
    for (const m of line.matchAll(/(`+)([^`]+?)\1(?!`)/g)) {
      const span = m[2]!.trim();
      if (/\s/.test(span) && COMMAND_WORDS.test(span)) commands.push({ section, kind: 'inline', text: span, line: span, lineNo: i + 1 });
    }
  }
  return { commands, listings };
}

export const readmeCommands = (markdown?: string) => parseReadme(markdown).commands;

/** One change a test makes to a README command before running it, and why it must. */
export interface Substitution {
  find: string;
  /** A fixed text: cluster data goes in the run's environment, as `"$NAME"` here. */
  replace: string;
  why: string;
}

export interface ReadmeRun {
  section: string;
  /** The commands, as the README writes them (trailing comment aside), in the order they run. */
  commands: readonly string[];
  /** The test that runs them: its file (from the repository root) and its `it` or hook. */
  test: { file: string; name: string };
  substitutions?: readonly Substitution[];
}

const KIND_HELLO_TEST = "the README's kind quick start: kubectl create deployment hello + expose --type=LoadBalancer, get svc, curl; the node addresses in the status, TCP answered by the pods";
const UNINSTALL_TEST = 'uninstalls as the README says: kubectl delete -k, then deploy/cleanup leaves no PIER chain and no pier table on any node';
const SWEEP = ['kubectl apply -k deploy/cleanup', 'kubectl -n pier-cleanup rollout status ds/pier-cleanup', 'kubectl delete -k deploy/cleanup'];
const HELM_UNINSTALL_TEST = 'helm uninstall stops pier and leaves its rules; the cleanup sweep (deploy/cleanup) then leaves no PIER chain and no pier table on any node';

// Substitutions shared by several runs.
const IMAGE_NGINX: Substitution = {
  find: '--image=nginx',
  replace: '--image="$IMAGE"',
  why: 'no registry is reachable here: the test pods\' echo image, built by test/images/build.sh and imported into every node, stands in for nginx',
};
const ECHO_PORT: Substitution = {
  find: '--target-port=80',
  replace: '--target-port=8080',
  why: 'the echo image listens on 8080 (as an unprivileged user), where nginx listens on 80',
};

const K3S_TEST = 'test/e2e/k3s.test.ts';
const K3S_INSTALL_TEST = "the README's k3s quick start: the images into k3s's containerd, kubectl apply -k deploy/overlays/k3s, rollout status";
const K3S_HELLO_TEST = "the README's k3s quick start: kubectl create deployment hello + expose --type=LoadBalancer, get svc, curl from another machine; the node's address in the status, TCP answered by the pods";
const K3S_UNINSTALL_TEST = 'uninstalls as the README says: kubectl delete -k deploy/overlays/k3s, then deploy/cleanup leaves no PIER chain and no pier table on the node';
const CURL_ECHO: Substitution = {
  find: 'curl http://',
  replace: 'curl --silent --show-error --max-time 10 --http0.9 http://',
  why: 'the echo image answers a connection with one JSON line naming the pod, not HTTP: curl prints it only with --http0.9; and a test must not wait forever',
};

/**
 * Every README command a test runs, by run id (what runReadme() takes). The
 * unit test test/unit/readme-commands.test.ts holds each id to a call in the
 * named test file.
 */
export const README_RUNS = {
  'setup-demo': {
    section: 'Set-up: two commands',
    commands: ['./scripts/demo.sh'],
    test: { file: 'test/e2e/demo.test.ts', name: './scripts/demo.sh waits for Ctrl-C, prints what kubectl prints, and on SIGINT to its pid removes everything and exits 0' },
  },
  'kind-install': {
    section: 'Quick start on kind',
    commands: ['kubectl apply -k deploy/overlays/kind', 'kubectl -n pier-system rollout status deploy/pier-controller ds/pier-agent'],
    test: { file: 'test/e2e/real-node.test.ts', name: 'beforeAll' },
  },
  'kind-hello': {
    section: 'Quick start on kind',
    commands: ['kubectl create deployment hello --image=nginx --replicas=2', 'kubectl expose deployment hello --type=LoadBalancer --port=8080 --target-port=80'],
    test: { file: 'test/e2e/real-node.test.ts', name: KIND_HELLO_TEST },
    substitutions: [IMAGE_NGINX, ECHO_PORT],
  },
  'kind-curl': {
    section: 'Quick start on kind',
    commands: ['kubectl get svc hello', "curl http://$(kubectl get svc hello -o jsonpath='{.status.loadBalancer.ingress[0].ip}'):8080/"],
    test: { file: 'test/e2e/real-node.test.ts', name: KIND_HELLO_TEST },
    substitutions: [CURL_ECHO],
  },
  'status': {
    section: 'The first Service',
    commands: ['pier status -n NAMESPACE'],
    test: { file: 'test/e2e/real-node.test.ts', name: 'the README\'s pier status -n NAMESPACE and pier trace CLIENT ADDRESS:PORT/PROTO --node NODE on that install, with no other flag' },
    substitutions: [{ find: 'NAMESPACE', replace: '"$NAMESPACE"', why: 'the README\'s placeholder, filled from the environment' }],
  },
  'trace': {
    section: 'Troubleshooting',
    commands: ['pier trace CLIENT ADDRESS:PORT/PROTO --node NODE'],
    test: { file: 'test/e2e/real-node.test.ts', name: 'the README\'s pier status -n NAMESPACE and pier trace CLIENT ADDRESS:PORT/PROTO --node NODE on that install, with no other flag' },
    substitutions: [
      { find: 'CLIENT', replace: '"$CLIENT"', why: 'the README\'s placeholder, filled from the environment' },
      { find: 'ADDRESS:PORT/PROTO', replace: '"$FRONTEND"', why: 'the README\'s placeholder, filled from the environment' },
      { find: '--node NODE', replace: '--node "$NODE"', why: 'the README\'s placeholder, filled from the environment' },
    ],
  },
  'uninstall-kind': {
    section: 'Uninstall',
    commands: ['kubectl delete -k deploy/overlays/k3s'],
    test: { file: 'test/e2e/real-node.test.ts', name: UNINSTALL_TEST },
    substitutions: [
      {
        find: 'deploy/overlays/k3s',
        replace: 'deploy/overlays/kind',
        why: 'the README says "or the overlay/base you applied": this cluster has the kind overlay (whose ConfigMap name, hashed from its content, is not the k3s overlay\'s)',
      },
    ],
  },
  'uninstall-sweep': {
    section: 'Uninstall',
    commands: SWEEP,
    test: { file: 'test/e2e/real-node.test.ts', name: UNINSTALL_TEST },
  },
  'apply-base': {
    section: 'On any other cluster, with kustomize',
    commands: ['kubectl apply -k deploy/base'],
    test: { file: 'test/e2e/deploy.test.ts', name: 'is admitted by the API server: base applied as the README writes it (kubectl apply -k deploy/base), every kustomization by server-side dry run' },
  },
  'helm-install': {
    section: 'With Helm',
    commands: [
      'kubectl create namespace pier-system',
      'kubectl label namespace pier-system pod-security.kubernetes.io/enforce=privileged',
      'helm install pier deploy/helm/pier -n pier-system',
    ],
    test: { file: 'test/e2e/helm.test.ts', name: 'helm install into a namespace made as deploy/helm/README.md says: two controllers and an agent per node, ready; a LoadBalancer Service answered through pier' },
    substitutions: [
      {
        find: 'helm install pier deploy/helm/pier -n pier-system',
        replace:
          'helm install pier deploy/helm/pier -n pier-system -f deploy/helm/values/kind.yaml --set controller.image.repository=pier/controller --set agent.image.repository=pier/agent --set agent.apiServer="$API_SERVER"',
        why: 'the README\'s own additions: "-f deploy/helm/values/kind.yaml, as with the overlays" (the kind values, so that kubectl expose\'s class-less Service is pier\'s), "with images loaded into the nodes instead, add --set controller.image.repository=pier/controller --set agent.image.repository=pier/agent"; and the agents given this cluster\'s API server, which is no kind-control-plane (README, Quick start on kind)',
      },
    ],
  },
  'helm-uninstall': {
    section: 'Uninstall',
    commands: ['helm uninstall pier -n pier-system'],
    test: { file: 'test/e2e/helm.test.ts', name: HELM_UNINSTALL_TEST },
  },
  'helm-uninstall-sweep': {
    section: 'Uninstall',
    commands: SWEEP,
    test: { file: 'test/e2e/helm.test.ts', name: HELM_UNINSTALL_TEST },
  },
  // The k3s quick start on a real k3s server (test/k3s/: built from its Go
  // module, cached; the test skips, saying so, when the cache is cold). The
  // lines run on the k3s node, as a reader on the k3s machine types them
  // (runReadme's `wrap`), but the curl, which runs on another machine.
  'k3s-import': {
    section: 'Quick start on k3s',
    commands: ['docker save pier/controller:0.1.0 pier/agent:0.1.0 | sudo k3s ctr images import -'],
    test: { file: K3S_TEST, name: K3S_INSTALL_TEST },
    substitutions: [
      {
        find: 'docker save pier/controller:0.1.0 pier/agent:0.1.0',
        replace: 'cat "$IMAGES_ARCHIVE"',
        why: 'no Docker engine here: test/images/build.sh builds both images with buildah, one docker-archive each; the test merges the two into one docker-archive holding both images, as `docker save` of two images writes',
      },
      {
        find: 'sudo k3s ctr',
        replace: 'ctr',
        why: 'no sudo here (the tests run as root, on the k3s node, whose mount namespace holds k3s\'s containerd socket); and `k3s ctr` is the release\'s `k3s` wrapper (cmd/k3s) running its bundled multi-call binary as `ctr`, a wrapper whose payload the Go module lacks: test/k3s/build.sh builds that multi-call binary (cmd/server), and `ctr` is a link to it, as the k3s installer links ctr to k3s: k3s\'s own ctr, with k3s\'s socket and the k8s.io namespace as defaults',
      },
    ],
  },
  'k3s-install': {
    section: 'Quick start on k3s',
    commands: ['kubectl apply -k deploy/overlays/k3s', 'kubectl -n pier-system rollout status deploy/pier-controller ds/pier-agent'],
    test: { file: K3S_TEST, name: K3S_INSTALL_TEST },
  },
  'k3s-hello': {
    section: 'Quick start on k3s',
    commands: ['kubectl create deployment hello --image=nginx --replicas=2', 'kubectl expose deployment hello --type=LoadBalancer --port=8080 --target-port=80'],
    test: { file: K3S_TEST, name: K3S_HELLO_TEST },
    substitutions: [IMAGE_NGINX, ECHO_PORT],
  },
  'k3s-get-svc': {
    section: 'Quick start on k3s',
    commands: ['kubectl get svc hello'],
    test: { file: K3S_TEST, name: K3S_HELLO_TEST },
  },
  'k3s-curl': {
    section: 'Quick start on k3s',
    commands: ['curl http://<node address>:8080/'],
    test: { file: K3S_TEST, name: K3S_HELLO_TEST },
    substitutions: [
      CURL_ECHO,
      { find: '<node address>', replace: '"$NODE_ADDRESS"', why: 'the README\'s placeholder, filled from the environment: the k3s node\'s address, from the status' },
    ],
  },
  'uninstall-k3s': {
    section: 'Uninstall',
    commands: ['kubectl delete -k deploy/overlays/k3s'],
    test: { file: K3S_TEST, name: K3S_UNINSTALL_TEST },
  },
  'uninstall-k3s-sweep': {
    section: 'Uninstall',
    commands: SWEEP,
    test: { file: K3S_TEST, name: K3S_UNINSTALL_TEST },
  },
  'demo-get-svc': {
    section: 'The first Service',
    commands: ['kubectl get svc -o wide'],
    test: { file: 'test/e2e/demo.test.ts', name: './scripts/demo.sh waits for Ctrl-C, prints what kubectl prints, and on SIGINT to its pid removes everything and exits 0' },
  },
} as const satisfies Record<string, ReadmeRun>;

export type ReadmeRunId = keyof typeof README_RUNS;

/**
 * Untagged fenced blocks whose lines start like commands but are no
 * transcript (no `$ `), by section, with why they hold no command to run.
 * Any other such block fails the unit test: tag it ```sh, or list it here.
 */
export const README_LISTINGS: Readonly<Record<string, string>> = {
  Commands: 'the list of pier\'s subcommands, each with what it does: names, not command lines; each subcommand is run by its own tests (test/unit/cli.test.ts, test/integration/status.test.ts, test/e2e/trace.test.ts, test/e2e/agent.test.ts, …)',
};

/** README commands no test runs, each with why: printed by the unit test. Never a pretence: what is missing is said here. */
export const README_NOT_RUN: readonly { section: string; command: string; reason: string }[] = [
  {
    section: 'Set-up: two commands',
    command: './scripts/test.sh',
    reason: 'the suite\'s own entry point: it runs every test, this one included, so no test can run it; CI runs it',
  },
  ...['docker build -f Dockerfile.controller -t pier/controller:0.1.0 .', 'docker build -f Dockerfile.agent      -t pier/agent:0.1.0 .', 'podman build -f Dockerfile.agent -t pier/agent:0.1.0 .'].map((command) => ({
    section: 'The images',
    command,
    reason: 'no Docker engine and no podman here; test/images/build.sh builds the same Dockerfiles with buildah (`buildah bud --pull=never --isolation chroot --layers`, its own storage), so not as written',
  })),
  {
    section: 'The images',
    command: 'buildah bud  -f Dockerfile.agent -t pier/agent:0.1.0 .',
    reason: 'test/images/build.sh runs buildah bud on this Dockerfile with its own storage and flags (--pull=never: no registry; --isolation chroot), not this line as written',
  },
  ...[
    'kind load docker-image pier/controller:0.1.0 pier/agent:0.1.0',
    'docker save',
    'podman save -o agent.tar pier/agent:0.1.0',
    'ctr -n k8s.io images import agent.tar',
  ].map((command) => ({
    section: 'The images',
    command,
    reason: 'no kind, Docker engine or podman here; the real-node cluster imports the buildah-built archives into each node\'s containerd with ctr (test/cluster/node.ts), not with this line',
  })),
  {
    section: 'The images',
    command: 'k3s ctr images import agent.tar',
    reason: 'not this line: test/e2e/k3s.test.ts runs the k3s quick start\'s `k3s ctr images import -` (the same command, the archive on stdin) on a real k3s',
  },
  {
    section: 'The images',
    command: 'kustomize edit set image pier/controller=REGISTRY/pier-controller:TAG',
    reason: 'needs a registry of one\'s own (REGISTRY); no test pushes to one',
  },
  {
    section: 'Quick start on k3s',
    command: 'curl -sfL https://get.k3s.io | INSTALL_K3S_EXEC="--disable=servicelb" sh -',
    reason: 'the installer downloads k3s from GitHub and installs a systemd unit; neither GitHub nor systemd is here. test/e2e/k3s.test.ts runs `k3s server` itself, built from the k3s Go module at the same release (test/k3s/build.sh), with this line\'s --disable=servicelb and what else cannot run here, each flag with its reason (test/k3s/k3s.ts, K3S_DISABLED)',
  },
  ...['kind create cluster', 'kind load docker-image pier/controller:0.1.0 pier/agent:0.1.0'].map((command) => ({
    section: 'Quick start on kind',
    command,
    reason: 'no kind and no Docker engine here: the real-node cluster (test/cluster/) stands in for kind\'s, with the images imported into its nodes\' containerd',
  })),
  {
    section: 'Quick start on kind',
    command: 'kind create cluster --name X',
    reason: 'no kind here',
  },
  {
    section: 'Uninstall',
    command: 'pier cleanup',
    reason: 'the deploy/cleanup sweep, which runs `pier cleanup` on every node, is run as written (the uninstall runs); `pier cleanup` itself is run on lab nodes by test/e2e/agent.test.ts with its own arguments, not from this line',
  },
  // The Status table and the Commands section name pier's parts; they are no steps.
  ...['pier controller', 'pier agent', 'pier plan', 'pier trace', 'pier status', 'pier cleanup', 'pier check'].map((command) => ({
    section: 'Status',
    command,
    reason: 'names a part in the Status table, not a step',
  })),
  {
    section: 'Status',
    command: 'npm run demo',
    reason: 'names the demo in the Status table; ./scripts/demo.sh (run as written by test/e2e/demo.test.ts) execs the same demo/demo.ts, which test/e2e/demo.test.ts also runs directly',
  },
  {
    section: 'Status',
    command: 'npm run bench',
    reason: 'benchmarks print numbers (bench/README.md); no test runs them',
  },
  {
    section: 'The first Service',
    command: 'kubectl expose deployment web --type=LoadBalancer --port=80 --target-port=8080',
    reason: 'the demo (demo/demo.ts, run by test/e2e/demo.test.ts) runs this command from its own copy, not from this line',
  },
  {
    section: 'The first Service',
    command: 'kubectl describe svc web',
    reason: 'shows Events for a reader; no test reads describe\'s text (test/e2e/controller-agents.test.ts and the integration tests read the Events through the API)',
  },
  {
    section: 'Commands',
    command: 'ln -s "$PWD/scripts/pier" /usr/local/bin/pier',
    reason: 'a test must not write to /usr/local/bin; runReadme puts a `pier` of its own on PATH instead (running cmd/cli.ts: scripts/pier would rebuild dist/ whenever the sources changed)',
  },
  ...[
    'kubectl get svc NAME -o yaml',
    'kubectl describe svc NAME',
    'pier status',
    'pier check',
    'kubectl -n pier-system get leases -l pier.dev/component=agent -o yaml',
    'sysctl -w net.ipv4.ip_forward=1',
    'iptables-save -t nat | grep PIER-',
    'nft list table ip pier',
    'pier plan',
  ].map((command) => ({
    section: 'Troubleshooting',
    command,
    reason: 'a diagnostic a reader runs when something is wrong; the tests read the same facts through the API, iptables-save and nft, not from this line',
  })),
  {
    section: 'Testing',
    command: './scripts/test.sh --project unit',
    reason: 'the suite\'s own entry point (see ./scripts/test.sh)',
  },
  {
    section: 'Testing',
    command: 'bash test/k3s/build.sh',
    reason: 'k3s\'s cold build (13 to 25 minutes of two cores) would push CI past its time; test/e2e/k3s.test.ts runs this very script only when told to (PIER_K3S=build), and uses what it built',
  },
];

/** The README's text of `section`'s command `text`, or an error naming what the README has there. */
function findCommand(commands: ReadmeCommand[], section: string, text: string): ReadmeCommand {
  const found = commands.find((c) => c.section === section && c.text === text);
  if (!found) {
    const there = commands.filter((c) => c.section === section).map((c) => `  ${c.text}`);
    throw new Error(`README.md has no command \`${text}\` under "${section}"; it has:\n${there.join('\n') || '  (no such section or no command in it)'}`);
  }
  return found;
}

/** The lines run `id` runs: the README's, with its substitutions made (each must apply, or the README changed). */
export function readmeScript(id: ReadmeRunId, markdown?: string): string[] {
  const run: ReadmeRun = README_RUNS[id];
  const commands = readmeCommands(markdown);
  const lines = run.commands.map((text) => findCommand(commands, run.section, text).line);
  // A substitution matches whole words only: `--target-port=80` is not the start of `--target-port=8080`.
  const pattern = (s: Substitution) => new RegExp(`${s.find.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}(?![A-Za-z0-9_])`, 'g');
  for (const s of run.substitutions ?? []) {
    if (!lines.some((l) => pattern(s).test(l))) throw new Error(`README run ${id}: substitution of \`${s.find}\` matches none of ${JSON.stringify(lines)}`);
  }
  return lines.map((line) => (run.substitutions ?? []).reduce((l, s) => l.replace(pattern(s), () => s.replace), line));
}

export interface ReadmeRunOptions {
  /** The cluster's kubeconfig, as $KUBECONFIG (never in the text). */
  kubeconfig?: string;
  /** Values the substitutions name (`"$IMAGE"`, …), and anything else the commands read. */
  env?: Record<string, string>;
  /** Per command; default 5 minutes. */
  timeoutMs?: number;
  /**
   * Where the reader would type the lines: a command prefix `bash` runs
   * under (test/k3s/k3s.ts's node wrapper, or `ip netns exec CLIENT`), the
   * environment passed through. Default: this machine, as it is.
   */
  wrap?: readonly string[];
  /** Folders put ahead of PATH (after kubectl's and helm's), such as the k3s binary's. */
  path?: readonly string[];
}

export interface ReadmeResult {
  line: string;
  stdout: string;
  stderr: string;
}

/**
 * The PATH a README command runs with: kubectl and helm as built here
 * (test/cluster/build.sh, test/helm/build.sh), and a `pier` that runs this
 * checkout's cmd/cli.ts with this Node (where the README has users run
 * scripts/pier or link it into /usr/local/bin), ahead of the machine's PATH.
 */
async function toolsDir(lines: string[]): Promise<{ dir: string; done: () => void }> {
  const { kubectlPath } = await import('../cluster/controlplane.ts');
  const dir = mkdtempSync(join(tmpdir(), 'pier-readme-bin-'));
  symlinkSync(await kubectlPath(), join(dir, 'kubectl'));
  // helm only for the runs that use it: elsewhere it need not be built.
  if (lines.some((l) => /^helm\s/.test(l))) {
    const { helmPath } = await import('../helm/tools.ts');
    symlinkSync(await helmPath(), join(dir, 'helm'));
  }
  writeFileSync(join(dir, 'pier'), `#!/bin/sh\nexec ${JSON.stringify(process.execPath)} ${JSON.stringify(join(ROOT, 'cmd/cli.ts'))} "$@"\n`);
  chmodSync(join(dir, 'pier'), 0o755);
  return { dir, done: () => rmSync(dir, { recursive: true, force: true }) };
}

function runEnv(bin: string, opts: ReadmeRunOptions): Record<string, string> {
  const path = [bin, ...(opts.path ?? []), process.env['PATH'] ?? '/usr/bin:/bin'].join(':');
  return { PATH: path, ...(opts.kubeconfig && { KUBECONFIG: opts.kubeconfig }), ...opts.env };
}

function describeRun(id: ReadmeRunId): string {
  const run: ReadmeRun = README_RUNS[id];
  const subs = (run.substitutions ?? []).map((s) => `\n[readme]   substituted \`${s.find}\` -> \`${s.replace}\`: ${s.why}`).join('');
  return `[readme] ${id}: README.md "${run.section}"${subs}`;
}

/** Runs README run `id`'s commands in order, each `bash -c` on the README's line; throws on the first that fails, with its output. */
export async function runReadme(id: ReadmeRunId, opts: ReadmeRunOptions = {}): Promise<ReadmeResult[]> {
  const lines = readmeScript(id);
  const tools = await toolsDir(lines);
  const results: ReadmeResult[] = [];
  try {
    console.log(describeRun(id));
    for (const line of lines) {
      // Under a wrapper, `env -C` puts the command back in the repository's root (nsenter --mount starts it in /).
      const [file, ...prefix] = opts.wrap ? [...opts.wrap, 'env', '-C', ROOT, 'bash'] : ['bash'];
      const r = await execa(file!, [...prefix, '-o', 'pipefail', '-c', line], { cwd: ROOT, env: runEnv(tools.dir, opts), stdin: 'ignore', reject: false, timeout: opts.timeoutMs ?? 300_000 });
      console.log(`[readme] $ ${line}${r.stdout ? `\n${r.stdout}` : ''}`);
      if (r.exitCode !== 0) throw new Error(`README command \`${line}\` (run ${id}) failed (${r.exitCode ?? r.signal}):\n${r.stderr}\n${r.stdout}`);
      results.push({ line, stdout: String(r.stdout), stderr: String(r.stderr) });
    }
  } finally {
    tools.done();
  }
  recordRun(id);
  return results;
}

/**
 * Notes in $PIER_README_RUNS (scripts/test.sh sets it) that run `id` ran to
 * the end, so that the run's summary names the README commands a skipped or
 * failed test left unrun instead of counting them as tested.
 */
function recordRun(id: ReadmeRunId): void {
  const file = process.env['PIER_README_RUNS'];
  if (file) appendFileSync(file, `${id}\n`);
}

/**
 * Starts README run `id`'s one command as a process of its own (`bash -c`
 * on the README's line; bash execs a single command, so the pid is the
 * command's): for long-running commands a test signals, such as the demo.
 * The process comes wrapped in an object: awaiting it here would wait for it
 * to end.
 */
export async function spawnReadme<O extends Options>(id: ReadmeRunId, execaOptions: O, opts: ReadmeRunOptions = {}): Promise<{ child: ResultPromise<O> }> {
  const lines = readmeScript(id);
  if (lines.length !== 1) throw new Error(`README run ${id}: spawnReadme runs one command, not ${lines.length}`);
  const tools = await toolsDir(lines);
  console.log(`${describeRun(id)}\n[readme] $ ${lines[0]}`);
  const child = execa('bash', ['-c', lines[0]!], { ...execaOptions, cwd: ROOT, env: { ...runEnv(tools.dir, opts), ...(execaOptions.env as Record<string, string> | undefined) } }) as unknown as ResultPromise<O>;
  void Promise.resolve(child).then((r) => {
    if (r.exitCode === 0) recordRun(id);
    tools.done();
  }, tools.done);
  return { child };
}
