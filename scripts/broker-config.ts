/**
 * What the local Kafka brokers of {@link ../scripts/services.ts} are configured with: the port
 * layout of the 3-node cluster, the `server.properties` of the single broker and of each cluster
 * node, and which node is the active controller according to the nodes' KRaft storage. No I/O
 * here, so all of it is unit-tested (test/unit/broker-config.test.ts).
 *
 * Ports on 127.0.0.1 (client listener / KRaft controller listener):
 *
 * | broker                                         | client        | controller    |
 * | ---------------------------------------------- | ------------- | ------------- |
 * | the single broker                              | 9092          | 9093          |
 * | cluster node 1, 2, 3 (`OUTBOXKIT_KAFKA_NODES=3`) | 9192, 9292, 9392 | 9193, 9293, 9393 |
 *
 * The cluster's ports stay clear of the tests' own brokers (scratch brokers on 19092–19500 and
 * 21092–21300, the SASL/TLS test broker on 21000–31004) and of Linux's ephemeral range
 * (32768–60999, where the chaos harness picks free ports).
 */

/** Pinned versions per major line. Keep in step with `kafka3.version` / `kafka4.version` in the pom. */
export const KAFKA_LINES = { 3: '3.9.2', 4: '4.4.0' } as const;
export type KafkaLine = keyof typeof KAFKA_LINES;

/** The major line of an exact version (`4.x.y` → 4, anything else → 3). */
export function kafkaLine(version: string): KafkaLine {
  return version.startsWith('4.') ? 4 : 3;
}

export const LOCAL_HOST = '127.0.0.1';
/** The single broker's client listener. */
export const LOCAL_BROKER = `${LOCAL_HOST}:9092`;
/** The single broker's KRaft controller listener. */
export const CONTROLLER_ADDRESS = `${LOCAL_HOST}:9093`;

/** Node ids of the local cluster; each node is a broker and a KRaft voter. */
export const CLUSTER_NODE_IDS: readonly number[] = [1, 2, 3];

/**
 * Heap of each cluster node (MiB), `-Xms` = `-Xmx`: three nodes beside PostgreSQL on a 2-core,
 * 24 GiB machine, where 320–384 MiB per node is known to work. Measured resident memory: 300–350
 * MiB per node (3.9.2 and 4.4.0) after start and after test/cluster/. The single broker keeps
 * 512 MiB.
 */
export const CLUSTER_HEAP_MB = 384;
export const SINGLE_BROKER_HEAP_MB = 512;

/**
 * `broker.session.timeout.ms` of the cluster: how long the active controller waits without a
 * heartbeat before it fences a broker, i.e. moves the leadership of its partitions and drops it
 * from every ISR. Kafka's default is 9,000 ms; 6,000 ms (heartbeats every 1,000 ms) makes a killed
 * node's partitions move sooner in failover tests while leaving six missed heartbeats of margin on
 * a loaded 2-core machine. When the killed node was the active controller, its successor is
 * elected first and starts the clock when it takes over: the node is fenced about 9 s after the
 * kill (seen in the controllers' logs, `handleBrokerFenced`).
 */
export const CLUSTER_SESSION_TIMEOUT_MS = 6_000;
/** `broker.heartbeat.interval.ms` of the cluster (Kafka's default is 2,000 ms). */
export const CLUSTER_HEARTBEAT_INTERVAL_MS = 1_000;

/** Where one node of the local cluster listens. */
export interface ClusterNodeAddress {
  /** `node.id`, 1–3. */
  id: number;
  /** `host:port` of the PLAINTEXT listener clients use (advertised as is). */
  broker: string;
  /** `host:port` of the KRaft CONTROLLER listener. */
  controller: string;
}

/**
 * The local cluster's nodes: node `n` takes client port `9092 + 100·n` and controller port one
 * above it (9192/9193, 9292/9293, 9392/9393).
 */
export function clusterAddresses(): ClusterNodeAddress[] {
  return CLUSTER_NODE_IDS.map((id) => {
    const port = 9_092 + 100 * id;
    return { id, broker: `${LOCAL_HOST}:${port}`, controller: `${LOCAL_HOST}:${port + 1}` };
  });
}

