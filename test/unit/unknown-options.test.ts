/**
 * Misspelt option names are refused (InvalidOptionsError, OUTBOXKIT_INVALID_OPTIONS) at every
 * public entry point taking an options bag, before anything connects or writes, instead of
 * falling back to the default silently. No infrastructure: the databases given are unreachable
 * (127.0.0.1:1), so a call that got past the check would fail with another error.
 */
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../src/errors.js';
import { noopLogger } from '../../src/logger.js';
import { migrate } from '../../src/migrate.js';
import { cleanupExpiredKeys } from '../../src/idempotency/cleanup.js';
import { executeIdempotent, executeWithoutKey } from '../../src/idempotency/execute.js';
import { fingerprintRequest } from '../../src/idempotency/fingerprint.js';
import { parseIdempotencyKey } from '../../src/idempotency/key.js';
import { executeLeased } from '../../src/idempotency/lease.js';
import { resolveLeaseOptions } from '../../src/idempotency/lease-options.js';
import { idempotencyGauges } from '../../src/idempotency/metrics.js';
import { resolveIdempotencyOptions } from '../../src/idempotency/options.js';
import { reconcileUncertain, serveOperation } from '../../src/idempotency/reconcile.js';
import { reject } from '../../src/idempotency/state-machine.js';
import { operationRoute, resolveLeaseRoute, resolveRoute } from '../../src/http/route-options.js';
import * as express from '../../src/http/express.js';
import * as fastify from '../../src/http/fastify.js';
import { Relay, createRelay, resolveRelayOptions, type RelayOptions } from '../../relay/relay.js';
import { createKafkajsProducer } from '../../src/kafka/kafkajs/producer.js';
import { relayReadiness } from '../../relay/metrics.js';

const UNREACHABLE = 'postgres://127.0.0.1:1/x';
const pools: pg.Pool[] = [];

/** A pool on a closed port; `totalCount` stays 0 unless something tried to connect. */
function deadPool(): pg.Pool {
  const pool = new pg.Pool({ connectionString: UNREACHABLE, connectionTimeoutMillis: 500 });
  pools.push(pool);
  return pool;
}

afterAll(async () => {
  await Promise.all(pools.map((p) => p.end()));
});

/** The error `fn` throws (or its promise rejects with). */
async function errorOf(fn: () => unknown): Promise<unknown> {
  try {
    await fn();
  } catch (err) {
    return err;
  }
  throw new Error('expected an error, got none');
}

/** Asserts `fn` fails with OUTBOXKIT_INVALID_OPTIONS naming `what` and the unknown `key`. */
async function expectUnknown(fn: () => unknown, what: string, key: string): Promise<void> {
  const err = await errorOf(fn);
  expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS'), String(err)).toBe(true);
  expect((err as Error).message).toContain(`${what}: unknown option ${JSON.stringify(key)}; the options are `);
}

const kafka = new Kafka({ clientId: 'unknown-options', brokers: ['127.0.0.1:1'], logLevel: logLevel.NOTHING });
const nullProducer = { connect: async () => {}, send: async () => {}, disconnect: async () => {} };
const request = {
  tenant: 'acme',
  operation: 'create-order',
  key: 'k-1',
  fingerprint: fingerprintRequest({ tenant: 'acme', operation: 'create-order', body: '{}', maxBodyBytes: 100 }),
};
const handler = async () => ({ status: 201, body: {} });
const resolveTenant = () => 'acme';

