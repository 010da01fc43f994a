/**
 * The orders service: `POST /orders` with `Idempotency-Key` and `X-Tenant-Id`. Claiming the key,
 * writing the order, enqueuing `order.created` and storing the response happen in ONE transaction
 * (drizzle-orm over node-postgres), so a client that timed out can always retry safely.
 *
 *   npm run example:orders        # HTTP on PORT (default 3000)
 *
 * Environment: DATABASE_URL, ORDERS_TOPIC (default `orders`), PORT, ORDERS_POOL_SIZE,
 * ORDERS_LOG_LEVEL (pino level of the logs on stderr, default `info`), ORDERS_OUTBOX_SOURCE
 * (`table`, the default, or `wal`: the outbox writer's source, for a WAL relay; docs/wal-source.md).
 *
 * Errors: a failed query's message names its SQL and values (the tenant, the body's fields), so no
 * error message ever reaches a client. The error handler logs the error and answers a generic
 * `application/problem+json` 500; outboxkit's layer does the same for the errors it catches.
 * `CHAOS_SABOTAGE` is test-only (the chaos harness's self-test, docs/chaos.md): never set it.
 */
import { randomUUID } from 'node:crypto';
import { STATUS_CODES } from 'node:http';
import { fileURLToPath } from 'node:url';
import Fastify, { type FastifyError, type FastifyInstance } from 'fastify';
import { drizzle } from 'drizzle-orm/node-postgres';
import { and, eq, sql } from 'drizzle-orm';
import pg from 'pg';
import { pino } from 'pino';
import {
  createOutbox,
  migrate,
  PROBLEM_CONTENT_TYPE,
  toProblem,
  type Logger,
  type OutboxSource,
} from '../../src/index.js';
import { idempotentHandler, registerRawJsonBody } from '../../src/http/fastify.js';
import type { HandlerResponse } from '../../src/idempotency/index.js';
import { customers, ensureDemoSchema, orders } from './db.js';

/** The body of `POST /orders`. */
interface OrderInput {
  cartId: string;
  currency: string;
  amount: number;
  /**
   * Optional. With it, `order.created` is keyed by the customer (Kafka per-key order across the
   * customer's orders) and carries `customerVersion`, the customer's order count in commit order.
   */
  customerId?: string;
}

/**
 * Carts whose id starts with this are declined after the order and its event were written: the
 * stored 402 rolls them back to the claim's savepoint (DESIGN G2), so their event must never be
 * published. The chaos harness uses it to check "nothing of a rolled-back transaction".
 */
export const DECLINED_CART_PREFIX = 'declined-';

/**
 * Test-only: with `lose-events` in `CHAOS_SABOTAGE` (set by `npm run chaos -- --sabotage`), one
 * order in ten (cart number ending in 3) has its event marked published in its own transaction,
 * so the relay never sends it: a lost event that the chaos harness must report (DESIGN G3).
 */
const loseEvents = (process.env.CHAOS_SABOTAGE ?? '').split(',').includes('lose-events');

function validOrder(body: unknown): body is OrderInput {
  const b = body as Partial<OrderInput> | null;
  return (
    typeof b === 'object' &&
    b !== null &&
    typeof b.cartId === 'string' &&
    b.cartId.length > 0 &&
    typeof b.currency === 'string' &&
    /^[A-Z]{3}$/.test(b.currency) &&
    Number.isInteger(b.amount) &&
    (b.amount as number) > 0 &&
    (b.customerId === undefined || (typeof b.customerId === 'string' && b.customerId.length > 0))
  );
}

/** Logs on stderr (stdout carries the lines the demo and the chaos harness read). */
function stderrLogger(): Logger {
  return pino({ name: 'orders', level: process.env.ORDERS_LOG_LEVEL ?? 'info' }, pino.destination(2));
}

/**
 * Builds the orders app on `pool`; events go to `topic`, written by the outbox writer of `source`
 * (`'table'` by default, `'wal'` for a WAL relay). Errors are logged through `logger` (default:
 * pino on stderr) and answered with a generic problem.
 */
