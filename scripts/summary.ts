// Prints vitest's JSON report as one plain closing line ("N passed, N failed,
// N skipped"), which CI reads whatever the runner; fails when nothing ran.
import { readFileSync } from 'node:fs';

const file = process.argv[2] ?? 'test-results/vitest.json';
let report: { numPassedTests: number; numFailedTests: number; numPendingTests: number; numTodoTests: number; numTotalTests: number };
try {
  report = JSON.parse(readFileSync(file, 'utf8'));
} catch (err) {
  console.error(`summary: cannot read ${file}: ${(err as Error).message}`);
  process.exit(1);
}
const skipped = report.numPendingTests + report.numTodoTests;
console.log(`tests: ${report.numPassedTests} passed, ${report.numFailedTests} failed, ${skipped} skipped`);
if (report.numTotalTests === 0) {
  console.error('summary: no test ran');
  process.exit(1);
}
process.exit(report.numFailedTests > 0 ? 1 : 0);
