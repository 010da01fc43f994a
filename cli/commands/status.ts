import type { Command } from 'commander';
import { quoteSchema } from '../../src/schema-name.js';
import { backlog, laneOwners } from '../../relay/sql.js';
import { databaseOption, q, schemaOption, withPool } from '../shared.js';
import { printJson, printLines } from '../printable.js';

/** `outboxkit status`. */
export function registerStatus(program: Command): void {
  program
    .command('status')
    .description('print the backlog, parked events and lane owners')
    .addOption(databaseOption())
    .addOption(schemaOption())
    .option('--json', 'print JSON')
    .action(async (opts: { databaseUrl: string; schema: string; json?: boolean }) => {
      await withPool(opts.databaseUrl, 'status', opts.schema, async (pool) => {
        const schema = quoteSchema(opts.schema);
        const status = { backlog: await backlog(q(pool), schema), lanes: await laneOwners(q(pool), schema) };
        if (opts.json) {
          printJson(status, 2);
        } else {
          printLines(
            `pending: ${status.backlog.pending}  parked: ${status.backlog.parked}  oldest pending: ${Math.round(status.backlog.oldestPendingMs)} ms`,
          );
          for (const l of status.lanes)
            printLines(
              `  ${l.owner_id ?? '(free)'}: ${l.lanes} lanes${l.owner_id && !l.live ? ' (lease expired)' : ''}`,
            );
        }
      });
    });
}
