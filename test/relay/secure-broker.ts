/**
 * A private single-node Kafka broker with authenticated and encrypted listeners, for tests of
 * real-cluster connection settings. It runs the jars of the configured Kafka version, which
 * scripts/services.ts resolves with Maven when they are missing (a fresh clone whose tests use an
 * external broker), keeps its storage and certificates under `.services/secure-<port>`, and is
 * killed and deleted by `destroy()`. Nothing here touches the shared broker.
 *
 * Listeners (all on 127.0.0.1):
 * - `port`: SASL_PLAINTEXT, users for PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512;
 * - `port + 1`: PLAINTEXT, the broker to itself; `port + 2`: the KRaft controller;
 * - `port + 3`: SASL_SSL (TLS + SCRAM-SHA-256), server certificate signed by a test CA;
 * - `port + 4`: SSL with client authentication required (mutual TLS).
 * SCRAM credentials are written at format time (`kafka-storage format --add-scram`, KRaft, Kafka
 * 3.5+); PLAIN users live in the listener's JAAS line. Certificates come from `openssl`: a CA, a
 * server certificate for IP 127.0.0.1, and a client certificate whose key is encrypted.
 */
import { spawn, execFile } from 'node:child_process';
import * as fs from 'node:fs';
import path from 'node:path';
import { Kafka, logLevel } from 'kafkajs';
import { resolveKafkaJars, resolveKafkaVersion } from '../../scripts/services.js';