describe('relay', () => {
  it('resolveRelayOptions, new Relay() and createRelay() refuse a misspelt option', async () => {
    const typo = { connectionString: UNREACHABLE, producer: nullProducer, leaseMS: 5 } as RelayOptions;
    await expectUnknown(() => resolveRelayOptions(typo), 'createRelay', 'leaseMS');
    await expectUnknown(() => new Relay(typo), 'createRelay', 'leaseMS');
    await expectUnknown(() => createRelay(typo), 'createRelay', 'leaseMS');
    // Even when its value is undefined.
    await expectUnknown(
      () => resolveRelayOptions({ pool: deadPool(), kafka, pollInterval: undefined } as RelayOptions),
      'createRelay',
      'pollInterval',
    );
  });

  it('lists every known option in the message, and accepts them all', async () => {
    const err = await errorOf(() =>
      resolveRelayOptions({ pool: deadPool(), kafka, batchSise: 1, leaseMS: 5 } as RelayOptions),
    );
    expect((err as Error).message).toMatch(/^createRelay: unknown options "batchSise", "leaseMS"; the options are /);
    expect((err as Error).message).toContain(
      'connectionString, pool, brokers, kafka, kafkaClient, producer, producerOptions',
    );
    expect((err as Error).message).toContain('cleanupBatchSize, cleanupRowsPerSecond, logger.');
    const every: Required<RelayOptions> = {
      connectionString: UNREACHABLE,
      pool: deadPool(),
      brokers: ['127.0.0.1:1'],
      kafka,
      kafkaClient: 'kafkajs',
      producer: nullProducer,
      producerOptions: { retries: 1, requestTimeoutMs: 1_000, compression: 0 },
      schema: 'outboxkit',
      relayId: 'r1',
      batchSize: 1,
      maxBatchBytes: 1_000,
      pollIntervalMs: 100,
      listen: false,
      leaseMs: 2_000,
      brokerTimeoutMs: 500,
      retryInitialMs: 10,
      retryMaxMs: 20,
      verifyTopics: false,
      maxAttempts: 1,
      holdKeyBehindFailure: true,
      publishedRetentionMs: 0,
      cleanupIntervalMs: 1_000,
      cleanupBatchSize: 1,
      cleanupRowsPerSecond: 0,
      logger: noopLogger,
    };
    expect(resolveRelayOptions(every).leaseMs).toBe(2_000);
  });

  it('refuses a misspelt producerOptions name (onSend is the relay’s own)', async () => {
    await expectUnknown(
      () => new Relay({ pool: deadPool(), kafka, producerOptions: { compresion: 1 } as never }),
      'createRelay producerOptions',
      'compresion',
    );
    await expectUnknown(
      () => new Relay({ pool: deadPool(), kafka, producerOptions: { onSend: () => {} } as never }),
      'createRelay producerOptions',
      'onSend',
    );
  });

  it('createKafkajsProducer and relayReadiness refuse a misspelt option', async () => {
    await expectUnknown(() => createKafkajsProducer(kafka, { retry: 1 } as never), 'createKafkajsProducer', 'retry');
    const relay = new Relay({ pool: deadPool(), producer: nullProducer });
    await expectUnknown(() => relayReadiness(relay, deadPool(), { timeout: 1 } as never), 'relayReadiness', 'timeout');
    expect(typeof relayReadiness(relay, deadPool(), { timeoutMs: 1 })).toBe('function');
  });
});

