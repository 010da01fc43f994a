/**
 * `executeIdempotent()`: the one-transaction mode (the default) of idempotent execution.
 *
 * Claiming the key, the handler's business rows and outbox events, and the stored result commit
 * together or not at all (docs/guarantees.md, G1 and G2). The pure decisions are in ./state-machine.ts, the SQL
 * in ./store.ts.
 */
import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import { runTransaction, type DatabaseHandle, type Queryable, type TransactionOf } from '../database.js';
import { crashPoint } from '../crash-point.js';
import { inClaimTransaction } from './claim-transaction.js';
import { InvalidOptionsError, isOutboxkitError } from '../errors.js';
import { KeyInProgressError, KeyMismatchError, LeaseLostError, StoreUnavailableError } from './errors.js';
import { FINGERPRINT_VERSION, type Fingerprint } from './fingerprint.js';
import { assertValidKey, redactKey } from './key.js';
import { resolveIdempotencyOptionsFor, type IdempotencyOptions, type ResolvedIdempotencyOptions } from './options.js';
import { emitOutcome } from './metrics.js';
import { classifyStoreError, toSchemaMissing } from './pg-errors.js';
import { assertValidOperation, assertValidTenant } from './text.js';
import { decideOnExisting, normaliseResponse, outcomeOfResponse, reject } from './state-machine.js';
import type { HandlerResponse, IdempotentResponse, IdempotentResult } from './state-machine.js';
import { readFirst } from './read-first.js';
import {
  claimKey,
  claimKeyWithSavepoint,
  completeKey,
  completionOf,
  idempotencyTable,
  readRecord,
  rollbackToClaimSavepoint,
  setClaimSavepoint,
  type ClaimRequest,
  type KeyScope,
} from './store.js';

/** The identity of one idempotent request. */
export interface IdempotentRequest {
  /** The authenticated caller's scope. Never a shared default: refuse the request instead. */
  tenant: string;
  /** The operation, for example `create-order`; the same key on two operations never collides. */
  operation: string;
  /** The idempotency key, as returned by `parseIdempotencyKey()`: 1-255 printable ASCII. */
  key: string;
  /** The request's fingerprint, from `fingerprintRequest()`. */
  fingerprint: Fingerprint;
}

/** What a handler receives besides its transaction. */
export interface ExecutionContext {
  /**
   * Ends the handler with a business rejection: `return ctx.reject(422, problem)` stores it (the
   * handler's writes rolled back to the claim's savepoint) and replays it; `{ store: false }`
   * releases the key instead. Same as the standalone {@link reject}.
   */
  reject: typeof reject;
}

const EXECUTION_CONTEXT: ExecutionContext = Object.freeze({ reject });

/**
 * A response that must not be stored (see `outcomeOfResponse`): thrown inside the transaction so
 * that it rolls back, and caught outside to hand the response back.
 */
class ReleasedResponse {
  constructor(readonly response: IdempotentResponse) {}
}

/** The handler threw: its error is propagated unchanged, after the rollback. */
class HandlerFailure {
  constructor(readonly error: unknown) {}
}

/**
 * Runs the handler in its transaction and returns what it returned, with its response validated
 * and normalised. An error it throws is wrapped in a {@link HandlerFailure}: rethrown unchanged
 * after the rollback.
 */
async function runHandler<T>(
  handler: (tx: T, ctx: ExecutionContext) => Promise<HandlerResponse>,
  tx: T,
): Promise<{ returned: HandlerResponse; response: IdempotentResponse }> {
  let returned: HandlerResponse;
  try {
    returned = await handler(tx, EXECUTION_CONTEXT);
  } catch (err) {
    throw new HandlerFailure(err);
  }
  return { returned, response: normaliseResponse(returned) };
}

