#!/usr/bin/env python3
"""summarize.py's anchor rows on synthetic run.sh logs (no GPU; standard library only).

  python3 tools/gpu_bundle/anchors/summarize_anchors_test.py
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

SUMMARIZE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "summarize.py")

KERNELS = {"copy_gbs": 4000, "hbm_peak_gbs": 4800, "ssu": [], "matmul": [],
           "ssd": [{"seqlen": 2048, "ms": 4.0, "tok_s": 5.12e5}, {"seqlen": 8192, "ms": 16.0, "tok_s": 5.12e5}]}
OURS_BENCH = {"decode": {"1": {"tok_s": 1341.0}, "64": {"tok_s": 12624.0}}, "prefill": {"2048": {"tok_s": 22000.0}}}
OURS_1B = {"decode": {"1": {"tok_s": 454.0}}, "prefill": {}}
MAMBA = [
    {"anchor": "mamba_ssm_triton_ssd_check", "dtype": "bf16", "seqlen": 600, "nheads": 64, "headdim": 64,
     "dstate": 128, "ngroups": 8, "chunk": 256, "rel_err_y": 4e-3, "rel_err_state": 3e-3, "tol": 1e-2, "passed": True},
    {"anchor": "mamba_ssm_triton_ssd", "shape": "granite-4.0-h-small", "seqlen": 2048, "nheads": 128, "headdim": 64,
     "dstate": 128, "ngroups": 1, "chunk": 256, "dtype": "bf16", "ms": 0.1, "tok_s": 2.048e7},
    {"anchor": "mamba_ssm_triton_ssd", "shape": "granite-4.0-h-small", "seqlen": 32768, "nheads": 128, "headdim": 64,
     "dstate": 128, "ngroups": 1, "chunk": 256, "dtype": "bf16", "ms": 1.0, "tok_s": 3.2768e7},
    {"anchor": "mamba_ssm_triton_ssd", "shape": "1b", "seqlen": 2048, "nheads": 64, "headdim": 64,
     "dstate": 128, "ngroups": 8, "chunk": 256, "dtype": "bf16", "ms": 0.05, "tok_s": 4.096e7},
]
LLAMA_BENCH = {"decode": {"1": {"tok_s": 2682.0}, "8": {"tok_s": 9000.0}, "64": {"tok_s": 6312.0}},
               "prefill": {"2048": {"tok_s": 44000.0}, "8192": {"tok_s": 40000.0}},
               "gpu": "NVIDIA H200, 580.1", "n_gpu_layers": -1, "version": "llama-cpp-python 0.3.36 / llama.cpp 0c1e57098bba"}
LLAMA_1B = {"decode": {"1": {"tok_s": 227.0}, "64": {"unsupported": "llama_decode returned 1"}},
            "prefill": {"8192": {"tok_s": 30000.0}}}


def run(steps, logs):
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "steps.tsv"), "w") as f:
            f.write("".join("\t".join(s) + "\n" for s in steps))
        for name, text in logs.items():
            with open(os.path.join(d, name + ".log"), "w") as f:
                f.write(text)
        r = subprocess.run([sys.executable, SUMMARIZE, "--steps", os.path.join(d, "steps.tsv"), "--logs", d],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError(r.stderr)
        return r.stdout


class AnchorRows(unittest.TestCase):
    def full(self):
        steps = [("cuda_kernels_bench", "bench", "0", "10"), ("throughput_bench", "bench", "0", "20"),
                 ("throughput_bench_1b", "bench", "0", "20"), ("ssd_triton_anchor", "anchor", "0", "60"),
                 ("llamacpp_cuda", "anchor", "0", "90")]
        logs = {
            "cuda_kernels_bench": "ssd ...\nJSON " + json.dumps(KERNELS) + "\n",
            "throughput_bench": "JSON " + json.dumps(OURS_BENCH) + "\n",
            "throughput_bench_1b": "JSON " + json.dumps(OURS_1B) + "\n",
            "ssd_triton_anchor": "device: x\n" + "".join("JSON " + json.dumps(m) + "\n" for m in MAMBA),
            "llamacpp_cuda": "== x\nLLAMACPP_JSON bench " + json.dumps(LLAMA_BENCH) + "\nLLAMACPP_JSON 1b "
                             + json.dumps(LLAMA_1B) + "\n",
        }
        return steps, logs

    def test_rows_and_ratios(self):
        out = run(*self.full())
        self.assertIn("## Anchors (same card", out)
        # ours 5.12e5 / theirs 2.048e7 = 0.025 at 2048 tokens; no figure of ours at 32768 or on the 1b shape.
        self.assertIn("| SSD chunk scan, granite-4.0-h-small (128x64, N 128, G 1), 2048 tokens: ours fp32 / "
                      "mamba_ssm Triton bf16 | 5.12e+05 tokens/s | 2.05e+07 tokens/s | 0.03x | >= 1.0x | MISSED |", out)
        self.assertIn("32768 tokens: ours fp32 / mamba_ssm Triton bf16 | not measured | 3.28e+07 tokens/s | - | "
                      ">= 1.0x | - |", out)
        self.assertIn("| SSD chunk scan, 1b (64x64, N 128, G 8), 2048 tokens: ours fp32 / mamba_ssm Triton bf16 "
                      "| not measured | 4.1e+07 tokens/s | - |", out)
        self.assertIn("| bench model (127M), bf16, decode batch 1: ours / llama.cpp CUDA | 1341.0 tok/s | "
                      "2682.0 tok/s | 0.50x | - | - |", out)
        self.assertIn("| bench model (127M), bf16, decode batch 64: ours / llama.cpp CUDA | 12624.0 tok/s | "
                      "6312.0 tok/s | 2.00x | >= 2.0x | MET |", out)
        self.assertIn("| bench model (127M), bf16, decode batch 8: ours / llama.cpp CUDA | not measured | "
                      "9000.0 tok/s | - | - | - |", out)
        self.assertIn("| bench model (127M), bf16, prefill 2048 tokens: ours / llama.cpp CUDA | 22000.0 tok/s | "
                      "44000.0 tok/s | 0.50x | - | - |", out)
        self.assertIn("| 1b model (0.93B), bf16, decode batch 1: ours / llama.cpp CUDA | 454.0 tok/s | 227.0 tok/s | "
                      "2.00x | >= 1.3x | MET |", out)
        self.assertIn("| 1b model (0.93B), bf16, prefill 8192 tokens: ours / llama.cpp CUDA | not measured | "
                      "30000.0 tok/s | - | >= 1.5x | - |", out)
        self.assertIn("- llama.cpp CUDA, 1b model (0.93B), decode batch 64: unsupported (llama_decode returned 1)", out)
        self.assertIn("- mamba_ssm Triton vs float64 reference: 1/1 checks passed, worst rel err 0.004", out)
        self.assertIn("on NVIDIA H200, 580.1", out)

    def test_failed_check_and_failed_step(self):
        steps, logs = self.full()
        bad = dict(MAMBA[0], passed=False, rel_err_y=0.5)
        logs["ssd_triton_anchor"] = "JSON " + json.dumps(bad) + "\nFAILED: the Triton scan does not match\n"
        steps[3] = ("ssd_triton_anchor", "anchor", "1", "30")
        out = run(steps, logs)
        self.assertIn("- ssd_triton_anchor: check FAILED at bf16 600 tokens x 64 heads: rel err y 0.5", out)
        self.assertIn("- ssd_triton_anchor: FAILED (exit 1) after 30 s", out)
        self.assertNotIn("SSD chunk scan, granite", out)

    def test_skips(self):
        steps = [("ssd_triton_anchor", "anchor", "0", "0"), ("llamacpp_cuda", "anchor", "0", "0")]
        logs = {"ssd_triton_anchor": "SKIP: no mamba_ssm wheel in /x (build_wheels.sh mamba)\n",
                "llamacpp_cuda": "llama-cpp-python: ...\nSKIP: no GPU (nvidia-smi -L failed)\n"}
        out = run(steps, logs)
        self.assertIn("- ssd_triton_anchor: skipped: no mamba_ssm wheel in /x (build_wheels.sh mamba)", out)
        self.assertIn("- llamacpp_cuda: skipped: no GPU (nvidia-smi -L failed)", out)

    def test_no_anchor_steps_no_section(self):
        out = run([("cuda_kernels_bench", "bench", "0", "1")], {"cuda_kernels_bench": "JSON " + json.dumps(KERNELS)})
        self.assertNotIn("Anchors", out)


if __name__ == "__main__":
    unittest.main()
