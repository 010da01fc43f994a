/**
 * `outboxkit relay --source wal` and `outboxkit migrate --wal-publication` as child processes,
 * against the PostgreSQL at wal_level=logical (test/helpers/wal.ts) and the real broker:
 * migrate creates the publication; the relay creates its slot (`<schema>_relay` by default) and
 * publishes the event written before it (the resync), then what the WAL writer commits, in commit
 * order; reports readiness by its own replication
 * connection, drains on SIGTERM with exit 0; a second relay waits while the first holds the slot
 * and takes over after it. Flags of the other source, and bad slot or publication names, are
 * refused before anything connects.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox } from '../../src/outbox/enqueue.js';
import { withPgTransaction } from '../../src/database.js';
import type { TestDatabase } from '../helpers/db.js';
import { createTopics, readTopic } from '../helpers/kafka.js';
import { finished, spawnCli, type Spawned } from '../helpers/processes.js';
import { waitFor } from '../helpers/wait-for.js';
import { confirmedFlush, createWalTestDatabase, currentWalLsn, waitForSlotInactive } from '../helpers/wal.js';

/** A schema of its own: the default slot name (`<schema>_relay`) is unique in the cluster. */
const SCHEMA = `w_${randomBytes(4).toString('hex')}`;
const UNREACHABLE = 'postgres://127.0.0.1:1/none';

let db: TestDatabase;
beforeAll(async () => {
  db = await createWalTestDatabase({ poolSize: 3 });
}, 30_000);
afterAll(async () => {
  await db?.drop();
});

const cli = (args: string[], env?: Record<string, string>) => finished(spawnCli(args, env));

/** The state letter of process `pid` in /proc (`T`: stopped by a signal). */
function processState(pid: number): string | undefined {
  try {
    return /^\d+ \(.*\) (\S)/.exec(readFileSync(`/proc/${pid}/stat`, 'utf8'))?.[1];
  } catch {
    return undefined;
  }
}

/** `outboxkit relay --source wal` on the test database, with its metrics on a random port. */
function spawnWalRelay(extra: string[] = [], env: Record<string, string> = {}): Spawned {
  return spawnCli(
    [
      'relay',
      '--source',
      'wal',
      '--database-url',
      db.url,
      '--schema',
      SCHEMA,
      '--broker-timeout-ms',
      '3000',
      '--wal-status-interval-ms',
      '1000',
      '--metrics-port',
      '0',
      '--log-level',
      'info',
      ...extra,
    ],
    env,
  );
}

/** The first log line of `relay` holding `text`, parsed. */
async function logLine(relay: Spawned, text: string, timeoutMs = 20_000): Promise<Record<string, unknown>> {
  const line = await waitFor(
    () =>
      relay.stdout
        .join('')
        .split('\n')
        .find((l) => l.includes(text)),
    { timeoutMs, message: () => `log line "${text}" (${relay.output.join('').slice(-3000)})` },
  );
  return JSON.parse(line) as Record<string, unknown>;
}

async function readyz(port: number): Promise<{ status: number; body: string }> {
  const res = await fetch(`http://127.0.0.1:${port}/readyz`);
  return { status: res.status, body: await res.text() };
}

/** Waits until `/readyz` answers `status`; returns its body. */
async function readyzBecomes(port: number, status: number): Promise<string> {
  return waitFor(
    async () => {
      const r = await readyz(port);
      return r.status === status ? r.body : undefined;
    },
    { timeoutMs: 15_000, message: `/readyz on port ${port} answers ${status}` },
  );
}

const outbox = createOutbox({ source: 'wal', schema: SCHEMA });

