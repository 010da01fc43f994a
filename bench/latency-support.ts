/**
 * The pieces of B3 (relay latency in LISTEN/NOTIFY mode), shared by bench/latency.ts and
 * bench/clients.ts: the receiving consumer process, the relay daemon, paced sending and one
 * measured phase (a path at a rate). bench/latency.ts describes the method.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { createInterface } from 'node:readline';
import type { Producer } from 'kafkajs';
import type pg from 'pg';
import { enqueue, type Outbox } from '../src/index.js';
import type { KafkaClientName } from '../relay/options.js';
import {
  type Child,
  type CpuMeter,
  type CpuSample,
  cpuDelta,
  log,
  percentile,
  root,
  sleep,
  startChild,
  waitFor,
} from './e2e-support.js';

/** Keys of the latency events (`k<i mod KEYS>`). */
export const LATENCY_KEYS = 100;

/** Wall-clock time in ms (`performance.timeOrigin + performance.now()`), comparable across processes. */
export const wallNow = () => performance.timeOrigin + performance.now();

/** Calls `tick(i)` `rate` times a second for `seconds`, up to `concurrency` in flight. */
export async function paced(
  rate: number,
  seconds: number,
  tick: (i: number) => Promise<void>,
  concurrency = 16,
): Promise<void> {
  const total = Math.round(rate * seconds);
  const start = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      for (let i = next++; i < total; i = next++) {
        const wait = start + (i * 1000) / rate - performance.now();
        if (wait > 0) await sleep(wait);
        await tick(i);
      }
    }),
  );
}

/** Busy and total jiffies of the whole machine (/proc/stat), for its busy share over a window. */
function machineJiffies(): { busy: number; total: number } {
  const f = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1, 9).map(Number);
  const total = f.reduce((a, b) => a + b, 0);
  return { busy: total - f[3]! - f[4]!, total };
}

export interface Phase {
  /** Send (or COMMIT sent) → receipt, ms, measured events only. */
  latency: number[];
  /** COMMIT reply → receipt, ms (relay path only). */
  fromReply: number[];
  /** Events sent in the measured window that were received. */
  received: number;
  measured: number;
  /** CPU cores (CPU-s per s) per group over the measured window. */
  cores: Record<string, number>;
  machineBusy: number;
}

/** One sent event: its id and the wall-clock start of its latency (and, relay path, of the COMMIT reply). */
export interface Sent {
  id: string;
  at: number;
  reply?: number;
}

/** The receiving consumer (bench/processes/latency-consumer.ts): receipt times by event id. */
export interface LatencyConsumer {
  /** Wall-clock receipt time (ms) of each event id received, first receipt only. */
  received: Map<string, number>;
  pid: number;
  stop(): Promise<void>;
}

/** Starts the receiving consumer on `topics` and waits until it has joined its group (60 s at most). */
export async function startLatencyConsumer(brokers: string[], topics: string[]): Promise<LatencyConsumer> {
  const received = new Map<string, number>();
  const consumer: ChildProcess = spawn(
    process.execPath,
    ['--import', 'tsx', path.join(root, 'bench/processes/latency-consumer.ts'), brokers.join(','), ...topics],
    { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] },
  );
  let ready = false;
  createInterface({ input: consumer.stdout! }).on('line', (line) => {
    if (line === 'ready') ready = true;
    else if (line.startsWith('r ')) {
      const [, id, at] = line.split(' ');
      if (!received.has(id!)) received.set(id!, Number(at));
    }
  });
  await waitFor('the consumer to join its group', () => ready, { timeoutMs: 60_000 });
  return {
    received,
    pid: consumer.pid!,
    async stop() {
      const exited = new Promise((r) => consumer.once('exit', r));
      consumer.kill('SIGTERM');
      await exited;
    },
  };
}

/**
 * Starts the relay daemon with its defaults (`cli/main.ts relay`, metrics off, warnings only;
 * `kafkaClient` adds `--kafka-client`) and waits until it holds lanes (`monitor` on its database;
 * with `relayId`, lanes held by that id). With `walSlot`, the WAL relay instead
 * (`--source wal --wal-slot <walSlot>`), ready once a walsender reads its slot.
 */
