import { logLevel } from 'kafkajs';
import { describe, expect, it } from 'vitest';
import { kafkajsLogCreator } from '../../src/kafka/kafkajs/log.js';
import type { Logger } from '../../src/logger.js';

describe('kafkajs logs through the CLI logger', () => {
  it("says kafkajs's finite-retries warning at debug, every time; other warnings stay warnings", () => {
    const seen: [string, string][] = [];
    const at = (level: string) => (_fields: unknown, message?: string) => void seen.push([level, message ?? '']);
    const logger = { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') } as Logger;
    const entry = kafkajsLogCreator(logger)(logLevel.INFO);
    const log = (level: logLevel, message: string) =>
      entry({ namespace: 'Producer', level, label: 'WARN', log: { timestamp: 'now', logger: 'kafkajs', message } });
    const finite = 'Limiting retries for the idempotent producer may invalidate EoS guarantees';
    log(logLevel.WARN, finite);
    log(logLevel.WARN, finite);
    log(logLevel.WARN, 'something else');
    log(logLevel.ERROR, 'Failed to send messages');
    expect(seen).toEqual([
      ['debug', `kafkajs: ${finite}`],
      ['debug', `kafkajs: ${finite}`],
      ['warn', 'kafkajs: something else'],
      ['error', 'kafkajs: Failed to send messages'],
    ]);
  });

  it("keeps kafkajs's namespace and the entry's fields (broker, clientId), and drops its timestamp and logger name", () => {
    const seen: [string, Record<string, unknown>, string][] = [];
    const at = (level: string) => (fields: Record<string, unknown>, message?: string) =>
      void seen.push([level, fields, message ?? '']);
    const logger = { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') } as Logger;
    const entry = kafkajsLogCreator(logger)(logLevel.DEBUG);
    entry({
      namespace: 'Connection',
      level: logLevel.ERROR,
      label: 'ERROR',
      log: {
        timestamp: 'now',
        logger: 'kafkajs',
        message: 'Connection error: connect ECONNREFUSED 127.0.0.1:1',
        broker: '127.0.0.1:1',
        clientId: 'outboxkit-relay',
      },
    });
    entry({
      namespace: '',
      level: logLevel.DEBUG,
      label: 'DEBUG',
      log: { timestamp: 'now', logger: 'kafkajs', message: 'm' },
    });
    expect(seen).toEqual([
      [
        'error',
        { namespace: 'Connection', broker: '127.0.0.1:1', clientId: 'outboxkit-relay' },
        'kafkajs: Connection error: connect ECONNREFUSED 127.0.0.1:1',
      ],
      ['debug', {}, 'kafkajs: m'],
    ]);
  });
});
