/**
 * The orders example's own tables (the "business rows"), defined with drizzle-orm. outboxkit's
 * tables come from `outboxkit migrate`; these come from the application.
 */
import { integer, pgSchema, text, timestamp, uuid } from 'drizzle-orm/pg-core';
import { sql } from 'drizzle-orm';
import type pg from 'pg';

const demo = pgSchema('orders_demo');

export const orders = demo.table('orders', {
  id: uuid('id').primaryKey(),
  tenant: text('tenant').notNull(),
  cartId: text('cart_id').notNull(),
  currency: text('currency').notNull(),
  amount: integer('amount').notNull(),
  // clock_timestamp(): the moment of the insert, close to the commit (now() is the transaction start).
  createdAt: timestamp('created_at', { withTimezone: true })
    .notNull()
    .default(sql`clock_timestamp()`),
});

export const shipments = demo.table('shipments', {
  orderId: uuid('order_id').primaryKey(),
  eventId: uuid('event_id').notNull(),
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
      created_at timestamptz NOT NULL DEFAULT clock_timestamp()
    );
    CREATE TABLE IF NOT EXISTS orders_demo.shipments (
      order_id uuid PRIMARY KEY,
      event_id uuid NOT NULL,
      created_at timestamptz NOT NULL DEFAULT clock_timestamp()
    );`);
}
