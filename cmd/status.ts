// `pier status`: what pier does for each LoadBalancer Service on a live
// cluster, read once with the user's kubeconfig. The decisions are in
// status-report.ts; this file parses flags, lists four collections and
// turns an API failure into one line naming what could not be read.
import { CoordinationV1Api, CoreV1Api, DiscoveryV1Api, type KubeConfig, type KubernetesListObject, type KubernetesObject } from '@kubernetes/client-node';

import { KUBECONFIG_OPTION, parseCommand, type CommandSpec } from '../lib/command.ts';
import { formatDuration, type OptionSpec } from '../lib/config.ts';
import { chooseSelection, type ChosenSelection } from '../lib/cluster-settings.ts';
import { DEFAULT_NAMESPACE, LEADER_LEASE_NAME, LOAD_BALANCER_CLASS } from '../lib/contract.ts';
import { KubeConfigError, loadKubeConfig, requestOptions } from '../lib/kube.ts';
import { apiStatus } from '../lib/lease.ts';
import { DEFAULT_MAX_ADDRESSES, defaultAllocatorConfig, parseMaxAddresses } from '../controller/allocate.ts';
import { CONTROLLER_SPEC } from './controller.ts';
import { buildStatusReport, formatJson, formatTable, LEASE_JUDGEMENT, type StatusInput } from '../controller/status-report.ts';

/** The controller's own flag, so that status reads a Service as the controller does. */
const controllerOption = (name: string): OptionSpec => CONTROLLER_SPEC.options.find((o) => o.name === name)!;

export const STATUS_SPEC: CommandSpec = {
  name: 'status',
  summary:
    'pier status: per pier LoadBalancer Service, its addresses, the nodes that serve it and why the others do not, port errors and the pier.dev/Ready condition.\n' +
    `Read once from the live cluster; ${LEASE_JUDGEMENT}.`,
  usage: 'pier status [-n NAMESPACE | -A] [-o table|json] [--kubeconfig FILE]',
  options: [
    KUBECONFIG_OPTION,
    { name: 'namespace', type: 'string', env: null, help: "Services of this namespace (-n; default: the kubeconfig context's namespace, else default)" },
    { name: 'all-namespaces', type: 'boolean', default: false, env: null, help: 'Services of every namespace (-A)' },
    { name: 'output', type: 'enum', values: ['table', 'json'], default: 'table', env: null, help: 'a table for people, or JSON for scripts (-o)' },
    { ...controllerOption('default-class'), help: "count LoadBalancer Services without a loadBalancerClass as pier's (default: as the controller's Lease says)" },
    { ...controllerOption('default-pool'), help: "pool of Services and Nodes that name none (default: as the controller's Lease says)" },
    {
      ...controllerOption('max-addresses'),
      help: 'the controller\'s K, addresses per Service and family, to judge which eligible nodes a Service does not list (default: as the controller\'s Lease says)',
    },
    { name: 'pier-namespace', type: 'string', default: DEFAULT_NAMESPACE, env: 'PIER_NAMESPACE', help: "pier's namespace, where the agent Leases and the controller's Lease are (the controller's --namespace)" },
    { name: 'request-timeout', type: 'duration', default: 30_000, min: 100, env: null, help: 'give up on an API request after this long' },
  ],
};

/** kubectl's short flags, onto the long ones: -n NS, -nNS, -n=NS, -A, -o json, -ojson. */
export function expandShortFlags(argv: readonly string[]): string[] {
  const long: Record<string, string> = { n: '--namespace', o: '--output', A: '--all-namespaces' };
  const out: string[] = [];
  for (const arg of argv) {
    const m = /^-([noA])(=?)(.*)$/s.exec(arg);
    if (!m || arg.startsWith('--')) out.push(arg);
    else if (m[1] === 'A') out.push(m[3] === '' ? long.A! : arg);
    else out.push(m[3] === '' && m[2] === '' ? long[m[1]!]! : `${long[m[1]!]}=${m[3]}`);
  }
  return out;
}

/** An API failure in one line: what could not be read, and why. */
export class StatusReadError extends Error {
  override name = 'StatusReadError';
}

