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
    .action(async (opts: { databaseUrl: string; schema: string }) => {
      const logger = pino({ name: 'outboxkit' });
      const { applied } = await migrate({ connectionString: opts.databaseUrl, schema: opts.schema, logger });
      logger.info({ applied }, applied.length ? 'migrations applied' : 'schema is up to date');
    });
}
