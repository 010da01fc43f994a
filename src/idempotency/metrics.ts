/**
 * Metrics of the idempotency layer: an outcome counter fed by every request, through a
 * prom-client `Registry` and/or a plain callback, and gauges computed from the table at scrape
 * time ({@link idempotencyGauges}).
 *
 * Labels are the operation and the outcome only: never the key nor the tenant (unbounded
 * cardinality, and keys are not to be exposed).
 */
import { Counter, Gauge, type Registry } from 'prom-client';
import { runTransaction, joinTransaction, type DatabaseHandle, type TransactionHandle } from '../database.js';
import { DEFAULT_SCHEMA } from '../constants.js';
import { optionNames, refuseUnknownOptions } from '../errors.js';
import { quoteSchema } from '../schema-name.js';
import { toSchemaMissing } from './pg-errors.js';
import { idempotencyTable } from './store.js';

/**
 * What became of one idempotent request:
 * - `new`: claimed a new key and ran the handler;
 * - `replayed`: got a stored result;
 * - `in_progress`: got 409/202 (or waited in vain) because another execution holds the key;
 * - `mismatch`: same key, different fingerprint (422);
 * - `takeover`: lease mode, took over an expired lease (the previous owner died or stalled);
 * - `expired`: reused a key whose record was past its retention (a new execution);
 * - `uncertain`: the outcome is unknown (reported by the handler, or met by a retry);
 * - `store_error`: the store was unavailable (503).
 */
export const IDEMPOTENCY_OUTCOMES = [
  'new',
  'replayed',
  'in_progress',
  'mismatch',
  'takeover',
  'expired',
  'uncertain',
  'store_error',
] as const;
export type IdempotencyOutcome = (typeof IDEMPOTENCY_OUTCOMES)[number];

/** The event passed to `onOutcome`. */
export interface IdempotencyOutcomeEvent {
  operation: string;
  outcome: IdempotencyOutcome;
}

/** The counter's name. */
export const REQUESTS_TOTAL = 'outboxkit_idempotency_requests_total';

/** The part of the resolved options that {@link emitOutcome} reads. */
export interface OutcomeSinks {
  readonly outcomeCounter?: Counter<'operation' | 'outcome'>;
  readonly onOutcome?: (event: IdempotencyOutcomeEvent) => void;
}

/**
 * The counter `outboxkit_idempotency_requests_total{operation,outcome}` of `registry`, created on
 * first use and shared by every route that passes the same registry.
 */
export function outcomeCounter(registry: Registry): Counter<'operation' | 'outcome'> {
  const existing = registry.getSingleMetric(REQUESTS_TOTAL);
  if (existing) return existing as Counter<'operation' | 'outcome'>;
  return new Counter({
    name: REQUESTS_TOTAL,
    help: 'Idempotent requests by operation and outcome (new, replayed, in_progress, mismatch, takeover, expired, uncertain, store_error).',
    labelNames: ['operation', 'outcome'],
    registers: [registry],
  });
}

/** Counts one outcome. A throwing `onOutcome` never fails the request. */
export function emitOutcome(sinks: OutcomeSinks, operation: string, outcome: IdempotencyOutcome): void {
  sinks.outcomeCounter?.inc({ operation, outcome });
  if (sinks.onOutcome) {
    try {
      sinks.onOutcome({ operation, outcome });
    } catch {
      // metrics must never change a request's outcome
    }
  }
}

/** Options of {@link idempotencyGauges}. */
export interface GaugeOptions {
  /** Schema holding outboxkit's tables. @defaultValue 'outboxkit' */
  schema?: string;
}

/** Every option name of {@link GaugeOptions}; the compiler keeps it in step with the interface. */
const GAUGE_OPTION_NAMES = optionNames<GaugeOptions>({ schema: true });

/**
 * Registers gauges computed by one query at scrape time (no timer, nothing cached):
 * - `outboxkit_idempotency_records{state}`: number of records by state;
 * - `outboxkit_idempotency_processing_age_seconds`: age of the oldest `processing` record (alert
 *   on it: an old processing record is a stuck execution; outboxkit never deletes it);
 * - `outboxkit_idempotency_uncertain_age_seconds`: age of the oldest `uncertain` record
 *   (reconciliation lag);
 * - `outboxkit_idempotency_oldest_unexpired_seconds`: age of the oldest terminal record not yet
 *   past its retention (how far back replays reach);
 * - `outboxkit_idempotency_cleanup_lag_seconds`: how long the oldest expired terminal record has
 *   waited for `cleanupExpiredKeys()`;
 * - `outboxkit_idempotency_table_bytes`: size of the table with its indexes and TOAST.
 *
 * Each scrape reads the whole table once (a GROUP BY over states): scrape it at an interval that
 * suits the table's size.
 *
 * @param db - a `pg.Pool` or a drizzle database (one short read-only transaction per scrape).
 * @throws {@link InvalidOptionsError} on an unknown option name or an invalid schema name.
 */
