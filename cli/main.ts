/**
 * The `outboxkit` command line: migrations, the relay daemon, and operator commands.
 * Every option reads: flag > environment variable > default (listed in `--help`).
 * Each command lives in cli/commands/ and registers itself here. Only the command asked for is
 * loaded (all of them for help or an unknown command): the relay daemon then never loads
 * drizzle-orm or the consumer's modules, which keeps its memory down.
 */
import { existsSync, readFileSync } from 'node:fs';
import { Command } from 'commander';
import { isOutboxkitError } from '../src/errors.js';
import { applyKafkajsRequestQueueFix } from '../src/kafka/kafkajs/fix.js';
import { applyKafkajsMetadataFix } from '../src/kafka/kafkajs/metadata-fix.js';
import { CONNECTION_SETTING_SQLSTATES, SQLSTATE } from '../src/postgres.js';
import { UNREACHABLE_SOCKET_CODES } from '../src/socket-codes.js';
import { printableJson, printableLines, printError } from './printable.js';
import { lifetime } from './shared.js';

/** Set by main() when the command line asks for JSON: errors are then printed as JSON too. */
let jsonErrors = false;
/**
 * Set when commander itself displayed the error (usage errors: unknown option, bad or missing
 * argument). An error thrown inside an action (even commander's InvalidArgumentError, whose code is
 * `commander.invalidArgument` too) never goes through commander's output, so the code alone cannot
 * tell whether it was printed.
 */
let shownByCommander = false;

/** Each command's module, loaded on demand. */
const COMMANDS: Record<string, () => Promise<(program: Command) => void>> = {
  migrate: async () => (await import('./commands/migrate.js')).registerMigrate,
  relay: async () => (await import('./commands/relay.js')).registerRelay,
  status: async () => (await import('./commands/status.js')).registerStatus,
  lanes: async () => (await import('./commands/lanes.js')).registerLanes,
  parked: async () => (await import('./commands/parked.js')).registerParked,
  topics: async () => (await import('./commands/topics.js')).registerTopics,
  keys: async () => (await import('./commands/keys.js')).registerKeys,
  dlq: async () => (await import('./commands/dlq.js')).registerDlq,
  inbox: async () => (await import('./commands/inbox.js')).registerInbox,
  wal: async () => (await import('./commands/wal.js')).registerWal,
};

/** outboxkit's version, from its package.json (next to cli/ in the sources, two levels up in dist/). */
function packageVersion(): string {
  for (const rel of ['../package.json', '../../package.json']) {
    const file = new URL(rel, import.meta.url);
    if (!existsSync(file)) continue;
    const pkg = JSON.parse(readFileSync(file, 'utf8')) as { name?: string; version?: string };
    if (pkg.name === 'outboxkit' && typeof pkg.version === 'string') return pkg.version;
  }
  return 'unknown';
}

/** The program with the command named in `args` registered, or every command when none is. */
async function buildProgram(args: string[]): Promise<Command> {
  const program = new Command('outboxkit')
    .description('Safe retries across PostgreSQL and Apache Kafka: outbox relay, migrations and operator commands.')
    .version(packageVersion(), '-V, --version', 'print the version')
    .showHelpAfterError()
    // Usage errors (unknown option, bad argument) go through main()'s handler, so `--json` gets JSON.
    .exitOverride()
    .configureOutput({
      // With --json, stderr carries only the JSON error main() prints (no usage text).
      writeErr: (text) => {
        if (!jsonErrors) process.stderr.write(printableLines(text));
      },
      outputError: (text, write) => {
        shownByCommander = true;
        if (!jsonErrors) write(printableLines(text));
      },
    });
  // The program has no options of its own: the first argument not starting with '-' names the command.
  const named = args.find((a) => !a.startsWith('-'));
  const names = named !== undefined && Object.hasOwn(COMMANDS, named) ? [named] : Object.keys(COMMANDS);
  for (const register of await Promise.all(names.map((n) => COMMANDS[n]!()))) register(program);
  shortUsageAfterErrors(program);
  return program;
}

/**
 * After a usage error, each command prints its one-line usage and where the whole help is, instead
 * of the whole help (the relay's runs to 60 lines, and the error itself scrolled out of sight).
 */
function shortUsageAfterErrors(command: Command, path: string[] = []): void {
  for (const sub of command.commands) {
    const names = [...path, sub.name()];
    const full = ['outboxkit', ...names].join(' ');
    sub.showHelpAfterError(`Usage: ${full} ${sub.usage()}\nRun '${full} --help' for the options.`);
    shortUsageAfterErrors(sub, names);
  }
}

