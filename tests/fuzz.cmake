# The fuzz targets of fuzz/ without libFuzzer: each runs over its seed corpus and the inputs of
# past crashes (fuzz/regressions/<name>/) under the build's own compiler and sanitizers, so a
# regression fails ctest. The fuzzing itself is the fuzz preset's job (scripts/test).
function(idemgate_fuzz_replay name)
  cmake_parse_arguments(R "" "" "SOURCES;LIBS" ${ARGN})
  set(exe fuzz_${name}_corpus_test)
  add_executable(${exe} ${PROJECT_SOURCE_DIR}/fuzz/${name}_fuzzer.cpp
                 ${PROJECT_SOURCE_DIR}/fuzz/replay_main.cpp ${R_SOURCES})
  target_link_libraries(${exe} PRIVATE ${R_LIBS})
  set(inputs ${PROJECT_SOURCE_DIR}/fuzz/corpus/${name})
  if(EXISTS ${PROJECT_SOURCE_DIR}/fuzz/regressions/${name})
    list(APPEND inputs ${PROJECT_SOURCE_DIR}/fuzz/regressions/${name})
  endif()
  add_test(NAME ${exe} COMMAND ${exe} ${inputs})
  set_tests_properties(${exe} PROPERTIES LABELS unit TIMEOUT 300)
endfunction()

idemgate_fuzz_replay(key_parser LIBS idemgate_core)
idemgate_fuzz_replay(config_loader LIBS idemgate_config)
idemgate_fuzz_replay(request_framing
  SOURCES ${PROJECT_SOURCE_DIR}/gateway/request_identity.cpp
  LIBS idemgate_http_rules idemgate_config)
idemgate_fuzz_replay(upstream_response LIBS idemgate_http_rules)
idemgate_fuzz_replay(stored_record LIBS idemgate_pg)
idemgate_fuzz_replay(replay_marker LIBS idemgate_core)
idemgate_fuzz_replay(h2_frames LIBS idemgate_h2_codec)

# Each crash or hang the fuzzers found, as a unit test of the behaviour that replaced it.
idemgate_test(fuzz_regression_test unit
  SOURCES ../fuzz/fuzz_regression_test.cpp
  LIBS idemgate_config)
