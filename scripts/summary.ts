// The end of a test run (scripts/test.sh): a table of its stages, vitest's
// files by time, what failed and what was skipped, by name, and one plain
// closing line, "tests: N passed, N failed, N skipped", that counts vitest and
// the upstream specs together. A failure that has no failed test of its own
// counts too: a test file that did not load, a failed beforeAll or afterAll
// (vitest then reports the file's tests as skipped), vitest writing no report,
// an upstream run that stopped before its specs had outcomes. Exit 1 when
// anything failed or nothing ran.
//
// With --readme-runs, the README runs (test/support/readme.ts) that did not
// run to the end are listed as skipped: a README command counts as tested only
// in a run that ran it.
//
//   node scripts/summary.ts --vitest FILE... [--stages FILE] [--upstream FILE]... [--readme-runs FILE]
import { existsSync, readFileSync } from 'node:fs';
import { relative } from 'node:path';
import { parseArgs } from 'node:util';
import { README_RUNS } from '../test/support/readme.ts';
import type { UpstreamResult } from '../test/upstream/run.ts';

/** The parts of vitest's JSON report (its jest-compatible reporter) read here. */
interface VitestReport {
  testResults: {
    name: string;
    status: string;
    message?: string;
    startTime?: number;
    endTime?: number;
    assertionResults: { fullName: string; status: string }[];
  }[];
}

export interface Tally {
  passed: number;
  failed: string[];
  skipped: string[];
}

const firstLine = (s: string | undefined) => (s ?? '').trim().split('\n')[0]!.slice(0, 200);
const SKIPPED = new Set(['skipped', 'pending', 'todo', 'disabled']);

/** Counts a vitest report; a file that failed with no failed test of its own is one failure, named by the file. */
export function tallyVitest(report: VitestReport, root: string): Tally {
  const t: Tally = { passed: 0, failed: [], skipped: [] };
  for (const file of report.testResults) {
    const name = relative(root, file.name);
    const failedHere = file.assertionResults.filter((a) => a.status === 'failed').length;
    // A failed beforeAll leaves its tests "skipped": they were not run, not skipped by choice.
    const outside = file.status === 'failed' && failedHere === 0;
    for (const a of file.assertionResults) {
      if (a.status === 'passed') t.passed++;
      else if (a.status === 'failed') t.failed.push(`${name} > ${a.fullName}`);
      else if (SKIPPED.has(a.status)) t.skipped.push(`${name} > ${a.fullName}${outside ? ' (not run: its file failed)' : ''}`);
    }
    if (outside) t.failed.push(`${name}: ${firstLine(file.message) || 'failed outside its tests: a beforeAll or afterAll hook (its error is in vitest\'s output above)'}`);
  }
  return t;
}

/** Counts one upstream run; a run that is missing or stopped early is one failure. */
export function tallyUpstream(report: UpstreamResult | undefined, file: string): Tally {
  const t: Tally = { passed: 0, failed: [], skipped: [] };
  if (!report) {
    t.failed.push(`upstream ${file}: no outcomes written (the run failed before its specs; see its .log)`);
    return t;
  }
  const who = `upstream ${report.backend}${report.shard === '1/1' ? '' : ` ${report.shard}`}`;
  for (const o of report.outcomes) {
    const spec = o.spec.replace(/^\[sig-network\] /, '');
    if (o.state === 'passed') t.passed++;
    else if (o.state === 'skipped') t.skipped.push(`${who} > ${spec}`);
    else t.failed.push(`${who} > ${spec}: ${o.state}${o.detail ? `: ${firstLine(o.detail)}` : ''}`);
  }
  if (!report.complete) t.failed.push(`${who}: stopped before every spec of its shard had an outcome (see its .log)`);
  return t;
}

/** The README runs not recorded in `ran` (one id a line), each a skip naming its test. */
export function unrunReadme(ran: string): Tally {
  const done = new Set(ran.split('\n').filter(Boolean));
  const skipped = Object.entries(README_RUNS)
    .filter(([id]) => !done.has(id))
    .map(([id, r]) => `README run ${id} (${r.test.file}): its commands did not run here`);
  return { passed: 0, failed: [], skipped };
}

