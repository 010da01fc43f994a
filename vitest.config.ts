import { defineConfig } from 'vitest/config';

// Two projects: `unit` needs no infrastructure; `integration` runs against the real PostgreSQL and
// the real Kafka broker, which test/global-setup.ts brings up when they are missing.
export default defineConfig({
  test: {
    // Two cores shared with PostgreSQL and the broker: few files at once.
    maxWorkers: 2,
    projects: [
      {
        test: {
          name: 'unit',
          include: ['test/unit/**/*.test.ts'],
        },
      },
      {
        test: {
          name: 'integration',
          include: ['test/**/*.test.ts'],
          exclude: ['test/unit/**'],
          globalSetup: ['test/global-setup.ts'],
          setupFiles: ['test/helpers/kafkajs-fix-setup.ts'],
          testTimeout: 60_000,
          hookTimeout: 120_000,
        },
      },
    ],
  },
});
