import { describe, expect, it } from 'vitest';
import { rewriteSchema } from '../../src/migrate.js';
import { quoteSchema } from '../../src/schema-name.js';
import { isOutboxkitError } from '../../src/errors.js';

describe('rewriteSchema', () => {
  it('moves every generated identifier to the configured schema and tolerates an existing schema', () => {
    const generated =
      'CREATE SCHEMA "outboxkit";\nCREATE TABLE "outboxkit"."t" (x int CHECK ("outboxkit"."t"."x" > 0));';
    expect(rewriteSchema(generated, '"billing"')).toBe(
      'CREATE SCHEMA IF NOT EXISTS "billing";\nCREATE TABLE "billing"."t" (x int CHECK ("billing"."t"."x" > 0));',
    );
  });
});

describe('quoteSchema', () => {
  it('accepts plain identifiers and refuses anything that would need escaping', () => {
    expect(quoteSchema('outboxkit')).toBe('"outboxkit"');
    expect(quoteSchema('a_1')).toBe('"a_1"');
    expect(quoteSchema('a'.repeat(40))).toBe(`"${'a'.repeat(40)}"`);
    for (const bad of ['', '1a', 'A', 'a-b', 'a"b', 'a'.repeat(41), 'a; DROP']) {
      let err: unknown;
      try {
        quoteSchema(bad);
      } catch (e) {
        err = e;
      }
      expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS'), bad).toBe(true);
    }
  });
});
