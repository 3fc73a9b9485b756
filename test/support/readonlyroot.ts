// A mount namespace whose `/` is read-only, like a container with
// readOnlyRootFilesystem: true (other mounts, /dev/shm for one, stay as they
// are, as they do in a pod). Commands enter it with the `prefix` argv.
import { readlinkSync } from 'node:fs';
import { execa, type ResultPromise } from 'execa';
import { atExit, isAlive } from './cleanup.ts';
import { eventually } from './wait.ts';

export interface ReadOnlyRoot {
  /** argv to put before a command so that it runs inside the namespace (needs root). */
  prefix: string[];
  stop(): Promise<void>;
}

export async function readOnlyRoot(): Promise<ReadOnlyRoot> {
  // The namespace lives as long as this process; setpriv's parent-death
  // signal ends it even when the test runner is killed.
  const holder: ResultPromise = execa('unshare', ['--mount', '--propagation', 'private', '--', 'setpriv', '--pdeathsig', 'SIGKILL', '--', 'sleep', 'infinity'], {
    stdin: 'ignore',
    reject: false,
  });
  const pid = holder.pid;
  if (pid === undefined) throw new Error('unshare did not start');
  const kill = () => {
    if (isAlive(pid)) process.kill(pid, 'SIGKILL');
  };
  const unregister = atExit(kill);
  const stop = async () => {
    kill();
    await holder;
    unregister();
  };
  try {
    // Remounting before unshare(2) has run would make the host's root read-only.
    const own = readlinkSync('/proc/self/ns/mnt');
    await eventually('the mount namespace to exist', () => {
      if (!isAlive(pid)) throw new Error('unshare exited');
      return readlinkSync(`/proc/${pid}/ns/mnt`) !== own;
    });
    const prefix = ['nsenter', `--target=${pid}`, '--mount', '--'];
    const r = await execa(prefix[0]!, [...prefix.slice(1), 'mount', '-o', 'remount,bind,ro', '/'], { reject: false, all: true });
    if (r.exitCode !== 0) throw new Error(`cannot remount / read-only in the namespace: ${String(r.all)}`);
    return { prefix, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