/**
 * `OUTBOXKIT_KAFKA_NODES`: unset, blank or `1` → the single broker; `3` → the 3-node cluster.
 *
 * @throws Error for any other value, naming the accepted ones.
 */
export function resolveKafkaNodes(value = process.env.OUTBOXKIT_KAFKA_NODES): 1 | 3 {
  const v = (value ?? '').trim();
  if (v === '' || v === '1') return 1;
  if (v === '3') return 3;
  throw new Error(
    `OUTBOXKIT_KAFKA_NODES=${v} is not supported; use 1 (the single broker on ${LOCAL_BROKER}, the default) or 3 (a 3-node cluster on ${clusterAddresses()
      .map((n) => n.broker)
      .join(',')}).`,
  );
}

/** One broker's `server.properties` (see {@link serverProperties}). */
export interface BrokerConfig {
  /** Exact Kafka version: 4.x adds the share-group state topic's settings. */
  version: string;
  /** `node.id`. */
  nodeId: number;
  /** `host:port` of the PLAINTEXT listener, advertised as is. */
  listen: string;
  /** `host:port` of this node's CONTROLLER listener. */
  controller: string;
  /**
   * Every voter of the KRaft quorum, this node included (`controller.quorum.voters`, static
   * voters). One voter: the single-broker defaults (replication factor 1); three: the cluster's.
   */
  voters: readonly { id: number; controller: string }[];
  /** `log.dirs`: the directory that holds the partitions and the metadata log. */
  logDir: string;
}

/**
 * The `server.properties` of a combined broker + controller on loopback, sized for two cores.
 * With one voter, the single broker's settings (everything at one replica); with three, the
 * cluster's: `default.replication.factor=3`, `min.insync.replicas=2`, internal topics at three
 * replicas (two in sync for transactions), and the short session timeout
 * ({@link CLUSTER_SESSION_TIMEOUT_MS}). Setting names and defaults: Kafka's broker configuration
 * reference (https://kafka.apache.org/documentation/#brokerconfigs).
 */
export function serverProperties(config: BrokerConfig): string {
  const { version, nodeId, listen, controller, voters, logDir } = config;
  const cluster = voters.length > 1;
  const replicas = Math.min(3, voters.length);
  const minIsr = replicas >= 3 ? 2 : 1;
  const lines = [
    '# Written by scripts/services.ts on every start; edit scripts/broker-config.ts, not this file.',
    cluster
      ? `# Node ${nodeId} of a ${voters.length}-node KRaft cluster, broker and controller in one process, loopback only.`
      : '# Single-node KRaft, broker and controller in one process, loopback only.',
    'process.roles=broker,controller',
    `node.id=${nodeId}`,
    `controller.quorum.voters=${voters.map((v) => `${v.id}@${v.controller}`).join(',')}`,
    `listeners=PLAINTEXT://${listen},CONTROLLER://${controller}`,
    `advertised.listeners=PLAINTEXT://${listen}`,
    'inter.broker.listener.name=PLAINTEXT',
    'controller.listener.names=CONTROLLER',
    'listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT',
    '',
    '# Small machine (2 cores): few threads.',
    'num.network.threads=2',
    'num.io.threads=2',
    'background.threads=2',
    'num.replica.fetchers=1',
    'num.recovery.threads.per.data.dir=1',
    '',
    `log.dirs=${logDir}`,
    'num.partitions=1',
    `default.replication.factor=${replicas}`,
    `min.insync.replicas=${minIsr}`,
    '# Topics are created explicitly (tests use random names); a typo must fail, not create a topic.',
    'auto.create.topics.enable=false',
    'delete.topic.enable=true',
    '',
    cluster
      ? '# Internal topics: three replicas, two in sync for a transaction; few partitions so the first consumer'
      : '# Internal topics: one replica, few partitions so the first consumer group / transactional',
    cluster
      ? '# group / transactional producer does not wait for 50 partitions to be created.'
      : '# producer does not wait for 50 partitions to be created.',
    `offsets.topic.replication.factor=${replicas}`,
    'offsets.topic.num.partitions=3',
    `transaction.state.log.replication.factor=${replicas}`,
    `transaction.state.log.min.isr=${minIsr}`,
    'transaction.state.log.num.partitions=3',
    '# No 3 s wait before the first rebalance of a group (faster tests).',
    'group.initial.rebalance.delay.ms=0',
    '',
    '# A dev/test broker: keep a day, at most 128 MiB per partition, small segments.',
    'log.retention.hours=24',
    'log.retention.bytes=134217728',
    'log.segment.bytes=16777216',
    'log.retention.check.interval.ms=300000',
  ];
  if (cluster) {
    lines.push(
      '',
      `# Failover tests: a node without a heartbeat for ${CLUSTER_SESSION_TIMEOUT_MS / 1000} s is fenced (its partitions get new leaders,`,
      `# it leaves every ISR); Kafka's defaults are 9 s and a heartbeat every 2 s.`,
      `broker.session.timeout.ms=${CLUSTER_SESSION_TIMEOUT_MS}`,
      `broker.heartbeat.interval.ms=${CLUSTER_HEARTBEAT_INTERVAL_MS}`,
    );
  }
  if (kafkaLine(version) === 4) {
    lines.push(
      '',
      cluster
        ? '# Kafka 4.x share groups (KIP-932): their state topic like the other internal topics.'
        : '# Kafka 4.x share groups (KIP-932): one replica for their state topic too.',
      `share.coordinator.state.topic.replication.factor=${replicas}`,
      `share.coordinator.state.topic.min.isr=${minIsr}`,
    );
  }
  return `${lines.join('\n')}\n`;
}

