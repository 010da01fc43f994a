import type { Command } from 'commander';
import { quoteSchema, walSlotName } from '../../src/schema-name.js';
import type { Queryable } from '../../src/database.js';
import { backlog, laneOwners, liveRelays, type LiveRelay } from '../../relay/sql.js';
import { walSlotsStatus, type WalSlotStatus } from '../../relay/wal/slot-sql.js';
import { databaseOption, q, schemaOption, withPool } from '../shared.js';
import { printError, printJson, printLines } from '../printable.js';
import { SQLSTATE, sqlStateOf } from '../../src/postgres.js';

/** Blocked topic-partitions listed per relay in the text output (`--json` lists all the relay wrote). */
const MAX_LISTED_PARTITIONS = 20;
/** Longest reason shown in the text output, in characters. */
const MAX_LISTED_REASON = 160;

/** A blocked topic-partition as `status --json` lists it: the relay that reported it, and its entry. */
interface ListedPartition {
  relayId: string;
  topic: string;
  partition: number;
  reason: string;
  /** Keys of that relay's lanes held back by it. */
  keys: number;
  /** Since when it is blocked, in ms since the epoch (the relay's clock). */
  since: number;
}

/** `outboxkit status`. */
export function registerStatus(program: Command): void {
  program
    .command('status')
    .description(
      'print the backlog, parked events, lane owners, the topic-partitions relays find blocked and the WAL relay slots',
    )
    .addOption(databaseOption())
    .addOption(schemaOption())
    .option('--json', 'print JSON')
    .action(async (opts: { databaseUrl: string; schema: string; json?: boolean }) => {
      await withPool(opts.databaseUrl, 'status', opts.schema, async (pool) => {
        const schema = quoteSchema(opts.schema);
        const status = {
          backlog: await backlog(q(pool), schema),
          lanes: await laneOwners(q(pool), schema),
          blockedPartitions: listed(await liveRelays(q(pool), schema)),
          ...(await walSlots(q(pool), opts.schema)),
        };
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
          printBlocked(status.blockedPartitions);
          printWalSlots(status.walSlots);
          if (status.walSlotsWarning) printError(`outboxkit: warning: ${status.walSlotsWarning.message}`);
        }
      });
    });
}

/** The blocked partitions of the live relays, relay by relay (each relay's own order: most keys first). */
function listed(relays: readonly LiveRelay[]): ListedPartition[] {
  return relays.flatMap((r) => r.blockedPartitions.map((b) => ({ relayId: r.relayId, ...b })));
}

/**
 * The text lines of the blocked partitions, when a live relay reported some (nothing otherwise):
 * at most {@link MAX_LISTED_PARTITIONS} per relay, each reason cut at {@link MAX_LISTED_REASON}.
 */
function printBlocked(partitions: readonly ListedPartition[]): void {
  if (partitions.length === 0) return;
  printLines('blocked topic-partitions (cannot take writes; their events wait, the others flow):');
  const byRelay = new Map<string, ListedPartition[]>();
  for (const p of partitions) {
    let list = byRelay.get(p.relayId);
    if (!list) byRelay.set(p.relayId, (list = []));
    list.push(p);
  }
  const now = Date.now();
  for (const [relayId, list] of byRelay) {
    for (const p of list.slice(0, MAX_LISTED_PARTITIONS)) {
      const reason = p.reason.length > MAX_LISTED_REASON ? `${p.reason.slice(0, MAX_LISTED_REASON - 1)}…` : p.reason;
      const forS = Math.max(0, Math.round((now - p.since) / 1000));
      printLines(
        `  ${relayId}: ${p.topic} partition ${p.partition}: ${reason}; ${p.keys} key${p.keys === 1 ? '' : 's'} waiting, for ${forS} s`,
      );
    }
    if (list.length > MAX_LISTED_PARTITIONS) {
      printLines(`  ${relayId}: ${list.length - MAX_LISTED_PARTITIONS} more (outboxkit status --json lists them)`);
    }
  }
}

