/**
 * The WAL relay's start-up check of the PostgreSQL server (docs/wal-source.md, "Start-up checks"):
 * what the server runs and what the relay's role may do, read in one query, before the relay
 * touches its slot or its lease. Settings are PostgreSQL's (documentation, "Server Configuration",
 * runtime-config-wal and runtime-config-replication).
 *
 * {@link assessWalServer} is the pure rule (settings and options in, errors and log notes out);
 * {@link checkWalServer} reads the settings and throws the first error. The notes are logged by
 * the caller, once it holds the slot (a standby polling the lease would repeat them at every try).
 */
import type { Queryable } from '../../src/database.js';
import {
  InvalidOptionsError,
  PermissionDeniedError,
  UnsupportedServerError,
  type OutboxkitError,
} from '../../src/errors.js';
import type { Logger } from '../../src/logger.js';

/** What the check reads from the server, for the session's role (`current_user`). */
export interface WalServerSettings {
  /** `wal_level`: `minimal`, `replica` or `logical`. */
  walLevel: string;
  /** The role the relay's sessions run as (`current_user`). */
  role: string;
  /** The role's `REPLICATION` attribute (`pg_roles.rolreplication`). */
  rolReplication: boolean;
  /** The role's `SUPERUSER` attribute (`pg_roles.rolsuper`). */
  rolSuper: boolean;
  /**
   * Whether the role is a member of `rds_replication`: on Amazon RDS and Aurora that membership,
   * not the attribute, lets a role replicate (false where no such role exists).
   */
  rdsReplication: boolean;
  /** `max_wal_senders`; null when unknown. */
  maxWalSenders: number | null;
  /** `max_replication_slots`; null when unknown. */
  maxReplicationSlots: number | null;
  /** `wal_sender_timeout` as this role's sessions see it, in ms; 0 disables it; null when unknown. */
  walSenderTimeoutMs: number | null;
  /** `max_slot_wal_keep_size`, in MB; -1 (PostgreSQL's default) is no limit; null when unknown. */
  maxSlotWalKeepSizeMb: number | null;
}

/** A line the relay logs about the server: not an error, but worth an operator's attention. */
export interface WalServerNote {
  level: 'info' | 'warn';
  /** The log entry's fields (the settings' values, with their units in the names). */
  fields: Record<string, unknown>;
  message: string;
}

/** What {@link assessWalServer} finds: errors (the first is thrown) and notes to log. */
export interface WalServerAssessment {
  errors: OutboxkitError[];
  notes: WalServerNote[];
}

/** The options of the relay that the check compares with the server's settings. */
export interface WalServerCheckOptions {
  /** The relay's `statusIntervalMs` (`--wal-status-interval-ms`), in ms. */
  statusIntervalMs: number;
}

/**
 * Every setting in one round trip. Numbers come from `pg_settings.setting`, in the setting's base
 * unit (`wal_sender_timeout` in ms, `max_slot_wal_keep_size` in MB), since `current_setting()`
 * prints them with a unit of its choosing (`1min`, `1GB`); both give the session's values, so a
 * `wal_sender_timeout` set for the role, the database or the connection (`options: '-c …'`, which
 * the replication connection shares) is the one seen. A setting this server lacks reads null.
 */
const WAL_SERVER_SQL = `SELECT current_setting('wal_level') AS wal_level,
       current_user::text AS role,
       coalesce(r.rolreplication, false) AS rol_replication,
       coalesce(r.rolsuper, false) AS rol_super,
       EXISTS (SELECT 1 FROM pg_roles g
                WHERE g.rolname = 'rds_replication' AND pg_has_role(current_user, g.oid, 'MEMBER')) AS rds_replication,
       s.max_wal_senders, s.max_replication_slots, s.wal_sender_timeout, s.max_slot_wal_keep_size
  FROM (SELECT (max(setting) FILTER (WHERE name = 'max_wal_senders'))::int AS max_wal_senders,
               (max(setting) FILTER (WHERE name = 'max_replication_slots'))::int AS max_replication_slots,
               (max(setting) FILTER (WHERE name = 'wal_sender_timeout'))::int AS wal_sender_timeout,
               (max(setting) FILTER (WHERE name = 'max_slot_wal_keep_size'))::int AS max_slot_wal_keep_size
          FROM pg_settings
         WHERE name IN ('max_wal_senders', 'max_replication_slots', 'wal_sender_timeout', 'max_slot_wal_keep_size')) s
  LEFT JOIN pg_roles r ON r.rolname = current_user`;