export function idempotencyGauges(db: DatabaseHandle, registry: Registry, options: GaugeOptions = {}): void {
  refuseUnknownOptions(options ?? {}, GAUGE_OPTION_NAMES, 'idempotencyGauges');
  const schema = options.schema ?? DEFAULT_SCHEMA;
  const table = idempotencyTable(quoteSchema(schema));
  let pending: Promise<Snapshot> | undefined;
  // One query serves every gauge of a scrape.
  const snapshot = (): Promise<Snapshot> => {
    pending ??= readSnapshot(db, table)
      .catch((err: unknown) => {
        throw toSchemaMissing(err, schema);
      })
      .finally(() => {
        setImmediate(() => (pending = undefined));
      });
    return pending;
  };
  new Gauge({
    name: 'outboxkit_idempotency_records',
    help: 'Idempotency records by state.',
    labelNames: ['state'],
    registers: [registry],
    async collect() {
      const s = await snapshot();
      this.reset();
      for (const state of ['processing', 'completed', 'failed', 'uncertain']) this.set({ state }, s.counts[state] ?? 0);
    },
  });
  for (const [figure, [name, help]] of Object.entries(FIGURE_GAUGES) as [Figure, GaugeText][]) {
    new Gauge({
      name,
      help,
      registers: [registry],
      async collect() {
        this.set((await snapshot())[figure]);
      },
    });
  }
}

/** What one scrape reads: the number of records by state, and the figures of the other gauges. */
interface Snapshot {
  counts: Record<string, number>;
  /** Seconds. */
  processingAge: number;
  /** Seconds. */
  uncertainAge: number;
  /** Seconds. */
  oldestUnexpired: number;
  /** Seconds. */
  cleanupLag: number;
  /** Bytes. */
  tableBytes: number;
}

/** A figure of the {@link Snapshot} with a gauge of its own. */
type Figure = Exclude<keyof Snapshot, 'counts'>;

/** A gauge's name and help text. */
type GaugeText = [name: string, help: string];

/** The gauge of each figure, in the order they are registered. */
const FIGURE_GAUGES: Readonly<Record<Figure, GaugeText>> = {
  processingAge: [
    'outboxkit_idempotency_processing_age_seconds',
    'Age of the oldest processing idempotency record (0 when none).',
  ],
  uncertainAge: [
    'outboxkit_idempotency_uncertain_age_seconds',
    'Age of the oldest uncertain idempotency record awaiting reconciliation (0 when none).',
  ],
  oldestUnexpired: [
    'outboxkit_idempotency_oldest_unexpired_seconds',
    'Age of the oldest completed/failed idempotency record still within its retention (0 when none).',
  ],
  tableBytes: ['outboxkit_idempotency_table_bytes', 'Size of the idempotency table, indexes and TOAST included.'],
  cleanupLag: [
    'outboxkit_idempotency_cleanup_lag_seconds',
    'Time the oldest expired completed/failed record has waited for cleanup (0 when none).',
  ],
};

async function readSnapshot(db: DatabaseHandle, table: string): Promise<Snapshot> {
  return runTransaction(db, async (tx) => {
    const q = joinTransaction(tx as TransactionHandle, 'idempotencyGauges()');
    const { rows } = await q.query<{
      state: string;
      n: number;
      oldest_created: number | null;
      oldest_unexpired: number | null;
      cleanup_lag: number | null;
    }>(
      `SELECT state, count(*)::int AS n,
              extract(epoch FROM clock_timestamp() - min(created_at))::float8 AS oldest_created,
              extract(epoch FROM clock_timestamp() - min(completed_at) FILTER (WHERE expires_at > clock_timestamp()))::float8 AS oldest_unexpired,
              extract(epoch FROM clock_timestamp() - min(expires_at) FILTER (WHERE expires_at <= clock_timestamp()))::float8 AS cleanup_lag
         FROM ${table} GROUP BY state`,
    );
    const size = await q.query<{ bytes: string }>('SELECT pg_total_relation_size($1::regclass)::text AS bytes', [
      table,
    ]);
    const s: Snapshot = {
      counts: {},
      processingAge: 0,
      uncertainAge: 0,
      oldestUnexpired: 0,
      cleanupLag: 0,
      tableBytes: Number(size.rows[0]?.bytes ?? 0),
    };
    for (const r of rows) {
      s.counts[r.state] = r.n;
      if (r.state === 'processing') s.processingAge = r.oldest_created ?? 0;
      if (r.state === 'uncertain') s.uncertainAge = r.oldest_created ?? 0;
      if (r.state === 'completed' || r.state === 'failed') {
        s.oldestUnexpired = Math.max(s.oldestUnexpired, r.oldest_unexpired ?? 0);
        s.cleanupLag = Math.max(s.cleanupLag, r.cleanup_lag ?? 0);
      }
    }
    return s;
  });
}
