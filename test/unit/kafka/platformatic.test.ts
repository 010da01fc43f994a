/**
 * The @platformatic/kafka adapter's pure parts: which package versions and Node.js versions it
 * accepts (KafkaClientUnavailableError saying what to install otherwise), its error mapping, its
 * retry delays, and the relay's `kafkaClient` option.
 */
import { describe, expect, it } from 'vitest';
import { resolveRelayOptions } from '../../../relay/options.js';
import { isOutboxkitError } from '../../../src/errors.js';
import { createPlatformaticClient, platformaticConnection } from '../../../src/kafka/platformatic/client.js';
import {
  isPlatformaticAuthenticationFailure,
  isRetriablePlatformaticError,
  platformaticFailureOf,
  withAuthenticationMessage,
  withUnreachableMessage,
} from '../../../src/kafka/platformatic/errors.js';
import {
  checkVersion,
  loadPlatformaticKafka,
  nodeSatisfies,
  readPackage,
} from '../../../src/kafka/platformatic/load.js';
import { retryDelayOf } from '../../../src/kafka/platformatic/producer.js';

// engines.node of the published packages (npm view @platformatic/kafka@<v> engines).
const ENGINES_1 = '>= 20.19.4 || >= 22.18.0 || >= 24.6.0';
const ENGINES_2 = '>= 22.22.0 || >= 24.6.0';

function thrown(fn: () => unknown): unknown {
  try {
    fn();
  } catch (err) {
    return err;
  }
  throw new Error('did not throw');
}

describe('@platformatic/kafka versions', () => {
  it('reads engines.node ranges of >= clauses', () => {
    expect(nodeSatisfies('20.20.2', ENGINES_1)).toBe(true);
    expect(nodeSatisfies('20.19.3', ENGINES_1)).toBe(false);
    expect(nodeSatisfies('20.20.2', ENGINES_2)).toBe(false);
    expect(nodeSatisfies('22.21.9', ENGINES_2)).toBe(false);
    expect(nodeSatisfies('24.22.3', ENGINES_2)).toBe(true);
    expect(nodeSatisfies('20.20.2', '^20 || ^22')).toBeUndefined();
  });

  it('accepts 1.35+ and 2.12.1+ on a Node.js their engines allow, and says what to install otherwise', () => {
    expect(() => checkVersion('1.35.0', '20.20.2', ENGINES_1)).not.toThrow();
    expect(() => checkVersion('1.35.0', '24.22.3', ENGINES_1)).not.toThrow();
    expect(() => checkVersion('2.12.1', '24.22.3', ENGINES_2)).not.toThrow();
    const tooOldNode = thrown(() => checkVersion('1.35.0', '20.19.0', ENGINES_1));
    expect(isOutboxkitError(tooOldNode, 'OUTBOXKIT_KAFKA_CLIENT_UNAVAILABLE')).toBe(true);
    expect((tooOldNode as Error).message).toMatch(/needs Node\.js >= 20\.19\.4.*this is Node\.js 20\.19\.0/);
    // 2.x on Node.js 20: install 1.x instead.
    const twoOnTwenty = thrown(() => checkVersion('2.12.1', '20.20.2', ENGINES_2));
    expect((twoOnTwenty as Error).message).toContain('npm install @platformatic/kafka@^1.35.0');
    for (const version of ['1.34.0', '2.12.0', '3.0.0', '0.9.0']) {
      const err = thrown(() => checkVersion(version, '24.22.3', ENGINES_2));
      expect(isOutboxkitError(err, 'OUTBOXKIT_KAFKA_CLIENT_UNAVAILABLE')).toBe(true);
      expect((err as Error).message).toContain('npm install @platformatic/kafka@^2.12.1');
    }
    expect((thrown(() => checkVersion('1.34.0', '20.20.2', ENGINES_1)) as Error).message).toContain(
      'npm install @platformatic/kafka@^1.35.0',
    );
  });

  // The devDependency (1.35.0) loads on every Node.js CI runs; scripts/platformatic-v2.sh runs this
  // file with 2.x installed, on Node.js 24 (loads) and on the machine's Node.js 20 (refused).
  it('loads the installed package where its engines.node allows this Node.js, and refuses it otherwise', async () => {
    const { version, engines } = readPackage();
    if (engines === undefined || nodeSatisfies(process.versions.node, engines) !== false) {
      const kafka = await loadPlatformaticKafka();
      expect(typeof kafka.Producer).toBe('function');
      return;
    }
    const err = await loadPlatformaticKafka().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isOutboxkitError(err, 'OUTBOXKIT_KAFKA_CLIENT_UNAVAILABLE')).toBe(true);
    expect((err as Error).message).toContain(`@platformatic/kafka ${version} needs Node.js ${engines}`);
    expect((err as Error).message).toContain('npm install @platformatic/kafka@^1.35.0');
  });
});

