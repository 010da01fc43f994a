/**
 * Every CLI error is printed exactly once (plain, or one JSON line with --json) with a non-zero
 * exit: commander's own usage errors, and errors thrown inside a command's action (an
 * InvalidArgumentError there never goes through commander's output). Bad event ids, topic names,
 * partition counts and metrics ports are usage errors before anything connects.
 */
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { enqueue, withPgTransaction } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { randomName, topicExists } from '../helpers/kafka.js';
import { finished, jsonError, spawnCli } from '../helpers/processes.js';

const cli = (args: string[], env?: Record<string, string>) => finished(spawnCli(args, env));

function count(text: string, needle: string): number {
  return text.split(needle).length - 1;
}

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase({ poolSize: 2 });
});
afterAll(async () => {
  await db?.drop();
});

describe('errors thrown inside a command are printed once', () => {
  it.each([
    [['parked', 'retry'], 'outboxkit: Give event ids or --all.\n'],
    [['dlq', 'replay', 'some.dlq'], 'outboxkit: Give --event-id <ids...> or --all.\n'],
    [['dlq', 'list', 'some.dlq', '--limit', '0'], 'outboxkit: --limit must be at least 1.\n'],
  ])('%j: the message alone on stderr, exit 1', async (args, expected) => {
    const r = await cli(args);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe(expected);
  });

  it('with --json: one JSON line', async () => {
    const r = await cli(['dlq', 'replay', 'some.dlq', '--json']);
    expect(r.code).toBe(1);
    expect(jsonError(r)).toEqual({ code: 'commander.invalidArgument', message: 'Give --event-id <ids...> or --all.' });
  });

  it('PostgreSQL unreachable: the socket error with a hint, once, exit 1 (the relay and an operator command)', async () => {
    const url = 'postgres://nobody@127.0.0.1:1/none';
    for (const args of [
      ['status', '--database-url', url],
      ['relay', '--database-url', url, '--metrics-port', '-1', '--log-level', 'error'],
    ]) {
      const r = await cli(args);
      expect(r.code).toBe(1);
      expect(r.stderr).toBe(
        'outboxkit: connect ECONNREFUSED 127.0.0.1:1 (PostgreSQL cannot be reached: check --database-url / DATABASE_URL, and that the server runs)\n',
      );
    }
    expect(jsonError(await cli(['status', '--database-url', url, '--json'])).code).toBe('ECONNREFUSED');
  });

  it('a database that does not exist: its SQLSTATE and where to look, once, exit 1', async () => {
    const url = new URL(db.url);
    url.pathname = '/outboxkit_no_such_database';
    const r = await cli(['status', '--database-url', url.toString()]);
    expect(r.code).toBe(1);
    expect(r.stderr).toBe(
      'outboxkit: database "outboxkit_no_such_database" does not exist (check --database-url / DATABASE_URL)\n',
    );
    expect(jsonError(await cli(['status', '--database-url', url.toString(), '--json'])).code).toBe('3D000');
  });

  it('relay: a metrics port already taken (another relay on the host) says so, before any lane is taken, exit 1', async () => {
    const { createServer } = await import('node:net');
    const taken = createServer();
    await new Promise<void>((resolve) => taken.listen(0, '0.0.0.0', resolve));
    const port = (taken.address() as { port: number }).port;
    try {
      const r = await cli(['relay', '--database-url', db.url, '--metrics-port', String(port), '--log-level', 'error']);
      expect(r.code).toBe(1);
      expect(r.stderr).toContain('EADDRINUSE');
      expect(r.stderr).toContain('give each instance its own --metrics-port');
      expect(count(r.stderr, 'EADDRINUSE')).toBe(1);
      const { rows } = await db.pool.query(
        'SELECT count(*)::int AS n FROM outboxkit.relay_lanes WHERE owner_id IS NOT NULL',
      );
      expect(rows[0]!.n).toBe(0);
    } finally {
      await new Promise((resolve) => taken.close(resolve));
    }
  });

  it('--version prints the package version, exit 0', async () => {
    const { version } = JSON.parse(readFileSync('package.json', 'utf8')) as { version: string };
    const r = await cli(['--version']);
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(`${version}\n`);
  });

  it("commander's own usage error stays printed once, with the one-line usage and not the whole help", async () => {
    const r = await cli(['status', '--bogus']);
    expect(r.code).toBe(1);
    expect(count(r.stderr, "unknown option '--bogus'")).toBe(1);
    expect(count(r.stderr, 'Usage: outboxkit status')).toBe(1);
    // The whole help (the relay's is 60 lines) would push the error out of sight.
    expect(r.stderr).not.toContain('Options:');
    expect(r.stderr).toContain("Run 'outboxkit status --help' for the options.");
    const nested = await cli(['parked', 'list', '--bogus']);
    expect(nested.stderr).toContain("Run 'outboxkit parked list --help' for the options.");
    expect(jsonError(await cli(['status', '--bogus', '--json'])).code).toBe('commander.unknownOption');
  });
});

