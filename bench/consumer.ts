/**
 * B4 · the dedup consumer's cost (`npm run bench -- consumer`).
 *
 * N events (BENCH_CONSUMER_EVENTS, default 200,000) on a 3-partition topic; every handler writes
 * one row. Per transaction scope (BENCH_CONSUMER_SCOPES, default `message,batch`), three
 * consumers read all of them, each in a fresh consumer group:
 * - baseline: a plain kafkajs `eachBatch` consumer with the same handler transaction without the
 *   inbox row. Scope `message`: BEGIN; INSERT; COMMIT per message (resolveOffset and heartbeat per
 *   message, auto-commit). Scope `batch`: BEGIN; up to 50 INSERTs; COMMIT per run of a fetched
 *   batch, offsets resolved after the COMMIT (the same bound as the dedup consumer's default
 *   `batchMaxMessages`);
 * - dedup: the dedup consumer with the same handler and `transactionScope` (inbox claim in the
 *   same transaction);
 * - duplicates: the dedup consumer of the same group again after its offsets were deleted, so
 *   every event is a duplicate (inbox hit, handler skipped).
 * Both sides use the same partition concurrency (3), pool size and fetch settings. Throughput is
 * timed from the first to the last processed message (group join and fetch start-up excluded).
 * BENCH_CONSUMER_ROUNDS (default 2) repeats the runs, alternating the order of baseline and
 * dedup; the median ratio of the rounds is reported. The headline B4 ratios compare like with
 * like (scope `message` against the per-message baseline); the batch scope is also shown against
 * the per-message baseline, labelled as such. BENCH_CONSUMER_WITHOUT_PROCESSED_IDX=1 drops the
 * inbox's `inbox_processed_idx` first (an experiment: what that btree costs per message).
 * BENCH_CONSUMER_PROGRESS=1 runs the dedup consumer with `recordProgress: true` (partition progress
 * in PostgreSQL written in each applied message's transaction; records it proves handled are
 * skipped, and count as duplicates here). BENCH_CONSUMER_SQL_ONLY=1 runs, instead, the two transactions alone without Kafka (3 workers,
 * 8 interleaved rounds of 2 s): the dedup transaction's SQL (`BEGIN; SET LOCAL lock_timeout;
 * claim` in one round trip, INSERT, COMMIT) against `BEGIN; INSERT; COMMIT`, with and without
 * `inbox_processed_idx`: what the inbox row costs PostgreSQL, apart from the consumer.
 */
import { randomBytes } from 'node:crypto';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { v7 as uuidv7 } from 'uuid';
import { inboxClaimSql, inlineLiterals } from '../consumer/inbox-sql.js';
import {
  B4_CONCURRENCY as CONCURRENCY,
  B4_PARTITIONS as PARTITIONS,
  B4_POOL_SIZE as POOL_SIZE,
  BATCH_MAX_MESSAGES,
  BENCH_EFFECTS_DDL,
  type Scope,
  timeBaselineConsumer,
  timeDedupConsumer,
} from './consumer-support.js';
import { compare, formatComparisons, median } from './lib.js';
import { benchDatabase, produceEvents } from './support.js';

const EVENTS = Number(process.env.BENCH_CONSUMER_EVENTS ?? 200_000);
const ROUNDS = Number(process.env.BENCH_CONSUMER_ROUNDS ?? 2);
const SCOPES = (process.env.BENCH_CONSUMER_SCOPES ?? 'message,batch').split(',') as Scope[];
const PROGRESS = process.env.BENCH_CONSUMER_PROGRESS === '1';

