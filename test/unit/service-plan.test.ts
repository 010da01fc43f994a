import { describe, expect, it } from 'vitest';
import {
  isCi,
  needsDockerProbe,
  planCluster,
  planKafka,
  planPostgres,
  type ClusterFacts,
  type ClusterNodeFact,
  type ServiceFacts,
} from '../../scripts/service-plan.js';

/** A machine with nothing: no env, nothing answering, no toolchain, no Docker, not CI, a test run. */
function bare(over: Partial<ServiceFacts> = {}): ServiceFacts {
  return {
    databaseUrl: undefined,
    kafkaBrokers: [],
    postgres: { local: 'down', clusterInstalled: false },
    kafka: { localAnswers: false, maven: { ok: false, reason: '`java -version` failed (java: command not found)' } },
    docker: { reachable: false, reason: 'Could not find a working container runtime strategy' },
    ci: false,
    ephemeralOk: true,
    ...over,
  };
}

const DOCKER = { reachable: true } as const;

describe('planPostgres', () => {
  it('uses DATABASE_URL first, whatever else is there', () => {
    const url = 'postgres://u@db:5432/x';
    expect(planPostgres(bare({ databaseUrl: url }))).toEqual({ action: 'use-env', url });
    expect(
      planPostgres(bare({ databaseUrl: url, postgres: { local: 'answers', clusterInstalled: true }, docker: DOCKER })),
    ).toEqual({ action: 'use-env', url });
  });

  it('uses the local server when it answers, or when it answers but refuses (its own error is clearer)', () => {
    for (const local of ['answers', 'refused'] as const) {
      expect(planPostgres(bare({ postgres: { local, clusterInstalled: false }, docker: DOCKER }))).toEqual({
        action: 'use-local',
        startCluster: false,
      });
    }
  });

  it('starts the installed local cluster before considering Docker', () => {
    expect(planPostgres(bare({ postgres: { local: 'down', clusterInstalled: true }, docker: DOCKER }))).toEqual({
      action: 'use-local',
      startCluster: true,
    });
  });

  it('starts a testcontainer when nothing else is left and a Docker engine answers', () => {
    expect(planPostgres(bare({ docker: DOCKER }))).toEqual({ action: 'start-testcontainer' });
  });

  it('names what is missing and each fix when there is no Docker engine', () => {
    const plan = planPostgres(bare());
    expect(plan.action).toBe('error');
    const message = plan.action === 'error' ? plan.message : '';
    expect(message).toContain('nothing answers at 127.0.0.1:5432');
    expect(message).toContain('DATABASE_URL is not set');
    expect(message).toContain('no local cluster is installed');
    expect(message).toContain('no Docker engine answers');
    expect(message).toContain('Could not find a working container runtime strategy');
    expect(message).toContain('set DATABASE_URL');
    expect(message).toContain('apt-get install postgresql');
    expect(message).toContain('docker compose up -d --wait');
    // A docker CLI on the PATH is not an engine: the message says so.
    expect(message).toContain('the `docker` CLI alone is not enough');
  });

  it('an unprobed Docker counts as unreachable', () => {
    expect(planPostgres(bare({ docker: undefined })).action).toBe('error');
  });

  it('never starts a container under CI, and says why', () => {
    const plan = planPostgres(bare({ docker: DOCKER, ci: true }));
    expect(plan.action).toBe('error');
    expect(plan.action === 'error' && plan.message).toContain('CI is set');
    expect(plan.action === 'error' && plan.message).toContain('npm run services:up');
  });

  it('never starts a container for a long-lived command (services:up): points at docker compose', () => {
    const plan = planPostgres(bare({ docker: DOCKER, ephemeralOk: false }));
    expect(plan.action).toBe('error');
    expect(plan.action === 'error' && plan.message).toContain('would stop when it exits');
    expect(plan.action === 'error' && plan.message).toContain('docker compose up -d --wait');
  });
});

