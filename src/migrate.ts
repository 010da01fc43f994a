/**
 * Applies outboxkit's drizzle-kit migrations (migrations/) to a PostgreSQL database.
 *
 * Why not drizzle's own `migrate()`: it takes no lock, so two processes starting at once both try
 * to apply the same files, and it cannot move the tables to another schema. This migrator:
 * - holds a session advisory lock on a dedicated connection (never a pooled one, which could hand
 *   the lock's session to someone else) while it works, so concurrent runs wait and then find
 *   nothing left to do;
 * - rewrites the schema identifier that drizzle-kit wrote (`"outboxkit"`) to the configured one;
 * - applies each migration in its own transaction and records it with the file's SHA-256, refusing
 *   to continue when an applied file was edited afterwards, or when a table that an applied
 *   migration created was dropped since (it never applies a recorded migration again);
 * - checks the server version first (PostgreSQL 13 or later).
 */
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import pg from 'pg';
import {
  InvalidOptionsError,
  MigrationError,
  SchemaMissingError,
  UnsupportedServerError,
  optionNames,
  refuseUnknownOptions,
} from './errors.js';
import { DEFAULT_SCHEMA } from './constants.js';
import { quoteSchema, walPublicationName } from './schema-name.js';
import { noopLogger, type Logger } from './logger.js';
import { checkReplicationName, ensurePublication } from './wal-publication.js';

/** Oldest PostgreSQL supported: 13 (`pg_current_xact_id`, `hashtextextended`, ...). */
export const MIN_SERVER_VERSION_NUM = 130000;

/** Options of {@link migrate}. */
export interface MigrateOptions {
  /** PostgreSQL connection string. Required unless `client` is given. */
  connectionString?: string;
  /**
   * A connected, dedicated `pg.Client` (not a pooled client) to run on. outboxkit does not end it.
   */
  client?: pg.Client;
  /** Schema holding outboxkit's tables. @defaultValue 'outboxkit' */
  schema?: string;
  /** Folder with drizzle-kit's output. @defaultValue the migrations/ folder shipped with outboxkit */
  migrationsFolder?: string;
  /** Logger. @defaultValue no-op */
  logger?: Logger;
  /**
   * Also create the publication that streams the inserts of `<schema>.outbox_events` to a WAL
   * relay (`CREATE PUBLICATION … FOR TABLE … WITH (publish = 'insert')`; docs/wal-source.md), for
   * writers with `createOutbox({ source: 'wal' })`. `true` names it `<schema>_outbox_events`
   * ({@link walPublicationName}); a string names it (1-63 characters of `[a-z0-9_]`, not starting
   * with a digit: the relay's replication connection cannot quote it). A publication of that name
   * that exists already is kept as it is (change it with `ALTER PUBLICATION`), so this is
   * idempotent and safe from several processes. Needs the ownership of the table (the migrating
   * role has it). The server must run `wal_level = logical`: otherwise migrate() throws an
   * `UnsupportedServerError` before it writes anything. The replication
   * slot is not created here: it is the WAL relay's (`outboxkit relay --source wal` creates it at
   * start; an embedded `createWalRelay()` needs `ensureLogicalSlot()` first).
   * @defaultValue false
   */
  walPublication?: boolean | string;
}

/** Every option name of {@link MigrateOptions}; the compiler keeps it in step with the interface. */
const MIGRATE_OPTION_NAMES = optionNames<MigrateOptions>({
  connectionString: true,
  client: true,
  schema: true,
  migrationsFolder: true,
  logger: true,
  walPublication: true,
});

/** What {@link migrate} did. */
export interface MigrateResult {
  /** Tags of the migrations applied by this call, in order (empty when up to date). */
  applied: string[];
  /** The server's `server_version_num`, for example 150020. */
  serverVersionNum: number;
  /** With `walPublication`: the publication's name, and whether this call created it. */
  walPublication?: { name: string; created: boolean };
}

interface JournalEntry {
  idx: number;
  tag: string;
}

/** A migration of the journal, its SQL as drizzle-kit wrote it (schema `"outboxkit"`). */
interface MigrationFile {
  tag: string;
  text: string;
  sha256: string;
}

