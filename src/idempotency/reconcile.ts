/**
 * Reconciliation of `uncertain` records (lease mode) and the operation resource of policy `async`.
 */
import { joinTransaction, runTransaction, type DatabaseHandle, type TransactionHandle } from '../database.js';
import { InvalidOptionsError, optionNames, refuseUnknownOptions } from '../errors.js';
import { DEFAULT_SCHEMA } from '../constants.js';
import { quoteSchema } from '../schema-name.js';
import { IDEMPOTENCY_DEFAULTS, resolveIdempotencyOptions } from './options.js';
import {
  leaseChannel,
  listUncertain,
  readRecordByOperationId,
  resolveUncertain,
  type UncertainRecord,
} from './lease-store.js';
import { normaliseResponse, REPLAYED_HEADER, type HandlerResponse, type IdempotentResponse } from './state-machine.js';
import { completionOf, idempotencyTable } from './store.js';
import { toSchemaMissing } from './pg-errors.js';
import { assertValidOperation, assertValidTenant } from './text.js';

/** What a reconciliation hook decides for one uncertain record. */
export type Reconciliation =
  /** The external effect happened: store this response (2xx/3xx) and replay it. */
  | { outcome: 'completed'; response: HandlerResponse }
  /** The external effect did not happen and will not: store this response (4xx/5xx) and replay it. */
  | { outcome: 'failed'; response: HandlerResponse }
  /** Still unknown: leave the record uncertain (retries keep getting 409 or 202). */
  | { outcome: 'unknown' };

/** Options of {@link reconcileUncertain}. */
export interface ReconcileOptions {
  /** Schema holding outboxkit's tables. @defaultValue 'outboxkit' */
  schema?: string;
  /** Most records examined per call (oldest first). @defaultValue 100 */
  limit?: number;
  /** Retention of the resolved record, from resolution, in ms. @defaultValue 86_400_000 */
  retentionMs?: number;
  /** Replayed headers, as in `IdempotencyOptions.replayHeaders`. */
  replayHeaders?: readonly string[];
}

/** Every option name of {@link ReconcileOptions}; the compiler keeps it in step with the interface. */
const RECONCILE_OPTION_NAMES = optionNames<ReconcileOptions>({
  schema: true,
  limit: true,
  retentionMs: true,
  replayHeaders: true,
});

/** What {@link reconcileUncertain} did. */
export interface ReconcileResult {
  completed: number;
  failed: number;
  unknown: number;
  /** Resolved meanwhile by another reconciler (its answer stands). */
  lost: number;
  /** Records whose hook threw (left uncertain). */
  errors: number;
}

/**
 * Asks `hook` about each `uncertain` record of `operation` (up to `limit`, oldest first) and
 * stores its answer: `completed` and `failed` become replayable results and wake waiting
 * duplicates; `unknown` leaves the record as it is. An uncertain record is never marked failed by
 * outboxkit itself and never released: only the hook's answer resolves it.
 *
 * The hook runs outside any transaction (it typically asks the external system, by the owner
 * token or the key the handler sent downstream). Each resolution is fenced by state and owner
 * token, so two reconcilers running at once never both resolve a record.
 *
 * @throws {@link InvalidOptionsError} on an unknown option name or invalid options (an operation
 *   name that is empty, has a NUL character or is over 255 UTF-8 bytes included), before any query.
 *   A hook that throws counts in `errors`.
 * @throws {@link SchemaMissingError} when outboxkit's tables do not exist in `schema`.
 */
export async function reconcileUncertain(
  db: DatabaseHandle,
  operation: string,
  hook: (record: UncertainRecord) => Promise<Reconciliation>,
  options: ReconcileOptions = {},
): Promise<ReconcileResult> {
  refuseUnknownOptions(options ?? {}, RECONCILE_OPTION_NAMES, 'reconcileUncertain');
  assertValidOperation(operation, 'reconcileUncertain()');
  if (typeof hook !== 'function') throw new InvalidOptionsError('reconcileUncertain() needs a hook function.');
  const limit = options.limit ?? 100;
  if (!Number.isInteger(limit) || limit < 1 || limit > 100_000) {
    throw new InvalidOptionsError(`limit must be an integer from 1 to 100,000, got ${String(limit)}.`);
  }
  const opts = resolveIdempotencyOptions({
    schema: options.schema ?? DEFAULT_SCHEMA,
    retentionMs: options.retentionMs ?? IDEMPOTENCY_DEFAULTS.retentionMs,
    ...(options.replayHeaders ? { replayHeaders: options.replayHeaders } : {}),
  });
  const table = idempotencyTable(opts.quotedSchema);
  const channel = leaseChannel(opts.schema);
  const inTx = <T>(fn: (q: ReturnType<typeof joinTransaction>) => Promise<T>) =>
    runTransaction(db, (tx) => fn(joinTransaction(tx as TransactionHandle, 'reconcileUncertain()')));

  const records = await inTx((q) => listUncertain(q, table, operation, limit)).catch((err: unknown) => {
    throw toSchemaMissing(err, opts.schema);
  });
  const result: ReconcileResult = { completed: 0, failed: 0, unknown: 0, lost: 0, errors: 0 };
  for (const record of records) {
    let answer: Reconciliation;
    try {
      answer = await hook(record);
    } catch (err) {
      opts.logger.warn({ operation, operationId: record.operationId, err }, 'reconciliation hook failed');
      result.errors++;
      continue;
    }
    if (answer.outcome === 'unknown') {
      result.unknown++;
      continue;
    }
    if (answer.outcome !== 'completed' && answer.outcome !== 'failed') {
      throw new InvalidOptionsError(`The reconciliation hook returned an unknown outcome ${JSON.stringify(answer)}.`);
    }
    const response = normaliseResponse(answer.response);
    const terminal = answer.outcome === 'completed' ? response.status < 400 : response.status >= 400;
    if (!terminal) {
      throw new InvalidOptionsError(
        `The reconciliation hook returned '${answer.outcome}' with status ${response.status}; use 2xx/3xx for completed and 4xx/5xx for failed.`,
      );
    }
    const scope = { tenant: record.tenant, operation: record.operation, key: record.key };
    const ok = await inTx((q) =>
      resolveUncertain(
        q,
        { table, channel, scope, ownerToken: record.ownerToken },
        completionOf(response, answer.outcome, opts),
      ),
    ).catch((err: unknown) => {
      throw toSchemaMissing(err, opts.schema);
    });
    if (!ok) result.lost++;
    else result[answer.outcome]++;
  }
  return result;
}

