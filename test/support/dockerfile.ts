// A small Dockerfile and .dockerignore reader, so a test can reproduce an
// image build outside Docker. It knows only the instructions pier's
// Dockerfiles use and throws on anything else: silently skipping an
// instruction it does not understand would let a broken Dockerfile pass.
import { posix } from 'node:path';

export type Step =
  | { kind: 'COPY'; line: number; from?: string; sources: string[]; dest: string; destIsDir: boolean }
  | { kind: 'RUN'; line: number; workdir: string; env: Record<string, string>; shell?: string; exec?: string[] }
  | { kind: 'WORKDIR'; line: number; path: string };

export interface Stage {
  index: number;
  name?: string;
  /** An image reference, or the name of an earlier stage. */
  base: string;
  /** Filesystem-changing steps in order, with the working folder and environment each saw. */
  steps: Step[];
  workdir: string;
  env: Record<string, string>;
  labels: Record<string, string>;
  user?: string;
  entrypoint?: string[];
  cmd?: string[];
}

export interface Dockerfile {
  stages: Stage[];
}

export class DockerfileError extends Error {
  override name = 'DockerfileError';
}

const SUPPORTED = new Set(['FROM', 'WORKDIR', 'COPY', 'RUN', 'ENV', 'USER', 'LABEL', 'ENTRYPOINT', 'CMD', 'ARG']);

/** Joins continuation lines and drops comments; returns instructions with their first line number. */
export function logicalLines(text: string): { line: number; text: string }[] {
  const out: { line: number; text: string }[] = [];
  let current: { line: number; text: string } | undefined;
  text.split('\n').forEach((raw, i) => {
    const trimmed = raw.trim();
    // Docker drops comment and empty lines, even inside a continued instruction.
    if (trimmed.startsWith('#') || trimmed === '') return;
    const continued = trimmed.endsWith('\\');
    const body = continued ? trimmed.slice(0, -1).trim() : trimmed;
    if (current) current.text += body === '' ? '' : ` ${body}`;
    else current = { line: i + 1, text: body };
    if (!continued) {
      out.push(current);
      current = undefined;
    }
  });
  if (current) out.push(current);
  return out;
}

/** `${NAME}` and `$NAME`; the `${NAME:-default}` forms are not supported. */
export function substitute(text: string, vars: Record<string, string>, line: number): string {
  return text.replace(/\$\{([^}]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)/g, (_m, braced: string | undefined, bare: string | undefined) => {
    const name = braced ?? bare!;
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw new DockerfileError(`line ${line}: unsupported variable form \${${name}}`);
    const value = vars[name];
    if (value === undefined) throw new DockerfileError(`line ${line}: $${name} is not declared (ARG or ENV)`);
    return value;
  });
}

/** `a=1 b="two words"`: the key=value form of ENV, LABEL and ARG. */
export function parsePairs(text: string, line: number): [string, string][] {
  const pairs: [string, string][] = [];
  const re = /\s*([^\s=]+)=(?:"((?:[^"\\]|\\.)*)"|([^\s"]*))(?=\s|$)/y;
  let pos = 0;
  while (pos < text.length) {
    if (/^\s*$/.test(text.slice(pos))) break;
    re.lastIndex = pos;
    const m = re.exec(text);
    if (!m) throw new DockerfileError(`line ${line}: expected key=value pairs, got ${JSON.stringify(text.slice(pos).trim())}`);
    pairs.push([m[1]!, m[2] !== undefined ? m[2].replace(/\\(.)/g, '$1') : m[3]!]);
    pos = re.lastIndex;
  }
  return pairs;
}

function execForm(args: string, keyword: string, line: number): string[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(args);
  } catch {
    parsed = undefined;
  }
  if (!Array.isArray(parsed) || !parsed.every((a) => typeof a === 'string')) {
    // Shell form would run the process under /bin/sh, which does not pass SIGTERM on.
    throw new DockerfileError(`line ${line}: ${keyword} must use the exec (JSON array) form`);
  }
  return parsed;
}

function parseFlags(words: string[], allowed: string[], keyword: string, line: number): { flags: Record<string, string>; rest: string[] } {
  const flags: Record<string, string> = {};
  let i = 0;
  for (; i < words.length && words[i]!.startsWith('--'); i++) {
    const m = /^--([a-z-]+)=(.+)$/.exec(words[i]!);
    if (!m || !allowed.includes(m[1]!)) throw new DockerfileError(`line ${line}: unsupported ${keyword} flag ${words[i]}`);
    flags[m[1]!] = m[2]!;
  }
  return { flags, rest: words.slice(i) };
}