/** The migrations/ folder that ships with this package (source or built layout). */
export function defaultMigrationsFolder(): string {
  const here = path.dirname(fileURLToPath(import.meta.url));
  for (const candidate of [path.join(here, '..', 'migrations'), path.join(here, '..', '..', 'migrations')]) {
    if (existsSync(path.join(candidate, 'meta', '_journal.json'))) return candidate;
  }
  throw new MigrationError(`outboxkit's migrations folder was not found next to ${here}.`);
}

function readJournal(folder: string): JournalEntry[] {
  const file = path.join(folder, 'meta', '_journal.json');
  try {
    const journal = JSON.parse(readFileSync(file, 'utf8')) as { entries?: JournalEntry[] };
    return [...(journal.entries ?? [])].sort((a, b) => a.idx - b.idx);
  } catch (err) {
    throw new MigrationError(`Cannot read the migration journal ${file}.`, { cause: err });
  }
}

/**
 * Rewrites the schema identifier drizzle-kit wrote and makes `CREATE SCHEMA` tolerate an existing
 * schema (the migrator creates it first, and users may point outboxkit at one they own).
 */
export function rewriteSchema(sqlText: string, quotedSchema: string): string {
  const generated = `"${DEFAULT_SCHEMA}"`;
  return sqlText
    .replaceAll(`CREATE SCHEMA ${generated};`, `CREATE SCHEMA IF NOT EXISTS ${generated};`)
    .replaceAll(generated, quotedSchema);
}

/**
 * Applies every pending outboxkit migration.
 *
 * Safe to call from several processes at once: they serialise on an advisory lock and the later
 * ones apply nothing.
 *
 * @returns the tags applied by this call.
 * @throws {@link UnsupportedServerError} when the server is older than PostgreSQL 13.
 * @throws {@link MigrationError} when a migration fails (that migration is rolled back; earlier
 *   ones stay), or an applied migration's file was changed since.
 * @throws {@link SchemaMissingError} when a table that an applied migration created is missing
 *   (dropped after it was migrated), before any pending migration is applied; the message names
 *   the tables and how to create them again.
 * @throws {@link InvalidOptionsError} on an unknown option name (a misspelt `schema` would
 *   otherwise migrate the default schema), an invalid schema name or a missing connection; nothing
 *   is connected then.
 */
export async function migrate(options: MigrateOptions = {}): Promise<MigrateResult> {
  refuseUnknownOptions(options ?? {}, MIGRATE_OPTION_NAMES, 'migrate');
  const schema = options.schema ?? DEFAULT_SCHEMA;
  quoteSchema(schema); // refuses an invalid name before anything connects
  const logger = options.logger ?? noopLogger;
  const folder = options.migrationsFolder ?? defaultMigrationsFolder();
  const publication = resolveWalPublication(options.walPublication, schema);
  if (!options.client && !options.connectionString) {
    throw new InvalidOptionsError('migrate() needs `connectionString` or a connected `client`.');
  }
  const client = options.client ?? new pg.Client({ connectionString: options.connectionString });
  const owned = !options.client;
  // Between statements an unheard 'error' (backend terminated) would crash the process; the next
  // statement fails instead, and migrate() rejects.
  const onError = (err: Error) => logger.warn({ err }, 'migration connection failed');
  client.on('error', onError);
  if (owned) await client.connect();
  try {
    const { rows } = await client.query<{ v: string }>(`SELECT current_setting('server_version_num') AS v`);
    const serverVersionNum = Number(rows[0]?.v);
    if (!(serverVersionNum >= MIN_SERVER_VERSION_NUM)) {
      throw new UnsupportedServerError(
        `PostgreSQL ${serverVersionNum} is too old: outboxkit needs PostgreSQL 13 or later.`,
      );
    }
    if (publication !== undefined) {
      // Checked before anything is written: on a server that cannot decode its WAL, WAL writers
      // would fill a table no WAL relay can ever read.
      const { rows: level } = await client.query<{ v: string }>(`SELECT current_setting('wal_level') AS v`);
      if (level[0]?.v !== 'logical') {
        throw new UnsupportedServerError(
          `migrate: walPublication needs wal_level = logical, and this server runs wal_level = ${level[0]?.v ?? 'unknown'}: ` +
            'set wal_level = logical in postgresql.conf and restart PostgreSQL, or migrate without walPublication (docs/wal-source.md).',
        );
      }
    }
    // One lock per schema: migrations of different schemas do not wait for each other.
    await client.query(`SELECT pg_advisory_lock(hashtextextended($1, 0))`, [`outboxkit:migrate:${schema}`]);
    try {
      const applied = await applyPending(client, schema, folder, logger);
      if (publication === undefined) return { applied, serverVersionNum };
      // Created after the table exists; ensurePublication() takes "already exists" as success, so a
      // second migrator (or a relay creating it) never makes this fail.
      const created = await ensurePublication(client, publication, [`${schema}.outbox_events`]);
      // The one line about the publication (the CLI logs none of its own). Its field is
      // `publication`, not `name`: a pino logger's own `name` comes first in the line, and a second
      // `name` key would make it JSON with a duplicate key.
      logger.info(
        { publication, created },
        created ? 'outboxkit WAL publication created' : 'outboxkit WAL publication exists already (kept as it is)',
      );
      return { applied, serverVersionNum, walPublication: { name: publication, created } };
    } finally {
      await client.query(`SELECT pg_advisory_unlock(hashtextextended($1, 0))`, [`outboxkit:migrate:${schema}`]);
    }
  } finally {
    client.off('error', onError);
    if (owned) await client.end();
  }
}

