/**
 * JSON text without silent loss: `JSON.stringify` turns some values into others without an error
 * (NaN into null, a Map into {}), and a consumer or a server would then read another value than
 * the one sent. Shared by the outbox writer (event payloads) and the idempotent HTTP client
 * (request bodies). And JSON text from outside, checked before it is parsed. Pure logic, no
 * dependencies.
 */

/**
 * What JSON.stringify would turn into something else without an error, named for a message, or
 * undefined when the value is kept: NaN and ±Infinity (null), an invalid Date (null), a Map or a
 * Set ({}), an ArrayBuffer ({}), and a typed array other than a Buffer (an object of its
 * elements). A Buffer is kept: its toJSON writes `{"type":"Buffer","data":[...]}`.
 */
export function lossyInJson(value: unknown): string | undefined {
  if (typeof value === 'number' && !Number.isFinite(value)) return String(value);
  if (value instanceof Date && Number.isNaN(value.getTime())) return 'an invalid Date';
  if (value instanceof Map) return 'a Map';
  if (value instanceof Set) return 'a Set';
  if (value instanceof ArrayBuffer || (ArrayBuffer.isView(value) && !Buffer.isBuffer(value))) {
    return `a binary ${value.constructor.name}`;
  }
  return undefined;
}

/**
 * `JSON.stringify(value)` in one pass that checks every value as given (before its toJSON), at
 * any depth, with {@link lossyInJson}.
 *
 * @param refuse - builds the error to throw for a lossy value: what it is, and its key (`''` at
 *   the top).
 * @returns the JSON text, or undefined when `value` has no JSON form (undefined, a function).
 * @throws what `refuse` returns for a lossy value; a TypeError for a cycle or a BigInt (from
 *   JSON.stringify).
 */
export function stringifyWithoutLoss(value: unknown, refuse: (what: string, key: string) => Error): string | undefined {
  return JSON.stringify(value, function (this: Record<string, unknown>, key: string, v: unknown) {
    const lossy = lossyInJson(this[key]);
    if (lossy !== undefined) throw refuse(lossy, key);
    return v;
  });
}

/** How a caller of {@link jsonText} words its errors. */
export interface JsonTextWording {
  /** What the value is, as a message's subject: `The request body`. */
  subject: string;
  /** Said after "<subject> is NaN, which JSON.stringify would not keep": what to send instead. */
  lossyFix: string;
  /** Said after "<subject> cannot be serialised to JSON (<reason>)": what to send instead. */
  failedFix: string;
  /** The whole message when the value has no JSON form (undefined, a function). */
  absent: string;
}

/**
 * `value` as JSON text ({@link stringifyWithoutLoss}), or the error that `refuse` makes of a
 * message worded by `wording` (with the TypeError of a cycle or a BigInt as its cause): for a
 * lossy value, at any depth, for a value JSON.stringify fails on, and for one it has no form for.
 */
export function jsonText(
  value: unknown,
  wording: JsonTextWording,
  refuse: (message: string, cause?: unknown) => Error,
): string {
  let refused: Error | undefined;
  let text: string | undefined;
  try {
    text = stringifyWithoutLoss(value, (lossy, key) => {
      const where = key === '' ? 'is' : `holds at key ${JSON.stringify(key)}`;
      refused = refuse(`${wording.subject} ${where} ${lossy}, which JSON.stringify would not keep${wording.lossyFix}`);
      return refused;
    });
  } catch (err) {
    if (err === refused) throw err;
    throw refuse(
      `${wording.subject} cannot be serialised to JSON (${(err as Error).message})${wording.failedFix}`,
      err,
    );
  }
  if (text === undefined) throw refuse(wording.absent);
  return text;
}

/**
 * Deepest nesting of arrays and objects accepted in JSON from outside (an idempotent request's
 * body, a consumed event's value): 1,000 levels, the default of Jackson's `StreamReadConstraints`.
 */
export const MAX_JSON_DEPTH = 1_000;

/**
 * Whether JSON text nests arrays and objects more than `maxDepth` levels deep: one linear pass over
 * the text, strings skipped, for any text (valid JSON or not). Parsing deep nesting costs more than
 * its length (V8's JSON.parse) and recursion over the parsed value overflows the stack, so text
 * from outside is checked before it is parsed (docs/security.md).
 */
export function exceedsJsonDepth(text: string, maxDepth: number): boolean {
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22 /* " */) {
      for (i++; i < text.length; i++) {
        const d = text.charCodeAt(i);
        if (d === 0x5c /* \ */) i++;
        else if (d === 0x22) break;
      }
    } else if (c === 0x5b /* [ */ || c === 0x7b /* { */) {
      if (++depth > maxDepth) return true;
    } else if (c === 0x5d /* ] */ || c === 0x7d /* } */) {
      depth--;
    }
  }
  return false;
}
