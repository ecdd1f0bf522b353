# SPDX-License-Identifier: BSD-3-Clause
"""The table builder: plain tables against a float64 oracle, bad arguments, scaling variants,
float64 tables and the builder's memory.

The variants are compared with the real transformers library: for every entry of its
``ROPE_INIT_FUNCTIONS`` (iterated, so a variant added by a newer transformers fails here until it
is implemented), inv_freq and the attention factor must agree, and the tables must be
``attention_factor * cos(p * inv_freq)`` computed in float64 and rounded once.
"""

import math
import os
import subprocess
import sys
import textwrap

import pytest
import references as ref
import torch
from helpers import cpu_and_cuda, subprocess_env

import torch_rope

THETA = 500000.0
HEAD_DIM = 64
MAX_POS = 4096


def _planes(scale):
    return [1.0 + scale * k / (HEAD_DIM // 2) for k in range(HEAD_DIM // 2)]


# rope_type -> list of (case id, rope_parameters without rope_type/theta, seq_lens to evaluate at).
# None as a seq_len means transformers' default (the config's own length).
CASES = {
    "linear": [("factor4", {"factor": 4.0}, [None])],
    "dynamic": [("factor2", {"factor": 2.0}, [None, MAX_POS // 2, 3 * MAX_POS, 5000])],
    "yarn": [
        ("plain", {"factor": 4.0, "original_max_position_embeddings": 1024}, [None]),
        (
            "mscale",
            {
                "factor": 8.0,
                "original_max_position_embeddings": 512,
                "beta_fast": 16,
                "beta_slow": 2,
                "mscale": 0.707,
                "mscale_all_dim": 1.0,
            },
            [None],
        ),
        (
            "attention_factor_no_truncate",
            {
                "factor": 16.0,
                "original_max_position_embeddings": 256,
                "attention_factor": 1.3,
                "truncate": False,
            },
            [None],
        ),
        (
            "factor_below_one_keeps_attention",
            {"factor": 1.0, "original_max_position_embeddings": MAX_POS},
            [None],
        ),
    ],
    "llama3": [
        (
            "llama3_1",
            {
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 1024,
            },
            [None],
        ),
        (
            "wide_band",
            {
                "factor": 32.0,
                "low_freq_factor": 0.5,
                "high_freq_factor": 8.0,
                "original_max_position_embeddings": 2048,
            },
            [None],
        ),
    ],
    "longrope": [
        (
            "derived_factor",
            {
                "short_factor": _planes(0.5),
                "long_factor": _planes(8.0),
                "original_max_position_embeddings": 1024,
            },
            [None, 1024, 1025, 4096],
        ),
        (
            "given_factors",
            {
                "short_factor": _planes(0.1),
                "long_factor": _planes(3.0),
                "original_max_position_embeddings": 512,
                "factor": 3.0,
                "attention_factor": 1.1,
            },
            [None, 2048],
        ),
    ],
    "proportional": [
        ("quarter", {"partial_rotary_factor": 0.25}, [None]),
        ("full_with_factor", {"partial_rotary_factor": 1.0, "factor": 2.0}, [None]),
    ],
}


def hf_config(rope_type, params):
    from transformers import LlamaConfig

    rope_parameters = dict(params, rope_type=rope_type, rope_theta=THETA)
    return LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POS,
        rope_parameters=rope_parameters,
    )


def our_scaling(rope_type, params):
    scaling = dict(params, rope_type=rope_type, rope_theta=THETA)
    if rope_type in ("dynamic", "yarn", "longrope"):
        scaling["max_position_embeddings"] = MAX_POS
    return scaling


def test_every_transformers_rope_type_has_cases_here():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    missing = sorted(set(ROPE_INIT_FUNCTIONS) - set(CASES))
    assert not missing, (
        f"transformers {transformers.__version__} has rope types {missing} that torch_rope "
        "neither implements nor tests"
    )


def _cases():
    return [
        pytest.param(rope_type, params, seq_len, id=f"{rope_type}-{case_id}-seq{seq_len}")
        for rope_type, cases in CASES.items()
        for case_id, params, seq_lens in cases
        for seq_len in seq_lens
    ]


def _our_seq_len(rope_type, seq_len):
    """transformers' seq_len=None: dynamic at the config's length, longrope's short factors."""
    if seq_len is not None:
        return seq_len
    return 1 if rope_type == "longrope" else MAX_POS


@pytest.mark.parametrize("rope_type,params,seq_len", _cases())
def test_frequencies_match_transformers(rope_type, params, seq_len):
    pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = hf_config(rope_type, params)
    want_inv, want_attention = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)
    got_inv, got_attention = torch_rope.rope_frequencies(
        THETA,
        HEAD_DIM,
        scaling=our_scaling(rope_type, params),
        seq_len=_our_seq_len(rope_type, seq_len),
    )
    assert got_inv.dtype == torch.float64 and got_inv.shape == want_inv.shape
    # transformers computes in float32 (theta^(2k/d) and the ramps rounded to 24 bits): we agree
    # to a few float32 ulps and are exact to float64 ourselves (see the float64 tests below).
    torch.testing.assert_close(got_inv, want_inv.double(), rtol=2e-6, atol=0)
    assert math.isclose(got_attention, float(want_attention), rel_tol=1e-12)


def test_default_matches_a_model_default_rope():
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    want, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(hf_config("default", {}))
    got, attention = torch_rope.rope_frequencies(THETA, HEAD_DIM)
    torch.testing.assert_close(got, want.double(), rtol=2e-6, atol=0)
    assert attention == 1.0


@pytest.mark.parametrize("rope_type,params,seq_len", _cases())
def test_tables_fold_the_attention_factor_and_round_once(rope_type, params, seq_len):
    scaling = our_scaling(rope_type, params)
    if seq_len is not None:
        scaling["seq_len"] = seq_len
    cos, sin = torch_rope.rope_tables(THETA, HEAD_DIM, 3000, scaling=scaling)
    # Without a seq_len, dynamic and longrope are evaluated at the table's length.
    inv, attention = torch_rope.rope_frequencies(THETA, HEAD_DIM, scaling=scaling, seq_len=3000)
    # Independent float64 computation from the (separately checked) frequencies.
    angles = torch.arange(3000, dtype=torch.float64)[:, None] * inv
    torch.testing.assert_close(cos, (attention * angles.cos()).float(), rtol=0, atol=0)
    torch.testing.assert_close(sin, (attention * angles.sin()).float(), rtol=0, atol=0)


@pytest.mark.parametrize("rope_type,params,seq_len", [p for p in _cases() if p.values[2] is None])
def test_tables_match_transformers_rotary_cos_sin(rope_type, params, seq_len):
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(hf_config(rope_type, params))
    positions = torch.arange(64)[None]
    hf_cos, hf_sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
    cos, sin = torch_rope.rope_tables(THETA, HEAD_DIM, 64, scaling=our_scaling(rope_type, params))
    # HF's gathered tables repeat the halves; float32 angles at p < 64 are off by < 4e-6.
    torch.testing.assert_close(hf_cos[0], torch.cat([cos, cos], -1), rtol=0, atol=1e-5)
    torch.testing.assert_close(hf_sin[0], torch.cat([sin, sin], -1), rtol=0, atol=1e-5)


def test_rope_tables_from_inv_freq_and_attention_scaling():
    inv = torch.tensor([1.0, 0.1, 0.01, 0.0], dtype=torch.float64)
    cos, sin = torch_rope.rope_tables_from_inv_freq(
        inv, 50, attention_scaling=1.25, dtype=torch.float64
    )
    angles = torch.arange(50, dtype=torch.float64)[:, None] * inv
    torch.testing.assert_close(cos, 1.25 * angles.cos(), rtol=0, atol=0)
    torch.testing.assert_close(sin, 1.25 * angles.sin(), rtol=0, atol=0)
    # A float32 inv_freq is widened, not rounded again.
    cos32, _ = torch_rope.rope_tables_from_inv_freq(inv.float(), 50)
    assert cos32.dtype == torch.float32


@pytest.mark.parametrize(
    "scaling,pattern,error",
    [
        ({"rope_type": "mrope"}, "rope_type 'mrope' is not supported", ValueError),
        ({"rope_type": "linear"}, "needs factor", ValueError),
        ({"rope_type": "llama3", "factor": 8.0}, "needs high_freq_factor", ValueError),
        (
            {"rope_type": "linear", "factor": 2.0, "fctor": 3.0},
            "unexpected key.*'fctor'",
            ValueError,
        ),
        (
            {"rope_type": "linear", "factor": 2.0, "rope_theta": 10.0},
            "rope_theta = 10 disagrees",
            ValueError,
        ),
        ({"rope_type": "linear", "factor": -2.0}, "factor must be a finite number > 0", ValueError),
        ({"rope_type": "linear", "factor": "2"}, r"\['factor'\] must be a number", TypeError),
        (
            {
                "rope_type": "longrope",
                "short_factor": [1.0],
                "long_factor": [1.0],
                "original_max_position_embeddings": 8,
            },
            "short_factor must have rotary_dim / 2 = 4",
            ValueError,
        ),
        ({"rope_type": "dynamic", "factor": 2.0}, "needs max_position_embeddings", ValueError),
        (
            {"rope_type": "yarn", "original_max_position_embeddings": 8},
            "give factor, or max_position_embeddings",
            ValueError,
        ),
        ("llama3", "rope_parameters dict", TypeError),
    ],
)
def test_bad_scaling_is_rejected_with_its_name(scaling, pattern, error):
    with pytest.raises(error, match=pattern):
        torch_rope.rope_tables(10000.0, 8, 16, scaling=scaling)


def test_legacy_type_key_and_default():
    a = torch_rope.rope_tables(10000.0, 8, 16, scaling={"type": "linear", "factor": 2.0})
    b = torch_rope.rope_tables(10000.0, 8, 16, scaling={"rope_type": "linear", "factor": 2.0})
    assert torch.equal(a[0], b[0])
    c = torch_rope.rope_tables(10000.0, 8, 16, scaling={"rope_type": "default"})
    d = torch_rope.rope_tables(10000.0, 8, 16)
    assert torch.equal(c[0], d[0])


# ---- float64 tables -------------------------------------------------------------------------


def _exact_rotation(x, positions, theta, rotary_dim):
    """x rotated with angles from 40-digit arithmetic (mpmath), the interleaved layout."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    out = x.clone()
    for row, p in enumerate(positions.tolist()):
        for k in range(rotary_dim // 2):
            angle = p * mpmath.power(mpmath.mpf(theta), -mpmath.mpf(2 * k) / rotary_dim)
            c, s = mpmath.cos(angle), mpmath.sin(angle)
            a, b = mpmath.mpf(float(x[row, 2 * k])), mpmath.mpf(float(x[row, 2 * k + 1]))
            out[row, 2 * k] = float(a * c - b * s)
            out[row, 2 * k + 1] = float(a * s + b * c)
    return out


def test_float64_tables_reach_the_rounding_of_the_angle():
    """float64 x with float64 tables: error ~1e-16 x position; float32 tables cap at ~1e-8."""
    positions = torch.tensor([0, 1, 7, 100, 1000, 4095, 4096, 65535])
    x = torch.randn(len(positions), 32, dtype=torch.float64)
    exact = _exact_rotation(x, positions, 10000.0, 32)
    rope64 = torch_rope.RotaryPositionalEmbedding(10000.0, 32, 65536, dtype=torch.float64)
    rope32 = torch_rope.RotaryPositionalEmbedding(10000.0, 32, 65536)
    err64 = (rope64(x, positions) - exact).abs().max(dim=-1).values / x.abs().max(dim=-1).values
    err32 = (rope32(x, positions) - exact).abs().max(dim=-1).values / x.abs().max(dim=-1).values
    eps = torch.finfo(torch.float64).eps
    # The angle p * inv_freq[0] = p is exact; the others carry inv_freq's and the product's
    # roundings, a few eps relative: about 4 eps x position at most, plus the cos/sin roundings.
    bound = 4 * eps * positions.double().clamp(min=1) + 4 * eps
    assert (err64 <= bound).all(), (err64, bound)
    assert err64[positions == 4096].item() < 2e-12  # "about 1e-13 at position 4096"
    assert err32.max().item() > 1e-8  # what float32 tables give, at every position > 0
    assert (err64[1:] < err32[1:] / 100).all()


def test_float64_module_tables_stay_float64_under_casts():
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 16, 32, dtype=torch.float64)
    cos = rope.cos.clone()
    for cast in (lambda m: m.float(), lambda m: m.half(), lambda m: m.to(torch.bfloat16)):
        cast(rope)
        assert rope.cos.dtype == torch.float64 and torch.equal(rope.cos, cos)
    assert rope.state_dict() == {}


# ---- memory of the builder -------------------------------------------------------------------

_MEASURE = textwrap.dedent("""
    import sys, torch, torch_rope
    rows, planes, dtype = int(sys.argv[1]), int(sys.argv[2]), getattr(torch, sys.argv[3])
    torch_rope.rope_tables(10000.0, 2 * planes, 1024, dtype=dtype)   # warm up: code, allocator
    def status(key):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current resident size
    before = status("VmRSS")
    assert status("VmHWM") <= before + (8 << 20), "the peak was not reset"
    cos, sin = torch_rope.rope_tables(10000.0, 2 * planes, rows, dtype=dtype)
    out = cos.numel() * cos.element_size() + sin.numel() * sin.element_size()
    print(status("VmHWM") - before, out)
""")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_building_tables_peaks_within_1_2x_of_the_tables(dtype):
    """Measured, not assumed: the growth of a fresh process's peak resident memory (VmHWM, reset
    just before) while it builds 512 MiB of tables, against the tables' own size."""
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        # scripts/sanitize.sh preloads ASan into every interpreter; its quarantine keeps freed
        # blocks resident (256 MiB by default), so the peak would measure ASan, not the builder.
        pytest.skip("under AddressSanitizer the peak resident memory includes ASan's quarantine")
    rows = (1 << 20) if dtype == "float32" else (1 << 19)
    # The child imports the torch_rope this test runs (whatever the working directory is now).
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(rows), "64", dtype],
        capture_output=True,
        text=True,
        env=subprocess_env(),
    )
    assert out.returncode == 0, out.stderr
    grew, tables = map(int, out.stdout.split())
    assert tables == 2 * rows * 64 * (4 if dtype == "float32" else 8)
    assert grew <= 1.2 * tables, f"peak grew by {grew / tables:.2f}x the tables"


