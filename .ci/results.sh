# Sourced by the CI steps: count_results LOG STATUS prints "N passed, N failed" from the
# per-target lines of a `bazel test` log and its exit status, and sets passed and failed.
count_results() {
  passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$1")
  failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|INCOMPLETE|FLAKY)' "$1")
  if [[ $2 -ne 0 && $failed -eq 0 ]]; then
    failed=1  # the build itself failed: no test could run
  fi
}
