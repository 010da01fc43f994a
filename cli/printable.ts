/**
 * Text output of the CLI that a terminal shows and never obeys: every command prints through
 * these functions, so text from outside (dead letters' headers, parked events, idempotency
 * tenants and operations, error messages) cannot send escape sequences to the operator's terminal
 * or forge lines of output. No dependencies: cli/main.ts loads it for every command.
 */

/**
 * Characters a terminal may act on instead of showing them: the C0 and C1 controls and DEL
 * (Unicode category Cc; ESC starts the ANSI sequences that recolour, move the cursor, clear the
 * screen or set the window title, and U+009B is a CSI of its own), the bidirectional formatting
 * characters, which reorder the text after them (U+061C, U+200E, U+200F, U+202A-U+202E,
 * U+2066-U+2069; CVE-2021-42574, "Trojan Source"), and the line and paragraph separators.
 */
const UNPRINTABLE = /[\p{Cc}\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]/gu;
/** {@link UNPRINTABLE} but the C0 controls: JSON text has them only as its own line breaks. */
const UNPRINTABLE_IN_JSON = /[\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]/g;

const NAMED_ESCAPES: Record<string, string> = { '\n': '\\n', '\r': '\\r', '\t': '\\t' };

function hex(c: string, digits: number): string {
  return c.codePointAt(0)!.toString(16).padStart(digits, '0');
}

/**
 * `text` with every character a terminal could act on shown as an escape (`\n`, `\r`, `\t`,
 * `\x1b`, `\u009b`, `\u202e`...), so that text from outside (a dead letter's reason or
 * headers, a parked event's type or error, a tenant, an error message) can neither drive the
 * operator's terminal nor forge a line of output. Other characters, backslashes included, are
 * kept as they are.
 */
export function printable(text: string): string {
  return text.replace(
    UNPRINTABLE,
    (c) => NAMED_ESCAPES[c] ?? (c.charCodeAt(0) <= 0xff ? `\\x${hex(c, 2)}` : `\\u${hex(c, 4)}`),
  );
}

/** Each line of `text` through {@link printable}, its line breaks kept (commander's usage text). */
export function printableLines(text: string): string {
  return text.split('\n').map(printable).join('\n');
}

/**
 * JSON text with the characters of {@link printable} that `JSON.stringify` leaves as they are
 * (DEL, C1 controls, bidirectional formatting, U+2028, U+2029) written as `\uXXXX` escapes: the
 * same JSON value, safe on a terminal. They can only occur inside strings, where the escape is
 * valid JSON. (JSON.stringify escapes the C0 controls itself.)
 */
export function printableJson(json: string): string {
  return json.replace(UNPRINTABLE_IN_JSON, (c) => `\\u${hex(c, 4)}`);
}

/** Prints lines of text on stdout, each through {@link printable}. */
export function printLines(...lines: string[]): void {
  for (const line of lines) console.log(printable(line));
}

/** Prints a line on stderr through {@link printable}. */
export function printError(line: string): void {
  console.error(printable(line));
}

/** Prints `value` as JSON on stdout (indented by `indent` spaces), through {@link printableJson}. */
export function printJson(value: unknown, indent?: number): void {
  console.log(printableJson(JSON.stringify(value, null, indent)));
}
