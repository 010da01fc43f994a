/**
 * Loading @platformatic/kafka, an optional peer dependency: only a relay that chose it loads it,
 * and one that cannot gets a {@link KafkaClientUnavailableError} saying what to install.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import type * as platformatic from '@platformatic/kafka';
import { KafkaClientUnavailableError } from '../../errors.js';
import { fixPlatformaticMetadata } from './metadata-fix.js';

/** The module's type, for the adapter's own files (never in a public signature). */
export type PlatformaticKafka = typeof platformatic;

/**
 * The package versions this adapter was tested against: 1.35.0 on Node.js 20.20.2 and 24.22.3,
 * 2.12.1 on Node.js 24.22.3 (the 2.x line needs Node.js 22.22+).
 */
export const PLATFORMATIC_SUPPORTED = '^1.35.0 || ^2.12.1';

/** What to install on Node.js `node`, for the error messages: 2.x where it runs (22.22+), else 1.x. */
export function platformaticInstall(node: string = process.versions.node): string {
  return `npm install @platformatic/kafka@${nodeSatisfies(node, '>= 22.22.0') ? '^2.12.1' : '^1.35.0'}`;
}

let loading: Promise<PlatformaticKafka> | undefined;

/**
 * The @platformatic/kafka module, loaded once per process, with {@link fixPlatformaticMetadata}
 * applied.
 *
 * @throws {@link KafkaClientUnavailableError} when the package cannot be resolved, when its major
 *   version is not one outboxkit supports, or when this Node.js is older than the package's
 *   `engines.node` (read from its package.json).
 */
export function loadPlatformaticKafka(): Promise<PlatformaticKafka> {
  loading ??= load();
  // A failed load is tried again on the next call (the package may be installed meanwhile).
  loading.catch(() => (loading = undefined));
  return loading;
}

async function load(): Promise<PlatformaticKafka> {
  const pkg = readPackage();
  checkVersion(pkg.version, process.versions.node, pkg.engines);
  let kafka: PlatformaticKafka;
  try {
    kafka = await import('@platformatic/kafka');
  } catch (err) {
    throw new KafkaClientUnavailableError(
      `@platformatic/kafka ${pkg.version} is installed but could not be loaded (${(err as Error).message}). ` +
        `Reinstall it (${platformaticInstall()}) or choose kafkaClient 'kafkajs'.`,
      { cause: err },
    );
  }
  // Partitions without a leader no longer fail a whole metadata request (./metadata-fix.ts).
  fixPlatformaticMetadata(kafka);
  return kafka;
}

/**
 * The installed package's version and `engines.node` (from its package.json).
 *
 * @throws {@link KafkaClientUnavailableError} when it is not installed.
 */
export function readPackage(): { version: string; engines?: string } {
  let entry: string;
  try {
    entry = createRequire(import.meta.url).resolve('@platformatic/kafka');
  } catch (err) {
    throw new KafkaClientUnavailableError(
      `kafkaClient 'platformatic' needs the package @platformatic/kafka, an optional peer dependency of outboxkit ` +
        `that is not installed: run \`${platformaticInstall()}\`, or choose kafkaClient 'kafkajs' (the default).`,
      { cause: err },
    );
  }
  // The package exports only its entry (dist/index.js): its package.json is found by walking up.
  for (let dir = path.dirname(entry); dir !== path.dirname(dir); dir = path.dirname(dir)) {
    let text: string;
    try {
      text = readFileSync(path.join(dir, 'package.json'), 'utf8');
    } catch {
      continue;
    }
    const json = JSON.parse(text) as { name?: string; version?: string; engines?: { node?: string } };
    if (json.name !== '@platformatic/kafka') continue;
    return { version: json.version ?? '0.0.0', engines: json.engines?.node };
  }
  throw new KafkaClientUnavailableError(
    `The package.json of @platformatic/kafka (resolved to ${entry}) was not found: reinstall it (${platformaticInstall()}).`,
  );
}

type Version = [number, number, number];

function parseVersion(text: string): Version | undefined {
  const m = /^v?(\d+)\.(\d+)\.(\d+)/.exec(text.trim());
  return m ? [Number(m[1]), Number(m[2]), Number(m[3])] : undefined;
}

function atLeast(a: Version, b: Version): boolean {
  for (let i = 0; i < 3; i++) if (a[i] !== b[i]) return a[i]! > b[i]!;
  return true;
}

/**
 * Whether Node.js `node` satisfies an `engines.node` range made of `>= x.y.z` clauses joined by
 * `||` (the form @platformatic/kafka uses: `>= 20.19.4 || >= 22.18.0 || >= 24.6.0` in 1.x,
 * `>= 22.22.0 || >= 24.6.0` in 2.x). Undefined when the range has another form (not checked then).
 */
export function nodeSatisfies(node: string, engines: string): boolean | undefined {
  const version = parseVersion(node);
  if (!version) return undefined;
  const minimums: Version[] = [];
  for (const clause of engines.split('||')) {
    const m = /^\s*>=\s*(\S+)\s*$/.exec(clause);
    const min = m ? parseVersion(m[1]!) : undefined;
    if (!min) return undefined;
    minimums.push(min);
  }
  return minimums.some((min) => atLeast(version, min));
}

/**
 * Refuses a package version outside {@link PLATFORMATIC_SUPPORTED}, or a Node.js the package's
 * `engines.node` excludes.
 *
 * @throws {@link KafkaClientUnavailableError} saying what to install.
 */
export function checkVersion(version: string, node: string, engines: string | undefined): void {
  const v = parseVersion(version);
  const supported =
    v !== undefined && ((v[0] === 1 && atLeast(v, [1, 35, 0])) || (v[0] === 2 && atLeast(v, [2, 12, 1])));
  if (!supported) {
    throw new KafkaClientUnavailableError(
      `@platformatic/kafka ${version} is installed; outboxkit supports ${PLATFORMATIC_SUPPORTED}: run \`${platformaticInstall(node)}\`, ` +
        `or choose kafkaClient 'kafkajs'.`,
    );
  }
  if (engines !== undefined && nodeSatisfies(node, engines) === false) {
    throw new KafkaClientUnavailableError(
      `@platformatic/kafka ${version} needs Node.js ${engines}; this is Node.js ${node}. Upgrade Node.js, ` +
        `or run \`${platformaticInstall(node)}\`, or choose kafkaClient 'kafkajs'.`,
    );
  }
}
