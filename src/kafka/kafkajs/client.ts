/**
 * The kafkajs adapter's entry: a {@link KafkaClient} over a kafkajs `Kafka` instance. Every kafkajs
 * import of the library is in this folder.
 */
import { Kafka, logLevel as kafkajsLogLevel, type KafkaConfig } from 'kafkajs';
import { InvalidOptionsError, optionNames, refuseUnknownOptions } from '../../errors.js';
import type { Logger } from '../../logger.js';
import type { KafkaClient } from '../types.js';
import { kafkajsAdmin } from './admin.js';
import { isRetriableKafkaError, withUnreachableMessage } from './errors.js';
import { applyKafkajsRequestQueueFix } from './fix.js';
import { applyKafkajsMetadataFix } from './metadata-fix.js';
import { kafkajsGroupConsumer } from './group-consumer.js';
import { kafkajsLogCreator } from './log.js';
import { kafkajsPartitionForKey, kafkajsProducer } from './producer.js';

export type { Kafka, KafkaConfig, SASLOptions } from 'kafkajs';

/** Lowest level of kafkajs's own log entries that are logged (kafkajs's `logLevel`, by name). */
export type KafkajsLogLevel = 'nothing' | 'error' | 'warn' | 'info' | 'debug';

const LOG_LEVELS: Record<KafkajsLogLevel, kafkajsLogLevel> = {
  nothing: kafkajsLogLevel.NOTHING,
  error: kafkajsLogLevel.ERROR,
  warn: kafkajsLogLevel.WARN,
  info: kafkajsLogLevel.INFO,
  debug: kafkajsLogLevel.DEBUG,
};

/**
 * Options of {@link createKafkajsClient}. They apply to the `Kafka` instance it makes from a
 * config; one you pass in keeps its own logging (giving them then is refused).
 */
export interface KafkajsClientOptions {
  /** Where kafkajs's log entries go (`kafkajs: <message>`, at their level). @defaultValue kafkajs's console logger */
  logger?: Logger;
  /** Lowest kafkajs level logged. @defaultValue 'warn' */
  logLevel?: KafkajsLogLevel;
}

const CLIENT_OPTION_NAMES = optionNames<KafkajsClientOptions>({ logger: true, logLevel: true });

/**
 * Whether `value` is an object whose `methods` are all functions: a test by shape, which also
 * passes an object of another copy of the library (an application may load two).
 */
function hasMethods(value: unknown, methods: readonly string[]): boolean {
  return (
    typeof value === 'object' &&
    value !== null &&
    methods.every((name) => typeof (value as Record<string, unknown>)[name] === 'function')
  );
}

/** Whether `value` looks like a kafkajs `Kafka` instance (its producer, consumer and admin factories). */
export function isKafkajsKafka(value: unknown): value is Kafka {
  return hasMethods(value, ['consumer', 'producer', 'admin']);
}

/**
 * A {@link KafkaClient} over kafkajs, from a `Kafka` instance or a kafkajs config (for example
 * `resolveKafkaConfig().kafkaConfig`).
 *
 * It applies {@link applyKafkajsRequestQueueFix} and {@link applyKafkajsMetadataFix} (once per
 * process): the fixes of kafkajs 2.2.4's idle 1 ms timer loop and of its metadata requests that fail
 * on any partition without a leader, to the copy of kafkajs outboxkit resolves (docs/kafka.md,
 * "kafkajs' 1 ms timer loop", "A partition without a leader"). So does every relay and dedup consumer made from a kafkajs client, since they make
 * theirs here; the library's constructors never patch kafkajs themselves.
 *
 * @throws {@link InvalidOptionsError} on an unknown option name, on `logger` or `logLevel` given
 *   with a `Kafka` instance, or on something that is neither an instance nor a config with brokers.
 */
export function createKafkajsClient(kafka: Kafka | KafkaConfig, options: KafkajsClientOptions = {}): KafkaClient {
  refuseUnknownOptions(options ?? {}, CLIENT_OPTION_NAMES, 'createKafkajsClient');
  let instance: Kafka;
  // Named in the error of a connect that reached none of them (unknown for an instance: kafkajs's error names one).
  let brokers: readonly string[] | undefined;
  if (isKafkajsKafka(kafka)) {
    if (options.logger !== undefined || options.logLevel !== undefined) {
      throw new InvalidOptionsError(
        'createKafkajsClient: logger and logLevel apply to a client made from a config; a Kafka instance keeps its own logging.',
      );
    }
    instance = kafka;
  } else if (typeof kafka === 'object' && kafka !== null && 'brokers' in kafka) {
    const level = options.logLevel ?? 'warn';
    if (!Object.hasOwn(LOG_LEVELS, level)) {
      throw new InvalidOptionsError(
        `createKafkajsClient: logLevel must be one of ${Object.keys(LOG_LEVELS).join(', ')}, got ${JSON.stringify(level)}.`,
      );
    }
    if (Array.isArray(kafka.brokers)) brokers = kafka.brokers;
    instance = new Kafka({
      ...kafka,
      logLevel: LOG_LEVELS[level],
      ...(options.logger ? { logCreator: kafkajsLogCreator(options.logger) } : {}),
    });
  } else {
    throw new InvalidOptionsError(
      'createKafkajsClient: give a kafkajs Kafka instance or a kafkajs config ({ clientId, brokers, ... }).',
    );
  }
  applyKafkajsRequestQueueFix();
  applyKafkajsMetadataFix();
  const reached = <T extends { connect(): Promise<void> }>(client: T): T =>
    namingUnreachable(client, (err) => withUnreachableMessage(err, brokers));
  return {
    producer: (settings) => reached(kafkajsProducer(instance, settings)),
    admin: () => reached(kafkajsAdmin(instance)),
    groupConsumer: (settings) => reached(kafkajsGroupConsumer(instance, settings)),
    isRetriable: isRetriableKafkaError,
    partitionForKey: kafkajsPartitionForKey,
  };
}

/**
 * `client` with its `connect()` rejecting with `rename(err)` instead of `err`: brokers that could
 * not be reached at all then reject with `BrokerUnavailableError` naming them (see
 * {@link withUnreachableMessage}), on both clients alike. The object is changed in place.
 */
export function namingUnreachable<T extends { connect(): Promise<void> }>(
  client: T,
  rename: (err: unknown) => unknown,
): T {
  const connect = client.connect.bind(client);
  client.connect = () =>
    connect().catch((err: unknown) => {
      throw rename(err);
    });
  return client;
}

/** `kafka` as a {@link KafkaClient}: a client as it is, a kafkajs `Kafka` instance through {@link createKafkajsClient}. */
export function kafkaClientOf(kafka: Kafka | KafkaClient): KafkaClient {
  return isKafkaClient(kafka) ? kafka : createKafkajsClient(kafka);
}

/** Whether `value` is a {@link KafkaClient} (as opposed to a kafkajs `Kafka` instance). */
export function isKafkaClient(value: unknown): value is KafkaClient {
  return hasMethods(value, ['groupConsumer', 'producer', 'admin']);
}
