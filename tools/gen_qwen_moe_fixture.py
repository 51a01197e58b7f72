#!/usr/bin/env python3
"""Records one tiny transformers Qwen3NextSparseMoeBlock (router softmax, top-k,
routed SwiGLU experts as fused 3-D tensors, the shared expert scaled by
sigmoid(shared_expert_gate x); fp32, seeded, eager experts) into
tests/fixtures/gated_delta/moe_case.json, the reference of
//kernels/cpu:qwen_moe_block_test. Run with the golden venv (torch +
transformers 5.23): /work/venv-golden/bin/python tools/gen_qwen_moe_fixture.py
Shapes: hidden 32, 8 experts, top-k 2, moe_intermediate_size 16,
shared_expert_intermediate_size 24, 12 rows (the last all zeros: every router
logit 0, so all 8 probabilities tie and torch.topk's tie order decides the
experts). Qwen3-Next is recorded with norm_topk_prob false (its default, true,
is the form Qwen3.5-MoE always takes); Qwen3_5MoeSparseMoeBlock (always
renormalised) is recorded the same way into moe_case_qwen3_5.json. Weights are
redrawn from a seeded normal (the router's init, zeros, would tie every row)
and written flat, row-major, in transformers' layouts. Each file also holds
torch.topk's indices on probability vectors with ties ("topk_ties"), for both
of its CPU algorithms (partial_sort when k * 64 <= n, else nth_element)."""

import json
import os
import sys

import torch
import transformers
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m35
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
from transformers.models.qwen3_next import modeling_qwen3_next as m
from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig


def tie_cases():
    cases = []
    for n, k, pattern in (
        (8, 2, "all"),
        (8, 3, "pairs"),
        (8, 4, "all"),
        (16, 2, "all"),
        (64, 4, "pairs"),
        (128, 2, "all"),
        (128, 2, "pairs"),
        (256, 8, "all"),
        (512, 10, "pairs"),
        (512, 4, "all"),
    ):
        if pattern == "all":
            p = torch.full((n,), 1.0 / n)
        else:
            p = (torch.arange(n) // 2).float().remainder(7) / 7.0
        idx = torch.topk(p, k, dim=-1).indices
        cases.append({"n": n, "k": k, "p": [float(v) for v in p.tolist()], "indices": idx.tolist()})
    return cases


def record(config_class, block_class, file_name, **extra):
    torch.manual_seed(50)
    cfg = config_class(
        hidden_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        num_hidden_layers=1,
        hidden_act="silu",
        **extra,
    )
    assert getattr(cfg, "_experts_implementation", None) in (None, "eager")
    block = block_class(cfg).float().eval()
    with torch.no_grad():
        block.gate.weight.normal_(0.0, 0.5)
        block.experts.gate_up_proj.normal_(0.0, 0.3)
        block.experts.down_proj.normal_(0.0, 0.3)
        for lin in (block.shared_expert.gate_proj, block.shared_expert.up_proj, block.shared_expert.down_proj):
            lin.weight.normal_(0.0, 0.3)
        block.shared_expert_gate.weight.normal_(0.0, 0.3)
    rows = 12
    x = torch.randn(1, rows, cfg.hidden_size)
    x[0, rows - 1] = 0.0
    with torch.no_grad():
        y = block(x)
        _, weights, chosen = block.gate(x.reshape(-1, cfg.hidden_size))

    flat = lambda t: [float(v) for v in t.detach().reshape(-1).tolist()]
    out = {
        "transformers_version": transformers.__version__,
        "block": block_class.__name__,
        "rows": rows,
        "hidden_size": cfg.hidden_size,
        "num_experts": cfg.num_experts,
        "top_k": cfg.num_experts_per_tok,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "shared_expert_intermediate_size": cfg.shared_expert_intermediate_size,
        "norm_topk_prob": bool(getattr(cfg, "norm_topk_prob", True)),
        "router": flat(block.gate.weight),
        "experts_gate_up": flat(block.experts.gate_up_proj),
        "experts_down": flat(block.experts.down_proj),
        "shared_gate_proj": flat(block.shared_expert.gate_proj.weight),
        "shared_up_proj": flat(block.shared_expert.up_proj.weight),
        "shared_down_proj": flat(block.shared_expert.down_proj.weight),
        "shared_expert_gate": flat(block.shared_expert_gate.weight),
        "x": flat(x),
        "chosen": flat(chosen.float()),
        "chosen_weight": flat(weights),
        "y": flat(y),
        "topk_ties": tie_cases(),
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gated_delta", file_name)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(path), file=sys.stderr)


def main():
    record(Qwen3NextConfig, m.Qwen3NextSparseMoeBlock, "moe_case.json", norm_topk_prob=False)
    record(Qwen3_5MoeTextConfig, m35.Qwen3_5MoeSparseMoeBlock, "moe_case_qwen3_5.json")


if __name__ == "__main__":
    main()
