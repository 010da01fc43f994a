/**
 * `executeLeased()`: lease mode, for operations that outlive one transaction (an external payment
 * call, a long job). Side by side with one-transaction mode (`executeIdempotent()`):
 *
 * | | one-transaction mode (default) | lease mode |
 * | --- | --- | --- |
 * | claim | uncommitted, inside the request's transaction | committed first, with an owner token, a generation and a lease (database clock) |
 * | business writes | in the same transaction (G2) | in fenced transactions `ctx.transaction(fn)`, committed as they go |
 * | crash | everything rolls back; the retry executes | the record stays `processing`; 409 while the lease is live; after it, a retry takes over (new token, generation + 1) |
 * | stale owner | cannot exist | its completion, renewal and fenced writes change nothing and raise {@link LeaseLostError} |
 * | duplicate while running | row lock: `reject` (409 after `lockTimeoutMs`) or `wait` | `reject` (409 + Retry-After), `wait` (LISTEN/NOTIFY + bounded poll, up to the deadline), `async` (202 + Location) |
 * | error | rolls back, key released | before any effect: released; after an effect: stored as `failed` (500) and replayed |
 * | unknown external outcome | — | `return ctx.uncertain(reason)`: record `uncertain` (never failed, never released) until {@link reconcileUncertain} resolves it |
 * | stored rejection | rolled back to a savepoint after the claim | stored as `failed`; writes already committed by `ctx.transaction` stay |
 *
 * Elapsed time alone never deletes a processing record, nor hands an uncertain one to anyone.
 */
import { randomUUID } from 'node:crypto';
import {
  joinTransaction,
  runTransaction,
  type DatabaseHandle,
  type Queryable,
  type TransactionHandle,
  type TransactionOf,
} from '../database.js';
import { exponentialBackoffMs } from '../backoff.js';
import { inClaimTransaction } from './claim-transaction.js';
import { InvalidOptionsError, isOutboxkitError } from '../errors.js';
import {
  DeadlineInvalidError,
  KeyInProgressError,
  KeyMismatchError,
  LeaseLostError,
  StoreUnavailableError,
} from './errors.js';
import { checkRequest, type IdempotentRequest } from './execute.js';
import { redactKey } from './key.js';
import {
  claimLease,
  fenceLease,
  finishLease,
  markUncertain,
  readLeasedRecord,
  releaseLease,
  renewLease,
  type LeaseClaim,
  type LeasedRecord,
  type OwnedLease,
} from './lease-store.js';
import { subscribe, type Subscription } from './lease-listener.js';
import {
  MIN_WAIT_PAUSE_MS,
  resolveLeaseOptionsFor,
  type LeaseOptions,
  type ResolvedLeaseOptions,
} from './lease-options.js';
import { emitOutcome } from './metrics.js';
import { classifyStoreError, toSchemaMissing } from './pg-errors.js';
import { storableText } from './text.js';
import { decideOnExisting, normaliseResponse, outcomeOfResponse, reject } from './state-machine.js';
import type { HandlerResponse, IdempotentResponse, IdempotentResult } from './state-machine.js';
import { autocommitQueryable, readFirst } from './read-first.js';
import { completionOf, idempotencyTable, type KeyScope } from './store.js';

const UNCERTAIN = Symbol.for('outboxkit.uncertain');

/** What {@link executeLeased} takes: the key's scope and fingerprint, and what bounds a wait. */
export interface LeasedRequest extends IdempotentRequest {
  /**
   * The caller's deadline, in milliseconds since the epoch (the clock of `Date.now()`): a wait
   * (policy `wait`) ends at it, or after `waitTimeoutMs`, whichever comes first. A time already
   * past means no wait. It must be a finite number: anything else (`NaN` from a malformed
   * `Request-Timeout` header, an infinity, a string) is refused with {@link DeadlineInvalidError}
   * before anything is read or written.
   * @defaultValue none (`waitTimeoutMs` alone bounds a wait)
   */
  deadline?: number;
  /**
   * Ends a wait (policy `wait`) as soon as it is aborted, with {@link KeyInProgressError} (its
   * `cause` is the signal's reason): abort it when the caller is gone. The HTTP adapters abort it
   * when the client's connection closes before the response is sent. It never stops an execution
   * this request has claimed: that one runs to its end and stores its result for the retries.
   * @defaultValue none
   */
  signal?: AbortSignal;
}

