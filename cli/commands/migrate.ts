import type { Command } from 'commander';
import { pino } from 'pino';
import { migrate } from '../../src/migrate.js';
import { databaseOption, schemaOption } from '../shared.js';

/** `outboxkit migrate`. */
export function registerMigrate(program: Command): void {
  program
    .command('migrate')
    .description("create or upgrade outboxkit's tables (safe to run from several processes at once)")
    .addOption(databaseOption())
    .addOption(schemaOption())
    .option('--json', 'print JSON on stdout: { "applied": [migration names] } (no log lines)')
    .action(async (opts: { databaseUrl: string; schema: string; json?: boolean }) => {
      const logger = pino({ name: 'outboxkit', enabled: !opts.json });
      const { applied } = await migrate({ connectionString: opts.databaseUrl, schema: opts.schema, logger });
      if (opts.json) console.log(JSON.stringify({ applied }));
      else logger.info({ applied }, applied.length ? 'migrations applied' : 'schema is up to date');
    });
}
