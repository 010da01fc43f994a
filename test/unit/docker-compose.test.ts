/**
 * docker-compose.yml checked statically: this project's machines have no Docker engine, so the
 * file is never run here. Parsed with `yaml` (a dev-only transitive dependency, via testcontainers'
 * docker-compose client).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

interface Service {
  image?: string;
  ports?: string[];
  environment?: Record<string, string | number | boolean>;
  healthcheck?: { test?: string[] | string; interval?: string; timeout?: string; retries?: number };
}

const compose = parse(fs.readFileSync(path.join(ROOT, 'docker-compose.yml'), 'utf8')) as {
  services?: Record<string, Service>;
};
const services = compose.services ?? {};

/** The host side of `127.0.0.1:5432:5432` / `5432:5432` (the port a client on the host dials). */
function hostPorts(service: Service | undefined): number[] {
  return (service?.ports ?? []).map((p) => {
    const parts = String(p).split(':');
    return Number(parts.length === 3 ? parts[1] : parts[0]);
  });
}

function healthcheckCommand(service: Service | undefined): string {
  const test = service?.healthcheck?.test;
  return Array.isArray(test) ? test.join(' ') : (test ?? '');
}

describe('docker-compose.yml', () => {
  it('has exactly the two services the tests need', () => {
    expect(Object.keys(services).sort()).toEqual(['kafka', 'postgres']);
  });

  it('gives both services a real healthcheck (so `docker compose up --wait` waits for readiness)', () => {
    for (const name of ['postgres', 'kafka']) {
      const hc = services[name]?.healthcheck;
      expect(hc, name).toBeDefined();
      expect(healthcheckCommand(services[name]), name).not.toBe('');
      expect(hc?.retries, name).toBeGreaterThan(0);
    }
    expect(healthcheckCommand(services.postgres)).toContain('pg_isready');
    expect(healthcheckCommand(services.kafka)).toContain('--bootstrap-server 127.0.0.1:9092');
  });

  it('publishes the default ports on loopback (DATABASE_URL / KAFKA_BROKERS defaults)', () => {
    expect(hostPorts(services.postgres)).toEqual([5432]);
    expect(hostPorts(services.kafka)).toEqual([9092]);
    for (const name of ['postgres', 'kafka']) {
      for (const p of services[name]?.ports ?? []) expect(String(p), name).toMatch(/^127\.0\.0\.1:/);
    }
  });

  it('runs Kafka in KRaft mode (broker + controller, no ZooKeeper) with topic auto-creation off', () => {
    const env = services.kafka?.environment ?? {};
    expect(env.KAFKA_PROCESS_ROLES).toBe('broker,controller');
    expect(env.KAFKA_CONTROLLER_LISTENER_NAMES).toBe('CONTROLLER');
    expect(String(env.KAFKA_CONTROLLER_QUORUM_VOTERS)).toMatch(/^1@/);
    expect(Object.keys(env).some((k) => k.includes('ZOOKEEPER'))).toBe(false);
    expect(String(env.KAFKA_AUTO_CREATE_TOPICS_ENABLE)).toBe('false');
    // Clients on the host dial what the broker advertises.
    expect(env.KAFKA_ADVERTISED_LISTENERS).toBe('PLAINTEXT://127.0.0.1:9092');
    // One broker: internal topics must not ask for three replicas.
    expect(Number(env.KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR)).toBe(1);
    expect(Number(env.KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR)).toBe(1);
  });

  it('pins the images: PostgreSQL 13+ and the Kafka version CI tests (3.9.2)', () => {
    const pgTag = services.postgres?.image?.match(/^postgres:(\d+)/)?.[1];
    expect(Number(pgTag)).toBeGreaterThanOrEqual(13);
    expect(services.kafka?.image).toBe('apache/kafka:3.9.2');
  });

  it('matches the credentials its header comment tells users to put in DATABASE_URL', () => {
    const text = fs.readFileSync(path.join(ROOT, 'docker-compose.yml'), 'utf8');
    const password = services.postgres?.environment?.POSTGRES_PASSWORD;
    expect(text).toContain(`DATABASE_URL=postgres://postgres:${String(password)}@127.0.0.1:5432/postgres`);
  });
});
