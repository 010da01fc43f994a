/**
 * The @platformatic/kafka {@link GroupConsumer}. The client's `consume()` stream fetches every
 * assigned partition as one stream, advances its fetch positions by itself and has no
 * per-partition pause or seek, so this adapter uses the client for group membership only
 * (`joinGroup`: JoinGroup, SyncGroup, heartbeats and rejoins, which the client runs by itself) and
 * runs a fetch loop of its own over the client's `fetch()` (one Fetch request per leader, on a
 * connection pool of its own so that a long poll never delays a heartbeat):
 *
 * - a fetch position per assigned partition, which only this adapter moves: to the first unmarked
 *   record after each batch, so an unmarked record is always fetched again;
 * - one {@link InboundBatch} per partition and fetch, at most `concurrency` batches at once and
 *   one at a time per partition; a partition is fetched again only after its batch ended;
 * - autocommit off: only marked offsets are committed, of partitions this member owns in the
 *   client's current generation (a commit carries the generation; the broker refuses an old one);
 * - a paused partition is not fetched; resuming moves its position back to its first unmarked record;
 * - the client rejoins by itself as soon as a heartbeat says the group rebalances: from then on
 *   every batch's `heartbeat()` rejects with a rebalance error (a kafkajs batch ends the same way)
 *   and nothing is fetched until the join;
 * - a partition that leaves the assignment ends its batch (`isActive()` false) and its marks are
 *   dropped, never committed.
 */
import type {
  GroupConsumer,
  GroupConsumerEvents,
  GroupConsumerSettings,
  InboundBatch,
  InboundMessage,
} from '../types.js';
import { isRetriablePlatformaticError, protocolErrorName, withUnreachableMessage } from './errors.js';
import { loadPlatformaticKafka, type PlatformaticKafka } from './load.js';
import { retryDelayOf, type PlatformaticConnection } from './producer.js';

type Consumer = InstanceType<PlatformaticKafka['Consumer']>;
type Pool = InstanceType<PlatformaticKafka['ConnectionPool']>;
type FetchResponse = Awaited<ReturnType<Consumer['fetch']>>;
type FetchPartition = FetchResponse['responses'][number]['partitions'][number];
type Assignment = Record<string, number[]>;

/** Kafka's `max.partition.fetch.bytes` default (kafkajs's `maxBytesPerPartition`). */
const PARTITION_MAX_BYTES = 1_048_576;
/**
 * Bytes one Fetch response may carry over all its partitions (kafkajs's `maxBytes` default, and
 * @platformatic/kafka 1.x's; 2.0 raised the client's default to 50 MiB), in bytes. Given on every
 * fetch, so that a round holds the same at most 10 MiB whichever client version runs.
 */
export const FETCH_MAX_BYTES = 10_485_760;
/** Attributes bit of a control batch (transaction markers). */
const IS_CONTROL = 0b10_0000;
/** Pause after a failed fetch or join before the next attempt, in ms. */
const RETRY_DELAY_MS = 500;
/**
 * How long a retriable failure of the join, of the start positions or of the fetch loop is retried
 * quietly before it is reported as a `crash` (willRestart) event, in ms; then once per this long
 * while it lasts. kafkajs likewise retries a coordinator or leader that is not available yet (a
 * broker that just started) inside its own retry budget, without a crash event.
 */
export const QUIET_RETRY_MS = 10_000;
/** Pause after a fetch found a topic missing, in ms. */
const UNKNOWN_TOPIC_DELAY_MS = 50;
/** Protocol errors that mean the group rebalances or this member left it. */
const REBALANCE_ERRORS = new Set([
  'REBALANCE_IN_PROGRESS',
  'ILLEGAL_GENERATION',
  'UNKNOWN_MEMBER_ID',
  'NOT_COORDINATOR',
  'FENCED_INSTANCE_ID',
]);

