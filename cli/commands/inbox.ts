import { Option, type Command } from 'commander';
import { CLEANUP_INBOX_DEFAULTS, cleanupInbox } from '../../consumer/inbox-cleanup.js';
import { resetConsumerProgress } from '../../consumer/progress.js';
import { databaseOption, int, schemaOption, withPool } from '../shared.js';
import { printJson, printLines } from '../printable.js';

/** `outboxkit inbox cleanup` and `outboxkit inbox progress-reset`. */
export function registerInbox(program: Command): void {
  const inbox = program.command('inbox').description("the dedup consumer's inbox (applied event ids per group)");
  inbox
    .command('cleanup')
    .description(
      'delete inbox rows older than the retention, in bounded batches; keep the retention above the ' +
        "consumed topics' retention.ms, or redelivered old events are applied again",
    )
    .addOption(databaseOption())
    .addOption(schemaOption())
    .addOption(
      new Option('--retention-ms <ms>', 'delete rows processed longer ago than this (default 8 days)')
        .env('OUTBOXKIT_INBOX_RETENTION_MS')
        .argParser(int)
        .default(CLEANUP_INBOX_DEFAULTS.retentionMs),
    )
    .option('--batch-size <n>', 'rows deleted per transaction', int, CLEANUP_INBOX_DEFAULTS.batchSize)
    .option('--max-batches <n>', 'most batches in this run', int, CLEANUP_INBOX_DEFAULTS.maxBatches)
    .option('--group <consumer-group>', "only this consumer group's rows")
    .option('--json', 'print JSON: { "deleted": n, "more": boolean }')
    .action(
      async (opts: {
        databaseUrl: string;
        schema: string;
        retentionMs: number;
        batchSize: number;
        maxBatches: number;
        group?: string;
        json?: boolean;
      }) => {
        await withPool(opts.databaseUrl, 'inbox', opts.schema, async (pool) => {
          const { deleted, more } = await cleanupInbox(pool, {
            schema: opts.schema,
            retentionMs: opts.retentionMs,
            batchSize: opts.batchSize,
            maxBatches: opts.maxBatches,
            consumerGroup: opts.group,
          });
          if (opts.json) printJson({ deleted, more });
          else printLines(`deleted ${deleted} inbox rows${more ? ' (more remain; run again)' : ''}`);
        });
      },
    );
  inbox
    .command('progress-reset')
    .description(
      "delete a consumer group's partition progress rows (recordProgress); never needed for correctness, " +
        "a later batch trusts a row only when it holds that row's last record again",
    )
    .addOption(databaseOption())
    .addOption(schemaOption())
    .requiredOption('--group <consumer-group>', 'the consumer group')
    .option('--topic <topic>', "only this topic's rows")
    .option('--json', 'print JSON: { "deleted": n }')
    .action(async (opts: { databaseUrl: string; schema: string; group: string; topic?: string; json?: boolean }) => {
      await withPool(opts.databaseUrl, 'inbox', opts.schema, async (pool) => {
        const deleted = await resetConsumerProgress(pool, {
          schema: opts.schema,
          consumerGroup: opts.group,
          topic: opts.topic,
        });
        if (opts.json) printJson({ deleted });
        else printLines(`deleted ${deleted} progress rows`);
      });
    });
}