/**
 * Why `outboxkit status` could not list the WAL relay slots (`walSlotsWarning` in `--json`, a
 * warning line on stderr in text mode); `walSlots` is then empty.
 *
 * - `reason: 'table-missing'`: `<schema>.wal_slots` does not exist (SQLSTATE 42P01: the schema was
 *   migrated before migration 0006); fixed by `outboxkit migrate`.
 * - `reason: 'permission-denied'`: the role may not read it (42501); fixed by `GRANT SELECT`.
 *
 * `message` says so, with the fix.
 */
export interface WalSlotsWarning {
  reason: 'table-missing' | 'permission-denied';
  message: string;
}

/**
 * The WAL relay slots of `schema` (relay/wal/slot-sql.ts, {@link walSlotsStatus}): none when no
 * WAL relay ran (table mode). When `<schema>.wal_slots` does not exist or the role may not read it
 * (a monitoring role), no slots and a {@link WalSlotsWarning} saying why: the rest of the status
 * is still printed. Told apart by SQLSTATE; any other error fails the command.
 */
async function walSlots(
  db: Queryable,
  schema: string,
): Promise<{ walSlots: WalSlotStatus[]; walSlotsWarning: WalSlotsWarning | null }> {
  const table = `${quoteSchema(schema)}.wal_slots`;
  try {
    return { walSlots: await walSlotsStatus(db, quoteSchema(schema), walSlotName(schema)), walSlotsWarning: null };
  } catch (err) {
    const state = sqlStateOf(err);
    if (state === SQLSTATE.UNDEFINED_TABLE) {
      return notListed(
        'table-missing',
        `${table} does not exist (a schema migrated before migration 0006); ` +
          `run \`outboxkit migrate --schema ${schema}\` to create it.`,
      );
    }
    if (state === SQLSTATE.INSUFFICIENT_PRIVILEGE) {
      return notListed(
        'permission-denied',
        `the database role may not read ${table} (${(err as Error).message}); grant it: GRANT SELECT ON ${table} TO <role>.`,
      );
    }
    throw err;
  }
}

/** No WAL relay slots, and the {@link WalSlotsWarning} of `reason`: `WAL relay slots not listed: <why>`. */
function notListed(
  reason: WalSlotsWarning['reason'],
  why: string,
): { walSlots: WalSlotStatus[]; walSlotsWarning: WalSlotsWarning } {
  return { walSlots: [], walSlotsWarning: { reason, message: `WAL relay slots not listed: ${why}` } };
}

/** A byte count for people: `812 B`, `3.4 MiB`. */
function byteText(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${v} B` : `${v.toFixed(1)} ${units[i]}`;
}

/** The text lines of the WAL relay slots, when there are some (nothing otherwise). */
function printWalSlots(slots: readonly WalSlotStatus[]): void {
  if (slots.length === 0) return;
  printLines('WAL relay slots:');
  for (const s of slots) {
    const state = !s.exists
      ? 'missing (the next relay start creates it and resyncs)'
      : `${s.active ? `read by pid ${s.activePid}` : 'not read'}, wal_status ${s.walStatus ?? 'unknown'}` +
        (s.retainedBytes === null ? '' : `, retains ${byteText(s.retainedBytes)}`) +
        (s.confirmedLagBytes === null ? '' : `, confirmed ${byteText(s.confirmedLagBytes)} behind`);
    const resync = s.resyncPending
      ? `; resync pending (${s.resyncReason ?? 'unknown'}, since ${new Date(s.resyncStartedAt ?? 0).toISOString()})`
      : s.resyncedAt === null
        ? ''
        : `; last resync ${new Date(s.resyncedAt).toISOString()} (${s.resyncReason ?? 'unknown'})`;
    const lease =
      s.leaseOwner === null
        ? ''
        : s.leaseRemainingMs === 0
          ? `; lease of ${s.leaseOwner} expired`
          : `; lease held by ${s.leaseOwner} (${((s.leaseRemainingMs ?? 0) / 1000).toFixed(1)} s left)`;
    printLines(`  ${s.slot}: ${state}${resync}${lease}`);
  }
}
