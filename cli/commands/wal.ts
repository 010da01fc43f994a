import { Option, type Command } from 'commander';
import { quoteSchema, walSlotName } from '../../src/schema-name.js';
import { dropWalSlot } from '../../relay/wal/slot-sql.js';
import { databaseOption, replicationName, schemaOption, withPool } from '../shared.js';
import { printJson, printLines } from '../printable.js';

/** `outboxkit wal drop-slot`. */
export function registerWal(program: Command): void {
  const wal = program.command('wal').description("the WAL relay's replication slot (docs/wal-source.md)");
  wal
    .command('drop-slot')
    .description(
      "drop the WAL relay's replication slot and forget it (its resync marker and lease), after going back to the " +
        'table relay: a slot nobody reads keeps all WAL written after it on disk. Refused while a WAL relay holds ' +
        "the slot's lease or reads it (stop every WAL relay of the slot first); docs/runbooks.md",
    )
    .addOption(
      new Option('--wal-slot <name>', 'the replication slot (default: <schema>_relay)')
        .env('OUTBOXKIT_WAL_SLOT')
        .argParser(replicationName('slot')),
    )
    .addOption(databaseOption())
    .addOption(schemaOption())
    .option('--json', 'print JSON: { "slot": name, "dropped": boolean, "forgotten": n }')
    .action(async (opts: { walSlot?: string; databaseUrl: string; schema: string; json?: boolean }) => {
      await withPool(opts.databaseUrl, 'wal', opts.schema, async (pool) => {
        const slot = opts.walSlot ?? walSlotName(opts.schema);
        const result = await dropWalSlot(pool, quoteSchema(opts.schema), slot);
        if (opts.json) printJson(result);
        else if (result.dropped) printLines(`dropped replication slot ${slot}`);
        else
          printLines(
            `no replication slot ${slot}: nothing to drop${result.forgotten > 0 ? ' (its rows deleted)' : ''}`,
          );
      });
    });
}
