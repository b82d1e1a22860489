# Postgres layer against a real server (IDEMGATE_PG_DSN): the RecordStore contract suite on
# PgRecordStore, plus pool, timeout, reconnect and migration cases.
idemgate_test(record_store_pg_test pg
  SOURCES storage/record_store_pg_test.cpp
  LIBS idemgate_pg)

# The same contract suite on PgRecordStore with group commit (PgBatchWriter), plus batching cases.
idemgate_test(record_store_batched_pg_test pg
  SOURCES storage/record_store_batched_pg_test.cpp
  LIBS idemgate_pg)