/** The marker `ctx.uncertain(reason)` returns: the handler returns it as its response. */
export interface UncertainOutcome extends HandlerResponse {
  readonly [UNCERTAIN]: { readonly reason: string };
}

/** What a leased handler receives. */
export interface LeaseContext<D extends DatabaseHandle> {
  /** This execution's owner token (fencing): send it downstream as the external idempotency key. */
  readonly ownerToken: string;
  /**
   * Aborted when this execution learns that it has lost its lease (another execution took over):
   * by the automatic renewal (`renewEveryMs`), `renew()` or `transaction()`. Its `reason` is the
   * {@link LeaseLostError}. Pass it to long calls (`fetch(url, { signal })`) to stop work whose
   * result can no longer be stored. Never aborted while this execution owns the record.
   */
  readonly signal: AbortSignal;
  /** 1 for the first execution, + 1 per takeover. */
  readonly generation: number;
  /**
   * The record's public id (operation resource, NOTIFY payload): the HMAC that the claim stored
   * (see `LeaseOptions.operationIdSecret`), kept through takeovers; never the key.
   */
  readonly operationId: string;
  /**
   * Extends the lease by `leaseMs` from now (database clock). With `renewEveryMs` this happens on
   * its own while the handler runs.
   * @throws {@link LeaseLostError} when another execution has taken over (and aborts `signal`).
   */
  renew(): Promise<void>;
  /**
   * Declares that an effect may have happened (call it before an external call): from then on, an
   * error marks the record `failed` instead of releasing the key. `transaction()` declares it too.
   */
  effect(): void;
  /**
   * Runs `fn` in a new transaction of `db` that first locks the record under this owner token, so
   * that its writes commit only while this execution owns the key (a takeover waits for it).
   * @throws {@link LeaseLostError} (nothing written) when another execution has taken over.
   */
  transaction<T>(fn: (tx: TransactionOf<D>) => Promise<T>): Promise<T>;
  /** A business rejection (4xx) to return; stored as `failed` unless `{ store: false }` and no effect yet. */
  reject: typeof reject;
  /**
   * The outcome of an external effect is unknown (a payment call timed out): `return
   * ctx.uncertain('payment provider timeout')`. The record becomes `uncertain`; retries get 409
   * (or 202) until {@link reconcileUncertain} resolves it. The reason is stored; keep keys and
   * personal data out of it.
   */
  uncertain(reason: string): UncertainOutcome;
}

/** The outcome of {@link executeLeased}. */
export interface LeasedResult extends IdempotentResult {
  /**
   * - `executed`: this request ran the handler and stored its result;
   * - `replayed`: a stored result;
   * - `released`: the handler failed before any effect, nothing stored, the key is free;
   * - `accepted`: 202 (policy `async`, or this request's outcome is uncertain).
   */
  outcome: 'executed' | 'replayed' | 'released' | 'accepted';
}

function notOwner(scope: KeyScope, what: string): LeaseLostError {
  return new LeaseLostError(
    `The lease on ${redactKey(scope.key)} of ${scope.operation} was taken over by another execution; ${what}. Do not report this execution's result.`,
  );
}

function accepted(
  opts: ResolvedLeaseOptions,
  operationId: string,
  state: string,
  retryAfter: number,
): IdempotentResponse {
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    'retry-after': String(retryAfter),
    'cache-control': 'no-store',
  };
  if (opts.operationLocation) headers.location = opts.operationLocation(operationId);
  return { status: 202, headers, body: Buffer.from(JSON.stringify({ operationId, state }), 'utf8') };
}

function retryAfterOf(record: LeasedRecord, opts: ResolvedLeaseOptions): number {
  if (record.state !== 'processing') return opts.base.retryAfterSeconds;
  return Math.max(opts.base.retryAfterSeconds, Math.ceil(record.leaseRemainingMs / 1000));
}

