/**
 * ops/grafana/outboxkit.json and ops/prometheus/alerts.yml: they parse, have the structure Grafana
 * and Prometheus need, and every metric they name exists in the registries the code builds (a
 * renamed metric fails here, not silently on a dashboard). No infrastructure: the components are
 * constructed, never started, and no metric is collected.
 */
import { readFileSync } from 'node:fs';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import client from 'prom-client';
import { describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { createDedupConsumer } from '../../consumer/dedup-consumer.js';
import { consumerMetrics } from '../../consumer/metrics.js';
import { Relay } from '../../relay/relay.js';
import { relayMetrics } from '../../relay/metrics.js';
import { idempotencyGauges, outcomeCounter } from '../../src/idempotency/metrics.js';

const dashboard = JSON.parse(readFileSync('ops/grafana/outboxkit.json', 'utf8')) as {
  uid: string;
  title: string;
  panels: Panel[];
  templating: { list: { name: string; query?: unknown; definition?: string }[] };
};
interface Panel {
  id: number;
  type: string;
  title: string;
  gridPos: { h: number; w: number; x: number; y: number };
  targets?: { expr: string; refId: string }[];
  datasource?: { uid: string };
}
interface Rule {
  alert: string;
  expr: string;
  for: string;
  labels: { severity: string };
  annotations: { summary: string; description: string; runbook: string };
}
const alerts = parseYaml(readFileSync('ops/prometheus/alerts.yml', 'utf8')) as {
  groups: { name: string; rules: Rule[] }[];
};
const rules = alerts.groups.flatMap((g) => g.rules);
const readme = readFileSync('ops/README.md', 'utf8');

/** Metric names the code registers, histogram series (_bucket, _sum, _count) included. */
function registeredNames(): Set<string> {
  const registry = new client.Registry();
  const pool = new pg.Pool({ connectionString: 'postgres://nobody@127.0.0.1:1/none' });
  const relay = new Relay({
    pool,
    producer: { connect: async () => {}, send: async () => {}, disconnect: async () => {} },
  });
  relayMetrics(relay, pool, registry);
  const consumer = createDedupConsumer({
    kafka: new Kafka({ brokers: ['127.0.0.1:1'], logLevel: logLevel.NOTHING }),
    groupId: 'ops-test',
    topics: ['ops-test'],
    database: pool,
    handler: async () => {},
  });
  consumerMetrics(consumer, registry);
  outcomeCounter(registry);
  idempotencyGauges(pool, registry);
  const names = new Set<string>();
  for (const m of registry.getMetricsAsArray()) {
    const { name, constructor } = m as unknown as { name: string; constructor: { name: string } };
    names.add(name);
    if (constructor.name === 'Histogram') for (const s of ['_bucket', '_sum', '_count']) names.add(name + s);
  }
  return names;
}

const metricNames = (expr: string) => new Set(expr.match(/\boutboxkit_[a-z0-9_]+/g) ?? []);

const dashboardExprs = [
  ...dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr)),
  ...dashboard.templating.list.flatMap((v) => (v.definition ? [v.definition] : [])),
];
const alertExprs = rules.map((r) => r.expr);

/** Balanced (), {}, [] outside string literals: a cheap guard against a broken PromQL edit. */
function balanced(expr: string): boolean {
  const pairs: Record<string, string> = { ')': '(', '}': '{', ']': '[' };
  const stack: string[] = [];
  let quoted = false;
  for (const c of expr) {
    if (c === '"') quoted = !quoted;
    if (quoted) continue;
    if ('({['.includes(c)) stack.push(c);
    else if (c in pairs && stack.pop() !== pairs[c]) return false;
  }
  return stack.length === 0 && !quoted;
}

