/**
 * Which PostgreSQL and which Kafka broker the tests, the demo and `services:up` use: a pure
 * decision over facts that {@link ../scripts/services.ts} gathers (environment, what answers
 * locally, which toolchains exist, whether a Docker engine answers). No I/O here, so every branch
 * is unit-tested (test/unit/service-plan.test.ts).
 *
 * Order of preference, per service:
 *
 * | PostgreSQL                                   | Kafka                                              |
 * | -------------------------------------------- | -------------------------------------------------- |
 * | 1. `DATABASE_URL`                            | 1. `KAFKA_BROKERS`                                 |
 * | 2. whatever answers on 127.0.0.1:5432        | 2. whatever answers on 127.0.0.1:9092              |
 * | 3. the local Debian cluster (`pg_ctlcluster`) | 3. a broker from Maven Central (Java 17+ and Maven) |
 * | 4. a testcontainer (Docker engine answers)   | 4. a testcontainer (Docker engine answers)         |
 * | 5. an error naming what is missing           | 5. an error naming what is missing                 |
 *
 * With `OUTBOXKIT_KAFKA_NODES=3` Kafka's "local" is the 3-node cluster (127.0.0.1:9192, :9292,
 * :9392; scripts/broker-config.ts) and step 4 does not exist: no container path starts a cluster.
 * Which nodes to start is {@link planCluster}.
 *
 * Testcontainers come last: the local toolchains are what CI uses, and a container lives only as
 * long as the process that started it. They are never used:
 * - under `CI` (a CI run must test the services its script set up, e.g. `.ci/run` runs
 *   `npm run services:up` with Maven; silently switching to a Confluent image would make
 *   "CI ran against Apache Kafka 3.9.2" untrue);
 * - by the long-lived `services:up` command (its containers would stop when it exits: it points
 *   at `docker compose up -d --wait` instead).
 */

/** Where the facts say a Docker engine is, as testcontainers' runtime strategies see it. */
export interface DockerFact {
  /** True when a container runtime answered (not merely a `docker` CLI on the PATH). */
  reachable: boolean;
  /** Why not, for the error message (e.g. "Could not find a working container runtime strategy"). */
  reason?: string;
}

/** Everything the plan depends on. `undefined` facts were not probed because no branch needs them. */
export interface ServiceFacts {
  /** `DATABASE_URL`, trimmed; undefined when unset or blank. */
  databaseUrl: string | undefined;
  /** `KAFKA_BROKERS` split on commas; empty when unset or blank. */
  kafkaBrokers: readonly string[];
  postgres: {
    /**
     * The local server at the default URL: `answers`, `refused` (something listens but the
     * connection failed: auth, missing database; starting another server would not help) or
     * `down` (nothing listens).
     */
    local: 'answers' | 'refused' | 'down';
    /** A Debian cluster is installed (`/etc/postgresql/<major>/main`): `pg_ctlcluster` can start it. */
    clusterInstalled: boolean;
  };
  kafka: {
    /**
     * `OUTBOXKIT_KAFKA_NODES`: 1, the single broker on 127.0.0.1:9092, or 3, the local 3-node
     * cluster. @defaultValue 1
     */
    nodes?: 1 | 3;
    /**
     * A broker answers on 127.0.0.1:9092 (an admin client lists topics); with 3 nodes, every
     * node of the cluster answers.
     */
    localAnswers: boolean;
    /**
     * Java 17+ runs, and Maven runs or the broker's jars are already in `.services/`: the Maven
     * path can start a broker (or the cluster's missing nodes). `reason` says what is missing
     * otherwise.
     */
    maven: { ok: boolean; reason?: string } | undefined;
  };
  /** Probed only when a service has no other source left (see {@link needsDockerProbe}). */
  docker: DockerFact | undefined;
  /** `CI` is set to something other than `''`, `0` or `false`. */
  ci: boolean;
  /**
   * Whether the caller can use containers that live only as long as its process: true for the
   * test run, the demo and the benchmarks; false for `services:up`.
   */
  ephemeralOk: boolean;
}

export type PostgresPlan =
  | { action: 'use-env'; url: string }
  /** Use the default URL; `startCluster` first runs `pg_ctlcluster` (installed but down). */
  | { action: 'use-local'; startCluster: boolean }
  | { action: 'start-testcontainer' }
  | { action: 'error'; message: string };

export type KafkaPlan =
  | { action: 'use-env'; brokers: string[] }
  /** The single broker, or with 3 nodes the cluster, answers: use it. */
  | { action: 'use-local' }
  | { action: 'start-maven-broker' }
  /** Start the cluster's missing nodes ({@link planCluster} says which). */
  | { action: 'start-maven-cluster' }
  | { action: 'start-testcontainer' }
  | { action: 'error'; message: string };

