#!/usr/bin/env node
// The `outboxkit` command. The TypeScript sources are compiled to dist/ by `npm run build`, which
// `npm ci` / `npm install` run through the `prepare` script.
import { main } from '../dist/cli/main.js';

await main();