export interface SecureBroker {
  /** host:port of the SASL_PLAINTEXT listener. */
  brokers: string[];
  /** host:port of the SASL_SSL listener (SCRAM-SHA-256 over TLS). */
  saslSslBrokers: string[];
  /** host:port of the SSL listener that requires a client certificate. */
  mtlsBrokers: string[];
  users: Record<'plain' | 'scram' | 'scram512', { username: string; password: string }>;
  /** PEM files: the CA that signed the broker's certificate, a client certificate and its encrypted key. */
  tls: { caFile: string; clientCertFile: string; clientKeyFile: string; clientKeyPasswordFile: string };
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

async function openssl(args: string[], cwd: string): Promise<void> {
  const r = await run('openssl', args, cwd);
  if (r.code !== 0) throw new Error(`openssl ${args[0]} failed: ${r.out.slice(-1_000)}`);
}

/** A test CA, a server certificate for 127.0.0.1 (encrypted PKCS#8 key) and a client certificate. */
async function makeCertificates(dir: string) {
  const f = (name: string) => path.join(dir, name);
  const subj = (cn: string) => ['-subj', `/CN=${cn}`];
  await openssl(
    [
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-keyout',
      f('ca.key'),
      '-out',
      f('ca.pem'),
      '-days',
      '2',
      ...subj('outboxkit-test-ca'),
    ],
    dir,
  );
  fs.writeFileSync(f('san.ext'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
  const keyPassword = `key-${Math.random().toString(36).slice(2)}`;
  fs.writeFileSync(f('key-password'), `${keyPassword}\n`);
  for (const who of ['server', 'client']) {
    await openssl(
      [
        'req',
        '-newkey',
        'rsa:2048',
        '-nodes',
        '-keyout',
        f(`${who}.plain.key`),
        '-out',
        f(`${who}.csr`),
        ...subj(`outboxkit-test-${who}`),
      ],
      dir,
    );
    await openssl(
      [
        'x509',
        '-req',
        '-in',
        f(`${who}.csr`),
        '-CA',
        f('ca.pem'),
        '-CAkey',
        f('ca.key'),
        '-CAcreateserial',
        '-out',
        f(`${who}.pem`),
        '-days',
        '2',
        ...(who === 'server' ? ['-extfile', f('san.ext')] : []),
      ],
      dir,
    );
    // Kafka's PEM key store wants an encrypted PKCS#8 key; the client key tests the passphrase file.
    await openssl(
      [
        'pkcs8',
        '-topk8',
        // Java 17 cannot read PBES2 keys in Kafka's PEM store; Node.js reads either.
        ...(who === 'server' ? ['-v1', 'PBE-SHA1-3DES'] : ['-v2', 'aes-256-cbc']),
        '-in',
        f(`${who}.plain.key`),
        '-out',
        f(`${who}.key`),
        '-passout',
        `pass:${keyPassword}`,
      ],
      dir,
    );
  }
  // Kafka's file-based PEM key store: the private key and the certificate in one file.
  fs.writeFileSync(
    f('server.keystore.pem'),
    fs.readFileSync(f('server.key'), 'utf8') + fs.readFileSync(f('server.pem'), 'utf8'),
  );
  return { f, keyPassword };
}

/** Starts the broker and waits until the SCRAM user can create a topic. */
export async function startSecureBroker(port: number): Promise<SecureBroker> {
  const version = resolveKafkaVersion();
  // With an external broker (KAFKA_BROKERS) nothing else resolved the jars on a fresh clone: Maven
  // resolves them here, once (a no-op when they are already there).
  await resolveKafkaJars(version, (msg) => console.log(`[secure-broker] ${msg}`));
  const lib = path.join(ROOT, '.services', `kafka-${version}`, 'lib');
  const home = path.join(ROOT, '.services', `secure-${port}`);
  fs.rmSync(home, { recursive: true, force: true });
  fs.mkdirSync(path.join(home, 'logs'), { recursive: true });
  const certs = path.join(home, 'certs');
  fs.mkdirSync(certs);
  const { f, keyPassword } = await makeCertificates(certs);
  const users = {
    plain: { username: 'plain-user', password: `plain-${Math.random().toString(36).slice(2)}` },
    scram: { username: 'scram-user', password: `scram-${Math.random().toString(36).slice(2)}` },
    scram512: { username: 'scram512-user', password: `scram512-${Math.random().toString(36).slice(2)}` },
  };
  const props = path.join(home, 'server.properties');
  fs.writeFileSync(
    props,
    [
      'process.roles=broker,controller',
      'node.id=1',
      `controller.quorum.voters=1@127.0.0.1:${port + 2}`,
      `listeners=SASL_PLAINTEXT://127.0.0.1:${port},INTERNAL://127.0.0.1:${port + 1},CONTROLLER://127.0.0.1:${port + 2},` +
        `SASL_SSL://127.0.0.1:${port + 3},MTLS://127.0.0.1:${port + 4}`,
      `advertised.listeners=SASL_PLAINTEXT://127.0.0.1:${port},INTERNAL://127.0.0.1:${port + 1},` +
        `SASL_SSL://127.0.0.1:${port + 3},MTLS://127.0.0.1:${port + 4}`,
      'inter.broker.listener.name=INTERNAL',
      'controller.listener.names=CONTROLLER',
      'listener.security.protocol.map=CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL',
      'sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512',
      'listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required ' +
        `user_${users.plain.username}="${users.plain.password}";`,
      'listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;',
      'listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;',
      'listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-256',
      'listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;',
      'ssl.keystore.type=PEM',
      `ssl.keystore.location=${f('server.keystore.pem')}`,
      `ssl.key.password=${keyPassword}`,
      'ssl.truststore.type=PEM',
      `ssl.truststore.location=${f('ca.pem')}`,
      'listener.name.mtls.ssl.client.auth=required',
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
      '--add-scram',
      `SCRAM-SHA-512=[name=${users.scram512.username},password=${users.scram512.password}]`,
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
      return {
        brokers,
        saslSslBrokers: [`127.0.0.1:${port + 3}`],
        mtlsBrokers: [`127.0.0.1:${port + 4}`],
        users,
        tls: {
          caFile: f('ca.pem'),
          clientCertFile: f('client.pem'),
          clientKeyFile: f('client.key'),
          clientKeyPasswordFile: f('key-password'),
        },
        destroy,
      };
    } catch (err) {
      last = err;
      await new Promise((r) => setTimeout(r, 500));
    } finally {
      await admin.disconnect().catch(() => undefined);
    }
  }
  const read = (name: string) =>
    fs.existsSync(path.join(home, name)) ? fs.readFileSync(path.join(home, name), 'utf8') : '';
  const errors = read('logs/server.log')
    .split('\n')
    .filter((l) => / (ERROR|FATAL) |^Caused by|Exception/.test(l))
    .slice(-10)
    .join('\n');
  const log = `${errors}\n${read('kafka.out')}`;
  await destroy();
  throw new Error(`secure broker did not become ready: ${String(last)}\n${log.slice(-3_000)}`);
}
