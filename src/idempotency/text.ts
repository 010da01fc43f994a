/**
 * Validation of the strings the idempotency layer stores as PostgreSQL `text` (tenant, operation),
 * before any SQL runs (docs/guarantees.md, G6). PostgreSQL text cannot hold U+0000 (SQLSTATE 22021); a lone
 * UTF-16 surrogate is silently turned into U+FFFD by the UTF-8 encoder, so two different tenants
 * would share one scope; and the primary key (tenant, operation, key) is a b-tree, whose entries
 * must stay well below a third of a page (about 2,700 bytes). The key itself is validated by
 * ./key.ts (1-255 visible ASCII).
 */
import { InvalidOptionsError } from '../errors.js';
import { TenantUnresolvedError } from './errors.js';

/** Longest tenant, in UTF-8 bytes. */
export const MAX_TENANT_BYTES = 1_024;
/** Longest operation name, in UTF-8 bytes. */
export const MAX_OPERATION_BYTES = 255;

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
const LONE_SURROGATES = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/** Why `value` cannot be stored as a scope component, or `undefined` when it can. */
export function textProblem(value: unknown, maxBytes: number): string | undefined {
  if (typeof value !== 'string') return `is not a string (${value === null ? 'null' : typeof value})`;
  if (value.length === 0) return 'is empty';
  if (value.includes('\0')) return 'contains a NUL character (U+0000), which PostgreSQL text cannot hold';
  if (LONE_SURROGATE.test(value)) return 'is not well-formed Unicode (it contains a lone UTF-16 surrogate)';
  const bytes = Buffer.byteLength(value, 'utf8');
  if (bytes > maxBytes) return `is ${bytes} bytes long in UTF-8, more than ${maxBytes}`;
  return undefined;
}

/**
 * Validates an operation name (a programming constant): non-empty, at most
 * {@link MAX_OPERATION_BYTES} UTF-8 bytes, no NUL, well-formed Unicode.
 * @throws {@link InvalidOptionsError} otherwise.
 */
export function assertValidOperation(operation: unknown, what: string): string {
  const problem = textProblem(operation, MAX_OPERATION_BYTES);
  if (problem !== undefined) {
    throw new InvalidOptionsError(
      `${what} needs a non-empty operation name of at most ${MAX_OPERATION_BYTES} UTF-8 bytes without NUL characters; the operation name ${problem}.`,
    );
  }
  return operation as string;
}

/**
 * Validates a resolved tenant: non-empty, at most {@link MAX_TENANT_BYTES} UTF-8 bytes, no NUL,
 * well-formed Unicode. A tenant that fails is refused (400 `tenant-unresolved`), never stored in a
 * shared or altered scope.
 * @throws {@link TenantUnresolvedError} otherwise.
 */
export function assertValidTenant(tenant: unknown): string {
  if (typeof tenant !== 'string' || tenant.length === 0) throw new TenantUnresolvedError();
  const problem = textProblem(tenant, MAX_TENANT_BYTES);
  if (problem !== undefined) {
    throw new TenantUnresolvedError(
      `The caller (tenant) resolved for this request is not a valid scope: it ${problem}; the request was refused and nothing was recorded.`,
    );
  }
  return tenant;
}

/**
 * Free text (a reason for an operator) made storable as PostgreSQL text: NUL characters and lone
 * surrogates become U+FFFD. Used where refusing the text would lose a more important state.
 */
export function storableText(text: string): string {
  return text.replaceAll('\0', '\uFFFD').replace(LONE_SURROGATES, '\uFFFD');
}
