/**
 * One error, on either client, for brokers that could not be reached at all (nothing listens, the
 * host name does not resolve, no route): {@link BrokerUnavailableError} whose message names the
 * broker addresses and the socket's reason, for example `Kafka brokers could not be reached
 * (127.0.0.1:1): connect ECONNREFUSED 127.0.0.1:1. ...`. kafkajs says only `Connection error:
 * connect ECONNREFUSED 127.0.0.1:1` (and names one broker), @platformatic/kafka `metadata failed 6
 * times.` with the reason four causes down. Each adapter recognises its own client's shape (by
 * error names and codes, never message text): src/kafka/kafkajs/errors.ts, src/kafka/platformatic/errors.ts.
 */
import { BrokerUnavailableError } from '../errors.js';

export { UNREACHABLE_SOCKET_CODES } from '../socket-codes.js';

/**
 * The error for brokers that could not be reached: retriable (the caller's backoff applies, as to
 * the client's own error), the client's error as `cause`.
 *
 * @param brokers - the addresses tried (the client's bootstrap brokers, or those its errors name).
 * @param reasons - the sockets' reasons, as Node.js words them (`connect ECONNREFUSED 127.0.0.1:1`).
 */
export function brokersUnreachableError(
  brokers: readonly string[],
  reasons: readonly string[],
  cause: unknown,
): BrokerUnavailableError {
  const where = brokers.length > 0 ? ` (${[...new Set(brokers)].join(', ')})` : '';
  return new BrokerUnavailableError(
    `Kafka brokers could not be reached${where}: ${[...new Set(reasons)].join('; ')}. ` +
      'Check the broker addresses (the brokers option, --brokers or KAFKA_BROKERS) and that the brokers run.',
    { cause },
  );
}
