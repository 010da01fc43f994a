/**
 * The `outboxkit` command line: migrations, the relay daemon, and operator commands.
 * Every option reads: flag > environment variable > default (listed in `--help`).
 * Each command lives in cli/commands/ and registers itself here.
 */
import { Command } from 'commander';
import { isOutboxkitError } from '../src/errors.js';
import { registerDlq } from './commands/dlq.js';
import { registerInbox } from './commands/inbox.js';
import { registerKeys } from './commands/keys.js';
import { registerLanes } from './commands/lanes.js';
import { registerMigrate } from './commands/migrate.js';
import { registerParked } from './commands/parked.js';
import { registerRelay } from './commands/relay.js';
import { registerStatus } from './commands/status.js';
import { registerTopics } from './commands/topics.js';

const program = new Command('outboxkit')
  .description('Safe retries across PostgreSQL and Apache Kafka: outbox relay, migrations and operator commands.')
  .showHelpAfterError();

registerMigrate(program);
registerRelay(program);
registerStatus(program);
registerLanes(program);
registerParked(program);
registerTopics(program);
registerKeys(program);
registerDlq(program);
registerInbox(program);

export async function main(argv: string[] = process.argv): Promise<void> {
  try {
    await program.parseAsync(argv);
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    const hint = code === '42P01' ? " (outboxkit's tables are missing: run `outboxkit migrate`)" : '';
    const message = isOutboxkitError(err)
      ? `${err.code}: ${err.message}`
      : `${(err as Error).message ?? String(err)}${hint}`;
    console.error(`outboxkit: ${message}`);
    process.exitCode = 1;
  }
}

// Run when executed directly (tsx cli/main.ts, or bin/outboxkit.js importing the build).
if (process.argv[1] && import.meta.url === new URL(`file://${process.argv[1]}`).href) {
  void main();
}