/** A wait ended because its request's `signal` was aborted (the caller went away). */
function abortedWait(opts: ResolvedLeaseOptions, signal: AbortSignal): KeyInProgressError {
  return new KeyInProgressError(
    'The wait for the request with this idempotency key ended because the request was aborted; retry the identical request after the Retry-After delay.',
    { retryAfterSeconds: opts.base.retryAfterSeconds, cause: signal.reason },
  );
}

/**
 * The request's deadline, validated before any query.
 * @throws {@link DeadlineInvalidError} when it is not a finite number.
 */
function deadlineOf(request: LeasedRequest): number | undefined {
  const { deadline } = request;
  if (deadline === undefined) return undefined;
  if (typeof deadline !== 'number' || !Number.isFinite(deadline)) {
    const got = typeof deadline === 'number' ? String(deadline) : `a value of type ${typeof deadline}`;
    throw new DeadlineInvalidError(
      `The request's deadline must be a finite time in ms since the epoch, got ${got}; send a valid timeout, or none.`,
    );
  }
  return deadline;
}

/** The request's abort signal, checked structurally (an AbortSignal of another realm passes). */
function signalOf(request: LeasedRequest): AbortSignal | undefined {
  const { signal } = request;
  if (signal === undefined) return undefined;
  const s = signal as Partial<AbortSignal> | null;
  if (
    typeof s !== 'object' ||
    s === null ||
    typeof s.aborted !== 'boolean' ||
    typeof s.addEventListener !== 'function'
  ) {
    throw new InvalidOptionsError('executeLeased(): request.signal must be an AbortSignal.');
  }
  return signal;
}

/**
 * The stored id of the key's record, read without a lock (a row lock held by a claim or a fenced
 * transaction does not block a plain read), or `computed` when no record is visible (a concurrent
 * claim not yet committed, which stores the id computed the same way) or the read fails.
 */
async function visibleOperationId(
  db: DatabaseHandle,
  table: string,
  scope: KeyScope,
  computed: string,
): Promise<string> {
  const q = autocommitQueryable(db);
  if (q === undefined) return computed;
  const record = await readLeasedRecord(q, { table, scope }).catch(() => undefined);
  return record?.operationId ?? computed;
}

function inProgressError(record: LeasedRecord, opts: ResolvedLeaseOptions, cause?: unknown): KeyInProgressError {
  const message =
    record.state === 'uncertain'
      ? 'The outcome of the request with this idempotency key is being reconciled (an external effect is uncertain); retry the identical request after the Retry-After delay.'
      : undefined;
  return new KeyInProgressError(message, { retryAfterSeconds: retryAfterOf(record, opts), cause });
}

/**
 * Runs `handler` at most once at a time per (tenant, operation, key) under a committed lease, and
 * returns a stable response to every retry. See the table at the top of this module for how it
 * differs from `executeIdempotent()`.
 *
 * Flow:
 * 0. Read first, outside any transaction (as in `executeIdempotent()`): a terminal record within
 *    its retention is answered by one plain SELECT (replay, or 422 on another fingerprint); it
 *    cannot change before it expires, and one that expires between the read and the reply is
 *    still replayed (it was valid when read). Any other record (`processing`, `uncertain`,
 *    expired) or none goes to step 1.
 * 1. One short transaction claims the key (INSERT ... ON CONFLICT): a new key, an expired
 *    terminal record, or — takeover — a `processing` record of the same fingerprint whose lease has
 *    expired (new owner token, generation + 1). It commits before the handler runs.
 * 2. Otherwise the committed record decides: a different fingerprint → 422; completed/failed →
 *    replay; `processing` (live lease) or `uncertain` → the policy (`reject` 409, `wait`, `async`
 *    202). A wait looks again at each notification of the record and after pauses that start at
 *    25 ms and double up to `pollIntervalMs`, until `waitTimeoutMs`, the request's `deadline` or
 *    its `signal`, whichever ends it first.
 * 3. `handler(ctx)` runs outside any transaction; its local writes go through the fenced
 *    `ctx.transaction()`; it may `ctx.renew()` the lease, or let `renewEveryMs` renew it while it
 *    runs (`ctx.signal` aborts if a renewal finds the lease lost).
 * 4. Its response is stored with a statement fenced by the owner token (`completed` for 2xx/3xx,
 *    `failed` for a 4xx, `uncertain` for `ctx.uncertain()`), or the record is released (an error
 *    or a 5xx/408/409/425/429 before any effect). After an effect, an error or such a status is
 *    stored as `failed`, never released. A stale owner stores nothing: {@link LeaseLostError}.
 *
 * @param db - a `pg.Pool` or a drizzle database (LISTEN/NOTIFY wake-ups need a pg pool behind it;
 *   otherwise `wait` polls).
 * @param request - tenant, operation, key, fingerprint, and optionally the caller's `deadline`
 *   (ms since the epoch) and `signal` that end a wait (see {@link LeasedRequest}).
 * @throws {@link DeadlineInvalidError} (400) when `request.deadline` is not a finite number, before
 *   any query.
 * @throws {@link KeyMismatchError} (422), {@link KeyInProgressError} (409 + Retry-After),
 *   {@link StoreUnavailableError} (503), {@link LeaseLostError} (a stale owner), and the handler's
 *   own error when it failed before any effect (after the release).
 * @throws {@link InvalidOptionsError} on an unknown option name or invalid options (see
 *   `resolveLeaseOptions()`), or an invalid request, before any query.
 */
