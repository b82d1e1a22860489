#!/usr/bin/env bash
# scripts/test, the runner CI trusts, cannot pass by accident. Each case runs a copy of it in a
# throwaway tree: the real tests/CMakeLists.txt, one stub fragment per fragment it includes (each
# a test that passes), a CMakePresets.json whose `asan` preset builds without sanitizers, and
# stubs for scripts/install-deps and scripts/local-stores. Asserted: a configure error, a compile
# error, a deleted fragment, a failing install step, a failing test, a ctest filter that matches
# nothing, an empty or unknown stage list all fail the run; a skipped test fails it in CI unless the stage allows it,
# and is reported when not in CI; a healthy tree passes with the right counts, the stage table and
# the closing `N passed, N failed` line; the stores are stopped whatever happened.
set -euo pipefail
source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tree=$tmp/tree
out=$tmp/output
failures=0
cases=0

# ---- the throwaway tree ----------------------------------------------------------------------
mkdir -p "$tree/scripts" "$tree/tests/probe"
cp "$source_dir/scripts/test" "$tree/scripts/test"
cp "$source_dir/tests/CMakeLists.txt" "$tree/tests/CMakeLists.txt"
printf '#!/usr/bin/env bash\nexit 0\n' >"$tree/scripts/install-deps"
# Stores that are only a directory; every start and stop is logged, to check that they pair up.
cat >"$tree/scripts/local-stores" <<STUB
#!/usr/bin/env bash
set -euo pipefail
case \$1 in
  start)
    dir=\$(mktemp -d "$tmp/stores.XXXXXX")
    echo "start \$dir" >>"$tmp/stores.log"
    echo "export IDEMGATE_STORES_DIR=\$dir"
    ;;
  stop)
    echo "stop \$2" >>"$tmp/stores.log"
    rm -rf "\$2"
    ;;
