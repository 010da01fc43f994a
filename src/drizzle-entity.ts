/**
 * Recognising drizzle-orm objects without loading drizzle-orm.
 *
 * outboxkit accepts drizzle handles but must not import drizzle-orm at module load: on Node.js 24
 * loading `drizzle-orm` and `drizzle-orm/pg-core` takes about 1.2 s (0.19 s on Node.js 20), which
 * every process paid (the CLI, the relay) even when no drizzle handle is ever used.
 * test/unit/lazy-drizzle.test.ts checks that the runtime entry points load no drizzle-orm module.
 */

/**
 * drizzle-orm's `entityKind` symbol (drizzle-orm/entity.js: `Symbol.for("drizzle:entityKind")`): a
 * registered symbol, the same in every copy of drizzle-orm, so outboxkit reads it without importing
 * drizzle.
 */
const DRIZZLE_ENTITY_KIND = Symbol.for('drizzle:entityKind');

/**
 * Whether `value` is an instance of the drizzle-orm class whose entity kind is `kind` (or of a
 * subclass), as drizzle-orm's own `is(value, Class)` answers, without loading drizzle-orm.
 *
 * The protocol it relies on (drizzle-orm 0.44 and 0.45, the peer range; read in
 * drizzle-orm 0.45.4's entity.js): each drizzle class has a static `[Symbol.for('drizzle:entityKind')]`
 * holding its name (`PgTransaction`, `NodePgTransaction`, `PgDatabase`, ...), and `is()` walks from
 * the value's constructor up the chain of its parent classes, comparing each class's (own or
 * inherited) entity kind with the class asked about. This does the same walk. `is()` tries
 * `value instanceof Class` first, which only adds a value whose prototype chain holds the class but
 * whose `constructor` does not lead to it; a value without a prototype (`Object.create(null)`), on
 * which `is()` throws a TypeError, is simply not a drizzle object here.
 *
 * For `kind = 'PgTransaction'`: true for a drizzle transaction of any PostgreSQL driver
 * (node-postgres `NodePgTransaction`, postgres-js `PostgresJsTransaction`, and their nested
 * savepoint transactions); false for a top-level drizzle database (`PgDatabase`), a `pg.Pool`, a
 * `pg` client, a plain object, `null` (test/unit/drizzle-entity.test.ts compares it with `is()`).
 */
export function hasDrizzleEntityKind(value: unknown, kind: string): boolean {
  if (!value || typeof value !== 'object') return false;
  const proto: unknown = Object.getPrototypeOf(value);
  if (proto === null) return false;
  let cls: unknown = (proto as { constructor?: unknown }).constructor;
  while (cls !== null && cls !== undefined && (typeof cls === 'function' || typeof cls === 'object')) {
    if (DRIZZLE_ENTITY_KIND in cls && (cls as Record<symbol, unknown>)[DRIZZLE_ENTITY_KIND] === kind) return true;
    cls = Object.getPrototypeOf(cls);
  }
  return false;
}

/** Whether `value` is a drizzle-orm PostgreSQL transaction (`is(value, PgTransaction)`), without loading drizzle-orm. */
export function isDrizzleTransaction(value: unknown): boolean {
  return hasDrizzleEntityKind(value, 'PgTransaction');
}
