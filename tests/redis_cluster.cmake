# Redis Cluster routing (SPEC C42): pure logic here, a real cluster in scale.cmake.
idemgate_test(redis_cluster_test unit SOURCES unit/redis_cluster_test.cpp LIBS idemgate_redis)
