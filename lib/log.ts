// Structured logs as JSON lines on stderr, so stdout stays free for output a
// person or a pipe consumes (`pier plan`, `pier agent --dry-run`).
import { pino, type Logger, type LevelWithSilent } from 'pino';

export type { Logger };

export const LOG_LEVELS: readonly LevelWithSilent[] = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

export function createLogger(opts: { level?: string; name?: string } = {}): Logger {
  return pino(
    {
      name: opts.name ?? 'pier',
      level: opts.level ?? 'info',
      base: undefined,
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
    },
    pino.destination({ fd: 2, sync: true }),
  );
}

/** A logger that drops everything, for library code used without one. */
export const silentLogger: Logger = pino({ level: 'silent' });