/** What to do about an error, by its code (appended to its message), or ''. */
function hintFor(code: string): string {
  if (code === SQLSTATE.UNDEFINED_TABLE) return " (outboxkit's tables are missing: run `outboxkit migrate`)";
  // kafkajs wraps its socket errors (KafkaJSConnectionError): a bare socket error code is pg's.
  if (UNREACHABLE_SOCKET_CODES.has(code))
    return ' (PostgreSQL cannot be reached: check --database-url / DATABASE_URL, and that the server runs)';
  if (CONNECTION_SETTING_SQLSTATES.has(code)) return ' (check --database-url / DATABASE_URL)';
  if (code === 'EADDRINUSE') {
    return (
      ' (the metrics port is taken, for example by another relay on this host: give each instance its own ' +
      '--metrics-port / OUTBOXKIT_METRICS_PORT, 0 for a random one, or -1 for none)'
    );
  }
  if (code === 'EADDRNOTAVAIL') {
    return " (the metrics address is not one of this host's: check --metrics-host / OUTBOXKIT_METRICS_HOST)";
  }
  return '';
}

/**
 * The error as `{ code, message }`: an outboxkit code, a commander code (`commander.unknownOption`),
 * a SQLSTATE or Node.js code, else the error's class name (`KafkaJSConnectionError`).
 */
export function describeError(err: unknown): { code: string; message: string } {
  const e = err as { code?: unknown; name?: unknown; message?: unknown };
  const code = typeof e?.code === 'string' && e.code !== '' ? e.code : typeof e?.name === 'string' ? e.name : 'ERROR';
  const hint = hintFor(code);
  let message = typeof e?.message === 'string' ? e.message : String(err);
  // kafkajs answers several topics' errors as one KafkaJSAggregateError ("Topic creation errors"):
  // the reasons are in its errors, each with its topic and Kafka error type.
  const inner = (err as { errors?: unknown }).errors;
  if (Array.isArray(inner) && inner.length > 0) {
    const reasons = inner.map((i: { topic?: unknown; type?: unknown; message?: unknown }) =>
      [typeof i?.topic === 'string' ? `${i.topic}:` : '', typeof i?.type === 'string' ? i.type : '', i?.message]
        .filter((x) => typeof x === 'string' && x !== '')
        .join(' '),
    );
    message = `${message} (${reasons.join('; ')})`;
  }
  return { code, message: `${message.replace(/^error: /, '')}${hint}` };
}

export async function main(argv: string[] = process.argv): Promise<void> {
  // Options end at `--`; anything after it is an argument.
  const end = argv.indexOf('--');
  jsonErrors = (end === -1 ? argv : argv.slice(0, end)).includes('--json');
  shownByCommander = false;
  // kafkajs 2.2.4 re-arms a 1 ms timer per broker connection forever (and Node 24 warns on each).
  applyKafkajsRequestQueueFix();
  // kafkajs 2.2.4 fails every metadata request that covers a partition without a leader.
  applyKafkajsMetadataFix();
  try {
    const program = await buildProgram((end === -1 ? argv : argv.slice(0, end)).slice(2));
    await program.parseAsync(argv);
  } catch (err) {
    const { code, message } = describeError(err);
    const exitCode = (err as { exitCode?: unknown }).exitCode;
    // Help (asked for, or shown for a missing command) ends through exitOverride too, already printed.
    if (code === 'commander.helpDisplayed' || code === 'commander.version' || code === 'commander.help') {
      process.exitCode = typeof exitCode === 'number' ? exitCode : 0;
      return;
    }
    if (jsonErrors) {
      const field = (err as { field?: unknown }).field; // InvalidKafkaConfigError names the setting
      const error = typeof field === 'string' ? { code, message, field } : { code, message };
      process.stderr.write(`${printableJson(JSON.stringify({ error }))}\n`);
    } else if (shownByCommander && code.startsWith('commander.')) {
      // commander printed the usage error already (outputError), with the command's usage.
    } else {
      // Messages may quote text from outside (a Kafka or PostgreSQL error, a topic name).
      printError(`outboxkit: ${isOutboxkitError(err) ? `${code}: ${message}` : message}`);
    }
    process.exitCode = typeof exitCode === 'number' && exitCode !== 0 ? exitCode : 1;
  }
}

/**
 * The `outboxkit` process: {@link main}, then an exit within 2 s of the command's end. A command
 * that gave up on an unreachable broker (`topics ensure --timeout-ms`) leaves kafkajs retrying the
 * connection of an abandoned client on timers nothing can cancel, which would hold the process for
 * up to its retry time (30 s); the unref'd watchdog never delays a process that is idle already.
 * Not after `relay`, which returns once started and lives on until a signal.
 */
export async function runCli(argv: string[] = process.argv): Promise<void> {
  await main(argv);
  if (!lifetime.daemon) setTimeout(() => process.exit(), 2_000).unref();
}

// Run when executed directly (tsx cli/main.ts, or bin/outboxkit.js importing the build).
if (process.argv[1] && import.meta.url === new URL(`file://${process.argv[1]}`).href) {
  void runCli();
}
