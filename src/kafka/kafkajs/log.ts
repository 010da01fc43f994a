/**
 * kafkajs's log entries through outboxkit's {@link Logger} (a pino logger in the CLI).
 */
import { logLevel as kafkaLogLevel, type logCreator } from 'kafkajs';
import type { Logger } from '../../logger.js';

/**
 * kafkajs's warning for every idempotent producer created with finite retries. Logged at debug,
 * never at warn: outboxkit's producers always have finite retries on purpose (a failing send must
 * surface, src/kafka/kafkajs/producer.ts), so it came at every relay start and after each failed
 * send, with nothing for an operator to do. It is harmless here: what it warns of is a send whose
 * retries are spent and that is sent again, and so may be written twice; outboxkit promises at
 * least once, not exactly once (a duplicate carries the same `event-id`, which the dedup consumer
 * absorbs), and keeps each key's order by sending no batch before the previous one is acknowledged
 * (docs/kafka.md, Known warnings). The producer's settings are unchanged: only the log level is.
 */
const FINITE_RETRIES_WARNING = 'Limiting retries for the idempotent producer may invalidate EoS guarantees';

/**
 * kafkajs log entries through a pino-style logger, at the client's `logLevel` and above (kafkajs
 * filters by level before it calls the creator): ERROR to `error`, WARN to `warn`, INFO to `info`,
 * DEBUG to `debug`. The message reads `kafkajs: <message>`; the entry's fields are kept (`broker`,
 * `clientId`, `stack`, `retryCount`...), with kafkajs's `namespace` (`Connection`, `BrokerPool`,
 * `Producer`...), which kafkajs's console logger shows as `[Connection]`.
 */
export function kafkajsLogCreator(logger: Logger): logCreator {
  return () =>
    ({ namespace, level, log }) => {
      const { message, timestamp: _t, logger: _l, ...rest } = log as Record<string, unknown>;
      const fields = namespace ? { namespace, ...rest } : rest;
      const text = `kafkajs: ${String(message)}`;
      if (level === kafkaLogLevel.WARN && message === FINITE_RETRIES_WARNING) return logger.debug(fields, text);
      if (level <= kafkaLogLevel.ERROR) logger.error(fields, text);
      else if (level === kafkaLogLevel.WARN) logger.warn(fields, text);
      else if (level === kafkaLogLevel.INFO) logger.info(fields, text);
      else logger.debug(fields, text);
    };
}
