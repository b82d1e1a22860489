# Tests against real store topologies started by the test itself (a Redis Cluster, Sentinel, ACL):
# loopback only, each suite well under a minute. Each one starts store processes of its own
# (idemgate_starts_stores at the end: one such suite at a time).
add_library(idemgate_test_redis_cluster STATIC scale/redis_cluster.cpp)
target_link_libraries(idemgate_test_redis_cluster PUBLIC idemgate_test_support idemgate_redis)

idemgate_test(redis_cluster_scale_test scale SOURCES scale/redis_cluster_scale_test.cpp
  LIBS idemgate_test_redis_cluster idemgate_redis)

# The LockService contract on the Sentinel-named primary and on a 3-primary cluster, both started
# by the binary, through the product's own client; and a lost reply undone on each.
idemgate_test(redis_lock_scale_test scale SOURCES scale/redis_lock_scale_test.cpp
  LIBS idemgate_test_redis_sentinel idemgate_test_redis_cluster idemgate_redis)

# A Redis with an ACL user limited to the lock keys, restarted under keyed load: every reconnect
# authenticates first. Postgres comes from scripts/local-stores (a private one, like fault).
idemgate_test(redis_auth_scale_e2e_test scale
  SOURCES scale/redis_auth_scale_e2e_test.cpp fault/local_stores.cpp
  LIBS idemgate_e2e_fixture PkgConfig::HIREDIS)
add_dependencies(redis_auth_scale_e2e_test idemgate payment-service)

# The gateway over a real cluster: the idemgate and payment-service binaries, a private Postgres
# (scripts/local-stores) and a cluster this binary starts and reshards under load.
idemgate_test(redis_cluster_scale_e2e_test scale
  SOURCES scale/redis_cluster_scale_e2e_test.cpp fault/local_stores.cpp
  LIBS idemgate_e2e_fixture idemgate_test_redis_cluster idemgate_core)
# The test starts both binaries; build them with it.
add_dependencies(redis_cluster_scale_e2e_test idemgate payment-service)

# A Sentinel deployment (primary, replica, three sentinels) a test starts and fails over.
add_library(idemgate_test_redis_sentinel STATIC scale/redis_sentinel.cpp)
target_link_libraries(idemgate_test_redis_sentinel
  PUBLIC idemgate_e2e_fixture idemgate_redis PRIVATE PkgConfig::HIREDIS)

# The real gateway and payment service against a Sentinel deployment the test binary fails
# over, plus a private Postgres (scripts/local-stores), so the suite needs no store variables.
idemgate_test(redis_sentinel_scale_e2e_test scale
  SOURCES scale/redis_sentinel_scale_e2e_test.cpp fault/local_stores.cpp
  LIBS idemgate_test_redis_sentinel idemgate_ops_support PkgConfig::HIREDIS)
# The test starts both binaries; build them with it.
add_dependencies(redis_sentinel_scale_e2e_test idemgate payment-service)

# Three gateways behind a real HAProxy (`mode tcp`, health check on /readyz, SPEC C45) on a
# private Postgres and Redis (scripts/local-stores): the storm, a drain and a SIGKILL under load.
idemgate_test(haproxy_scale_e2e_test scale
  SOURCES scale/haproxy_scale_e2e_test.cpp scale/haproxy.cpp fault/local_stores.cpp
  LIBS idemgate_e2e_fixture idemgate_ops_support)
# The test starts both binaries; build them with it.
add_dependencies(haproxy_scale_e2e_test idemgate payment-service)

# idempotency_record hash-partitioned by id (`idemgate migrate --partitions N`): the RecordStore
# contract suite on a converted table, the cleaner per partition, the migration's own cases and
# the gateway across a conversion, on a private Postgres and Redis (scripts/local-stores).
idemgate_test(pg_partitions_scale_e2e_test scale
  SOURCES scale/pg_partitions_scale_e2e_test.cpp fault/local_stores.cpp
  LIBS idemgate_e2e_fixture idemgate_app)
# The test starts both binaries; build them with it.
add_dependencies(pg_partitions_scale_e2e_test idemgate payment-service)

# The real gateway over a Postgres primary and its synchronous standby that this binary starts,
# SIGKILLs and promotes under keyed load (the gateway's DSN names both hosts); Redis and the
# payment service's database come from scripts/local-stores.
idemgate_test(pg_failover_scale_e2e_test scale
  SOURCES scale/pg_failover_scale_e2e_test.cpp scale/pg_standby.cpp fault/local_stores.cpp
  LIBS idemgate_e2e_fixture idemgate_ops_support PostgreSQL::PostgreSQL)
# The test starts both binaries; build them with it.
add_dependencies(pg_failover_scale_e2e_test idemgate payment-service)

# Connection poolers (SPEC C44): the gateway and payment service with storage.postgres behind a
# PgBouncer in transaction pooling mode that this binary starts, stops and starts again, in
# front of a private Postgres (scripts/local-stores).
add_library(idemgate_test_pgbouncer STATIC scale/pgbouncer.cpp)
target_link_libraries(idemgate_test_pgbouncer
  PUBLIC idemgate_e2e_fixture PRIVATE PostgreSQL::PostgreSQL)
idemgate_test(pgbouncer_scale_e2e_test scale
  SOURCES scale/pgbouncer_scale_e2e_test.cpp fault/local_stores.cpp
  LIBS idemgate_test_pgbouncer idemgate_ops_support idemgate_pg)
# The test starts both binaries; build them with it.
add_dependencies(pgbouncer_scale_e2e_test idemgate payment-service)

idemgate_starts_stores(redis_cluster_scale_test redis_lock_scale_test redis_auth_scale_e2e_test
  redis_cluster_scale_e2e_test redis_sentinel_scale_e2e_test haproxy_scale_e2e_test
  pg_partitions_scale_e2e_test pg_failover_scale_e2e_test pgbouncer_scale_e2e_test)
