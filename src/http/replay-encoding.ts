/**
 * What a replay is sent as, for the `Accept-Encoding` of the retry that asked for it. The stored
 * response is the representation the handler chose the first time, content coding included; a
 * retry may come from another client, or through another proxy, that accepts other codings.
 *
 * The rule (RFC 9110 §12.5.3; docs/http-contract.md, "Replayed representation"):
 * 1. a stored response without content coding, a retry without `Accept-Encoding` (no preference),
 *    or one that accepts every stored coding: the stored response as is, byte for byte;
 * 2. else, when identity is acceptable and outboxkit can decode every stored coding (gzip,
 *    x-gzip, deflate, br, with Node.js zlib): the decoded bytes, the same content, without
 *    `content-encoding` — the server "SHOULD send a response without any content coding" (§12.5.3);
 * 3. else: {@link ReplayNotAcceptableError} (406 `replay-not-acceptable`, §15.5.7), the record
 *    untouched.
 */
import { promisify } from 'node:util';
import zlib from 'node:zlib';
import { ReplayNotAcceptableError } from '../idempotency/errors.js';
import type { IdempotentResponse } from '../idempotency/state-machine.js';

/**
 * Content codings a replay can be decoded from, with Node.js zlib (RFC 9110 §8.4.1; `x-gzip` is
 * read as `gzip`, §8.4.1.3).
 */
export const DECODABLE_CODINGS: ReadonlySet<string> = new Set(['gzip', 'x-gzip', 'deflate', 'br']);

/**
 * Headers that describe the coded bytes rather than the content, dropped from a decoded replay: a
 * strong ETag (RFC 9110 §8.8.3: "a strong entity tag for a content-encoded representation has to
 * be distinct from the entity tag of an unencoded representation"; a weak one is kept) and the
 * digests of the bytes sent (RFC 9530 `content-digest`, `repr-digest`; the obsolete `digest` and
 * `content-md5`), when `replayHeaders` kept them.
 */
const CODED_BYTES_HEADERS = ['content-digest', 'repr-digest', 'digest', 'content-md5'] as const;

/** What a replay is sent as (see the module's rule). */
export type ReplayEncodingDecision =
  | { kind: 'as-stored' }
  | { kind: 'decode'; codings: readonly string[] }
  | { kind: 'not-acceptable'; codings: readonly string[]; reason: 'identity-refused' | 'undecodable' };

/**
 * The content codings of a `content-encoding` value, in the order they were applied, lower-cased,
 * `x-gzip` read as `gzip`, `identity` left out.
 */
export function contentCodings(contentEncoding: string | undefined): string[] {
  if (contentEncoding === undefined) return [];
  return contentEncoding
    .split(',')
    .map((c) => normaliseCoding(c.trim()))
    .filter((c) => c !== '' && c !== 'identity');
}

function normaliseCoding(coding: string): string {
  const lower = coding.toLowerCase();
  return lower === 'x-gzip' ? 'gzip' : lower;
}

// weight = OWS ";" OWS "q=" qvalue; qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )
const QVALUE = /^(?:0(?:\.\d{0,3})?|1(?:\.0{0,3})?)$/;

/**
 * The weights an `Accept-Encoding` field gives (RFC 9110 §12.5.3, §12.4.2): coding → qvalue, `*`
 * included, lower-cased, `x-gzip` read as `gzip`. A member with a malformed weight is ignored; a
 * coding listed twice keeps its first weight. Repeated fields count as one list (§5.3).
 */
export function acceptEncodingWeights(field: string | readonly string[]): Map<string, number> {
  const weights = new Map<string, number>();
  const value = typeof field === 'string' ? field : field.join(',');
  for (const member of value.split(',')) {
    const [name = '', ...params] = member.split(';');
    const coding = normaliseCoding(name.trim());
    if (coding === '' || weights.has(coding)) continue;
    let q: number | undefined = 1;
    for (const param of params) {
      const eq = param.indexOf('=');
      if (eq < 0 || param.slice(0, eq).trim().toLowerCase() !== 'q') continue;
      const text = param.slice(eq + 1).trim();
      q = QVALUE.test(text) ? Number(text) : undefined;
    }
    if (q !== undefined) weights.set(coding, q);
  }
  return weights;
}

/**
 * Whether `coding` is acceptable under `weights` (RFC 9110 §12.5.3): a coding listed with a
 * weight above 0, or not listed while `*` is; `identity` also when neither it nor `*` is listed
 * (refused only by `identity;q=0`, or `*;q=0` without an `identity` member).
 */
export function isAcceptable(weights: ReadonlyMap<string, number>, coding: string): boolean {
  const q = weights.get(coding) ?? weights.get('*');
  if (q === undefined) return coding === 'identity';
  return q > 0;
}