export async function executeLeased<D extends DatabaseHandle>(
  db: D,
  request: LeasedRequest,
  handler: (ctx: LeaseContext<D>) => Promise<HandlerResponse>,
  options?: LeaseOptions | ResolvedLeaseOptions,
): Promise<LeasedResult> {
  const opts = resolveLeaseOptionsFor(options, 'executeLeased');
  const base = opts.base;
  const scope = checkRequest(request, 'executeLeased()');
  const deadline = deadlineOf(request);
  const signal = signalOf(request);
  const table = idempotencyTable(base.quotedSchema);
  // The id a new record gets; a record that exists already keeps the one it has.
  const operationId = opts.operationIdOf(scope);
  const log = { operation: scope.operation, key: redactKey(scope.key) };
  // Finite: `deadline` was checked, and `waitTimeoutMs` is at most an hour.
  const waitUntil = Math.min(Date.now() + base.waitTimeoutMs, deadline ?? Number.POSITIVE_INFINITY);
  let pauses = 0;
  // The next pause of a wait: from MIN_WAIT_PAUSE_MS, doubling up to pollIntervalMs, shortened to
  // wake at `wakeMs` (a lease's expiry) but never below MIN_WAIT_PAUSE_MS, and never past the end
  // of the wait. However the wait is bounded, it never polls faster than that.
  const pauseMs = (wakeMs: number): number =>
    Math.min(
      waitUntil - Date.now(),
      Math.max(
        MIN_WAIT_PAUSE_MS,
        Math.min(wakeMs, exponentialBackoffMs(++pauses, MIN_WAIT_PAUSE_MS, opts.pollIntervalMs)),
      ),
    );
  // Waits for a notification of the record or the next pause, then ends the wait if the request
  // was aborted meanwhile.
  const pause = async (notifications: Subscription, wakeMs: number): Promise<void> => {
    await notifications.next(pauseMs(wakeMs), signal);
    if (signal?.aborted) {
      emitOutcome(base, scope.operation, 'in_progress');
      throw abortedWait(opts, signal);
    }
  };
  let subscription: Subscription | undefined;
  let first = true;
  try {
    for (;;) {
      const ownerToken = randomUUID();
      let attempt: { claim: LeaseClaim } | { record: LeasedRecord | undefined };
      const claimIn = async (_tx: unknown, q: Queryable): Promise<typeof attempt> => {
        const claimed = { table, scope, ownerToken, fingerprint: request.fingerprint, retentionMs: base.retentionMs };
        const claim = await claimLease(q, claimed, operationId, opts.leaseMs);
        if (claim) return { claim };
        return { record: await readLeasedRecord(q, claimed) };
      };
      try {
        if (first) {
          first = false;
          const known = base.readFirst ? await readFirst(db, { table, scope }, request.fingerprint) : undefined;
          if (known?.kind === 'mismatch') {
            emitOutcome(base, scope.operation, 'mismatch');
            throw new KeyMismatchError();
          }
          if (known?.kind === 'replay') {
            emitOutcome(base, scope.operation, 'replayed');
            return { replayed: true, outcome: 'replayed', response: known.response };
          }
        }
        // The claim transaction is short, so a lock wait is short too; bound it anyway.
        attempt = await inClaimTransaction(db, base.lockTimeoutMs, 'executeLeased()', claimIn);
      } catch (err) {
        const translated = translate(err, opts, log, 'new');
        if (!isOutboxkitError(translated, 'OUTBOXKIT_KEY_IN_PROGRESS')) throw translated;
        // The claim timed out on a row lock (another duplicate's short claim transaction, or the
        // owner's fenced `ctx.transaction()`): the key is busy, as with a live lease, and the
        // policy applies.
        if (opts.policy === 'async') {
          emitOutcome(base, scope.operation, 'in_progress');
          const id = await visibleOperationId(db, table, scope, operationId);
          return {
            replayed: false,
            outcome: 'accepted',
            response: accepted(opts, id, 'processing', base.retryAfterSeconds),
          };
        }
        if (opts.policy === 'reject' || waitUntil - Date.now() <= 0 || signal?.aborted) {
          emitOutcome(base, scope.operation, 'in_progress');
          throw signal?.aborted ? abortedWait(opts, signal) : translated;
        }
        // The record's notifications carry its stored id; a row locked by the owner's fenced
        // transaction can be read for it.
        subscription ??= await subscribe(
          db,
          opts.channel,
          await visibleOperationId(db, table, scope, operationId),
          base.logger,
        );
        await pause(subscription, Number.POSITIVE_INFINITY);
        continue;
      }

      if ('claim' in attempt) {
        const { claim } = attempt;
        if (claim.previousState === 'processing') {
          emitOutcome(base, scope.operation, 'takeover');
          base.logger.warn({ ...log, generation: claim.generation }, 'idempotency lease taken over after expiry');
        } else {
          emitOutcome(base, scope.operation, claim.previousState === null ? 'new' : 'expired');
        }
        return await runOwned(db, scope, claim, handler, opts, log, table);
      }

      const record = attempt.record;
      if (record === undefined) continue; // released between the claim and the read: claim again
      const decision = decideOnExisting(record, request.fingerprint);
      if (decision.kind === 'mismatch') {
        emitOutcome(base, scope.operation, 'mismatch');
        throw new KeyMismatchError();
      }
      if (decision.kind === 'replay') {
        emitOutcome(base, scope.operation, 'replayed');
        return { replayed: true, outcome: 'replayed', response: decision.response };
      }
      // processing (live lease) or uncertain. Its stored id is the one its callers hold (a
      // record without one was claimed by an older version, which used the computed one's place).
      const recordId = record.operationId ?? operationId;
      if (opts.policy === 'async') {
        emitOutcome(base, scope.operation, record.state === 'uncertain' ? 'uncertain' : 'in_progress');
        return {
          replayed: false,
          outcome: 'accepted',
          response: accepted(opts, recordId, record.state, retryAfterOf(record, opts)),
        };
      }
      if (opts.policy === 'reject' || waitUntil - Date.now() <= 0 || signal?.aborted) {
        emitOutcome(base, scope.operation, record.state === 'uncertain' ? 'uncertain' : 'in_progress');
        throw signal?.aborted ? abortedWait(opts, signal) : inProgressError(record, opts);
      }
      // Wake on a notification, at the latest after the next pause, at the lease's expiry (to
      // take over), or at the end of the wait.
      subscription ??= await subscribe(db, opts.channel, recordId, base.logger);
      await pause(subscription, record.state === 'processing' ? record.leaseRemainingMs + 5 : Number.POSITIVE_INFINITY);
    }
  } finally {
    await subscription?.close();
  }
}

