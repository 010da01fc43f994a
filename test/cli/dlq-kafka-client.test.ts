/**
 * `outboxkit dlq list|replay --kafka-client <name>` (and `OUTBOXKIT_KAFKA_CLIENT`), as on `relay`:
 * the same choices, environment variable, default and help text. Which library a run used is told
 * by what it sent the broker: the CLI connects through a proxy in front of the real broker that
 * keeps the bytes the client sent, and @platformatic/kafka names itself (`platformatic-kafka`,
 * ApiVersions v3+'s client software name) where kafkajs does not.
 */
import net from 'node:net';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { createTopics } from '../helpers/kafka.js';
import { finished, spawnCli } from '../helpers/processes.js';

/** A TCP proxy to the test broker that keeps what clients sent it. */
async function recordingProxy(): Promise<{ address: string; sent: () => string; close: () => Promise<void> }> {
  const [host, port] = inject('kafkaBrokers')[0]!.split(':');
  const chunks: Buffer[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(port), host);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('error', () => s.destroy());
      s.on('close', () => sockets.delete(s));
    }
    client.on('data', (d: Buffer) => chunks.push(d));
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port: listening } = server.address() as net.AddressInfo;
  return {
    address: `127.0.0.1:${listening}`,
    sent: () => Buffer.concat(chunks).toString('latin1'),
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

const proxies: { close(): Promise<void> }[] = [];
afterAll(async () => {
  await Promise.all(proxies.map((p) => p.close()));
});

describe('outboxkit dlq --kafka-client', () => {
  it('list (flag) and replay (OUTBOXKIT_KAFKA_CLIENT) run on @platformatic/kafka, kafkajs on kafkajs', async () => {
    const [dlq, other] = await createTopics(['cli-dlq-client', 'cli-dlq-client-to'], { partitions: 1 });
    const [viaFlag, viaEnv, viaDefault] = await Promise.all([recordingProxy(), recordingProxy(), recordingProxy()]);
    proxies.push(viaFlag, viaEnv, viaDefault);
    const [list, replay, kafkajs] = await Promise.all([
      // The flag beats the environment.
      finished(
        spawnCli(['dlq', 'list', dlq!, '--kafka-client', 'platformatic', '--json', '--timeout-ms', '10000'], {
          KAFKA_BROKERS: viaFlag.address,
          OUTBOXKIT_KAFKA_CLIENT: 'kafkajs',
        }),
      ),
      finished(
        spawnCli(['dlq', 'replay', dlq!, '--all', '--to', other!, '--json', '--timeout-ms', '10000'], {
          KAFKA_BROKERS: viaEnv.address,
          OUTBOXKIT_KAFKA_CLIENT: 'platformatic',
        }),
      ),
      finished(
        spawnCli(['dlq', 'list', dlq!, '--json', '--timeout-ms', '10000'], {
          KAFKA_BROKERS: viaDefault.address,
          OUTBOXKIT_KAFKA_CLIENT: 'kafkajs',
        }),
      ),
    ]);
    expect(list.code, list.stderr).toBe(0);
    expect(JSON.parse(list.stdout)).toEqual([]);
    expect(replay.code, replay.stderr).toBe(0);
    expect(JSON.parse(replay.stdout)).toMatchObject({ replayed: [], skipped: [] });
    expect(kafkajs.code, kafkajs.stderr).toBe(0);
    expect(viaFlag.sent()).toContain('platformatic-kafka');
    expect(viaEnv.sent()).toContain('platformatic-kafka');
    expect(viaDefault.sent()).toContain('outboxkit-cli');
    expect(viaDefault.sent()).not.toContain('platformatic-kafka');
  });

  it('refuses a client it does not know, and lists the option in --help, as relay does', async () => {
    const [list, replay, help] = await Promise.all([
      finished(spawnCli(['dlq', 'list', 'x.dlq', '--kafka-client', 'rdkafka'])),
      finished(spawnCli(['dlq', 'replay', 'x.dlq', '--all', '--kafka-client', 'rdkafka'])),
      finished(spawnCli(['dlq', 'replay', '--help'])),
    ]);
    for (const r of [list, replay]) {
      expect(r.code).not.toBe(0);
      expect(r.stderr).toContain("argument 'rdkafka' is invalid. Allowed choices are kafkajs, platformatic");
    }
    expect(help.stdout.replace(/\s+/g, ' ')).toContain(
      '--kafka-client <name> Kafka client library: kafkajs, or platformatic (@platformatic/kafka, installed separately; ' +
        'docs/kafka.md) (choices: "kafkajs", "platformatic", default: "kafkajs", env: OUTBOXKIT_KAFKA_CLIENT)',
    );
  });
});
