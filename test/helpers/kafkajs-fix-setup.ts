/**
 * Every integration test file: kafkajs' idle 1 ms timer loop fixed before the test's own kafkajs
 * clients connect (src/kafka/kafkajs/fix.ts), as outboxkit's relay, consumer and CLI do. It keeps two
 * cores from spinning for test helpers' admins, and Node 24's TimeoutNegativeWarning out of CI's
 * log. test/kafka/kafkajs-fix.test.ts measures stock kafkajs in a process of its own.
 */
import { applyKafkajsRequestQueueFix } from '../../src/kafka/kafkajs/fix.js';

applyKafkajsRequestQueueFix();