describe('arguments checked before anything connects', () => {
  it('parked retry/skip: an id that is not a UUID is a usage error, not a PostgreSQL one', async () => {
    for (const command of ['retry', 'skip']) {
      const r = await cli(['parked', command, 'not-a-uuid', '--database-url', db.url]);
      expect(r.code).toBe(1);
      expect(r.stderr).toMatch(/'not-a-uuid' is invalid for argument 'event-ids'\. Not an event id/);
      expect(r.stderr).not.toMatch(/invalid input syntax/);
    }
  });

  it('parked retry: valid ids are all passed on (and ids with --all are refused)', async () => {
    const events = await withPgTransaction(db.pool, async (c) => [
      ...(await enqueue(c, { topic: 'cli-parked', key: 'a', type: 't', payload: 1 })),
      ...(await enqueue(c, { topic: 'cli-parked', key: 'b', type: 't', payload: 2 })),
      ...(await enqueue(c, { topic: 'cli-parked', key: 'c', type: 't', payload: 3 })),
    ]);
    await db.pool.query('UPDATE outboxkit.outbox_events SET parked_at = now(), attempts = 5');
    const [a, b] = events.map((e) => e.eventId);
    const both = await cli(['parked', 'retry', a!, '--all', '--database-url', db.url]);
    expect(both.code).toBe(1);
    expect(both.stderr).toBe('outboxkit: Give event ids or --all, not both.\n');
    const r = await cli(['parked', 'retry', a!, b!, '--database-url', db.url]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe('requeued 2 events\n');
    const { rows } = await db.pool.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE parked_at IS NOT NULL',
    );
    expect(rows[0]!.n).toBe(1);
    // An id that is no longer (or never was) a parked event: the others are handled, exit 1.
    const again = await cli(['parked', 'skip', a!, events[2]!.eventId, '--database-url', db.url]);
    expect(again.code).toBe(1);
    expect(again.stdout).toBe('skipped 1 events\n');
    expect(again.stderr).toBe('outboxkit: 1 of 2 ids are not parked events (unknown, or already handled)\n');
  });

  it('topics ensure: an illegal topic name is refused and nothing is created', async () => {
    const good = randomName('cli-args');
    const r = await cli(['topics', 'ensure', good, 'bad name', '--json']);
    expect(r.code).toBe(1);
    const error = jsonError(r);
    expect(error.code).toBe('commander.invalidArgument');
    expect(error.message).toMatch(/'bad name' is invalid for argument 'topics'\. Not a legal Kafka topic name/);
    for (const name of ['.', '..', 'x'.repeat(250), 'a/b']) {
      expect(jsonError(await cli(['topics', 'ensure', name, '--json'])).code, name).toBe('commander.invalidArgument');
    }
    expect(await topicExists(good)).toBe(false);
  });

  it('topics ensure: --partitions below 1 is refused; legal names are all created', async () => {
    const t1 = randomName('cli-args');
    const t2 = randomName('cli-args');
    for (const n of ['0', '-3']) {
      const error = jsonError(await cli(['topics', 'ensure', t1, '--partitions', n, '--json']));
      expect(error.code).toBe('commander.invalidArgument');
      expect(error.message).toBe(
        `option '--partitions <n>' argument '${n}' is invalid. Must be an integer of 1 or more.`,
      );
    }
    expect(await topicExists(t1)).toBe(false);
    const ok = await cli(['topics', 'ensure', t1, t2, '--partitions', '1']);
    expect(ok.code, ok.stderr).toBe(0);
    expect(ok.stdout).toBe(`created: ${t1}, ${t2}\n`);
    // The test broker is one node: every topic has one replica, which makes acks=all weak.
    const weak = (t: string) =>
      `outboxkit: warning: ${t} has replication factor 1: an acknowledged event lives on one broker, and its partitions stop while that broker is down.\n`;
    expect(ok.stderr).toBe(weak(t1) + weak(t2));
    // Existing topics are left as they are; a partition count other than the one asked is said.
    const again = await cli(['topics', 'ensure', t1, '--partitions', '3']);
    expect(again.code).toBe(0);
    expect(again.stdout).toBe('all topics exist\n');
    expect(again.stderr).toBe(
      `outboxkit: ${t1} exists with 1 partitions, not 3: left as it is (--partitions applies to new topics only).\n` +
        weak(t1),
    );
    const json = await cli(['topics', 'ensure', t1, t2, '--partitions', '1', '--json']);
    const replicated = { replicationFactor: 1, minInsyncReplicas: 1 };
    expect(JSON.parse(json.stdout)).toEqual({
      created: [],
      existing: [t1, t2],
      partitions: { [t1]: 1, [t2]: 1 },
      replication: { [t1]: replicated, [t2]: replicated },
    });
    expect(json.stderr).toBe(weak(t1) + weak(t2));
  });

  it('topics ensure: --replication-factor above the brokers is refused by Kafka and nothing is created', async () => {
    const t = randomName('cli-args');
    const r = await cli(['topics', 'ensure', t, '--replication-factor', '3', '--json', '--kafka-retries', '0']);
    expect(r.code).toBe(1);
    expect(JSON.stringify(jsonError(r))).toMatch(/replication.factor/i);
    expect(await topicExists(t)).toBe(false);
  });

  it('relay: --metrics-port outside -1..65535 is refused before the relay starts (flag and env)', async () => {
    const flag = await cli(['relay', '--database-url', db.url, '--metrics-port', '99999']);
    expect(flag.code).toBe(1);
    expect(flag.stdout).toBe(''); // the relay logs its Kafka settings on stdout once it starts
    expect(count(flag.stderr, "option '--metrics-port <port>' argument '99999' is invalid")).toBe(1);
    expect(flag.stderr).toMatch(/Must be a port from 1 to 65535, 0 for a random port, or -1 for none\./);
    const env = await cli(['relay', '--database-url', db.url], { OUTBOXKIT_METRICS_PORT: '-2' });
    expect(env.code).toBe(1);
    expect(env.stdout).toBe('');
    expect(count(env.stderr, "value '-2' from env 'OUTBOXKIT_METRICS_PORT' is invalid")).toBe(1);
  });

  it.each([
    [['--batch-size', '0'], 'outboxkit: OUTBOXKIT_INVALID_OPTIONS: --batch-size must be an integer ≥ 1, got 0.\n'],
    [['--lease-ms', '10'], 'outboxkit: OUTBOXKIT_INVALID_OPTIONS: --lease-ms must be an integer ≥ 1000, got 10.\n'],
    [
      ['--poll-interval-ms', '1'],
      'outboxkit: OUTBOXKIT_INVALID_OPTIONS: --poll-interval-ms must be an integer ≥ 10, got 1.\n',
    ],
  ])('relay %j: refused by its flag name before anything is logged or connected', async (args, expected) => {
    const r = await cli(['relay', '--database-url', db.url, ...args]);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe(''); // no 'Kafka connection settings' line: nothing started
    expect(r.stderr).toBe(expected);
  });

  it('relay: a broker timeout not below the lease is refused naming both flags (flag, env and default)', async () => {
    const refusal = (timeout: number, lease: number) =>
      `outboxkit: OUTBOXKIT_INVALID_OPTIONS: --broker-timeout-ms must be below --lease-ms, got ${timeout} and ${lease}: ` +
      'a send waits up to --broker-timeout-ms and the relay stands down only after --lease-ms of failing, so a hung ' +
      'broker would keep it holding its lanes past their lease. Lower --broker-timeout-ms or raise --lease-ms ' +
      '(defaults 5000 and 10000).\n';
    for (const [args, env, expected] of [
      [['--lease-ms', '2000', '--broker-timeout-ms', '2000'], {}, refusal(2_000, 2_000)],
      [['--lease-ms', '2000'], { OUTBOXKIT_BROKER_TIMEOUT_MS: '3000' }, refusal(3_000, 2_000)],
      [['--lease-ms', '3000'], {}, refusal(5_000, 3_000)], // the default timeout
    ] as const) {
      const r = await cli(['relay', '--database-url', db.url, ...args], env);
      expect(r.code).toBe(1);
      expect(r.stdout).toBe(''); // nothing started
      expect(r.stderr).toBe(expected);
    }
  });
});

