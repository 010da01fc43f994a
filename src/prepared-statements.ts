/**
 * When outboxkit may run one of its statements under its name (a named prepared statement, parsed
 * and planned once per connection) on a node-postgres client, and when it runs it unnamed instead.
 *
 * The hazard (case C33, a pooled connection whose session was reset): node-postgres remembers each
 * named statement it prepared in `client.connection.parsedStatements` (pg/lib/client.js,
 * `_handleParseComplete`) and never forgets one while the connection lives; for a name it lists
 * there it sends only Bind and Execute (pg/lib/query.js, `hasBeenParsed`). A session reset on the
 * server (`DEALLOCATE ALL` or `DISCARD ALL`: a pooler's reset query, an application's release hook)
 * removes the statement but not that entry, so the next use is a Bind of a statement that does not
 * exist: SQLSTATE 26000, which aborts the transaction it runs in (the caller's, for `enqueue()`).
 * Retrying cannot help: the transaction is already lost.
 *
 * What outboxkit does instead: before it first names a statement on a connection, it listens to that
 * connection's CommandComplete messages, which carry the tag of every command the session ran
 * through that client, whoever sent it (the pool's reset, the application, drizzle):
 * - `DEALLOCATE ALL` or `DISCARD ALL`: the server holds no prepared statement any more, so
 *   outboxkit's names are deleted from `parsedStatements`, and node-postgres parses them again on
 *   their next use (it decides at the moment it sends a query, which in its default, non-pipelined
 *   mode is after the reset's CommandComplete: the client sends one query at a time);
 * - `DEALLOCATE` of one statement (the tag does not say which): outboxkit no longer names statements
 *   on that connection (unnamed: parsed every time, always safe) until the next `DEALLOCATE ALL` or
 *   `DISCARD ALL` makes the state known again.
 * So outboxkit names a statement only where it has seen every command that could have removed it.
 * Everywhere else it runs the statement unnamed: a client in pipeline mode (queries are sent before
 * the earlier ones complete, so a reset's tag may come too late), a client without node-postgres's
 * `connection` (pg-native, another driver, an object with a `query()` method), and a connection on
 * which outboxkit's names were parsed before any copy of outboxkit listened.
 *
 * What stays outside what a client can see: a server-side pooler that resets or swaps the server
 * session behind a live client connection (PgBouncer in transaction mode without
 * `max_prepared_statements`), and `DEALLOCATE` run inside a server-side function. PgBouncer 1.21+
 * with `max_prepared_statements` set tracks protocol-level named statements itself, per server
 * connection, and clears its tracking on the CommandComplete of `DEALLOCATE ALL` or `DISCARD ALL`
 * (the same signal). See docs/runbooks.md, "PostgreSQL failover and transaction-pooling proxies".
 */

/** The prefix of every statement name outboxkit gives (`statementName()`, the idempotency store's). */
export const STATEMENT_NAME_PREFIX = 'outboxkit_';

/**
 * The watch of one connection, shared by every copy of outboxkit in the process (an application may
 * load two): a copy that finds it knows that another listens already.
 */
const WATCH = Symbol.for('outboxkit.preparedStatementWatch');

interface Watch {
  /** Whether outboxkit's entries in `parsedStatements` match what the session holds. */
  trusted: boolean;
}

/** The part of node-postgres's Connection (pg/lib/connection.js) this module relies on. */
interface PgConnection {
  parsedStatements: Record<string, string>;
  submittedNamedStatements?: Record<string, string>;
  on(event: 'commandComplete', listener: (message: { text?: unknown }) => void): unknown;
  [WATCH]?: Watch;
}

function isPgConnection(value: unknown): value is PgConnection {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as { on?: unknown }).on === 'function' &&
    typeof (value as { parsedStatements?: unknown }).parsedStatements === 'object' &&
    (value as { parsedStatements?: unknown }).parsedStatements !== null
  );
}

function hasOutboxkitName(statements: Record<string, string> | undefined): boolean {
  if (statements === undefined) return false;
  for (const name in statements) if (name.startsWith(STATEMENT_NAME_PREFIX)) return true;
  return false;
}

function forgetOutboxkitNames(statements: Record<string, string>): void {
  for (const name of Object.keys(statements)) {
    if (name.startsWith(STATEMENT_NAME_PREFIX)) delete statements[name];
  }
}

/** Reacts to the tag of a command the session completed (PostgreSQL's CommandComplete message). */
function onCommandComplete(connection: PgConnection, watch: Watch, tag: unknown): void {
  if (tag === 'DEALLOCATE ALL' || tag === 'DISCARD ALL') {
    forgetOutboxkitNames(connection.parsedStatements);
    watch.trusted = true;
  } else if (tag === 'DEALLOCATE') {
    watch.trusted = false;
  }
}

function watchOf(connection: PgConnection): Watch {
  let watch = connection[WATCH];
  if (watch === undefined) {
    // Names parsed before anyone listened: whether a reset removed them since is unknown.
    const w: Watch = {
      trusted: !hasOutboxkitName(connection.parsedStatements) && !hasOutboxkitName(connection.submittedNamedStatements),
    };
    connection.on('commandComplete', (message) => onCommandComplete(connection, w, message?.text));
    Object.defineProperty(connection, WATCH, { value: w });
    watch = w;
  }
  return watch;
}

/**
 * The name under which `client` may run one of outboxkit's statements: `name` where outboxkit sees
 * every command that could remove the statement from the session (see the module's comment), else
 * `undefined` (run it unnamed). Safe to call for every statement: after the first call on a
 * connection it costs a property read.
 *
 * @param client - a node-postgres `Client`/`PoolClient`, or any object with a `query()` method.
 * @param name - the statement's name (`outboxkit_...`), or `undefined` for a one-off statement.
 */
export function preparedStatementName(client: unknown, name: string | undefined): string | undefined {
  if (name === undefined || typeof client !== 'object' || client === null) return undefined;
  if ((client as { pipeline?: unknown }).pipeline === true) return undefined;
  const connection = (client as { connection?: unknown }).connection;
  if (!isPgConnection(connection)) return undefined;
  return watchOf(connection).trusted ? name : undefined;
}
