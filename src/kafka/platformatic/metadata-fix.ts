/**
 * A fix for a @platformatic/kafka trap (1.35.0 and 2.12.1 alike) on a multi-broker cluster: one
 * partition without a leader fails every metadata request that covers it, and with it everything
 * that needs metadata (the same fault as kafkajs', ../kafkajs/metadata-fix.ts).
 *
 * The cause: the client's Metadata response parsers (dist/apis/metadata/metadata-v*.js: v9-v12 in
 * 1.35.0, v0-v12 in 2.12.1) collect every topic- and partition-level error code and then throw a
 * `ResponseError` holding them (each a `ProtocolError` with its `path`, `/topics/i` or
 * `/topics/i/partitions/j`, and `apiCode`) and the parsed answer (`response`). A partition whose
 * only replica, or every in-sync replica, is down comes with LEADER_NOT_AVAILABLE (its leader -1).
 * The client's `metadata()` retries that and then fails for the whole request: the relay's
 * partition check (`describeTopics`) never answers, and the producer's send (which asks the
 * metadata of its topics first) fails for every record of a topic with one leaderless partition
 * (G7 in docs/guarantees.md, cases C25-C27).
 *
 * The fix wraps `Base.prototype[kGetApi]` (every client, producer, admin and consumer, asks it for
 * the Metadata API it calls, `api(connection, ...args, callback)`): the Metadata API it gives back
 * answers with the parsed response instead of the error when every error of the answer is a
 * partition's (path `/topics/i/partitions/j`) LEADER_NOT_AVAILABLE (5) or REPLICA_NOT_AVAILABLE
 * (9): such a partition is kept, with the leader the broker gave (-1 when it has none). A
 * topic-level error, and every other partition error, still fails as before.
 *
 * A partition with leader -1 in the client's metadata then reaches code that looks its leader up
 * in `metadata.brokers`: 1.35.0's connection pool reads `broker.host` of `undefined` and throws a
 * TypeError from inside a callback (uncaught: the process would crash); 2.12.1's answers a
 * retriable `NetworkError` ("Cannot get a connection: the broker is not available in the current
 * cluster metadata.", `hasStaleMetadata`). The fix also wraps `Base.prototype[kGetConnection]` so
 * that both answer that same error for a broker that is not in the metadata. The producer adapter
 * does not hand the client a record for a leaderless partition in the first place (./producer.ts).
 *
 * Applied once per loaded module (`loadPlatformaticKafka()` applies it right after loading), and
 * only when the module's shapes are as expected: a 1.x or 2.x client (`clientSoftwareVersion`)
 * exporting `Base`, `kGetApi`, `kGetConnection`, `NetworkError`, and Metadata API modules
 * (`metadataV<n>`) whose `parseResponse` pushes partition errors under `/topics/${i}/partitions/${j}`
 * and throws `new ResponseError(apiKey, apiVersion, Object.fromEntries(errors), response)`, whose
 * `api` is a function with `key` 3. Otherwise nothing is changed.
 */
import { promisify } from 'node:util';
import { normalised } from '../kafkajs/fix.js';
import { TOLERATED_PARTITION_ERRORS } from '../kafkajs/metadata-fix.js';
import { loadPlatformaticKafka, type PlatformaticKafka } from './load.js';

/**
 * What {@link fixPlatformaticMetadata} did: `'applied'` the first time for a module (the loader's
 * own call, so {@link applyPlatformaticMetadataFix} normally answers the next value),
 * `'already-applied'` after that (also when another copy of outboxkit did it), `'unrecognised'`
 * when the module's shapes are not the expected ones (left as it is), `'not-found'` when the
 * package cannot be loaded ({@link applyPlatformaticMetadataFix} only).
 */
export type PlatformaticFixOutcome = 'applied' | 'already-applied' | 'unrecognised' | 'not-found';

type Callback = (error: unknown, result?: unknown) => void;
type Api = ((connection: unknown, ...args: unknown[]) => void) & { key?: unknown; version?: unknown; async?: unknown };
type GetApi = (this: unknown, name: string, callback: (error: unknown, api?: Api) => void) => unknown;
type GetConnection = (this: unknown, broker: unknown, callback: Callback) => unknown;