@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_tables_build_under_inference_mode_on_every_thread(mode):
    # Regression: the builder's worker threads lacked the caller's InferenceMode, so building
    # tables of more than one chunk under torch.inference_mode() raised "Inplace update to
    # inference tensor outside InferenceMode" (found by the CPU benchmark).
    want_cos, want_sin = torch_rope.rope_tables(10000.0, 128, 8192)
    context = torch.inference_mode() if mode == "inference_mode" else torch.no_grad()
    with context:
        cos, sin = torch_rope.rope_tables(10000.0, 128, 8192)
        module = torch_rope.RotaryPositionalEmbedding(10000.0, 128, 8192)
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    assert torch.equal(module.cos, want_cos)


# ---- plain tables -------------------------------------------------------------------------


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize(
    "theta,rotary_dim,max_seq_len", [(10000.0, 64, 128), (500000.0, 128, 40000), (10.0, 2, 5)]
)
def test_rope_tables_equal_float64_computation(theta, rotary_dim, max_seq_len, device):
    cos, sin = torch_rope.rope_tables(theta, rotary_dim, max_seq_len, device=device)
    assert cos.dtype == sin.dtype == torch.float32
    assert cos.shape == sin.shape == (max_seq_len, rotary_dim // 2)
    assert cos.device.type == device
    want_cos, want_sin = ref.tables(max_seq_len, rotary_dim, theta, torch.float64)
    # Within one float32 rounding of the float64 value: angles of 4e4 rad computed in float32
    # would be off by ~1e-3 and fail here.
    torch.testing.assert_close(cos.cpu().double(), want_cos, rtol=0, atol=1.2e-7)
    torch.testing.assert_close(sin.cpu().double(), want_sin, rtol=0, atol=1.2e-7)


def test_oracle_tables_equal_scalar_math():
    # The table oracle (references.tables, vectorised in torch) against Python's scalar math on
    # a few entries, including large angles: position * theta ** (-2k / rotary_dim). (One ulp of
    # the float64 angle at 4e4 rad is ~7e-12; a float32 rounding of a table entry is 6e-8.)
    cos, sin = ref.tables(40000, 48, 10000.0, torch.float64)
    for p, k in [(0, 0), (1, 0), (7, 3), (299, 23), (39999, 0), (39999, 11)]:
        angle = p * 10000.0 ** (-2 * k / 48)
        assert math.isclose(cos[p, k].item(), math.cos(angle), rel_tol=0, abs_tol=1e-9)
        assert math.isclose(sin[p, k].item(), math.sin(angle), rel_tol=0, abs_tol=1e-9)


@pytest.mark.parametrize(
    "theta,rotary_dim,max_seq_len,pattern",
    [
        (10000.0, 7, 16, r"rotary_dim.*7"),
        (10000.0, 0, 16, r"rotary_dim.*0"),
        (10000.0, 8, 0, r"max_seq_len.*0"),
        (-1.0, 8, 16, r"theta.*-1"),
        (0.0, 8, 16, r"theta.*got 0"),
    ],
)
def test_rope_tables_bad_arguments(theta, rotary_dim, max_seq_len, pattern):
    with pytest.raises((ValueError, RuntimeError), match=pattern):
        torch_rope.rope_tables(theta, rotary_dim, max_seq_len)
