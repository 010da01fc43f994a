import { describe, expect, it } from 'vitest';
import {
  CLUSTER_SESSION_TIMEOUT_MS,
  clusterAddresses,
  parseQuorumState,
  quorumLeader,
  resolveKafkaNodes,
  serverProperties,
  type QuorumState,
} from '../../scripts/broker-config.js';

/** `server.properties` as a map; a key given twice fails the test (the broker would take the last). */
function parse(text: string): Map<string, string> {
  const map = new Map<string, string>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const eq = line.indexOf('=');
    expect(eq, line).toBeGreaterThan(0);
    const key = line.slice(0, eq);
    expect(map.has(key), `${key} given twice`).toBe(false);
    map.set(key, line.slice(eq + 1));
  }
  return map;
}

function single(version: string): Map<string, string> {
  return parse(
    serverProperties({
      version,
      nodeId: 1,
      listen: '127.0.0.1:9092',
      controller: '127.0.0.1:9093',
      voters: [{ id: 1, controller: '127.0.0.1:9093' }],
      logDir: '/srv/kafka/data',
    }),
  );
}

function clusterNode(version: string, id: number): Map<string, string> {
  const nodes = clusterAddresses();
  const self = nodes.find((n) => n.id === id)!;
  return parse(
    serverProperties({
      version,
      nodeId: id,
      listen: self.broker,
      controller: self.controller,
      voters: nodes.map((n) => ({ id: n.id, controller: n.controller })),
      logDir: `/srv/cluster/node-${id}/data`,
    }),
  );
}

const PORT_RANGES_IN_USE: [string, number, number][] = [
  ['the single broker', 9092, 9093],
  ['scratch brokers (test/relay, test/consumer)', 19092, 19500],
  ['scratch brokers (test/relay/kafka-transactions.test.ts)', 21092, 21300],
  ['the SASL/TLS test broker (test/relay/kafka-security.test.ts)', 21000, 31004],
  ["Linux's ephemeral ports (the chaos harness's free ports)", 32768, 60999],
];

describe('clusterAddresses', () => {
  it('gives node n the client port 9092 + 100n and the controller port above it', () => {
    expect(clusterAddresses()).toEqual([
      { id: 1, broker: '127.0.0.1:9192', controller: '127.0.0.1:9193' },
      { id: 2, broker: '127.0.0.1:9292', controller: '127.0.0.1:9293' },
      { id: 3, broker: '127.0.0.1:9392', controller: '127.0.0.1:9393' },
    ]);
  });

  it('uses six distinct ports that collide with no other broker of the project', () => {
    const ports = clusterAddresses().flatMap((n) => [n.broker, n.controller].map((a) => Number(a.split(':')[1])));
    expect(new Set(ports).size).toBe(6);
    for (const port of ports) {
      for (const [owner, from, to] of PORT_RANGES_IN_USE) {
        expect(port >= from && port <= to, `port ${port} lies in ${from}-${to} (${owner})`).toBe(false);
      }
    }
  });
});

describe('resolveKafkaNodes', () => {
  it('reads OUTBOXKIT_KAFKA_NODES: unset or 1 is the single broker, 3 the cluster', () => {
    expect(resolveKafkaNodes(undefined)).toBe(1);
    expect(resolveKafkaNodes('')).toBe(1);
    expect(resolveKafkaNodes(' 1 ')).toBe(1);
    expect(resolveKafkaNodes('3')).toBe(3);
    expect(resolveKafkaNodes(' 3\n')).toBe(3);
  });

  it('refuses any other count, naming the accepted ones', () => {
    for (const v of ['2', '5', 'three', '3.0']) {
      expect(() => resolveKafkaNodes(v)).toThrow(`OUTBOXKIT_KAFKA_NODES=${v} is not supported; use 1`);
    }
    expect(() => resolveKafkaNodes('2')).toThrow('127.0.0.1:9192,127.0.0.1:9292,127.0.0.1:9392');
  });
});