/** The lines of the shipped parsers the fix relies on, without blanks. */
const PARTITION_ERROR = normalise('errors.push([`/topics/${i}/partitions/${j}`, [errorCode, null]])');
const THROW = normalise('throw new ResponseError(apiKey, apiVersion, Object.fromEntries(errors), response)');
const PARTITION_PATH = /^\/topics\/\d+\/partitions\/\d+$/;
/** The message of 2.12.1's own error for a broker not in the metadata (network/connection-pool.js). */
const NO_BROKER_MESSAGE = 'Cannot get a connection: the broker is not available in the current cluster metadata.';

/** Marks the wrappers, so that a second copy of outboxkit in the process recognises them. */
const FIXED = Symbol.for('outboxkit.platformaticMetadataFix');

function normalise(text: string): string {
  return text.replace(/\s+/g, '');
}

/**
 * True when `error` is a Metadata `ResponseError` whose errors are all partition-level
 * LEADER_NOT_AVAILABLE or REPLICA_NOT_AVAILABLE, with the parsed answer in `response`.
 */
export function onlyLeaderlessPartitions(error: unknown): error is { response: { topics: unknown[] } } {
  const e = error as { code?: unknown; errors?: unknown; response?: { topics?: unknown } } | null;
  if (!e || typeof e !== 'object' || e.code !== 'PLT_KFK_RESPONSE') return false;
  if (!e.response || typeof e.response !== 'object' || !Array.isArray(e.response.topics)) return false;
  if (!Array.isArray(e.errors) || e.errors.length === 0) return false;
  return e.errors.every((inner: { path?: unknown; apiCode?: unknown } | null) => {
    return (
      typeof inner?.path === 'string' &&
      PARTITION_PATH.test(inner.path) &&
      typeof inner.apiCode === 'number' &&
      TOLERATED_PARTITION_ERRORS.has(inner.apiCode)
    );
  });
}

/** `api` (a Metadata API: `api(connection, ...args, callback)`) answering leaderless partitions. */
function tolerant(api: Api): Api {
  const wrapped: Api = function (this: unknown, connection: unknown, ...args: unknown[]) {
    const callback: Callback = typeof args.at(-1) === 'function' ? (args.pop() as Callback) : () => {};
    api.call(this, connection, ...args, (error: unknown, response?: unknown) => {
      if (error && onlyLeaderlessPartitions(error)) callback(null, error.response);
      else callback(error, response);
    });
  };
  wrapped.async = promisify(wrapped);
  wrapped.key = api.key;
  wrapped.version = api.version;
  Object.defineProperty(wrapped, FIXED, { value: true });
  return wrapped;
}

/** Why `kafka` is not the shape the fix expects, or undefined when it is. */
function unrecognised(kafka: PlatformaticKafka): string | undefined {
  const k = kafka as unknown as Record<string, unknown>;
  const version = typeof k.clientSoftwareVersion === 'string' ? k.clientSoftwareVersion : '';
  if (!/^[12]\./.test(version)) return `version ${version || 'unknown'}`;
  const base = k.Base as { prototype?: Record<symbol, unknown> } | undefined;
  const kGetApi = k.kGetApi;
  const kGetConnection = k.kGetConnection;
  if (typeof base?.prototype !== 'object' || typeof kGetApi !== 'symbol' || typeof kGetConnection !== 'symbol') {
    return 'no Base, kGetApi or kGetConnection';
  }
  if (typeof base.prototype[kGetApi] !== 'function' || typeof base.prototype[kGetConnection] !== 'function') {
    return 'no Base.prototype[kGetApi] or [kGetConnection]';
  }
  if (typeof k.NetworkError !== 'function') return 'no NetworkError';
  const modules = Object.keys(k).filter((name) => /^metadataV\d+$/.test(name));
  if (modules.length === 0) return 'no Metadata API';
  for (const name of modules) {
    const m = k[name] as { api?: Api; parseResponse?: (...args: never[]) => unknown } | undefined;
    if (typeof m?.api !== 'function' || m.api.key !== 3 || typeof m.parseResponse !== 'function') {
      return `${name} is not a Metadata API`;
    }
    const source = normalised(m.parseResponse);
    if (!source.includes(PARTITION_ERROR) || !source.includes(THROW)) return `${name}'s parse differs`;
  }
  return undefined;
}

