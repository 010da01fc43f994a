import { defineConfig } from 'drizzle-kit';

// drizzle-kit generates migrations/ for the default schema `outboxkit`; outboxkit's migrator
// rewrites that identifier when another schema is configured (see src/migrate.ts).
export default defineConfig({
  dialect: 'postgresql',
  schema: './src/schema.ts',
  out: './migrations',
  schemaFilter: ['outboxkit'],
});