describe('serverProperties: the single broker', () => {
  for (const version of ['3.9.2', '4.4.0']) {
    it(`Kafka ${version}: one voter, everything at one replica`, () => {
      const p = single(version);
      expect(p.get('process.roles')).toBe('broker,controller');
      expect(p.get('node.id')).toBe('1');
      expect(p.get('controller.quorum.voters')).toBe('1@127.0.0.1:9093');
      expect(p.get('listeners')).toBe('PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093');
      expect(p.get('advertised.listeners')).toBe('PLAINTEXT://127.0.0.1:9092');
      expect(p.get('log.dirs')).toBe('/srv/kafka/data');
      expect(p.get('num.partitions')).toBe('1');
      expect(p.get('default.replication.factor')).toBe('1');
      expect(p.get('min.insync.replicas')).toBe('1');
      expect(p.get('offsets.topic.replication.factor')).toBe('1');
      expect(p.get('transaction.state.log.replication.factor')).toBe('1');
      expect(p.get('transaction.state.log.min.isr')).toBe('1');
      expect(p.get('auto.create.topics.enable')).toBe('false');
      // Kafka's defaults for a broker nobody fails over.
      expect(p.has('broker.session.timeout.ms')).toBe(false);
      expect(p.has('broker.heartbeat.interval.ms')).toBe(false);
      if (version.startsWith('4.')) {
        expect(p.get('share.coordinator.state.topic.replication.factor')).toBe('1');
        expect(p.get('share.coordinator.state.topic.min.isr')).toBe('1');
      } else {
        // 3.9 has no share groups: an unknown setting would only be logged, but say nothing.
        expect(p.has('share.coordinator.state.topic.replication.factor')).toBe(false);
      }
    });
  }
});

describe('serverProperties: a node of the 3-node cluster', () => {
  for (const version of ['3.9.2', '4.4.0']) {
    it(`Kafka ${version}: three static voters, RF 3, min.insync.replicas 2, its own ports and storage`, () => {
      for (const id of [1, 2, 3]) {
        const p = clusterNode(version, id);
        const port = 9092 + 100 * id;
        expect(p.get('process.roles')).toBe('broker,controller');
        expect(p.get('node.id')).toBe(String(id));
        expect(p.get('controller.quorum.voters')).toBe('1@127.0.0.1:9193,2@127.0.0.1:9293,3@127.0.0.1:9393');
        expect(p.get('listeners')).toBe(`PLAINTEXT://127.0.0.1:${port},CONTROLLER://127.0.0.1:${port + 1}`);
        expect(p.get('advertised.listeners')).toBe(`PLAINTEXT://127.0.0.1:${port}`);
        expect(p.get('controller.listener.names')).toBe('CONTROLLER');
        expect(p.get('inter.broker.listener.name')).toBe('PLAINTEXT');
        expect(p.get('log.dirs')).toBe(`/srv/cluster/node-${id}/data`);
        expect(p.get('default.replication.factor')).toBe('3');
        expect(p.get('min.insync.replicas')).toBe('2');
        expect(p.get('offsets.topic.replication.factor')).toBe('3');
        expect(p.get('transaction.state.log.replication.factor')).toBe('3');
        expect(p.get('transaction.state.log.min.isr')).toBe('2');
        expect(p.get('broker.session.timeout.ms')).toBe(String(CLUSTER_SESSION_TIMEOUT_MS));
        expect(p.get('broker.heartbeat.interval.ms')).toBe('1000');
        // Heartbeats well inside the session: six may be missed before a node is fenced.
        expect(CLUSTER_SESSION_TIMEOUT_MS / Number(p.get('broker.heartbeat.interval.ms'))).toBeGreaterThanOrEqual(3);
        if (version.startsWith('4.')) {
          expect(p.get('share.coordinator.state.topic.replication.factor')).toBe('3');
          expect(p.get('share.coordinator.state.topic.min.isr')).toBe('2');
        } else {
          expect(p.has('share.coordinator.state.topic.replication.factor')).toBe(false);
        }
      }
    });

    it(`Kafka ${version}: differs from the single broker only where a cluster must`, () => {
      const one = single(version);
      const node = clusterNode(version, 2);
      const differing = [...new Set([...one.keys(), ...node.keys()])].filter((k) => one.get(k) !== node.get(k)).sort();
      const expected = [
        'advertised.listeners',
        'broker.heartbeat.interval.ms',
        'broker.session.timeout.ms',
        'controller.quorum.voters',
        'default.replication.factor',
        'listeners',
        'log.dirs',
        'min.insync.replicas',
        'node.id',
        'offsets.topic.replication.factor',
        'transaction.state.log.min.isr',
        'transaction.state.log.replication.factor',
        ...(version.startsWith('4.')
          ? ['share.coordinator.state.topic.min.isr', 'share.coordinator.state.topic.replication.factor']
          : []),
      ].sort();
      expect(differing).toEqual(expected);
      // Same partition count, threads, retention as the single broker.
      expect(node.get('num.partitions')).toBe(one.get('num.partitions'));
    });
  }
});

