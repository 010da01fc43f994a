/**
 * The logger interface outboxkit components accept: the subset of pino's API they call, so a pino
 * logger (or a child of one) fits as is. The library logs nothing by default; the CLI uses pino.
 * outboxkit never logs payloads or full idempotency keys.
 */
export interface Logger {
  debug(obj: Record<string, unknown>, msg: string): void;
  info(obj: Record<string, unknown>, msg: string): void;
  warn(obj: Record<string, unknown>, msg: string): void;
  error(obj: Record<string, unknown>, msg: string): void;
}

/** A logger that drops everything: the default of every component. */
export const noopLogger: Logger = {
  debug() {},
  info() {},
  warn() {},
  error() {},
};
