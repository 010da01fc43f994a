/**
 * Shared setup of the dedup consumer tests: fast settings, a registry that stops every consumer a
 * test started, an event recorder, a producer of test messages and Kafka offset queries.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { Kafka, Producer } from 'kafkajs';
import { v7 as uuidv7 } from 'uuid';
import {
  createDedupConsumer,
  type DedupConsumer,
  type DedupConsumerEvents,
  type DedupConsumerOptions,
} from '../../consumer/index.js';
import type { DatabaseHandle } from '../../src/database.js';
import { HEADER_EVENT_ID, HEADER_EVENT_TYPE } from '../../src/outbox/event.js';
import type { KafkaClient } from '../../src/kafka/types.js';
import { createTopics, createTopicsOn, randomName, testConsumerKafka, testKafka } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';

/** Settings that keep the tests fast: short fetch waits and heartbeats, tiny retry delays. */
export const FAST = {
  sessionTimeoutMs: 10_000,
  heartbeatIntervalMs: 500,
  fetchMaxWaitMs: 100,
  autoCommitIntervalMs: 200,
  retryInitialMs: 10,
  retryMaxMs: 50,
  fromBeginning: true,
} as const;

type Overrides<D extends DatabaseHandle> = Omit<DedupConsumerOptions<D>, 'kafka' | 'groupId'> &
  Partial<Pick<DedupConsumerOptions<D>, 'kafka' | 'groupId'>>;

/** Starts consumers with {@link FAST} settings and stops all of them in `stopAll()` (afterEach). */
export class ConsumerRegistry {
  readonly #started: DedupConsumer[] = [];
  /** kafkajs, for the tests' own queries (offsets, topics). */
  readonly kafka: Kafka = testKafka('outboxkit-consumer-test');
  /** The client the consumers under test run on (TEST_KAFKA_CLIENT: kafkajs or @platformatic/kafka). */
  readonly client: Kafka | KafkaClient = testConsumerKafka('outboxkit-consumer-test');

  /** Creates a consumer (random group unless given) without starting it. */
  create<D extends DatabaseHandle>(options: Overrides<D>): DedupConsumer {
    const consumer = createDedupConsumer<D>({ ...FAST, kafka: this.client, groupId: randomName('group'), ...options });
    this.#started.push(consumer);
    return consumer;
  }

  async start<D extends DatabaseHandle>(options: Overrides<D>): Promise<DedupConsumer> {
    const consumer = this.create(options);
    await consumer.start();
    return consumer;
  }

  async stopAll(): Promise<void> {
    await Promise.all(this.#started.splice(0).map((c) => c.stop()));
  }
}

/** Everything a consumer emitted, in order. */
export interface Recorded {
  applied: DedupConsumerEvents['consumer:applied'][];
  duplicates: DedupConsumerEvents['consumer:duplicate'][];
  retries: DedupConsumerEvents['consumer:retry'][];
  deadLettered: DedupConsumerEvents['consumer:dead-lettered'][];
  errors: DedupConsumerEvents['consumer:error'][];
  crashes: DedupConsumerEvents['consumer:crash'][];
}

export function record(consumer: DedupConsumer): Recorded {
  const r: Recorded = { applied: [], duplicates: [], retries: [], deadLettered: [], errors: [], crashes: [] };
  consumer.on('consumer:applied', (e) => r.applied.push(e));
  consumer.on('consumer:duplicate', (e) => r.duplicates.push(e));
  consumer.on('consumer:retry', (e) => r.retries.push(e));
  consumer.on('consumer:dead-lettered', (e) => r.deadLettered.push(e));
  consumer.on('consumer:error', (e) => r.errors.push(e));
  consumer.on('consumer:crash', (e) => r.crashes.push(e));
  return r;
}

/** A test message. `eventId: null` leaves the event id header out; a string sets it as is. */
export interface TestMessage {
  partition: number;
  value: unknown;
  key?: string;
  eventId?: string | null;
  headers?: Record<string, string>;
}

/** A plain producer for test input (what the relay would have written). */
export class TestProducer {
  readonly #producer: Producer;
  #connected: Promise<void> | undefined;

  constructor(kafka: Kafka = testKafka('outboxkit-consumer-test-producer')) {
    // More retries than kafkajs's 5 (about 9 s): a loaded broker can take longer to host a new topic.
    this.#producer = kafka.producer({ retry: { retries: 10 } });
  }