describe('@platformatic/kafka errors', () => {
  const protocol = (apiId: string, canRetry: boolean) =>
    Object.assign(new Error(apiId), { code: 'PLT_KFK_PROTOCOL', apiId, canRetry });
  const response = (...errors: Error[]) =>
    Object.assign(new AggregateError(errors, 'Producing messages failed.'), { code: 'PLT_KFK_MULTIPLE' });

  it('maps a record fault to a record failure and a cluster fault to a broker failure', () => {
    expect(platformaticFailureOf(response(protocol('MESSAGE_TOO_LARGE', false)))).toMatchObject({
      kind: 'record',
      code: 'MESSAGE_TOO_LARGE',
    });
    expect(
      platformaticFailureOf(Object.assign(new Error('Failed to serialize a message.'), { code: 'PLT_KFK_USER' })),
    ).toMatchObject({
      kind: 'record',
    });
    expect(platformaticFailureOf(response(protocol('NOT_LEADER_OR_FOLLOWER', true)))).toMatchObject({
      kind: 'broker',
      code: 'NOT_LEADER_OR_FOLLOWER',
      partitionUnavailable: true,
    });
    const network = Object.assign(new Error('Connection closed'), { code: 'PLT_KFK_NETWORK', canRetry: true });
    expect(platformaticFailureOf(network)).toEqual({ kind: 'broker', error: network });
    expect(isRetriablePlatformaticError(network)).toBe(true);
    expect(isRetriablePlatformaticError(response(protocol('NOT_LEADER_OR_FOLLOWER', true)))).toBe(true);
    expect(isRetriablePlatformaticError(response(protocol('MESSAGE_TOO_LARGE', false)))).toBe(false);
  });

  /** What 1.35.0 rejects a connect with after the broker refused a SCRAM password (shape as measured). */
  const refusedCredentials = () => {
    const protocolError = Object.assign(new Error('SASL authentication failed.'), {
      code: 'PLT_KFK_PROTOCOL',
      apiId: 'SASL_AUTHENTICATION_FAILED',
      canRetry: false,
      serverErrorMessage:
        'Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256',
    });
    const auth = Object.assign(new Error('SASL authentication failed.', { cause: protocolError }), {
      code: 'PLT_KFK_AUTHENTICATION',
      canRetry: false,
    });
    const network = Object.assign(new Error('Connection to 127.0.0.1:9093 failed.', { cause: auth }), {
      code: 'PLT_KFK_NETWORK',
      canRetry: true,
    });
    const any = Object.assign(new AggregateError([network], 'Cannot connect to any broker.'), {
      code: 'PLT_KFK_MULTIPLE',
    });
    return Object.assign(new AggregateError([any, any], 'metadata failed 2 times.'), { code: 'PLT_KFK_MULTIPLE' });
  };

  it('says an authentication failure as one, worded as kafkajs words it, and never retriable', () => {
    const refused = refusedCredentials();
    expect(isPlatformaticAuthenticationFailure(refused)).toBe(true);
    const named = withAuthenticationMessage(refused, 'SCRAM-SHA-256') as Error & { code: string; cause: unknown };
    expect(named.message).toMatch(
      /^SASL SCRAM SHA256 authentication failed: Authentication failed during authentication due to invalid credentials/,
    );
    expect(named).toMatchObject({ code: 'PLT_KFK_AUTHENTICATION', cause: refused });
    expect(isRetriablePlatformaticError(named)).toBe(false);
    expect((withAuthenticationMessage(refused, 'PLAIN') as Error).message).toMatch(
      /^SASL PLAIN authentication failed: /,
    );
    expect(platformaticFailureOf(named)).toMatchObject({ kind: 'broker', code: 'SASL_AUTHENTICATION_FAILED' });
    const network = Object.assign(new Error('Connection closed'), { code: 'PLT_KFK_NETWORK', canRetry: true });
    expect(isPlatformaticAuthenticationFailure(network)).toBe(false);
    expect(withAuthenticationMessage(network, 'PLAIN')).toBe(network);
  });

  it('says brokers that refused every connection as BrokerUnavailableError naming them; a broker that answered stays as it came', () => {
    const socket = (address: string) =>
      Object.assign(new Error(`connect ECONNREFUSED ${address}`), { code: 'ECONNREFUSED' });
    const network = (address: string, cause: Error) =>
      Object.assign(new Error(`Connection to ${address} failed.`, { cause }), {
        code: 'PLT_KFK_NETWORK',
        canRetry: true,
      });
    const any = (...errors: Error[]) =>
      Object.assign(new AggregateError(errors, 'Cannot connect to any broker.'), { code: 'PLT_KFK_MULTIPLE' });
    const refused = Object.assign(
      new AggregateError(
        [any(network('a:1', socket('10.0.0.1:1')), network('b:2', socket('10.0.0.2:2')))],
        'metadata failed 1 times.',
      ),
      { code: 'PLT_KFK_MULTIPLE' },
    );
    const said = withUnreachableMessage(refused, ['a:1', 'b:2']) as Error & { retriable: boolean };
    expect(isOutboxkitError(said, 'OUTBOXKIT_BROKER_UNAVAILABLE')).toBe(true);
    expect(said.message).toMatch(
      /^Kafka brokers could not be reached \(a:1, b:2\): connect ECONNREFUSED 10\.0\.0\.1:1; connect ECONNREFUSED 10\.0\.0\.2:2\. /,
    );
    expect(said.cause).toBe(refused);
    expect(isRetriablePlatformaticError(said)).toBe(true);
    // A broker answered (a protocol error), a connection closed after it opened, refused credentials: as they came.
    const answered = any(network('a:1', socket('10.0.0.1:1')), response(protocol('NOT_LEADER_OR_FOLLOWER', true)));
    expect(withUnreachableMessage(answered, ['a:1'])).toBe(answered);
    const closed = Object.assign(new Error('Connection closed'), { code: 'PLT_KFK_NETWORK', canRetry: true });
    expect(withUnreachableMessage(any(closed), ['a:1'])).not.toHaveProperty('code', 'OUTBOXKIT_BROKER_UNAVAILABLE');
    const credentials = refusedCredentials();
    expect(withUnreachableMessage(credentials, ['a:1'])).toBe(credentials);
  });

  it('retries a missing topic and refused credentials without delay, anything else with exponential backoff', () => {
    const delay = retryDelayOf(100, 1_000);
    const unknown = response(protocol('UNKNOWN_TOPIC_OR_PARTITION', true));
    expect(delay(null, 'metadata', 3, 5, unknown)).toBe(0);
    expect(delay(null, 'metadata', 3, 5, refusedCredentials().errors[0] as Error)).toBe(0);
    const other = response(protocol('LEADER_NOT_AVAILABLE', true));
    expect([1, 2, 3, 4, 5].map((attempt) => delay(null, 'metadata', attempt, 5, other))).toEqual([
      100, 200, 400, 800, 1_000,
    ]);
  });
});