describe('option values checked before anything connects', () => {
  const EXPECTED_URL = 'Expected a PostgreSQL URL such as postgres://user@host:5432/db.';

  it('parked list: --limit below 1 is a usage error, not a PostgreSQL one', async () => {
    for (const n of ['-1', '0']) {
      const error = jsonError(await cli(['parked', 'list', '--limit', n, '--database-url', db.url, '--json']));
      expect(error).toEqual({
        code: 'commander.invalidArgument',
        message: `option '--limit <n>' argument '${n}' is invalid. Must be an integer of 1 or more.`,
      });
    }
    const r = await cli(['parked', 'list', '--limit', '-1', '--database-url', db.url]);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    expect(count(r.stderr, "option '--limit <n>' argument '-1' is invalid. Must be an integer of 1 or more.")).toBe(1);
    expect(count(r.stderr, 'Usage: outboxkit parked list')).toBe(1);
    const ok = await cli(['parked', 'list', '--limit', '1', '--database-url', db.url, '--json']);
    expect(ok.code, ok.stderr).toBe(0);
  });

  it('dlq replay: an --event-id that is not a UUID is a usage error (also after a valid one)', async () => {
    const valid = '01900000-0000-7000-8000-0000000000aa';
    for (const ids of [['nope'], [valid, 'nope']]) {
      // An unreachable broker: only a check before connecting answers at once with a usage error.
      const r = await cli(['dlq', 'replay', 'some.dlq', '--brokers', '127.0.0.1:1', '--event-id', ...ids, '--json']);
      expect(r.code).toBe(1);
      expect(r.stdout).toBe('');
      const error = jsonError(r);
      expect(error.code).toBe('commander.invalidArgument');
      expect(error.message).toMatch(/^option '--event-id <ids\.\.\.>' argument 'nope' is invalid\. Not an event id/);
    }
  });

  it('relay: --log-level accepts only pino levels (flag and env)', async () => {
    const flag = await cli(['relay', '--database-url', db.url, '--log-level', 'verbose']);
    expect(flag.code).toBe(1);
    expect(flag.stdout).toBe(''); // the relay logs its Kafka settings on stdout once it starts
    expect(
      count(
        flag.stderr,
        "option '--log-level <level>' argument 'verbose' is invalid. Allowed choices are fatal, error, warn, info, debug, trace, silent.",
      ),
    ).toBe(1);
    expect(flag.stderr).not.toMatch(/custom levels/);
    const env = await cli(['relay', '--database-url', db.url, '--json'], { OUTBOXKIT_LOG_LEVEL: 'verbose' });
    expect(env.code).toBe(1);
    expect(env.stdout).toBe('');
    expect(jsonError(env)).toEqual({
      code: 'commander.invalidArgument',
      message:
        "option '--log-level <level>' value 'verbose' from env 'OUTBOXKIT_LOG_LEVEL' is invalid. Allowed choices are fatal, error, warn, info, debug, trace, silent.",
    });
  });

  it('--database-url / DATABASE_URL: not a PostgreSQL URL is a usage error (flag and env)', async () => {
    for (const url of ['notaurl', 'mysql://127.0.0.1/db', 'postgres://127.0.0.1:99999/db', 'postgres:/db']) {
      const r = await cli(['status', '--database-url', url]);
      expect(r.code, url).toBe(1);
      expect(r.stdout).toBe('');
      expect(count(r.stderr, `option '--database-url <url>' argument '${url}' is invalid. ${EXPECTED_URL}`)).toBe(1);
      expect(r.stderr).not.toMatch(/ENOTFOUND|Invalid URL/);
    }
    const relay = await cli(['relay', '--database-url', 'notaurl']);
    expect(relay.code).toBe(1);
    expect(relay.stdout).toBe(''); // the relay did not start
    expect(count(relay.stderr, `argument 'notaurl' is invalid. ${EXPECTED_URL}`)).toBe(1);
    const env = await cli(['status', '--json'], { DATABASE_URL: 'notaurl' });
    expect(env.code).toBe(1);
    expect(jsonError(env)).toEqual({
      code: 'commander.invalidArgument',
      message: `option '--database-url <url>' value 'notaurl' from env 'DATABASE_URL' is invalid. ${EXPECTED_URL}`,
    });
  });

  it('--database-url / DATABASE_URL: a bad URL that may hold a password is refused without showing it', async () => {
    const url = 'postgres://app:s3cret-pw@127.0.0.1:99999/db';
    const flag = await cli(['status', '--database-url', url]);
    expect(flag.code).toBe(1);
    expect(flag.stdout).toBe('');
    expect(flag.stderr).toBe(
      `outboxkit: OUTBOXKIT_INVALID_OPTIONS: option '--database-url <url>' argument is invalid (not shown: it may hold a password). ${EXPECTED_URL}\n`,
    );
    const env = await cli(['relay', '--json'], { DATABASE_URL: url });
    expect(env.code).toBe(1);
    expect(env.stdout).toBe('');
    expect(env.stderr).not.toMatch(/s3cret/);
    expect(jsonError(env)).toEqual({
      code: 'OUTBOXKIT_INVALID_OPTIONS',
      message: `value from env 'DATABASE_URL' is invalid (not shown: it may hold a password). ${EXPECTED_URL}`,
      field: 'DATABASE_URL',
    });
  });

  it('--database-url / DATABASE_URL: valid forms still connect (URL, Unix socket directory, the default)', async () => {
    expect((await cli(['status', '--database-url', db.url, '--json'])).code).toBe(0);
    expect((await cli(['status', '--json'], { DATABASE_URL: db.url.replace(/^postgres:/, 'postgresql:') })).code).toBe(
      0,
    );
    // A socket directory (pg's `/dir [database]` and `?host=/dir` forms) passes the check; the
    // connection then fails because no server listens there.
    for (const url of ['/nonexistent-outboxkit-socket', 'postgres://nobody@/none?host=/nonexistent-outboxkit-socket']) {
      const error = jsonError(await cli(['status', '--database-url', url, '--json']));
      expect(error, url).toEqual({
        code: 'ENOENT',
        message: 'connect ENOENT /nonexistent-outboxkit-socket/.s.PGSQL.5432',
      });
    }
    // No flag: DATABASE_URL if set, else the default URL (never parsed by commander) passes.
    const r = await cli(['status']);
    expect(r.stderr).not.toMatch(/database-url|DATABASE_URL/);
  });
});

