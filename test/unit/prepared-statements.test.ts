/**
 * C33 (a pooled connection whose session was reset): when outboxkit names its statements on a
 * node-postgres client, on a fake of the two parts of pg's Connection it relies on (the
 * `parsedStatements` map and the CommandComplete event). test/c33-reset-session.test.ts runs the
 * same against PostgreSQL.
 */
import { EventEmitter } from 'node:events';
import { describe, expect, it, vi } from 'vitest';
import { preparedStatementName } from '../../src/prepared-statements.js';

const NAME = 'outboxkit_enqueue_0123456789abcdef';

/** A client shaped like node-postgres's: `connection.parsedStatements` and CommandComplete events. */
function fakeClient(parsed: Record<string, string> = {}, options: { pipeline?: boolean } = {}) {
  const connection = Object.assign(new EventEmitter(), {
    parsedStatements: { ...parsed },
    submittedNamedStatements: {} as Record<string, string>,
  });
  return {
    connection,
    pipeline: options.pipeline ?? false,
    /** The session completed a command with this tag. */
    complete(tag: string) {
      connection.emit('commandComplete', { name: 'commandComplete', text: tag });
    },
    /** node-postgres parsed `name` on this connection (its ParseComplete). */
    parse(name: string) {
      connection.parsedStatements[name] = 'SELECT 1';
    },
  };
}

describe('C33 preparedStatementName', () => {
  it('names the statement on a node-postgres client, and keeps it named across other commands', () => {
    const client = fakeClient();
    expect(preparedStatementName(client, NAME)).toBe(NAME);
    client.parse(NAME);
    for (const tag of ['BEGIN', 'INSERT 0 1', 'COMMIT', 'DISCARD PLANS', 'DISCARD TEMP', 'RESET', 'SET']) {
      client.complete(tag);
    }
    expect(client.connection.parsedStatements[NAME]).toBeDefined();
    expect(preparedStatementName(client, NAME)).toBe(NAME);
    expect(client.connection.listenerCount('commandComplete')).toBe(1);
  });

  it.each(['DEALLOCATE ALL', 'DISCARD ALL'])(
    '%s makes node-postgres parse outboxkit statements again, and leaves the application’s entries alone',
    (tag) => {
      const client = fakeClient({ app_statement: 'SELECT 2' });
      expect(preparedStatementName(client, NAME)).toBe(NAME);
      client.parse(NAME);
      client.complete(tag);
      expect(client.connection.parsedStatements).toEqual({ app_statement: 'SELECT 2' });
      expect(preparedStatementName(client, NAME)).toBe(NAME);
    },
  );

  it('after a DEALLOCATE of one statement (which one, the tag does not say) it runs unnamed until the next DEALLOCATE ALL or DISCARD ALL', () => {
    const client = fakeClient();
    preparedStatementName(client, NAME);
    client.parse(NAME);
    client.complete('DEALLOCATE');
    expect(preparedStatementName(client, NAME)).toBeUndefined();
    // The entry stays: had the DEALLOCATE removed another statement, parsing this one again
    // would fail with "already exists" (42P05).
    expect(client.connection.parsedStatements[NAME]).toBeDefined();
    client.complete('DISCARD ALL');
    expect(client.connection.parsedStatements[NAME]).toBeUndefined();
    expect(preparedStatementName(client, NAME)).toBe(NAME);
  });

  it('a connection on which outboxkit names were parsed before anyone listened runs unnamed until a full reset', () => {
    const client = fakeClient({ [NAME]: 'SELECT 1' });
    expect(preparedStatementName(client, NAME)).toBeUndefined();
    client.complete('DEALLOCATE ALL');
    expect(preparedStatementName(client, NAME)).toBe(NAME);
  });

  it('another copy of outboxkit in the process shares the one listener (and trusts the names the first parsed)', async () => {
    const client = fakeClient();
    preparedStatementName(client, NAME);
    client.parse(NAME);
    vi.resetModules();
    const copy = await import('../../src/prepared-statements.js');
    expect(copy.preparedStatementName).not.toBe(preparedStatementName);
    expect(copy.preparedStatementName(client, NAME)).toBe(NAME);
    expect(client.connection.listenerCount('commandComplete')).toBe(1);
    client.complete('DEALLOCATE');
    expect(copy.preparedStatementName(client, NAME)).toBeUndefined();
  });

  it('runs unnamed on a pipelined client, on an object without pg’s connection, and for a one-off statement', () => {
    expect(preparedStatementName(fakeClient({}, { pipeline: true }), NAME)).toBeUndefined();
    expect(preparedStatementName({ query: () => undefined }, NAME)).toBeUndefined();
    expect(preparedStatementName({ connection: { on() {} } }, NAME)).toBeUndefined();
    expect(preparedStatementName(null, NAME)).toBeUndefined();
    expect(preparedStatementName(fakeClient(), undefined)).toBeUndefined();
  });
});