export async function runStatus(argv: string[], env = process.env): Promise<number> {
  const parsed = parseCommand(STATUS_SPEC, expandShortFlags(argv), env);
  if (typeof parsed === 'number') return parsed;
  const v = parsed.values;
  let input: StatusInput;
  let chosen: ChosenSelection;
  try {
    const { kc } = loadKubeConfig({ kubeconfig: v['kubeconfig'] as string | undefined });
    const all = v['all-namespaces'] as boolean;
    const namespace = all ? undefined : ((v['namespace'] as string | undefined) || kc.getContextObject(kc.getCurrentContext())?.namespace || 'default');
    const pierNamespace = v['pier-namespace'] as string;
    const read = await readCluster(kc, { namespace, pierNamespace, timeoutMs: v['request-timeout'] as number });
    const given = (name: string) => parsed.sources[name] !== 'default';
    chosen = chooseSelection({
      given: {
        ...(given('default-class') ? { defaultClass: v['default-class'] as boolean } : {}),
        ...(given('default-pool') ? { defaultPool: v['default-pool'] as string } : {}),
        ...(given('max-addresses') ? { maxAddresses: parseMaxAddresses(v['max-addresses']) } : {}),
      },
      defaults: { defaultClass: v['default-class'] as boolean, defaultPool: v['default-pool'] as string, maxAddresses: parseMaxAddresses(v['max-addresses']) ?? DEFAULT_MAX_ADDRESSES },
      lease: read.leases.find((l) => l.metadata?.name === LEADER_LEASE_NAME),
      leaseRef: `${pierNamespace}/${LEADER_LEASE_NAME}`,
      needs: ['defaultClass', 'defaultPool', 'maxAddresses'],
    });
    if (chosen.note) process.stderr.write(`pier status: ${chosen.note}\n`);
    input = {
      ...read,
      now: Date.now(),
      config: defaultAllocatorConfig({
        loadBalancerClass: LOAD_BALANCER_CLASS,
        defaultClass: chosen.defaultClass,
        defaultPool: chosen.defaultPool,
        agentNamespace: pierNamespace,
        maxAddresses: chosen.maxAddresses,
      }),
    };
  } catch (err) {
    if (err instanceof StatusReadError || err instanceof KubeConfigError) {
      process.stderr.write(`pier status: ${err.message}\n`);
      return 1;
    }
    throw err;
  }
  const report = {
    ...buildStatusReport(input),
    settings: { defaultClass: chosen.defaultClass, defaultPool: chosen.defaultPool, from: { defaultClass: chosen.from.defaultClass, defaultPool: chosen.from.defaultPool } },
  };
  if (v['output'] === 'json') {
    process.stdout.write(formatJson(report));
  } else if (report.services.length === 0) {
    const where = v['all-namespaces'] ? 'any namespace' : 'this namespace';
    // Whether class-less Services count is what most often makes this list empty: say which it was and who said so.
    const from = { flag: 'as given', controller: "as the controller's Lease says", default: 'the default' }[chosen.from.defaultClass];
    process.stderr.write(`No LoadBalancer Services of pier's in ${where} (Services without a loadBalancerClass ${chosen.defaultClass ? 'count' : 'do not count'}, ${from}).\n`);
  } else {
    process.stdout.write(formatTable(report));
  }
  return 0;
}

export interface ReadOptions {
  /** Services and EndpointSlices of this namespace; every namespace when undefined. */
  namespace: string | undefined;
  /** Where the agent Leases are. */
  pierNamespace: string;
  timeoutMs: number;
}

/** The four lists the report needs, each read whole, page by page. */
export async function readCluster(kc: KubeConfig, opts: ReadOptions): Promise<Omit<StatusInput, 'now' | 'config'>> {
  const core = kc.makeApiClient(CoreV1Api);
  const discovery = kc.makeApiClient(DiscoveryV1Api);
  const coordination = kc.makeApiClient(CoordinationV1Api);
  const server = kc.getCurrentCluster()?.server ?? 'the API server';
  const ns = opts.namespace;
  const o = () => requestOptions({ timeoutMs: opts.timeoutMs });
  const where = ns === undefined ? 'in any namespace' : `in namespace ${ns}`;
  const [services, nodes, slices, leases] = await Promise.all([
    listAll(`list services ${where}`, server, opts.timeoutMs, (page) =>
      ns === undefined ? core.listServiceForAllNamespaces(page, o()) : core.listNamespacedService({ namespace: ns, ...page }, o()),
    ),
    listAll('list nodes', server, opts.timeoutMs, (page) => core.listNode(page, o())),
    listAll(`list endpointslices ${where}`, server, opts.timeoutMs, (page) =>
      ns === undefined ? discovery.listEndpointSliceForAllNamespaces(page, o()) : discovery.listNamespacedEndpointSlice({ namespace: ns, ...page }, o()),
    ),
    listAll(`list leases in namespace ${opts.pierNamespace}`, server, opts.timeoutMs, (page) =>
      coordination.listNamespacedLease({ namespace: opts.pierNamespace, ...page }, o()),
    ),
  ]);
  return { services, nodes, slices, leases };
}

async function listAll<T extends KubernetesObject>(
  what: string,
  server: string,
  timeoutMs: number,
  list: (page: { limit: number; _continue?: string }) => Promise<KubernetesListObject<T>>,
): Promise<T[]> {
  const items: T[] = [];
  let next: string | undefined;
  do {
    let page: KubernetesListObject<T>;
    try {
      page = await list({ limit: 500, ...(next ? { _continue: next } : {}) });
    } catch (err) {
      throw new StatusReadError(`cannot ${what}: ${describeFailure(err, server, timeoutMs)}`);
    }
    items.push(...page.items);
    next = page.metadata?._continue || undefined;
  } while (next);
  return items;
}

/** Why a request failed, for a person: the API server's own message, or what kept it from answering. */
export function describeFailure(err: unknown, server: string, timeoutMs: number): string {
  const code = apiStatus(err);
  if (code !== undefined) {
    const body = (err as { body?: unknown }).body;
    let message = '';
    try {
      const parsed = typeof body === 'string' ? (JSON.parse(body) as { message?: unknown }) : (body as { message?: unknown } | undefined);
      if (typeof parsed?.message === 'string') message = parsed.message;
    } catch {
      message = String(body).slice(0, 200);
    }
    const hint = code === 403 ? ' (pier status needs list on services, nodes and endpointslices, and on leases in pier\'s namespace; see the README)' : code === 401 ? ' (the kubeconfig\'s credentials were refused)' : '';
    return `HTTP ${code}${message ? `: ${message}` : ''}${hint}`;
  }
  const e = err as { name?: string; message?: string; cause?: { code?: string; message?: string } };
  if (e?.name === 'TimeoutError' || e?.name === 'AbortError') return `${server} did not answer within ${formatDuration(timeoutMs)}`;
  const cause = e?.cause?.code ?? e?.cause?.message;
  return `cannot reach ${server}: ${e?.message ?? String(err)}${cause ? ` (${cause})` : ''}`;
}