describe('outboxkit migrate --wal-publication', () => {
  it('creates the default publication, then a named one, and reports them', async () => {
    const first = await cli(['migrate', '--database-url', db.url, '--schema', SCHEMA, '--wal-publication', '--json']);
    expect(first.code, first.stderr).toBe(0);
    const out = JSON.parse(first.stdout) as { applied: string[]; walPublication: unknown };
    expect(out.applied.length).toBeGreaterThan(0);
    expect(out.walPublication).toEqual({ name: `${SCHEMA}_outbox_events`, created: true });

    const second = await cli([
      'migrate',
      '--database-url',
      db.url,
      '--schema',
      SCHEMA,
      '--wal-publication',
      'named_pub',
      '--json',
    ]);
    expect(second.code, second.stderr).toBe(0);
    expect(JSON.parse(second.stdout)).toEqual({ applied: [], walPublication: { name: 'named_pub', created: true } });

    const { rows } = await db.pool.query<{ pubname: string; tables: string[]; pubinsert: boolean; pubdelete: boolean }>(
      `SELECT p.pubname, p.pubinsert, p.pubdelete,
              array_agg(t.schemaname || '.' || t.tablename) AS tables
         FROM pg_publication p JOIN pg_publication_tables t USING (pubname)
        GROUP BY 1, 2, 3 ORDER BY 1`,
    );
    expect(rows).toEqual([
      { pubname: 'named_pub', pubinsert: true, pubdelete: false, tables: [`${SCHEMA}.outbox_events`] },
      { pubname: `${SCHEMA}_outbox_events`, pubinsert: true, pubdelete: false, tables: [`${SCHEMA}.outbox_events`] },
    ]);
  });
});

