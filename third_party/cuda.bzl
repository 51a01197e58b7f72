"""hs_cuda_library: compiles .cu files with nvcc (sm_80, sm_90) into a cc_library."""

NVCC = "/usr/local/cuda/bin/nvcc"

# Ampere (A100) and Hopper (H100/H200), plus PTX for newer GPUs to JIT from.
CUDA_GENCODE = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def hs_cuda_library(name, srcs, hdrs = [], cu_hdrs = [], deps = [], nccl = False, blas = False, visibility = None):
    """Builds `srcs` (.cu) with nvcc into object files linked by a cc_library.

    `hdrs` are plain C++ headers (no CUDA types) that C++ callers include;
    `cu_hdrs` are headers only the .cu files see. The library links cudart
    (and NCCL when `nccl` is set, cuBLAS and cuBLASLt when `blas` is set). It
    loads on machines without a GPU. `cu_hdrs` may be labels of other packages'
    headers (the params structs) that the .cu files include.
    """
    objs = []
    for src in srcs:
        obj = src[:-len(".cu")] + ".cu.o"
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + hdrs + cu_hdrs,
            outs = [obj],
            cmd = " ".join([
                NVCC,
                "-c",
                "-O3",
                "-std=c++17",
                "--expt-relaxed-constexpr",
                "-Xcompiler",
                "-fPIC",
                "-I.",
                "-I$(GENDIR)",
            ] + CUDA_GENCODE + ["$(location %s)" % src, "-o", "$@"]),
        )
        objs.append(obj)

    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["//third_party:nccl" if nccl else "//third_party:cuda_runtime"] +
               (["//third_party:cublas"] if blas else []),
        linkstatic = True,
        visibility = visibility,
    )
