/**
 * The client-side ledger of a chaos run: every logical request (tenant, key, body) and every HTTP
 * attempt's answer (status and body bytes, or none), recorded below the idempotent client by a
 * wrapped `fetch`, so that retries, timeouts and concurrent duplicates are all seen.
 */
import type { Attempt, Operation } from './check.js';

const utf8 = new TextDecoder();

function bodyText(body: unknown): string {
  if (typeof body === 'string') return body;
  if (body instanceof Uint8Array) return utf8.decode(body);
  if (body instanceof ArrayBuffer) return utf8.decode(new Uint8Array(body));
  return String(body);
}

export class Ledger {
  private readonly operations = new Map<string, Operation>();
  /** Attempts whose (tenant, key) the harness never registered (a bug of the harness). */
  unknownAttempts = 0;

  /** Registers a logical request before its first attempt. */
  register(op: Omit<Operation, 'attempts'>): Operation {
    const full: Operation = { ...op, attempts: [] };
    this.operations.set(`${op.tenant}\n${op.key}`, full);
    return full;
  }

  /** Records one attempt of (tenant, key) with `body`: the original body, or a reuse with another. */
  record(tenant: string, key: string, body: string, attempt: Attempt): void {
    const op = this.operations.get(`${tenant}\n${key}`);
    if (!op) {
      this.unknownAttempts++;
      return;
    }
    if (body === op.body) op.attempts.push(attempt);
    else (op.reuse ??= { body, attempts: [] }).attempts.push(attempt);
  }

  all(): Operation[] {
    return [...this.operations.values()];
  }

  /**
   * A `fetch` that records every attempt in this ledger and hands the idempotent client a response
   * rebuilt from the bytes it read (so that the body is read once).
   */
  fetch(): typeof fetch {
    return async (input, init) => {
      const headers = new Headers(init?.headers);
      const tenant = headers.get('x-tenant-id') ?? '';
      const key = headers.get('idempotency-key') ?? '';
      const body = bodyText(init?.body);
      let res: Response;
      let bytes: Uint8Array;
      try {
        res = await fetch(input, init);
        bytes = new Uint8Array(await res.arrayBuffer());
      } catch (err) {
        this.record(tenant, key, body, { status: undefined, replayed: false, body: '' });
        throw err;
      }
      this.record(tenant, key, body, {
        status: res.status,
        replayed: res.headers.get('idempotent-replayed') === 'true',
        body: utf8.decode(bytes),
      });
      return new Response(bytes.length > 0 ? bytes : null, {
        status: res.status,
        statusText: res.statusText,
        headers: res.headers,
      });
    };
  }
}
