#!/usr/bin/env node
// The `pier` executable (package.json "bin", scripts/pier, the images'
// bundle). It checks Node's version before anything else loads: pier's
// dependencies fail on older Node with errors that name neither pier nor
// Node (undici: "Cannot read properties of undefined (reading 'bind')",
// execa: "TEXT_ENCODINGS.union is not a function"). So this file imports
// only the check, and loads the CLI once the version is known to be enough.
import { nodeAtLeast, tooOldMessage } from '../lib/node-version.ts';

if (!nodeAtLeast(process.versions.node)) {
  process.stderr.write(tooOldMessage(process.version, process.execPath));
  process.exitCode = 1;
} else {
  // cmd/cli.ts runs the command line when it loads.
  await import('./cli.ts');
}
