/**
 * The @platformatic/kafka adapter's entry: a {@link KafkaClient} whose producer and admin run on
 * @platformatic/kafka (an optional peer dependency, loaded on the first connect), and so do the
 * dedup consumer's group members (group-consumer.ts).
 */
import type { ConnectionOptions as TlsOptions } from 'node:tls';
import { InvalidOptionsError } from '../../errors.js';
import type { KafkaConfig } from '../kafkajs/client.js';
import { kafkajsPartitionForKey } from '../kafkajs/producer.js';
import type { KafkaClient } from '../types.js';
import { platformaticAdmin } from './admin.js';
import { isRetriablePlatformaticError } from './errors.js';
import { platformaticGroupConsumer } from './group-consumer.js';
import { platformaticProducer, type PlatformaticConnection } from './producer.js';

/** SASL mechanisms by the names outboxkit's settings use (kafkajs's, lower case). */
const SASL_MECHANISMS: Record<string, string> = {
  plain: 'PLAIN',
  'scram-sha-256': 'SCRAM-SHA-256',
  'scram-sha-512': 'SCRAM-SHA-512',
};

/**
 * The client's connection settings from a kafkajs-shaped config (what `resolveKafkaConfig()`
 * gives, so that the CLI's flags, environment and config file apply to both clients): brokers,
 * client id, TLS (`ssl`), SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), connect and request
 * timeouts, client retries.
 *
 * @throws {@link InvalidOptionsError} for what the adapter cannot carry over: brokers given as a
 *   function, another SASL mechanism, a kafkajs `socketFactory`.
 */
export function platformaticConnection(config: KafkaConfig): PlatformaticConnection {
  if (!Array.isArray(config.brokers) || config.brokers.length === 0) {
    throw new InvalidOptionsError('createPlatformaticClient: brokers must be a non-empty array of host:port strings.');
  }
  if (config.socketFactory) {
    throw new InvalidOptionsError(
      'createPlatformaticClient: a kafkajs socketFactory cannot be used with @platformatic/kafka.',
    );
  }
  const out: PlatformaticConnection = {
    clientId: config.clientId ?? 'outboxkit',
    bootstrapBrokers: [...config.brokers],
  };
  if (config.ssl) out.tls = (config.ssl === true ? {} : config.ssl) satisfies TlsOptions;
  if (config.sasl) {
    const { mechanism } = config.sasl;
    const name = SASL_MECHANISMS[mechanism];
    if (!name || !('username' in config.sasl)) {
      throw new InvalidOptionsError(
        `createPlatformaticClient: SASL mechanism ${JSON.stringify(mechanism)} is not carried over to @platformatic/kafka; ` +
          `use ${Object.keys(SASL_MECHANISMS).join(', ')}.`,
      );
    }
    out.sasl = { mechanism: name, username: config.sasl.username, password: config.sasl.password };
  }
  if (config.connectionTimeout !== undefined) out.connectTimeout = config.connectionTimeout;
  if (config.requestTimeout !== undefined) out.requestTimeout = config.requestTimeout;
  if (config.retry?.retries !== undefined) out.retries = config.retry.retries;
  if (config.retry?.initialRetryTime !== undefined) out.retryDelay = config.retry.initialRetryTime;
  return out;
}

/**
 * A {@link KafkaClient} over @platformatic/kafka, from a kafkajs-shaped config (for example
 * `resolveKafkaConfig().kafkaConfig`; see {@link platformaticConnection} for what carries over).
 * Nothing loads or connects here: the package is loaded by the first `connect()` of a producer,
 * admin or group consumer, which rejects with {@link KafkaClientUnavailableError} when it is missing, of an
 * unsupported version, or needs a newer Node.js (docs/kafka.md, "Choosing a client").
 *
 * `partitionForKey` is Kafka's Java-client partitioner (kafkajs's implementation of it, a pure
 * function): this client's producers place keyed records with the same function
 * (test/kafka/partitioner.test.ts checks the three clients agree on 10,000 keys).
 *
 * @throws {@link InvalidOptionsError} for a config the adapter cannot carry over.
 */
export function createPlatformaticClient(config: KafkaConfig): KafkaClient {
  const connection = platformaticConnection(config);
  return {
    producer: (settings) => platformaticProducer(connection, settings),
    admin: () => platformaticAdmin(connection),
    groupConsumer: (settings) => platformaticGroupConsumer(connection, settings),
    partitionForKey: kafkajsPartitionForKey,
    isRetriable: isRetriablePlatformaticError,
  };
}
