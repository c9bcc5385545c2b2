"""One cc_test per *_test.cc file, named after the file."""

def tessera_tests(deps, tags = [], data = [], main = "//tests:catch_main"):
    """Declares a cc_test for every *_test.cc in the package; `main` holds main()."""
    for src in native.glob(["*_test.cc"]):
        native.cc_test(
            name = src[:-len(".cc")],
            srcs = [src],
            deps = deps + [main, "//tests:testing", "@catch2"],
            tags = tags,
            data = data,
        )