export async function buildOrdersApp(
  pool: pg.Pool,
  topic: string,
  { logger = stderrLogger(), source = 'table' }: { logger?: Logger; source?: OutboxSource } = {},
): Promise<FastifyInstance> {
  const db = drizzle(pool);
  const outbox = createOutbox({ source });
  const app = Fastify({ logger: false });
  app.setErrorHandler((err: FastifyError, req, reply) => {
    const code = err.statusCode;
    const status = code !== undefined && code >= 400 && code < 500 ? code : 500;
    if (status === 500) {
      // The message of a failed query holds its SQL and parameters: for the logs only.
      logger.error({ err, method: req.method, url: req.url }, 'orders request failed');
      const problem = toProblem(err); // the generic 500: no message, no SQL, no values
      return reply
        .code(problem.status)
        .headers(problem.headers)
        .send(Buffer.from(JSON.stringify(problem.body)));
    }
    // Fastify's own client errors (415 unsupported media type, 413, ...): their status, a fixed title.
    return reply
      .code(status)
      .header('content-type', PROBLEM_CONTENT_TYPE)
      .send(Buffer.from(JSON.stringify({ type: 'about:blank', title: STATUS_CODES[status], status })));
  });
  app.get('/healthz', async () => ({ ok: true }));

  await app.register(async (scope) => {
    // The fingerprint covers the raw body bytes: keep them in this scope.
    registerRawJsonBody(scope);
    scope.post(
      '/orders',
      idempotentHandler(
        {
          db,
          operation: 'create-order',
          // The demo's tenant comes from a header; a real service takes it from authentication.
          resolveTenant: (req) => {
            const t = req.headers['x-tenant-id'];
            return typeof t === 'string' && t.length > 0 ? t : undefined;
          },
          policy: 'reject',
          logger,
        },
        async (req, tx, ctx): Promise<HandlerResponse> => {
          if (!validOrder(req.body)) {
            // A final business rejection: stored and replayed (4xx other than 408/409/425/429).
            return {
              status: 400,
              headers: { 'content-type': 'application/problem+json' },
              body: {
                type: 'about:blank',
                title: 'Invalid order',
                detail: 'cartId, currency (ISO 4217) and a positive integer amount are required.',
              },
            };
          }
          const tenant = String(req.headers['x-tenant-id']);
          const orderId = randomUUID();
          const { customerId } = req.body;
          // The upsert's row lock makes a customer's orders take their versions in commit order.
          const [customer] =
            customerId === undefined
              ? [undefined]
              : await tx
                  .insert(customers)
                  .values({ id: customerId, version: 1 })
                  .onConflictDoUpdate({ target: customers.id, set: { version: sql`${customers.version} + 1` } })
                  .returning();
          const [order] = await tx
            .insert(orders)
            .values({
              id: orderId,
              tenant,
              cartId: req.body.cartId,
              currency: req.body.currency,
              amount: req.body.amount,
              customerId,
              customerVersion: customer?.version,
            })
            .returning();
          const payload = { orderId, tenant, cartId: order!.cartId, currency: order!.currency, amount: order!.amount };
          const [event] = await outbox.enqueue(tx, {
            topic,
            key: customerId ?? orderId,
            type: 'order.created',
            aggregateType: 'order',
            aggregateId: orderId,
            payload: customer ? { ...payload, customerId, customerVersion: customer.version } : payload,
          });
          if (loseEvents && /3$/.test(req.body.cartId))
            await tx.execute(
              sql`UPDATE outboxkit.outbox_events SET published_at = now() WHERE event_id = ${event!.eventId}::uuid`,
            );
          if (req.body.cartId.startsWith(DECLINED_CART_PREFIX)) {
            // A final business rejection after writes: stored and replayed, the writes rolled back.
            return ctx.reject(
              402,
              {
                type: 'about:blank',
                title: 'Payment declined',
                detail: 'The payment for this cart was declined; nothing was ordered.',
              },
              { headers: { 'content-type': 'application/problem+json' } },
            );
          }
          return {
            status: 201,
            headers: { location: `/orders/${orderId}` },
            body: {
              orderId,
              tenant,
              cartId: order!.cartId,
              currency: order!.currency,
              amount: order!.amount,
              createdAt: order!.createdAt.toISOString(),
            },
          };
        },
      ),
    );
  });

  app.get<{ Params: { id: string } }>('/orders/:id', async (req, reply) => {
    const tenant = req.headers['x-tenant-id'];
    if (typeof tenant !== 'string' || !/^[0-9a-f-]{36}$/.test(req.params.id)) return reply.code(404).send();
    const [order] = await db
      .select()
      .from(orders)
      .where(and(eq(orders.id, req.params.id), eq(orders.tenant, tenant)));
    if (!order) return reply.code(404).send();
    return order;
  });
  return app;
}

async function main(): Promise<void> {
  const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
  const topic = process.env.ORDERS_TOPIC ?? 'orders';
  const pool = new pg.Pool({ connectionString: databaseUrl, max: Number(process.env.ORDERS_POOL_SIZE ?? 16) });
  await migrate({ connectionString: databaseUrl });
  await ensureDemoSchema(pool);
  // createOutbox() refuses another value (InvalidOptionsError).
  const source = (process.env.ORDERS_OUTBOX_SOURCE ?? 'table') as OutboxSource;
  const app = await buildOrdersApp(pool, topic, { source });
  const address = await app.listen({ host: '127.0.0.1', port: Number(process.env.PORT ?? 3000) });
  // The demo reads this line to find the port.
  console.log(`ORDERS_LISTENING ${address}`);
  const shutdown = async () => {
    await app.close();
    await pool.end();
    process.exit(0);
  };
  process.once('SIGTERM', () => void shutdown());
  process.once('SIGINT', () => void shutdown());
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((err: unknown) => {
    console.error(err);
    process.exit(1);
  });
}