/** Validates a request and returns its scope. @internal */
export function checkRequest(request: IdempotentRequest, what = 'executeIdempotent()'): KeyScope {
  if (typeof request !== 'object' || request === null) throw new InvalidOptionsError(`${what} needs a request.`);
  const { key, fingerprint } = request;
  // Before any SQL: PostgreSQL text holds no NUL, and a lone surrogate would alias another scope.
  const tenant = assertValidTenant(request.tenant);
  const operation = assertValidOperation(request.operation, what);
  assertValidKey(key);
  if (
    typeof fingerprint !== 'object' ||
    fingerprint === null ||
    fingerprint.version !== FINGERPRINT_VERSION ||
    !Buffer.isBuffer(fingerprint.digest) ||
    fingerprint.digest.length !== 32
  ) {
    throw new InvalidOptionsError(`${what} needs the fingerprint returned by fingerprintRequest().`);
  }
  return { tenant, operation, key };
}

/**
 * Runs `handler` at most once per (tenant, operation, key) within the retention window, in one
 * transaction with the key's claim and its stored result, and returns a stable response to every
 * retry.
 *
 * Flow:
 * 0. Read first, outside any transaction: one plain SELECT of the key's record, kept only if it is
 *    terminal (`completed`/`failed`) and unexpired. Such a record cannot change before it expires,
 *    so it is answered at once: replayed, or {@link KeyMismatchError} on another fingerprint. A
 *    record that expires between this read and the reply is still replayed (it was valid when
 *    read). Anything else (no record, expired, `processing`, `uncertain`, or not yet committed)
 *    goes on to the claim below, which alone decides under concurrency.
 *
 * Then, in one transaction of `db`:
 * 1. `lock_timeout` = `lockTimeoutMs` (policy `reject`) or `waitTimeoutMs` (policy `wait`), for the
 *    claim only.
 * 2. One atomic claim (INSERT ... ON CONFLICT DO UPDATE): a new key, or one whose terminal record
 *    is past its retention, is claimed; a SAVEPOINT is taken; then `handler(tx, ctx)` runs, and
 *    its response is stored (`completed` for 2xx/3xx, `failed` for a final 4xx) in the same
 *    transaction. A stored 4xx (returned, or `ctx.reject(status, body)`) first rolls back to the
 *    savepoint: the rejection commits, the handler's business writes and outbox events do not.
 * 3. Otherwise the committed record decides: a different fingerprint → {@link KeyMismatchError};
 *    completed/failed → its stored response, with `idempotent-replayed: true`, and the handler does
 *    not run; processing → {@link KeyInProgressError}.
 *
 * A duplicate that arrives while the first request's transaction is open waits on its row lock:
 * under `reject` for `lockTimeoutMs`, then {@link KeyInProgressError}; under `wait` until the first
 * commits (→ replay) or rolls back (→ this request claims the key and executes), at most
 * `waitTimeoutMs` (→ {@link KeyInProgressError}).
 *
 * What releases the key (the whole transaction is rolled back, the handler's writes included, and
 * a retry executes again): the handler throws (its error is rethrown as is), or returns a 5xx or
 * 408/409/425/429 (returned with `replayed: false`, not stored), or ends with
 * `ctx.reject(status, body, { store: false })`, or the process dies before COMMIT.
 *
 * Round trips of a new key with a `pg.Pool`: the read-first SELECT (unless `readFirst: false`); `BEGIN` with the claim's
 * `lock_timeout` (one simple-protocol query); the claim with its SAVEPOINT (one simple-protocol
 * query, values as escaped literals); the handler's statements; the completion; `COMMIT`. With a
 * drizzle database, the setting, the claim and the SAVEPOINT are three statements of their own
 * (drizzle runs `BEGIN` itself, and postgres-js has no multi-statement query with results).
 *
 * Expects PostgreSQL's default isolation, READ COMMITTED. Do not keep the transaction open across
 * slow external calls: every duplicate under `wait` holds a pooled connection meanwhile.
 *
 * @param db - a `pg.Pool` or a drizzle database; outboxkit opens the transaction.
 * @param request - tenant, operation, key and fingerprint.
 * @param handler - the operation; receives the transaction (a `pg.PoolClient` inside BEGIN, or the
 *   drizzle `tx`) and writes its business rows and outbox events with it.
 * @param options - see {@link IdempotencyOptions}.
 * @throws {@link KeyMismatchError} (422) same key, different fingerprint.
 * @throws {@link KeyInProgressError} (409, retriable) the key is held by another request.
 * @throws {@link StoreUnavailableError} (503, retriable) PostgreSQL cannot be reached or failed
 *   before the handler ran (the handler then never ran), or during COMMIT (outcome unknown: the
 *   retry replays or executes).
 * @throws {@link SchemaMissingError} (not retriable) outboxkit's tables do not exist in `schema`:
 *   run `outboxkit migrate` first. The handler never ran.
 * @throws {@link KeyInvalidError}, {@link TenantUnresolvedError}, {@link InvalidOptionsError} on an
 *   invalid request, options or handler response (the transaction is rolled back). An unknown
 *   option name (a typo such as `lockTimeotMs`) is refused before any query.
 */
