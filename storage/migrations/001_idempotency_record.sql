-- The durable store of completed responses (SPEC C15, C16, C24, C36): one row per scope and key.
CREATE TABLE idempotency_record (
  -- SHA-256 of scope and key: the raw client key is never stored (C23).
  id           bytea       PRIMARY KEY CHECK (octet_length(id) = 32),
  route        text        NOT NULL,
  fingerprint  bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
  status       integer     NOT NULL CHECK (status BETWEEN 100 AND 599),
  -- End-to-end response header fields in order, repeats kept, any bytes in values: a format
  -- byte 1, then per field a 4-byte big-endian name length, the name, a 4-byte big-endian
  -- value length, the value.
  headers      bytea       NOT NULL,
  body         bytea       NOT NULL,
  -- The body was over max_stored_response and is not kept (C29).
  body_omitted boolean     NOT NULL DEFAULT false,
  created_at   timestamptz NOT NULL DEFAULT now(),
  expires_at   timestamptz NOT NULL
);

-- The cleaner deletes expired rows in batches (C24).
CREATE INDEX idempotency_record_expires_at_idx ON idempotency_record (expires_at);
