# Redis layer against a real Redis (IDEMGATE_REDIS_ADDR); the tests fail when it is not set.
idemgate_test(redis_connection_redis_test redis
  SOURCES storage/redis_connection_redis_test.cpp
  LIBS idemgate_redis idemgate_core)
idemgate_test(redis_lock_redis_test redis
  SOURCES storage/redis_lock_redis_test.cpp
  LIBS idemgate_redis)
