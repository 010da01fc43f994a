/**
 * The chaos harness's invariant checker: pure logic over what the clients saw (the ledger) and
 * what PostgreSQL and Kafka hold at the end of a run. No I/O here, so that a unit test can feed it
 * a deliberately broken run (test/unit/chaos-check.test.ts).
 *
 * Each invariant is one line of DESIGN.md's guarantees (G1-G5) seen from outside the pipeline.
 */

/** Statuses that end a logical request: the stored answer (201, 400, 402) or a refusal (422). */
export const FINAL_STATUSES: ReadonlySet<number> = new Set([201, 400, 402, 422]);

/** One HTTP attempt as the client saw it. */
export interface Attempt {
  /** `undefined`: no answer (timeout, connection refused or reset). */
  status: number | undefined;
  replayed: boolean;
  /** The response body, as UTF-8 text ('' without an answer). */
  body: string;
}

/** One logical request of the load: one (tenant, key), its body and, maybe, a reuse with another body. */
export interface Operation {
  tenant: string;
  key: string;
  /** The cart id: unique per operation, the id the report uses (the key is never printed in full). */
  cartId: string;
  customerId: string;
  /** The request body sent on every attempt (UTF-8). */
  body: string;
  attempts: Attempt[];
  /** The same key sent afterwards with another body: every final answer must be 422. */
  reuse?: { body: string; attempts: Attempt[] };
}

/** What PostgreSQL and Kafka hold at the end of the run. */
export interface Observed {
  orders: { id: string; tenant: string; cartId: string; customerId: string | null }[];
  /**
   * The committed outbox rows (committed, by definition of a read from another session): the
   * table's rows in table mode; in WAL mode, where the relay deletes published rows, their copies
   * made by a trigger in the writer's transaction (chaos/collect.ts, `recordCommittedEvents`).
   */
  outbox: { eventId: string; orderId: string; key: string }[];
  /**
   * Outbox rows left after the drain neither published (marked in table mode, deleted in WAL mode)
   * nor parked; absent: not read.
   */
  leftPending?: { eventId: string; orderId: string }[];
  /** Idempotency records still in state `processing` (or `uncertain`). */
  stuckKeys: { tenant: string; key: string; state: string }[];
  shipments: {
    orderId: string;
    eventId: string;
    applications: number;
    appliedSeq: number;
    customerId: string | null;
    customerVersion: number | null;
  }[];
  /** The topic read from the beginning, in offset order within each partition. */
  published: {
    partition: number;
    offset: string;
    eventId: string;
    key: string;
    orderId: string;
    customerVersion: number | null;
  }[];
  /** The dead-letter topic. */
  deadLetters: { eventId: string; orderId: string | undefined; reason: string }[];
  /**
   * The consumer group's committed offset per partition at the end (the next offset it would read),
   * if it could be read: it tells a missing effect that was skipped (committed past it, a G4
   * breach) from one never consumed (the consumer stalled). Diagnostic only.
   */
  committedOffsets?: ReadonlyMap<number, bigint>;
  /**
   * Topics other than the orders topic that the relays publish (`--cluster`: the audit topic): the
   * event ids of their committed outbox rows, and of the messages read back from the topic. Every
   * committed one must be there; none may be there without its row.
   */
  otherTopics?: { topic: string; committed: readonly string[]; published: readonly string[] }[];
}

/** One invariant and what broke it. */
export interface InvariantResult {
  id: InvariantId;
  title: string;
  /** One line per violation, naming the ids involved. */
  violations: string[];
}

export const INVARIANTS = [
  ['committed-unpublished', 'every committed event published'],
  ['left-pending', 'no outbox row left pending after the drain'],
  ['rolled-back-published', 'nothing published from a rolled-back transaction'],
  ['effect-duplicated', 'no effect applied more than once'],
  ['effect-missing', 'every committed event applied or dead-lettered'],
  ['key-order', 'per-key order of first occurrences (Kafka and consumer)'],
  ['stuck-processing', 'no idempotency record left in processing'],
  ['replay-differs', 'replays identical to the original response'],
  ['executed-twice', 'at most one execution per key'],
  ['unanswered', 'every request answered after the final retries'],
] as const;

export type InvariantId = (typeof INVARIANTS)[number][0];

/** The outcome of a check: the invariants in {@link INVARIANTS} order, and the dead letters. */
export interface CheckResult {
  invariants: InvariantResult[];
  deadLetters: Observed['deadLetters'];
  /** Total violations (0: the run passes). */
  violations: number;
}

