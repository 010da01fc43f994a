import type { Command } from 'commander';
import type { Queryable } from '../../src/database.js';
import { quoteSchema } from '../../src/schema-name.js';
import { laneOwners, releaseOwner } from '../../relay/sql.js';
import { databaseOption, q, schemaOption, withPool } from '../shared.js';
import { printError, printJson, printLines } from '../printable.js';

/** `outboxkit lanes release`. */
export function registerLanes(program: Command): void {
  const lanes = program.command('lanes').description('relay lane operations');
  lanes
    .command('release')
    .description(
      'free every lane of a relay (for example a dead one) so live relays take them at once; ' +
        'exit 1 when the relay holds no lanes',
    )
    .argument('<relay-id>', 'the owner shown by `outboxkit status`')
    .addOption(databaseOption())
    .addOption(schemaOption())
    .option('--json', 'print JSON: { "relayId": id, "released": n } (exit 1 when n is 0)')
    .action(async (relayId: string, opts: { databaseUrl: string; schema: string; json?: boolean }) => {
      await withPool(opts.databaseUrl, 'lanes', opts.schema, async (pool) => {
        const schema = quoteSchema(opts.schema);
        const n = await releaseOwner(q(pool), schema, relayId);
        // A mistyped id would otherwise "succeed" with nothing done: exit 1, as `parked skip` of an
        // id that is not parked (the reason on stderr, or the usual JSON with `released: 0`).
        if (n === 0) {
          process.exitCode = 1;
          if (!opts.json) printError(`outboxkit: ${await holdsNoLanes(q(pool), opts.schema, relayId)}`);
        }
        if (opts.json) printJson({ relayId, released: n });
        else if (n > 0) printLines(`released ${n} lanes of ${relayId}`);
      });
    });
}

/** Why nothing was released, with the relays that do hold lanes (the id may be mistyped). */
async function holdsNoLanes(db: Queryable, schema: string, relayId: string): Promise<string> {
  const owners = (await laneOwners(db, quoteSchema(schema))).filter((o) => o.owner_id !== null);
  const shown = owners.slice(0, 10).map((o) => `${o.owner_id} (${o.lanes} lanes${o.live ? '' : ', lease expired'})`);
  if (owners.length > shown.length) shown.push(`${owners.length - shown.length} more`);
  return (
    `relay ${JSON.stringify(relayId)} holds no lanes: nothing was released (a mistyped id, or its lanes were ` +
    `already released or taken over); ${shown.length ? `lanes are held by ${shown.join(', ')}` : 'no relay holds lanes'}. ` +
    `See \`outboxkit status --schema ${schema}\`.`
  );
}
