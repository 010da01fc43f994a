/**
 * A fix for a kafkajs 2.2.4 defect that outboxkit's processes would otherwise carry: each broker
 * connection's request queue re-arms a timer every millisecond for as long as it lives, idle or
 * not, and on Node.js 24 each re-arming prints a `TimeoutNegativeWarning` to stderr.
 *
 * The cause (kafkajs issues #1704 and #1751, fixes proposed in pull requests #1755 and #1768, none
 * released; 2.2.4 is the last release): `RequestQueue#scheduleCheckPendingRequests` computes
 * `throttledUntil - Date.now()` with `throttledUntil = -1` when no broker throttling is in force,
 * and passes that negative delay to `setTimeout`, which Node.js runs after 1 ms; the callback
 * schedules the next one. Nothing is pending, so each run does no work but wake the event loop.
 *
 * The replacement keeps kafkajs' behaviour wherever a check has work to do: with requests pending
 * it schedules one for the end of the throttling, or in 10 ms (kafkajs' own interval); throttled
 * with nothing pending, it schedules one for the end of the throttling. It only stops scheduling
 * when nothing is pending and nothing is throttled, where `push()` sends a new request at once
 * and an answered request runs the check itself (kafkajs calls `checkPendingRequests` from
 * `fulfillRequest` and from a request's timeout).
 *
 * Applied once per process, and only to kafkajs 2.2.x whose method still reads as the defective
 * one (its source is compared), so a fixed release is left alone. It changes the method on the
 * copy of kafkajs that outboxkit resolves (its own dependency, which npm shares with your app when
 * your app asks for a compatible kafkajs), for every client of that copy, existing ones included:
 * kafkajs looks the method up at each call. A kafkajs that a bundler inlined, or another copy in
 * node_modules, is not changed.
 */
import { createRequire } from 'node:module';

/** kafkajs' own interval between checks of a pending queue (ms), `CHECK_PENDING_REQUESTS_INTERVAL`. */
const CHECK_PENDING_REQUESTS_INTERVAL_MS = 10;

/** The defective method's body, as shipped in kafkajs 2.2.4, without blanks and comments. */
const DEFECTIVE_SOURCE = [
  'letscheduleAt=this.throttledUntil-Date.now()',
  'if(!this.throttleCheckTimeoutId){',
  'if(this.pending.length>0){',
  'scheduleAt=scheduleAt>0?scheduleAt:CHECK_PENDING_REQUESTS_INTERVAL',
  '}',
  'this.throttleCheckTimeoutId=setTimeout(()=>{',
  'this.throttleCheckTimeoutId=null',
  'this.checkPendingRequests()',
  '},scheduleAt)',
  '}',
].join('');

interface RequestQueueLike {
  throttledUntil: number;
  throttleCheckTimeoutId: NodeJS.Timeout | null;
  pending: unknown[];
  checkPendingRequests(): void;
}

/** What {@link applyKafkajsRequestQueueFix} did. */
export type KafkajsFixOutcome = 'applied' | 'already-applied' | 'unrecognised' | 'not-found';

let outcome: KafkajsFixOutcome | undefined;
/** Marks the replacement, so that a second copy of outboxkit in the process recognises it. */
const FIXED = Symbol.for('outboxkit.kafkajsRequestQueueFix');

/** A function's body without blanks and `//` comments: how a fix recognises the kafkajs code it replaces. */
export function normalised(fn: (...args: never[]) => unknown): string {
  const text = fn.toString();
  const body = text.slice(text.indexOf('{') + 1, text.lastIndexOf('}'));
  return body.replace(/\/\/[^\n]*/g, '').replace(/\s+/g, '');
}

/**
 * Replaces kafkajs' `RequestQueue#scheduleCheckPendingRequests` by one that never passes a
 * negative delay to `setTimeout` and does not re-arm a timer when there is nothing to check (see
 * the module's comment for the defect and the kafkajs issues). Idempotent; never throws.
 *
 * @returns `'applied'` the first time it changed the method, `'already-applied'` after that (also
 *   when another copy of outboxkit in the process did it), `'unrecognised'` when the kafkajs that
 *   outboxkit resolves is not 2.2.x or its method does not read as the defective one (a fixed or a
 *   changed release, a minified copy: left as it is), `'not-found'` when kafkajs' request queue
 *   module cannot be loaded (another layout). It says nothing of other copies of kafkajs (a
 *   bundle's, your app's own if npm did not share one): see the module's comment.
 */
export function applyKafkajsRequestQueueFix(): KafkajsFixOutcome {
  if (outcome === 'applied' || outcome === 'already-applied') return (outcome = 'already-applied');
  if (outcome) return outcome;
  let RequestQueue: { prototype: RequestQueueLike & { scheduleCheckPendingRequests(): void } };
  try {
    const require = createRequire(import.meta.url);
    const version = (require('kafkajs/package.json') as { version?: string }).version ?? '';
    if (!version.startsWith('2.2.')) return (outcome = 'unrecognised');
    RequestQueue = require('kafkajs/src/network/requestQueue/index.js') as typeof RequestQueue;
  } catch {
    return (outcome = 'not-found');
  }
  const proto = RequestQueue?.prototype;
  if (typeof proto?.scheduleCheckPendingRequests !== 'function') return (outcome = 'not-found');
  if ((proto.scheduleCheckPendingRequests as unknown as Record<symbol, unknown>)[FIXED]) {
    return (outcome = 'already-applied'); // by another copy of this module in the process
  }
  if (normalised(proto.scheduleCheckPendingRequests) !== DEFECTIVE_SOURCE) return (outcome = 'unrecognised');
  const fixed = function scheduleCheckPendingRequests(this: RequestQueueLike): void {
    if (this.throttleCheckTimeoutId) return;
    const untilUnthrottled = this.throttledUntil - Date.now();
    let delay: number;
    if (this.pending.length > 0) delay = untilUnthrottled > 0 ? untilUnthrottled : CHECK_PENDING_REQUESTS_INTERVAL_MS;
    else if (untilUnthrottled > 0) delay = untilUnthrottled;
    else return;
    this.throttleCheckTimeoutId = setTimeout(() => {
      this.throttleCheckTimeoutId = null;
      this.checkPendingRequests();
    }, delay);
  };
  Object.defineProperty(fixed, FIXED, { value: true });
  proto.scheduleCheckPendingRequests = fixed;
  return (outcome = 'applied');
}