describe('outboxkit migrate --wal-publication, its log line', () => {
  // Breach caught: a log line with a key twice (pino's logger `name` and the result's `name`),
  // which JSON.parse reads as the last one and other log readers refuse or read otherwise.
  it('names the publication under `publication`, every key once', async () => {
    const r = await cli(['migrate', '--database-url', db.url, '--schema', SCHEMA, '--wal-publication']);
    expect(r.code, r.stderr).toBe(0);
    const line = r.stdout.split('\n').find((l) => l.includes('WAL publication'));
    expect(line, r.stdout).toBeDefined();
    // pino writes one flat object; its keys are the `"key":` after `{` or `,` (no value here has those).
    const keys = [...line!.matchAll(/[{,]"([^"]+)":/g)].map((m) => m[1]);
    expect(keys.length).toBeGreaterThan(0);
    expect(
      keys.filter((k, i) => keys.indexOf(k) !== i),
      line,
    ).toEqual([]);
    expect(JSON.parse(line!)).toMatchObject({
      name: 'outboxkit',
      publication: `${SCHEMA}_outbox_events`,
      created: false,
      msg: 'outboxkit WAL publication exists already (kept as it is)',
    });
  });

  // Breach caught: the publication reported twice, by migrate() and again by the CLI (a user trial
  // saw "outboxkit WAL publication created" followed by "WAL publication created").
  it('reports the publication in one line: created, then kept as it is', async () => {
    const schema = `w_${randomBytes(4).toString('hex')}`;
    // The first run creates it, the second keeps it.
    for (const [created, msg] of [
      [true, 'outboxkit WAL publication created'],
      [false, 'outboxkit WAL publication exists already (kept as it is)'],
    ] as const) {
      const r = await cli(['migrate', '--database-url', db.url, '--schema', schema, '--wal-publication']);
      expect(r.code, r.stderr).toBe(0);
      const lines = r.stdout.split('\n').filter((l) => l.includes('publication'));
      expect(lines.map((l) => JSON.parse(l) as unknown)).toEqual([
        expect.objectContaining({ publication: `${schema}_outbox_events`, created, msg }),
      ]);
    }
  });
});

describe('outboxkit relay --source wal', () => {
  // Breaches caught: the WAL source not reachable from the CLI, events out of commit order, a
  // relay reported ready while another holds the slot (or not ready while it streams), a
  // SIGTERM that does not drain to exit 0, a standby that never takes the slot over.
  it('publishes in commit order, drains on SIGTERM, and a second relay takes the slot over', async () => {
    const [topic] = await createTopics(['wal-cli'], { partitions: 1 });
    const write = (c: Parameters<typeof outbox.enqueue>[0], n: number) =>
      outbox.enqueue(c, [{ topic: topic!, key: 'k', type: 'test.event', payload: { n } }]);
    // Written before the relay (and its slot) exists: published by its first resync.
    await withPgTransaction(db.pool, (c) => write(c, 0));
    const first = spawnWalRelay();
    await logLine(first, 'WAL relay started');
    const port1 = Number((await logLine(first, 'metrics and health endpoints listening')).port);
    const slot = await db.pool.query<{ slot_name: string }>(
      `SELECT slot_name FROM pg_replication_slots WHERE database = current_database()`,
    );
    expect(slot.rows).toEqual([{ slot_name: `${SCHEMA}_relay` }]);

    // Two transactions that commit in the opposite order of their inserts, then one more.
    const a = await db.pool.connect();
    const b = await db.pool.connect();
    try {
      await a.query('BEGIN');
      await write(a, 2);
      await b.query('BEGIN');
      await write(b, 1);
      await b.query('COMMIT');
      await a.query('COMMIT');
    } finally {
      a.release();
      b.release();
    }
    await withPgTransaction(db.pool, (c) => write(c, 3));
    const n = (all: { value: Buffer | null }[]) => all.map((m) => (JSON.parse(m.value!.toString()) as { n: number }).n);
    const firstRead = await readTopic(
      topic!,
      (m) => m,
      (all) => all.length >= 4,
      20_000,
    );
    expect(n(firstRead)).toEqual([0, 1, 2, 3]);
    expect(await readyzBecomes(port1, 200)).toBe('ready\n');
    // The counters, each kind of error listed at 0 before any failure.
    const metrics = await (await fetch(`http://127.0.0.1:${port1}/metrics`)).text();
    expect(metrics).toMatch(/^outboxkit_relay_published_total [1-9]\d*$/m);
    for (const what of ['send', 'database', 'stream']) {
      expect(metrics).toMatch(new RegExp(`^outboxkit_wal_relay_errors_total\\{what="${what}"\\} \\d+$`, 'm'));
    }
    // The first start resynced (its slot was missing) and published the one event written before it.
    expect(metrics).toMatch(/^outboxkit_wal_relay_resyncs_total\{reason="missing"\} 1$/m);
    expect(metrics).toMatch(/^outboxkit_wal_relay_resyncs_total\{reason="lost"\} 0$/m);
    expect(metrics).toMatch(/^outboxkit_wal_relay_resynced_events_total 1$/m);
    expect(metrics).toMatch(/^outboxkit_wal_relay_resyncing 0$/m);
    // Held keys (docs/wal-source.md): none held, no partition blocked.
    expect(metrics).toMatch(/^outboxkit_wal_relay_held_total 0$/m);
    expect(metrics).toMatch(/^outboxkit_wal_relay_held_keys 0$/m);
    expect(metrics).toMatch(/^outboxkit_relay_partitions_blocked 0$/m);
    expect(metrics).toMatch(
      new RegExp(`^outboxkit_wal_slot_retained_bytes\\{slot="${SCHEMA}_relay"\\} [1-9]\\d*$`, 'm'),
    );
    expect(metrics).toMatch(
      new RegExp(`^outboxkit_wal_slot_confirmed_lag_bytes\\{slot="${SCHEMA}_relay"\\} \\d+$`, 'm'),
    );

    // `outboxkit status` shows the slot, who reads it and what it holds back.
    const status = await cli(['status', '--database-url', db.url, '--schema', SCHEMA, '--json']);
    expect(status.code, status.stderr).toBe(0);
    const { walSlots } = JSON.parse(status.stdout) as { walSlots: Record<string, unknown>[] };
    expect(walSlots).toEqual([
      expect.objectContaining({
        slot: `${SCHEMA}_relay`,
        exists: true,
        active: true,
        activePid: expect.any(Number),
        walStatus: 'reserved',
        retainedBytes: expect.any(Number),
        confirmedLagBytes: expect.any(Number),
        resyncPending: false,
        resyncReason: 'missing',
        resyncedAt: expect.any(Number),
        // The first relay holds the reader lease, named by its id (host-pid-random by default).
        leaseOwner: expect.stringMatching(/^.+-\d+-[0-9a-f]{8}$/),
        leaseRemainingMs: expect.any(Number),
      }),
    ]);
    const text = await cli(['status', '--database-url', db.url, '--schema', SCHEMA]);
    expect(text.stdout).toMatch(
      new RegExp(
        `^  ${SCHEMA}_relay: read by pid \\d+, wal_status reserved, retains .+; last resync .+ \\(missing\\); ` +
          'lease held by .+ \\(\\d+\\.\\d s left\\)$',
        'm',
      ),
    );

    // A second relay on the same slot: it waits, and is not ready.
    const second = spawnWalRelay();
    await logLine(second, 'standing by until the slot lease is free');
    const port2 = Number((await logLine(second, 'metrics and health endpoints listening')).port);
    expect(await readyzBecomes(port2, 503)).toBe('not ready: replication stream down\n');
    expect((await readyz(port1)).status).toBe(200);

    first.proc.kill('SIGTERM');
    const exit = await first.exited;
    const log = first.output.join('');
    expect(exit, log.slice(-3000)).toEqual({ code: 0, signal: null });
    expect(log).toContain('"msg":"draining"');
    expect(log).toContain('"msg":"WAL relay stopped"');

    // Written while the slot is free: the second relay publishes them once it holds it.
    await withPgTransaction(db.pool, (c) => write(c, 4));
    await withPgTransaction(db.pool, (c) => write(c, 5));
    await logLine(second, 'WAL relay started');
    const all = await readTopic(
      topic!,
      (m) => m,
      (got) => got.length >= 6,
      20_000,
    );
    expect(n(all)).toEqual([0, 1, 2, 3, 4, 5]);
    expect(await readyzBecomes(port2, 200)).toBe('ready\n');
    const { rows } = await db.pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${SCHEMA}.outbox_events`);
    expect(rows[0]!.n).toBe(0); // published rows are deleted

    second.proc.kill('SIGTERM');
    expect(await second.exited).toEqual({ code: 0, signal: null });
  }, 90_000);

  // Breach caught (a trial): two running relays given one --relay-id both taking the lease as
  // theirs and ending each other's walsender every half second, forever, publishing duplicates.
  it('a second running relay with the same --relay-id stands by, saying why, and never fights', async () => {
    const [topic] = await createTopics(['wal-same-id'], { partitions: 1 });
    const same = ['--relay-id', 'same-id', '--wal-lease-ms', '2000', '--broker-timeout-ms', '1500'];
    const a = spawnWalRelay(same);
    await logLine(a, 'WAL relay started');
    const b = spawnWalRelay(same);
    expect(await logLine(b, "under this relay's own relayId")).toMatchObject({ relayId: 'same-id' });
    for (let n = 0; n < 3; n++) {
      await withPgTransaction(db.pool, (c) =>
        outbox.enqueue(c, [{ topic: topic!, key: 'k', type: 'test.event', payload: { n } }]),
      );
    }
    await readTopic(
      topic!,
      (m) => m,
      (all) => all.length >= 3,
      20_000,
    );
    // Several leases long: a fight would show within one.
    await new Promise((r) => setTimeout(r, 6_000));
    const all = await readTopic(
      topic!,
      (m) => m,
      (got) => got.length >= 3,
      20_000,
    );
    expect(all.map((m) => (JSON.parse(m.value!.toString()) as { n: number }).n)).toEqual([0, 1, 2]);
    for (const r of [a, b]) expect(r.output.join('')).not.toContain('ended the walsender');
    expect(a.output.join('')).not.toContain("lost the replication slot's lease");
    // Said once, not at every poll of the lease (each poll is a new relay object).
    expect(b.stdout.join('').split("under this relay's own relayId").length - 1).toBe(1);
    for (const r of [a, b]) r.proc.kill('SIGTERM');
    expect(await a.exited).toEqual({ code: 0, signal: null });
    expect(await b.exited).toEqual({ code: 0, signal: null });
  }, 60_000);

  // Breaches caught: a paused reader (its walsender, and so the slot, held until
  // wal_sender_timeout, 60 s here) never taken over, or only at wal_sender_timeout; a former
  // reader that wakes in the middle of a batch and sends it after the takeover (late duplicates
  // the lease forbids: it has not renewed it); an event lost or reordered across the takeover.
  it('a standby takes a paused reader over within its lease; the paused one wakes fenced', async () => {
    const [topic] = await createTopics(['wal-standby'], { partitions: 1 });
    const slot = `${SCHEMA}_relay`;
    // One transaction of three events: one batch, one arrival at the pause point.
    const write = (from: number) =>
      withPgTransaction(db.pool, (c) =>
        outbox.enqueue(
          c,
          [from, from + 1, from + 2].map((n) => ({ topic: topic!, key: 'k', type: 'test.event', payload: { n } })),
        ),
      );
    const leaseMs = 2_000;
    // The lease above the broker timeout, as the relay requires.
    const lease = ['--wal-lease-ms', String(leaseMs), '--broker-timeout-ms', '1500'];
    // A stops itself (SIGSTOP) holding its second batch, before the send: a GC pause, a stopped VM.
    const a = spawnWalRelay([...lease, '--relay-id', 'relay-a'], {
      OUTBOXKIT_CRASH_POINT: 'wal-relay:before-send',
      OUTBOXKIT_CRASH_AFTER: '2',
      OUTBOXKIT_CRASH_SIGNAL: 'SIGSTOP',
    });
    await logLine(a, 'WAL relay started');
    const portA = Number((await logLine(a, 'metrics and health endpoints listening')).port);
    const b = spawnWalRelay([...lease, '--relay-id', 'relay-b']);
    expect(await logLine(b, 'standing by until the slot lease is free')).toMatchObject({ owner: 'relay-a' });
    const publishedBy = async (port: number) =>
      Number(
        /^outboxkit_relay_published_total (\d+)$/m.exec(
          await (await fetch(`http://127.0.0.1:${port}/metrics`)).text(),
        )?.[1],
      );
    try {
      await write(0);
      const written = await currentWalLsn(db.pool);
      // Published and confirmed by A: nothing of it may come again.
      await waitFor(async () => (await confirmedFlush(db.pool, slot)) >= written, {
        timeoutMs: 20_000,
        message: 'first batch not confirmed by relay A',
      });
      expect(await publishedBy(portA)).toBe(3);
      const pidA = (
        await db.pool.query<{ pid: number }>(
          'SELECT active_pid AS pid FROM pg_replication_slots WHERE slot_name = $1',
          [slot],
        )
      ).rows[0]!.pid;

      await write(3);
      await waitFor(() => processState(a.proc.pid!) === 'T', { timeoutMs: 20_000, message: 'relay A did not pause' });
      const pausedAt = Date.now();
      expect(await logLine(b, 'took over the replication slot', 30_000)).toMatchObject({ from: 'relay-a' });
      expect(await logLine(b, 'ended the walsender')).toMatchObject({ pid: pidA });
      await logLine(b, 'WAL relay started', 30_000);
      // Within the lease and a poll of it (B polls every third), plus slack for a loaded machine;
      // without the lease, only wal_sender_timeout (60 s) would free the slot.
      expect(Date.now() - pausedAt).toBeLessThan(leaseMs + 15_000);
      const portB = Number((await logLine(b, 'metrics and health endpoints listening')).port);
      await readTopic(
        topic!,
        (m) => m,
        (all) => all.length >= 6,
        20_000,
      );

      // A goes on from the pause point with its batch in hand: it must not send it.
      a.proc.kill('SIGCONT');
      expect(await logLine(a, "lost the replication slot's lease", 20_000)).toMatchObject({ slot });
      await write(6);
      const all = await readTopic(
        topic!,
        (m) => m,
        (got) => got.length >= 9,
        20_000,
      );
      // Time for a late copy from A to arrive, if it would.
      await new Promise((r) => setTimeout(r, 2_000));
      const again = await readTopic(
        topic!,
        (m) => m,
        (got) => got.length >= all.length,
        20_000,
      );
      const n = again.map((m) => (JSON.parse(m.value!.toString()) as { n: number }).n);
      expect(n).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8]); // each once, in commit order
      expect(await publishedBy(portA)).toBe(3);
      expect(await publishedBy(portB)).toBe(6);
      expect((await readyz(portA)).status).toBe(503);
      expect((await readyz(portB)).status).toBe(200);
      expect(a.proc.exitCode).toBeNull(); // A stands by; it did not crash
      const { rows } = await db.pool.query<{ owner_id: string }>(
        `SELECT owner_id FROM ${SCHEMA}.wal_slot_leases WHERE slot_name = $1`,
        [slot],
      );
      expect(rows[0]!.owner_id).toBe('relay-b');
    } finally {
      a.proc.kill('SIGCONT');
    }
    for (const r of [a, b]) r.proc.kill('SIGTERM');
    expect(await a.exited).toEqual({ code: 0, signal: null });
    expect(await b.exited).toEqual({ code: 0, signal: null });
  }, 120_000);
});