describe('planKafka', () => {
  it('uses KAFKA_BROKERS first, whatever else is there', () => {
    expect(planKafka(bare({ kafkaBrokers: ['k1:9092', 'k2:9092'] }))).toEqual({
      action: 'use-env',
      brokers: ['k1:9092', 'k2:9092'],
    });
    expect(
      planKafka(
        bare({ kafkaBrokers: ['k1:9092'], kafka: { localAnswers: true, maven: { ok: true } }, docker: DOCKER }),
      ),
    ).toEqual({ action: 'use-env', brokers: ['k1:9092'] });
  });

  it('uses a broker that answers on 127.0.0.1:9092', () => {
    expect(planKafka(bare({ kafka: { localAnswers: true, maven: undefined }, docker: DOCKER }))).toEqual({
      action: 'use-local',
    });
  });

  it('starts the Maven broker before considering Docker (the path CI depends on)', () => {
    expect(planKafka(bare({ kafka: { localAnswers: false, maven: { ok: true } }, docker: DOCKER }))).toEqual({
      action: 'start-maven-broker',
    });
    // Also under CI: CI=true changes nothing on the Maven path.
    expect(planKafka(bare({ kafka: { localAnswers: false, maven: { ok: true } }, ci: true }))).toEqual({
      action: 'start-maven-broker',
    });
  });

  it('starts a testcontainer when Java/Maven are missing and a Docker engine answers', () => {
    expect(planKafka(bare({ docker: DOCKER }))).toEqual({ action: 'start-testcontainer' });
  });

  it('names what is missing (with the Java/Maven reason) and each fix when there is no Docker engine', () => {
    const plan = planKafka(bare());
    expect(plan.action).toBe('error');
    const message = plan.action === 'error' ? plan.message : '';
    expect(message).toContain('nothing answers at 127.0.0.1:9092');
    expect(message).toContain('KAFKA_BROKERS is not set');
    expect(message).toContain('java: command not found');
    expect(message).toContain('no Docker engine answers');
    expect(message).toContain('set KAFKA_BROKERS');
    expect(message).toContain('install Java 17+ and Maven');
    expect(message).toContain('docker compose up -d --wait');
  });

  it('never starts a container under CI or for services:up', () => {
    expect(planKafka(bare({ docker: DOCKER, ci: true })).action).toBe('error');
    expect(planKafka(bare({ docker: DOCKER, ephemeralOk: false })).action).toBe('error');
  });
});

describe('planKafka with OUTBOXKIT_KAFKA_NODES=3', () => {
  const cluster = (kafka: Partial<ServiceFacts['kafka']>, over: Partial<ServiceFacts> = {}) =>
    bare({ kafka: { nodes: 3, localAnswers: false, maven: { ok: true }, ...kafka }, ...over });

  it('still uses KAFKA_BROKERS first', () => {
    expect(planKafka(cluster({}, { kafkaBrokers: ['k1:9092'] }))).toEqual({ action: 'use-env', brokers: ['k1:9092'] });
  });

  it('uses the cluster when every node answers, else starts its missing nodes with Maven', () => {
    expect(planKafka(cluster({ localAnswers: true, maven: undefined }))).toEqual({ action: 'use-local' });
    expect(planKafka(cluster({}))).toEqual({ action: 'start-maven-cluster' });
    expect(planKafka(cluster({}, { ci: true }))).toEqual({ action: 'start-maven-cluster' });
  });

  it('never falls back to a container (no container path starts a cluster), and says what to do', () => {
    const plan = planKafka(
      cluster({ maven: { ok: false, reason: '`mvn -v` failed (mvn: command not found)' } }, { docker: DOCKER }),
    );
    expect(plan.action).toBe('error');
    const message = plan.action === 'error' ? plan.message : '';
    expect(message).toContain('127.0.0.1:9192,127.0.0.1:9292,127.0.0.1:9392');
    expect(message).toContain('mvn: command not found');
    expect(message).toContain('set KAFKA_BROKERS');
    expect(message).toContain('install Java 17+ and Maven');
    expect(message).toContain('unset OUTBOXKIT_KAFKA_NODES');
  });

  it('needs no Docker probe for Kafka', () => {
    const { docker: _docker, ...facts } = cluster({ maven: { ok: false } }, { databaseUrl: 'postgres://x' });
    expect(needsDockerProbe(facts)).toBe(false);
  });
});