export async function executeIdempotent<D extends DatabaseHandle>(
  db: D,
  request: IdempotentRequest,
  handler: (tx: TransactionOf<D>, ctx: ExecutionContext) => Promise<HandlerResponse>,
  options?: IdempotencyOptions | ResolvedIdempotencyOptions,
): Promise<IdempotentResult> {
  const opts = resolveIdempotencyOptionsFor(options, 'executeIdempotent');
  const scope = checkRequest(request);
  const table = idempotencyTable(opts.quotedSchema);
  const log = { operation: scope.operation, key: redactKey(scope.key) };
  const claimTimeoutMs = opts.policy === 'wait' ? opts.waitTimeoutMs : opts.lockTimeoutMs;

  /**
   * The claim transaction's body. `pgClient`: the node-postgres client of a pool, which sends the
   * claim and its SAVEPOINT in one round trip; otherwise (drizzle) one statement each.
   */
  const body = async (tx: TransactionOf<D>, q: Queryable, pgClient?: pg.PoolClient): Promise<IdempotentResult> => {
    // The record this execution claims, and then owns.
    const owned: ClaimRequest = {
      table,
      scope,
      ownerToken: randomUUID(),
      fingerprint: request.fingerprint,
      retentionMs: opts.retentionMs,
    };
    const claim =
      pgClient === undefined
        ? await claimKey(q, owned)
        : await claimKeyWithSavepoint(pgClient, (value) => pgClient.escapeLiteral(value), owned);

    if (claim === undefined) {
      const record = await readRecord(q, owned);
      if (record === undefined) {
        // Cannot happen: the claim's conflict locked the row, and nothing deletes a locked row.
        throw new KeyInProgressError(undefined, { retryAfterSeconds: opts.retryAfterSeconds });
      }
      const decision = decideOnExisting(record, request.fingerprint);
      if (decision.kind === 'in-progress') {
        emitOutcome(opts, scope.operation, record.state === 'uncertain' ? 'uncertain' : 'in_progress');
        throw new KeyInProgressError(undefined, { retryAfterSeconds: opts.retryAfterSeconds });
      }
      return answerExisting(decision, opts, scope.operation, log);
    }
    // Counted at claim time: a later rollback still was a new execution attempt.
    emitOutcome(opts, scope.operation, claim.generation > 1 ? 'expired' : 'new');
    await crashPoint('idempotency:after-claim'); // test-only (src/crash-point.ts)

    if (pgClient === undefined) await setClaimSavepoint(q);
    const { returned, response } = await runHandler(handler, tx);
    const outcome = outcomeOfResponse(returned);
    if (outcome === 'release') throw new ReleasedResponse(response);
    // A stored rejection keeps the claim but none of the handler's writes.
    if (outcome === 'failed') await rollbackToClaimSavepoint(q);
    if (!(await completeKey(q, owned, completionOf(response, outcome, opts)))) {
      throw new LeaseLostError(
        `The idempotency record ${redactKey(scope.key)} of ${scope.operation} is no longer owned by this execution; its result was not stored.`,
      );
    }
    await crashPoint('idempotency:before-commit'); // test-only (src/crash-point.ts)
    opts.logger.debug({ ...log, status: response.status, generation: claim.generation }, 'idempotent request executed');
    return { replayed: false, response };
  };

  try {
    const known = opts.readFirst ? await readFirst(db, { table, scope }, request.fingerprint) : undefined;
    if (known !== undefined) return answerExisting(known, opts, scope.operation, log);
    return await inClaimTransaction(db, claimTimeoutMs, 'executeIdempotent()', body);
  } catch (err) {
    if (err instanceof ReleasedResponse) {
      opts.logger.debug({ ...log, status: err.response.status }, 'idempotent request released (response not stored)');
      return { replayed: false, response: err.response };
    }
    throw translateError(err, opts, log, scope.operation);
  }
}