async function runOwned<D extends DatabaseHandle>(
  db: D,
  scope: KeyScope,
  claim: LeaseClaim,
  handler: (ctx: LeaseContext<D>) => Promise<HandlerResponse>,
  opts: ResolvedLeaseOptions,
  log: Record<string, unknown>,
  table: string,
): Promise<LeasedResult> {
  const base = opts.base;
  const { ownerToken, operationId } = claim;
  const lease: OwnedLease = { table, channel: opts.channel, scope, ownerToken };
  let effects = false;
  const inTx = <T>(fn: (q: ReturnType<typeof joinTransaction>) => Promise<T>): Promise<T> =>
    runTransaction(db, (tx) => fn(joinTransaction(tx as TransactionHandle, 'executeLeased()')));
  // Set once this execution knows it lost the record; `signal` carries it to the handler.
  let lost: LeaseLostError | undefined;
  const controller = new AbortController();
  const loseLease = (what: string): LeaseLostError => {
    if (lost === undefined) {
      lost = notOwner(scope, what);
      base.logger.warn({ ...log, generation: claim.generation }, 'idempotency lease lost to another execution');
      controller.abort(lost);
    }
    return lost;
  };
  const ctx: LeaseContext<D> = {
    ownerToken,
    generation: claim.generation,
    operationId,
    signal: controller.signal,
    async renew() {
      if (!(await inTx((q) => renewLease(q, lease, opts.leaseMs)))) {
        throw loseLease('the lease was not renewed');
      }
    },
    effect() {
      effects = true;
    },
    async transaction<T>(fn: (tx: TransactionOf<D>) => Promise<T>): Promise<T> {
      effects = true;
      return runTransaction(db, async (tx) => {
        const q = joinTransaction(tx as TransactionHandle, 'ctx.transaction()');
        if (!(await fenceLease(q, lease))) throw loseLease('nothing was written');
        return fn(tx);
      });
    },
    reject,
    uncertain(reason: string): UncertainOutcome {
      // Stored as text for operators: a NUL or a lone surrogate must not make the store fail
      // (the record would stay processing); they become U+FFFD.
      const text =
        typeof reason === 'string' && reason.length > 0 ? storableText(reason.slice(0, 1_000)) : 'outcome unknown';
      return Object.assign({ status: 202, body: { state: 'uncertain' } } as HandlerResponse, {
        [UNCERTAIN]: Object.freeze({ reason: text }),
      });
    },
  };

  let returned: HandlerResponse;
  let marker: UncertainOutcome[typeof UNCERTAIN] | undefined;
  let response: IdempotentResponse | undefined;
  const renewal =
    opts.renewEveryMs === undefined
      ? undefined
      : renewEvery(opts.renewEveryMs, () => inTx((q) => renewLease(q, lease, opts.leaseMs)), {
          lost: () => loseLease('the lease was not renewed'),
          failed: (err) => base.logger.warn({ ...log, err }, 'idempotency lease renewal failed; trying again'),
          renewed: () => base.logger.debug({ ...log, generation: claim.generation }, 'idempotency lease renewed'),
        });
  try {
    returned = await handler(ctx);
    marker = (returned as Partial<UncertainOutcome> | null | undefined)?.[UNCERTAIN];
    // An invalid response (a header value with NUL, CR or LF, a non-string value, a bad status)
    // is the handler's error: validated here, before anything is stored, so that it releases the
    // key (no effect yet) or is stored as failed (after an effect), never leaves it processing.
    if (marker === undefined) response = normaliseResponse(returned);
  } catch (err) {
    renewal?.stop();
    if (isOutboxkitError(err, 'OUTBOXKIT_LEASE_LOST')) throw err;
    // The handler failed after learning that it lost the lease (an abort through `signal`):
    // nothing of this execution may be stored or released; the new owner decides.
    if (lost !== undefined) throw lost;
    if (!effects) {
      const released = await inTx((q) => releaseLease(q, lease)).catch(() => false);
      base.logger.debug({ ...log, released }, 'leased handler failed before any effect: key released');
      throw err;
    }
    base.logger.error({ ...log, err }, 'leased handler failed after an effect: stored as failed');
    const response = normaliseResponse({
      status: 500,
      headers: { 'content-type': 'application/problem+json' },
      body: {
        type: 'https://outboxkit.dev/problems/internal',
        title: 'Internal error',
        status: 500,
        detail: 'The request failed after it had started its effects; it is not executed again for this key.',
        code: 'OUTBOXKIT_INTERNAL',
      },
    });
    return store(response, 'failed');
  }
  renewal?.stop();

  if (marker !== undefined || response === undefined) {
    const reason = marker?.reason ?? 'outcome unknown';
    const ok = await inTx((q) => markUncertain(q, lease, reason));
    if (!ok) throw notOwner(scope, 'the uncertain outcome was not recorded');
    emitOutcome(base, scope.operation, 'uncertain');
    base.logger.warn({ ...log, reason }, 'leased execution outcome uncertain: awaiting reconciliation');
    return {
      replayed: false,
      outcome: 'accepted',
      response: accepted(opts, operationId, 'uncertain', base.retryAfterSeconds),
    };
  }
  const outcome = outcomeOfResponse(returned);
  if (outcome === 'release' && !effects) {
    const ok = await inTx((q) => releaseLease(q, lease));
    if (!ok) throw notOwner(scope, 'the key was not released');
    return { replayed: false, outcome: 'released', response };
  }
  return store(response, outcome === 'completed' ? 'completed' : 'failed');

  async function store(response: IdempotentResponse, state: 'completed' | 'failed'): Promise<LeasedResult> {
    let ok: boolean;
    try {
      ok = await inTx((q) => finishLease(q, lease, completionOf(response, state, base)));
    } catch (err) {
      throw translate(err, opts, log, undefined);
    }
    if (!ok) throw notOwner(scope, 'its result was not stored');
    base.logger.debug({ ...log, status: response.status, generation: claim.generation }, 'leased request executed');
    return { replayed: false, outcome: 'executed', response };
  }
}

