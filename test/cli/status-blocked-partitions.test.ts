/**
 * `outboxkit status` lists the topic-partitions that live relays find unable to take writes. It
 * reads the database, not the relays' memory: each relay writes its `blockedPartitions()` into
 * `relay_instances.blocked_partitions` at every heartbeat (relay/sql.ts, `heartbeatInstance`), at
 * most 200 of them, those holding back the most keys first. The text output is bounded (20 per
 * relay, reasons cut at 160 characters) and escaped like every CLI output; `--json` lists all
 * that the relays wrote. Relays whose liveness lease expired are not listed.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { BlockedPartition } from '../../relay/partitions.js';
import { heartbeatInstance, liveRelays, PUBLISHED_BLOCKED_PARTITIONS_MAX } from '../../relay/sql.js';
import { q } from '../../cli/shared.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { finished, spawnCli } from '../helpers/processes.js';
import { startRelay } from '../helpers/relay.js';

const SCHEMA = '"outboxkit"';
const cli = (args: string[]) => finished(spawnCli(args));

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase({ poolSize: 4 });
});
afterAll(async () => {
  await db.drop();
});

/** Registers `relayId` as live for `leaseMs` with `blocked`, through the relay's own statement. */
async function heartbeat(relayId: string, blocked: BlockedPartition[], leaseMs = 60_000): Promise<void> {
  await heartbeatInstance(
    { db: q(db.pool), schema: SCHEMA, relayId },
    { hostname: 'test-host', pid: 4242, leaseMs, blockedPartitions: blocked },
  );
}

async function stored(relayId: string): Promise<BlockedPartition[] | null> {
  const { rows } = await db.pool.query<{ b: BlockedPartition[] | null }>(
    'SELECT blocked_partitions AS b FROM outboxkit.relay_instances WHERE relay_id = $1',
    [relayId],
  );
  return rows[0]!.b;
}

const SINCE = Date.now() - 42_000;
const entry = (topic: string, partition: number, keys: number, reason = 'no leader'): BlockedPartition => ({
  topic,
  partition,
  reason,
  keys,
  since: SINCE,
});

