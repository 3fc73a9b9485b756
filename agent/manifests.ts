// Reading Node, Service and EndpointSlice manifests from disk for `pier plan`:
// YAML or JSON, several documents per file, `kind: List` wrappers, and
// directories read the way `kubectl apply -f DIR` reads them (their .yaml,
// .yml and .json files, not recursively, in name order). Other kinds are
// skipped. A malformed object is an error naming the file, the document and
// the field. A file with an error is skipped whole (a plan built on a
// half-read file would mislead) and the others are still read: one bad file
// in a directory hides nothing else, and the caller says which it skipped.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { extname, join } from 'node:path';
import type { V1EndpointSlice, V1Node, V1Service } from '@kubernetes/client-node';
import { parseAllDocuments } from 'yaml';

export class ManifestError extends Error {
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

export interface ManifestsRead {
  manifests: Manifests;
  /** One per file (or path) skipped, naming it: the manifests hold nothing of those. */
  errors: ManifestError[];
}

/** Every readable file's objects, and an error for each file skipped. Never throws for bad input. */
export function readManifestFiles(paths: string[]): ManifestsRead {
  const errors: ManifestError[] = [];
  const manifests: Manifests = { nodes: [], services: [], slices: [] };
  for (const file of manifestFiles(paths, errors)) {
    const mine: Manifests = { nodes: [], services: [], slices: [] };
    try {
      readFile(file, mine);
    } catch (err) {
      if (!(err instanceof ManifestError)) throw err;
      errors.push(err);
      continue;
    }
    manifests.nodes.push(...mine.nodes);
    manifests.services.push(...mine.services);
    manifests.slices.push(...mine.slices);
  }
  return { manifests, errors };
}

/** Like readManifestFiles, but the first bad file is an error. */
export function readManifests(paths: string[]): Manifests {
  const { manifests, errors } = readManifestFiles(paths);
  if (errors.length > 0) throw errors[0]!;
  return manifests;
}

function readFile(file: string, out: Manifests): void {
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
    addObject(out, value, where, '');
  });
}

function addObject(out: Manifests, value: unknown, where: string, path: string): void {
  const obj = expectObject(value, where, path || '(document)');
  const kind = obj['kind'];
  if (typeof kind !== 'string') throw new ManifestError(`${where}: ${path}kind is missing or not a string`);
  if (kind === 'List' || kind.endsWith('List')) {
    const items = obj['items'];
    if (!Array.isArray(items)) throw new ManifestError(`${where}: ${path}items must be a list in a ${kind}`);
    items.forEach((item, i) => addObject(out, item, where, `${path}items[${i}].`));
    return;
  }
  if (kind !== 'Node' && kind !== 'Service' && kind !== 'EndpointSlice') return;
  const meta = expectObject(obj['metadata'], where, `${path}metadata`);
  const name = meta['name'];
  if (typeof name !== 'string' || name === '') throw new ManifestError(`${where}: ${path}metadata.name is missing (${kind})`);
  const label = `${kind} ${name}`;
  const field = (f: string) => `${where}: ${label}: ${path}${f}`;
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
