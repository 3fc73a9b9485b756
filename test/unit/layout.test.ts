// The arrows between the rooms (docs/architecture.md): lib/ imports nothing
// of pier's above it, agent/ and controller/ import only lib/ (and each
// its own room), and only cmd/ brings them together.
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const ROOMS = ['lib', 'agent', 'controller', 'cmd'] as const;
type Room = (typeof ROOMS)[number];
const MAY_IMPORT: Record<Room, readonly Room[]> = {
  lib: ['lib'],
  agent: ['agent', 'lib'],
  controller: ['controller', 'lib'],
  cmd: ['cmd', 'agent', 'controller', 'lib'],
};

function sources(dir: string): string[] {
  return readdirSync(join(ROOT, dir), { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile() && e.name.endsWith('.ts'))
    .map((e) => relative(ROOT, join(e.parentPath, e.name)));
}

/** The repository-relative files a source imports by relative path (static imports and re-exports). */
function importsOf(file: string): string[] {
  const text = readFileSync(join(ROOT, file), 'utf8');
  return [...text.matchAll(/^\s*(?:import|export)\b[^'"]*?from\s+'(\.[^']+)'/gm)].map((m) => relative(ROOT, resolve(dirname(join(ROOT, file)), m[1]!)));
}

describe('the rooms import only downwards', () => {
  for (const room of ROOMS) {
    it(`${room}/ imports only ${MAY_IMPORT[room].join(', ')}`, () => {
      const files = sources(room);
      expect(files.length).toBeGreaterThan(0);
      const wrong = files.flatMap((file) =>
        importsOf(file)
          .filter((target) => {
            const top = target.split('/')[0] as Room;
            return (ROOMS as readonly string[]).includes(top) && !MAY_IMPORT[room].includes(top);
          })
          .map((target) => `${file} -> ${target}`),
      );
      expect(wrong).toEqual([]);
    });
  }

  it('finds an import that goes the wrong way', () => {
    // The check itself: a file of lib/ importing the controller would be caught.
    const target = relative(ROOT, resolve(join(ROOT, 'lib'), '../controller/allocate.ts'));
    expect(target.split('/')[0]).toBe('controller');
    expect(MAY_IMPORT.lib.includes('controller')).toBe(false);
    expect(importsOf('cmd/status.ts').some((t) => t.startsWith('controller/'))).toBe(true);
  });
});