describe('outboxkit status: blocked topic-partitions of the live relays', () => {
  it('lists them per live relay: the text bounded and escaped, --json all of them; expired relays left out', async () => {
    const hostile = `no leader\x1b[2J\nrelay-z: orders partition 0: forged line ${'x'.repeat(200)}`;
    // relay-a: 23 blocked partitions (more than the text lists), one with a hostile reason.
    const many = Array.from({ length: 23 }, (_, i) => entry('orders', i, 100 - i));
    many[0] = entry('orders', 0, 100, hostile);
    await heartbeat('relay-a', many);
    // relay-b: nothing blocked.
    await heartbeat('relay-b', []);
    // relay-c: blocked partitions, but it died (its lease expired): not listed.
    await heartbeat('relay-c', [entry('payments', 1, 5)]);
    await db.pool.query(
      "UPDATE outboxkit.relay_instances SET lease_expires_at = now() - interval '1 second' WHERE relay_id = 'relay-c'",
    );
    // relay-d: entries of another shape beside a valid one, as anything that can write the table
    // might leave: only the valid one is listed.
    await heartbeat('relay-d', []);
    await db.pool.query(
      `UPDATE outboxkit.relay_instances SET blocked_partitions = $1::jsonb WHERE relay_id = 'relay-d'`,
      [
        JSON.stringify([
          { topic: 1 },
          'x',
          { ...entry('audit', 3, 2, 'NOT_ENOUGH_REPLICAS (isr 1 < min.insync.replicas 2)') },
        ]),
      ],
    );

    expect(await stored('relay-b')).toBeNull();
    expect(await stored('relay-d')).toHaveLength(3);
    const live = await liveRelays(q(db.pool), SCHEMA);
    expect(live.map((r) => [r.relayId, r.blockedPartitions.length])).toEqual([
      ['relay-a', 23],
      ['relay-b', 0],
      ['relay-d', 1],
    ]);

    const text = await cli(['status', '--database-url', db.url]);
    expect(text.code, text.stderr).toBe(0);
    const lines = text.stdout.trimEnd().split('\n');
    const at = lines.indexOf('blocked topic-partitions (cannot take writes; their events wait, the others flow):');
    expect(at).toBeGreaterThan(0);
    const blockedLines = lines.slice(at + 1);
    // 20 of relay-a's, most keys first, then how many more; relay-d's valid entry; no relay-c.
    expect(blockedLines).toHaveLength(22);
    expect(blockedLines[0]).toMatch(
      /^ {2}relay-a: orders partition 0: no leader\\x1b\[2J\\nrelay-z: orders partition 0: forged line x+…; 100 keys waiting, for \d+ s$/,
    );
    expect(blockedLines[0]!.length).toBeLessThan(260);
    expect(blockedLines[1]).toMatch(/^ {2}relay-a: orders partition 1: no leader; 99 keys waiting, for \d+ s$/);
    expect(blockedLines[19]).toMatch(/^ {2}relay-a: orders partition 19: no leader; 81 keys waiting/);
    expect(blockedLines[20]).toBe('  relay-a: 3 more (outboxkit status --json lists them)');
    expect(blockedLines[21]).toMatch(
      /^ {2}relay-d: audit partition 3: NOT_ENOUGH_REPLICAS \(isr 1 < min\.insync\.replicas 2\); 2 keys waiting, for \d+ s$/,
    );
    expect(text.stdout).not.toContain('\x1b');
    expect(text.stdout).not.toContain('payments');

    const json = await cli(['status', '--database-url', db.url, '--json']);
    expect(json.code, json.stderr).toBe(0);
    const status = JSON.parse(json.stdout) as { blockedPartitions: (BlockedPartition & { relayId: string })[] };
    expect(status.blockedPartitions).toHaveLength(24);
    expect(status.blockedPartitions[0]).toEqual({ relayId: 'relay-a', ...many[0] });
    expect(status.blockedPartitions[22]).toEqual({ relayId: 'relay-a', ...many[22] });
    expect(status.blockedPartitions[23]).toEqual({
      relayId: 'relay-d',
      ...entry('audit', 3, 2, 'NOT_ENOUGH_REPLICAS (isr 1 < min.insync.replicas 2)'),
    });
    expect(json.stdout).not.toContain('\x1b');
  }, 60_000);

  it(`a heartbeat writes at most ${PUBLISHED_BLOCKED_PARTITIONS_MAX}, those holding back the most keys first`, async () => {
    const blocked = Array.from({ length: 250 }, (_, i) => entry('big', i, i % 7 === 0 ? 1_000 + i : i));
    await heartbeat('relay-big', blocked);
    const written = (await stored('relay-big'))!;
    expect(written).toHaveLength(PUBLISHED_BLOCKED_PARTITIONS_MAX);
    expect(written.map((b) => b.keys)).toEqual(
      blocked
        .map((b) => b.keys)
        .sort((a, b) => b - a)
        .slice(0, PUBLISHED_BLOCKED_PARTITIONS_MAX),
    );
    expect(written[0]).toEqual(entry('big', 245, 1_245));
    await db.pool.query("DELETE FROM outboxkit.relay_instances WHERE relay_id = 'relay-big'");
  });

  it("a running relay's heartbeat writes what it finds blocked now: with nothing blocked, status lists nothing for it", async () => {
    // What a previous incarnation of the relay left: replaced at its first heartbeat.
    await heartbeat('relay-live', [entry('orders', 7, 3)]);
    const relay = await startRelay(db.url, { relayId: 'relay-live' });
    expect(relay.blockedPartitions()).toEqual([]);
    expect(await stored('relay-live')).toBeNull();
    const json = await cli(['status', '--database-url', db.url, '--json']);
    const status = JSON.parse(json.stdout) as { blockedPartitions: { relayId: string }[] };
    expect(status.blockedPartitions.filter((b) => b.relayId === 'relay-live')).toEqual([]);
    await relay.stopAndForget();
    // A stopped relay leaves the live relays (its row is removed).
    expect((await liveRelays(q(db.pool), SCHEMA)).map((r) => r.relayId)).not.toContain('relay-live');
  }, 30_000);
});
