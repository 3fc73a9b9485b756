// The tools test/helm/build.sh builds from Go modules (helm 4, helm 3,
// actionlint) and the prometheus-operator CRDs it fetches, for the tests:
// from a variable naming one (PIER_HELM...), else from the folder where
// scripts/test.sh's background build leaves each tool's path
// (PIER_TOOLS_DIR, waited for), else by running build.sh (cached; cold, helm
// takes minutes). In CI (CI=true) that last fails instead: there
// scripts/test.sh must have built them, and a silent build would hide that it
// did not. Also: helm itself, run with argument arrays, and the chart rendered.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import type { KubernetesObject } from '@kubernetes/client-node';
import { execa } from 'execa';
import { parseAllDocuments } from 'yaml';

const BUILD = fileURLToPath(new URL('./build.sh', import.meta.url));
export const CHART = fileURLToPath(new URL('../../deploy/helm/pier', import.meta.url));
export const CHART_VALUES = fileURLToPath(new URL('../../deploy/helm/values/', import.meta.url));

type Tool = 'helm' | 'helm3' | 'actionlint' | 'prometheus-crds';
const ENV: Record<Tool, string> = { helm: 'PIER_HELM', helm3: 'PIER_HELM3', actionlint: 'PIER_ACTIONLINT', 'prometheus-crds': 'PIER_PROMETHEUS_CRDS' };
/** CI as GitHub Actions and most runners set it. */
export const inCi = (env: NodeJS.ProcessEnv = process.env) => env['CI'] === 'true' || env['CI'] === '1';
const loaded = new Map<Tool, Promise<string>>();

function tool(what: Tool): Promise<string> {
  let p = loaded.get(what);
  if (!p) {
    p = (async () => {
      const fromEnv = process.env[ENV[what]];
      if (fromEnv && existsSync(fromEnv)) return fromEnv;
      const building = process.env['PIER_TOOLS_DIR'];
      if (!fromEnv && building) return await builtInBackground(building, what);
      if (inCi()) {
        throw new Error(`${ENV[what]} is ${fromEnv ? `${fromEnv}, which does not exist` : 'not set, nor PIER_TOOLS_DIR'}: in CI scripts/test.sh builds it (bash test/helm/build.sh ${what}); no test builds it silently there`);
      }
      // Progress on the test's stderr: a cold helm build takes minutes.
      const r = await execa('bash', [BUILD, what], { stdin: 'ignore', stderr: 'inherit', reject: false });
      if (r.exitCode !== 0) throw new Error(`test/helm/build.sh ${what} exited with ${r.exitCode} (its log is above)`);
      return r.stdout.trim();
    })();
    p.catch(() => loaded.delete(what));
    loaded.set(what, p);
  }
  return p;
}

/** How long a test waits for scripts/test.sh's background build: a cold one takes 5-12 minutes beside the tests. */
const BACKGROUND_BUILD_WAIT_MS = 30 * 60_000;

/** The path scripts/test.sh's background build left in `dir` for `what` (`what`.path), or its failure (`what`.failed names the log). */
async function builtInBackground(dir: string, what: Tool): Promise<string> {
  const deadline = Date.now() + BACKGROUND_BUILD_WAIT_MS;
  for (;;) {
    const path = join(dir, `${what}.path`);
    if (existsSync(path)) return readFileSync(path, 'utf8').trim();
    const failed = join(dir, `${what}.failed`);
    if (existsSync(failed)) throw new Error(`scripts/test.sh could not build ${what}; its log: ${readFileSync(failed, 'utf8').trim()}`);
    if (Date.now() > deadline) throw new Error(`no ${what} in ${dir} after ${BACKGROUND_BUILD_WAIT_MS / 60_000} minutes: scripts/test.sh's background build (test/helm/build.sh ${what}) neither finished nor failed`);
    await sleep(1000);
  }
}

export const helmPath = () => tool('helm');
export const helm3Path = () => tool('helm3');
/** Which helm runs: 4 (the tests' own, PIER_HELM) or 3 (PIER_HELM3), the two majors users run. */
export type HelmMajor = 3 | 4;
export const actionlintPath = () => tool('actionlint');
/** The folder with monitoring.coreos.com_servicemonitors.yaml and monitoring.coreos.com_podmonitors.yaml. */
export const prometheusCrdsDir = () => tool('prometheus-crds');

/**
 * helm with `args`, its caches and configuration in `home` (never the
 * user's ~/.cache/helm or ~/.config/helm); throws with helm's stderr when it
 * fails.
 */
export async function helm(home: string, args: string[], opts: { kubeconfig?: string; input?: string; major?: HelmMajor } = {}): Promise<string> {
  const env: Record<string, string> = {
    HELM_CACHE_HOME: `${home}/cache`,
    HELM_CONFIG_HOME: `${home}/config`,
    HELM_DATA_HOME: `${home}/data`,
  };
  if (opts.kubeconfig) env['KUBECONFIG'] = opts.kubeconfig;
  const r = await execa(await (opts.major === 3 ? helm3Path() : helmPath()), args, { env, reject: false, ...(opts.input === undefined ? { stdin: 'ignore' as const } : { input: opts.input }) });
  if (r.exitCode !== 0) throw new Error(`helm${opts.major === 3 ? '3' : ''} ${args.join(' ')} failed (${r.exitCode}):\n${r.stderr}\n${r.stdout}`);
  return r.stdout;
}

/** An object as plain JSON: any field may be read or removed. */
export type Obj = KubernetesObject & Record<string, any>;

export function parseYaml(text: string): Obj[] {
  return parseAllDocuments(text)
    .map((d) => d.toJSON() as Obj | null)
    .filter((o): o is Obj => o !== null);
}

export interface RenderedChart {
  yaml: string;
  objects: Obj[];
}

/** `helm template pier CHART --namespace pier-system` with `args` (e.g. --set, -f). */
export async function template(home: string, args: string[] = [], major: HelmMajor = 4): Promise<RenderedChart> {
  const yaml = await helm(home, ['template', 'pier', CHART, '--namespace', 'pier-system', ...args], { major });
  return { yaml, objects: parseYaml(yaml) };
}