  /** Sends in one request (messages of one partition land in one record batch, in order); returns the event ids. */
  async send(topic: string, messages: TestMessage[]): Promise<(string | null)[]> {
    this.#connected ??= this.#producer.connect();
    await this.#connected;
    const ids = messages.map((m) => (m.eventId === undefined ? uuidv7() : m.eventId));
    await this.#producer.send({
      topic,
      acks: -1,
      messages: messages.map((m, i) => {
        const headers: Record<string, string> = { [HEADER_EVENT_TYPE]: 'test.event', ...m.headers };
        const id = ids[i];
        if (id !== null && id !== undefined) headers[HEADER_EVENT_ID] = id;
        return { partition: m.partition, key: m.key ?? null, value: JSON.stringify(m.value), headers };
      }),
    });
    return ids;
  }

  async close(): Promise<void> {
    if (this.#connected) await this.#producer.disconnect();
  }
}

/** Committed offset of each partition of `topic` for `groupId` (-1 when none), by partition. */
export async function committedOffsets(kafka: Kafka, groupId: string, topic: string): Promise<Map<number, number>> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    const [entry] = await admin.fetchOffsets({ groupId, topics: [topic] });
    return new Map((entry?.partitions ?? []).map((p) => [p.partition, Number(p.offset)]));
  } finally {
    await admin.disconnect();
  }
}

/** Log end offset (high watermark) of each partition of `topic`, by partition. */
export async function logEndOffsets(kafka: Kafka, topic: string): Promise<Map<number, number>> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    return new Map((await admin.fetchTopicOffsets(topic)).map((p) => [p.partition, Number(p.high)]));
  } finally {
    await admin.disconnect();
  }
}

/** True when the group's committed offsets equal the log end of every partition of `topic`. */
export async function committedAtLogEnd(kafka: Kafka, groupId: string, topic: string): Promise<boolean> {
  const [committed, ends] = await Promise.all([committedOffsets(kafka, groupId, topic), logEndOffsets(kafka, topic)]);
  for (const [partition, end] of ends) {
    const offset = committed.get(partition) ?? -1;
    if (end === 0 ? offset > 0 : offset !== end) return false;
  }
  return true;
}

/**
 * Creates topics with random names (3 partitions) and, for each, its dead-letter topic named by
 * the consumer's default (`<topic>.dlq`). Returns the source topic names in the order of `prefixes`.
 */
export async function createTopicsWithDlq(prefixes: string[], partitions = 3): Promise<string[]> {
  const topics = await createTopics(prefixes, { partitions });
  await createTopicsOn(
    testKafka(),
    topics.map((topic) => ({ topic: `${topic}.dlq`, numPartitions: 1, replicationFactor: 1 })),
  );
  return topics;
}

const CRASH_CONSUMER = fileURLToPath(new URL('./fixtures/crash-consumer.ts', import.meta.url));

/** A running fixtures/crash-consumer.ts child process. */
export interface ChildConsumer {
  proc: ChildProcess;
  /** Everything the child printed to stdout so far. */
  stdout(): string;
  stderr(): string;
  /** Resolves with the exit code and signal once the child exits. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** True while the child runs. */
  alive(): boolean;
  /** The `COMMITTED` lines printed so far. */
  committed(): { id: string; partition: number; offset: number; outcome: string }[];
}

/**
 * Starts fixtures/crash-consumer.ts in a real child process (see its doc for `env`) and resolves
 * once it printed `READY` (it consumes). The caller must SIGKILL it (afterEach) if it still runs.
 *
 * @throws when the child exits or does not start within 30 s (with its stderr).
 */
export async function startChildConsumer(env: Record<string, string>): Promise<ChildConsumer> {
  const proc = spawn(process.execPath, ['--import', 'tsx', CRASH_CONSUMER], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  proc.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
  proc.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  let done = false;
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    proc.once('exit', (code, signal) => {
      done = true;
      resolve({ code, signal });
    }),
  );
  const child: ChildConsumer = {
    proc,
    stdout: () => stdout,
    stderr: () => stderr,
    exited,
    alive: () => !done,
    committed: () =>
      [...stdout.matchAll(/^COMMITTED (\S+) (\d+) (\d+) (\w+)$/gm)].map((m) => ({
        id: m[1]!,
        partition: Number(m[2]),
        offset: Number(m[3]),
        outcome: m[4]!,
      })),
  };
  try {
    await waitFor(() => stdout.includes('READY') || done, { timeoutMs: 30_000 });
  } catch (err) {
    proc.kill('SIGKILL');
    throw new Error(`the child consumer did not start within 30 s: ${stderr}`, { cause: err });
  }
  if (!stdout.includes('READY')) throw new Error(`the child consumer exited before it started: ${stderr}`);
  return child;
}
