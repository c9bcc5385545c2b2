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

# write_text FILE WORDS: WORDS words of varied text, 11 to a line, from a fixed generator
# (ZX81 LCG: exact in awk's doubles), so every run trains on the same bytes.
write_text() {
  awk -v count="$2" 'BEGIN {
    n = split("the of and to in is was that for it with as his on be at by this had not are " \
              "but from or have an they which one you were her all she there would their we " \
              "him been has when who will more no if out so said what up its about into than " \
              "them can only other new some could time these two may then do first any my now " \
              "such like our over man me even most made after also did many before must", w, " ")
    x = 1
    for (i = 0; i < count; i++) {
      x = (x * 75 + 74) % 65537
      printf "%s%s", w[x % n + 1], (i % 11 == 10 ? ".\n" : " ")
    }
  }' >"$1"
}

# prepare_chars FILE: char-level token shards of FILE in data/, and VOCAB set to the char
# vocabulary's size (the distinct bytes of FILE).
prepare_chars() {
  "$PREPARE" --input "$1" --output data --tokenizer char >prepare.log 2>&1 ||
    fail "prepare_data failed: $(cat prepare.log)"
  VOCAB=$(sed -n 's/^prepare_data: .*vocab size \([0-9]*\).*/\1/p' prepare.log)
  [ -n "$VOCAB" ] || fail "no vocab size in the prepare_data output: $(cat prepare.log)"
}

rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"
