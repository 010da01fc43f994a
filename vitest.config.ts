import { defineConfig } from 'vitest/config';
import { LongFilesFirstSequencer } from './test/helpers/sequencer.js';

// Four projects: `unit` needs no infrastructure; `integration` runs against the real PostgreSQL and
// the real Kafka broker, which test/global-setup.ts brings up when they are missing; `alone` runs
// the tests that compare two rates of one relay after the others, one file at a time, on the same
// services; `cluster` starts, breaks and stops the local 3-node Kafka cluster (scripts/services.ts),
// and runs only with OUTBOXKIT_KAFKA_NODES=3 (its tests skip otherwise, saying so).

/**
 * Tests that compare a relay's rate under a fault with its rate without one, in one run: another
 * test file beside them loads the two cores in bursts that fall on one side of the comparison (on
 * CI a median ratio of 0.74 where the same code measures 0.97-1.02 on its own, even with two busy
 * loops beside it).
 */
const ALONE = ['test/relay/poison-drain.test.ts'];

export default defineConfig({
  test: {
    // Two cores shared with PostgreSQL and the broker: few files at once.
    maxWorkers: 2,
    // vitest's order, but the files that run far longer than the rest first (the unit project's
    // test/unit/hostile-input.test.ts otherwise starts last and runs alone: test/helpers/sequencer.ts).
    sequence: { sequencer: LongFilesFirstSequencer },
    projects: [
      {
        test: {
          name: 'unit',
          include: ['test/unit/**/*.test.ts'],
          // A young generation large enough for the garbage of parsing a 1 MiB body: the
          // linear-time checks of test/unit/hostile-input.test.ts then measure the parsers' work,
          // not the moment V8 starts promoting objects to its old generation. `gc()` lets them
          // start each measurement on a collected heap (no earlier input's garbage to pay for).
          execArgv: ['--max-semi-space-size=64', '--expose-gc'],
        },
      },
      {
        test: {
          name: 'integration',
          include: ['test/**/*.test.ts'],
          exclude: ['test/unit/**', 'test/cluster/**', ...ALONE],
          globalSetup: ['test/global-setup.ts'],
          setupFiles: ['test/helpers/kafkajs-fix-setup.ts'],
          testTimeout: 60_000,
          hookTimeout: 120_000,
        },
      },
      {
        test: {
          name: 'alone',
          include: ALONE,
          // Its own template database and provided values; the services are the integration
          // project's (test/global-setup.ts starts only what is missing).
          globalSetup: ['test/global-setup.ts'],
          setupFiles: ['test/helpers/kafkajs-fix-setup.ts'],
          // After the unit and integration projects, before the cluster's, one file at a time.
          sequence: { groupOrder: 1 },
          fileParallelism: false,
          testTimeout: 60_000,
          hookTimeout: 120_000,
        },
      },
      {
        test: {
          name: 'cluster',
          include: ['test/cluster/**/*.test.ts'],
          setupFiles: ['test/helpers/kafkajs-fix-setup.ts'],
          // After the other projects: it kills cluster nodes and stops the cluster at the end, which
          // `OUTBOXKIT_KAFKA_NODES=3 npm test` also hands to the integration tests.
          sequence: { groupOrder: 2 },
          // One file at a time: each kills and restarts nodes of the one cluster.
          fileParallelism: false,
          testTimeout: 180_000,
          hookTimeout: 300_000,
        },
      },
    ],
  },
});