describe('relay flags of the other source, and replication names, are refused before connecting', () => {
  it('exit 1 with one message naming the flag (all run at once)', async () => {
    const refused: [string[], Record<string, string>, string][] = [
      [
        ['relay', '--source', 'wal', '--lease-ms', '2000', '--listen', 'false'],
        {},
        'outboxkit: OUTBOXKIT_INVALID_OPTIONS: --lease-ms, --listen apply only to --source table, not to --source wal: remove them.\n',
      ],
      [
        ['relay', '--source', 'wal'],
        { OUTBOXKIT_POLL_INTERVAL_MS: '100' },
        'outboxkit: OUTBOXKIT_INVALID_OPTIONS: --poll-interval-ms (set by OUTBOXKIT_POLL_INTERVAL_MS) applies only to --source table, not to --source wal: remove it.\n',
      ],
      [
        ['relay', '--wal-slot', 'some_slot'],
        {},
        'outboxkit: OUTBOXKIT_INVALID_OPTIONS: --wal-slot applies only to --source wal, not to --source table: remove it.\n',
      ],
      [
        ['relay', '--source', 'wal', '--wal-status-interval-ms', '1'],
        {},
        'outboxkit: OUTBOXKIT_INVALID_OPTIONS: --wal-status-interval-ms must be an integer from 10 to 3600000, got 1.\n',
      ],
      // The retention flags serve both sources (they were refused with --source wal): passed to the
      // WAL relay, whose check names them by flag.
      [
        ['relay', '--source', 'wal', '--published-retention-ms', '3600000', '--cleanup-rows-per-second', '-1'],
        {},
        'outboxkit: OUTBOXKIT_INVALID_OPTIONS: --cleanup-rows-per-second must be an integer ≥ 0, got -1.\n',
      ],
      [
        ['relay', '--source', 'wal'],
        { OUTBOXKIT_PUBLISHED_RETENTION_MS: '-5' },
        'outboxkit: OUTBOXKIT_INVALID_OPTIONS: --published-retention-ms must be an integer ≥ 0, got -5.\n',
      ],
    ];
    // Usage errors (commander's, with the usage line after them).
    const usage: [string[], string][] = [
      [
        ['relay', '--source', 'wal', '--wal-slot', 'Bad-Slot'],
        "error: option '--wal-slot <name>' argument 'Bad-Slot' is invalid. Invalid slot name \"Bad-Slot\"",
      ],
      [
        ['migrate', '--wal-publication', 'no-dash'],
        "error: option '--wal-publication [name]' argument 'no-dash' is invalid. Invalid publication name \"no-dash\"",
      ],
    ];
    const [refusedRuns, usageRuns] = await Promise.all([
      Promise.all(
        refused.map(([args, env]) => cli([...args, '--database-url', UNREACHABLE, '--metrics-port', '-1'], env)),
      ),
      Promise.all(usage.map(([args]) => cli([...args, '--database-url', UNREACHABLE]))),
    ]);
    refused.forEach(([args, , expected], i) => {
      const r = refusedRuns[i]!;
      expect({ args, code: r.code, stdout: r.stdout, stderr: r.stderr }).toEqual({
        args,
        code: 1,
        stdout: '',
        stderr: expected,
      });
    });
    usage.forEach(([args, expected], i) => {
      const r = usageRuns[i]!;
      expect({ args, code: r.code }).toEqual({ args, code: 1 });
      expect(r.stderr).toContain(expected);
      expect(r.stderr).not.toContain('ECONNREFUSED');
    });
  });
});

