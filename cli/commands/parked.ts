import { InvalidArgumentError, type Command } from 'commander';
import { quoteSchema } from '../../src/schema-name.js';
import { listParked, retryParked, skipParked } from '../../relay/sql.js';
import { databaseOption, eventIdList, positiveInt, q, schemaOption, withPool } from '../shared.js';
import { printError, printJson, printLines } from '../printable.js';

/** `outboxkit parked list|retry|skip`. */
export function registerParked(program: Command): void {
  const parked = program.command('parked').description('events the relay parked after repeated failures');
  parked
    .command('list')
    .description('list parked events with their error and attempts')
    .addOption(databaseOption())
    .addOption(schemaOption())
    .option('--limit <n>', 'most rows', positiveInt, 100)
    .option('--json', 'print JSON')
    .action(async (opts: { databaseUrl: string; schema: string; limit: number; json?: boolean }) => {
      await withPool(opts.databaseUrl, 'parked', opts.schema, async (pool) => {
        const rows = await listParked(q(pool), quoteSchema(opts.schema), opts.limit);
        if (opts.json) return printJson(rows, 2);
        if (rows.length === 0) return printLines('no parked events');
        // The type, key and error come from writers and from Kafka: printLines() escapes their control characters.
        for (const r of rows) {
          printLines(
            `${r.event_id}  ${r.topic}  key=${r.key === null ? '-' : JSON.stringify(r.key)}  ${r.type}  ${r.bytes} B (headers ${r.header_bytes} B)  attempts=${r.attempts}  parked ${r.parked_at.toISOString()}`,
            `    ${r.last_error ?? ''}`,
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
    .option('--json', 'print JSON: { "requeued": n, "notParked": n }')
    .action(async (ids: string[], opts: { databaseUrl: string; schema: string; all?: boolean; json?: boolean }) => {
      if (!opts.all && ids.length === 0) throw new InvalidArgumentError('Give event ids or --all.');
      if (opts.all && ids.length > 0) throw new InvalidArgumentError('Give event ids or --all, not both.');
      await withPool(opts.databaseUrl, 'parked', opts.schema, async (pool) => {
        const n = await retryParked(q(pool), quoteSchema(opts.schema), opts.all ? 'all' : ids);
        const notParked = notAllFound(opts.all ? n : new Set(ids.map((id) => id.toLowerCase())).size, n, opts.json);
        if (opts.json) printJson({ requeued: n, notParked });
        else printLines(`requeued ${n} events`);
      });
    });
  parked
    .command('skip')
    .description('give up on parked events (marked published without being sent), so their keys go on')
    .argument('<event-ids...>', 'event ids', eventIdList)
    .addOption(databaseOption())
    .addOption(schemaOption())
    .option('--json', 'print JSON: { "skipped": n, "notParked": n }')
    .action(async (ids: string[], opts: { databaseUrl: string; schema: string; json?: boolean }) => {
      await withPool(opts.databaseUrl, 'parked', opts.schema, async (pool) => {
        const n = await skipParked(q(pool), quoteSchema(opts.schema), ids);
        const notParked = notAllFound(new Set(ids.map((id) => id.toLowerCase())).size, n, opts.json);
        if (opts.json) printJson({ skipped: n, notParked });
        else printLines(`skipped ${n} events`);
      });
    });
}

/**
 * Exit code 1 when fewer events were changed than ids given (an id that is not a parked event:
 * mistyped, already retried or skipped, or published), so that a script notices. Returns how many
 * ids were not parked events; the message goes to stderr unless `json` (then it is in the JSON).
 */
function notAllFound(given: number, changed: number, json = false): number {
  const missing = Math.max(0, given - changed);
  if (missing > 0) {
    if (!json) printError(`outboxkit: ${missing} of ${given} ids are not parked events (unknown, or already handled)`);
    process.exitCode = 1;
  }
  return missing;
}
