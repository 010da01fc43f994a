/**
 * How a component declares its options: once, as a zod strict object whose fields give each
 * option's type, range and default, and whose refinements give the rules between options; the
 * resolved type is the schema's output. {@link parseOptions} checks the names first (an unknown
 * name is refused with the list of known ones, as {@link refuseUnknownOptions} words it), then the
 * values, and throws {@link InvalidOptionsError} with a message that names the option, the values
 * it accepts and the value given.
 *
 * The fields several components share (`schema`, `logger`, retry delays) are declared here once.
 */
import { z } from 'zod';
import { InvalidOptionsError, refuseUnknownOptions } from './errors.js';
import { DEFAULT_SCHEMA } from './constants.js';
import { noopLogger, type Logger } from './logger.js';
import { quoteSchema } from './schema-name.js';

/** An integer option from `min` to `max` (inclusive; no upper bound without `max`). */
export function integer(min: number, max?: number) {
  const error = `must be an integer ${max === undefined ? `≥ ${min}` : `from ${min} to ${max}`}`;
  const int = z.number({ error }).int({ error }).min(min, { error });
  return max === undefined ? int : int.max(max, { error });
}

/** A boolean option. */
export function boolean() {
  return z.boolean({ error: 'must be true or false' });
}

/** A function option (`signature` shown in the message, for example `(topic) => name`). */
export function fn<F extends (...args: never[]) => unknown>(signature: string) {
  return z.custom<F>((v) => typeof v === 'function', { error: `must be a function ${signature}` });
}

/** Any value of type `T`, checked by `check` (`expected` shown in the message). */
export function value<T>(expected: string, check: (v: unknown) => boolean = () => true) {
  return z.custom<T>(check, { error: `must be ${expected}` });
}

function isLogger(v: unknown): boolean {
  return (
    typeof v === 'object' &&
    v !== null &&
    ['debug', 'info', 'warn', 'error'].every((level) => typeof (v as Record<string, unknown>)[level] === 'function')
  );
}

/** The fields several components share, each declared once. */
export const SHARED_OPTIONS = {
  /** Schema holding outboxkit's tables: a lower-case SQL identifier. @defaultValue 'outboxkit' */
  schema: z
    .string({ error: 'must be a string' })
    .superRefine((name, ctx) => {
      try {
        quoteSchema(name);
      } catch (err) {
        ctx.addIssue(sentence((err as Error).message));
      }
    })
    .default(DEFAULT_SCHEMA),
  /** Logger with pino's `debug`/`info`/`warn`/`error` methods. @defaultValue a no-op logger */
  logger: z
    .custom<Logger>(isLogger, { error: 'must have debug, info, warn and error methods (a pino logger fits)' })
    .default(noopLogger),
};

/**
 * The retry delays of a component: the first delay and the cap of a full-jitter exponential
 * backoff, in ms, with the component's defaults. The rule between them (the cap not below the
 * first delay) is {@link retryDelaysInOrder}.
 */
export function retryDelays(defaults: { initialMs: number; maxMs: number }, min = 0) {
  return {
    retryInitialMs: integer(min).default(defaults.initialMs),
    retryMaxMs: integer(min).default(defaults.maxMs),
  };
}

/** The rule of {@link retryDelays}: `retryMaxMs` is not below `retryInitialMs`. */
export function retryDelaysInOrder(o: { retryInitialMs: number; retryMaxMs: number }, ctx: z.RefinementCtx): void {
  if (o.retryMaxMs < o.retryInitialMs) {
    ctx.addIssue(sentence(`retryMaxMs (${o.retryMaxMs}) must be at least retryInitialMs (${o.retryInitialMs}).`));
  }
}

/**
 * An issue whose message is a whole sentence (a rule between options, or another validator's
 * message): {@link parseOptions} shows it as it is, without the option's name and value.
 */
export function sentence(message: string): z.core.$ZodRawIssue {
  return { code: 'custom', message, input: undefined, params: { sentence: true } };
}

/**
 * Validates `input` against a component's options schema once and returns the resolved options.
 * An issue of one option reads `<what>: <option> <rule>, got <value>.`; a {@link sentence} reads
 * `<what>: <sentence>`.
 *
 * @param what - the component's entry point, for messages (`createRelay`).
 * @throws {@link InvalidOptionsError} when `input` is not an object, on unknown option names
 *   (all named, the known ones listed), else on the first invalid option.
 */
export function parseOptions<S extends z.ZodObject>(schema: S, input: unknown, what: string): z.output<S> {
  if (typeof input !== 'object' || input === null) throw new InvalidOptionsError(`${what}: options must be an object.`);
  refuseUnknownOptions(input, Object.keys(schema.shape), what);
  const result = schema.safeParse(input);
  if (result.success) return result.data;
  const issue = result.error.issues[0]!;
  if (issue.code === 'unrecognized_keys') {
    // In a nested object (an option whose value is an object of options): worded as at the top.
    const nested = objectAt(schema, issue.path);
    const given = valueAt(input, issue.path);
    if (nested && typeof given === 'object' && given !== null) {
      refuseUnknownOptions(given, Object.keys(nested.shape), `${what} ${issue.path.join('.')}`);
    }
  }
  if (issue.code === 'custom' && issue.params?.sentence === true)
    throw new InvalidOptionsError(`${what}: ${issue.message}`);
  throw new InvalidOptionsError(
    `${what}: ${issue.path.join('.')} ${issue.message}, got ${describe(valueAt(input, issue.path))}.`,
  );
}

function valueAt(input: unknown, path: readonly PropertyKey[]): unknown {
  return path.reduce<unknown>((v, key) => (v as Record<PropertyKey, unknown> | undefined)?.[key], input);
}

/** The object schema at `path` of `schema` (through optional and default wrappers), if any. */
function objectAt(schema: z.ZodObject, path: readonly PropertyKey[]): z.ZodObject | undefined {
  let current: z.ZodType = schema;
  for (const key of path) {
    const unwrapped = unwrap(current);
    if (!(unwrapped instanceof z.ZodObject)) return undefined;
    current = (unwrapped.shape as Record<PropertyKey, z.ZodType>)[key]!;
    if (current === undefined) return undefined;
  }
  const last = unwrap(current);
  return last instanceof z.ZodObject ? last : undefined;
}

function unwrap(t: z.ZodType): z.ZodType {
  let current = t;
  while (current instanceof z.ZodOptional || current instanceof z.ZodDefault) current = current.unwrap() as z.ZodType;
  return current;
}

function describe(v: unknown): string {
  if (typeof v === 'function') return 'a function';
  if (typeof v === 'bigint') return `${v}n`;
  try {
    const json = JSON.stringify(v);
    return json === undefined ? String(v) : json.length > 80 ? `${json.slice(0, 77)}...` : json;
  } catch {
    return Object.prototype.toString.call(v);
  }
}