export function closingLine(t: Tally): string {
  return `tests: ${t.passed} passed, ${t.failed.length} failed, ${t.skipped.length} skipped`;
}

const merge = (...ts: Tally[]): Tally => ({ passed: ts.reduce((n, t) => n + t.passed, 0), failed: ts.flatMap((t) => t.failed), skipped: ts.flatMap((t) => t.skipped) });
const mmss = (seconds: number) => {
  const s = Math.round(seconds);
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
};

function readJson<T>(file: string): T | undefined {
  if (!existsSync(file)) return undefined;
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as T;
  } catch {
    return undefined;
  }
}

function stagesTable(file: string): string[] {
  if (!existsSync(file)) return [];
  const rows = readFileSync(file, 'utf8')
    .trim()
    .split('\n')
    .filter(Boolean)
    .map((l) => l.split('\t'))
    .map(([name, start, length, rc]) => ({ name: name!, start: Number(start), length: Number(length), rc: rc! }))
    .sort((a, b) => a.start - b.start);
  const w = Math.max(5, ...rows.map((r) => r.name.length));
  return [
    'stages (start and length in min:s from the run\'s start; they overlap where they run at once):',
    ...rows.map((r) => `  ${r.name.padEnd(w)}  ${mmss(r.start).padStart(6)}  ${mmss(r.length).padStart(6)}${r.rc === '0' ? '' : `  exit ${r.rc}`}`),
  ];
}

function filesTable(report: VitestReport, root: string, atLeastS: number): string[] {
  const files = report.testResults
    .map((f) => ({ name: relative(root, f.name), s: ((f.endTime ?? 0) - (f.startTime ?? 0)) / 1000 }))
    .sort((a, b) => b.s - a.s);
  const long = files.filter((f) => f.s >= atLeastS);
  const rest = files.slice(long.length);
  return [
    `vitest files by time (${files.length} files, ${mmss(files.reduce((n, f) => n + f.s, 0))} in all):`,
    ...long.map((f) => `  ${mmss(f.s).padStart(6)}  ${f.name}`),
    ...(rest.length ? [`  ${mmss(rest.reduce((n, f) => n + f.s, 0)).padStart(6)}  the other ${rest.length} files, under ${atLeastS} s each`] : []),
  ];
}

function main(): number {
  const { values } = parseArgs({
    options: { vitest: { type: 'string', multiple: true, default: [] }, stages: { type: 'string' }, upstream: { type: 'string', multiple: true, default: [] }, 'readme-runs': { type: 'string' } },
  });
  const root = process.cwd();
  const parts: Tally[] = [];
  const out: string[] = [''];
  if (values.stages) out.push(...stagesTable(values.stages), '');
  const reports: VitestReport = { testResults: [] };
  for (const file of values.vitest!) {
    const report = readJson<VitestReport>(file);
    if (report) {
      reports.testResults.push(...report.testResults);
      parts.push(tallyVitest(report, root));
    } else parts.push({ passed: 0, failed: [`vitest: no report in ${file} (vitest did not finish; its output is above)`], skipped: [] });
  }
  if (reports.testResults.length) out.push(...filesTable(reports, root, 10), '');
  for (const file of values.upstream!) parts.push(tallyUpstream(readJson<UpstreamResult>(file), file));
  const readme = values['readme-runs'];
  if (readme) parts.push(unrunReadme(existsSync(readme) ? readFileSync(readme, 'utf8') : ''));
  const all = merge(...parts);
  if (all.skipped.length) out.push(`skipped (${all.skipped.length}):`, ...all.skipped.map((s) => `  ${s}`), '');
  if (all.failed.length) out.push(`FAILED (${all.failed.length}):`, ...all.failed.map((s) => `  ${s}`), '');
  out.push(closingLine(all));
  console.log(out.join('\n'));
  if (all.passed + all.failed.length === 0) {
    console.error('summary: no test ran');
    return 1;
  }
  return all.failed.length > 0 ? 1 : 0;
}

if (import.meta.main) process.exit(main());
