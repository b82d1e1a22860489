-- pgbench baseline of scripts/bench: one idempotency record per transaction, the shape and the
-- statement of PgRecordStore's single-row insert (storage/pg/pg_record_store.cpp, kInsert), into
-- a scratch copy of idempotency_record. The id is random, so every insert is a new row.
INSERT INTO bench_record AS r
  (id, route, fingerprint, status, headers, body, body_omitted, expires_at)
VALUES (sha256(gen_random_uuid()::text::bytea), 'payments', sha256(gen_random_uuid()::text::bytea),
        201,
        '\x010000000c436f6e74656e742d54797065000000106170706c69636174696f6e2f6a736f6e000000084c6f636174696f6e000000142f7061796d656e74732f62656e63682d31323334'::bytea,
        convert_to('{"id":"bench-1234","status":"created"}', 'UTF8'), false,
        now() + 3600000 * interval '1 millisecond')
ON CONFLICT (id) DO UPDATE SET route = EXCLUDED.route, fingerprint = EXCLUDED.fingerprint,
  status = EXCLUDED.status, headers = EXCLUDED.headers, body = EXCLUDED.body,
  body_omitted = EXCLUDED.body_omitted, created_at = EXCLUDED.created_at,
  expires_at = EXCLUDED.expires_at
WHERE r.expires_at <= now()
RETURNING created_at, expires_at;