/**
 * Answers a request whose key has a committed terminal record it may not take over (from the
 * read-first path or from the claim path): 422 on another fingerprint, else the stored response.
 */
function answerExisting(
  decision: { kind: 'mismatch' } | { kind: 'replay'; response: IdempotentResponse },
  opts: ResolvedIdempotencyOptions,
  operation: string,
  log: Record<string, unknown>,
): IdempotentResult {
  if (decision.kind === 'mismatch') {
    opts.logger.warn(log, 'idempotency key reused with a different request');
    emitOutcome(opts, operation, 'mismatch');
    throw new KeyMismatchError();
  }
  opts.logger.debug(log, 'idempotent response replayed');
  emitOutcome(opts, operation, 'replayed');
  return { replayed: true, response: decision.response };
}

/** Maps what escaped the transaction to what the caller sees; see {@link executeIdempotent}. */
function translateError(
  err: unknown,
  opts: ResolvedIdempotencyOptions,
  log: Record<string, unknown>,
  operation?: string,
): unknown {
  if (err instanceof HandlerFailure) return err.error;
  if (isOutboxkitError(err)) return err;
  const missing = toSchemaMissing(err, opts.schema);
  if (missing !== err) {
    // An operator error (no `outboxkit migrate` yet), not a retriable one; the handler never ran.
    opts.logger.error({ ...log, err }, "outboxkit's tables are missing: run outboxkit migrate");
    return missing;
  }
  switch (classifyStoreError(err)) {
    case 'lock-timeout':
    case 'serialization':
      if (operation !== undefined) emitOutcome(opts, operation, 'in_progress');
      opts.logger.debug(log, 'idempotency key in progress');
      return new KeyInProgressError(undefined, { retryAfterSeconds: opts.retryAfterSeconds, cause: err });
    case 'unavailable':
      if (operation !== undefined) emitOutcome(opts, operation, 'store_error');
      opts.logger.warn({ ...log, err }, 'idempotency store unavailable');
      return new StoreUnavailableError(undefined, { retryAfterSeconds: opts.retryAfterSeconds, cause: err });
    case 'other':
      return err;
  }
}

/**
 * Runs `handler` in a transaction of `db` without an idempotency key (for operations where the key
 * is optional and the request has none). Same transaction rules as {@link executeIdempotent}: a
 * 4xx or 5xx response (a `reject()` included) rolls the transaction back, a thrown error is rethrown after the
 * rollback, and a store failure becomes {@link StoreUnavailableError}. Nothing is stored.
 */
export async function executeWithoutKey<D extends DatabaseHandle>(
  db: D,
  handler: (tx: TransactionOf<D>, ctx: ExecutionContext) => Promise<HandlerResponse>,
  options?: IdempotencyOptions | ResolvedIdempotencyOptions,
): Promise<IdempotentResult> {
  const opts = resolveIdempotencyOptionsFor(options, 'executeWithoutKey');
  try {
    return await runTransaction(db, async (tx) => {
      const { returned, response } = await runHandler(handler, tx);
      // Without a key nothing is stored; a 4xx, like a 5xx, leaves no business write behind.
      if (outcomeOfResponse(returned) !== 'completed') throw new ReleasedResponse(response);
      return { replayed: false, response };
    });
  } catch (err) {
    if (err instanceof ReleasedResponse) return { replayed: false, response: err.response };
    throw translateError(err, opts, { operation: undefined });
  }
}
