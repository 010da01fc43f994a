/**
 * Heartbeats while one batch is processed, so a long handler (or a slow DLQ send) does not cost
 * the group membership, and an early warning when the group starts rebalancing.
 */

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
 * A heartbeat error for which `losesPartitions` is true (the client's `isRebalance`) aborts the
 * signal; other heartbeat errors (a timeout) are left to the next heartbeat between messages.
 */
export function startKeepAlive(
  heartbeat: () => Promise<void>,
  intervalMs: number,
  losesPartitions: (err: unknown) => boolean,
): KeepAlive {
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
