#!/usr/bin/env python3
"""Our CUDA GatedDeltaPrefill vs flash-linear-attention's chunk_gated_delta_rule on the same shapes
(issue 50's GPU anchor for the Gated DeltaNet prefill). Needs a GPU machine with torch + triton; fla is
carried as two wheels because the GPU machine has no network:

    # here (network): the wheels, pure Python, ~1.5 MB
    python3 -m pip download flash-linear-attention fla-core --no-deps -d gpu_bundle/anchors
    bazel build -c opt //bench/kernels:gdn_cuda_bench
    # there:
    python3 bench/kernels/gdn_fla_anchor.py [--fla-wheels gpu_bundle/anchors] \\
        --ours bazel-bin/bench/kernels/gdn_cuda_bench [--seqlens 2048,8192] [--out result.json]

(--ours may also be the GPU bundle's launcher, bin/gdn_cuda_bench.) The wheels are installed with
--no-deps into a temporary directory that is put first on sys.path (nothing is installed into the
machine's Python); fla needs only torch, triton and einops, which PyTorch's environments carry (the
script says which import failed otherwise). Without torch or a GPU it prints `SKIP: <reason>` and exits 0.

Shapes: Qwen3-Next-80B-A3B's Gated DeltaNet (16 key heads, 32 value heads, dk = dv = 128), one
sequence of 2K and 8K tokens, chunk 64 (both), l2-normalised q and k inside the kernel
(use_qk_l2norm_in_kernel, as Qwen3-Next calls it), zero initial state, final state returned. Both
sides get fp32 q/k/v/g/beta (ours computes in fp32 only); fla is also timed with bf16 q/k/v (what
serving engines feed it), reported as a second column, never as the ratio's denominator.

Timing (both sides): one untimed call, then the best of --reps batches of --calls calls, each batch
ended by a device synchronisation (host clock; ours: gdn_cuda_bench's own loop, which does the same).
The result: per length, ms per call for each side and ours / fla as a time ratio (< 1: ours faster)
and as the throughput ratio fla_ms / ours_ms (goal >= 1.0). Prints a table and `JSON {...}`.

--check (default on) also compares fla's fp32 output with transformers' formula on a short prefix
(torch, 256 tokens) so that a mis-set argument (scale, layout, gate space) shows as a large difference
instead of a fast wrong number.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

# Where the GPU bundle's anchors carry their wheels (tools/gpu_bundle/anchors): used when --fla-wheels
# is not given and fla wheels are there.
DEFAULT_WHEELS = "gpu_bundle/anchors"
QWEN3_NEXT = dict(n_k_heads=16, n_v_heads=32, dk=128, dv=128)
CHUNK = 64


def install_wheels(wheel_dir, pattern="*.whl"):
    """pip install --no-deps --target TMP the wheels of `wheel_dir`; TMP goes first on sys.path."""
    wheels = sorted(glob.glob(os.path.join(wheel_dir, pattern)))
    if not wheels:
        sys.exit(f"no .whl in {wheel_dir} (pip download flash-linear-attention fla-core --no-deps -d DIR)")
    target = tempfile.mkdtemp(prefix="fla-site-")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", "--target", target,
                    *wheels], check=True)
    sys.path.insert(0, target)
    return target


def inputs(torch, seqlen, shape, dtype, seed=0):
    """q, k [1, T, n_k, dk], v [1, T, n_v, dv] in `dtype`; g (log decay <= 0) and beta [1, T, n_v] fp32."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    nk, nv, dk, dv = shape["n_k_heads"], shape["n_v_heads"], shape["dk"], shape["dv"]

    def u(*s, lo=-1.0, hi=1.0):
        return torch.rand(*s, device="cuda", generator=gen, dtype=torch.float32) * (hi - lo) + lo

    q, k, v = u(1, seqlen, nk, dk), u(1, seqlen, nk, dk), u(1, seqlen, nv, dv)
    g, beta = u(1, seqlen, nv, lo=-0.1, hi=0.0), u(1, seqlen, nv, lo=0.0, hi=1.0)
    return q.to(dtype), k.to(dtype), v.to(dtype), g, beta


def best_ms(torch, fn, reps, calls):
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e3