/**
 * The publication `walPublication` asks for, or `undefined` for none.
 *
 * @throws {@link InvalidOptionsError} on a value that is neither a boolean nor a valid name.
 */
function resolveWalPublication(option: unknown, schema: string): string | undefined {
  if (option === undefined || option === false) return undefined;
  if (option === true) return walPublicationName(schema);
  if (typeof option === 'string') return checkReplicationName(option, 'publication');
  throw new InvalidOptionsError(
    `migrate: walPublication must be true, false or a publication name, got ${typeof option}.`,
  );
}

async function applyPending(client: pg.Client, schema: string, folder: string, logger: Logger): Promise<string[]> {
  const quoted = quoteSchema(schema);
  await client.query(`CREATE SCHEMA IF NOT EXISTS ${quoted}`);
  await client.query(
    `CREATE TABLE IF NOT EXISTS ${quoted}.outboxkit_migrations (
       tag text PRIMARY KEY,
       sha256 text NOT NULL,
       applied_at timestamptz NOT NULL DEFAULT now()
     )`,
  );
  const done = new Map(
    (
      await client.query<{ tag: string; sha256: string }>(`SELECT tag, sha256 FROM ${quoted}.outboxkit_migrations`)
    ).rows.map((r) => [r.tag, r.sha256]),
  );
  const migrations: MigrationFile[] = readJournal(folder).map((entry) => {
    const text = readFileSync(path.join(folder, `${entry.tag}.sql`), 'utf8');
    return { tag: entry.tag, text, sha256: createHash('sha256').update(text).digest('hex') };
  });
  const recorded = migrations.filter((m) => done.has(m.tag));
  for (const { tag, sha256 } of recorded) {
    const previous = done.get(tag);
    if (previous !== sha256) {
      throw new MigrationError(
        `Migration ${tag} was changed after it was applied (sha256 ${previous} in the database, ${sha256} on disk); ` +
          'restore the original file and add a new migration instead.',
      );
    }
  }
  // Before the pending ones, which may change those tables.
  await refuseDroppedTables(client, schema, recorded);
  const applied: string[] = [];
  for (const { tag, text, sha256 } of migrations) {
    if (done.has(tag)) continue;
    const statements = rewriteSchema(text, quoted)
      .split('--> statement-breakpoint')
      .map((s) => s.trim())
      .filter((s) => s.length > 0);
    await client.query('BEGIN');
    try {
      for (const statement of statements) await client.query(statement);
      await client.query(`INSERT INTO ${quoted}.outboxkit_migrations (tag, sha256) VALUES ($1, $2)`, [tag, sha256]);
      await client.query('COMMIT');
    } catch (err) {
      await client.query('ROLLBACK');
      throw new MigrationError(`Migration ${tag} failed and was rolled back: ${(err as Error).message}`, {
        cause: err,
      });
    }
    logger.info({ tag }, 'outboxkit migration applied');
    applied.push(tag);
  }
  return applied;
}

