/**
 * Brings up what the integration tests need (PostgreSQL and a real Kafka broker: the local ones,
 * or those named by DATABASE_URL / KAFKA_BROKERS) and prepares a migrated template database that
 * each test file clones.
 */
import type { TestProject } from 'vitest/node';
import pg from 'pg';
import { ensureServices } from '../scripts/services.js';
import { migrate } from '../src/migrate.js';

export const TEMPLATE_DB = 'outboxkit_template';

export default async function setup(project: TestProject): Promise<void> {
  const { databaseUrl, kafkaBrokers } = await ensureServices((msg) => console.log(`[services] ${msg}`));
  const admin = new pg.Client({ connectionString: databaseUrl });
  await admin.connect();
  try {
    await admin.query(`SELECT pg_advisory_lock(hashtextextended('outboxkit:test-template', 0))`);
    await admin.query(
      `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`,
      [TEMPLATE_DB],
    );
    await admin.query(`DROP DATABASE IF EXISTS ${TEMPLATE_DB}`);
    await admin.query(`CREATE DATABASE ${TEMPLATE_DB}`);
    const url = new URL(databaseUrl);
    url.pathname = `/${TEMPLATE_DB}`;
    await migrate({ connectionString: url.toString() });
  } finally {
    await admin.end();
  }
  project.provide('databaseUrl', databaseUrl);
  project.provide('kafkaBrokers', kafkaBrokers);
}

declare module 'vitest' {
  export interface ProvidedContext {
    databaseUrl: string;
    kafkaBrokers: string[];
  }
}
