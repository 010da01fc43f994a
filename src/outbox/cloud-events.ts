/**
 * CloudEvents attributes of an outbox event, as Kafka headers in binary content mode: pure logic.
 *
 * Sources:
 * - CloudEvents 1.0.2 core specification, "Context Attributes" (required: `id`, `source`,
 *   `specversion`, `type`; optional: `datacontenttype`, `subject`, `time`):
 *   https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/spec.md#context-attributes
 * - CloudEvents Kafka Protocol Binding 1.0.2, §3.2 "Binary Content Mode": each attribute is a
 *   header named `ce_` + the attribute name, its value UTF-8; `datacontenttype` maps to the
 *   `content-type` header; the Kafka value is the event data as is:
 *   https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/bindings/kafka-protocol-binding.md#32-binary-content-mode
 *
 * outboxkit does not depend on the `cloudevents` npm package: the mapping is these few headers.
 */
import { InvalidOptionsError } from '../errors.js';

/** The CloudEvents specification version outboxkit writes (`ce_specversion`). */
export const CLOUDEVENTS_SPEC_VERSION = '1.0';

/** Kafka header names of the CloudEvents attributes outboxkit writes (binary content mode). */
export const CE_HEADERS = Object.freeze({
  specversion: 'ce_specversion',
  id: 'ce_id',
  source: 'ce_source',
  type: 'ce_type',
  time: 'ce_time',
  subject: 'ce_subject',
  /** `datacontenttype` is carried by the Kafka `content-type` header, not `ce_datacontenttype`. */
  datacontenttype: 'content-type',
});

/** The `content-type` header (Kafka binding §3.2.1; also set by an encoder that names a content type). */
export const HEADER_CONTENT_TYPE = CE_HEADERS.datacontenttype;

/** Content type of payloads outboxkit serialises itself (`JSON.stringify`, UTF-8). */
export const JSON_CONTENT_TYPE = 'application/json';

/** Options of the CloudEvents headers (`createOutbox({ cloudEvents })`). */
export interface CloudEventsOptions {
  /**
   * The CloudEvents `source`: a URI-reference naming the context in which events happen, for
   * example `/orders` or `https://shop.example.com/orders` (spec: "Context Attributes", source).
   * Together with the event id it identifies an event. Required, non-empty, no whitespace or
   * control characters.
   */
  source: string;
}

/** The CloudEvents context attributes of one event (CloudEvents 1.0 names). */
export interface CloudEventAttributes {
  specversion: string;
  id: string;
  source: string;
  type: string;
  /** RFC 3339 timestamp. */
  time?: string;
  subject?: string;
  datacontenttype?: string;
}

// A URI-reference (RFC 3986 §4.1) has no whitespace or control characters; anything else, relative
// or absolute, is left to the application.
const URI_REFERENCE_SHAPE = /^[^\s\p{Cc}]+$/u;

/**
 * Validates the `cloudEvents` option once.
 *
 * @returns the options, frozen; undefined when CloudEvents headers are off.
 * @throws {@link InvalidOptionsError} when `source` is missing, empty or not URI-reference-shaped.
 */
export function resolveCloudEventsOptions(options: CloudEventsOptions | undefined): CloudEventsOptions | undefined {
  if (options === undefined) return undefined;
  if (typeof options !== 'object' || options === null) {
    throw new InvalidOptionsError("cloudEvents must be an object such as { source: '/orders' }, or be left out.");
  }
  const { source } = options;
  if (typeof source !== 'string' || source.length === 0 || source.length > 4096 || !URI_REFERENCE_SHAPE.test(source)) {
    throw new InvalidOptionsError(
      `cloudEvents.source must be a non-empty URI-reference without whitespace (for example '/orders'), got ${JSON.stringify(source)}.`,
    );
  }
  return Object.freeze({ source });
}

/** What {@link addCloudEventHeaders} needs of an event. */
export interface CloudEventEnvelope {
  eventId: string;
  type: string;
  key: string | null;
  aggregateId: string | null;
  /** The payload's content type (`datacontenttype`), when known. */
  contentType: string | null;
  /** Creation time, as an RFC 3339 timestamp (`Date.prototype.toISOString()`). */
  time: string;
}

/**
 * Adds the binary-mode CloudEvents headers of one event to `headers` (modified in place):
 * `ce_specversion` 1.0, `ce_id` = event id, `ce_source`, `ce_type` = event type, `ce_time` =
 * creation time, `ce_subject` = key, else aggregate id (left out when neither exists), and
 * `content-type` = the payload's content type when known.
 *
 * `ce_id`, `ce_type`, `ce_specversion` and `ce_source` always come from the envelope and the
 * options (a consumer deduplicates by source + id); headers the application set itself win for
 * `ce_time`, `ce_subject`, `content-type` and any extension attribute (`ce_<name>`).
 */
export function addCloudEventHeaders(
  headers: Record<string, string>,
  event: CloudEventEnvelope,
  options: CloudEventsOptions,
): void {
  headers[CE_HEADERS.specversion] = CLOUDEVENTS_SPEC_VERSION;
  headers[CE_HEADERS.id] = event.eventId;
  headers[CE_HEADERS.source] = options.source;
  headers[CE_HEADERS.type] = event.type;
  if (!Object.hasOwn(headers, CE_HEADERS.time)) headers[CE_HEADERS.time] = event.time;
  const subject = event.key ?? event.aggregateId;
  if (subject !== null && subject.length > 0 && !Object.hasOwn(headers, CE_HEADERS.subject)) {
    headers[CE_HEADERS.subject] = subject;
  }
  if (event.contentType !== null && !Object.hasOwn(headers, CE_HEADERS.datacontenttype)) {
    headers[CE_HEADERS.datacontenttype] = event.contentType;
  }
}

/**
 * Reads the CloudEvents attributes of a Kafka message in binary content mode (decoded headers, as
 * `ConsumedEvent.headers` gives them).
 *
 * @returns the attributes, or null when a required one (`ce_specversion`, `ce_id`, `ce_source`,
 *   `ce_type`) is missing or empty. Extension attributes stay in the headers (`ce_<name>`).
 */
export function readCloudEventAttributes(headers: Readonly<Record<string, string>>): CloudEventAttributes | null {
  const specversion = headers[CE_HEADERS.specversion];
  const id = headers[CE_HEADERS.id];
  const source = headers[CE_HEADERS.source];
  const type = headers[CE_HEADERS.type];
  if (!specversion || !id || !source || !type) return null;
  const out: CloudEventAttributes = { specversion, id, source, type };
  const time = headers[CE_HEADERS.time];
  if (time) out.time = time;
  const subject = headers[CE_HEADERS.subject];
  if (subject) out.subject = subject;
  const datacontenttype = headers[CE_HEADERS.datacontenttype];
  if (datacontenttype) out.datacontenttype = datacontenttype;
  return out;
}
