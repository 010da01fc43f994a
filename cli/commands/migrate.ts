import type { Command } from 'commander';
import pg from 'pg';
import { pino } from 'pino';
import { migrate } from '../../src/migrate.js';
import { applicationName, databaseOption, schemaOption } from '../shared.js';
import { printJson, printableJson } from '../printable.js';

/** `outboxkit migrate`. */
export function registerMigrate(program: Command): void {
  program
    .command('migrate')
    .description("create or upgrade outboxkit's tables (safe to run from several processes at once)")
    .addOption(databaseOption())
    .addOption(schemaOption())
    .option('--json', 'print JSON on stdout: { "applied": [migration names] } (no log lines)')
    .action(async (opts: { databaseUrl: string; schema: string; json?: boolean }) => {
      const logger = pino({ name: 'outboxkit', enabled: !opts.json, hooks: { streamWrite: printableJson } });
      // The CLI's own client, to name it in pg_stat_activity; migrate() reports a lost connection
      // at its next statement.
      const client = new pg.Client({
        connectionString: opts.databaseUrl,
        fallback_application_name: applicationName('migrate'),
      });
      client.on('error', () => undefined);
      await client.connect();
      let applied: string[];
      try {
        ({ applied } = await migrate({ client, schema: opts.schema, logger }));
      } finally {
        await client.end().catch(() => undefined);
      }
      if (opts.json) printJson({ applied });
      else logger.info({ applied }, applied.length ? 'migrations applied' : 'schema is up to date');
    });
}
