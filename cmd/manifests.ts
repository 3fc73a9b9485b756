// Reading Node, Service and EndpointSlice manifests from disk for `pier plan`:
// YAML or JSON, several documents per file, `kind: List` wrappers, and
// directories read the way `kubectl apply -f DIR` reads them (their .yaml,
// .yml and .json files, not recursively, in name order). Other kinds are
// skipped. A malformed object is an error naming the file, the document and
// the field. A file with an error is skipped whole (a plan built on a
// half-read file would mislead) and the others are still read: one bad file
// in a directory hides nothing else, and the caller says which it skipped.
// Two objects of one kind with one name (and namespace) are what `kubectl
// apply` makes one object of: the later one read is kept, and the caller
// names both.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { extname, join } from 'node:path';
import type { V1EndpointSlice, V1Node, V1Service } from '@kubernetes/client-node';
import { parseAllDocuments } from 'yaml';
import { ExplainedError } from '../lib/errors.ts';

export class ManifestError extends ExplainedError {
  override name = 'ManifestError';
}

export interface Manifests {
  nodes: V1Node[];
  services: V1Service[];
  slices: V1EndpointSlice[];
}

const EXTENSIONS = new Set(['.yaml', '.yml', '.json']);

/** Expands directories into their manifest files; a path that cannot be read becomes an error, and the others are still expanded. */
export function manifestFiles(paths: string[], errors: ManifestError[] = []): string[] {
  const files: string[] = [];
  const fail = (p: string, err: unknown) =>
    errors.push(new ManifestError(`${p}: ${(err as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file or directory' : (err as Error).message}`));
  for (const p of paths) {
    let st;
    try {
      st = statSync(p);
    } catch (err) {
      fail(p, err);
      continue;
    }
    if (!st.isDirectory()) {
      files.push(p);
      continue;
    }
    let names: string[];
    try {
      names = readdirSync(p);
    } catch (err) {
      fail(p, err);
      continue;
    }
    for (const f of names.filter((n) => EXTENSIONS.has(extname(n).toLowerCase())).sort()) {
      const file = join(p, f);
      try {
        if (statSync(file).isFile()) files.push(file);
      } catch (err) {
        fail(file, err); // a dangling symlink, say
      }
    }
  }
  return files;
}

type Kind = 'Node' | 'Service' | 'EndpointSlice';

/** An object left out because a later one has its kind and name. */
export interface Duplicate {
  kind: Kind;
  /** `namespace/name` (pier's key: no namespace is ''), or a Node's name. */
  name: string;
  /** Where the object kept was read: the last one. */
  kept: string;
  /** Where the one left out was read. */
  dropped: string;
  message: string;
}

export interface ManifestsRead {
  /** Each object once: of two with one kind and name, the later one read. */
  manifests: Manifests;
  /** One per file (or path) skipped, naming it: the manifests hold nothing of those. */
  errors: ManifestError[];
  /** One per object left out for a later one. */
  duplicates: Duplicate[];
}

/** Where each object was read, for the duplicates' messages. */
type Sources = Map<object, string>;

/** Every readable file's objects, and an error for each file skipped. Never throws for bad input. */
export function readManifestFiles(paths: string[]): ManifestsRead {
  const errors: ManifestError[] = [];
  const all: Manifests = { nodes: [], services: [], slices: [] };
  const sources: Sources = new Map();
  for (const file of manifestFiles(paths, errors)) {
    const mine: Manifests = { nodes: [], services: [], slices: [] };
    try {
      readFile(file, mine, sources);
    } catch (err) {
      if (!(err instanceof ManifestError)) throw err;
      errors.push(err);
      continue;
    }
    all.nodes.push(...mine.nodes);
    all.services.push(...mine.services);
    all.slices.push(...mine.slices);
  }
  // The agent's engine takes each object once, as informers hold them.
  const duplicates: Duplicate[] = [];
  const manifests: Manifests = {
    nodes: latest('Node', all.nodes, sources, duplicates),
    services: latest('Service', all.services, sources, duplicates),
    slices: latest('EndpointSlice', all.slices, sources, duplicates),
  };
  return { manifests, errors, duplicates };
}

/** `list` with each name once, the last object of each name where it was read; the others become Duplicates. */
function latest<T extends { metadata?: { namespace?: string; name?: string } }>(kind: Kind, list: T[], sources: Sources, out: Duplicate[]): T[] {
  const name = (o: T) => (kind === 'Node' ? (o.metadata?.name ?? '') : `${o.metadata?.namespace ?? ''}/${o.metadata?.name ?? ''}`);
  const last = new Map<string, T>();
  for (const o of list) last.set(name(o), o);
  if (last.size === list.length) return list;
  const kept: T[] = [];
  for (const o of list) {
    const n = name(o);
    const winner = last.get(n)!;
    if (winner === o) {
      kept.push(o);
      continue;
    }
    const k = sources.get(winner) ?? '?';
    const d = sources.get(o) ?? '?';
    out.push({ kind, name: n, kept: k, dropped: d, message: `${kind} ${n} in ${d} is read again in ${k}: the later one is used, as kubectl apply would leave it` });
  }
  return kept;
}

