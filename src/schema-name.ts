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
