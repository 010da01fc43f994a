/**
 * consumer/options.ts `resolveDedupConsumerOptions`: unknown option names are refused (the
 * known ones listed), every option docs/configuration.md documents is accepted, and the rules
 * between options (session timeout, heartbeat interval, fetch wait; retry delays) name both
 * options. Needs no infrastructure: neither the pool nor the Kafka client connects before `start()`.
 */
import { readFileSync } from 'node:fs';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { createDedupConsumer } from '../../../consumer/dedup-consumer.js';
import {
  DEDUP_CONSUMER_DEFAULTS,
  resolveDedupConsumerOptions,
  type DedupConsumerOptions,
} from '../../../consumer/options.js';
import { isOutboxkitError } from '../../../src/errors.js';
import { noopLogger } from '../../../src/logger.js';

const pool = new pg.Pool({ connectionString: 'postgres://nobody@127.0.0.1:1/none' });
const kafka = new Kafka({ brokers: ['127.0.0.1:1'], logLevel: logLevel.NOTHING });
afterAll(() => pool.end());

const base = (): DedupConsumerOptions<pg.Pool> => ({
  kafka,
  groupId: 'g',
  topics: ['orders'],
  database: pool,
  handler: async () => {},
});

/** The error `fn` throws (undefined when it returns). */
function thrown(fn: () => unknown): Error | undefined {
  try {
    fn();
  } catch (err) {
    return err as Error;
  }
  return undefined;
}

/** Option names in the table of docs/configuration.md's "Dedup consumer" section. */
function documentedOptions(): string[] {
  const doc = readFileSync('docs/configuration.md', 'utf8');
  const section = doc.slice(doc.indexOf('## Dedup consumer'), doc.indexOf('\nInbox cleanup'));
  return [...section.matchAll(/^\| `([A-Za-z]+)(?:\([^)]*\))?`/gm)].map((m) => m[1]!);
}

describe('resolveDedupConsumerOptions: unknown option names', () => {
  it('refuses a typo with InvalidOptionsError naming the key and listing the options', () => {
    const err = thrown(() => resolveDedupConsumerOptions({ ...base(), fromBeggining: true } as never));
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
    expect(err!.message).toContain('createDedupConsumer: unknown option "fromBeggining"; the options are ');
    expect(err!.message).toContain('fromBeginning');
  });

  it("refuses it through createDedupConsumer() too (the reviewer's case)", () => {
    const err = thrown(() => createDedupConsumer({ ...base(), bogus: true } as never));
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
    expect(err!.message).toContain('unknown option "bogus"');
  });

  it('names every unknown key, a case slip included', () => {
    const err = thrown(() => resolveDedupConsumerOptions({ ...base(), bogus: 1, maxattempts: 3 } as never));
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
    expect(err!.message).toContain('unknown options "bogus", "maxattempts";');
  });

  it('refuses an unknown key even when its value is undefined', () => {
    const err = thrown(() => resolveDedupConsumerOptions({ ...base(), fromBegining: undefined } as never));
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
    expect(err!.message).toContain('"fromBegining"');
  });

  it('checks names before values: a misspelt required option is reported as unknown', () => {
    const { groupId, ...rest } = base();
    const err = thrown(() => resolveDedupConsumerOptions({ ...rest, groupID: groupId } as never));
    expect(err!.message).toContain('unknown option "groupID";');
  });
});

describe('resolveDedupConsumerOptions: known options', () => {
  it('accepts known keys whose value is undefined and applies their defaults', () => {
    const o = resolveDedupConsumerOptions({
      ...base(),
      maxAttempts: undefined,
      fromBeginning: undefined,
      decode: undefined,
    });
    expect(o.maxAttempts).toBe(DEDUP_CONSUMER_DEFAULTS.maxAttempts);
    expect(o.fromBeginning).toBe(false);
    expect(o.decode).toBeUndefined();
  });

  it('accepts every documented option', () => {
    const decode = (value: Buffer) => value.toString();
    const hooks = { afterCommit: () => {} };
    const all: Required<DedupConsumerOptions<pg.Pool>> = {
      ...base(),
      schema: 'shipping',
      deadLetterTopic: (topic) => `${topic}.dead`,
      maxAttempts: 7,
      retryInitialMs: 20,
      retryMaxMs: 200,
      maxRetryLaterMs: 60_000,
      lockTimeoutMs: 1_000,
      transactionScope: 'batch',
      recordProgress: true,
      batchMaxMessages: 20,
      batchMaxMs: 500,
      partitionsConsumedConcurrently: 2,
      eventIdHeader: 'x-event-id',
      sessionTimeoutMs: 10_000,
      heartbeatIntervalMs: 1_000,
      fetchMaxWaitMs: 100,
      metadataMaxAgeMs: 5_000,
      autoCommitIntervalMs: 200,
      fromBeginning: true,
      inboxRetentionMs: 1_000_000_000,
      stuckAfterMs: 30_000,
      logger: noopLogger,
      hooks,
      decode,
      tracing: false,
    };
    expect(Object.keys(all).sort()).toEqual(documentedOptions().sort());
    const o = resolveDedupConsumerOptions(all);
    const { deadLetterTopic: _, ...plain } = all;
    expect(o).toMatchObject(plain);
    expect(o.deadLetterTopics.get('orders')).toBe('orders.dead');
    expect(() => createDedupConsumer(all)).not.toThrow();
  });
});

