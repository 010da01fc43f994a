/**
 * src/drizzle-entity.ts recognises drizzle transactions without loading drizzle-orm: its answers
 * are drizzle-orm's own `is(value, PgTransaction)` for the handles an application may pass
 * (transactions of both drivers, nested ones, top-level databases, pools, clients, other values).
 * No connection is opened: drizzle's classes are built on handles that have not connected yet.
 */
import { is } from 'drizzle-orm';
import { drizzle as drizzleNodePg, NodePgTransaction, type NodePgDatabase } from 'drizzle-orm/node-postgres';
import { PgDatabase, PgTransaction } from 'drizzle-orm/pg-core';
import { drizzle as drizzlePostgresJs, PostgresJsTransaction, type PostgresJsDatabase } from 'drizzle-orm/postgres-js';
import pg from 'pg';
import postgres from 'postgres';
import { afterAll, describe, expect, it } from 'vitest';
import { hasDrizzleEntityKind, isDrizzleTransaction } from '../../src/drizzle-entity.js';
import { joinTransaction } from '../../src/database.js';

const pool = new pg.Pool({ connectionString: 'postgres://nobody@127.0.0.1:1/none' });
const client = new pg.Client({ connectionString: 'postgres://nobody@127.0.0.1:1/none' });
const sqlClient = postgres('postgres://nobody@127.0.0.1:1/none', { max: 1 });
const nodePgDb = drizzleNodePg(pool);
const nodePgClientDb = drizzleNodePg(client);
const postgresJsDb = drizzlePostgresJs(sqlClient);

afterAll(async () => {
  await pool.end();
  await sqlClient.end();
});

/** drizzle's internals the transaction constructors take (a database's own dialect and session). */
function parts(db: NodePgDatabase | PostgresJsDatabase) {
  const { dialect, session } = db as unknown as { dialect: never; session: never };
  return { dialect, session };
}

/** drizzle-orm's entityKind symbol, as any copy of drizzle-orm registers it. */
const ENTITY_KIND: unique symbol = Symbol.for('drizzle:entityKind');

class SubTransaction extends NodePgTransaction<never, never> {}

function handles(): [string, unknown][] {
  const n = parts(nodePgDb);
  const p = parts(postgresJsDb);
  return [
    ['node-postgres transaction', new NodePgTransaction(n.dialect, n.session, undefined)],
    ['node-postgres nested transaction (savepoint)', new NodePgTransaction(n.dialect, n.session, undefined, 1)],
    ['postgres-js transaction', new PostgresJsTransaction(p.dialect, p.session, undefined)],
    [
      'a subclass of a transaction, without an entity kind of its own',
      new SubTransaction(n.dialect, n.session, undefined),
    ],
    ['node-postgres database on a pool', nodePgDb],
    ['node-postgres database on a client', nodePgClientDb],
    ['postgres-js database', postgresJsDb],
    ['pg.Pool', pool],
    ['pg.Client', client],
    ['postgres-js sql', sqlClient],
    ['plain object', { query: () => undefined }],
    ['null', null],
    ['undefined', undefined],
    ['a function', () => undefined],
    ['a string', 'PgTransaction'],
    // Another copy of drizzle-orm: its classes carry the same registered symbol.
    [
      'a transaction class of another copy',
      new (class {
        static [ENTITY_KIND] = 'PgTransaction';
      })(),
    ],
  ];
}

describe('hasDrizzleEntityKind: drizzle-orm entity kinds without drizzle-orm', () => {
  it.each(handles())('%s: the same answer as drizzle-orm is(value, PgTransaction)', (_name, value) => {
    expect(isDrizzleTransaction(value)).toBe(is(value, PgTransaction));
    expect(hasDrizzleEntityKind(value, 'PgTransaction')).toBe(is(value, PgTransaction));
    expect(hasDrizzleEntityKind(value, 'PgDatabase')).toBe(is(value, PgDatabase));
  });

  it('says yes to the transactions and no to the rest', () => {
    const yes = handles()
      .filter(([, v]) => isDrizzleTransaction(v))
      .map(([name]) => name);
    expect(yes).toEqual([
      'node-postgres transaction',
      'node-postgres nested transaction (savepoint)',
      'postgres-js transaction',
      'a subclass of a transaction, without an entity kind of its own',
      'a transaction class of another copy',
    ]);
  });

  it('a value without a prototype is no drizzle object (drizzle-orm is() throws on it)', () => {
    const bare = Object.create(null) as object;
    expect(isDrizzleTransaction(bare)).toBe(false);
    expect(() => is(bare, PgTransaction)).toThrow(TypeError);
  });

  it('joinTransaction takes a drizzle transaction and refuses a top-level drizzle database', () => {
    const n = parts(nodePgDb);
    expect(typeof joinTransaction(new NodePgTransaction(n.dialect, n.session, undefined), 'test').query).toBe(
      'function',
    );
    expect(() => joinTransaction(nodePgDb as never, 'test')).toThrow(/top-level drizzle database/);
    expect(() => joinTransaction(postgresJsDb as never, 'test')).toThrow(/top-level drizzle database/);
  });
});
