import { setTimeout as sleep } from 'node:timers/promises';

/**
 * Polls `check` until it returns a value other than undefined/false, or fails
 * after `timeoutMs` with the last value or error, so a failing test says what
 * it was still waiting for.
 */
export async function eventually<T>(
  what: string,
  check: () => Promise<T | undefined | false> | T | undefined | false,
  opts: { timeoutMs?: number; intervalMs?: number } = {},
): Promise<T> {
  const deadline = Date.now() + (opts.timeoutMs ?? 30_000);
  let last: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v !== undefined && v !== false) return v;
      last = v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) {
      const detail = last instanceof Error ? last.message : JSON.stringify(last);
      throw new Error(`timed out after ${opts.timeoutMs ?? 30_000} ms waiting for ${what} (last: ${detail})`);
    }
    await sleep(opts.intervalMs ?? 100);
  }
}
