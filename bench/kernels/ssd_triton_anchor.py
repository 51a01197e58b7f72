#!/usr/bin/env python3
"""mamba_ssm's Triton SSD chunk scan as the anchor of our SsdChunkScan (issue 45, item 5).

Times `mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined` (the kernel
vLLM's and SGLang's Mamba2 prefill descends from) on the Mamba dimensions that
bench/kernels/cuda_kernels_bench.cc uses for our scan, plus the 0.93B model's:

  granite-4.0-h-small   128 heads x head_dim 64, d_state 128, 1 group, chunk 256
  1b (0.93B, gen_model) 64 heads x head_dim 64, d_state 128, 8 groups, chunk 256

at 2K / 8K / 32K tokens (batch 1), bf16 inputs (--dtypes bf16,fp32 adds fp32, what
our benchmark's scan reads; the JSON says which), dt as given (no softplus, no bias), D per head, final
state returned (ours writes it too). Inputs are uniform as in the C++ benchmark
(x, B, C, D in [-1, 1], dt in [0.01, 0.1], A in [-2, -0.5]), never zeros.

Before any timing, a correctness check on small shapes (several chunks, a
partial last chunk, groups > 1, the timed dimensions): the Triton output and final
state against a float64 sequential recurrence in PyTorch (h_t = exp(dt_t A) h_{t-1} +
dt_t x_t B_t^T, y_t = h_t C_t + D x_t), by ||out - ref|| / ||ref||: bf16 inputs
must land under 1e-2 (--check-fp32: fp32 inputs under 5e-3, Triton's dots may
run in tf32), NaN never passes. A failed check exits 1 before timing.

mamba_ssm comes from its pure-Python wheel (tools/gpu_bundle/anchors/
build_wheels.sh mamba: MAMBA_SKIP_CUDA_BUILD, no selective_scan_cuda). Its
package __init__ imports that CUDA extension, which the Triton SSD path does not
need: we register an empty `mamba_ssm` package object (its __path__ only) in
sys.modules, so importing `mamba_ssm.ops.triton.ssd_combined` runs the
subpackages' (empty) __init__ files and the Triton modules, never the top-level
__init__. Needs torch, triton, einops, packaging (the GPU machine has them).

  python3 bench/kernels/ssd_triton_anchor.py --mamba gpu_bundle/anchors/mamba_ssm-2.3.2.post1-py3-none-any.whl
  python3 bench/kernels/ssd_triton_anchor.py --mamba WHEEL --self-test   # no GPU: the import path and
                                              # our reference against mamba_ssm's own PyTorch reference

Prints one `JSON {...}` line per shape (and one for the check). Without a GPU
(or without torch / triton) it prints `SKIP: <reason>` and exits 0.
Timing: triton.testing.do_bench (CUDA events, L2 flushed between calls),
median of --rep-ms of calls after --warmup-ms.
"""

import argparse
import atexit
import importlib
import importlib.machinery
import json
import os
import shutil
import sys
import tempfile
import types
import zipfile

SHAPES = {
    # name: (nheads, headdim, dstate, ngroups, chunk)
    "granite-4.0-h-small": (128, 64, 128, 1, 256),
    "1b": (64, 64, 128, 8, 256),
}
# The GPU check's shapes: the timed dimensions (so Triton autotunes nothing more
# than the timing needs), a partial last chunk, 8 groups on the 1b shape.
CHECK_SHAPES = [
    # (seqlen, nheads, headdim, dstate, ngroups, chunk)
    (600, 64, 64, 128, 8, 256),
    (300, 128, 64, 128, 1, 256),
]
# --self-test (CPU): smaller shapes as well, other chunk sizes and group counts.
SELF_TEST_SHAPES = [(200, 4, 32, 64, 2, 64), (300, 8, 64, 128, 1, 128)] + CHECK_SHAPES
TOL = {"bf16": 1e-2, "fp32": 5e-3}


def skip(reason):
    print(f"SKIP: {reason}")
    sys.stdout.flush()
    sys.exit(0)


def mamba_root(path):
    """The directory that holds the `mamba_ssm` package: `path` itself, or a wheel unpacked to a temp dir."""
    if path.endswith(".whl"):
        dest = tempfile.mkdtemp(prefix="hs-mamba-ssm-")
        atexit.register(shutil.rmtree, dest, True)
        with zipfile.ZipFile(path) as z:
            z.extractall(dest)
        return dest
    return path