/** BENCH_CONSUMER_SQL_ONLY=1: the handler transaction with and without the inbox row, no Kafka. */
async function runSqlOnly(): Promise<string> {
  const db = await benchDatabase();
  const pool = new pg.Pool({ connectionString: db.url, max: POOL_SIZE });
  try {
    await pool.query(BENCH_EFFECTS_DDL);
    // The same inbox without inbox_processed_idx, for the comparison.
    await pool.query(
      'CREATE SCHEMA noidx; CREATE TABLE noidx.inbox (LIKE outboxkit.inbox INCLUDING DEFAULTS); ' +
        'ALTER TABLE noidx.inbox ADD PRIMARY KEY (consumer_group, event_id)',
    );
    const value = JSON.stringify({ orderId: 'order-1', amount: 1 });
    let offset = 0;
    const inline = inlineLiterals();
    const claims = new Map(
      ['outboxkit', 'noidx'].map((schema) => [
        schema,
        (row: { eventId: string; topic: string; partition: number; offset: string }) =>
          inboxClaimSql({ schemaSql: schema, row: { ...row, groupId: 'bench-group' } }, inline).text,
      ]),
    );
    const transaction = (schema: string | null) => async () => {
      const client = await pool.connect();
      try {
        const id = uuidv7();
        const claim = schema === null ? null : claims.get(schema)!;
        await client.query(
          claim === null
            ? 'BEGIN'
            : `BEGIN; SET LOCAL lock_timeout = '5000ms'; ${claim({ eventId: id, topic: 'bench', partition: 0, offset: String(offset++) })}`,
        );
        await client.query('INSERT INTO bench_effects (event_id, payload) VALUES ($1, $2)', [id, value]);
        await client.query('COMMIT');
      } finally {
        client.release();
      }
    };
    const o = { rounds: 8, roundMs: 2_000, concurrency: CONCURRENCY };
    const plain = 'BEGIN; INSERT; COMMIT';
    return formatComparisons([
      await compare(
        'dedup transaction (inbox with inbox_processed_idx)',
        transaction('outboxkit'),
        plain,
        transaction(null),
        o,
      ),
      await compare(
        'dedup transaction (inbox without inbox_processed_idx)',
        transaction('noidx'),
        plain,
        transaction(null),
        o,
      ),
      await compare('without inbox_processed_idx', transaction('noidx'), 'with it', transaction('outboxkit'), o),
    ]);
  } finally {
    await pool.end();
    await db.drop();
  }
}

