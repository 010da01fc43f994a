/**
 * Brings up what the integration tests need (PostgreSQL and a real Kafka broker: the local ones,
 * or those named by DATABASE_URL / KAFKA_BROKERS; and a PostgreSQL at wal_level=logical for the WAL
 * source's tests, WAL_DATABASE_URL or the project's own cluster on 5433) and prepares a migrated
 * template database that each test file clones.
 */
import type { TestProject } from 'vitest/node';
import pg from 'pg';
import { ensureServices } from '../scripts/services.js';
import { migrate } from '../src/migrate.js';
import { buildCli, type CliBuild } from './helpers/cli-build.js';

type Services = Awaited<ReturnType<typeof ensureServices>>;

/**
 * The services of this run, shared by the projects that name this file (integration and alone run
 * their global setups in one process): one start, stopped by the last teardown.
 */
const shared = globalThis as typeof globalThis & {
  outboxkitTestServices?: { services: Promise<Services>; cli: Promise<CliBuild>; users: number };
};

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  shared.outboxkitTestServices ??= {
    services: ensureServices((msg) => console.log(`[services] ${msg}`)),
    cli: buildCli(process.cwd()),
    users: 0,
  };
  const entry = shared.outboxkitTestServices;
  entry.users += 1;
  const release = async () => {
    entry.users -= 1;
    if (entry.users === 0) {
      shared.outboxkitTestServices = undefined;
      (await entry.cli.catch(() => undefined))?.remove();
      await (await entry.services).stop();
    }
  };
  let services: Services;
  let cli: CliBuild;
  try {
    [services, cli] = await Promise.all([entry.services, entry.cli]);
  } catch (err) {
    entry.users -= 1;
    if (entry.users === 0) shared.outboxkitTestServices = undefined;
    throw err;
  }
  const { databaseUrl, kafkaBrokers, walDatabaseUrl, walDatabaseError } = services;
  // One template per run and project: two runs on one server (two developers, or a run beside the
  // demo) do not drop each other's template, nor do two projects of one run.
  const TEMPLATE_DB = `outboxkit_template_${process.pid}_${project.name.replace(/[^a-z0-9]/gi, '_').toLowerCase()}`;
  const admin = new pg.Client({ connectionString: databaseUrl });
  try {
    await admin.connect();
    await admin.query(`DROP DATABASE IF EXISTS ${TEMPLATE_DB} WITH (FORCE)`);
    await admin.query(`CREATE DATABASE ${TEMPLATE_DB}`);
    const url = new URL(databaseUrl);
    url.pathname = `/${TEMPLATE_DB}`;
    await migrate({ connectionString: url.toString() });
  } catch (err) {
    await release();
    throw err;
  } finally {
    await admin.end();
  }
  project.provide('databaseUrl', databaseUrl);
  project.provide('kafkaBrokers', kafkaBrokers);
  project.provide('templateDatabase', TEMPLATE_DB);
  project.provide('cliEntry', cli.entry);
  // Not fatal here: only the WAL tests need it, and test/helpers/wal.ts fails them with the reason.
  project.provide('walDatabaseUrl', walDatabaseUrl);
  project.provide('walDatabaseError', walDatabaseError ?? null);
  return async () => {
    const c = new pg.Client({ connectionString: databaseUrl });
    try {
      await c.connect();
      await c.query(`DROP DATABASE IF EXISTS ${TEMPLATE_DB} WITH (FORCE)`);
    } finally {
      await c.end();
      // Containers started through testcontainers (none on the local paths), by the last project.
      await release();
    }
  };
}

declare module 'vitest' {
  export interface ProvidedContext {
    databaseUrl: string;
    kafkaBrokers: string[];
    templateDatabase: string;
    /** A server at wal_level=logical (scripts/services.ts, ensureWalPostgres). */
    walDatabaseUrl: string;
    /** Why {@link walDatabaseUrl} could not be brought up; null when it answered. */
    walDatabaseError: string | null;
    /** The CLI built from this run's sources (test/helpers/cli-build.ts). */
    cliEntry?: string;
  }
}
