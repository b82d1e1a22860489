# Redis layer against a real Redis (IDEMGATE_REDIS_ADDR); the tests fail when it is not set.
idemgate_test(redis_connection_redis_test redis
  SOURCES storage/redis_connection_redis_test.cpp
  LIBS idemgate_redis idemgate_core)
idemgate_test(redis_lock_redis_test redis
  SOURCES storage/redis_lock_redis_test.cpp
  LIBS idemgate_redis)
# Its C25 cases pause every client's writes (CLIENT PAUSE WRITE) and kill every client's
# connection (CLIENT KILL TYPE normal) of the shared Redis, and one case flushes its script cache:
# no other test may use that Redis meanwhile.
idemgate_disturbs_shared_stores(redis_lock_redis_test)
# The command encoding (pure: compared with hiredis's own formatter).
idemgate_test(redis_resp_test unit SOURCES unit/redis_resp_test.cpp LIBS idemgate_redis)