describe('ops artefacts name metrics that exist', () => {
  const registered = registeredNames();

  it('every metric of the dashboard and of the alert rules is registered by the code', () => {
    const used = new Set([...dashboardExprs, ...alertExprs].flatMap((e) => [...metricNames(e)]));
    expect(used.size).toBeGreaterThan(15);
    expect([...used].filter((n) => !registered.has(n))).toEqual([]);
  });

  it('the dashboard covers what operators watch', () => {
    const used = new Set(dashboardExprs.flatMap((e) => [...metricNames(e)]));
    for (const name of [
      'outboxkit_relay_backlog',
      'outboxkit_relay_oldest_pending_seconds',
      'outboxkit_relay_published_total',
      'outboxkit_relay_publish_duration_seconds_bucket',
      'outboxkit_relay_parked',
      'outboxkit_relay_lanes_unowned',
      'outboxkit_consumer_dead_lettered_total',
      'outboxkit_consumer_duplicates_total',
      'outboxkit_consumer_partition_stalled_seconds',
      'outboxkit_consumer_partition_stuck',
      'outboxkit_idempotency_requests_total',
    ]) {
      expect(used, name).toContain(name);
    }
  });

  it('the sanity check itself catches an unknown name', () => {
    expect(registered.has('outboxkit_relay_backlogg')).toBe(false);
    expect(registered.has('outboxkit_relay_publish_duration_seconds_bucket')).toBe(true);
  });
});

describe('ops/grafana/outboxkit.json', () => {
  it('has a uid, unique panel ids, grid positions inside 24 columns, and the datasource variable', () => {
    expect(dashboard.uid).toBe('outboxkit');
    const ids = dashboard.panels.map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    for (const p of dashboard.panels) {
      expect(p.gridPos.x + p.gridPos.w, p.title).toBeLessThanOrEqual(24);
      if (p.type !== 'row') expect(p.datasource?.uid, p.title).toBe('${datasource}');
    }
    expect(dashboard.templating.list.map((v) => v.name)).toContain('datasource');
  });

  it('panels do not overlap', () => {
    const boxes = dashboard.panels.map((p) => p.gridPos);
    for (let i = 0; i < boxes.length; i++)
      for (let j = i + 1; j < boxes.length; j++) {
        const a = boxes[i]!;
        const b = boxes[j]!;
        const overlap = a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
        expect(overlap, `${dashboard.panels[i]!.title} / ${dashboard.panels[j]!.title}`).toBe(false);
      }
  });

  it('every query is balanced and every target has a refId', () => {
    for (const p of dashboard.panels)
      for (const t of p.targets ?? []) {
        expect(balanced(t.expr), t.expr).toBe(true);
        expect(t.refId).toMatch(/^[A-Z]$/);
      }
  });
});

describe('ops/prometheus/alerts.yml', () => {
  it('every rule has a name, a balanced expression, a for: duration, a severity, a summary and a runbook in ops/README.md', () => {
    expect(rules.length).toBeGreaterThanOrEqual(10);
    const names = rules.map((r) => r.alert);
    expect(new Set(names).size).toBe(names.length);
    for (const r of rules) {
      expect(r.alert, JSON.stringify(r)).toMatch(/^Outboxkit[A-Za-z]+$/);
      expect(balanced(r.expr), r.expr).toBe(true);
      expect(r.for, r.alert).toMatch(/^\d+[smh]$/);
      expect(['critical', 'warning', 'info'], r.alert).toContain(r.labels.severity);
      expect(r.annotations.summary, r.alert).toBeTruthy();
      expect(r.annotations.description, r.alert).toBeTruthy();
      const anchor = r.annotations.runbook.split('#')[1]!;
      // ops/README.md has a heading per alert (GitHub anchors: lower case).
      expect(readme.toLowerCase(), r.alert).toContain(`### ${anchor}`);
    }
  });

  it('covers the cases operators page on', () => {
    const names = rules.map((r) => r.alert);
    for (const n of [
      'OutboxkitNoRelayRunning',
      'OutboxkitOutboxLagHigh',
      'OutboxkitParkedEvents',
      'OutboxkitDeadLettersRising',
      'OutboxkitLanesWithoutOwner',
      'OutboxkitRelayKafkaDisconnected',
      'OutboxkitConsumerPartitionStuck',
    ])
      expect(names).toContain(n);
  });
});
