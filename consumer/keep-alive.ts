/**
 * Heartbeats while one batch is processed, so a long handler (or a slow DLQ send) does not cost
 * the group membership, and an early warning when the group starts rebalancing.
 */

/** kafkajs error types (Kafka protocol errors) that mean this member may lose its partitions. */
const MEMBERSHIP_LOST = new Set([
  'REBALANCE_IN_PROGRESS',
  'ILLEGAL_GENERATION',
  'UNKNOWN_MEMBER_ID',
  'NOT_COORDINATOR_FOR_GROUP',
  'FENCED_INSTANCE_ID',
]);

/** True when a heartbeat error means the group is rebalancing or this member left it. */
export function losesPartitions(err: unknown): boolean {
  const type = (err as { type?: unknown } | null)?.type;
  return typeof type === 'string' && MEMBERSHIP_LOST.has(type);
}

export interface KeepAlive {
  /** Aborted (with the heartbeat error as reason) once a heartbeat says the partitions may go. */
  readonly signal: AbortSignal;
  /** Throws the heartbeat error if the partitions may go: kafkajs then commits and rejoins. */
  throwIfLost(): void;
  stop(): void;
}

/**
 * Calls `heartbeat` every `intervalMs` until `stop()`. kafkajs throttles heartbeats to its own
 * interval and shares one request between concurrent callers, so this never floods the broker.
 * Other heartbeat errors (a timeout) are left to the next heartbeat between messages.
 */
export function startKeepAlive(heartbeat: () => Promise<void>, intervalMs: number): KeepAlive {
  const controller = new AbortController();
  let inFlight = false;
  const timer = setInterval(() => {
    if (inFlight || controller.signal.aborted) return;
    inFlight = true;
    heartbeat()
      .catch((err: unknown) => {
        if (losesPartitions(err)) controller.abort(err);
      })
      .finally(() => {
        inFlight = false;
      });
  }, intervalMs);
  return {
    signal: controller.signal,
    throwIfLost() {
      if (controller.signal.aborted) throw controller.signal.reason;
    },
    stop() {
      clearInterval(timer);
    },
  };
}
