# Tests against several real store processes started by the test itself (a Redis Cluster):
# loopback only, each suite well under a minute.
add_library(idemgate_test_redis_cluster STATIC scale/redis_cluster.cpp)
target_link_libraries(idemgate_test_redis_cluster PUBLIC idemgate_test_support idemgate_redis)

idemgate_test(redis_cluster_scale_test scale SOURCES scale/redis_cluster_scale_test.cpp
  LIBS idemgate_test_redis_cluster idemgate_redis)
