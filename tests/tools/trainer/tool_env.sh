# Sourced by the trainer's shell tests: `fail`, the tool binaries from the runfiles, and a
# fresh working directory. Set RUNFILES and WORK before sourcing.

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

TRAIN="$RUNFILES/tools/train"
PREPARE="$RUNFILES/tools/prepare_data"
[ -x "$TRAIN" ] || fail "no train binary at $TRAIN"
[ -x "$PREPARE" ] || fail "no prepare_data binary at $PREPARE"

rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"
