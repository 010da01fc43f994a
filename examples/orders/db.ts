/**
 * The orders example's own tables (the "business rows"), defined with drizzle-orm. outboxkit's
 * tables come from `outboxkit migrate`; these come from the application.
 */
import { bigint, integer, pgSchema, text, timestamp, uuid } from 'drizzle-orm/pg-core';
import { sql } from 'drizzle-orm';
import type pg from 'pg';

const demo = pgSchema('orders_demo');

export const orders = demo.table('orders', {
  id: uuid('id').primaryKey(),
  tenant: text('tenant').notNull(),
  cartId: text('cart_id').notNull(),
  currency: text('currency').notNull(),
  amount: integer('amount').notNull(),
  /** Optional: orders of one customer are published in commit order under the customer's key. */
  customerId: text('customer_id'),
  /** The customer's order count after this order: 1, 2, 3... in commit order (row lock on `customers`). */
  customerVersion: integer('customer_version'),
  // clock_timestamp(): the moment of the insert, close to the commit (now() is the transaction start).
  createdAt: timestamp('created_at', { withTimezone: true })
    .notNull()
    .default(sql`clock_timestamp()`),
});

/** One row per customer that placed an order; `version` counts its committed orders. */
export const customers = demo.table('customers', {
  id: text('id').primaryKey(),
  version: integer('version').notNull(),
});

export const shipments = demo.table('shipments', {
  orderId: uuid('order_id').primaryKey(),
  eventId: uuid('event_id').notNull(),
  customerId: text('customer_id'),
  customerVersion: integer('customer_version'),
  /** How many times the effect ran: the dedup consumer keeps it at 1 (the chaos harness checks it). */
  applications: integer('applications').notNull().default(1),
  /** Order in which the consumer applied its effects (per-key order at the consumer). */
  appliedSeq: bigint('applied_seq', { mode: 'number' }).generatedAlwaysAsIdentity(),
  createdAt: timestamp('created_at', { withTimezone: true })
    .notNull()
    .default(sql`clock_timestamp()`),
});

/** Creates the example's tables if they are missing (an application would use its own migrations). */
export async function ensureDemoSchema(pool: pg.Pool): Promise<void> {
  await pool.query(`
    CREATE SCHEMA IF NOT EXISTS orders_demo;
    CREATE TABLE IF NOT EXISTS orders_demo.orders (
      id uuid PRIMARY KEY,
      tenant text NOT NULL,
      cart_id text NOT NULL,
      currency text NOT NULL,
      amount integer NOT NULL,
      customer_id text,
      customer_version integer,
      created_at timestamptz NOT NULL DEFAULT clock_timestamp()
    );
    CREATE TABLE IF NOT EXISTS orders_demo.customers (
      id text PRIMARY KEY,
      version integer NOT NULL
    );
    CREATE TABLE IF NOT EXISTS orders_demo.shipments (
      order_id uuid PRIMARY KEY,
      event_id uuid NOT NULL,
      customer_id text,
      customer_version integer,
      applications integer NOT NULL DEFAULT 1,
      applied_seq bigint GENERATED ALWAYS AS IDENTITY,
      created_at timestamptz NOT NULL DEFAULT clock_timestamp()
    );`);
}
