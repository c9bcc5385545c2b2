"""Build rules for Tessera's CUDA code.

The CUDA backend is part of the one default build whenever the toolkit is found (so it
cannot rot); `--config=cpu` leaves it out and `--config=cuda` insists on it.
"""

load("@local_config_cuda//:defs.bzl", "CUDA_FOUND", "NVCC")

def if_cuda(if_true, if_false = []):
    """Selects `if_true` when the CUDA backend is built, `if_false` otherwise."""
    if not CUDA_FOUND:
        return if_false
    return select({
        "//third_party/cuda:cuda_off": if_false,
        "//conditions:default": if_true,
    })

def cuda_objects(name, srcs, hdrs):
    """Compiles each .cu in `srcs` with nvcc into objects usable in a cc_library's srcs.

    `hdrs` lists every header the sources include (the sandbox holds only declared files).
    Architectures come from `--define=cuda_archs=80,90` (.bazelrc): machine code for each,
    plus PTX for the last so that newer GPUs can compile it at load time. The host code's
    -march comes from `--define=cuda_host_march=...` (native by default; x86-64-v3 for the
    portable GPU bundle, tools/gpu/pack.sh). Returns the object labels; the caller puts them
    behind if_cuda().
    """
    outs = []
    for src in srcs:
        stem = src[:-len(".cu")]
        out = stem + ".cu.pic.o"
        native.genrule(
            name = name + "_" + stem.replace("/", "_"),
            srcs = [src] + hdrs,
            outs = [out],
            cmd = ("gencode=; for a in $$(echo $(cuda_archs) | tr , ' '); do " +
                   "gencode=\"$$gencode -gencode arch=compute_$$a,code=sm_$$a\"; last=$$a; done; " +
                   "gencode=\"$$gencode -gencode arch=compute_$$last,code=compute_$$last\"; " +
                   NVCC + " -c -O3 -std=c++20 -Xcompiler -fPIC " +
                   "-Xcompiler -march=$(cuda_host_march) " +
                   "-I. $$gencode $(location " + src + ") -o $@"),
            tags = ["no-remote"],
        )
        outs.append(out)
    return outs
