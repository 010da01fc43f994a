import { InvalidArgumentError, Option, type Command } from 'commander';
import { readDeadLetters, replayDeadLetters } from '../../consumer/dead-letter-replay.js';
import type { DeadLetterSummary } from '../../consumer/dead-letter.js';
import {
  addKafkaOptions,
  chosenKafkaClient,
  eventIdList,
  int,
  kafkaClientOption,
  kafkaFromOptions,
} from '../shared.js';
import { printJson, printLines } from '../printable.js';

/** The client `--kafka-client` chose, with the Kafka settings of the flags, environment and file. */
async function cliKafka(opts: Record<string, unknown>) {
  const { client, resolved } = kafkaFromOptions(opts, { clientId: 'outboxkit-cli' });
  return (await chosenKafkaClient(opts, client, resolved)).client;
}

const eventIdHeaderOption = () =>
  new Option('--event-id-header <name>', 'Kafka header that carries the event id')
    .env('OUTBOXKIT_EVENT_ID_HEADER')
    .default('event-id');
const timeoutOption = () =>
  new Option('--timeout-ms <ms>', 'longest wait for the end of the dead-letter topic').argParser(int).default(30_000);

/** Reasons are bounded (1,000 characters) by the consumer; the table shows their start. */
const MAX_LISTED_REASON = 160;

/**
 * The two lines of one dead letter. Every field but the position comes from the record's headers,
 * which anyone who may write to the topic chooses: printLines() escapes their control characters.
 */
function lines(s: DeadLetterSummary): [string, string] {
  const reason = s.reason ?? '-';
  const shown = reason.length > MAX_LISTED_REASON ? `${reason.slice(0, MAX_LISTED_REASON - 1)}…` : reason;
  return [
    `${s.dlq.partition}/${s.dlq.offset}  event=${eventOf(s)}  from=${s.originalTopic ?? '-'}/${s.originalPartition ?? '-'}@${s.originalOffset ?? '-'}` +
      `  attempts=${s.attempts ?? '-'}  failed-at=${s.failedAt ?? '-'}  group=${s.consumerGroup ?? '-'}` +
      `  type=${s.eventType ?? '-'}  key=${s.key === null ? '-' : JSON.stringify(s.key)}  ` +
      `${s.omitted === null ? `${s.valueBytes ?? 0} B` : 'value omitted (too large for this topic)'}`,
    `    ${shown}`,
  ];
}

/** The event id, or what the header held when it is not a usable one. */
function eventOf(s: DeadLetterSummary): string {
  if (s.eventId !== null) return s.eventId;
  return s.invalidEventId === null ? '-' : `invalid:${JSON.stringify(s.invalidEventId)}`;
}

/** `outboxkit dlq list|replay`. */
export function registerDlq(program: Command): void {
  const dlq = program.command('dlq').description("the dedup consumer's dead-letter topics");
  const list = dlq
    .command('list')
    .description('list dead letters (origin, reason, attempts, failed-at, event id; never the payload)')
    .argument('<dlq-topic>', 'the dead-letter topic, for example orders.dlq');
  addKafkaOptions(list)
    .addOption(kafkaClientOption())
    .option('--limit <n>', 'most records, from the beginning of the topic', int, 100)
    .option('--json', 'print JSON')
    .addOption(eventIdHeaderOption())
    .addOption(timeoutOption())
    .action(
      async (topic: string, opts: { limit: number; json?: boolean; eventIdHeader: string; timeoutMs: number }) => {
        if (opts.limit < 1) throw new InvalidArgumentError('--limit must be at least 1.');
        const { records, complete } = await readDeadLetters(await cliKafka(opts), topic, {
          limit: opts.limit,
          eventIdHeader: opts.eventIdHeader,
          timeoutMs: opts.timeoutMs,
        });
        const summaries = records.map((r) => r.summary);
        if (opts.json) return printJson(summaries, 2);
        if (summaries.length === 0) return printLines(`no dead letters in ${topic}`);
        for (const s of summaries) printLines(...lines(s));
        if (!complete) printLines(`(timed out before the end of ${topic}; listed what was read)`);
        else if (summaries.length === opts.limit) printLines(`(first ${opts.limit}; use --limit for more)`);
      },
    );
  const replay = dlq
    .command('replay')
    .description(
      'produce dead letters again to the topic the dead-letter topic belongs to (orders.dlq -> orders; or --to) ' +
        'with their key, value and headers minus dlq-*; the dedup consumer applies each event at most once, ' +
        'however often it is replayed',
    )
    .argument('<dlq-topic>', 'the dead-letter topic');
  addKafkaOptions(replay)
    .addOption(kafkaClientOption())
    .option('--event-id <ids...>', 'event ids (UUIDs) to replay', eventIdList)
    .option('--all', 'every dead letter that has a usable event id')
    .option(
      '--to <topic>',
      'produce to this topic instead of the one the dead-letter topic belongs to (required unless it is named <topic>.dlq)',
    )
    .option('--json', 'print JSON')
    .addOption(eventIdHeaderOption())
    .addOption(timeoutOption())
    .action(
      async (
        topic: string,
        opts: {
          eventId?: string[];
          all?: boolean;
          to?: string;
          json?: boolean;
          eventIdHeader: string;
          timeoutMs: number;
        },
      ) => {
        if (!opts.all && !opts.eventId?.length) throw new InvalidArgumentError('Give --event-id <ids...> or --all.');
        if (opts.all && opts.eventId?.length) throw new InvalidArgumentError('Give --event-id or --all, not both.');
        const result = await replayDeadLetters(await cliKafka(opts), topic, {
          eventIds: opts.eventId,
          all: opts.all,
          to: opts.to,
          eventIdHeader: opts.eventIdHeader,
          timeoutMs: opts.timeoutMs,
        });
        if (opts.json) return printJson(result, 2);
        for (const r of result.replayed) printLines(`replayed ${r.eventId} -> ${r.topic}`);
        for (const s of result.skipped)
          printLines(`skipped ${s.dlqPartition}/${s.dlqOffset} (${s.eventId ?? '-'}): ${s.why}`);
        for (const id of result.notFound) printLines(`not found: ${id}`);
        printLines(`replayed ${result.replayed.length} events`);
        if (result.notFound.length > 0) process.exitCode = 1;
      },
    );
}
