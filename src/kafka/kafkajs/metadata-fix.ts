/**
 * A fix for a kafkajs 2.2.4 trap on a multi-broker cluster: one partition without a leader, in any
 * topic, fails every metadata request that covers it, and with it everything that needs metadata.
 *
 * The cause: kafkajs' Metadata response `parse` (protocol/requests/metadata/v0/response.js, shared
 * by v1–v6) throws the first partition error it finds, and a partition whose leader is offline
 * comes with LEADER_NOT_AVAILABLE (its leader -1). A request with no topic names asks for every
 * topic of the cluster (kafkajs sends a null array for an empty one): a new producer's
 * `connect()` (its producer id needs the cluster's metadata), a new admin's first request, a
 * consumer's start. So a replication-factor-1 topic that outboxkit never writes to, whose only
 * broker is down, kept every new relay producer and every new dedup consumer from starting
 * (issue 16, cases C25/C26 in docs/guarantees.md G7). And when a relay's own topic has one
 * leaderless partition, each metadata refresh for its topics fails: after a leader move elsewhere
 * no send could find its new leader.
 *
 * The replacement parses as kafkajs does but keeps a partition whose error is LEADER_NOT_AVAILABLE
 * or REPLICA_NOT_AVAILABLE, with the leader the broker gave (-1 when it has none), instead of
 * throwing. kafkajs already handles such partitions where it reads metadata: its partitioner sends
 * a record without a key only to partitions with a leader; a record with a key is hashed over all
 * partitions (as the Java client does) and its send fails with kafkajs' own broker-not-found
 * error, which it retries with a metadata refresh and then reports (the relay holds such a
 * partition's events back instead: relay/partitions.ts). A topic-level error, and every other
 * partition error, still throws as before.
 *
 * One kafkajs behaviour rested on the throw: `admin.createTopics({ waitForLeaders: true })`
 * retried its metadata request until no partition lacked a leader. outboxkit's admin adapter
 * waits for the leaders itself (./admin.ts, `createTopic`).
 *
 * Applied once per process, like the request-queue fix (./fix.ts), and only to kafkajs 2.2.x whose
 * parse still reads as the original (its source is compared); it changes the copy of kafkajs that
 * outboxkit resolves, for every client of that copy.
 */
import { createRequire } from 'node:module';
import { normalised, type KafkajsFixOutcome } from './fix.js';

/** kafkajs' `parse` of a Metadata response, as shipped in 2.2.4, without blanks and comments. */
const ORIGINAL_SOURCE = [
  'consttopicsWithErrors=data.topicMetadata.filter(topic=>failure(topic.topicErrorCode))',
  'if(topicsWithErrors.length>0){',
  'const{topicErrorCode}=topicsWithErrors[0]',
  'throwcreateErrorFromCode(topicErrorCode)',
  '}',
  'consterrors=data.topicMetadata.flatMap(topic=>{',
  'returntopic.partitionMetadata.filter(partition=>failure(partition.partitionErrorCode))',
  '})',
  'if(errors.length>0){',
  'const{partitionErrorCode}=errors[0]',
  'throwcreateErrorFromCode(partitionErrorCode)',
  '}',
  'returndata',
].join('');

/**
 * Partition error codes that say only that the partition cannot take writes now (Kafka protocol
 * error codes: LEADER_NOT_AVAILABLE 5, REPLICA_NOT_AVAILABLE 9).
 */
export const TOLERATED_PARTITION_ERRORS: ReadonlySet<number> = new Set([5, 9]);

interface MetadataData {
  topicMetadata: { topicErrorCode: number; partitionMetadata: { partitionErrorCode: number }[] }[];
}

type Parse = (data: MetadataData) => Promise<MetadataData>;

/** The Metadata response versions kafkajs 2.2.4 ships. */
const VERSIONS = [0, 1, 2, 3, 4, 5, 6];

let outcome: KafkajsFixOutcome | undefined;
/** Marks the replacement, so that a second copy of outboxkit in the process recognises it. */
const FIXED = Symbol.for('outboxkit.kafkajsMetadataFix');

/**
 * Makes kafkajs' Metadata responses keep partitions without a leader instead of failing (see the
 * module's comment). Idempotent; never throws.
 *
 * @returns `'applied'` the first time, `'already-applied'` after that (also when another copy of
 *   outboxkit did it), `'unrecognised'` when the kafkajs outboxkit resolves is not 2.2.x or its
 *   parse does not read as the original (left as it is), `'not-found'` when its modules cannot be
 *   loaded.
 */
export function applyKafkajsMetadataFix(): KafkajsFixOutcome {
  if (outcome === 'applied' || outcome === 'already-applied') return (outcome = 'already-applied');
  if (outcome) return outcome;
  let modules: { parse: Parse }[];
  let failure: (code: number) => boolean;
  let createErrorFromCode: (code: number) => Error;
  try {
    const require = createRequire(import.meta.url);
    const version = (require('kafkajs/package.json') as { version?: string }).version ?? '';
    if (!version.startsWith('2.2.')) return (outcome = 'unrecognised');
    modules = VERSIONS.map(
      (v) => require(`kafkajs/src/protocol/requests/metadata/v${v}/response.js`) as { parse: Parse },
    );
    ({ failure, createErrorFromCode } = require('kafkajs/src/protocol/error.js') as {
      failure: typeof failure;
      createErrorFromCode: typeof createErrorFromCode;
    });
  } catch {
    return (outcome = 'not-found');
  }
  if (typeof failure !== 'function' || typeof createErrorFromCode !== 'function') return (outcome = 'not-found');
  if (modules.some((m) => typeof m?.parse !== 'function')) return (outcome = 'not-found');
  if (modules.every((m) => (m.parse as unknown as Record<symbol, unknown>)[FIXED])) {
    return (outcome = 'already-applied'); // by another copy of this module in the process
  }
  if (modules.some((m) => normalised(m.parse) !== ORIGINAL_SOURCE)) return (outcome = 'unrecognised');
  const parse: Parse = async (data) => {
    for (const topic of data.topicMetadata) {
      if (failure(topic.topicErrorCode)) throw createErrorFromCode(topic.topicErrorCode);
    }
    for (const topic of data.topicMetadata) {
      for (const p of topic.partitionMetadata) {
        if (failure(p.partitionErrorCode) && !TOLERATED_PARTITION_ERRORS.has(p.partitionErrorCode)) {
          throw createErrorFromCode(p.partitionErrorCode);
        }
      }
    }
    return data;
  };
  Object.defineProperty(parse, FIXED, { value: true });
  for (const m of modules) m.parse = parse;
  return (outcome = 'applied');
}