export async function run(): Promise<string> {
  if (process.env.BENCH_CONSUMER_SQL_ONLY === '1') return runSqlOnly();
  const db = await benchDatabase();
  const pool = new pg.Pool({ connectionString: db.url, max: POOL_SIZE });
  const kafka = new Kafka({ clientId: 'outboxkit-bench', brokers: db.brokers, logLevel: logLevel.NOTHING });
  const kadmin = kafka.admin();
  await kadmin.connect();
  const topic = `bench-consumer-${randomBytes(4).toString('hex')}`;
  const rows: { round: number; scope: Scope; baseline: number; dedup: number; duplicates: number }[] = [];
  try {
    await pool.query(BENCH_EFFECTS_DDL);
    if (process.env.BENCH_CONSUMER_WITHOUT_PROCESSED_IDX === '1') {
      await pool.query('DROP INDEX outboxkit.inbox_processed_idx');
    }
    await kadmin.createTopics({
      waitForLeaders: true,
      topics: [
        { topic, numPartitions: PARTITIONS, replicationFactor: 1 },
        { topic: `${topic}.dlq`, numPartitions: 1, replicationFactor: 1 },
      ],
    });
    const producedAt = performance.now();
    await produceEvents(kafka, topic, EVENTS, (i) => JSON.stringify({ orderId: `order-${i % 10_000}`, amount: i }));
    const produceSeconds = (performance.now() - producedAt) / 1_000;

    const source = { pool, topic, events: EVENTS };
    const baseline = (scope: Scope) => timeBaselineConsumer(kafka, source, scope);
    const dedup = (groupId: string, expect: 'applied' | 'duplicate', scope: Scope) =>
      timeDedupConsumer(kafka, source, { groupId, expect, scope, recordProgress: PROGRESS });

    for (let round = 1; round <= ROUNDS; round++) {
      for (const scope of SCOPES) {
        await pool.query('TRUNCATE bench_effects');
        await pool.query('TRUNCATE outboxkit.inbox');
        await pool.query('TRUNCATE outboxkit.consumer_progress');
        await pool.query('CHECKPOINT');
        const groupId = `bench-dedup-${randomBytes(4).toString('hex')}`;
        let b: number;
        let d: number;
        // Alternate which side goes first, so neither always runs on a warmer (or more tired) machine.
        if (round % 2 === 1) {
          b = await baseline(scope);
          await pool.query('TRUNCATE bench_effects');
          d = await dedup(groupId, 'applied', scope);
        } else {
          d = await dedup(groupId, 'applied', scope);
          await pool.query('TRUNCATE bench_effects');
          b = await baseline(scope);
        }
        const { rows: count } = await pool.query<{ n: number }>(
          'SELECT count(*)::int AS n FROM outboxkit.inbox WHERE consumer_group = $1',
          [groupId],
        );
        if (count[0]!.n !== EVENTS) throw new Error(`inbox holds ${count[0]!.n} rows, expected ${EVENTS}`);
        // Reset the group's offsets: the same group reads everything again, all duplicates.
        await kadmin.deleteGroups([groupId]);
        const dup = await dedup(groupId, 'duplicate', scope);
        rows.push({ round, scope, baseline: b, dedup: d, duplicates: dup });
        console.error(
          `round ${round} (${scope}): baseline ${b.toFixed(0)}/s, dedup ${d.toFixed(0)}/s, duplicates ${dup.toFixed(0)}/s`,
        );
      }
    }

    const baselineName: Record<Scope, string> = {
      message: 'plain eachBatch, BEGIN; INSERT; COMMIT per message',
      batch: `plain eachBatch, BEGIN; ≤ ${BATCH_MAX_MESSAGES} INSERTs; COMMIT`,
    };
    const lines = [
      `${EVENTS.toLocaleString('en-US')} events, ${PARTITIONS} partitions, ${CONCURRENCY} partitions consumed concurrently, pool of ${POOL_SIZE}; ` +
        `produced in ${produceSeconds.toFixed(1)} s; ${ROUNDS} round(s)` +
        (process.env.BENCH_CONSUMER_WITHOUT_PROCESSED_IDX === '1' ? '; inbox_processed_idx dropped' : '') +
        (PROGRESS ? '; dedup consumer with recordProgress: true.' : '.'),
      '',
      '| measure | baseline | ratio (median) | rounds | candidate msg/s (median) | baseline msg/s (median) | target |',
      '| --- | --- | --- | --- | --- | --- | --- |',
    ];
    const row = (name: string, base: string, cand: number[], bases: number[], target: string) => {
      const ratios = cand.map((x, i) => x / bases[i]!);
      lines.push(
        `| ${name} | ${base} | **${median(ratios).toFixed(3)}** | ${ratios.map((x) => x.toFixed(2)).join(' ')} | ${median(cand).toFixed(0)} | ${median(bases).toFixed(0)} | ${target} |`,
      );
    };
    const of = (scope: Scope) => rows.filter((r) => r.scope === scope);
    for (const scope of SCOPES) {
      const r = of(scope);
      const label = scope === 'message' ? 'B4' : "transactionScope 'batch'";
      row(
        `${label}, new events`,
        baselineName[scope],
        r.map((x) => x.dedup),
        r.map((x) => x.baseline),
        '≥ 0.85',
      );
      row(
        `${label}, all duplicates`,
        baselineName[scope],
        r.map((x) => x.duplicates),
        r.map((x) => x.baseline),
        '≥ 1.0',
      );
    }
    if (SCOPES.includes('message') && SCOPES.includes('batch')) {
      // Rounds pair up: the batch runs of a round against the per-message baseline of the same round.
      const m = of('message');
      const b = of('batch');
      row(
        "transactionScope 'batch', new events (not like with like)",
        baselineName.message,
        b.map((x) => x.dedup),
        m.map((x) => x.baseline),
        '—',
      );
      row(
        "transactionScope 'batch', all duplicates (not like with like)",
        baselineName.message,
        b.map((x) => x.duplicates),
        m.map((x) => x.baseline),
        '—',
      );
    }
    return lines.join('\n');
  } finally {
    await kadmin.deleteTopics({ topics: [topic, `${topic}.dlq`] }).catch(() => {});
    await kadmin.disconnect();
    await pool.end();
    await db.drop();
  }
}
