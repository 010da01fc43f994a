/**
 * kafkajs's log entries through outboxkit's {@link Logger} (a pino logger in the CLI).
 */
import { logLevel as kafkaLogLevel, type logCreator } from 'kafkajs';
import type { Logger } from '../../logger.js';

/**
 * kafkajs's warning for every idempotent producer created with finite retries, which the relay
 * does on purpose and again after each failed send (docs/kafka.md, Known warnings): said once per
 * process at warn, then at debug, so that a run of parked events does not flood the log.
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
  let finiteRetriesWarned = false;
  return () =>
    ({ namespace, level, log }) => {
      const { message, timestamp: _t, logger: _l, ...rest } = log as Record<string, unknown>;
      const fields = namespace ? { namespace, ...rest } : rest;
      const text = `kafkajs: ${String(message)}`;
      if (level === kafkaLogLevel.WARN && message === FINITE_RETRIES_WARNING) {
        if (finiteRetriesWarned) return logger.debug(fields, text);
        finiteRetriesWarned = true;
      }
      if (level <= kafkaLogLevel.ERROR) logger.error(fields, text);
      else if (level === kafkaLogLevel.WARN) logger.warn(fields, text);
      else if (level === kafkaLogLevel.INFO) logger.info(fields, text);
      else logger.debug(fields, text);
    };
}
