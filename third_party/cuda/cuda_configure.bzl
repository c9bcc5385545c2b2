"""Detects the CUDA toolkit and exposes it as @local_config_cuda.

The generated repository always exists. `defs.bzl` says whether nvcc and cuDNN were found,
so the CUDA backend builds whenever the toolkit and cuDNN are installed and the CPU-only stub
is used otherwise. Environment: CUDA_PATH (default /usr/local/cuda); TESSERA_REQUIRE_CUDA=1
(set by --config=cuda) turns a missing toolkit into a build error.
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
    linkopts = ["-L{lib}", "-lcudnn", "-Wl,-rpath,{lib}"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "nccl",
    linkopts = ["-L{lib}", "-lnccl", "-Wl,-rpath,{lib}"],
    deps = [":cuda_headers"],
)
"""

def _cuda_configure_impl(rctx):
    cuda_path = rctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nvcc = rctx.path(cuda_path + "/bin/nvcc")
    cudnn = rctx.path(cuda_path + "/include/cudnn.h")
    found = nvcc.exists and cudnn.exists
    missing = "nvcc at %s" % nvcc if not nvcc.exists else "cuDNN's header at %s" % cudnn
    if not found and rctx.os.environ.get("TESSERA_REQUIRE_CUDA", "0") == "1":
        fail("--config=cuda needs the CUDA toolkit with cuDNN: expected %s, found nothing (set CUDA_PATH)" % missing)
    if nvcc.exists and not cudnn.exists:
        # The CUDA backend needs cuDNN (kernels/cuda/cudnn_graph.cu): without it, the CPU-only stub.
        print("Tessera: nvcc found but no cuDNN (expected %s): building without CUDA" % cudnn)
    if found:
        rctx.symlink(cuda_path + "/include", "include")
        rctx.file("BUILD", _HEADERS_BUILD.replace("{lib}", cuda_path + "/lib64"))
    else:
        rctx.file("BUILD", "package(default_visibility = [\"//visibility:public\"])\n")
    rctx.file("defs.bzl", "CUDA_FOUND = %s\nNVCC = \"%s\"\n" % (found, nvcc))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH", "TESSERA_REQUIRE_CUDA"],
    local = True,
)