export interface ServicePlan {
  postgres: PostgresPlan;
  kafka: KafkaPlan;
}

const LOCAL_POSTGRES = '127.0.0.1:5432';
const LOCAL_KAFKA = '127.0.0.1:9092';
const LOCAL_CLUSTER = '127.0.0.1:9192,127.0.0.1:9292,127.0.0.1:9392';

/** `CI` as CI systems set it (`true`, `1`, a name); `''`, `0` and `false` mean not CI. */
export function isCi(value: string | undefined): boolean {
  const v = value?.trim().toLowerCase();
  return v !== undefined && v !== '' && v !== '0' && v !== 'false';
}

/**
 * True when some service has neither an environment variable, nor a local answer, nor a local
 * toolchain to start it, so whether a Docker engine answers decides between a container and an
 * error. The gatherer probes Docker only then (the probe loads testcontainers).
 */
export function needsDockerProbe(facts: Omit<ServiceFacts, 'docker'>): boolean {
  const pgNeeds =
    facts.databaseUrl === undefined && facts.postgres.local === 'down' && !facts.postgres.clusterInstalled;
  // No container path for the cluster: Docker changes nothing there.
  const kafkaNeeds =
    facts.kafka.nodes !== 3 &&
    facts.kafkaBrokers.length === 0 &&
    !facts.kafka.localAnswers &&
    facts.kafka.maven?.ok !== true;
  return pgNeeds || kafkaNeeds;
}

/** The plan for both services. Pure: same facts, same plan. */
export function planServices(facts: ServiceFacts): ServicePlan {
  return { postgres: planPostgres(facts), kafka: planKafka(facts) };
}

export function planPostgres(facts: ServiceFacts): PostgresPlan {
  if (facts.databaseUrl !== undefined) return { action: 'use-env', url: facts.databaseUrl };
  // `refused` also goes to the local path: ensurePostgres() reports the server's own error, and a
  // container could not bind the port that server holds anyway.
  if (facts.postgres.local !== 'down') return { action: 'use-local', startCluster: false };
  if (facts.postgres.clusterInstalled) return { action: 'use-local', startCluster: true };
  const container = containerVerdict(facts);
  if (container.ok) return { action: 'start-testcontainer' };
  return {
    action: 'error',
    message:
      `PostgreSQL: nothing answers at ${LOCAL_POSTGRES}, DATABASE_URL is not set, no local cluster is installed ` +
      `(/etc/postgresql/<major>/main), and ${container.why}. ` +
      `Fix one of: set DATABASE_URL to a running server; install PostgreSQL (Debian: apt-get install postgresql); ` +
      `${container.fix}`,
  };
}

export function planKafka(facts: ServiceFacts): KafkaPlan {
  if (facts.kafkaBrokers.length > 0) return { action: 'use-env', brokers: [...facts.kafkaBrokers] };
  if (facts.kafka.localAnswers) return { action: 'use-local' };
  if (facts.kafka.nodes === 3) {
    if (facts.kafka.maven?.ok === true) return { action: 'start-maven-cluster' };
    return {
      action: 'error',
      message:
        `Kafka: the 3-node cluster (OUTBOXKIT_KAFKA_NODES=3) does not answer at ${LOCAL_CLUSTER}, KAFKA_BROKERS is not set, ` +
        `and its nodes cannot be started from Maven Central (${facts.kafka.maven?.reason ?? 'Java 17+ and Maven were not checked'}). ` +
        'Fix one of: set KAFKA_BROKERS to a running cluster; install Java 17+ and Maven (npm run services:up); ' +
        'or unset OUTBOXKIT_KAFKA_NODES for the single broker (no container path starts a cluster).',
    };
  }
  if (facts.kafka.maven?.ok === true) return { action: 'start-maven-broker' };
  const container = containerVerdict(facts);
  if (container.ok) return { action: 'start-testcontainer' };
  const maven = facts.kafka.maven?.reason ?? 'Java 17+ and Maven were not checked';
  return {
    action: 'error',
    message:
      `Kafka: nothing answers at ${LOCAL_KAFKA}, KAFKA_BROKERS is not set, a broker cannot be started from Maven Central ` +
      `(${maven}), and ${container.why}. ` +
      `Fix one of: set KAFKA_BROKERS to a running broker; install Java 17+ and Maven (npm run services:up); ` +
      `${container.fix}`,
  };
}

type ContainerVerdict = { ok: true } | { ok: false; why: string; fix: string };

