# Sourced by the tests that run binaries under mpirun, after `cd` into their working
# directory WORK: the environment OpenMPI needs in the test sandbox, and mpi_run.

# OpenMPI puts its session directory under TMPDIR. One OpenMP thread per rank: the ranks
# alone already outnumber the cores.
export TMPDIR="$WORK"
export OMP_NUM_THREADS=1
# Under --config=asan, LeakSanitizer reports ~120 KB per rank at exit. The frames it can
# name are in libmpi, libopen-pal or glibc; most have no symbols, likely OpenMPI's unloaded
# plugins, so they cannot be suppressed by name. No leak stack seen had a Tessera frame.
# Address and UB checks stay on.
if [ -n "${ASAN_OPTIONS:-}" ]; then
  export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
fi

# mpi_run SECONDS NP BINARY ARGS...: BINARY on NP ranks with rank-tagged output, killed
# after SECONDS (exit code 124).
mpi_run() {
  limit=$1
  np=$2
  shift 2
  timeout "$limit" mpirun --allow-run-as-root --oversubscribe --tag-output -np "$np" "$@"
}