export async function startLatencyRelay(
  db: { url: string; brokers: string[] },
  monitor: pg.Pool,
  options: { kafkaClient?: KafkaClientName; relayId?: string; walSlot?: string } = {},
): Promise<Child> {
  const args = ['relay', '--metrics-port', '-1'];
  if (options.kafkaClient) args.push('--kafka-client', options.kafkaClient);
  if (options.relayId) args.push('--relay-id', options.relayId);
  if (options.walSlot) args.push('--source', 'wal', '--wal-slot', options.walSlot);
  const relay = startChild(options.walSlot ? 'wal relay' : 'relay', path.join(root, 'cli/main.ts'), args, {
    DATABASE_URL: db.url,
    KAFKA_BROKERS: db.brokers.join(','),
    OUTBOXKIT_LOG_LEVEL: 'warn',
  });
  const held =
    options.walSlot !== undefined
      ? { text: 'SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active', values: [options.walSlot] }
      : options.relayId === undefined
        ? { text: 'SELECT 1 FROM outboxkit.relay_lanes WHERE owner_id IS NOT NULL', values: [] }
        : { text: 'SELECT 1 FROM outboxkit.relay_lanes WHERE owner_id = $1', values: [options.relayId] };
  await waitFor(
    options.walSlot ? 'the WAL relay to read its slot' : 'the relay to hold its lanes',
    async () => (await monitor.query(held)).rowCount! > 0,
    { timeoutMs: 60_000, children: [relay] },
  );
  return relay;
}

/**
 * Runs one path at `rate` events/s for `warmupS` (not counted) + `seconds`, then waits (60 s at
 * most) for the measured events to reach `consumer`. `send(i)` sends event i and returns its id and
 * the start of its latency. `cpu` is sampled at the start and the end of the measured window for
 * the CPU of each of `groups`.
 */
export async function measurePhase(options: {
  rate: number;
  warmupS: number;
  seconds: number;
  consumer: LatencyConsumer;
  cpu: CpuMeter;
  groups: readonly string[];
  send: (i: number) => Promise<Sent>;
}): Promise<Phase> {
  const { rate, warmupS, seconds, consumer, cpu, groups, send } = options;
  const received = consumer.received;
  const warmup = Math.round(rate * warmupS);
  const sent: Sent[] = [];
  let start: { cpu: CpuSample; jiffies: ReturnType<typeof machineJiffies>; at: number } | undefined;
  const startWindow = async () => {
    start = { cpu: await cpu.sample(), jiffies: machineJiffies(), at: performance.now() };
  };
  let starting: Promise<void> | undefined;
  await paced(rate, warmupS + seconds, async (i) => {
    if (i === warmup) starting = startWindow();
    const s = await send(i);
    if (i >= warmup) sent.push(s);
  });
  await starting;
  const endCpu = await cpu.sample();
  const endJiffies = machineJiffies();
  const windowS = (performance.now() - start!.at) / 1000;
  await waitFor(`${sent.length} events to reach the consumer`, () => sent.every((s) => received.has(s.id)), {
    timeoutMs: 60_000,
    everyMs: 100,
  }).catch((err: Error) => log('latency', err.message));
  const cores: Record<string, number> = {};
  for (const g of groups) cores[g] = cpuDelta(start!.cpu, endCpu, [g]) / windowS;
  const got = sent.filter((s) => received.has(s.id));
  return {
    latency: got.map((s) => received.get(s.id)! - s.at),
    fromReply: got.filter((s) => s.reply !== undefined).map((s) => received.get(s.id)! - s.reply!),
    received: got.length,
    measured: sent.length,
    cores,
    machineBusy: (endJiffies.busy - start!.jiffies.busy) / (endJiffies.total - start!.jiffies.total),
  };
}

/**
 * The raw path's `send`: a plain kafkajs producer (acks=all) sends each message as it comes,
 * concurrently (the relay's producer sends one request at a time with what accumulated).
 */
export function rawSend(producer: Producer, topic: string): (i: number) => Promise<Sent> {
  return async (i) => {
    const id = randomUUID();
    const at = wallNow();
    await producer.send({
      topic,
      acks: -1,
      messages: [{ key: `k${i % LATENCY_KEYS}`, value: Buffer.from('{"n":1}'), headers: { 'event-id': id } }],
    });
    return { id, at };
  };
}

/**
 * The relay path's `send`: one `enqueue()` per transaction on `writer` (through `outbox`, default
 * the table writer with NOTIFY); the clock starts as COMMIT is sent.
 */
export function relaySend(
  writer: pg.Pool,
  topic: string,
  outbox: Pick<Outbox, 'enqueue'> = { enqueue },
): (i: number) => Promise<Sent> {
  return async (i) => {
    const c = await writer.connect();
    try {
      await c.query('BEGIN');
      const [e] = await outbox.enqueue(c, { topic, key: `k${i % LATENCY_KEYS}`, type: 't', payload: { n: 1 } });
      const at = wallNow();
      await c.query('COMMIT');
      return { id: e!.eventId, at, reply: wallNow() };
    } finally {
      c.release();
    }
  };
}

/** What the relay adds at percentile `q`: relay path minus raw path, in ms. */
export function added(raw: Phase, viaRelay: Phase, q: number): number {
  return percentile(viaRelay.latency, q) - percentile(raw.latency, q);
}
