/**
 * JSON text without silent loss: `JSON.stringify` turns some values into others without an error
 * (NaN into null, a Map into {}), and a consumer or a server would then read another value than
 * the one sent. Shared by the outbox writer (event payloads) and the idempotent HTTP client
 * (request bodies). Pure logic, no dependencies.
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