/** Thrown by a batch's `heartbeat()` once the group rebalanced since the batch began. */
class RebalanceError extends Error {
  readonly rebalance = true;
  constructor(topic: string, partition: number, owned: boolean) {
    super(
      owned
        ? `The group rebalanced while a batch of ${topic}/${partition} was processed: the batch ends, its partition is fetched again from its first unmarked record.`
        : `Partition ${topic}/${partition} was revoked from this member by a rebalance of its group.`,
    );
    this.name = 'RebalanceError';
  }
}

/** What the adapter keeps of one assigned partition. */
interface PartitionState {
  readonly topic: string;
  readonly partition: number;
  /** Next offset to fetch. */
  position: bigint;
  /** The first unmarked offset: what a commit writes. */
  marked: bigint;
  /** The last committed offset (of this adapter, in this assignment). */
  committed: bigint;
  paused: boolean;
  /** A batch of it is queued or running. */
  busy: boolean;
  /** False once it left the assignment: its batches are stale, its marks dropped. */
  owned: boolean;
}

/** Closes the client's consumer (it leaves the group), the stream-free way: no stream holds it. */
const closeConsumer = (c: Consumer | undefined): Promise<void> =>
  c
    ? new Promise<void>((resolve, reject) => c.close(true, (err) => (err ? reject(err) : resolve())))
    : Promise.resolve();
const key = (topic: string, partition: number) => `${topic}\u0000${partition}`;
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms).unref());