def import_ssd_combined(root):
    """mamba_ssm.ops.triton.ssd_combined from `root`, without mamba_ssm/__init__.py (and its CUDA extension)."""
    spec = importlib.machinery.PathFinder.find_spec("mamba_ssm", [root] if root else None)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"no mamba_ssm package under {root or 'sys.path'}")
    pkg = types.ModuleType("mamba_ssm")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__file__ = None
    pkg.__version__ = "unknown"
    init = os.path.join(pkg.__path__[0], "__init__.py")
    if os.path.exists(init):
        for line in open(init):
            if line.startswith("__version__"):
                pkg.__version__ = line.split("=", 1)[1].strip().strip("\"'")
    sys.modules["mamba_ssm"] = pkg
    mod = importlib.import_module("mamba_ssm.ops.triton.ssd_combined")
    for ext in ("selective_scan_cuda", "causal_conv1d_cuda"):
        if ext in sys.modules:
            raise ImportError(f"the Triton SSD path imported the CUDA extension {ext}")
    return mod, pkg.__version__


def reference(x, dt, A, B, C, D):
    """float64 sequential recurrence; x (b,l,h,p), dt (b,l,h), A (h), B/C (b,l,g,n), D (h). Returns y, final state."""
    import torch

    x, dt, A, B, C, D = (t.detach().to("cpu", torch.float64) for t in (x, dt, A, B, C, D))
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    Bh = B.repeat_interleave(h // g, dim=2)  # (b,l,h,n): head i reads group i // (h / g)
    Ch = C.repeat_interleave(h // g, dim=2)
    state = torch.zeros(b, h, p, n, dtype=torch.float64)
    y = torch.empty(b, l, h, p, dtype=torch.float64)
    for t in range(l):
        decay = torch.exp(dt[:, t] * A)  # (b,h)
        state = state * decay[:, :, None, None] + (dt[:, t, :, None, None] * x[:, t, :, :, None]) * Bh[:, t, :, None, :]
        y[:, t] = torch.einsum("bhpn,bhn->bhp", state, Ch[:, t]) + D[None, :, None] * x[:, t]
    return y, state


def inputs(seqlen, nheads, headdim, dstate, ngroups, dtype, device, seed):
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)

    def uni(shape, lo, hi, dt_=dtype):
        return (torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo).to(device=device, dtype=dt_)

    x = uni((1, seqlen, nheads, headdim), -1, 1)
    dt = uni((1, seqlen, nheads), 0.01, 0.1)
    A = uni((nheads,), -2, -0.5, torch.float32)
    B = uni((1, seqlen, ngroups, dstate), -1, 1)
    C = uni((1, seqlen, ngroups, dstate), -1, 1)
    D = uni((nheads,), -1, 1, torch.float32)
    return x, dt, A, B, C, D


def rel_err(out, ref):
    import torch

    out = out.detach().to("cpu", torch.float64)
    if not torch.isfinite(out).all():
        return float("nan")
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref))


def self_test(ssd):
    """No GPU: our reference against mamba_ssm's own PyTorch reference (ssd_chunk_scan_combined_ref) on the CPU."""
    import torch

    ok = True
    for seqlen, h, p, n, g, chunk in SELF_TEST_SHAPES:
        seqlen -= seqlen % chunk  # their reference takes whole chunks only
        x, dt, A, B, C, D = inputs(seqlen, h, p, n, g, torch.float32, "cpu", seed=seqlen)
        ref, _ = reference(x, dt, A, B, C, D)
        theirs = ssd.ssd_chunk_scan_combined_ref(x, dt, A, B, C, chunk, D=D)
        err = rel_err(theirs, ref)
        passed = err == err and err < 1e-4
        ok &= passed
        print("JSON " + json.dumps({"anchor": "mamba_ssm_ref_vs_ours_cpu", "seqlen": seqlen, "nheads": h, "headdim": p,
                                    "dstate": n, "ngroups": g, "chunk": chunk, "rel_err": err, "tol": 1e-4,
                                    "passed": passed}))
    return ok


def check(ssd, device, fp32):
    """The Triton kernel against the float64 reference on CHECK_SHAPES, bf16 inputs (and fp32 with --check-fp32)."""
    import torch

    ok = True
    dtypes = [("bf16", torch.bfloat16)] + ([("fp32", torch.float32)] if fp32 else [])
    for seqlen, h, p, n, g, chunk in CHECK_SHAPES:
        for name, dtype in dtypes:
            x, dt, A, B, C, D = inputs(seqlen, h, p, n, g, dtype, device, seed=1000 + seqlen)
            y, final = ssd.mamba_chunk_scan_combined(x, dt, A, B, C, chunk, D=D, return_final_states=True)
            torch.cuda.synchronize()
            ref_y, ref_state = reference(x, dt, A, B, C, D)
            ey, es = rel_err(y, ref_y), rel_err(final, ref_state)
            passed = ey == ey and es == es and max(ey, es) < TOL[name]
            ok &= passed
            print("JSON " + json.dumps({"anchor": "mamba_ssm_triton_ssd_check", "dtype": name, "seqlen": seqlen,
                                        "nheads": h, "headdim": p, "dstate": n, "ngroups": g, "chunk": chunk,
                                        "rel_err_y": ey, "rel_err_state": es, "tol": TOL[name], "passed": passed}))
    return ok


