# Postgres layer against a real server (IDEMGATE_PG_DSN): the RecordStore contract suite on
# PgRecordStore, plus pool, timeout, reconnect and migration cases.
idemgate_test(record_store_pg_test pg
  SOURCES storage/record_store_pg_test.cpp
  LIBS idemgate_pg)

# The same contract suite on PgRecordStore with group commit (PgBatchWriter), plus batching cases.
idemgate_test(record_store_batched_pg_test pg
  SOURCES storage/record_store_batched_pg_test.cpp
  LIBS idemgate_pg)

# The row and header-blob decoding of the record store, without a server.
idemgate_test(pg_record_codec_test unit
  SOURCES unit/pg_record_codec_test.cpp
  LIBS idemgate_pg)