/** A short, non-secret name of a key for reports (never the full key: STYLE.md). */
export function shortKey(key: string): string {
  return `${key.slice(0, 4)}…`;
}

function opName(op: Pick<Operation, 'cartId' | 'key'>): string {
  return `${op.cartId} (key ${shortKey(op.key)})`;
}

const finals = (attempts: Attempt[]) => attempts.filter((a) => a.status !== undefined && FINAL_STATUSES.has(a.status));

/**
 * Where an unapplied event sits in the topic and where the group stands: `; p3@120, group at 118
 * (not consumed)` or `; p3@120, group committed past it at 125 (skipped)`.
 */
function whereInLog(eventIds: string[], observed: Observed): string {
  const ids = new Set(eventIds);
  const at = observed.published.filter((m) => ids.has(m.eventId));
  if (at.length === 0) return '; not in the topic';
  return `; ${at
    .map((m) => {
      const committed = observed.committedOffsets?.get(m.partition);
      const place = `p${m.partition}@${m.offset}`;
      if (committed === undefined) return `${place}, group offset unknown`;
      return committed > BigInt(m.offset)
        ? `${place}, group committed past it at ${committed} (skipped)`
        : `${place}, group at ${committed} (not consumed)`;
    })
    .join(', ')}`;
}

/** Checks every invariant; see {@link INVARIANTS}. */
export function checkRun(operations: readonly Operation[], observed: Observed): CheckResult {
  const v = new Map<InvariantId, string[]>(INVARIANTS.map(([id]) => [id, []]));
  const add = (id: InvariantId, line: string) => v.get(id)!.push(line);

  const ordersById = new Map(observed.orders.map((o) => [o.id, o]));
  const outboxById = new Map(observed.outbox.map((e) => [e.eventId, e]));
  const publishedIds = new Set(observed.published.map((m) => m.eventId));
  const deadLettered = new Set(observed.deadLetters.map((d) => d.eventId));
  const eventsOfOrder = new Map<string, string[]>();
  for (const e of observed.outbox) eventsOfOrder.set(e.orderId, [...(eventsOfOrder.get(e.orderId) ?? []), e.eventId]);

  // G3: every committed event reaches Kafka; a committed order has its event (G2).
  for (const e of observed.outbox) {
    if (!publishedIds.has(e.eventId)) add('committed-unpublished', `event ${e.eventId} (order ${e.orderId})`);
  }
  for (const o of observed.orders) {
    if (!eventsOfOrder.has(o.id))
      add('committed-unpublished', `order ${o.id} (${o.cartId}) committed without its event`);
  }

  // G3: the relay finished its work: every row published (marked, or deleted by the WAL relay) or parked.
  for (const e of observed.leftPending ?? [])
    add('left-pending', `event ${e.eventId} (order ${e.orderId}): row neither published nor parked`);

  for (const other of observed.otherTopics ?? []) {
    const there = new Set(other.published);
    const committed = new Set(other.committed);
    for (const id of other.committed)
      if (!there.has(id)) add('committed-unpublished', `event ${id} (topic ${other.topic}) not in its topic`);
    for (const id of there)
      if (!committed.has(id)) add('rolled-back-published', `event ${id} published to ${other.topic}, never committed`);
  }

  // G3: nothing of a rolled-back transaction; G2: a declined order's writes never commit.
  const seenPublished = new Set<string>();
  for (const m of observed.published) {
    if (seenPublished.has(m.eventId)) continue;
    seenPublished.add(m.eventId);
    if (!outboxById.has(m.eventId))
      add('rolled-back-published', `event ${m.eventId} (order ${m.orderId}) published, never committed`);
    else if (!ordersById.has(m.orderId))
      add('rolled-back-published', `event ${m.eventId} published for order ${m.orderId}, which never committed`);
  }
  for (const o of observed.orders) {
    if (o.cartId.startsWith('declined-'))
      add('rolled-back-published', `order ${o.id} (${o.cartId}) committed although its request was declined`);
  }

  // G4: effects once per event; every committed event applied, or dead-lettered (listed).
  const shipmentsByOrder = new Map<string, Observed['shipments']>();
  for (const s of observed.shipments) shipmentsByOrder.set(s.orderId, [...(shipmentsByOrder.get(s.orderId) ?? []), s]);
  for (const [orderId, rows] of shipmentsByOrder) {
    const applications = rows.reduce((n, s) => n + s.applications, 0);
    if (applications > 1) add('effect-duplicated', `order ${orderId}: effect applied ${applications} times`);
    if (!ordersById.has(orderId))
      add('rolled-back-published', `order ${orderId}: effect applied, the order never committed`);
  }
  for (const o of observed.orders) {
    if (shipmentsByOrder.has(o.id)) continue;
    const events = eventsOfOrder.get(o.id) ?? [];
    if (events.some((id) => deadLettered.has(id))) continue;
    add(
      'effect-missing',
      `order ${o.id} (${o.cartId}): never applied nor dead-lettered${whereInLog(events, observed)}`,
    );
  }

  // G3: per key, first occurrences in commit order (customerVersion is 1, 2, 3... by commit).
  const firstByKey = new Map<string, { versions: number[]; partitions: Set<number>; ids: string[] }>();
  const firstSeen = new Set<string>();
  const inLogOrder = [...observed.published].sort(
    (a, b) => a.partition - b.partition || Number(BigInt(a.offset) - BigInt(b.offset)),
  );
  for (const m of inLogOrder) {
    if (firstSeen.has(m.eventId) || m.customerVersion === null) continue;
    firstSeen.add(m.eventId);
    const k = firstByKey.get(m.key) ?? { versions: [], partitions: new Set(), ids: [] };
    k.versions.push(m.customerVersion);
    k.partitions.add(m.partition);
    k.ids.push(m.eventId);
    firstByKey.set(m.key, k);
  }
  for (const [key, k] of firstByKey) {
    if (k.partitions.size > 1) add('key-order', `key ${key}: first occurrences on partitions ${[...k.partitions]}`);
    const i = k.versions.findIndex((ver, j) => j > 0 && ver <= k.versions[j - 1]!);
    if (i > 0)
      add(
        'key-order',
        `key ${key} in Kafka: version ${k.versions[i]} (event ${k.ids[i]}) after version ${k.versions[i - 1]}`,
      );
  }
  const appliedByKey = new Map<string, Observed['shipments']>();
  for (const s of [...observed.shipments].sort((a, b) => a.appliedSeq - b.appliedSeq)) {
    if (s.customerId === null || s.customerVersion === null) continue;
    appliedByKey.set(s.customerId, [...(appliedByKey.get(s.customerId) ?? []), s]);
  }
  for (const [key, rows] of appliedByKey) {
    const i = rows.findIndex((s, j) => j > 0 && s.customerVersion! <= rows[j - 1]!.customerVersion!);
    if (i > 0)
      add(
        'key-order',
        `key ${key} at the consumer: version ${rows[i]!.customerVersion} (order ${rows[i]!.orderId}) applied after version ${rows[i - 1]!.customerVersion}`,
      );
  }

  // G1: no record left processing once every request is answered.
  for (const k of observed.stuckKeys) add('stuck-processing', `tenant ${k.tenant}, key ${shortKey(k.key)}: ${k.state}`);

  // G1: one execution per key; replays byte for byte; another body on the same key refused.
  const ordersByCart = new Map<string, string[]>();
  for (const o of observed.orders) {
    const id = `${o.tenant}/${o.cartId}`;
    ordersByCart.set(id, [...(ordersByCart.get(id) ?? []), o.id]);
  }
  for (const op of operations) {
    const executed = ordersByCart.get(`${op.tenant}/${op.cartId}`) ?? [];
    if (executed.length > 1) add('executed-twice', `${opName(op)}: ${executed.length} orders ${executed.join(', ')}`);
    const answers = finals(op.attempts);
    const original = answers[0];
    if (original === undefined) {
      add('unanswered', `${opName(op)}: no final answer in ${op.attempts.length} attempts`);
    } else {
      if (original.status === 422) add('replay-differs', `${opName(op)}: its own body was refused as a reuse (422)`);
      const differs = answers.find((a) => a.status !== original.status || a.body !== original.body);
      if (differs)
        add(
          'replay-differs',
          `${opName(op)}: ${original.status} ${original.body.slice(0, 60)} then ${differs.status} ${differs.body.slice(0, 60)}`,
        );
      if (original.status === 201) {
        const orderId = (JSON.parse(original.body) as { orderId?: string }).orderId;
        if (orderId === undefined || !ordersById.has(orderId))
          add('unanswered', `${opName(op)}: answered 201 with order ${orderId}, which does not exist`);
      }
    }
    if (op.reuse) {
      for (const a of finals(op.reuse.attempts)) {
        if (a.status !== 422) add('replay-differs', `${opName(op)}: reused with another body, answered ${a.status}`);
      }
    }
  }

  const invariants = INVARIANTS.map(([id, title]) => ({ id, title, violations: v.get(id)! }));
  return {
    invariants,
    deadLetters: observed.deadLetters,
    violations: invariants.reduce((n, i) => n + i.violations.length, 0),
  };
}
