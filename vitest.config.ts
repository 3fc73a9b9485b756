import { defineConfig } from 'vitest/config';

// Three projects, from fast to real:
//  unit         pure functions and in-process machinery, in parallel
//  integration  a real kube-apiserver and etcd (test/cluster), one file at a time
//  e2e          the network lab (test/lab), network namespaces, root only, one file at a time
// One file at a time across all projects: the machine has two cores, the
// lab's underlay addresses are fixed, and the end-to-end tests measure
// latencies (refused in under a second, zero failed connections) that a
// parallel kube-apiserver start-up would distort. The unit project is fast
// enough that this costs seconds.
export default defineConfig({
  test: {
    pool: 'forks',
    maxWorkers: 1,
    projects: [
      {
        test: {
          name: 'unit',
          include: ['test/unit/**/*.test.ts'],
          // A hang guard, not a speed goal: in a whole run the unit tests share
          // the cores with the first real nodes and four upstream clusters
          // starting, and a test that starts the CLI seven times took 20 s there.
          testTimeout: 60_000,
        },
      },
      {
        test: {
          name: 'integration',
          include: ['test/integration/**/*.test.ts'],
          fileParallelism: false,
          testTimeout: 180_000,
          hookTimeout: 1_800_000,
        },
      },
      {
        test: {
          name: 'e2e',
          include: ['test/e2e/**/*.test.ts'],
          fileParallelism: false,
          testTimeout: 180_000,
          hookTimeout: 1_800_000,
        },
      },
    ],
  },
});
