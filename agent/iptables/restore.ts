// Rulesets to and from the text iptables speaks: iptables-restore payloads
// (whole or as a delta against what was applied), single commands for people
// to read, and iptables-save output parsed back for comparison.
//
// Payloads are for `iptables-restore --noflush`: declaring `:CHAIN - [0:0]`
// creates the chain or flushes it, so a chain is rewritten in place inside
// one atomic transaction and nothing outside pier's chains is touched.
import type { Family } from '../../lib/contract.ts';
import { CHAIN_PREFIX, TABLES, type Jump, type Ruleset, type TableName } from './render.ts';

export type SavedTables = Map<string, Map<string, string[]>>;

export interface RestoreOptions {
  /** What was applied last; only the difference is written. */
  previous?: Ruleset;
  /** pier chains present in the kernel per table (e.g. from parseSave); those no longer wanted are deleted. */
  existingChains?: Partial<Record<TableName, Iterable<string>>>;
  /** Rules in built-in chains to delete (before any chain is) and to insert at the top of their chain (in reverse, so the listed order holds). */
  jumps?: Partial<Record<TableName, JumpEdits>>;
}

export interface JumpEdits {
  remove: { chain: string; rule: string }[];
  insert: { chain: string; rule: string }[];
}

/**
 * The --noflush payload that turns `previous` (or, without it, whatever pier
 * chains exist) into `next`. Jumps from built-in chains are only included as
 * `jumps` says: the applier decides those from a save. Empty when nothing
 * changes.
 */
export function restoreText(next: Ruleset, opts: RestoreOptions = {}): string {
  return [...restorePieces(next, opts)].join('');
}

/**
 * restoreText in pieces, each made when it is asked for, so that a full
 * rewrite's iptables-restore parses the first chains while the rest are
 * written out (Xtables.startRestore). Each piece is whole lines.
 */
export function* restorePieces(next: Ruleset, opts: RestoreOptions = {}): Generator<string> {
  for (const table of TABLES) {
    const want = next.tables[table].chains;
    const write: string[] = [];
    const remove: string[] = [];
    if (opts.previous) {
      const had = opts.previous.tables[table].chains;
      // Chains the renderer kept from the previous ruleset are the same
      // arrays: those cost a pointer comparison each.
      for (const [chain, rules] of want) if (!sameRules(had.get(chain), rules)) write.push(chain);
      for (const chain of had.keys()) if (!want.has(chain)) remove.push(chain);
    } else {
      write.push(...want.keys());
    }
    const removing = new Set(remove);
    for (const chain of opts.existingChains?.[table] ?? []) {
      if (chain.startsWith(CHAIN_PREFIX) && !want.has(chain) && !removing.has(chain)) {
        removing.add(chain);
        remove.push(chain);
      }
    }
    const jumps = opts.jumps?.[table];
    if (write.length === 0 && remove.length === 0 && !jumps?.remove.length && !jumps?.insert.length) continue;
    remove.sort();
    // Flushing a doomed chain first drops its references to other chains, so
    // every -X below succeeds whatever order the chains referenced each other in.
    yield `*${table}\n${[...write, ...remove].map((chain) => `:${chain} - [0:0]\n`).join('')}`;
    for (const chain of write) {
      const rules = want.get(chain)!;
      // One join per chain rather than a string per rule: at 10,000 ports the
      // payload is megabytes.
      if (rules.length > 0) yield `-A ${chain} ${rules.join(`\n-A ${chain} `)}\n`;
    }
    const tail: string[] = [];
    // A jump goes before its chain can.
    for (const j of jumps?.remove ?? []) tail.push(`-D ${j.chain} ${j.rule}\n`);
    for (const chain of remove) tail.push(`-X ${chain}\n`);
    for (const j of [...(jumps?.insert ?? [])].reverse()) tail.push(`-I ${j.chain} 1 ${j.rule}\n`);
    yield `${tail.join('')}COMMIT\n`;
  }
}

/**
 * The whole ruleset, jumps included, for a host without pier rules (dry
 * runs, `pier plan`, tests). Jumps go to the top of their built-in chains,
 * in the order the agent's full rewrite leaves them, ahead of the host's own
 * rules: `-I CHAIN 1`, `-I CHAIN 2`, ... per chain.
 */
