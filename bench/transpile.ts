// Benchmarks measure pier as it ships, compiled to JavaScript: Node's
// TypeScript loader alone adds ~17 MB and start-up time to a process.
import { mkdir, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');

/**
 * Transpiles `entries` (folders, whose .ts files are taken with their
 * subfolders', or single .ts files; relative to the repository root) into a
 * fresh `out`, keeping the layout, so relative imports still resolve.
 */
export async function transpile(out: string, entries: string[]): Promise<void> {
  await rm(out, { recursive: true, force: true });
  for (const entry of entries) {
    const path = join(ROOT, entry);
    const files = (await stat(path)).isDirectory()
      ? (await readdir(path, { recursive: true })).filter((f) => f.endsWith('.ts')).map((f) => join(path, f))
      : [path];
    for (const file of files) {
      const js = ts.transpileModule(await readFile(file, 'utf8'), {
        fileName: file,
        compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022, verbatimModuleSyntax: true, rewriteRelativeImportExtensions: true },
      }).outputText;
      const target = join(out, relative(ROOT, file)).replace(/\.ts$/, '.js');
      await mkdir(dirname(target), { recursive: true });
      await writeFile(target, js);
    }
  }
}