// ---------------------------------------------------------------------------------------------
// The active controller, from the nodes' KRaft storage
// ---------------------------------------------------------------------------------------------

/**
 * What a KRaft voter last wrote to `<log.dirs>/__cluster_metadata-0/quorum-state` (a JSON file
 * it rewrites on every election-state change: candidate, voted, leader, follower).
 */
export interface QuorumState {
  /** The leader of the metadata quorum as this node knows it, or -1 during an election. */
  leaderId: number;
  /** The epoch of that knowledge; a new election always raises it. */
  leaderEpoch: number;
}

/**
 * Parses a `quorum-state` file: `leaderId` and `leaderEpoch` of its JSON (3.9.2 and 4.4.0 with
 * static voters both write `data_version` 0, the leader's and the followers' alike; a dynamic
 * quorum's version 1 keeps the two fields). Returns undefined for anything else (a file being
 * rewritten, another format).
 */
export function parseQuorumState(text: string): QuorumState | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (typeof parsed !== 'object' || parsed === null) return undefined;
  const { leaderId, leaderEpoch } = parsed as Record<string, unknown>;
  if (!Number.isInteger(leaderId) || !Number.isInteger(leaderEpoch)) return undefined;
  return { leaderId: leaderId as number, leaderEpoch: leaderEpoch as number };
}

/**
 * The active controller (the leader of the KRaft metadata quorum) from the voters' own
 * `quorum-state` files: the leader named at the highest epoch any running node has written, if
 * that leader is running. Undefined while an election is under way (the highest epoch has no
 * leader yet) or when the last leader known is not running (the survivors have not noticed yet).
 * A stopped node's file is ignored: it may still name itself leader of an epoch the others left.
 *
 * Kafka's own clients cannot tell: in KRaft the controller id of a Metadata answer is a random
 * live broker (KIP-590), and DescribeQuorum is not in kafkajs.
 */
export function quorumLeader(
  nodes: readonly { id: number; running: boolean; state: QuorumState | undefined }[],
): number | undefined {
  const running = nodes.filter((n) => n.running);
  let epoch = -1;
  for (const n of running) if (n.state && n.state.leaderEpoch > epoch) epoch = n.state.leaderEpoch;
  const leader = running.find((n) => n.state?.leaderEpoch === epoch && n.state.leaderId >= 0)?.state?.leaderId;
  if (leader === undefined) return undefined;
  return running.some((n) => n.id === leader) ? leader : undefined;
}
