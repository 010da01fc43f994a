-- Custom SQL migration file, put your code below! --
-- Records claimed before operation ids were stored keep the id they were given then, the hex
-- SHA-256 of their key, so that the Location URLs already handed out keep working; new records
-- get an HMAC of (tenant, operation, key) from the claim. Safe to run again (docs/runbooks.md,
-- "Upgrades": after the last instance of an older version has stopped).
UPDATE "outboxkit"."idempotency_keys"
   SET "operation_id" = encode(sha256(convert_to("key", 'UTF8')), 'hex')
 WHERE "operation_id" IS NULL;
