"""What every family of tools/gen_model.py shares: the random streams, the tensor builders and
the config.json fields common to several archs.

A tensor's values are a pure function of (seed, its name): Tensors draws each one from its own
Stream, so the order in which a family builds its tensors does not matter. The builders take
every standard deviation from their caller, as the caller writes it: the same expression gives
the same float and so the same bytes.
"""

import hashlib
import math

import numpy as np

INF = {"__float__": "Infinity"}  # transformers 5 encoding of float('inf') in config.json

TIME_STEP_MIN, TIME_STEP_MAX, TIME_STEP_FLOOR = 0.001, 0.1, 1e-4

# Router weights ~ N(0, (ROUTER_GAIN^2) / hidden): router logits of a normalised hidden state
# have standard deviation ~ROUTER_GAIN, so the top-k choice varies from token to token and its
# margins stay well above rounding (make_golden.py records both).
ROUTER_GAIN = 2.0


# ----------------------------------------------------------------------------- random

class Stream:
    """Random numbers for one tensor: a pure function of (seed, name), platform independent."""

    def __init__(self, seed, name):
        digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
        self._bits = np.random.PCG64(int.from_bytes(digest[:16], "little"))

    def _raw(self, n):
        return self._bits.random_raw(n).astype(np.uint64)

    def normal(self, shape, std, block=1 << 20):
        """Irwin-Hall(12) approximation of N(0, std^2), values in (-6 std, 6 std), float32."""
        n = int(np.prod(shape, dtype=np.int64))
        out = np.empty(n, dtype=np.float32)
        for lo in range(0, n, block):  # blocks only bound memory; the stream is sequential
            m = min(block, n - lo)
            raw = self._raw(3 * m)  # 3 x 64 bits = twelve 16-bit uniforms per value
            acc = np.zeros(m, dtype=np.int64)
            for r in range(3):
                words = raw[r::3]
                for s in range(4):
                    acc += ((words >> np.uint64(16 * s)) & np.uint64(0xFFFF)).astype(np.int64)
            # sum of 12 U{0..65535}: mean 12*65535/2, variance 12*(2^32-1)/12 ~= 2^32
            z = (acc - 393210).astype(np.float64) / 65536.0
            out[lo:lo + m] = (z * std).astype(np.float32)
        return out.reshape(shape)

    def uniform(self, shape, lo, hi):
        """U(lo, hi) from 24-bit dyadic midpoints, float64 (callers cast)."""
        n = int(np.prod(shape, dtype=np.int64))
        k = (self._raw(n) >> np.uint64(40)).astype(np.float64)
        return (lo + (hi - lo) * (k + 0.5) / float(1 << 24)).reshape(shape)


class Tensors(dict):
    """name -> float32 array of one model; every tensor is drawn from its own Stream(seed, name)."""

    def __init__(self, seed):
        super().__init__()
        self.seed = seed

    def stream(self, name):
        return Stream(self.seed, name)

    def normal(self, name, shape, std):
        """tensor `name` ~ N(0, std^2)."""
        self[name] = self.stream(name).normal(shape, std)

    def norm(self, name, n):
        """An RMSNorm (or D) weight: 1 + N(0, 0.1^2), so that a kernel that ignores it is caught."""
        self[name] = 1.0 + self.stream(name).normal((n,), 0.1)


def new_model(seed, embedding, vocab, hidden, std=None):
    """The Tensors of a model of `seed`, holding its embedding `embedding` [vocab, hidden]
    ~ N(0, std^2) (default 1/hidden)."""
    t = Tensors(seed)
    t.normal(embedding, (vocab, hidden), hidden ** -0.5 if std is None else std)
    return t


def _softplus_inv(dt):
    # softplus(x) = log(1 + e^x)  =>  x = dt + log(-expm1(-dt))
    return dt + math.log(-math.expm1(-dt))


# ----------------------------------------------------------------------------- tensor builders

def mamba_mixer(t, prefix, hidden, n_heads, head_dim, n_groups, d_state, d_conv, n_layers, out_scale=1.0):
    """Mamba2 mixer tensors, shared by every arch. in_proj rows: [z | x | B | C | dt].
    out_scale multiplies out_proj's standard deviation (granitemoehybrid: 1 / residual_multiplier)."""
    inter = n_heads * head_dim
    conv_dim = inter + 2 * n_groups * d_state
    proj = inter + conv_dim + n_heads
    t.normal(prefix + "in_proj.weight", (proj, hidden), hidden ** -0.5)
    bound = d_conv ** -0.5
    t[prefix + "conv1d.weight"] = t.stream(prefix + "conv1d.weight").uniform(
        (conv_dim, 1, d_conv), -bound, bound).astype(np.float32)
    t[prefix + "conv1d.bias"] = t.stream(prefix + "conv1d.bias").uniform((conv_dim,), -bound, bound).astype(np.float32)
    u = t.stream(prefix + "A_log").uniform((n_heads,), 1.0, 16.0)
    t[prefix + "A_log"] = np.array([math.log(a) for a in u], dtype=np.float32)
    u = t.stream(prefix + "dt_bias").uniform((n_heads,), math.log(TIME_STEP_MIN), math.log(TIME_STEP_MAX))
    t[prefix + "dt_bias"] = np.array(
        [_softplus_inv(max(math.exp(v), TIME_STEP_FLOOR)) for v in u], dtype=np.float32)
    t.norm(prefix + "D", n_heads)
    t.norm(prefix + "norm.weight", inter)
    t.normal(prefix + "out_proj.weight", (hidden, inter), (inter * n_layers) ** -0.5 * out_scale)


