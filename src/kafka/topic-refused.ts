/**
 * CreateTopics refused for the request's own sake (a bad configuration entry, too many replicas,
 * a policy), as opposed to a cluster that cannot serve it now: both Kafka adapters turn such an
 * answer into {@link InvalidOptionsError} naming the topic, the broker's error name and its reason.
 */
import { InvalidOptionsError } from '../errors.js';

/**
 * Kafka protocol error codes by which a broker refuses a CreateTopics request for what it asks
 * (Kafka's protocol error table): no retry of the same request can pass.
 */
export const TOPIC_REFUSAL_CODES: ReadonlySet<number> = new Set([
  17, // INVALID_TOPIC_EXCEPTION
  29, // TOPIC_AUTHORIZATION_FAILED
  37, // INVALID_PARTITIONS
  38, // INVALID_REPLICATION_FACTOR
  39, // INVALID_REPLICA_ASSIGNMENT
  40, // INVALID_CONFIG
  44, // POLICY_VIOLATION
]);

/**
 * The error for a topic the broker refused to create.
 *
 * @param topic - the topic asked for.
 * @param errorName - the broker's error name (INVALID_CONFIG, ...).
 * @param reason - why: the broker's own message, or what the adapter found.
 * @param cause - the Kafka client's error.
 */
export function topicRefusedError(
  topic: string,
  errorName: string,
  reason: string,
  cause: unknown,
): InvalidOptionsError {
  return new InvalidOptionsError(
    `Kafka refused to create topic ${JSON.stringify(topic)}: ${errorName}: ${reason.replace(/\.$/, '')}.`,
    { cause },
  );
}
