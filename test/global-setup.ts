/**
 * Brings up what the integration tests need (PostgreSQL and a real Kafka broker: the local ones,
 * or those named by DATABASE_URL / KAFKA_BROKERS) and prepares a migrated template database that
 * each test file clones.
 */
import type { TestProject } from 'vitest/node';
import pg from 'pg';
import { ensureServices } from '../scripts/services.js';
import { migrate } from '../src/migrate.js';

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const { databaseUrl, kafkaBrokers } = await ensureServices((msg) => console.log(`[services] ${msg}`));
  // One template per run: two runs on one server (two developers, or a run beside the demo) do not
  // drop each other's template.
  const TEMPLATE_DB = `outboxkit_template_${process.pid}`;
  const admin = new pg.Client({ connectionString: databaseUrl });
  await admin.connect();
  try {
    await admin.query(`DROP DATABASE IF EXISTS ${TEMPLATE_DB} WITH (FORCE)`);
    await admin.query(`CREATE DATABASE ${TEMPLATE_DB}`);
    const url = new URL(databaseUrl);
    url.pathname = `/${TEMPLATE_DB}`;
    await migrate({ connectionString: url.toString() });
  } finally {
    await admin.end();
  }
  project.provide('databaseUrl', databaseUrl);
  project.provide('kafkaBrokers', kafkaBrokers);
  project.provide('templateDatabase', TEMPLATE_DB);
  return async () => {
    const c = new pg.Client({ connectionString: databaseUrl });
    await c.connect();
    try {
      await c.query(`DROP DATABASE IF EXISTS ${TEMPLATE_DB} WITH (FORCE)`);
    } finally {
      await c.end();
    }
  };
}

declare module 'vitest' {
  export interface ProvidedContext {
    databaseUrl: string;
    kafkaBrokers: string[];
    templateDatabase: string;
  }
}
