import { InvalidArgumentError, Option, type Command } from 'commander';
import pg from 'pg';
import { pino } from 'pino';
import { migrate, type MigrateResult } from '../../src/migrate.js';
import { checkReplicationName } from '../../src/wal-publication.js';
import { applicationName, databaseOption, schemaOption } from '../shared.js';
import { printJson, printableJson } from '../printable.js';

/** `outboxkit migrate`. */
export function registerMigrate(program: Command): void {
  program
    .command('migrate')
    .description("create or upgrade outboxkit's tables (safe to run from several processes at once)")
    .addOption(databaseOption())
    .addOption(schemaOption())
    .addOption(
      new Option(
        '--wal-publication [name]',
        'also create the publication the WAL relay reads (--source wal; needs wal_level = logical), named <schema>_outbox_events unless named here; an existing one is kept',
      ).argParser((value: string) => {
        try {
          return checkReplicationName(value, 'publication');
        } catch (err) {
          throw new InvalidArgumentError((err as Error).message);
        }
      }),
    )
    .option(
      '--json',
      'print JSON on stdout: { "applied": [migration names] }, with "walPublication": { "name", "created" } when asked (no log lines)',
    )
    .action(async (opts: { databaseUrl: string; schema: string; json?: boolean; walPublication?: string | true }) => {
      const logger = pino({ name: 'outboxkit', enabled: !opts.json, hooks: { streamWrite: printableJson } });
      // The CLI's own client, to name it in pg_stat_activity; migrate() reports a lost connection
      // at its next statement.
      const client = new pg.Client({
        connectionString: opts.databaseUrl,
        fallback_application_name: applicationName('migrate'),
      });
      client.on('error', () => undefined);
      await client.connect();
      let result: MigrateResult;
      try {
        result = await migrate({ client, schema: opts.schema, logger, walPublication: opts.walPublication ?? false });
      } finally {
        await client.end().catch(() => undefined);
      }
      const { applied, walPublication } = result;
      // migrate() logged the publication's line itself (created, or kept as it is).
      if (opts.json) printJson(walPublication ? { applied, walPublication } : { applied });
      else logger.info({ applied }, applied.length ? 'migrations applied' : 'schema is up to date');
    });
}
