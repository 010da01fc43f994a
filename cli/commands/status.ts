import type { Command } from 'commander';
import { quoteSchema } from '../../src/schema-name.js';
import { backlog, laneOwners, liveRelays, type LiveRelay } from '../../relay/sql.js';
import { databaseOption, q, schemaOption, withPool } from '../shared.js';
import { printJson, printLines } from '../printable.js';

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
    .description('print the backlog, parked events, lane owners and the topic-partitions relays find blocked')
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
