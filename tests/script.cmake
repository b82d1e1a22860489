# The test runner itself (label `script`): scripts/test in throwaway trees must fail on a configure
# error, a compile error, a deleted fragment, a failing or (in CI) skipped test and an empty or
# unknown stage list, and report a healthy tree's counts (tests/script/test_runner_test.sh). No
# stores, no sanitizers: the trees are tiny CMake projects of their own.
add_test(NAME test_runner_test COMMAND bash ${PROJECT_SOURCE_DIR}/tests/script/test_runner_test.sh)
set_tests_properties(test_runner_test PROPERTIES LABELS script TIMEOUT 600)
# It configures and builds its trees: among the longest suites, it starts among the first.
idemgate_runs_long(test_runner_test)
