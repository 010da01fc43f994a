/**
 * Node.js socket and DNS error codes (`err.code`) by which no connection to an address could be
 * made: nothing listens (ECONNREFUSED), the host name does not resolve (ENOTFOUND, EAI_AGAIN), no
 * answer or no route (ETIMEDOUT, EHOSTUNREACH, ENETUNREACH). Shared by the Kafka adapters
 * (src/kafka/unreachable.ts) and the CLI's hints for PostgreSQL (cli/main.ts).
 */
export const UNREACHABLE_SOCKET_CODES: ReadonlySet<string> = new Set([
  'ECONNREFUSED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
]);