describe('choosing the client', () => {
  it('carries the connection settings over and refuses what it cannot', () => {
    expect(
      platformaticConnection({
        clientId: 'c',
        brokers: ['b:9093'],
        ssl: true,
        sasl: { mechanism: 'scram-sha-512', username: 'u', password: 'p' },
        connectionTimeout: 3_000,
        requestTimeout: 30_000,
        retry: { retries: 5, initialRetryTime: 300 },
      }),
    ).toEqual({
      clientId: 'c',
      bootstrapBrokers: ['b:9093'],
      tls: {},
      sasl: { mechanism: 'SCRAM-SHA-512', username: 'u', password: 'p' },
      connectTimeout: 3_000,
      requestTimeout: 30_000,
      retries: 5,
      retryDelay: 300,
    });
    expect(() => createPlatformaticClient({ brokers: [] })).toThrow(/brokers/);
    expect(() =>
      createPlatformaticClient({ brokers: ['b:1'], sasl: { mechanism: 'aws', authorizationIdentity: 'x' } as never }),
    ).toThrow(/SASL mechanism "aws"/);
    // The dedup consumer's group member: made without loading the package or connecting.
    const member = createPlatformaticClient({ brokers: ['b:1'] }).groupConsumer({ groupId: 'g' });
    expect(typeof member.connect).toBe('function');
    expect(member.isRebalance(Object.assign(new Error('x'), { apiId: 'REBALANCE_IN_PROGRESS' }))).toBe(true);
    expect(member.isRebalance(new Error('x'))).toBe(false);
  });

  it("validates the relay's kafkaClient option", () => {
    const base = { connectionString: 'postgres://x', brokers: ['b:1'] };
    expect(resolveRelayOptions(base).kafkaClient).toBe('kafkajs');
    expect(resolveRelayOptions({ ...base, kafkaClient: 'platformatic' }).kafkaClient).toBe('platformatic');
    expect(() => resolveRelayOptions({ ...base, kafkaClient: 'rdkafka' as never })).toThrow(
      /kafkaClient.*kafkajs, platformatic/,
    );
    const kafka = createPlatformaticClient({ brokers: ['b:1'] });
    expect(() => resolveRelayOptions({ ...base, kafka, kafkaClient: 'platformatic' })).toThrow(
      /createPlatformaticClient/,
    );
  });
});
