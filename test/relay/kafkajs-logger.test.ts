/**
 * kafkajs's own log entries of the client a relay makes from `brokers` go to the relay's `logger`
 * (src/kafka/kafkajs/log.ts), at their level and with kafkajs's fields (`namespace`, `broker`),
 * instead of kafkajs's console logger; without a logger they stay on the console, as before.
 * Nothing listens on 127.0.0.1:1, so kafkajs logs connection errors at ERROR at once.
 */
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { Relay } from '../../relay/index.js';
import type { Logger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db?.drop();
});

describe("kafkajs's log of a relay made from brokers", () => {
  it("goes to the relay's logger, at its level, with kafkajs's namespace and broker; not to the console", async () => {
    const entries: { level: string; fields: Record<string, unknown>; message: string }[] = [];
    const at =
      (level: string) =>
      (fields: Record<string, unknown>, message = '') =>
        void entries.push({ level, fields, message });
    const logger: Logger = { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') };
    const consoleError = vi.spyOn(console, 'error').mockImplementation(() => undefined);
    const relay = new Relay({
      connectionString: db.url,
      brokers: ['127.0.0.1:1'],
      leaseMs: 2_000,
      brokerTimeoutMs: 1_500,
      logger,
    });
    try {
      await relay.start();
      const kafkajs = () => entries.filter((e) => e.message.startsWith('kafkajs: '));
      await waitFor(() => kafkajs().some((e) => e.level === 'error' && e.fields.namespace === 'Connection'), {
        timeoutMs: 10_000,
        message: () => JSON.stringify(entries.slice(-5)),
      });
      expect(kafkajs().find((e) => e.fields.namespace === 'Connection')).toMatchObject({
        level: 'error',
        message: 'kafkajs: Connection error: connect ECONNREFUSED 127.0.0.1:1',
        fields: { namespace: 'Connection', broker: '127.0.0.1:1', clientId: 'outboxkit-relay' },
      });
      // kafkajs's console logger writes its ERROR entries with console.error: none of them.
      expect(consoleError.mock.calls.filter((c) => String(c[0]).includes('"logger":"kafkajs"'))).toEqual([]);
    } finally {
      await relay.stop();
      consoleError.mockRestore();
    }
  });
});