export function parseDockerfile(text: string): Dockerfile {
  const stages: Stage[] = [];
  const globalArgs: Record<string, string> = {};
  let stage: Stage | undefined;
  let args: Record<string, string> = {};

  for (const { line, text: instr } of logicalLines(text)) {
    const m = /^(\S+)\s*(.*)$/.exec(instr)!;
    const keyword = m[1]!.toUpperCase();
    const rest = m[2]!;
    if (!SUPPORTED.has(keyword)) throw new DockerfileError(`line ${line}: unsupported instruction ${keyword}`);
    if (keyword === 'ARG') {
      const am = /^([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?$/.exec(rest.trim());
      if (!am) throw new DockerfileError(`line ${line}: expected ARG NAME[=default]`);
      const [, name, dflt] = am as unknown as [string, string, string | undefined];
      const value = dflt !== undefined ? (parsePairs(`${name}=${dflt}`, line)[0]![1]) : stage ? globalArgs[name] : undefined;
      if (value === undefined) throw new DockerfileError(`line ${line}: ARG ${name} has no default; the reproduction needs one`);
      if (stage) args[name] = value;
      else globalArgs[name] = value;
      continue;
    }
    if (keyword === 'FROM') {
      const words = substitute(rest, globalArgs, line).split(/\s+/);
      if (words.some((w) => w.startsWith('--'))) throw new DockerfileError(`line ${line}: FROM flags are not supported`);
      if (!(words.length === 1 || (words.length === 3 && words[1]!.toUpperCase() === 'AS'))) {
        throw new DockerfileError(`line ${line}: expected FROM image [AS name]`);
      }
      const base = words[0]!;
      const parent = stages.find((s) => s.name === base);
      stage = {
        index: stages.length,
        ...(words[2] !== undefined ? { name: words[2] } : {}),
        base,
        steps: [],
        workdir: parent?.workdir ?? '/',
        env: { ...parent?.env },
        labels: { ...parent?.labels },
        ...(parent?.user !== undefined ? { user: parent.user } : {}),
        ...(parent?.entrypoint ? { entrypoint: parent.entrypoint } : {}),
        ...(parent?.cmd ? { cmd: parent.cmd } : {}),
      };
      stages.push(stage);
      args = {};
      continue;
    }
    if (!stage) throw new DockerfileError(`line ${line}: ${keyword} before the first FROM`);
    const vars = { ...args, ...stage.env };
    switch (keyword) {
      case 'WORKDIR': {
        stage.workdir = posix.resolve(stage.workdir, substitute(rest.trim(), vars, line));
        stage.steps.push({ kind: 'WORKDIR', line, path: stage.workdir });
        break;
      }
      case 'ENV':
        for (const [k, v] of parsePairs(rest, line)) stage.env[k] = substitute(v, { ...vars, ...stage.env }, line);
        break;
      case 'LABEL':
        for (const [k, v] of parsePairs(rest, line)) stage.labels[k] = substitute(v, vars, line);
        break;
      case 'USER':
        stage.user = substitute(rest.trim(), vars, line);
        break;
      case 'ENTRYPOINT':
        stage.entrypoint = execForm(rest, keyword, line);
        // Docker resets CMD when ENTRYPOINT is set after it.
        delete stage.cmd;
        break;
      case 'CMD':
        stage.cmd = execForm(rest, keyword, line);
        break;
      case 'RUN': {
        const base = { kind: 'RUN' as const, line, workdir: stage.workdir, env: { ...stage.env } };
        if (rest.trim().startsWith('[')) stage.steps.push({ ...base, exec: execForm(rest, keyword, line) });
        else if (rest.trim().startsWith('--')) throw new DockerfileError(`line ${line}: RUN flags are not supported`);
        else stage.steps.push({ ...base, shell: rest.trim() });
        break;
      }
      case 'COPY': {
        if (rest.trim().startsWith('[')) throw new DockerfileError(`line ${line}: the JSON form of COPY is not supported`);
        const { flags, rest: paths } = parseFlags(substitute(rest, vars, line).trim().split(/\s+/), ['from', 'chown'], keyword, line);
        if (paths.length < 2) throw new DockerfileError(`line ${line}: COPY needs a source and a destination`);
        const sources = paths.slice(0, -1);
        const rawDest = paths.at(-1)!;
        for (const s of sources) {
          if (/[*?[]/.test(s)) throw new DockerfileError(`line ${line}: wildcards in COPY sources are not supported (${s})`);
        }
        stage.steps.push({
          kind: 'COPY',
          line,
          ...(flags['from'] !== undefined ? { from: flags['from'] } : {}),
          sources,
          dest: posix.resolve(stage.workdir, rawDest),
          destIsDir: rawDest.endsWith('/') || sources.length > 1,
        });
        break;
      }
    }
  }
  if (stages.length === 0) throw new DockerfileError('no FROM instruction');
  return { stages };
}

/** The stage a `FROM` or `COPY --from` names: a stage name or index; undefined for an outside image. */
export function stageRef(df: Dockerfile, ref: string, before: number): Stage | undefined {
  const found = /^\d+$/.test(ref) ? df.stages[Number(ref)] : df.stages.find((s) => s.name === ref);
  if (found && found.index >= before) throw new DockerfileError(`stage ${ref} is used before it is defined`);
  return found;
}

/** The flags between `node` and the script of a `["node", ...flags, script]` ENTRYPOINT. */
export function nodeFlags(stage: Stage): string[] {
  const [program, ...rest] = stage.entrypoint ?? [];
  if (program !== 'node' || rest.length === 0) throw new DockerfileError(`ENTRYPOINT ${JSON.stringify(stage.entrypoint)} does not run a script with node`);
  return rest.slice(0, -1);
}

/**
 * A shell-form RUN as a list of commands joined by `&&`, each split into
 * words. Anything else the shell would interpret (quotes, pipes, `;`,
 * redirections, substitutions) throws, so the reproduction never guesses.
 */
export function splitShell(command: string): string[][] {
  if (/["'`;|&<>()$\\]/.test(command.replaceAll('&&', ' '))) {
    throw new DockerfileError(`shell syntax beyond "a && b" is not supported: ${command}`);
  }
  return command.split('&&').map((part) => {
    const words = part.trim().split(/\s+/).filter((w) => w !== '');
    if (words.length === 0) throw new DockerfileError(`empty command in: ${command}`);
    return words;
  });
}

/** A .dockerignore: `ignored(path)` for a context-relative POSIX path, with Docker's rules. */
export interface DockerIgnore {
  ignored(path: string): boolean;
  /** False when no `!` pattern can match inside this ignored folder, so a walk may skip it. */
  mayIncludeUnder(dir: string): boolean;
}

interface Pattern {
  re: RegExp;
  exception: boolean;
  /** The pattern up to its first wildcard. */
  literal: string;
}

/** moby/patternmatcher's translation: `**` any number of folders, `*` and `?` within one path element. */
function compilePattern(pattern: string): RegExp {
  if (pattern.includes('[')) throw new DockerfileError(`character classes in .dockerignore are not supported: ${pattern}`);
  let re = '^';
  for (let i = 0; i < pattern.length; i++) {
    const ch = pattern[i]!;
    if (ch === '*' && pattern[i + 1] === '*') {
      i++;
      if (pattern[i + 1] === '/') i++;
      re += i + 1 >= pattern.length ? '.*' : '(.*/)?';
    } else if (ch === '*') re += '[^/]*';
    else if (ch === '?') re += '[^/]';
    else if (ch === '\\' && i + 1 < pattern.length) re += `\\${pattern[++i]}`;
    else re += /[.+^${}()|\\]/.test(ch) ? `\\${ch}` : ch;
  }
  return new RegExp(`${re}$`);
}

export function parseDockerignore(text: string): DockerIgnore {
  const patterns: Pattern[] = [];
  for (const raw of text.split('\n')) {
    let p = raw.trim();
    if (p === '' || p.startsWith('#')) continue;
    const exception = p.startsWith('!');
    if (exception) p = p.slice(1).trim();
    // Docker cleans each pattern and treats the context root as "/".
    p = posix.normalize(p).replace(/^\/+/, '').replace(/\/+$/, '');
    if (p === '' || p === '.') continue;
    patterns.push({ re: compilePattern(p), exception, literal: p.replace(/[*?\\].*$/, '') });
  }
  return {
    mayIncludeUnder(dir: string): boolean {
      const prefix = `${dir}/`;
      return patterns.some((p) => p.exception && (p.literal.startsWith(prefix) || prefix.startsWith(p.literal)));
    },
    ignored(path: string): boolean {
      const parts = path.split('/');
      const prefixes = parts.map((_, i) => parts.slice(0, i + 1).join('/'));
      let ignored = false;
      // The last pattern that matches the path or one of its parent folders decides.
      for (const p of patterns) {
        if (prefixes.some((prefix) => p.re.test(prefix))) ignored = !p.exception;
      }
      return ignored;
    },
  };
}
