/**
 * A private single-node Kafka broker with a SASL_PLAINTEXT listener (PLAIN and SCRAM-SHA-256
 * users), for tests of authenticated connections. It reuses the jars scripts/services.ts resolved
 * for the shared broker, keeps its storage under `.services/sasl-<port>`, and is killed and
 * deleted by `destroy()`. Nothing here touches the shared broker.
 *
 * Listeners: SASL_PLAINTEXT on `port` (clients), PLAINTEXT on `port + 1` (the broker to itself),
 * CONTROLLER on `port + 2`. SCRAM credentials are written at format time (`kafka-storage format
 * --add-scram`, KRaft, Kafka 3.5+); PLAIN users live in the listener's JAAS line.
 */
import { spawn, execFile } from 'node:child_process';
import * as fs from 'node:fs';
import path from 'node:path';
import { Kafka, logLevel } from 'kafkajs';
import { resolveKafkaVersion } from '../../scripts/services.js';

export interface SaslBroker {
  /** host:port of the SASL_PLAINTEXT listener. */
  brokers: string[];
  users: { plain: { username: string; password: string }; scram: { username: string; password: string } };
  destroy(): Promise<void>;
}

const ROOT = path.resolve(import.meta.dirname, '..', '..');

function run(cmd: string, args: string[], cwd: string): Promise<{ code: number; out: string }> {
  return new Promise((resolve) =>
    execFile(cmd, args, { cwd, timeout: 120_000 }, (err, stdout, stderr) =>
      resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, out: stdout + stderr }),
    ),
  );
}

/** Starts the broker and waits until the SCRAM user can create a topic. */
export async function startSaslBroker(port: number): Promise<SaslBroker> {
  const version = resolveKafkaVersion();
  const lib = path.join(ROOT, '.services', `kafka-${version}`, 'lib');
  if (!fs.existsSync(path.join(lib, `kafka_2.13-${version}.jar`))) {
    throw new Error(`Kafka jars missing under ${lib}: run \`npm run services:up\` once first.`);
  }
  const home = path.join(ROOT, '.services', `sasl-${port}`);
  fs.rmSync(home, { recursive: true, force: true });
  fs.mkdirSync(path.join(home, 'logs'), { recursive: true });
  const users = {
    plain: { username: 'plain-user', password: `plain-${Math.random().toString(36).slice(2)}` },
    scram: { username: 'scram-user', password: `scram-${Math.random().toString(36).slice(2)}` },
  };
  const props = path.join(home, 'server.properties');
  fs.writeFileSync(
    props,
    [
      'process.roles=broker,controller',
      'node.id=1',
      `controller.quorum.voters=1@127.0.0.1:${port + 2}`,
      `listeners=SASL_PLAINTEXT://127.0.0.1:${port},INTERNAL://127.0.0.1:${port + 1},CONTROLLER://127.0.0.1:${port + 2}`,
      `advertised.listeners=SASL_PLAINTEXT://127.0.0.1:${port},INTERNAL://127.0.0.1:${port + 1}`,
      'inter.broker.listener.name=INTERNAL',
      'controller.listener.names=CONTROLLER',
      'listener.security.protocol.map=CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT',
      'sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256',
      'listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required ' +
        `user_${users.plain.username}="${users.plain.password}";`,
      'listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;',
      'num.network.threads=1',
      'num.io.threads=1',
      'background.threads=1',
      'num.partitions=1',
      'default.replication.factor=1',
      'min.insync.replicas=1',
      'auto.create.topics.enable=false',
      'offsets.topic.replication.factor=1',
      'offsets.topic.num.partitions=1',
      'transaction.state.log.replication.factor=1',
      'transaction.state.log.min.isr=1',
      'group.initial.rebalance.delay.ms=0',
      `log.dirs=${path.join(home, 'data')}`,
      '',
    ].join('\n'),
  );
  const java = process.env.JAVA_HOME ? path.join(process.env.JAVA_HOME, 'bin', 'java') : 'java';
  const logging = [
    `-Dkafka.logs.dir=${path.join(home, 'logs')}`,
    `-Dlog4j.configuration=file:${path.join(ROOT, 'scripts', 'kafka', 'log4j.properties')}`,
  ];
  const cp = path.join(lib, '*');
  const format = await run(
    java,
    [
      ...logging,
      '-cp',
      cp,
      'kafka.tools.StorageTool',
      'format',
      '-t',
      'c2FzbC10ZXN0LWNsdXN0ZXIx',
      '-c',
      props,
      '--add-scram',
      `SCRAM-SHA-256=[name=${users.scram.username},password=${users.scram.password}]`,
    ],
    home,
  );
  if (format.code !== 0) throw new Error(`StorageTool format failed: ${format.out.slice(-2_000)}`);
  const out = fs.openSync(path.join(home, 'kafka.out'), 'a');
  const child = spawn(
    java,
    ['-Xms256m', '-Xmx256m', '-XX:ActiveProcessorCount=1', ...logging, '-cp', cp, 'kafka.Kafka', props],
    { cwd: home, stdio: ['ignore', out, out] },
  );
  fs.closeSync(out);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const destroy = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
    fs.rmSync(home, { recursive: true, force: true });
  };
  const brokers = [`127.0.0.1:${port}`];
  const deadline = Date.now() + 90_000;
  let last: unknown;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) break;
    const admin = new Kafka({
      brokers,
      clientId: 'sasl-probe',
      sasl: { mechanism: 'scram-sha-256', ...users.scram },
      logLevel: logLevel.NOTHING,
      retry: { retries: 0 },
      connectionTimeout: 2_000,
    }).admin();
    try {
      await admin.connect();
      await admin.createTopics({ topics: [{ topic: 'probe', numPartitions: 1 }], waitForLeaders: true });
      return { brokers, users, destroy };
    } catch (err) {
      last = err;
      await new Promise((r) => setTimeout(r, 500));
    } finally {
      await admin.disconnect().catch(() => undefined);
    }
  }
  const log = fs.existsSync(path.join(home, 'kafka.out')) ? fs.readFileSync(path.join(home, 'kafka.out'), 'utf8') : '';
  await destroy();
  throw new Error(`SASL broker did not become ready: ${String(last)}\n${log.slice(-3_000)}`);
}
