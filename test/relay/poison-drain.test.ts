/**
 * Issue 16, point 2 (G7): isolating a poison event costs sends per suspect event, not one send per
 * row. After a broker error (here MESSAGE_TOO_LARGE: a record above the topic's
 * `max.message.bytes`), a backlog drains at ≥ 0.8 of the rate at which the same relay drains a
 * backlog with no fault, in the same run, from 2 s after the error.
 *
 * One relay, one topic, backlogs of the same size, each committed at once, one after another: no
 * fault, then three times a poison event (a key of its own) at the head and no fault. A drain's rate is the rows marked published
 * from 2 s after its start (the backlog's commit; for the poisoned one, the relay's failed pass)
 * until its last row, per second; each poisoned drain is compared with the mean of the two around
 * it (the machine's load drifts over a run), and the median ratio is asserted. Rates, not times: both sides slow down alike on a loaded
 * machine.
 *
 * The batch size is 5,000 rows (4 MB): a relay that resent the failed pass's rows one at a time (the
 * old isolation: one send and one marking per row, about 2 ms each on a local broker) would still be
 * at it for seconds after the 2 s grace. With 2,000 rows such a relay measured 0.72, too close to
 * the bound.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { laneOf } from '../../src/outbox/event.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopics } from '../helpers/kafka.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db.drop();
});

/**
 * Rows per backlog: enough that a drain lasts well past the 2 s grace. With 60,000 the relay on
 * @platformatic/kafka drained a backlog without a fault in 2.5-3.2 s on a quiet machine, leaving
 * 15,000-20,000 rows in the window (kafkajs: 3.7-6.4 s), so a drain failed the window check below.
 */
const ROWS = 100_000;
/**
 * Poisoned drains, each between two without a fault (odd: the median is one of them). Three, with
 * the file alone on the machine (vitest project `alone`): the ratios of a run on its own spread
 * 0.93-1.14 (five rounds, 2026-12-07), well above the bound; each round is two drains of 100,000
 * rows, about 20 s of CI's time.
 */
const ROUNDS = 3;
/** The window of a drain starts this long after its start (the issue's 2 s). */
const GRACE_MS = 2_000;

describe('G7 a poison event after which a backlog drains', () => {
  it('drains at ≥ 0.8 of the no-fault rate from 2 s after the broker error (one send per suspect event)', async () => {
    const [topic] = await createTopics(['poison-drain'], {
      partitions: 1,
      configEntries: [{ name: 'max.message.bytes', value: '200000' }],
    });
    const keys = Array.from({ length: 100 }, (_, i) => `k${i}`);
    const relay = await startRelay(db.url, { batchSize: 5_000, maxBatchBytes: 4_000_000, maxAttempts: 1 });
    /** Rows marked published, with when (ms, performance.now()). */
    const marks: { at: number; rows: number }[] = [];
    const errors: number[] = [];
    relay.on('relay:marked', ({ rows }) => marks.push({ at: performance.now(), rows }));
    relay.on('relay:error', () => errors.push(performance.now()));
    await waitFor(async () => {
      // Every lane held: the whole backlog is the relay's from its first pass.
      const { rows } = await db.pool.query<{ all: number; held: number }>(
        'SELECT count(*)::int AS all, count(owner_id)::int AS held FROM outboxkit.relay_lanes',
      );
      return rows[0]!.all > 0 && rows[0]!.held === rows[0]!.all;
    });

    /** Commits a backlog (the poison first when asked) and returns its drain's rate in rows/s. */
    const drain = async (phase: string, poison: boolean, count = ROWS) => {
      const client = await db.pool.connect();
      try {
        await client.query('BEGIN');
        if (poison) {
          await client.query(
            `INSERT INTO outboxkit.outbox_events (event_id, topic, key, lane, type, payload)
               VALUES (gen_random_uuid(), $1, $2, $3, 'poison', convert_to(rpad('p', 300000, 'p'), 'UTF8'))`,
            [topic, phase, laneOf(phase)],
          );
        }
        await client.query(
          `INSERT INTO outboxkit.outbox_events (event_id, topic, key, lane, type, payload)
             SELECT gen_random_uuid(), $1, k.key, k.lane, $5, convert_to(rpad('x', 200, 'x'), 'UTF8')
               FROM generate_series(1, $4::int) i
               JOIN unnest($2::text[], $3::smallint[]) WITH ORDINALITY AS k(key, lane, n) ON k.n = (i % 100) + 1`,
          [topic, keys, keys.map(laneOf), count, phase],
        );
        await client.query('COMMIT');
      } finally {
        client.release();
      }
      const committed = performance.now();
      const from = marks.length;
      await waitFor(async () => marks.slice(from).reduce((n, m) => n + m.rows, 0) >= count, {
        timeoutMs: 120_000,
      });
      const own = marks.slice(from);
      const end = own[own.length - 1]!.at;
      const fault = errors.find((t) => t >= committed);
      if (poison) expect(fault, 'the poison failed a pass').toBeDefined();
      const start = (fault ?? committed) + GRACE_MS;
      // Rows are marked a batch at a time: the rate runs from the first marking in the window to the
      // last, over the rows marked after the first (those were sent before it).
      const window = own.filter((m) => m.at > start);
      const inWindow = window.reduce((n, m) => n + m.rows, 0);
      const rate = window.length < 2 ? 0 : (inWindow - window[0]!.rows) / ((end - window[0]!.at) / 1000);
      console.log(
        `[poison-drain] ${phase}: ${count} rows drained in ${((end - committed) / 1000).toFixed(2)} s` +
          `${fault === undefined ? '' : ` (error ${((fault - committed) / 1000).toFixed(2)} s after the commit)`}; ` +
          `${inWindow} rows in the window from ${GRACE_MS / 1000} s after ${poison ? 'the error' : 'the commit'}: ${Math.round(rate)} rows/s`,
      );
      // The window must hold a good part of the backlog, or the rate says little.
      if (phase !== 'warm-up') expect(inWindow, `${phase}: rows in the measured window`).toBeGreaterThan(count / 4);
      return rate;
    };

    await drain('warm-up', false, 10_000); // the relay's and the database's first rows (JIT, caches)
    // Three poisoned drains, each between two drains without a fault; each is compared with the
    // mean of its neighbours, and the median of the three ratios is asserted: the machine's load
    // (other work on two cores) moves one drain's rate by up to a third either way.
    const ratios: number[] = [];
    let before = await drain('normal-0', false);
    for (let round = 1; round <= ROUNDS; round++) {
      const afterError = await drain(`poisoned-${round}`, true);
      const after = await drain(`normal-${round}`, false);
      const ratio = afterError / ((before + after) / 2);
      console.log(`[poison-drain] round ${round}: drain rate after the error / normal: ${ratio.toFixed(2)}`);
      ratios.push(ratio);
      before = after;
    }
    const median = [...ratios].sort((a, b) => a - b)[(ROUNDS - 1) / 2]!;
    console.log(`[poison-drain] median: ${median.toFixed(2)} (${ratios.map((r) => r.toFixed(2)).join(', ')})`);
    // The poison was isolated (parked at its first attempt), nothing else was.
    const { rows: parked } = await db.pool.query<{ type: string; last_error: string }>(
      'SELECT type, last_error FROM outboxkit.outbox_events WHERE parked_at IS NOT NULL',
    );
    expect(parked.map((r) => r.type)).toEqual(Array.from({ length: ROUNDS }, () => 'poison'));
    for (const r of parked) expect(r.last_error).toMatch(/MESSAGE_TOO_LARGE/);
    expect(median).toBeGreaterThanOrEqual(0.8);
  }, 300_000);
});