/** Options of {@link serveOperation}. */
export interface ServeOperationOptions {
  /** Schema holding outboxkit's tables. @defaultValue 'outboxkit' */
  schema?: string;
  /** `Retry-After` of a pending operation, in seconds. @defaultValue 1 */
  retryAfterSeconds?: number;
}

/** Every option name of {@link ServeOperationOptions}; the compiler keeps it in step with the interface. */
const SERVE_OPERATION_OPTION_NAMES = optionNames<ServeOperationOptions>({ schema: true, retryAfterSeconds: true });

/**
 * The response to `GET` of an operation resource (the `Location` of a 202 under policy `async`):
 * - completed/failed: the stored status, allow-listed headers and body bytes, with
 *   `Idempotent-Replayed: true` (the same as a retry of the original request gets);
 * - processing/uncertain: 202 with `{"operationId","state"}` and `Retry-After`;
 * - unknown id (or another tenant's, or another operation's): 404 problem+json. The lookup is
 *   always scoped by `tenant` and `operation`, so an id never leaks another caller's response.
 *
 * @param scope.tenant - the authenticated caller of the GET (the same resolver as the POST).
 * @throws {@link TenantUnresolvedError} when `tenant` is empty or cannot be stored (a NUL
 *   character, a lone surrogate, over 1,024 UTF-8 bytes); {@link InvalidOptionsError} on such an
 *   operation name or an unknown option name (before any query); {@link SchemaMissingError} when
 *   outboxkit's tables do not exist in `schema`.
 */
export async function serveOperation(
  db: DatabaseHandle,
  scope: { tenant: string; operation: string; operationId: string },
  options: ServeOperationOptions = {},
): Promise<IdempotentResponse> {
  refuseUnknownOptions(options ?? {}, SERVE_OPERATION_OPTION_NAMES, 'serveOperation');
  const schema = options.schema ?? DEFAULT_SCHEMA;
  const table = idempotencyTable(quoteSchema(schema));
  const noStore = { 'cache-control': 'no-store' };
  // Before any SQL (PostgreSQL text holds no NUL): an invalid tenant is refused, an invalid
  // operation is a programming error, an invalid id is simply unknown (404).
  const tenant = assertValidTenant(scope.tenant);
  const operation = assertValidOperation(scope.operation, 'serveOperation()');
  const valid = typeof scope.operationId === 'string' && /^[0-9a-f]{64}$/.test(scope.operationId);
  const record = valid
    ? await runTransaction(db, (tx) =>
        readRecordByOperationId(joinTransaction(tx as TransactionHandle, 'serveOperation()'), table, {
          tenant,
          operation,
          operationId: scope.operationId,
        }),
      ).catch((err: unknown) => {
        throw toSchemaMissing(err, schema);
      })
    : undefined;
  if (record === undefined) {
    return {
      status: 404,
      headers: { 'content-type': 'application/problem+json', ...noStore },
      body: Buffer.from(
        JSON.stringify({
          type: 'https://outboxkit.dev/problems/operation-not-found',
          title: 'Operation not found',
          status: 404,
          detail: 'No operation with this id exists for this caller (or it is past its retention).',
        }),
        'utf8',
      ),
    };
  }
  if (
    (record.state === 'completed' || record.state === 'failed') &&
    record.responseStatus !== null &&
    record.responseBody !== null
  ) {
    return {
      status: record.responseStatus,
      headers: { ...(record.responseHeaders ?? {}), [REPLAYED_HEADER]: 'true' },
      body: record.responseBody,
    };
  }
  const retryAfter =
    record.state === 'processing'
      ? Math.max(options.retryAfterSeconds ?? 1, Math.ceil(record.leaseRemainingMs / 1000))
      : (options.retryAfterSeconds ?? 1);
  return {
    status: 202,
    headers: { 'content-type': 'application/json', 'retry-after': String(retryAfter), ...noStore },
    body: Buffer.from(JSON.stringify({ operationId: scope.operationId, state: record.state }), 'utf8'),
  };
}