def bench(ssd, device, shape, seqlen, dtype, warmup_ms, rep_ms):
    import torch
    import triton

    h, p, n, g, chunk = SHAPES[shape]
    tdtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    x, dt, A, B, C, D = inputs(seqlen, h, p, n, g, tdtype, device, seed=seqlen)

    def run():
        return ssd.mamba_chunk_scan_combined(x, dt, A, B, C, chunk, D=D, return_final_states=True)

    y, _ = run()  # compile and autotune outside the timing
    torch.cuda.synchronize()
    if not torch.isfinite(y).all():
        raise RuntimeError(f"{shape} {seqlen}: non-finite output")
    ms = triton.testing.do_bench(run, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    return {"anchor": "mamba_ssm_triton_ssd", "shape": shape, "seqlen": seqlen, "batch": 1, "nheads": h,
            "headdim": p, "dstate": n, "ngroups": g, "chunk": chunk, "dtype": dtype, "ms": ms,
            "tok_s": seqlen / (ms * 1e-3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mamba", default=os.environ.get("HS_MAMBA_SSM", ""),
                    help="mamba_ssm wheel, or the directory holding the mamba_ssm package (default: sys.path)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--seqlens", default="2048,8192,32768")
    ap.add_argument("--dtypes", default="bf16",
                    help="input dtypes to time, bf16 and/or fp32 (our benchmark's scan reads fp32; each dtype "
                         "is one more Triton compile and autotune)")
    ap.add_argument("--warmup-ms", type=float, default=25)
    ap.add_argument("--rep-ms", type=float, default=200)
    ap.add_argument("--self-test", action="store_true",
                    help="no GPU needed: import the scan, check our reference against mamba_ssm's PyTorch one")
    ap.add_argument("--check-fp32", action="store_true",
                    help="check fp32 inputs too (one more Triton compile and autotune per kernel)")
    ap.add_argument("--out", default=None, help="also append the JSON lines to this file")
    args = ap.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"--shapes: unknown shape {s!r} (known: {', '.join(SHAPES)})")
    try:
        seqlens = [int(s) for s in args.seqlens.split(",") if s]
    except ValueError:
        ap.error(f"--seqlens: not a list of integers: {args.seqlens!r}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    if not dtypes or any(d not in ("bf16", "fp32") for d in dtypes):
        ap.error(f"--dtypes: give bf16 and/or fp32, not {args.dtypes!r}")
    if not seqlens or min(seqlens) <= 0:
        ap.error("--seqlens: give at least one positive length")
    if args.mamba and not os.path.exists(args.mamba):
        ap.error(f"--mamba: {args.mamba} does not exist")

    try:
        import torch
    except ImportError as e:
        skip(f"no torch ({e})")
    if not args.self_test and not torch.cuda.is_available():
        skip("no CUDA GPU visible to torch")
    try:
        ssd, version = import_ssd_combined(mamba_root(args.mamba) if args.mamba else None)
    except ImportError as e:
        if args.self_test:
            print(f"FAILED: cannot import mamba_ssm's Triton SSD scan: {e}")
            return 1
        skip(f"cannot import mamba_ssm's Triton SSD scan: {e}")
    import triton

    out = open(args.out, "a") if args.out else None

    def emit(d):
        line = json.dumps(d)
        print("JSON " + line)
        sys.stdout.flush()
        if out:
            out.write(line + "\n")
            out.flush()

    if args.self_test:
        ok = self_test(ssd)
        print(f"self-test (mamba_ssm {version}, triton {triton.__version__}, torch {torch.__version__}): "
              f"{'passed' if ok else 'FAILED'}")
        return 0 if ok else 1

    device = "cuda"
    dev = torch.cuda.get_device_name(0)
    print(f"device: {dev}; mamba_ssm {version}, triton {triton.__version__}, torch {torch.__version__}")
    if not check(ssd, device, args.check_fp32 or "fp32" in dtypes):
        print("FAILED: the Triton scan does not match the float64 reference; no timing")
        return 1
    for shape in shapes:
        for dtype in dtypes:
            for seqlen in seqlens:
                r = bench(ssd, device, shape, seqlen, dtype, args.warmup_ms, args.rep_ms)
                r.update({"device": dev, "mamba_ssm": version, "triton": triton.__version__,
                          "torch": torch.__version__})
                emit(r)
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