/**
 * The tables a migration's SQL names (`"outboxkit"."<table>"`, as drizzle-kit writes them): with
 * `created`, only those it creates (`CREATE [UNLOGGED] TABLE`). Read from the text, never edited.
 */
function migrationTables(sqlText: string, options: { created?: boolean } = {}): string[] {
  const table = `"${DEFAULT_SCHEMA}"\\."([a-z0-9_]+)"`;
  const pattern = options.created ? `CREATE (?:UNLOGGED )?TABLE (?:IF NOT EXISTS )?${table}` : table;
  return [...new Set([...sqlText.matchAll(new RegExp(pattern, 'g'))].map((m) => m[1]!))];
}

/**
 * Refuses a schema where a table that a recorded migration created is missing (dropped after it was
 * migrated). migrate() never applies a recorded migration again, so it would otherwise call the
 * schema up to date while the writers, the relays and `outboxkit status` fail on the table.
 *
 * @throws {@link SchemaMissingError} naming the missing tables, the migrations that created them,
 *   and how to create them again: delete those migrations' records (and those of the later ones
 *   that change the tables) so that migrate() applies them again, when every table they name is
 *   missing; else restore the tables, or run those migrations' statements by hand.
 */
async function refuseDroppedTables(
  client: pg.Client,
  schema: string,
  recorded: readonly MigrationFile[],
): Promise<void> {
  const creator = new Map<string, string>();
  for (const m of recorded) for (const t of migrationTables(m.text, { created: true })) creator.set(t, m.tag);
  if (creator.size === 0) return;
  // Tables, partitioned tables included; read from the catalog, which any role may read.
  const { rows } = await client.query<{ name: string }>(
    `SELECT c.relname AS name FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')`,
    [schema],
  );
  const present = new Set(rows.map((r) => r.name));
  const missing = [...creator.keys()].filter((t) => !present.has(t));
  if (missing.length === 0) return;
  // What has to run again: the migrations that created the missing tables and those that changed them since.
  const again = recorded.filter((m) => migrationTables(m.text).some((t) => missing.includes(t)));
  // Those that also name a table still there cannot run again as a whole (its CREATE TABLE or ADD COLUMN would fail).
  const blocking = again.filter((m) => migrationTables(m.text).some((t) => present.has(t))).map((m) => m.tag);
  const quoted = quoteSchema(schema);
  const them = missing.length === 1 ? 'it' : 'them';
  const creators = [...new Set(missing.map((t) => creator.get(t)!))];
  const tags = again.map((m) => m.tag);
  const fix =
    blocking.length === 0
      ? `delete the record${tags.length === 1 ? '' : 's'} of ${tags.join(', ')} (DELETE FROM ${quoted}.outboxkit_migrations ` +
        `WHERE tag IN (${tags.map((t) => `'${t}'`).join(', ')})) and run \`outboxkit migrate --schema ${schema}\` ` +
        'or migrate() again'
      : `run the statements that create and change ${them} in ${tags.map((t) => `migrations/${t}.sql`).join(', ')} ` +
        `(in outboxkit's package)${schema === DEFAULT_SCHEMA ? '' : `, with ${quoted} in place of "${DEFAULT_SCHEMA}"`}: ` +
        `${blocking.join(', ')} also ${blocking.length === 1 ? 'names' : 'name'} tables that are still there, ` +
        `so ${blocking.length === 1 ? 'it' : 'they'} cannot run again as a whole`;
  throw new SchemaMissingError(
    `outboxkit's table${missing.length === 1 ? '' : 's'} ${missing.map((t) => `${quoted}.${t}`).join(', ')} ` +
      `${missing.length === 1 ? 'is' : 'are'} missing, though ` +
      `${creators.length === 1 ? `migration ${creators[0]}, which created ${them}, is` : `migrations ${creators.join(', ')}, which created ${them}, are`} ` +
      `recorded as applied in ${quoted}.outboxkit_migrations: dropped since, and migrate never applies a recorded ` +
      `migration again. Restore ${them} from a backup, or, to create ${them} again empty, ${fix}.`,
  );
}
