/**
 * Database roles a test makes for itself (the test servers use trust authentication: a role logs
 * in by its name alone). PostgreSQL keeps roles per cluster, not per database, so the test drops
 * them after it, once the databases holding their grants are dropped.
 */
import pg from 'pg';

/** `url` with the user name `role`. */
export function asRole(url: string, role: string): string {
  const u = new URL(url);
  u.username = role;
  return u.toString();
}

/**
 * Drops `roles` (if they exist) on the server of `url`, a connection string. Drop the databases
 * where they hold grants first: a role that still owns or may use something cannot be dropped.
 */
export async function dropRoles(url: string, roles: readonly string[]): Promise<void> {
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  try {
    for (const role of roles) await admin.query(`DROP ROLE IF EXISTS ${role}`);
  } finally {
    await admin.end();
  }
}
