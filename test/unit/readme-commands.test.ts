// Every command README.md tells a reader to run is run by a test, or is
// listed as not runnable here with the reason (issue 30). The commands come
// from README.md itself (test/support/readme.ts: fenced shell blocks,
// transcripts' `$ ` lines, and code spans in the prose that begin with a
// command); each must be claimed by a run in README_RUNS, whose test file
// really calls runReadme/spawnReadme with that run's id, or by an entry of
// README_NOT_RUN, printed here with its reason. Adding a command to the
// README without either fails this file.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  README_LISTINGS,
  README_NOT_RUN,
  README_RUNS,
  ROOT,
  parseReadme,
  readmeScript,
  type ReadmeCommand,
  type ReadmeRun,
  type ReadmeRunId,
} from '../support/readme.ts';

const runs = Object.entries(README_RUNS) as [ReadmeRunId, ReadmeRun][];
const key = (section: string, text: string) => `${section} :: ${text}`;
const claimedByRuns = new Map(runs.flatMap(([id, r]) => r.commands.map((c) => [key(r.section, c), id] as const)));
const notRun = new Map(README_NOT_RUN.map((n) => [key(n.section, n.command), n.reason]));

/** The README's commands that neither a run nor README_NOT_RUN accounts for. */
function unclaimed(commands: ReadmeCommand[]): string[] {
  return commands
    .filter((c) => !claimedByRuns.has(key(c.section, c.text)) && !notRun.has(key(c.section, c.text)))
    .map((c) => `README.md:${c.lineNo} (${c.kind}, "${c.section}"): ${c.text}`);
}

describe('README.md commands', () => {
  const readme = parseReadme();

  it('finds the commands of every kind: fenced shell blocks, transcripts, code spans in the prose', () => {
    const kinds = new Set(readme.commands.map((c) => c.kind));
    expect([...kinds].sort()).toEqual(['block', 'inline', 'transcript']);
    // The two set-up commands, the kind quick start's install and the uninstall are among them.
    for (const text of ['./scripts/demo.sh', './scripts/test.sh', 'kubectl apply -k deploy/overlays/kind', 'kubectl apply -k deploy/cleanup', 'helm uninstall pier -n pier-system']) {
      expect(readme.commands.map((c) => c.text)).toContain(text);
    }
  });

  it('every command is run by a test or listed as not runnable here, with the reason (printed)', () => {
    const missing = unclaimed(readme.commands);
    expect(missing, `README commands no test runs and README_NOT_RUN (test/support/readme.ts) does not list:\n${missing.join('\n')}`).toEqual([]);

    const byRun = runs.map(([id, r]) => `  ${id} (${r.test.file}, "${r.test.name}"):\n${r.commands.map((c) => `    ${c}`).join('\n')}`);
    const notRunHere = readme.commands
      .filter((c) => !claimedByRuns.has(key(c.section, c.text)))
      .map((c) => `  README.md:${c.lineNo} ${c.text}\n      ${notRun.get(key(c.section, c.text))}`);
    console.log(`[readme] ${readme.commands.length} commands; run by tests:\n${byRun.join('\n')}\n[readme] not run here (${notRunHere.length}):\n${notRunHere.join('\n')}`);
  });

  it('no command is both run and listed as not run, and nothing listed is missing from the README', () => {
    const both = [...claimedByRuns.keys()].filter((k) => notRun.has(k));
    expect(both).toEqual([]);
    const inReadme = new Set(readme.commands.map((c) => key(c.section, c.text)));
    const stale = [...claimedByRuns.keys(), ...notRun.keys()].filter((k) => !inReadme.has(k));
    expect(stale, 'listed in test/support/readme.ts but not in README.md (changed or removed?)').toEqual([]);
    for (const n of README_NOT_RUN) expect(n.reason.length, n.command).toBeGreaterThan(10);
  });

  it.each(runs)('run %s: its commands are in the README, each substitution applies, and its test calls it', (id, run) => {
    // Throws when a command or a substitution no longer matches the README.
    const lines = readmeScript(id);
    expect(lines).toHaveLength(run.commands.length);
    for (const s of run.substitutions ?? []) {
      expect(s.why.length, s.find).toBeGreaterThan(10);
      // What a substitution writes is fixed text: values from a cluster come through the environment.
      expect(s.replace, s.find).not.toMatch(/\$\{|`/);
    }
    const file = join(ROOT, run.test.file);
    expect(existsSync(file), run.test.file).toBe(true);
    const source = readFileSync(file, 'utf8');
    expect(source, `${run.test.file} calls runReadme('${id}') or spawnReadme('${id}')`).toMatch(new RegExp(`(?:runReadme|spawnReadme)\\('${id}'`));
    const name = run.test.name;
    expect(source.includes(name) || source.includes(name.replaceAll("'", "\\'")), `${run.test.file} has a test or hook named "${name}"`).toBe(true);
  });

  it('an untagged block that reads like commands is a transcript or a listing named with its reason', () => {
    const unlisted = readme.listings.filter((l) => !(l.section in README_LISTINGS)).map((l) => `README.md:${l.lineNo} ("${l.section}"): ${l.firstLine}`);
    expect(unlisted, 'tag these blocks ```sh (and claim their commands), or list them in README_LISTINGS').toEqual([]);
    const stale = Object.keys(README_LISTINGS).filter((s) => !readme.listings.some((l) => l.section === s));
    expect(stale).toEqual([]);
  });

  it('fails for a command added to the README without a test, in a block, a transcript or the prose', () => {
    const original = readFileSync(join(ROOT, 'README.md'), 'utf8');
    const added = [
      '\n## Upgrading\n\n```sh\nkubectl apply -k deploy/overlays/kind   # again\nkubectl -n pier-system rollout restart ds/pier-agent \\\n  --timeout=60s\n```\n',
      '\n```\n$ pier status -A\n```\n',
      '\nThen run `kubectl get leases -n pier-system` to see the agents.\n',
      '\n```\nkubectl get pods\n```\n',
    ];
    const { commands, listings } = parseReadme(original + added.join(''));
    expect(unclaimed(commands)).toEqual([
      expect.stringMatching(/\(block, "Upgrading"\): kubectl apply -k deploy\/overlays\/kind$/),
      expect.stringMatching(/\(block, "Upgrading"\): kubectl -n pier-system rollout restart ds\/pier-agent --timeout=60s$/),
      expect.stringMatching(/\(transcript, "Upgrading"\): pier status -A$/),
      expect.stringMatching(/\(inline, "Upgrading"\): kubectl get leases -n pier-system$/),
    ]);
    expect(listings.filter((l) => !(l.section in README_LISTINGS)).map((l) => l.firstLine)).toEqual(['kubectl get pods']);
  });

  it('reads fences as CommonMark does: a longer fence holds a shorter one, ~~~ fences, comments outside quotes only', () => {
    const { commands } = parseReadme(
      ['# T', '````sh', '```', 'echo "a # b" # c', '````', '~~~bash', "kubectl get svc -o jsonpath='{#x}'  # d", '~~~', '```yaml', 'kubectl: no', '```'].join('\n'),
    );
    expect(commands.map((c) => c.text)).toEqual(['```', 'echo "a # b"', "kubectl get svc -o jsonpath='{#x}'"]);
  });
});