/**
 * Calls `renew` every `intervalMs` until stopped or until it reports the lease lost (`false`).
 * One renewal at a time: the next interval starts when the previous renewal has settled. After
 * `stop()`, a renewal still in flight is ignored (its UPDATE is fenced: once the record is
 * stored, released or marked uncertain it changes nothing).
 */
function renewEvery(
  intervalMs: number,
  renew: () => Promise<boolean>,
  on: { lost(): void; failed(err: unknown): void; renewed(): void },
): { stop(): void } {
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  const tick = async (): Promise<void> => {
    let owned: boolean;
    try {
      owned = await renew();
    } catch (err) {
      if (stopped) return;
      on.failed(err);
      schedule();
      return;
    }
    if (stopped) return;
    if (!owned) {
      stopped = true;
      on.lost();
      return;
    }
    on.renewed();
    schedule();
  };
  const schedule = () => {
    timer = setTimeout(() => void tick(), intervalMs);
    // A renewal never keeps the process alive on its own: the handler's work does.
    timer.unref();
  };
  schedule();
  return {
    stop() {
      stopped = true;
      clearTimeout(timer);
    },
  };
}

function translate(
  err: unknown,
  opts: ResolvedLeaseOptions,
  log: Record<string, unknown>,
  operationOutcome: 'new' | undefined,
): unknown {
  if (isOutboxkitError(err)) return err;
  const missing = toSchemaMissing(err, opts.base.schema);
  if (missing !== err) {
    // An operator error (no `outboxkit migrate` yet), not a retriable one; the handler never ran.
    opts.base.logger.error({ ...log, err }, "outboxkit's tables are missing: run outboxkit migrate");
    return missing;
  }
  const retryAfterSeconds = opts.base.retryAfterSeconds;
  switch (classifyStoreError(err)) {
    case 'lock-timeout':
    case 'serialization':
      return new KeyInProgressError(undefined, { retryAfterSeconds, cause: err });
    case 'unavailable':
      if (operationOutcome !== undefined) emitOutcome(opts.base, String(log.operation), 'store_error');
      opts.base.logger.warn({ ...log, err }, 'idempotency store unavailable');
      return new StoreUnavailableError(undefined, { retryAfterSeconds, cause: err });
    case 'other':
      return err;
  }
}
