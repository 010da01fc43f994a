import type { Command } from 'commander';
import { quoteSchema } from '../../src/schema-name.js';
import { releaseOwner } from '../../relay/sql.js';
import { databaseOption, q, schemaOption, withPool } from '../shared.js';

/** `outboxkit lanes release`. */
export function registerLanes(program: Command): void {
  const lanes = program.command('lanes').description('relay lane operations');
  lanes
    .command('release')
    .description('free every lane of a relay (for example a dead one) so live relays take them at once')
    .argument('<relay-id>', 'the owner shown by `outboxkit status`')
    .addOption(databaseOption())
    .addOption(schemaOption())
    .option('--json', 'print JSON: { "relayId": id, "released": n }')
    .action(async (relayId: string, opts: { databaseUrl: string; schema: string; json?: boolean }) => {
      await withPool(opts.databaseUrl, 'lanes', async (pool) => {
        const n = await releaseOwner(q(pool), quoteSchema(opts.schema), relayId);
        console.log(opts.json ? JSON.stringify({ relayId, released: n }) : `released ${n} lanes of ${relayId}`);
      });
    });
}