describe('parseQuorumState', () => {
  it('reads the leader and its epoch from the file Kafka writes', () => {
    // Kafka 3.9.2, single node (as written on this machine).
    expect(
      parseQuorumState(
        '{"clusterId":"","leaderId":1,"leaderEpoch":1,"votedId":-1,"appliedOffset":0,"currentVoters":[{"voterId":1}],"data_version":0}',
      ),
    ).toEqual({ leaderId: 1, leaderEpoch: 1 });
    // Kafka 4.4.0, a follower of a 3-node cluster that voted for the leader (as written here).
    expect(
      parseQuorumState(
        '{"clusterId":"","leaderId":2,"leaderEpoch":2,"votedId":2,"appliedOffset":0,"currentVoters":[{"voterId":1},{"voterId":2},{"voterId":3}],"data_version":0}',
      ),
    ).toEqual({ leaderId: 2, leaderEpoch: 2 });
    // A voter during an election: no leader yet.
    expect(parseQuorumState('{"leaderId":-1,"leaderEpoch":7,"votedId":2,"data_version":1}')).toEqual({
      leaderId: -1,
      leaderEpoch: 7,
    });
  });

  it('returns undefined for anything else', () => {
    expect(parseQuorumState('')).toBeUndefined();
    expect(parseQuorumState('{"leaderId":1')).toBeUndefined();
    expect(parseQuorumState('null')).toBeUndefined();
    expect(parseQuorumState('{"leaderEpoch":3}')).toBeUndefined();
    expect(parseQuorumState('{"leaderId":"1","leaderEpoch":3}')).toBeUndefined();
  });
});

describe('quorumLeader', () => {
  const at = (leaderId: number, leaderEpoch: number): QuorumState => ({ leaderId, leaderEpoch });

  it('names the leader of the highest epoch when it runs', () => {
    expect(
      quorumLeader([
        { id: 1, running: true, state: at(2, 5) },
        { id: 2, running: true, state: at(2, 5) },
        { id: 3, running: true, state: at(1, 4) },
      ]),
    ).toBe(2);
  });

  it('is undefined while the highest epoch has no leader (an election)', () => {
    expect(
      quorumLeader([
        { id: 1, running: true, state: at(-1, 6) },
        { id: 2, running: true, state: at(2, 5) },
        { id: 3, running: true, state: at(-1, 6) },
      ]),
    ).toBeUndefined();
  });

  it('is undefined when the last leader known is not running (the survivors have not noticed yet)', () => {
    expect(
      quorumLeader([
        { id: 1, running: false, state: at(1, 5) },
        { id: 2, running: true, state: at(1, 5) },
        { id: 3, running: true, state: at(1, 5) },
      ]),
    ).toBeUndefined();
  });

  it('ignores the file of a node that does not run, whatever epoch it names', () => {
    expect(
      quorumLeader([
        { id: 1, running: false, state: at(1, 9) },
        { id: 2, running: true, state: at(3, 6) },
        { id: 3, running: true, state: at(3, 6) },
      ]),
    ).toBe(3);
  });

  it('finds the leader from its own file even when the followers wrote none yet', () => {
    expect(
      quorumLeader([
        { id: 1, running: true, state: undefined },
        { id: 2, running: true, state: at(-1, 1) },
        { id: 3, running: true, state: at(3, 2) },
      ]),
    ).toBe(3);
  });

  it('is undefined when nothing runs', () => {
    expect(quorumLeader([])).toBeUndefined();
    expect(quorumLeader([{ id: 1, running: false, state: at(1, 1) }])).toBeUndefined();
  });
});
