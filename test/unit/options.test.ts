/**
 * src/options.ts: a component's options declared once as a zod strict object, and the messages
 * parseOptions() gives: unknown names first (the known ones listed, nested objects too), then the
 * first invalid value with the option's name, the values it accepts and the value given, or a
 * rule between options as a sentence.
 */
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { isOutboxkitError } from '../../src/errors.js';
import { boolean, integer, parseOptions, retryDelays, retryDelaysInOrder, SHARED_OPTIONS } from '../../src/options.js';
import { noopLogger } from '../../src/logger.js';

const schema = z
  .strictObject({
    schema: SHARED_OPTIONS.schema,
    logger: SHARED_OPTIONS.logger,
    size: integer(1, 10).default(5),
    enabled: boolean().default(true),
    nested: z.strictObject({ a: z.number().optional(), b: z.number().optional() }).optional(),
    ...retryDelays({ initialMs: 100, maxMs: 1_000 }),
  })
  .superRefine(retryDelaysInOrder);

function message(input: unknown): string {
  try {
    parseOptions(schema, input, 'createThing');
  } catch (err) {
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
    return (err as Error).message;
  }
  return '';
}

describe('parseOptions', () => {
  it('applies the defaults and gives the resolved values', () => {
    expect(parseOptions(schema, {}, 'createThing')).toEqual({
      schema: 'outboxkit',
      logger: noopLogger,
      size: 5,
      enabled: true,
      retryInitialMs: 100,
      retryMaxMs: 1_000,
    });
    expect(parseOptions(schema, { size: undefined, schema: 'mine' }, 'createThing')).toMatchObject({
      size: 5,
      schema: 'mine',
    });
  });

  it('names unknown options before looking at values, nested ones too', () => {
    expect(message({ sise: 3, size: 'x' })).toBe(
      'createThing: unknown option "sise"; the options are schema, logger, size, enabled, nested, retryInitialMs, retryMaxMs.',
    );
    expect(message({ nested: { a: 1, c: 2 } })).toBe('createThing nested: unknown option "c"; the options are a, b.');
  });

  it('names the option, what it accepts and what it got', () => {
    expect(message({ size: 11 })).toBe('createThing: size must be an integer from 1 to 10, got 11.');
    expect(message({ size: 1.5 })).toBe('createThing: size must be an integer from 1 to 10, got 1.5.');
    expect(message({ enabled: 'yes' })).toBe('createThing: enabled must be true or false, got "yes".');
    expect(message({ retryInitialMs: -1 })).toBe('createThing: retryInitialMs must be an integer ≥ 0, got -1.');
    expect(message({ logger: console.log })).toMatch(
      /logger must have debug, info, warn and error methods .* got a function\.$/,
    );
  });

  it('shows another validator message, and a rule between options, as a sentence', () => {
    expect(message({ schema: 'Bad-Name' })).toMatch(/^createThing: Invalid schema name "Bad-Name": use 1-40/);
    expect(message({ retryInitialMs: 500, retryMaxMs: 200 })).toBe(
      'createThing: retryMaxMs (200) must be at least retryInitialMs (500).',
    );
  });

  it('refuses what is not an options object', () => {
    expect(message(null)).toBe('createThing: options must be an object.');
  });
});