def attention(t, pre, d_in, q_dim, kv_dim, o_std, in_std=None, k_std=None, d_out=None):
    """Attention projections under `pre`: q_proj [q_dim, d_in], k_proj and v_proj [kv_dim, d_in],
    o_proj [d_out, q_dim]. q and v ~ N(0, in_std^2) (default 1/d_in), k ~ N(0, k_std^2) (default
    in_std), o ~ N(0, o_std^2); d_out defaults to d_in."""
    in_std = d_in ** -0.5 if in_std is None else in_std
    k_std = in_std if k_std is None else k_std
    t.normal(pre + "q_proj.weight", (q_dim, d_in), in_std)
    t.normal(pre + "k_proj.weight", (kv_dim, d_in), k_std)
    t.normal(pre + "v_proj.weight", (kv_dim, d_in), in_std)
    t.normal(pre + "o_proj.weight", (d_in if d_out is None else d_out, q_dim), o_std)


def mlp(t, pre, h, f, down_std, up="up_proj", down="down_proj", up_rows=None):
    """A two-matrix MLP under `pre`: `up` [up_rows (default f), h] ~ N(0, 1/h), `down` [h, f]
    ~ N(0, down_std^2) (names without ".weight")."""
    t.normal(pre + up + ".weight", (f if up_rows is None else up_rows, h), h ** -0.5)
    t.normal(pre + down + ".weight", (h, f), down_std)


def swiglu_mlp(t, pre, h, f, down_std, gate_std=None, bias_stds=None):
    """gate_proj [f, h] ~ N(0, gate_std^2) (default 1/h), up_proj and down_proj as mlp(), and with
    bias_stds (gate, up, down) their biases ~ N(0, std^2)."""
    t.normal(pre + "gate_proj.weight", (f, h), h ** -0.5 if gate_std is None else gate_std)
    mlp(t, pre, h, f, down_std)
    if bias_stds is not None:
        for name, n, std in zip(("gate_proj", "up_proj", "down_proj"), (f, f, h), bias_stds):
            t.normal(pre + name + ".bias", (n,), std)


def router(t, name, n_experts, h):
    """A router's weight [n_experts, h] ~ N(0, ROUTER_GAIN^2 / h)."""
    t.normal(name, (n_experts, h), ROUTER_GAIN * h ** -0.5)


# ----------------------------------------------------------------------------- config fields

def head_fields(p, architecture, model_type, dtype_name, n_layers, tied):
    """The fields that open every config.json: the class, the vocabulary, the width and depth,
    the tied head or not, the special token ids."""
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "dtype": dtype_name,
        "vocab_size": p["vocab_size"],
        "hidden_size": p["hidden_size"],
        "num_hidden_layers": n_layers,
        "tie_word_embeddings": tied,
        "pad_token_id": p["pad_token_id"],
        "bos_token_id": p["bos_token_id"],
        "eos_token_id": p["eos_token_id"],
    }


def attention_fields(p, num_key_value_heads=None, bias_field=True):
    """Attention fields: no dropout, and no bias ("attention_bias": false unless not bias_field)."""
    return {
        "num_attention_heads": p["num_attention_heads"],
        "num_key_value_heads": p["num_key_value_heads"] if num_key_value_heads is None else num_key_value_heads,
        **({"attention_bias": False} if bias_field else {}),
        "attention_dropout": 0.0,
        "max_position_embeddings": p["max_position_embeddings"],
    }


def tail_fields(rms_norm_eps, logits_to_keep=True):
    """The fields that close the config.json of the archs transformers 5.23 writes with rms_norm_eps."""
    return {
        "rms_norm_eps": rms_norm_eps,
        "initializer_range": 0.02,
        **({"num_logits_to_keep": 1} if logits_to_keep else {}),
        "use_cache": True,
    }


def time_step_fields():
    return {"time_step_min": TIME_STEP_MIN, "time_step_max": TIME_STEP_MAX, "time_step_floor": TIME_STEP_FLOOR}