/**
 * Decides what a replay whose stored `content-encoding` is `contentEncoding` is sent as, for a
 * retry whose `Accept-Encoding` is `acceptEncoding` (`undefined`: the retry sent none). Pure.
 * @param partial - whether the stored response is a range (a `content-range` header): a range of
 *   coded bytes cannot be decoded on its own.
 */
export function decideReplayEncoding(
  contentEncoding: string | undefined,
  acceptEncoding: string | readonly string[] | undefined,
  partial = false,
): ReplayEncodingDecision {
  const codings = contentCodings(contentEncoding);
  if (codings.length === 0 || acceptEncoding === undefined) return { kind: 'as-stored' };
  const weights = acceptEncodingWeights(acceptEncoding);
  if (codings.every((c) => isAcceptable(weights, c))) return { kind: 'as-stored' };
  if (!isAcceptable(weights, 'identity')) return { kind: 'not-acceptable', codings, reason: 'identity-refused' };
  if (partial || !codings.every((c) => DECODABLE_CODINGS.has(c))) {
    return { kind: 'not-acceptable', codings, reason: 'undecodable' };
  }
  return { kind: 'decode', codings };
}

const inflaters: Readonly<Record<string, (bytes: Buffer) => Promise<Buffer>>> = {
  gzip: promisify(zlib.gunzip),
  br: promisify(zlib.brotliDecompress),
  deflate: inflate,
};

/**
 * HTTP's `deflate` is the zlib format (RFC 9110 §8.4.1.2); some servers sent raw deflate
 * instead, which clients accept too, and so does this.
 */
async function inflate(bytes: Buffer): Promise<Buffer> {
  try {
    return await promisify(zlib.inflate)(bytes);
  } catch (err) {
    return promisify(zlib.inflateRaw)(bytes).catch(() => Promise.reject(err as Error));
  }
}

/**
 * A stored response (`idempotent-replayed: true`) as it is sent to a retry whose
 * `Accept-Encoding` is `acceptEncoding` (`undefined` when absent), by the rule of this module:
 * as stored; or decoded, without `content-encoding`, without a strong `etag` and the digests of the
 * coded bytes, and with `accept-encoding` added to `vary` (the answer now depends on it, RFC 9110
 * §12.5.5); or refused. Decoding runs on the zlib thread pool, not the event loop.
 *
 * @throws {@link ReplayNotAcceptableError} (406) when the retry refuses the stored coding and
 *   identity, or refuses the stored coding and outboxkit cannot decode it.
 * @throws Error when the stored bytes do not decode as their `content-encoding` says (the handler
 *   stored a mislabelled body): the adapters log it and answer 500 `internal`.
 */
export async function negotiateReplayEncoding(
  response: IdempotentResponse,
  acceptEncoding: string | readonly string[] | undefined,
): Promise<IdempotentResponse> {
  const decision = decideReplayEncoding(
    response.headers['content-encoding'],
    acceptEncoding,
    response.headers['content-range'] !== undefined,
  );
  if (decision.kind === 'as-stored') return response;
  if (decision.kind === 'not-acceptable') {
    const stored = decision.codings.join(', ');
    throw new ReplayNotAcceptableError(
      decision.codings,
      decision.reason === 'identity-refused'
        ? `The stored response of this idempotency key is encoded with ${stored}; this request's Accept-Encoding refuses it and refuses identity too. Retry with an Accept-Encoding that accepts ${stored} or identity.`
        : `The stored response of this idempotency key is encoded with ${stored}, which this request's Accept-Encoding refuses and which cannot be decoded for it${response.headers['content-range'] === undefined ? '' : ' (a range of coded bytes)'}. Retry with an Accept-Encoding that accepts ${stored}.`,
    );
  }
  let body = response.body;
  for (const coding of [...decision.codings].reverse()) {
    try {
      body = await inflaters[coding]!(body);
    } catch (err) {
      throw new Error(
        `The stored response is labelled content-encoding ${decision.codings.join(', ')} but does not decode as ${coding}.`,
        { cause: err },
      );
    }
  }
  const headers: Record<string, string> = { ...response.headers };
  delete headers['content-encoding'];
  for (const name of CODED_BYTES_HEADERS) delete headers[name];
  if (headers.etag !== undefined && !headers.etag.startsWith('W/')) delete headers.etag;
  headers.vary = withAcceptEncoding(headers.vary);
  return { status: response.status, headers, body };
}

/** A `vary` value that names `accept-encoding` (unchanged when it already does, or is `*`). */
function withAcceptEncoding(vary: string | undefined): string {
  if (vary === undefined || vary.trim() === '') return 'accept-encoding';
  const names = vary.split(',').map((n) => n.trim().toLowerCase());
  return names.includes('*') || names.includes('accept-encoding') ? vary : `${vary}, accept-encoding`;
}
