import { InvalidOptionsError } from './errors.js';
import { DEFAULT_SCHEMA } from './constants.js';

/**
 * Longest schema name, in characters: PostgreSQL allows 63 bytes for identifiers and NOTIFY channel
 * names, and outboxkit's channels append up to 12 characters (`_idempotency`).
 */
export const MAX_SCHEMA_NAME_LENGTH = 40;

/** Schema names outboxkit accepts: a lower-case SQL identifier that never needs escaping. */
const SCHEMA_NAME = /^[a-z_][a-z0-9_]{0,39}$/;

/**
 * Validates a PostgreSQL schema name and returns it quoted, ready to splice into SQL.
 *
 * @param name - the schema name. @defaultValue 'outboxkit'
 * @returns the quoted identifier, for example `"outboxkit"`.
 * @throws {@link InvalidOptionsError} unless `name` matches `^[a-z_][a-z0-9_]{0,39}$`.
 */
export function quoteSchema(name: string = DEFAULT_SCHEMA): string {
  if (typeof name !== 'string' || !SCHEMA_NAME.test(name)) {
    throw new InvalidOptionsError(
      `Invalid schema name ${JSON.stringify(name)}: use 1-40 lower-case letters, digits or underscores, not starting with a digit.`,
    );
  }
  return `"${name}"`;
}

/** The NOTIFY channel of a schema (`<schema>_outbox`), which the writer notifies and the relay listens to. */
export function notifyChannel(schema: string): string {
  return `${schema}_outbox`;
}

/**
 * The default name of the publication that streams a schema's outbox inserts to the WAL relay
 * (`<schema>_outbox_events`; docs/wal-source.md, "The writer"). Always a valid publication name:
 * a schema name (at most 40 characters of `[a-z0-9_]`) plus 14 characters stays within the 63 that
 * replication names allow.
 */
export function walPublicationName(schema: string): string {
  return `${schema}_outbox_events`;
}

/**
 * The default name of the replication slot a WAL relay of a schema reads (`<schema>_relay`;
 * `outboxkit relay --source wal` without `--wal-slot`; docs/wal-source.md). Always a valid slot
 * name: a schema name (at most 40 characters of `[a-z0-9_]`) plus 6 characters. Slot names are
 * unique across the whole PostgreSQL cluster, not per database: two databases of one cluster with
 * the same schema need `--wal-slot` for one of them.
 */
export function walSlotName(schema: string): string {
  return `${schema}_relay`;
}