describe('migrate() and cleanupExpiredKeys() refuse before touching the database', () => {
  it('migrate({ schem }) rejects without connecting', async () => {
    await expectUnknown(
      () => migrate({ connectionString: UNREACHABLE, schem: 'tenant_a' } as never),
      'migrate',
      'schem',
    );
    // With a client: not one call on it.
    const calls: string[] = [];
    const client = new Proxy(
      {},
      {
        get: (_target, name) => () => {
          calls.push(String(name));
          throw new Error(`client.${String(name)}() called`);
        },
      },
    );
    await expectUnknown(() => migrate({ client, schem: 'tenant_a' } as never), 'migrate', 'schem');
    expect(calls).toEqual([]);
    // Without the typo the same call does reach the (closed) port: the check above is what stopped it.
    const reached = await errorOf(() => migrate({ connectionString: UNREACHABLE, schema: 'tenant_a' }));
    expect(isOutboxkitError(reached)).toBe(false);
  });

  it('cleanupExpiredKeys(pool, { batchSise }) rejects without connecting', async () => {
    const pool = deadPool();
    await expectUnknown(() => cleanupExpiredKeys(pool, { batchSise: 1 } as never), 'cleanupExpiredKeys', 'batchSise');
    expect(pool.totalCount).toBe(0);
    const reached = await errorOf(() => cleanupExpiredKeys(pool, { batchSize: 1 }));
    expect(isOutboxkitError(reached, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(false);
  });
});

describe('idempotency', () => {
  it('resolveIdempotencyOptions and resolveLeaseOptions refuse a misspelt option', async () => {
    await expectUnknown(
      () => resolveIdempotencyOptions({ lockTimeotMs: 5 } as never),
      'resolveIdempotencyOptions',
      'lockTimeotMs',
    );
    // A lease option is not a one-transaction option.
    await expectUnknown(
      () => resolveIdempotencyOptions({ leaseMs: 1_000 } as never),
      'resolveIdempotencyOptions',
      'leaseMs',
    );
    await expectUnknown(() => resolveLeaseOptions({ leaseMS: 1_000 } as never), 'resolveLeaseOptions', 'leaseMS');
  });

  it('accepts every option of its type; resolved objects pass back in unchecked', () => {
    const o = resolveIdempotencyOptions({
      schema: 'outboxkit',
      policy: 'wait',
      lockTimeoutMs: 5,
      waitTimeoutMs: 10,
      retentionMs: 60_000,
      replayHeaders: ['etag'],
      readFirst: false,
      retryAfterSeconds: 2,
      logger: undefined,
      registry: new Registry(),
      onOutcome: () => {},
    });
    expect(resolveIdempotencyOptions(o)).toBe(o);
    const l = resolveLeaseOptions({
      policy: 'async',
      leaseMs: 1_000,
      pollIntervalMs: 50,
      renewEveryMs: 300,
      operationLocation: (id) => `/operations/${id}`,
      retentionMs: 60_000,
      replayHeaders: ['etag'],
    });
    expect(resolveLeaseOptions(l)).toBe(l);
    expect(l.base.retentionMs).toBe(60_000);
  });

  it('executeIdempotent, executeWithoutKey and executeLeased refuse before any query', async () => {
    const pool = deadPool();
    await expectUnknown(
      () => executeIdempotent(pool, request, handler, { lockTimeotMs: 5 } as never),
      'executeIdempotent',
      'lockTimeotMs',
    );
    await expectUnknown(
      () => executeWithoutKey(pool, handler, { polcy: 'wait' } as never),
      'executeWithoutKey',
      'polcy',
    );
    await expectUnknown(
      () => executeLeased(pool, request, handler, { leaseMS: 5 } as never),
      'executeLeased',
      'leaseMS',
    );
    expect(pool.totalCount).toBe(0);
  });

  it('reconcileUncertain, serveOperation and idempotencyGauges refuse before any query', async () => {
    const pool = deadPool();
    await expectUnknown(
      () => reconcileUncertain(pool, 'pay', async () => ({ outcome: 'unknown' }), { limt: 5 } as never),
      'reconcileUncertain',
      'limt',
    );
    await expectUnknown(
      () => serveOperation(pool, { tenant: 'acme', operation: 'pay', operationId: 'x' }, { retryAfter: 5 } as never),
      'serveOperation',
      'retryAfter',
    );
    await expectUnknown(
      () => idempotencyGauges(pool, new Registry(), { schem: 'a' } as never),
      'idempotencyGauges',
      'schem',
    );
    expect(pool.totalCount).toBe(0);
  });

  it('reject() and parseIdempotencyKey() refuse a misspelt option', async () => {
    await expectUnknown(() => reject(404, {}, { stor: false } as never), 'reject', 'stor');
    expect(reject(409, {}, { store: false, headers: { etag: '"1"' } }).status).toBe(409);
    await expectUnknown(
      () => parseIdempotencyKey(undefined, { requird: true } as never),
      'parseIdempotencyKey',
      'requird',
    );
    expect(parseIdempotencyKey('abc', { required: true })).toBe('abc');
  });
});

describe('HTTP routes', () => {
  const db = deadPool();

  it('resolveRoute refuses a misspelt route or idempotency option, and accepts all of them', async () => {
    await expectUnknown(
      () =>
        resolveRoute({ db, operation: 'op', resolveTenant, polcy: 'wait' } as never, handler, 'idempotentHandler()'),
      'idempotentHandler()',
      'polcy',
    );
    await expectUnknown(
      () =>
        resolveRoute(
          { db, operation: 'op', resolveTenant, semanticHeader: [] } as never,
          handler,
          'idempotentHandler()',
        ),
      'idempotentHandler()',
      'semanticHeader',
    );
    // A lease-mode option has no meaning on a one-transaction route.
    await expectUnknown(
      () =>
        resolveRoute({ db, operation: 'op', resolveTenant, leaseMs: 1_000 } as never, handler, 'idempotentHandler()'),
      'idempotentHandler()',
      'leaseMs',
    );
    const route = resolveRoute(
      {
        db,
        operation: 'op',
        resolveTenant,
        semanticHeaders: ['Accept-Language'],
        required: false,
        maxBodyBytes: 10,
        policy: 'wait',
        lockTimeoutMs: 5,
        retryAfterSeconds: 3,
      },
      handler,
      'idempotentHandler()',
    );
    expect(route.opts.policy).toBe('wait');
    expect(route.semanticHeaders).toEqual(['accept-language']);
  });

  it('resolveLeaseRoute refuses a misspelt option, and `required` (always required in lease mode)', async () => {
    await expectUnknown(
      () =>
        resolveLeaseRoute({ db, operation: 'op', resolveTenant, renewEvery: 10 } as never, handler, 'leasedHandler()'),
      'leasedHandler()',
      'renewEvery',
    );
    await expectUnknown(
      () =>
        resolveLeaseRoute({ db, operation: 'op', resolveTenant, required: false } as never, handler, 'leasedHandler()'),
      'leasedHandler()',
      'required',
    );
    const route = resolveLeaseRoute(
      {
        db,
        operation: 'op',
        resolveTenant,
        semanticHeaders: [],
        maxBodyBytes: 10,
        deadline: () => undefined,
        policy: 'async',
        operationLocation: (id) => `/ops/${id}`,
        leaseMs: 1_000,
        renewEveryMs: 300,
        pollIntervalMs: 50,
        waitTimeoutMs: 100,
      },
      handler,
      'leasedHandler()',
    );
    expect(route.opts.policy).toBe('async');
  });

  it('operationRoute refuses a misspelt option', async () => {
    await expectUnknown(
      () => operationRoute({ db, operation: 'op', resolveTenant, schem: 'a' } as never, 'operationHandler()'),
      'operationHandler()',
      'schem',
    );
    expect(typeof operationRoute({ db, operation: 'op', resolveTenant, schema: 'a' }, 'operationHandler()')).toBe(
      'function',
    );
  });

  it.each([
    ['express', express],
    ['fastify', fastify],
  ] as const)('the %s adapters refuse a misspelt option when the route is built', async (_name, adapter) => {
    await expectUnknown(
      () => adapter.idempotentHandler({ db, operation: 'op', resolveTenant, polcy: 'wait' } as never, handler),
      'idempotentHandler()',
      'polcy',
    );
    await expectUnknown(
      () => adapter.leasedHandler({ db, operation: 'op', resolveTenant, leaseMS: 5 } as never, handler),
      'leasedHandler()',
      'leaseMS',
    );
    await expectUnknown(
      () => adapter.operationHandler({ db, operation: 'op', resolveTenant, schem: 'a' } as never),
      'operationHandler()',
      'schem',
    );
  });

  it('registerRawJsonBody refuses a misspelt option before touching the instance', async () => {
    const touched: string[] = [];
    const app = {
      hasContentTypeParser: () => (touched.push('has'), false),
      removeContentTypeParser: () => void touched.push('remove'),
      addContentTypeParser: () => void touched.push('add'),
    };
    await expectUnknown(
      () => fastify.registerRawJsonBody(app, { bodylimit: 10 } as never),
      'registerRawJsonBody',
      'bodylimit',
    );
    expect(touched).toEqual([]);
  });
});