describe('--json on the commands that change something: one JSON object on stdout, nothing else', () => {
  const json = async (args: string[]) => {
    const r = await cli([...args, '--database-url', db.url, '--json']);
    expect(r.stderr, r.stderr).toBe('');
    const lines = r.stdout.split('\n').filter((l) => l !== '');
    expect(lines, r.stdout).toHaveLength(1);
    return { code: r.code, value: JSON.parse(lines[0]!) as Record<string, unknown> };
  };

  it('migrate, lanes release, keys cleanup, inbox cleanup', async () => {
    expect(await json(['migrate'])).toEqual({ code: 0, value: { applied: [] } });
    // Nothing released: exit 1 (a mistyped id), as `parked skip` of an id that is not parked.
    expect(await json(['lanes', 'release', 'no-such-relay'])).toEqual({
      code: 1,
      value: { relayId: 'no-such-relay', released: 0 },
    });
    expect(await json(['keys', 'cleanup'])).toEqual({ code: 0, value: { deleted: 0 } });
    expect(await json(['inbox', 'cleanup'])).toEqual({ code: 0, value: { deleted: 0, more: false } });
  });

  it("inbox progress-reset deletes one group's rows (one topic, or all), and needs --group", async () => {
    await db.pool.query(
      `INSERT INTO outboxkit.consumer_progress (consumer_group, topic, partition, range_start, last_offset, last_event_id, last_timestamp)
       VALUES ('g1', 'a', 0, 0, 5, '01900000-0000-7000-8000-0000000000aa', 1),
              ('g1', 'a', 1, 0, 5, '01900000-0000-7000-8000-0000000000ab', 1),
              ('g1', 'b', 0, 0, 5, '01900000-0000-7000-8000-0000000000ac', 1),
              ('g2', 'a', 0, 0, 5, '01900000-0000-7000-8000-0000000000ad', 1)`,
    );
    expect(await json(['inbox', 'progress-reset', '--group', 'g1', '--topic', 'a'])).toEqual({
      code: 0,
      value: { deleted: 2 },
    });
    expect(await json(['inbox', 'progress-reset', '--group', 'g1'])).toEqual({ code: 0, value: { deleted: 1 } });
    const { rows } = await db.pool.query('SELECT consumer_group FROM outboxkit.consumer_progress');
    expect(rows).toEqual([{ consumer_group: 'g2' }]);
    const r = await cli(['inbox', 'progress-reset', '--database-url', db.url]);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/--group/);
  });

  it('parked retry/skip: counts, and ids that are not parked events in the JSON (exit 1)', async () => {
    const [event] = await withPgTransaction(db.pool, (c) =>
      enqueue(c, { topic: randomName('json'), key: 'k', type: 't', payload: 1 }),
    );
    await db.pool.query(
      `UPDATE outboxkit.outbox_events SET parked_at = now(), attempts = 5, last_error = 'test' WHERE event_id = $1`,
      [event!.eventId],
    );
    const unknown = '01900000-0000-7000-8000-0000000000aa';
    expect(await json(['parked', 'retry', event!.eventId, unknown])).toEqual({
      code: 1,
      value: { requeued: 1, notParked: 1 },
    });
    await db.pool.query(`UPDATE outboxkit.outbox_events SET parked_at = now() WHERE event_id = $1`, [event!.eventId]);
    expect(await json(['parked', 'skip', event!.eventId])).toEqual({ code: 0, value: { skipped: 1, notParked: 0 } });
  });
});