describe('outboxkit relay --source wal during a resync', () => {
  // Breaches caught: a relay that publishes the table's rows (its slot was missing) reported not
  // ready as if its stream were down, or the resync not visible in its metrics.
  it('answers /readyz 200 naming the resync while it publishes the table, then streams', async () => {
    const [topic] = await createTopics(['wal-cli-resync'], { partitions: 1 });
    // The first test's slot, dropped once its last reader let it go: the next start resyncs (reason missing).
    await waitForSlotInactive(db.pool, `${SCHEMA}_relay`);
    await db.pool.query(`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, [
      `${SCHEMA}_relay`,
    ]);
    const rows = 20_000;
    await withPgTransaction(db.pool, (c) =>
      outbox.enqueue(
        c,
        Array.from({ length: rows }, (_, n) => ({
          topic: topic!,
          key: `k${n % 10}`,
          type: 'test.event',
          payload: { n },
        })),
      ),
    );
    // Pages of 100 rows: 200 sends and deletions, long enough to be seen resyncing.
    const relay = spawnWalRelay(['--batch-size', '100']);
    try {
      const port = Number((await logLine(relay, 'metrics and health endpoints listening')).port);
      const seen: { status: number; body: string; resyncing: boolean }[] = [];
      // Until the resync's end is logged (it runs after `WAL relay started`, before the stream).
      let resynced = false;
      void logLine(relay, 'WAL relay resync done', 90_000).then(
        () => (resynced = true),
        () => (resynced = true),
      );
      while (!resynced) {
        const r = await readyz(port);
        const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
        seen.push({ ...r, resyncing: /^outboxkit_wal_relay_resyncing 1$/m.test(metrics) });
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      const during = seen.filter((x) => x.resyncing);
      expect(during.length, JSON.stringify(seen.slice(-5))).toBeGreaterThan(0);
      expect(during.map((x) => x.status)).toContain(200);
      expect(during.find((x) => x.status === 200)?.body).toBe('ready; resyncing the outbox table before streaming\n');
      expect(await readyzBecomes(port, 200)).toBe('ready\n');
      const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      expect(metrics).toMatch(/^outboxkit_wal_relay_resyncs_total\{reason="missing"\} 1$/m);
      expect(metrics).toMatch(new RegExp(`^outboxkit_wal_relay_resynced_events_total ${rows}$`, 'm'));
      expect(metrics).toMatch(/^outboxkit_wal_relay_resyncing 0$/m);
    } finally {
      relay.proc.kill('SIGTERM');
      await relay.exited;
    }
  }, 120_000);
});