def reference(torch, q, k, v, g, beta):
    """transformers' torch_recurrent_gated_delta_rule (l2norm of q and k, scale dk^-0.5), fp32, token by token."""
    def l2norm(x):  # transformers' l2norm(x, dim=-1, eps=1e-6)
        x = x.float()
        return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)

    q, k = l2norm(q), l2norm(k)
    rep = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    q = q * q.shape[-1] ** -0.5
    T, H, dk, dv = q.shape[1], q.shape[2], q.shape[3], v.shape[3]
    S = torch.zeros(H, dk, dv, device=q.device)
    out = torch.empty(T, H, dv, device=q.device)
    for t in range(T):
        S = S * g[0, t].exp()[:, None, None]
        kv = torch.einsum("hk,hkv->hv", k[0, t], S)
        delta = (v[0, t].float() - kv) * beta[0, t][:, None]
        S = S + k[0, t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hk,hkv->hv", q[0, t], S)
    return out[None]


def run_ours(binary, seqlens, shape, reps, calls):
    cmd = [binary, f"--seqlens={','.join(map(str, seqlens))}", f"--reps={reps}", f"--calls={calls}",
           f"--chunk_size={CHUNK}"] + [f"--{k}={v}" for k, v in shape.items()]
    p = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(p.stdout + p.stderr)
    if p.returncode != 0:
        sys.exit(f"{binary} failed (rc {p.returncode})")
    line = next(ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("JSON "))
    res = json.loads(line[5:])
    if res.get("emulated"):
        sys.exit("gdn_cuda_bench ran on the emulator: no GPU number")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", required=True, help="gdn_cuda_bench binary (or the GPU bundle's bin/ launcher)")
    ap.add_argument("--fla-wheels", default=None,
                    help=f"directory of the fla wheels (default: {DEFAULT_WHEELS} when it has them, else fla importable)")
    ap.add_argument("--seqlens", default="2048,8192")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--no-check", dest="check", action="store_false")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    a = ap.parse_args()
    seqlens = [int(x) for x in a.seqlens.split(",") if x]

    if a.fla_wheels:
        install_wheels(a.fla_wheels)
    elif os.path.isdir(DEFAULT_WHEELS) and glob.glob(os.path.join(DEFAULT_WHEELS, "fla*.whl")):
        install_wheels(DEFAULT_WHEELS, "fla*.whl")
    try:
        import torch
    except ImportError as e:
        print(f"SKIP: {e}")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (this script only measures on a GPU)")
        return 0
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as e:
        sys.exit(f"import of fla failed: {e} (fla needs torch, triton, einops)")

    import fla

    def fla_call(q, k, v, g, beta):
        return chunk_gated_delta_rule(q, k, v, g, beta, initial_state=None, output_final_state=True,
                                      use_qk_l2norm_in_kernel=True)

    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "fla": getattr(fla, "__version__", "?"), "shape": QWEN3_NEXT, "chunk": CHUNK, "rows": []}
    if a.check:
        q, k, v, g, beta = inputs(torch, 256, QWEN3_NEXT, torch.float32, seed=1)
        o, _ = fla_call(q, k, v, g, beta)
        ref = reference(torch, q, k, v, g, beta)
        diff = (o.float() - ref).abs().max().item()
        res["fla_check_max_abs_diff_fp32_256"] = diff
        print(f"fla fp32 vs transformers' recurrent rule, 256 tokens: max |diff| {diff:.3g}", file=sys.stderr)
        if not diff < 1e-2:
            sys.exit("fla's output does not match the rule: check the arguments before timing")

    ours = {r["seqlen"]: r for r in run_ours(a.ours, seqlens, QWEN3_NEXT, a.reps, a.calls)["prefill"]}
    for L in seqlens:
        row = {"seqlen": L, "ours_ms": ours[L]["ms"]}
        for name, dtype in (("fla_fp32_ms", torch.float32), ("fla_bf16_ms", torch.bfloat16)):
            q, k, v, g, beta = inputs(torch, L, QWEN3_NEXT, dtype)
            row[name] = best_ms(torch, lambda: fla_call(q, k, v, g, beta), a.reps, a.calls)
        row["ours_over_fla_time"] = row["ours_ms"] / row["fla_fp32_ms"]
        row["throughput_ratio"] = row["fla_fp32_ms"] / row["ours_ms"]
        res["rows"].append(row)

    print(f"device {res['device']}, fla {res['fla']}, Qwen3-Next GDN (16 k / 32 v heads, 128 x 128), chunk {CHUNK}")
    print("| tokens | ours ms | fla fp32 ms | fla bf16 ms | ours / fla (time) | throughput ratio (goal >= 1) |")
    print("|---|---|---|---|---|---|")
    for r in res["rows"]:
        print(f"| {r['seqlen']} | {r['ours_ms']:.3f} | {r['fla_fp32_ms']:.3f} | {r['fla_bf16_ms']:.3f} | "
              f"{r['ours_over_fla_time']:.2f} | {r['throughput_ratio']:.2f} |")
    print("JSON " + json.dumps(res))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
