/**
 * PostgreSQL and a single-node KRaft Kafka in Docker through testcontainers, for test runs on a
 * machine without local services or Java/Maven (see scripts/service-plan.ts for when).
 *
 * NOT RUN on this project's machines: they have no Docker engine (a `docker` CLI, no daemon). This
 * file is type-checked and its decision logic is unit-tested (test/unit/service-plan.test.ts); the
 * container start itself has never been exercised here. Report what you see if you run it.
 *
 * - Versions: testcontainers 11.x (`testcontainers`, `@testcontainers/postgresql`,
 *   `@testcontainers/kafka`) supports Node.js 20; 12.x needs Node.js 22.
 * - Kafka: `@testcontainers/kafka` drives Confluent Platform images (`confluentinc/cp-kafka`), not
 *   `apache/kafka`. Line 3 → `cp-kafka:7.9.1` (Apache Kafka 3.9), line 4 → `cp-kafka:8.2.0`
 *   (Apache Kafka 4.x, KRaft only); both run in KRaft mode with topic auto-creation off, as the
 *   Maven broker and docker-compose.yml do. The tags are the ones testcontainers-node's own tests
 *   use; Docker Hub was not reachable from here to check them.
 * - Cleanup: {@link StartedContainers.stop} stops what was started (test/global-setup.ts calls it
 *   at teardown); testcontainers' reaper (Ryuk) also removes the containers when the process that
 *   started them exits, unless `TESTCONTAINERS_RYUK_DISABLED=true`.
 * - Images can be overridden with `OUTBOXKIT_POSTGRES_IMAGE` / `OUTBOXKIT_KAFKA_IMAGE` (a
 *   Confluent `cp-kafka` image, 7.0.0 or later).
 */
import type { StartedKafkaContainer } from '@testcontainers/kafka';
import type { StartedPostgreSqlContainer } from '@testcontainers/postgresql';

export type Log = (msg: string) => void;

/** Default images per Kafka line (Apache Kafka major version). */
export const KAFKA_IMAGES = { 3: 'confluentinc/cp-kafka:7.9.1', 4: 'confluentinc/cp-kafka:8.2.0' } as const;
export const POSTGRES_IMAGE = 'postgres:16';

/** The plaintext listener `@testcontainers/kafka` exposes to the host (mapped to a random port). */
const KAFKA_HOST_PORT = 9093;

export interface StartedContainers {
  /** Set when PostgreSQL was started: a superuser URL (`postgres:postgres`) to the `postgres` database. */
  databaseUrl?: string;
  /** Set when Kafka was started: `host:mappedPort`. */
  kafkaBrokers?: string[];
  /** Stops every container this call started; idempotent. */
  stop(): Promise<void>;
}

/**
 * Starts the containers asked for (either or both) in parallel. If one fails, the other is
 * stopped before the error is thrown.
 *
 * @throws Error naming the image and the testcontainers error (image pull, start timeout).
 */
export async function startContainers(
  want: { postgres: boolean; kafka: boolean; kafkaLine?: 3 | 4 },
  log: Log = () => {},
): Promise<StartedContainers> {
  const started: Array<{ name: string; stop: () => Promise<unknown> }> = [];
  let stopped = false;
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    const results = await Promise.allSettled(started.map((c) => c.stop()));
    for (const [i, r] of results.entries()) {
      if (r.status === 'rejected') log(`could not stop the ${started[i]?.name} container: ${String(r.reason)}`);
    }
  };

  const tasks: Array<Promise<Partial<StartedContainers>>> = [];
  if (want.postgres) {
    tasks.push(
      startPostgres(log).then((c) => {
        started.push({ name: 'PostgreSQL', stop: () => c.stop() });
        return { databaseUrl: c.getConnectionUri() };
      }),
    );
  }
  if (want.kafka) {
    tasks.push(
      startKafka(want.kafkaLine ?? 3, log).then((c) => {
        started.push({ name: 'Kafka', stop: () => c.stop() });
        return { kafkaBrokers: [`${c.getHost()}:${c.getMappedPort(KAFKA_HOST_PORT)}`] };
      }),
    );
  }
  const results = await Promise.allSettled(tasks);
  const failures = results.flatMap((r) => (r.status === 'rejected' ? [r.reason as unknown] : []));
  if (failures.length > 0) {
    await stop();
    throw new Error(failures.map((e) => (e instanceof Error ? e.message : String(e))).join('\n'));
  }
  const out: StartedContainers = { stop };
  for (const r of results) if (r.status === 'fulfilled') Object.assign(out, r.value);
  return out;
}

async function startPostgres(log: Log): Promise<StartedPostgreSqlContainer> {
  const image = process.env.OUTBOXKIT_POSTGRES_IMAGE?.trim() || POSTGRES_IMAGE;
  log(`Starting PostgreSQL in Docker (${image}, testcontainers)`);
  // Loaded on demand: most runs never need testcontainers.
  const { PostgreSqlContainer } = await import('@testcontainers/postgresql');
  try {
    const c = await new PostgreSqlContainer(image)
      .withDatabase('postgres')
      .withUsername('postgres')
      .withPassword('postgres')
      .start();
    log(`PostgreSQL container ready at ${c.getHost()}:${c.getPort()}`);
    return c;
  } catch (err) {
    throw new Error(`Could not start PostgreSQL from ${image} with testcontainers: ${errorText(err)}`, { cause: err });
  }
}

async function startKafka(line: 3 | 4, log: Log): Promise<StartedKafkaContainer> {
  const image = process.env.OUTBOXKIT_KAFKA_IMAGE?.trim() || KAFKA_IMAGES[line];
  log(`Starting Kafka in Docker (${image}, KRaft, testcontainers)`);
  const { KafkaContainer } = await import('@testcontainers/kafka');
  try {
    const c = await new KafkaContainer(image)
      .withKraft()
      .withEnvironment({
        // Topics are created explicitly (tests use random names); a typo must fail, not create one.
        KAFKA_AUTO_CREATE_TOPICS_ENABLE: 'false',
        KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR: '1',
      })
      .start();
    log(`Kafka container ready at ${c.getHost()}:${c.getMappedPort(KAFKA_HOST_PORT)}`);
    return c;
  } catch (err) {
    throw new Error(`Could not start Kafka from ${image} with testcontainers: ${errorText(err)}`, { cause: err });
  }
}

/**
 * Whether a container runtime answers, as testcontainers sees it (its runtime strategies: the
 * environment's `DOCKER_HOST`, `~/.testcontainers.properties`, the Docker socket, rootless and
 * Podman sockets), so "reachable" means an engine answered a ping, not that a `docker` CLI exists.
 */
export async function probeDocker(): Promise<{ reachable: boolean; reason?: string }> {
  try {
    const { getContainerRuntimeClient } = await import('testcontainers');
    await getContainerRuntimeClient();
    return { reachable: true };
  } catch (err) {
    return { reachable: false, reason: errorText(err) };
  }
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