describe('planCluster', () => {
  const node = (id: number, over: Partial<ClusterNodeFact> = {}): ClusterNodeFact => ({
    id,
    broker: `127.0.0.1:${9092 + 100 * id}`,
    answers: false,
    running: undefined,
    ...over,
  });
  const facts = (nodes: ClusterNodeFact[], over: Partial<ClusterFacts> = {}): ClusterFacts => ({
    nodes,
    wanted: '3.9.2',
    wantedExplicitly: false,
    ...over,
  });
  const ours = { answers: true, running: '3.9.2' };

  it('starts all three nodes, with the version asked for, when none runs', () => {
    expect(planCluster(facts([node(1), node(2), node(3)], { wanted: '4.4.0' }))).toEqual({
      action: 'start',
      version: '4.4.0',
      start: [1, 2, 3],
      wait: [],
    });
  });

  it('uses the cluster as it is when every node answers', () => {
    expect(planCluster(facts([node(1, ours), node(2, ours), node(3, ours)]))).toEqual({ action: 'use-running' });
  });

  it('starts only a killed node again, with the version the others run', () => {
    expect(planCluster(facts([node(1, ours), node(2), node(3, ours)], { wanted: '4.4.0' }))).toEqual({
      action: 'start',
      version: '3.9.2',
      start: [2],
      wait: [],
    });
  });

  it('waits for a node of ours that runs but does not answer yet (booting), never starts a second one', () => {
    expect(planCluster(facts([node(1, ours), node(2, { running: '3.9.2' }), node(3)]))).toEqual({
      action: 'start',
      version: '3.9.2',
      start: [3],
      wait: [2],
    });
  });

  it('warns when OUTBOXKIT_KAFKA_VERSION asks for another version than the running cluster', () => {
    const nodes = [node(1, ours), node(2, ours), node(3, ours)];
    const plan = planCluster(facts(nodes, { wanted: '4.4.0', wantedExplicitly: true }));
    expect(plan.action).toBe('use-running');
    expect(plan.action === 'use-running' && plan.warning).toContain(
      'asks for Kafka 4.4.0, but the local cluster runs Kafka 3.9.2',
    );
    // Not asked explicitly: the default version differs, nothing to warn about.
    expect(planCluster(facts(nodes, { wanted: '4.4.0' }))).toEqual({ action: 'use-running' });
  });

  it('uses a cluster this checkout did not start while all its nodes answer', () => {
    const foreign = { answers: true, running: undefined };
    expect(planCluster(facts([node(1, foreign), node(2, foreign), node(3, foreign)]))).toEqual({
      action: 'use-running',
    });
  });

  it('refuses to complete a cluster this checkout did not start (another cluster id), naming the ports', () => {
    const plan = planCluster(facts([node(1, { answers: true }), node(2), node(3, ours)]));
    expect(plan.action).toBe('error');
    const message = plan.action === 'error' ? plan.message : '';
    expect(message).toContain('127.0.0.1:9192 answers but was not started from this checkout');
    expect(message).toContain('127.0.0.1:9292 is down');
    expect(message).toContain('npm run services:down');
  });

  it('refuses nodes of two versions at once', () => {
    const plan = planCluster(facts([node(1, ours), node(2, { answers: true, running: '4.4.0' }), node(3)]));
    expect(plan.action).toBe('error');
    expect(plan.action === 'error' && plan.message).toContain('different versions (3.9.2, 4.4.0)');
  });
});

describe('needsDockerProbe', () => {
  const { docker: _docker, ...nothing } = bare();

  it('is false when every service has a source without Docker', () => {
    expect(
      needsDockerProbe({
        ...nothing,
        postgres: { local: 'answers', clusterInstalled: false },
        kafka: { localAnswers: true, maven: undefined },
      }),
    ).toBe(false);
    expect(
      needsDockerProbe({
        ...nothing,
        databaseUrl: 'postgres://x',
        kafka: { localAnswers: false, maven: { ok: true } },
      }),
    ).toBe(false);
    expect(
      needsDockerProbe({
        ...nothing,
        postgres: { local: 'down', clusterInstalled: true },
        kafkaBrokers: ['k:9092'],
      }),
    ).toBe(false);
  });

  it('is true when PostgreSQL or Kafka has nothing left but Docker', () => {
    expect(needsDockerProbe({ ...nothing, kafka: { localAnswers: true, maven: undefined } })).toBe(true);
    expect(needsDockerProbe({ ...nothing, postgres: { local: 'answers', clusterInstalled: false } })).toBe(true);
  });
});

describe('isCi', () => {
  it('reads CI as CI systems set it', () => {
    expect(isCi(undefined)).toBe(false);
    expect(isCi('')).toBe(false);
    expect(isCi('0')).toBe(false);
    expect(isCi('false')).toBe(false);
    expect(isCi('FALSE')).toBe(false);
    expect(isCi('true')).toBe(true);
    expect(isCi('1')).toBe(true);
    expect(isCi('woodpecker')).toBe(true);
  });
});