export function planText(ruleset: Ruleset): string {
  const out: string[] = [];
  for (const table of TABLES) {
    const { chains, jumps } = ruleset.tables[table];
    out.push(`*${table}`);
    for (const chain of chains.keys()) out.push(`:${chain} - [0:0]`);
    for (const [chain, rules] of chains) for (const rule of rules) out.push(`-A ${chain} ${rule}`);
    for (const j of jumpPositions(jumps)) out.push(`-I ${j.chain} ${j.position} ${j.rule}`);
    out.push('COMMIT');
  }
  return `${out.join('\n')}\n`;
}

/** Each jump with its place among the jumps of its chain, counted from 1: inserted in this order, they end in this order at the top. */
function jumpPositions(jumps: readonly Jump[]): (Jump & { position: number })[] {
  const count = new Map<string, number>();
  return jumps.map((j) => {
    const position = (count.get(j.chain) ?? 0) + 1;
    count.set(j.chain, position);
    return { ...j, position };
  });
}

/** planText as single iptables/ip6tables commands, one per line, quoted for a POSIX shell; jumps inserted as planText inserts them. */
export function commandsText(ruleset: Ruleset, family: Family = ruleset.family): string {
  const bin = family === 'ipv6' ? 'ip6tables' : 'iptables';
  const out: string[] = [];
  for (const table of TABLES) {
    const { chains, jumps } = ruleset.tables[table];
    for (const chain of chains.keys()) out.push(`${bin} -t ${table} -N ${chain}`);
    for (const [chain, rules] of chains) for (const rule of rules) out.push(command(bin, table, ['-A', chain], rule));
    for (const j of jumpPositions(jumps)) out.push(command(bin, table, ['-I', j.chain, String(j.position)], j.rule));
  }
  return out.length === 0 ? '' : `${out.join('\n')}\n`;
}

function command(bin: string, table: string, where: string[], rule: string): string {
  return [bin, '-t', table, ...where, ...splitRule(rule)].map(shellQuote).join(' ');
}

function shellQuote(word: string): string {
  if (/^[A-Za-z0-9_./:=,@%+-]+$/.test(word)) return word;
  return `'${word.replace(/'/g, `'\\''`)}'`;
}

/** Splits a rule spec into arguments the way iptables-restore does: whitespace-separated, double quotes group, backslash escapes. */
export function splitRule(rule: string): string[] {
  const words: string[] = [];
  let cur = '';
  let inWord = false;
  let quoted = false;
  for (let i = 0; i < rule.length; i++) {
    const c = rule[i]!;
    if (c === '\\' && i + 1 < rule.length) {
      cur += rule[++i];
      inWord = true;
    } else if (c === '"') {
      quoted = !quoted;
      inWord = true;
    } else if (!quoted && (c === ' ' || c === '\t')) {
      if (inWord) words.push(cur);
      cur = '';
      inWord = false;
    } else {
      cur += c;
      inWord = true;
    }
  }
  if (inWord) words.push(cur);
  return words;
}

/**
 * iptables-save output as table -> chain -> rule specs (text after
 * `-A <chain> `). Every declared chain is present, built-in ones included,
 * in the order they were declared.
 */
export function parseSave(text: string): SavedTables {
  const tables: SavedTables = new Map();
  let current: Map<string, string[]> | undefined;
  for (const raw of text.split('\n')) {
    const line = raw.trimEnd();
    if (line === '' || line.startsWith('#')) continue;
    if (line.startsWith('*')) {
      current = new Map();
      tables.set(line.slice(1), current);
    } else if (line === 'COMMIT') {
      current = undefined;
    } else if (current && line.startsWith(':')) {
      current.set(line.slice(1).split(' ')[0]!, []);
    } else if (current && line.startsWith('-A ')) {
      const rest = line.slice(3);
      const space = rest.indexOf(' ');
      const chain = space < 0 ? rest : rest.slice(0, space);
      const rule = space < 0 ? '' : rest.slice(space + 1);
      let rules = current.get(chain);
      if (!rules) current.set(chain, (rules = []));
      rules.push(rule);
    }
  }
  return tables;
}

function sameRules(a: string[] | undefined, b: string[]): boolean {
  if (a === b) return true;
  if (!a || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** The target of a rule as iptables-save prints it (`-j X` or `-g X`). */
export function jumpTarget(rule: string): string | undefined {
  // Split first: a comment may contain " -j ".
  const words = splitRule(rule);
  for (let i = words.length - 2; i >= 0; i--) if (words[i] === '-j' || words[i] === '-g') return words[i + 1];
  return undefined;
}
