"""fuzz_test: one reader's fuzz test (tests/fuzz/fuzz_target.h)."""

def fuzz_test(name, deps, seconds = 8):
    """<name>_fuzz_test from <name>_fuzz.cc and the seed corpus corpus/<name>/."""
    native.cc_test(
        name = name + "_fuzz_test",
        srcs = [name + "_fuzz.cc"],
        deps = deps + [":fuzz_main"],
        data = native.glob(["corpus/" + name + "/*"]),
        args = [
            "--corpus",
            "tests/fuzz/corpus/" + name,
            "--seconds",
            str(seconds),
        ],
        size = "small",
    )