describe('batchMaxMessages above what PostgreSQL caches', () => {
  const warned = (options: Partial<DedupConsumerOptions<pg.Pool>>): string[] => {
    const messages: string[] = [];
    createDedupConsumer({ ...base(), ...options, logger: { ...noopLogger, warn: (_o, m) => messages.push(m ?? '') } });
    return messages;
  };

  it("warns at creation when 'batch' transactions may hold more than 64 subtransactions", () => {
    expect(warned({ transactionScope: 'batch', batchMaxMessages: 65 }).join()).toMatch(/batchMaxMessages is above 64/);
    expect(warned({ transactionScope: 'batch', batchMaxMessages: 64 })).toEqual([]);
    expect(warned({ transactionScope: 'message', batchMaxMessages: 500 })).toEqual([]);
  });
});

describe('rules between options', () => {
  /** The InvalidOptionsError message of `override` (fails the test when it is accepted). */
  const refusal = (override: Partial<DedupConsumerOptions<pg.Pool>>): string => {
    const err = thrown(() => resolveDedupConsumerOptions({ ...base(), ...override }));
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS'), String(err)).toBe(true);
    return err!.message;
  };

  it('refuses a heartbeat interval not below the session timeout, naming both and the values', () => {
    expect(refusal({ sessionTimeoutMs: 6_000, heartbeatIntervalMs: 6_000 })).toBe(
      'createDedupConsumer: heartbeatIntervalMs (6000) must be below sessionTimeoutMs (6000); a third of it is usual.',
    );
    // The default interval (3 s) above a session timeout lowered alone.
    expect(refusal({ sessionTimeoutMs: 2_000 })).toMatch(
      /heartbeatIntervalMs \(3000\) must be below sessionTimeoutMs \(2000\)/,
    );
  });

  it('refuses a fetch wait not below the session timeout, naming both and the values', () => {
    expect(refusal({ sessionTimeoutMs: 6_000, fetchMaxWaitMs: 6_000 })).toBe(
      'createDedupConsumer: fetchMaxWaitMs (6000) must be below sessionTimeoutMs (6000): an idle member heartbeats ' +
        'only between fetches, so a longer fetch wait expels it from the group. Lower fetchMaxWaitMs (default 500) ' +
        'or raise sessionTimeoutMs.',
    );
    expect(refusal({ fetchMaxWaitMs: 45_000 })).toMatch(
      /fetchMaxWaitMs \(45000\) must be below sessionTimeoutMs \(30000\)/,
    );
  });

  it('refuses a retry cap below the first retry delay, naming both and the values', () => {
    expect(refusal({ retryInitialMs: 500, retryMaxMs: 499 })).toBe(
      'createDedupConsumer: retryMaxMs (499) must be at least retryInitialMs (500).',
    );
  });

  it('accepts the edges: 1 ms below the session timeout, a cap equal to the first delay', () => {
    const o = resolveDedupConsumerOptions({
      ...base(),
      sessionTimeoutMs: 6_000,
      heartbeatIntervalMs: 5_999,
      fetchMaxWaitMs: 5_999,
      retryInitialMs: 500,
      retryMaxMs: 500,
    });
    expect(o).toMatchObject({ heartbeatIntervalMs: 5_999, fetchMaxWaitMs: 5_999, retryMaxMs: 500 });
    expect(resolveDedupConsumerOptions({ ...base(), fetchMaxWaitMs: 0 }).fetchMaxWaitMs).toBe(0);
  });
});

describe('resolveDedupConsumerOptions: maxRetryLaterMs', () => {
  it('defaults to 15 minutes, takes 0 (a RetryLaterError always counts), and refuses a negative or fractional value', () => {
    expect(resolveDedupConsumerOptions(base()).maxRetryLaterMs).toBe(900_000);
    expect(resolveDedupConsumerOptions({ ...base(), maxRetryLaterMs: 0 }).maxRetryLaterMs).toBe(0);
    for (const bad of [-1, 1.5, Number.POSITIVE_INFINITY, '1000']) {
      const err = thrown(() => resolveDedupConsumerOptions({ ...base(), maxRetryLaterMs: bad as number }));
      expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
      expect(err!.message).toContain('maxRetryLaterMs');
    }
  });
});

describe('metadataMaxAgeMs', () => {
  it('defaults to 30 s, takes 100 ms to a day, refuses what is outside', () => {
    expect(resolveDedupConsumerOptions(base()).metadataMaxAgeMs).toBe(30_000);
    expect(resolveDedupConsumerOptions({ ...base(), metadataMaxAgeMs: 100 }).metadataMaxAgeMs).toBe(100);
    for (const metadataMaxAgeMs of [99, 86_400_001]) {
      const err = thrown(() => resolveDedupConsumerOptions({ ...base(), metadataMaxAgeMs }));
      expect(err?.message).toMatch(/metadataMaxAgeMs.*from 100 to 86400000/);
    }
  });
});

describe('resolveDedupConsumerOptions: stuckAfterMs', () => {
  it('G7 defaults to 1 minute, takes 1 ms to a timer’s largest delay, and refuses anything else', () => {
    expect(resolveDedupConsumerOptions(base()).stuckAfterMs).toBe(60_000);
    expect(resolveDedupConsumerOptions({ ...base(), stuckAfterMs: 1 }).stuckAfterMs).toBe(1);
    expect(resolveDedupConsumerOptions({ ...base(), stuckAfterMs: 2_147_483_647 }).stuckAfterMs).toBe(2_147_483_647);
    for (const bad of [0, -1, 1.5, 2_147_483_648, Number.POSITIVE_INFINITY, '1000']) {
      const err = thrown(() => resolveDedupConsumerOptions({ ...base(), stuckAfterMs: bad as number }));
      expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS'), String(bad)).toBe(true);
      expect(err!.message).toMatch(/^createDedupConsumer: stuckAfterMs must be an integer from 1 to 2147483647, got /);
    }
  });
});