function containerVerdict(facts: ServiceFacts): ContainerVerdict {
  const docker = facts.docker;
  if (docker === undefined || !docker.reachable) {
    const reason = docker?.reason ? `: ${docker.reason}` : '';
    return {
      ok: false,
      why: `no Docker engine answers (testcontainers found no working container runtime${reason})`,
      fix:
        'or start a Docker engine (the `docker` CLI alone is not enough): the tests then start containers themselves, ' +
        'or run `docker compose up -d --wait` (docker-compose.yml).',
    };
  }
  if (facts.ci) {
    return {
      ok: false,
      why: 'CI is set, and testcontainers are not used under CI (a CI run tests the services its script started)',
      fix: 'or start the services in the CI script before the tests (npm run services:up as .ci/run does, or `docker compose up -d --wait`).',
    };
  }
  if (!facts.ephemeralOk) {
    return {
      ok: false,
      why: 'a Docker engine answers, but containers started by this command would stop when it exits',
      fix: 'or, since Docker answers, run `docker compose up -d --wait` (docker-compose.yml).',
    };
  }
  return { ok: true };
}

// ---------------------------------------------------------------------------------------------
// The local 3-node cluster
// ---------------------------------------------------------------------------------------------

/** One node of the local cluster as scripts/services.ts finds it. */
export interface ClusterNodeFact {
  /** `node.id`. */
  id: number;
  /** Its client address, for messages. */
  broker: string;
  /** A broker answers at that address (an admin client lists topics). */
  answers: boolean;
  /**
   * The Kafka version of the process this checkout started for the node (pid file under
   * `.services/cluster-<version>/node-<id>/`, command line checked), while it runs; undefined when
   * none runs. A node that answers without one was started by something else.
   */
  running: string | undefined;
}

export interface ClusterFacts {
  nodes: readonly ClusterNodeFact[];
  /** The version `OUTBOXKIT_KAFKA_VERSION` resolves to (its default when unset). */
  wanted: string;
  /** `OUTBOXKIT_KAFKA_VERSION` is set: a running cluster of another version deserves a warning. */
  wantedExplicitly: boolean;
}

export type ClusterPlan =
  /** Every node answers: use the cluster as it is (after the readiness check). */
  | { action: 'use-running'; warning?: string }
  /**
   * Start the nodes in `start` (with `version`, on their existing storage if any) and wait for
   * those in `wait` (started by this checkout, not answering yet: booting, or hung).
   */
  | { action: 'start'; version: string; start: number[]; wait: number[]; warning?: string }
  | { action: 'error'; message: string };

/**
 * Which nodes of the local cluster to start. Pure: the facts come from scripts/services.ts.
 *
 * - Nodes this checkout runs keep their version: a missing node joins them with the same one
 *   (storage and cluster id are per version), and asking for another version only warns, as for
 *   the single broker; nodes of two versions at once are an error.
 * - A node that answers without being ours (another checkout's cluster, or another program on its
 *   port) is used while every node answers; if some other node is missing, starting ours beside
 *   it cannot make a cluster (another cluster id), so that is an error naming the ports.
 */
export function planCluster(facts: ClusterFacts): ClusterPlan {
  const versions = [...new Set(facts.nodes.flatMap((n) => (n.running === undefined ? [] : [n.running])))];
  if (versions.length > 1) {
    return {
      action: 'error',
      message:
        `Kafka: nodes of the local cluster run different versions (${versions.join(', ')}). ` +
        'Stop them with `npm run services:down`, then start the cluster again.',
    };
  }
  const version = versions[0] ?? facts.wanted;
  const warning =
    versions[0] !== undefined && versions[0] !== facts.wanted && facts.wantedExplicitly
      ? `WARNING: OUTBOXKIT_KAFKA_VERSION asks for Kafka ${facts.wanted}, but the local cluster runs Kafka ${version}; ` +
        'using it. Run `npm run services:down` first to switch versions.'
      : undefined;
  const withWarning = warning === undefined ? {} : { warning };
  if (facts.nodes.every((n) => n.answers)) return { action: 'use-running', ...withWarning };

  const foreign = facts.nodes.filter((n) => n.answers && n.running === undefined);
  const start = facts.nodes.filter((n) => !n.answers && n.running === undefined);
  if (foreign.length > 0 && start.length > 0) {
    return {
      action: 'error',
      message:
        `Kafka: ${foreign.map((n) => n.broker).join(', ')} answer${foreign.length === 1 ? 's' : ''} but ` +
        `${foreign.length === 1 ? 'was' : 'were'} not started from this checkout, and ${start.map((n) => n.broker).join(', ')} ` +
        `${start.length === 1 ? 'is' : 'are'} down: a node started here would not join that cluster (another cluster id). ` +
        'Stop those brokers (`npm run services:down` in the checkout that started them), or set KAFKA_BROKERS to a cluster of your own.',
    };
  }
  return {
    action: 'start',
    version,
    start: start.map((n) => n.id),
    wait: facts.nodes.filter((n) => !n.answers && n.running !== undefined).map((n) => n.id),
    ...withWarning,
  };
}