esac
STUB
chmod +x "$tree/scripts/test" "$tree/scripts/install-deps" "$tree/scripts/local-stores"
cat >"$tree/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(runner_probe LANGUAGES CXX)
# Stands in for Boost.Test, which tests/CMakeLists.txt links every test with.
add_library(Boost::unit_test_framework INTERFACE IMPORTED)
enable_testing()
add_subdirectory(tests)
CMAKE
cat >"$tree/CMakePresets.json" <<'JSON'
{
  "version": 6,
  "cmakeMinimumRequired": { "major": 3, "minor": 25, "patch": 0 },
  "configurePresets": [
    { "name": "asan", "generator": "Unix Makefiles", "binaryDir": "${sourceDir}/build/asan" }
  ],
  "buildPresets": [{ "name": "asan", "configurePreset": "asan" }],
  "testPresets": [
    { "name": "asan", "configurePreset": "asan", "output": { "outputOnFailure": true } }
  ]
}
JSON
echo 'int main() { return 0; }' >"$tree/tests/probe/pass.cpp"
mapfile -t fragments < <(sed -n 's/^ *include( *\([^ )]*\)\.cmake.*/\1/p' "$tree/tests/CMakeLists.txt")
if ((${#fragments[@]} < 2)); then
  echo "FAILED: found ${#fragments[@]} fragments in tests/CMakeLists.txt"
  exit 1
fi
for f in "${fragments[@]}"; do
  echo "idemgate_test(${f}_probe_test unit SOURCES probe/pass.cpp)" >"$tree/tests/$f.cmake"
done
healthy=${#fragments[@]}
first=${fragments[0]}

# ---- running it ---------------------------------------------------------------------------------
# run [VAR=value...] [-- ctest arguments]: scripts/test of the tree, asan stage only, not in CI
# unless the case says so; its output goes to $out and its exit status to $rc.
rc=0
run() {
  local vars=()
  while (($# > 0)) && [[ $1 != -- ]]; do
    vars+=("$1")
    shift
  done
  if (($# > 0)); then shift; fi
  : >"$tmp/stores.log"
  set +e
  env -u CI -u IDEMGATE_REQUIRE_DOCKER -u IDEMGATE_TEST_JOBS -u ASAN_OPTIONS -u UBSAN_OPTIONS \
    IDEMGATE_TEST_STAGES=asan "${vars[@]}" "$tree/scripts/test" "$@" >"$out" 2>&1
  rc=$?
  set -e
}

failed() {
  echo "FAILED: $case: $*"
  failures=$((failures + 1))
}
begin_case() {
  case=$1
  cases=$((cases + 1))
  failures_before=$failures
}
expect_exit() {  # nonzero | N
  if [[ $1 == nonzero ]]; then
    ((rc != 0)) || failed "exit status 0, expected a failure"
  else
    ((rc == $1)) || failed "exit status $rc, expected $1"
  fi
}
expect_closing() {  # "N passed, N failed": the last line, exactly
  local last
  last=$(tail -n 1 "$out")
  [[ $last == "$1" ]] || failed "closing line '$last', expected '$1'"
}
expect_line() {  # an extended regular expression some line must match
  grep -Eq "$1" "$out" || failed "no line matches /$1/"
}
expect_no_line() {
  if grep -Eq "$1" "$out"; then failed "a line matches /$1/"; fi
}
expect_stores_stopped() {
  local started stopped
  started=$(grep -c '^start ' "$tmp/stores.log" || true)
  stopped=$(grep -c '^stop ' "$tmp/stores.log" || true)
  ((started == stopped)) || failed "stores started $started times, stopped $stopped times"
}
end_case() {
  if ((failures == failures_before)); then
    echo "ok: $case"
  else
    echo "----- scripts/test printed:"
    cat "$out"
    echo "-----"
  fi
}

# ---- the cases ----------------------------------------------------------------------------------
begin_case "an empty stage list is an error (exit 2) that runs nothing"
run IDEMGATE_TEST_STAGES=
expect_exit 2
expect_line "no stage to run"
expect_no_line "^== deps"
end_case

begin_case "a blank stage list is an error"
run "IDEMGATE_TEST_STAGES=   "
expect_exit 2
end_case

begin_case "an unknown stage is an error (exit 2) that runs nothing"
run "IDEMGATE_TEST_STAGES=asan nonsense"
expect_exit 2
expect_line "unknown stage 'nonsense'"
expect_no_line "^== deps"
end_case

begin_case "a job count that is not a positive number is an error"
run IDEMGATE_TEST_JOBS=0
expect_exit 2
expect_line "IDEMGATE_TEST_JOBS must be a positive number"
end_case

begin_case "a healthy tree passes, with the table and the closing line"
run
expect_exit 0
expect_line "^stage +run +passed +failed +skipped +wall +result$"
expect_line "^asan +$healthy +$healthy +0 +0 +[0-9]+ s +passed$"
expect_line "^total +$healthy +$healthy +0 +0 +[0-9]+ s$"
expect_closing "$healthy passed, 0 failed"
expect_stores_stopped
end_case

begin_case "a configure error (broken CMakeLists.txt) fails the run"
cp "$tree/CMakeLists.txt" "$tmp/CMakeLists.txt.good"
echo 'this_is_not_a_cmake_command()' >>"$tree/CMakeLists.txt"
run
expect_exit nonzero
expect_line "^asan .* FAILED"
expect_closing "0 passed, 1 failed"
expect_stores_stopped
cp "$tmp/CMakeLists.txt.good" "$tree/CMakeLists.txt"
end_case

begin_case "a compile error fails the run"
echo 'int main() { return }' >"$tree/tests/probe/broken.cpp"
cp "$tree/tests/$first.cmake" "$tmp/first.cmake.good"
echo "idemgate_test(broken_probe_test unit SOURCES probe/broken.cpp)" >>"$tree/tests/$first.cmake"
run
expect_exit nonzero
expect_line "^asan .* FAILED"
expect_closing "0 passed, 1 failed"
cp "$tmp/first.cmake.good" "$tree/tests/$first.cmake"
end_case

begin_case "a deleted test fragment fails the run (tests/CMakeLists.txt includes it without OPTIONAL)"
mv "$tree/tests/$first.cmake" "$tmp/first.cmake.moved"
run
expect_exit nonzero
expect_closing "0 passed, 1 failed"
mv "$tmp/first.cmake.moved" "$tree/tests/$first.cmake"
end_case

begin_case "a failing scripts/install-deps fails the run before any stage"
printf '#!/usr/bin/env bash\nexit 1\n' >"$tree/scripts/install-deps"
run
expect_exit nonzero
expect_line "^deps .* FAILED"
expect_line "^asan .* not run \\(deps failed\\)$"
expect_closing "0 passed, 1 failed"
printf '#!/usr/bin/env bash\nexit 0\n' >"$tree/scripts/install-deps"
end_case

begin_case "a failing test fails the run and is counted"
echo "add_test(NAME probe_fails COMMAND false)" >>"$tree/tests/$first.cmake"
run
expect_exit nonzero
expect_line "^asan +$((healthy + 1)) +$healthy +1 +0 .*FAILED"
expect_closing "$healthy passed, 1 failed"
cp "$tmp/first.cmake.good" "$tree/tests/$first.cmake"
end_case

begin_case "ctest arguments that select no test fail the run"
run -- -R no_test_has_this_name
expect_exit nonzero
expect_closing "0 passed, 1 failed"
end_case

cat >>"$tree/tests/$first.cmake" <<'CMAKE'
add_test(NAME probe_skips COMMAND sh -c "echo 'skipped: the probe tool is not installed'; exit 77")
set_tests_properties(probe_skips PROPERTIES SKIP_RETURN_CODE 77)
CMAKE

begin_case "a skipped test fails the run in CI"
run CI=true
expect_exit nonzero
expect_line "probe_skips"
expect_line "^asan +$((healthy + 1)) +$healthy +1 +0 .*FAILED"
expect_closing "$healthy passed, 1 failed"
end_case

begin_case "a skipped test is reported, not fatal, outside CI"
run
expect_exit 0
expect_line "WARNING: 1 tests SKIPPED"
expect_line "skipped: probe_skips \\(SKIP_RETURN_CODE=77: skipped: the probe tool is not installed\\)"
expect_line "^asan +$healthy +$healthy +0 +1 .*passed \\(1 skipped\\)"
expect_closing "$healthy passed, 0 failed"
end_case

begin_case "a skipped test the stage allows passes in CI"
cp "$tree/scripts/test" "$tmp/test.good"
sed -i 's/^may_skip_asan=()$/may_skip_asan=(probe_skips)/' "$tree/scripts/test"
if cmp -s "$tree/scripts/test" "$tmp/test.good"; then failed "scripts/test has no may_skip_asan=() line"; fi
run CI=true
expect_exit 0
expect_closing "$healthy passed, 0 failed"
cp "$tmp/test.good" "$tree/scripts/test"
end_case

echo "$cases cases, $failures failures"
((failures == 0))
