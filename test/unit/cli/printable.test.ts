/**
 * cli/printable.ts: what the CLI prints shows control characters, DEL, C1 controls and
 * bidirectional formatting as visible escapes; JSON stays the same JSON value.
 */
import { describe, expect, it } from 'vitest';
import { printable, printableJson, printableLines } from '../../../cli/printable.js';

describe('printable', () => {
  it('escapes C0, DEL, C1, bidi overrides and line separators; keeps other text as it is', () => {
    expect(printable('a\u001b[31mb\u0007c\u007fd\u009be\u202ef\u2066g\u2028h\ni\tj\rk\u0000')).toBe(
      'a\\x1b[31mb\\x07c\\x7fd\\x9be\\u202ef\\u2066g\\u2028h\\ni\\tj\\rk\\x00',
    );
    expect(printable('é ü 日本 🙂 C:\\path "quoted"')).toBe('é ü 日本 🙂 C:\\path "quoted"');
    expect(printableLines('one\u001b[2J\ntwo')).toBe('one\\x1b[2J\ntwo');
  });

  it('keeps JSON valid and equal, with nothing a terminal would act on', () => {
    const value = { reason: 'x\u001b[2J\u009b1m\u202e\u2029\u007f', n: 1, nested: ['\n'] };
    const text = printableJson(JSON.stringify(value, null, 2));
    expect(text).not.toMatch(/[\u007f-\u009f\u202a-\u202e\u2029]/);
    expect(text).toContain('\n  "n": 1');
    expect(JSON.parse(text)).toEqual(value);
  });
});
