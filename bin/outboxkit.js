#!/usr/bin/env node
// The `outboxkit` command. The TypeScript sources are compiled to dist/ by `npm run build`, which
// `npm ci` / `npm install` run through the `prepare` script.
import { runCli } from '../dist/cli/main.js';

await runCli();