/** A @platformatic/kafka-backed {@link GroupConsumer} (see `KafkaClient.groupConsumer`). */
export function platformaticGroupConsumer(
  connection: PlatformaticConnection,
  settings: GroupConsumerSettings,
): GroupConsumer {
  const { groupId, sessionTimeoutMs, heartbeatIntervalMs, fetchMaxWaitMs, metadataMaxAgeMs } = settings;
  const listeners = {
    join: new Set<(p: GroupConsumerEvents['join']) => void>(),
    crash: new Set<(p: GroupConsumerEvents['crash']) => void>(),
  };
  const emit = <K extends keyof GroupConsumerEvents>(event: K, payload: GroupConsumerEvents[K]) => {
    for (const l of listeners[event]) {
      try {
        (l as (p: GroupConsumerEvents[K]) => void)(payload);
      } catch {
        // A listener's throw is its own.
      }
    }
  };
  /**
   * Reports a retriable failure of one of the retry loops (join, start positions, fetch) as a
   * `crash` event only once it has lasted {@link QUIET_RETRY_MS}, then once per that long; `ok()`
   * ends the streak.
   */
  const streak = () => {
    let since: number | undefined;
    let reported = 0;
    return {
      failed(err: unknown) {
        const now = Date.now();
        since ??= now;
        if (now - since >= QUIET_RETRY_MS && now - reported >= QUIET_RETRY_MS) {
          reported = now;
          emit('crash', { error: err as Error, willRestart: true });
        }
      },
      ok() {
        since = undefined;
        reported = 0;
      },
    };
  };
  const joinFailures = streak();
  const startFailures = streak();
  const fetchFailures = streak();

  let consumer: Consumer | undefined;
  let pool: Pool | undefined;
  const fromBeginning = new Map<string, boolean>();
  const partitions = new Map<string, PartitionState>();
  /** Partition counts of each topic at the last join: a count that grew makes this member rejoin. */
  const knownCounts = new Map<string, number>();
  /** Each fetched topic's id: another id means the topic was recreated. */
  const topicIds = new Map<string, string>();
  /** Partitions (by {@link key}) a fetch round found their topic missing (deleted) for, until it comes back. */
  const gone = new Set<string>();
  /** The partitions of the last fetch round. */
  let lastRound: PartitionState[] = [];
  let generation = -1;
  /**
   * Counts the rebalances this member saw (the client's `consumer:group:rebalance`, then the join):
   * a batch that began in another epoch must end, as a kafkajs batch ends at its next heartbeat.
   */
  let epoch = 0;
  /** Between a rebalance and the next join: nothing is fetched (the assignment is about to change). */
  let rebalancing: NodeJS.Timeout | undefined;
  let memberId: string | null = null;
  let running = false;
  let stopping = false;
  let crashed = false;
  let loop: Promise<void> | undefined;
  let joins: Promise<void> = Promise.resolve();
  let lastCommit = 0;
  let metadataTimer: NodeJS.Timeout | undefined;
  /** Wakes the fetch loop (a batch ended, a partition resumed, a join). */
  let wake: (() => void) | undefined;
  const wakeUp = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  const active = new Set<Promise<void>>();
  const queue: { state: PartitionState; batch: InboundBatch }[] = [];
  let concurrency = 1;
  let autoCommitIntervalMs: number | undefined;
  let eachBatch: (batch: InboundBatch) => Promise<void> = async () => {};

  const client = (): Consumer => {
    if (!consumer) throw new Error('GroupConsumer: connect() first.');
    return consumer;
  };

  /** Commits the marked offsets of the partitions owned now, in the current generation. */
  let committing: Promise<void> = Promise.resolve();
  const commitMarked = (): Promise<void> => {
    const run = async () => {
      const c = consumer;
      if (!c || c.memberId === null || autoCommitIntervalMs === undefined) return;
      const due = [...partitions.values()].filter((s) => s.owned && s.marked > s.committed);
      if (due.length === 0) return;
      const at = generation;
      // Offsets marked before a rejoin are committed only if the partition stayed with this member
      // (its state survives only then, see onJoin) and the client is in the generation they were
      // checked against: the broker refuses a commit of another generation (ILLEGAL_GENERATION).
      if (c.generationId !== at) return;
      const offsets = due.map((s) => ({ topic: s.topic, partition: s.partition, offset: s.marked, leaderEpoch: -1 }));
      await c.commit({ offsets });
      lastCommit = Date.now();
      for (const [i, s] of due.entries()) if (s.owned) s.committed = offsets[i]!.offset;
    };
    committing = committing.then(run, run);
    return committing;
  };
  const commitQuietly = () => commitMarked().catch(() => undefined);

  /** Where a partition without a committed offset starts, and the committed ones. */
  const startPositions = async (assignment: Assignment): Promise<Map<string, bigint>> => {
    const c = client();
    const topics = Object.entries(assignment).filter(([, ps]) => ps.length > 0);
    const out = new Map<string, bigint>();
    if (topics.length === 0) return out;
    const committed = await c.listCommittedOffsets({
      topics: topics.map(([topic, ps]) => ({ topic, partitions: ps })),
    });
    const missing = new Map<boolean, string[]>();
    for (const [topic, ps] of topics) {
      const offsets = committed.get(topic) ?? [];
      for (const p of ps) {
        const offset = offsets[p];
        if (offset !== undefined && offset >= 0n) out.set(key(topic, p), offset);
        else {
          const earliest = fromBeginning.get(topic) ?? false;
          const list = missing.get(earliest) ?? [];
          if (!list.includes(topic)) list.push(topic);
          missing.set(earliest, list);
        }
      }
    }
    for (const [earliest, names] of missing) {
      const ends = await c.listOffsets({ topics: names, timestamp: earliest ? -2n : -1n });
      for (const name of names) {
        const offsets = ends.get(name) ?? [];
        for (const p of assignment[name] ?? []) {
          if (!out.has(key(name, p))) out.set(key(name, p), offsets[p] ?? 0n);
        }
      }
    }
    return out;
  };

  /** A new generation: partitions kept keep their positions; new ones start from their committed offsets. */
  const onJoin = async (payload: {
    memberId: string;
    generationId?: number;
    assignments?: { topic: string; partitions: number[] }[];
  }) => {
    const assignment: Assignment = {};
    for (const a of payload.assignments ?? []) assignment[a.topic] = [...a.partitions].sort((x, y) => x - y);
    const nextGeneration = payload.generationId ?? -1;
    // A member that missed a generation (it was thrown out and came back) cannot know who owned
    // its partitions meanwhile: it forgets them all, and reads their committed offsets again.
    const continuous = payload.memberId === memberId && nextGeneration === generation + 1;
    memberId = payload.memberId;
    const wanted = new Set<string>();
    for (const [topic, ps] of Object.entries(assignment)) for (const p of ps) wanted.add(key(topic, p));
    for (const [k, s] of partitions) {
      if (!continuous || !wanted.has(k)) {
        s.owned = false;
        partitions.delete(k);
      }
    }
    const fresh: Assignment = {};
    for (const [topic, ps] of Object.entries(assignment)) {
      const added = ps.filter((p) => !partitions.has(key(topic, p)));
      if (added.length > 0) fresh[topic] = added;
    }
    generation = nextGeneration;
    epoch += 1;
    clearTimeout(rebalancing);
    rebalancing = undefined;
    let starts = new Map<string, bigint>();
    for (;;) {
      try {
        starts = await startPositions(fresh);
        startFailures.ok();
        break;
      } catch (err) {
        if (stopping || client().generationId !== nextGeneration) return;
        startFailures.failed(err);
        await sleep(RETRY_DELAY_MS);
      }
    }
    if (client().generationId !== nextGeneration) return;
    for (const [topic, ps] of Object.entries(fresh)) {
      for (const p of ps) {
        const start = starts.get(key(topic, p)) ?? 0n;
        partitions.set(key(topic, p), {
          topic,
          partition: p,
          position: start,
          marked: start,
          committed: start,
          paused: false,
          busy: false,
          owned: true,
        });
      }
    }
    try {
      const metadata = await client().metadata({ topics: [...fromBeginning.keys()] });
      for (const [name, t] of metadata.topics) knownCounts.set(name, t.partitionsCount ?? t.partitions.length);
    } catch {
      // Counted again at the next metadata check.
    }
    emit('join', { assignment });
    wakeUp();
  };

  /** `metadataMaxAgeMs`: rejoins once a subscribed topic has more partitions than at the last join. */
  const checkPartitionCounts = async () => {
    const c = consumer;
    if (!c || stopping || c.memberId === null) return;
    try {
      const metadata = await c.metadata({ topics: [...fromBeginning.keys()], forceUpdate: true });
      for (const [name, t] of metadata.topics) {
        const count = t.partitionsCount ?? t.partitions.length;
        const known = knownCounts.get(name);
        if (known !== undefined && count > known) {
          knownCounts.set(name, count);
          await commitQuietly();
          await c.joinGroup({});
          return;
        }
      }
    } catch {
      // The next check tries again.
    }
  };

  const batchOf = (
    state: PartitionState,
    fetchedOffset: bigint,
    response: FetchPartition,
  ): InboundBatch | undefined => {
    const messages: InboundMessage[] = [];
    let last = -1n;
    for (const batch of response.records ?? []) {
      const lastOfBatch = batch.firstOffset + BigInt(batch.lastOffsetDelta);
      if (lastOfBatch > last) last = lastOfBatch;
      if (batch.attributes & IS_CONTROL) continue;
      for (const record of batch.records) {
        const offset = batch.firstOffset + BigInt(record.offsetDelta);
        if (offset < fetchedOffset) continue;
        const headers: Record<string, Buffer | Buffer[]> = {};
        for (const [name, value] of record.headers) {
          if (name === undefined || name === null) continue;
          const n = name.toString('utf8');
          const v = value ?? Buffer.alloc(0);
          const prev = headers[n];
          headers[n] = prev === undefined ? v : Array.isArray(prev) ? [...prev, v] : [prev, v];
        }
        messages.push({
          key: record.key ?? null,
          value: record.value ?? null,
          headers,
          offset: offset.toString(),
          timestamp: (batch.firstTimestamp + BigInt(record.timestampDelta)).toString(),
        });
      }
    }
    const highWatermark = response.highWatermark;
    if (last < fetchedOffset) {
      if (messages.length === 0) return undefined;
      last = BigInt(messages[messages.length - 1]!.offset);
    }
    const lastOffset = last >= 0n ? last : highWatermark - 1n;
    if (messages.length === 0) {
      // Only control records or aborted transactions' records: nothing to handle, moved past (as
      // kafkajs resolves a batch of control records by itself).
      state.marked = state.position = lastOffset + 1n;
      return undefined;
    }
    const lastMessage = messages[messages.length - 1]!.offset;
    const startedIn = epoch;
    const isActive = () =>
      running && !stopping && state.owned && partitions.get(key(state.topic, state.partition)) === state;
    return {
      topic: state.topic,
      partition: state.partition,
      messages,
      fetchedOffset: fetchedOffset.toString(),
      highWatermark: highWatermark.toString(),
      lastOffset: lastOffset.toString(),
      markProcessed(offset) {
        if (!isActive()) return;
        // Marking the last message also marks the control records after it.
        const next = offset === lastMessage ? lastOffset + 1n : BigInt(offset) + 1n;
        if (next > state.marked) state.marked = next;
      },
      async commitIfDue() {
        if (autoCommitIntervalMs !== undefined && Date.now() - lastCommit >= autoCommitIntervalMs) {
          await commitQuietly();
        }
      },
      heartbeat() {
        // The client heartbeats by itself; what a caller must learn here is whether the group
        // rebalanced since the batch began (the partition may go), as a kafkajs heartbeat tells.
        return stopping || (state.owned && epoch === startedIn)
          ? Promise.resolve()
          : Promise.reject(new RebalanceError(state.topic, state.partition, state.owned));
      },
      isActive,
      pause() {
        state.paused = true;
        return () => {
          if (!state.paused) return;
          state.paused = false;
          // Delivered again from its first unmarked record.
          state.position = state.marked;
          wakeUp();
        };
      },
    };
  };

  const isRebalance = (err: unknown): boolean =>
    err instanceof RebalanceError ||
    (typeof err === 'object' && err !== null && (err as { rebalance?: unknown }).rebalance === true) ||
    REBALANCE_ERRORS.has(protocolErrorName(err) ?? '');

  const runBatch = async (state: PartitionState, batch: InboundBatch) => {
    try {
      await eachBatch(batch);
    } catch (err) {
      if (!isRebalance(err)) {
        const willRestart = isRetriablePlatformaticError(err);
        emit('crash', { error: err as Error, willRestart });
        if (!willRestart) crashed = true;
      }
    } finally {
      if (state.owned) {
        // Fetched again from its first unmarked record (a paused one when resumed).
        state.position = state.marked;
        state.busy = false;
      }
      await commitQuietly();
      if (crashed && !stopping) void crash();
      wakeUp();
    }
  };

  const dispatch = () => {
    while (active.size < concurrency && queue.length > 0) {
      const { state, batch } = queue.shift()!;
      if (!batch.isActive()) {
        state.busy = false;
        continue;
      }
      const p: Promise<void> = runBatch(state, batch).finally(() => {
        active.delete(p);
        dispatch();
      });
      active.add(p);
    }
  };

  /** One round: a Fetch request per leader for every partition that is owned, idle and not paused. */
  const fetchRound = async (): Promise<boolean> => {
    const c = client();
    if (rebalancing) return false;
    const ready = [...partitions.values()].filter((s) => s.owned && !s.busy && !s.paused);
    lastRound = ready;
    if (ready.length === 0) return false;
    const metadata = await c.metadata({ topics: [...new Set(ready.map((s) => s.topic))] });
    // A topic whose id changed was deleted and created again: its positions belong to the old log.
    // A partition seen missing meanwhile has only unseen records in the new log: it starts as one
    // without a committed offset (`fromBeginning`), as a kafkajs fetch against the empty new log
    // gets OFFSET_OUT_OF_RANGE. Otherwise (this member was busy) they move only if outside the new
    // log, as Kafka's answer to a fetch at that position would say.
    for (const [name, t] of metadata.topics) {
      const before = topicIds.get(name);
      topicIds.set(name, t.id);
      if (before === undefined || before === t.id) continue;
      const mine = ready.filter((st) => st.topic === name);
      const seenGone = mine.filter((st) => gone.has(key(st.topic, st.partition)));
      for (const k of [...gone]) if (k.startsWith(`${name}\u0000`)) gone.delete(k);
      await resetOutOfRange(seenGone);
      await resetOutOfRange(
        mine.filter((st) => !seenGone.includes(st)),
        true,
      );
      return true;
    }
    const byLeader = new Map<number, { state: PartitionState; offset: bigint }[]>();
    for (const state of ready) {
      const leader = metadata.topics.get(state.topic)?.partitions[state.partition]?.leader;
      if (leader === undefined || leader < 0) {
        // No leader now (an election): asked again at the next round, not at `metadataMaxAgeMs`.
        c.clearMetadata();
        continue;
      }
      const list = byLeader.get(leader) ?? [];
      list.push({ state, offset: state.position });
      byLeader.set(leader, list);
    }
    if (byLeader.size === 0) return false;
    await Promise.all(
      [...byLeader].map(async ([leader, wanted]) => {
        const topics = new Map<
          string,
          {
            partition: number;
            fetchOffset: bigint;
            partitionMaxBytes: number;
            currentLeaderEpoch: number;
            lastFetchedEpoch: number;
          }[]
        >();
        for (const { state, offset } of wanted) {
          const id = metadata.topics.get(state.topic)!.id;
          const list = topics.get(id) ?? [];
          list.push({
            partition: state.partition,
            fetchOffset: offset,
            partitionMaxBytes: PARTITION_MAX_BYTES,
            currentLeaderEpoch: -1,
            lastFetchedEpoch: -1,
          });
          topics.set(id, list);
        }
        let response: FetchResponse;
        try {
          response = await c.fetch({
            node: leader,
            topics: [...topics].map(([topicId, ps]) => ({ topicId, partitions: ps })),
            maxBytes: FETCH_MAX_BYTES,
            ...(fetchMaxWaitMs === undefined ? {} : { maxWaitTime: fetchMaxWaitMs }),
            ...(pool ? { connectionPool: pool } : {}),
          } as Parameters<Consumer['fetch']>[0]);
        } catch (err) {
          if (protocolErrorName(err) === 'OFFSET_OUT_OF_RANGE') {
            c.clearMetadata();
            const names = new Map([...metadata.topics].map(([name, t]) => [t.id, name]));
            const out = outOfRange(err, names);
            await resetOutOfRange(wanted.map((w) => w.state).filter((st) => out.has(key(st.topic, st.partition))));
            return;
          }
          throw err;
        }
        const names = new Map([...metadata.topics].map(([name, t]) => [t.id, name]));
        for (const t of response.responses) {
          const topic = names.get(t.topicId);
          if (topic === undefined) continue;
          for (const p of t.partitions) {
            const w = wanted.find((x) => x.state.topic === topic && x.state.partition === p.partitionIndex);
            if (!w) continue;
            const { state } = w;
            // Dropped: a partition that was revoked, paused, resumed elsewhere meanwhile.
            if (!state.owned || state.busy || state.paused || state.position !== w.offset) continue;
            const batch = batchOf(state, w.offset, p);
            if (!batch) continue;
            state.busy = true;
            queue.push({ state, batch });
          }
        }
        dispatch();
      }),
    );
    return true;
  };

  /**
   * The partitions a Fetch answered OFFSET_OUT_OF_RANGE for (from the response the client's error
   * carries), by {@link key}.
   */
  const outOfRange = (err: unknown, names: Map<string, string>): Set<string> => {
    const out = new Set<string>();
    const queue: unknown[] = [err];
    const seen = new Set<unknown>();
    while (queue.length > 0) {
      const e = queue.shift() as { response?: unknown; errors?: unknown; cause?: unknown } | null;
      if (!e || typeof e !== 'object' || seen.has(e)) continue;
      seen.add(e);
      const response = e.response as Partial<FetchResponse> | undefined;
      for (const t of response?.responses ?? []) {
        const topic = names.get(t.topicId);
        for (const p of t.partitions)
          if (topic !== undefined && p.errorCode === 1) out.add(key(topic, p.partitionIndex));
      }
      if (Array.isArray(e.errors)) queue.push(...(e.errors as unknown[]));
      if (e.cause !== undefined) queue.push(e.cause);
    }
    return out;
  };

  /**
   * Positions the broker said are outside the log (retention deleted their records, the topic was
   * recreated): to the earliest or the latest offset, as the topic's `fromBeginning` says (Kafka's
   * `auto.offset.reset`; kafkajs does the same).
   */
  const resetOutOfRange = async (states: PartitionState[], onlyOutside = false) => {
    const c = client();
    for (const earliest of [true, false]) {
      const mine = states.filter((s) => (fromBeginning.get(s.topic) ?? false) === earliest);
      if (mine.length === 0) continue;
      const names = [...new Set(mine.map((s) => s.topic))];
      const [lows, highs] = await Promise.all([
        c.listOffsets({ topics: names, timestamp: -2n }),
        c.listOffsets({ topics: names, timestamp: -1n }),
      ]);
      for (const s of mine) {
        const low = lows.get(s.topic)?.[s.partition] ?? 0n;
        const high = highs.get(s.topic)?.[s.partition] ?? 0n;
        if (onlyOutside && s.position >= low && s.position <= high) continue;
        s.position = s.marked = earliest ? low : high;
        // Committed even if below the old log's committed offset.
        s.committed = -1n;
      }
    }
  };

  const fetchLoop = async () => {
    while (running && !stopping && !crashed) {
      let fetched = false;
      try {
        fetched = await fetchRound();
        fetchFailures.ok();
      } catch (err) {
        if (!running || stopping) break;
        // A topic deleted or recreated (UNKNOWN_TOPIC_ID), a leader moved: the cached metadata is
        // stale, and the client keeps it for `metadataMaxAgeMs`.
        consumer?.clearMetadata();
        const name = protocolErrorName(err);
        if (name === 'UNKNOWN_TOPIC_OR_PARTITION' || name === 'UNKNOWN_TOPIC_ID') {
          // Deleted (or not yet known to this broker): looked at again soon, so that a topic
          // created again is met while its new log is still empty.
          for (const st of lastRound) gone.add(key(st.topic, st.partition));
          await sleep(UNKNOWN_TOPIC_DELAY_MS);
          continue;
        }
        fetchFailures.failed(err);
        await sleep(RETRY_DELAY_MS);
        continue;
      }
      if (!fetched && running && !stopping) {
        // Marked offsets whose commit was skipped (a rebalance began; another generation) go now
        // that the member is idle in its current generation: no later batch may come to commit them.
        await commitQuietly();
        // Nothing to fetch: wait for a batch to end, a partition to resume or a join.
        await new Promise<void>((resolve) => {
          wake = resolve;
          setTimeout(resolve, fetchMaxWaitMs ?? 1_000).unref();
        });
      }
    }
  };

  const crash = async () => {
    running = false;
    wakeUp();
    await Promise.allSettled([...active]);
    await closeConsumer(consumer).catch(() => undefined);
  };

  const onJoinEvent = (payload: Parameters<typeof onJoin>[0]) => {
    joins = joins
      .then(() => onJoin(payload))
      .catch((err: unknown) => emit('crash', { error: err as Error, willRestart: true }));
  };
  // Before the client rejoins (a heartbeat said the group rebalances): what is marked goes now,
  // in the generation whose partitions this member still owns.
  const onRebalance = () => {
    epoch += 1;
    clearTimeout(rebalancing);
    // Fetching resumes at the join, or after a session timeout if no join comes (the client retries it).
    rebalancing = setTimeout(() => {
      rebalancing = undefined;
      wakeUp();
    }, sessionTimeoutMs ?? 30_000);
    rebalancing.unref();
    void commitQuietly();
  };
  const onError = (err: Error) => emit('crash', { error: err, willRestart: !crashed && !stopping });

  return {
    async connect() {
      const kafka = await loadPlatformaticKafka();
      const options = {
        ...connection,
        groupId,
        autocommit: false,
        ...(sessionTimeoutMs === undefined ? {} : { sessionTimeout: sessionTimeoutMs }),
        ...(heartbeatIntervalMs === undefined ? {} : { heartbeatInterval: heartbeatIntervalMs }),
        ...(fetchMaxWaitMs === undefined ? {} : { maxWaitTime: fetchMaxWaitMs }),
        ...(metadataMaxAgeMs === undefined ? {} : { metadataMaxAge: metadataMaxAgeMs }),
        // The client retries a missing topic like stale metadata, by default for seconds: none here,
        // the fetch loop looks again itself (a deleted topic is noticed while it is gone).
        retryDelay: retryDelayOf(typeof connection.retryDelay === 'number' ? connection.retryDelay : 100, 1_000),
        // A typo in a topic name must fail, not create an empty topic.
        autocreateTopics: false,
        strict: true,
      };
      consumer = new kafka.Consumer(options as ConstructorParameters<PlatformaticKafka['Consumer']>[0]);
      const { groupId: _g, autocommit: _a, ...poolOptions } = options;
      pool = new kafka.ConnectionPool(
        connection.clientId,
        poolOptions as ConstructorParameters<PlatformaticKafka['ConnectionPool']>[1],
      );
      consumer.on('consumer:group:join', onJoinEvent as never);
      consumer.on('consumer:group:rebalance', onRebalance);
      consumer.on('error', onError);
      // Brokers that could not be reached said as on kafkajs (withUnreachableMessage).
      await consumer.metadata({ topics: [] }).catch((err: unknown) => {
        throw withUnreachableMessage(err, connection.bootstrapBrokers);
      });
    },
    async subscribe(topics, options) {
      const c = client();
      await c.metadata({ topics: [...topics] });
      for (const topic of topics) {
        fromBeginning.set(topic, options.fromBeginning);
        c.topics.track(topic);
      }
    },
    async run(options) {
      concurrency = Math.max(1, options.concurrency ?? 1);
      autoCommitIntervalMs = options.autoCommitIntervalMs;
      eachBatch = options.eachBatch;
      running = true;
      loop = fetchLoop();
      // The commit interval counts from the start, as kafkajs's does.
      lastCommit = Date.now();
      const every = metadataMaxAgeMs ?? 300_000;
      metadataTimer = setInterval(() => void checkPartitionCounts(), every);
      metadataTimer.unref();
      // Joins in the background (the `join` event says when): a cluster without a coordinator yet is retried.
      void (async () => {
        for (;;) {
          try {
            // Session timeout and heartbeat interval come from the consumer's own options.
            await client().joinGroup({});
            joinFailures.ok();
            return;
          } catch (err) {
            if (stopping || !running) return;
            if (!isRetriablePlatformaticError(err)) {
              emit('crash', { error: err as Error, willRestart: false });
              crashed = true;
              return;
            }
            joinFailures.failed(err);
            await sleep(RETRY_DELAY_MS);
          }
        }
      })();
    },
    async disconnect() {
      stopping = true;
      clearInterval(metadataTimer);
      clearTimeout(rebalancing);
      wakeUp();
      await loop?.catch(() => undefined);
      await Promise.allSettled([...active]);
      await joins;
      running = false;
      const c = consumer;
      try {
        if (c && !crashed) await commitMarked().catch(() => undefined);
      } finally {
        for (const s of partitions.values()) s.owned = false;
        partitions.clear();
        queue.length = 0;
        consumer = undefined;
        const p = pool;
        pool = undefined;
        await p?.close().catch(() => undefined);
        if (c) {
          c.removeListener('consumer:group:join', onJoinEvent as never);
          c.removeListener('consumer:group:rebalance', onRebalance);
          await closeConsumer(c);
          c.removeListener('error', onError);
        }
      }
    },
    on(event, listener) {
      const set = listeners[event] as Set<typeof listener>;
      set.add(listener);
      return () => void set.delete(listener);
    },
    isRebalance,
  };
}
