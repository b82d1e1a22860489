# Redis Cluster routing (SPEC C42): pure logic here, a real cluster in scale.cmake.

# The cluster client calls PrimaryTracker and endpoint_text from storage/redis/redis_client.cpp;
# until that file is part of idemgate_redis, the cluster tests link a stand-in.
add_library(idemgate_test_redis_client INTERFACE)
if(NOT EXISTS ${PROJECT_SOURCE_DIR}/storage/redis/redis_client.cpp)
  target_sources(idemgate_test_redis_client INTERFACE
                 ${CMAKE_CURRENT_SOURCE_DIR}/support/redis_client_standin.cpp)
endif()

idemgate_test(redis_cluster_test unit SOURCES unit/redis_cluster_test.cpp
  LIBS idemgate_redis idemgate_test_redis_client)