interface WalServerRow {
  wal_level: string;
  role: string;
  rol_replication: boolean;
  rol_super: boolean;
  rds_replication: boolean;
  max_wal_senders: number | null;
  max_replication_slots: number | null;
  wal_sender_timeout: number | null;
  max_slot_wal_keep_size: number | null;
}

/** Reads the server's settings and the session role's attributes, in one query. */
export async function readWalServerSettings(db: Queryable): Promise<WalServerSettings> {
  const { rows } = await db.query<WalServerRow>(WAL_SERVER_SQL);
  // One row always: an aggregate without GROUP BY, and a LEFT JOIN.
  const row = rows[0]!;
  return {
    walLevel: row.wal_level,
    role: row.role,
    rolReplication: row.rol_replication,
    rolSuper: row.rol_super,
    rdsReplication: row.rds_replication,
    maxWalSenders: row.max_wal_senders,
    maxReplicationSlots: row.max_replication_slots,
    walSenderTimeoutMs: row.wal_sender_timeout,
    maxSlotWalKeepSizeMb: row.max_slot_wal_keep_size,
  };
}

/** `name` as an SQL identifier: as it is when plain lower case, else double-quoted. */
function sqlIdentifier(name: string): string {
  return /^[a-z_][a-z0-9_]*$/.test(name) ? name : `"${name.replace(/"/g, '""')}"`;
}

/** The error of a server whose `wal_level` is `level`, not `logical` (also {@link requireLogicalWal}'s). */
function walLevelError(level: string | undefined): UnsupportedServerError {
  return new UnsupportedServerError(
    `The WAL relay needs wal_level = logical, and this server runs wal_level = ${level ?? 'unknown'}: ` +
      'set wal_level = logical in postgresql.conf and restart PostgreSQL, or run the table relay (docs/wal-source.md).',
  );
}

/**
 * Judges `settings` for a WAL relay with `options` (pure). The errors, in the order they are
 * thrown (only the first is):
 * 1. `wal_level` is not `logical`: {@link UnsupportedServerError} (a restart fixes it).
 * 2. The role may not replicate (neither `REPLICATION` nor `SUPERUSER`, nor a member of RDS's
 *    `rds_replication`): {@link PermissionDeniedError} naming the role and
 *    `ALTER ROLE <role> WITH REPLICATION`.
 * 3. `max_wal_senders` or `max_replication_slots` is 0: {@link UnsupportedServerError} naming the
 *    settings at 0 (the relay needs one of each; a restart fixes them).
 * 4. `wal_sender_timeout` (ms) is on (above 0) and `statusIntervalMs` (ms) is not below it: the
 *    walsender would end a relay that waits (a send in flight, Kafka down), since its status
 *    updates are then all that keeps the connection alive: {@link InvalidOptionsError} naming both
 *    values, `statusIntervalMs` / `--wal-status-interval-ms` and `wal_sender_timeout`.
 *
 * The notes: a warning when `statusIntervalMs` is above half of `wal_sender_timeout` (one late
 * update from the end); a warning when `max_slot_wal_keep_size` is -1 (a slot whose relay is down
 * retains WAL without bound and can fill the disk), else an info line with its value in MB (a slot
 * past it is invalidated and the relay resyncs from the outbox table). A setting read as null is
 * not judged.
 */
