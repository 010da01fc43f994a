/** Shared set-up of benchmarks: a fresh migrated database and the services' addresses. */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { ensureServices } from '../scripts/services.js';
import { migrate } from '../src/migrate.js';

export interface BenchDatabase {
  url: string;
  brokers: string[];
  drop(): Promise<void>;
}

/** Creates and migrates a throwaway database for one benchmark; `drop()` removes it. */
export async function benchDatabase(): Promise<BenchDatabase> {
  const services = await ensureServices();
  const name = `outboxkit_bench_${randomBytes(4).toString('hex')}`;
  const admin = new pg.Client({ connectionString: services.databaseUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const url = new URL(services.databaseUrl);
  url.pathname = `/${name}`;
  await migrate({ connectionString: url.toString() });
  return {
    url: url.toString(),
    brokers: services.kafkaBrokers,
    async drop() {
      const c = new pg.Client({ connectionString: services.databaseUrl });
      await c.connect();
      await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await c.end();
    },
  };
}

/** A one-line description of the machine, for results. */
export async function machine(): Promise<string> {
  const os = await import('node:os');
  return `${os.cpus().length} cores, ${(os.totalmem() / 2 ** 30).toFixed(0)} GiB, Node ${process.version}, ${new Date().toISOString().slice(0, 10)}`;
}
