"""Detects the CUDA toolkit and exposes it as @local_config_cuda.

The generated repository always exists. `defs.bzl` says whether nvcc and cuDNN were found,
so the CUDA backend builds whenever the toolkit and cuDNN are installed and the CPU-only stub
is used otherwise. Environment: CUDA_PATH (default /usr/local/cuda); CUDNN_PATH (a cuDNN
outside the toolkit and the system's directories: its include/ and lib/);
TESSERA_REQUIRE_CUDA=1 (set by --config=cuda) turns a missing toolkit or cuDNN into a build
error.
"""

_HEADERS_BUILD = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/*.h", "include/*.hpp", "include/crt/**", "include/nv/**"]),
    includes = ["include"],
)

cc_library(
    name = "cudart",
    linkopts = ["-L{lib}", "-lcudart_static", "-ldl", "-lpthread", "-lrt"],
    deps = [":cuda_headers"],
)

# NCCL ships as a shared library only; the rpath lets binaries find it where it was found.
# It needs no driver to load, so binaries linking it still start on machines without a GPU.
# cuBLASLt, shared like NCCL (there is no static build of it here); loads without a driver.
cc_library(
    name = "cublaslt",
    linkopts = ["-L{lib}", "-lcublasLt", "-Wl,-rpath,{lib}"],
    deps = [":cuda_headers"],
)

# cuDNN 9 (kernels/cuda/cudnn_graph.cu): shared, loads its engine libraries on first use.
cc_library(
    name = "cudnn",
    linkopts = ["-L{cudnn_lib}", "-lcudnn", "-Wl,-rpath,{cudnn_lib}"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "nccl",
    linkopts = ["-L{lib}", "-lnccl", "-Wl,-rpath,{lib}"],
    deps = [":cuda_headers"],
)
"""

# Where cuDNN's header and library may be, as (include, lib) pairs after $CUDNN_PATH's: inside
# the toolkit (NVIDIA's tarball copied in), or the system's (Debian's and NVIDIA's packages;
# the compilers search those include directories by default).
def _cudnn_places(cuda_path):
    return [
        (cuda_path + "/include", cuda_path + "/lib64"),
        ("/usr/include", "/usr/lib/x86_64-linux-gnu"),
        ("/usr/include/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"),
    ]

def _cuda_configure_impl(rctx):
    cuda_path = rctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nvcc = rctx.path(cuda_path + "/bin/nvcc")
    places = _cudnn_places(cuda_path)
    cudnn_path = rctx.os.environ.get("CUDNN_PATH", "")
    if cudnn_path:
        places = [(cudnn_path + "/include", cudnn_path + "/lib")] + places
    cudnn_lib = None
    for include, lib in places:
        if rctx.path(include + "/cudnn.h").exists:
            cudnn_lib = lib
            break
    found = nvcc.exists and cudnn_lib != None
    searched = ", ".join([include for include, _ in places])
    missing = "nvcc at %s" % nvcc if not nvcc.exists else "cudnn.h in %s" % searched
    if not found and rctx.os.environ.get("TESSERA_REQUIRE_CUDA", "0") == "1":
        fail("--config=cuda needs the CUDA toolkit with cuDNN: expected %s, found nothing (set CUDA_PATH or CUDNN_PATH)" % missing)
    if nvcc.exists and not found:
        # The CUDA backend needs cuDNN (kernels/cuda/cudnn_graph.cu): without it, the CPU-only stub.
        print("Tessera: nvcc found but no cuDNN (no cudnn.h in %s): building without CUDA" % searched)
    if found:
        rctx.symlink(cuda_path + "/include", "include")
        build = _HEADERS_BUILD.replace("{cudnn_lib}", cudnn_lib)
        rctx.file("BUILD", build.replace("{lib}", cuda_path + "/lib64"))
    else:
        rctx.file("BUILD", "package(default_visibility = [\"//visibility:public\"])\n")
    rctx.file("defs.bzl", "CUDA_FOUND = %s\nNVCC = \"%s\"\n" % (found, nvcc))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH", "CUDNN_PATH", "TESSERA_REQUIRE_CUDA"],
    local = True,
)