export function assessWalServer(settings: WalServerSettings, options: WalServerCheckOptions): WalServerAssessment {
  const errors: OutboxkitError[] = [];
  const notes: WalServerNote[] = [];
  if (settings.walLevel !== 'logical') errors.push(walLevelError(settings.walLevel));
  if (!settings.rolReplication && !settings.rolSuper && !settings.rdsReplication) {
    const role = sqlIdentifier(settings.role);
    errors.push(
      new PermissionDeniedError(
        `The database role ${settings.role} may not start replication (it has neither REPLICATION nor SUPERUSER), ` +
          `and the WAL relay reads its slot through a replication connection: as a superuser, run ` +
          `ALTER ROLE ${role} WITH REPLICATION (on Amazon RDS or Aurora: GRANT rds_replication TO ${role}) ` +
          '(docs/wal-source.md, "What it needs from PostgreSQL").',
      ),
    );
  }
  const atZero = (
    [
      ['max_wal_senders', settings.maxWalSenders],
      ['max_replication_slots', settings.maxReplicationSlots],
    ] as const
  ).filter(([, value]) => value === 0);
  if (atZero.length > 0) {
    const names = atZero.map(([name]) => name);
    errors.push(
      new UnsupportedServerError(
        `The WAL relay needs a WAL sender and a replication slot, and this server runs ${names.map((n) => `${n} = 0`).join(' and ')}: ` +
          `raise ${names.join(' and ')} in postgresql.conf (each running relay takes one WAL sender and its slot one ` +
          'replication slot, beside any other replication client) and restart PostgreSQL (docs/wal-source.md, "Start-up checks").',
      ),
    );
  }
  const timeoutMs = settings.walSenderTimeoutMs;
  const intervalMs = options.statusIntervalMs;
  if (timeoutMs !== null && timeoutMs > 0) {
    const fix =
      `statusIntervalMs (--wal-status-interval-ms) to at most ${Math.floor(timeoutMs / 2)} ms, or raise ` +
      "wal_sender_timeout (postgresql.conf, ALTER ROLE or ALTER DATABASE ... SET, or the connection's options)";
    if (intervalMs >= timeoutMs) {
      errors.push(
        new InvalidOptionsError(
          `statusIntervalMs (--wal-status-interval-ms) is ${intervalMs} ms, not below the server's wal_sender_timeout ` +
            `of ${timeoutMs} ms: while the relay waits (a send in flight, Kafka down) its status updates are all that ` +
            'keeps the replication connection alive, and the walsender ends one silent for wal_sender_timeout. ' +
            `Lower ${fix} (docs/wal-source.md, "Start-up checks").`,
        ),
      );
    } else if (intervalMs > timeoutMs / 2) {
      notes.push({
        level: 'warn',
        fields: { statusIntervalMs: intervalMs, walSenderTimeoutMs: timeoutMs },
        message:
          `statusIntervalMs (--wal-status-interval-ms) is ${intervalMs} ms, above half of the server's ` +
          `wal_sender_timeout (${timeoutMs} ms): one late status update and the walsender ends a relay that waits; ` +
          `lower ${fix}`,
      });
    }
  }
  const keepMb = settings.maxSlotWalKeepSizeMb;
  if (keepMb === -1) {
    notes.push({
      level: 'warn',
      fields: { maxSlotWalKeepSizeMb: keepMb },
      message:
        "max_slot_wal_keep_size is -1 (no limit): while no relay reads the slot, it retains the server's WAL without " +
        "bound and can fill the server's disk; set max_slot_wal_keep_size in postgresql.conf (a reload applies it) to " +
        'what the disk can spare: past it PostgreSQL invalidates the slot and the relay resyncs from the outbox table ' +
        '(docs/wal-source.md, "Slot loss and resync")',
    });
  } else if (keepMb !== null) {
    notes.push({
      level: 'info',
      fields: { maxSlotWalKeepSizeMb: keepMb },
      message:
        `max_slot_wal_keep_size is ${keepMb} MB: a slot retaining more WAL is invalidated by PostgreSQL, and the relay ` +
        'then resyncs from the outbox table (docs/wal-source.md, "Slot loss and resync")',
    });
  }
  return { errors, notes };
}

/**
 * The WAL relay's start-up check: reads the server's settings and the role's attributes in one
 * query ({@link readWalServerSettings}) and judges them ({@link assessWalServer}).
 *
 * @returns the notes to log ({@link logWalServerNotes}).
 * @throws the first error of {@link assessWalServer}: {@link UnsupportedServerError} (`wal_level`,
 *   `max_wal_senders`, `max_replication_slots`), {@link PermissionDeniedError} (no `REPLICATION`),
 *   {@link InvalidOptionsError} (`statusIntervalMs` against `wal_sender_timeout`); none retriable.
 */
export async function checkWalServer(db: Queryable, options: WalServerCheckOptions): Promise<WalServerNote[]> {
  const { errors, notes } = assessWalServer(await readWalServerSettings(db), options);
  if (errors[0] !== undefined) throw errors[0];
  return notes;
}

/** Logs `notes` on `log`, each as one line with its fields and `fields` (the slot, for example). */
export function logWalServerNotes(log: Logger, notes: readonly WalServerNote[], fields: Record<string, unknown>): void {
  for (const note of notes) log[note.level]({ ...fields, ...note.fields }, note.message);
}

/**
 * Checks that the server runs `wal_level = logical` (the WAL relay cannot stream otherwise); the
 * relay's own check is {@link checkWalServer}.
 *
 * @throws {@link UnsupportedServerError} naming the setting and what to do.
 */
export async function requireLogicalWal(db: Queryable): Promise<void> {
  const { rows } = await db.query<{ v: string }>(`SELECT current_setting('wal_level') AS v`);
  if (rows[0]?.v === 'logical') return;
  throw walLevelError(rows[0]?.v);
}