/** Like readManifestFiles, but the first bad file is an error. */
export function readManifests(paths: string[]): Manifests {
  const { manifests, errors } = readManifestFiles(paths);
  if (errors.length > 0) throw errors[0]!;
  return manifests;
}

function readFile(file: string, out: Manifests, sources: Sources): void {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new ManifestError(`${file}: ${(err as Error).message}`);
  }
  const docs = parseAllDocuments(text);
  const list = Array.isArray(docs) ? docs : [docs];
  list.forEach((doc, i) => {
    const where = list.length > 1 ? `${file} (document ${i + 1})` : file;
    if (doc.errors.length > 0) throw new ManifestError(`${where}: not valid YAML or JSON: ${doc.errors[0]!.message.split('\n')[0]}`);
    const value: unknown = doc.toJS();
    if (value === null || value === undefined) return; // empty document, e.g. a trailing ---
    addObject(out, sources, value, where, '');
  });
}

function addObject(out: Manifests, sources: Sources, value: unknown, where: string, path: string): void {
  const obj = expectObject(value, where, path || '(document)');
  const kind = obj['kind'];
  if (typeof kind !== 'string') throw new ManifestError(`${where}: ${path}kind is missing or not a string`);
  if (kind === 'List' || kind.endsWith('List')) {
    const items = obj['items'];
    if (!Array.isArray(items)) throw new ManifestError(`${where}: ${path}items must be a list in a ${kind}`);
    items.forEach((item, i) => addObject(out, sources, item, where, `${path}items[${i}].`));
    return;
  }
  if (kind !== 'Node' && kind !== 'Service' && kind !== 'EndpointSlice') return;
  const meta = expectObject(obj['metadata'], where, `${path}metadata`);
  const name = meta['name'];
  if (typeof name !== 'string' || name === '') throw new ManifestError(`${where}: ${path}metadata.name is missing (${kind})`);
  const label = `${kind} ${name}`;
  const field = (f: string) => `${where}: ${label}: ${path}${f}`;
  const namespace = meta['namespace'];
  if (namespace !== undefined && namespace !== null && typeof namespace !== 'string') throw new ManifestError(`${field('metadata.namespace')} must be a string`);
  // The API server allows no '/' in either; pier keys objects by `namespace/name`.
  if (name.includes('/')) throw new ManifestError(`${field('metadata.name')} must not contain "/"`);
  if (typeof namespace === 'string' && namespace.includes('/')) throw new ManifestError(`${field('metadata.namespace')} must not contain "/"`);
  sources.set(obj, path ? `${where}, ${path.slice(0, -1)}` : where);
  if (kind === 'Node') {
    const addresses = (obj['status'] as Record<string, unknown> | undefined)?.['addresses'];
    if (addresses !== undefined) {
      if (!Array.isArray(addresses)) throw new ManifestError(`${field('status.addresses')} must be a list`);
      addresses.forEach((a, i) => {
        const e = expectObject(a, where, `${path}status.addresses[${i}]`);
        if (typeof e['address'] !== 'string') throw new ManifestError(`${field(`status.addresses[${i}].address`)} must be a string`);
      });
    }
    out.nodes.push(obj as V1Node);
  } else if (kind === 'Service') {
    const spec = expectObject(obj['spec'], where, `${path}spec`);
    const ports = spec['ports'];
    if (ports !== undefined) {
      if (!Array.isArray(ports)) throw new ManifestError(`${field('spec.ports')} must be a list`);
      ports.forEach((p, i) => {
        const e = expectObject(p, where, `${path}spec.ports[${i}]`);
        if (!Number.isInteger(e['port'])) throw new ManifestError(`${field(`spec.ports[${i}].port`)} must be an integer, got ${JSON.stringify(e['port'])}`);
      });
    }
    const ingress = ((obj['status'] as Record<string, unknown> | undefined)?.['loadBalancer'] as Record<string, unknown> | undefined)?.['ingress'];
    if (ingress !== undefined && !Array.isArray(ingress)) throw new ManifestError(`${field('status.loadBalancer.ingress')} must be a list`);
    out.services.push(obj as V1Service);
  } else {
    if (typeof obj['addressType'] !== 'string') throw new ManifestError(`${field('addressType')} is missing`);
    const endpoints = obj['endpoints'];
    if (endpoints !== undefined && endpoints !== null) {
      if (!Array.isArray(endpoints)) throw new ManifestError(`${field('endpoints')} must be a list`);
      endpoints.forEach((ep, i) => {
        const e = expectObject(ep, where, `${path}endpoints[${i}]`);
        if (!Array.isArray(e['addresses'])) throw new ManifestError(`${field(`endpoints[${i}].addresses`)} must be a list`);
      });
    }
    out.slices.push(obj as unknown as V1EndpointSlice);
  }
}

function expectObject(value: unknown, where: string, path: string): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new ManifestError(`${where}: ${path} must be an object, got ${value === null ? 'null' : Array.isArray(value) ? 'a list' : typeof value}`);
  }
  return value as Record<string, unknown>;
}