/** The Metadata API versions the loaded module implements (`metadataV<n>`), ascending. */
export function platformaticMetadataVersions(kafka: PlatformaticKafka): number[] {
  return Object.keys(kafka)
    .map((name) => /^metadataV(\d+)$/.exec(name)?.[1])
    .filter((v): v is string => v !== undefined)
    .map(Number)
    .sort((a, b) => a - b);
}

/**
 * Makes the loaded @platformatic/kafka module `kafka` keep partitions without a leader in its
 * Metadata answers instead of failing them, and answer a retriable error instead of throwing for a
 * leader that is not in the metadata (see the module's comment). Idempotent per module; never
 * throws.
 */
export function fixPlatformaticMetadata(kafka: PlatformaticKafka): Exclude<PlatformaticFixOutcome, 'not-found'> {
  try {
    if (unrecognised(kafka)) return 'unrecognised';
    const k = kafka as unknown as {
      Base: { prototype: Record<symbol, unknown> };
      kGetApi: symbol;
      kGetConnection: symbol;
      NetworkError: new (message: string, properties?: Record<string, unknown>) => Error;
    };
    const proto = k.Base.prototype;
    const getApi = proto[k.kGetApi] as GetApi;
    const getConnection = proto[k.kGetConnection] as GetConnection;
    if ((getApi as unknown as Record<symbol, unknown>)[FIXED]) return 'already-applied';

    const wrappers = new WeakMap<Api, Api>();
    const fixedGetApi: GetApi = function (name, callback) {
      if (name !== 'Metadata') return getApi.call(this, name, callback);
      return getApi.call(this, name, (error, api) => {
        if (error || typeof api !== 'function') {
          callback(error, api);
          return;
        }
        let wrapped = wrappers.get(api);
        if (!wrapped) wrappers.set(api, (wrapped = tolerant(api)));
        callback(null, wrapped);
      });
    };
    const fixedGetConnection: GetConnection = function (broker, callback) {
      const b = broker as { host?: unknown; port?: unknown } | null | undefined;
      if (b == null || b.host == null || b.port == null) {
        // As 2.12.1's connection pool answers itself (1.35.0's throws a TypeError instead).
        callback(new k.NetworkError(NO_BROKER_MESSAGE, { canRetry: true, hasStaleMetadata: true, broker }));
        return undefined;
      }
      return getConnection.call(this, broker, callback);
    };
    Object.defineProperty(fixedGetApi, FIXED, { value: true });
    Object.defineProperty(fixedGetConnection, FIXED, { value: true });
    proto[k.kGetApi] = fixedGetApi;
    proto[k.kGetConnection] = fixedGetConnection;
    return 'applied';
  } catch {
    return 'unrecognised';
  }
}

/**
 * Loads @platformatic/kafka (as the clients of `createPlatformaticClient()` do: the loader applies
 * this fix right after loading) and makes its Metadata answers keep partitions without a leader
 * (LEADER_NOT_AVAILABLE, REPLICA_NOT_AVAILABLE; their leader -1) instead of failing the whole
 * request; every other error still fails. Idempotent; never rejects.
 *
 * @returns `'already-applied'` once the loader applied it (so, normally), `'applied'` when this
 *   call did, `'unrecognised'` when the installed package's shapes are not the expected ones (left
 *   as it is), `'not-found'` when the package cannot be loaded (missing, unsupported version).
 */
export async function applyPlatformaticMetadataFix(): Promise<PlatformaticFixOutcome> {
  let kafka: PlatformaticKafka;
  try {
    kafka = await loadPlatformaticKafka();
  } catch {
    return 'not-found';
  }
  return fixPlatformaticMetadata(kafka);
}
