import { InvalidArgumentError, type Command } from 'commander';
import { quoteSchema } from '../../src/schema-name.js';
import { listParked, retryParked, skipParked } from '../../relay/sql.js';
import { databaseOption, eventIdList, int, q, schemaOption, withPool } from '../shared.js';

/** `outboxkit parked list|retry|skip`. */
export function registerParked(program: Command): void {
  const parked = program.command('parked').description('events the relay parked after repeated failures');
  parked
    .command('list')
    .description('list parked events with their error and attempts')
    .addOption(databaseOption())
    .addOption(schemaOption())
    .option('--limit <n>', 'most rows', int, 100)
    .option('--json', 'print JSON')
    .action(async (opts: { databaseUrl: string; schema: string; limit: number; json?: boolean }) => {
      await withPool(opts.databaseUrl, async (pool) => {
        const rows = await listParked(q(pool), quoteSchema(opts.schema), opts.limit);
        if (opts.json) return console.log(JSON.stringify(rows, null, 2));
        if (rows.length === 0) return console.log('no parked events');
        for (const r of rows) {
          console.log(
            `${r.event_id}  ${r.topic}  key=${r.key ?? '-'}  ${r.type}  ${r.bytes} B  attempts=${r.attempts}  parked ${r.parked_at.toISOString()}\n    ${r.last_error ?? ''}`,
          );
        }
      });
    });
  parked
    .command('retry')
    .description('put parked events back in line (attempts reset)')
    .argument('[event-ids...]', 'event ids (or --all)', eventIdList)
    .option('--all', 'every parked event')
    .addOption(databaseOption())
    .addOption(schemaOption())
    .action(async (ids: string[], opts: { databaseUrl: string; schema: string; all?: boolean }) => {
      if (!opts.all && ids.length === 0) throw new InvalidArgumentError('Give event ids or --all.');
      if (opts.all && ids.length > 0) throw new InvalidArgumentError('Give event ids or --all, not both.');
      await withPool(opts.databaseUrl, async (pool) => {
        console.log(`requeued ${await retryParked(q(pool), quoteSchema(opts.schema), opts.all ? 'all' : ids)} events`);
      });
    });
  parked
    .command('skip')
    .description('give up on parked events (marked published without being sent), so their keys go on')
    .argument('<event-ids...>', 'event ids', eventIdList)
    .addOption(databaseOption())
    .addOption(schemaOption())
    .action(async (ids: string[], opts: { databaseUrl: string; schema: string }) => {
      await withPool(opts.databaseUrl, async (pool) => {
        console.log(`skipped ${await skipParked(q(pool), quoteSchema(opts.schema), ids)} events`);
      });
    });
}
