# SPDX-License-Identifier: BSD-3-Clause
"""RotaryPositionalEmbedding: argument checks, seq_dim, scaling, float64 tables, table growth."""

import pytest
import torch
from helpers import (
    LAYOUT_IDS,
    LAYOUTS,
    assert_matches_reference,
    cpu_and_cuda,
    needs_torch,
    randn,
)
from torch.utils._python_dispatch import TorchDispatchMode

import torch_rope

RoPE = torch_rope.RotaryPositionalEmbedding


# ---- bad arguments: the right exception type, naming the argument -------------------------


@pytest.mark.parametrize(
    "kwargs,error,pattern",
    [
        (dict(theta=0.0), ValueError, r"theta must be a positive finite number, got 0\b"),
        (dict(theta=-1.0), ValueError, r"theta.*got -1\b"),
        (dict(theta=float("nan")), ValueError, r"theta.*nan"),
        (dict(theta=float("inf")), ValueError, r"theta.*inf"),
        (dict(theta="1e4"), TypeError, r"theta must be a number"),
        (dict(theta=True), TypeError, r"theta must be a number"),
        (dict(max_seq_len=0), ValueError, r"max_seq_len must be >= 1, got 0"),
        (dict(max_seq_len=-5), ValueError, r"max_seq_len must be >= 1, got -5"),
        (dict(max_seq_len=2**63 - 1), ValueError, r"max_seq_len \* rotary_dim must be <= 2\^53"),
        (dict(max_seq_len=100.7), TypeError, r"max_seq_len must be an int, got float 100.7"),
        (dict(max_seq_len=100.0), TypeError, r"max_seq_len must be an int, got float"),
        (dict(max_seq_len=True), TypeError, r"max_seq_len must be an int, got bool"),
        (dict(d_k=16.0), TypeError, r"d_k must be an int, got float"),
        (dict(d_k=0), ValueError, r"d_k must be >= 1, got 0"),
        (dict(rotary_dim=8.0), TypeError, r"rotary_dim must be an int"),
        (dict(rotary_dim=7), ValueError, r"rotary_dim must be even.*got 7"),
        (dict(interleaved=1), TypeError, r"interleaved must be a bool"),
        (dict(dtype=torch.bfloat16), ValueError, r"dtype.*float32 or float64.*BFloat16"),
        (dict(seq_dim=-1), ValueError, r"seq_dim must be a negative axis.*got -1"),
        (dict(seq_dim=1), ValueError, r"seq_dim.*got 1"),
        (dict(seq_dim=-2.0), TypeError, r"seq_dim must be an int"),
        (dict(scaling={"rope_type": "linear"}), ValueError, r"needs factor"),
    ],
)
def test_bad_arguments(kwargs, error, pattern):
    args = dict(theta=10000.0, d_k=16, max_seq_len=32)
    args.update(kwargs)
    with pytest.raises(error, match=pattern):
        RoPE(args.pop("theta"), args.pop("d_k"), args.pop("max_seq_len"), **args)


# 2**40 rows of 32 float32 planes, cos and sin: 2**48 bytes (256 TiB), more than any machine
# this runs on, yet within the 2^53 rule of max_seq_len * rotary_dim.
HUGE = 2**40
HUGE_BYTES = 2 * HUGE * 32 * 4


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: RoPE(10000.0, 64, HUGE), id="module"),
        pytest.param(lambda: RoPE(10000.0, 64, 32).extend_tables(HUGE), id="extend_tables"),
        pytest.param(lambda: torch_rope.rope_tables(10000.0, 64, HUGE), id="rope_tables"),
        pytest.param(
            lambda: torch_rope.rope_tables_from_inv_freq(torch.ones(32, dtype=torch.float64), HUGE),
            id="rope_tables_from_inv_freq",
        ),
    ],
)
def test_tables_larger_than_the_machine_are_a_value_error_naming_max_seq_len(build):
    # Refused before allocating (the allocator's own error named no argument), with the bytes.
    with pytest.raises(ValueError) as info:
        build()
    message = str(info.value)
    assert f"max_seq_len = {HUGE} needs {HUGE_BYTES} bytes (262144 GiB) of tables" in message
    assert "cos and sin, each (1099511627776, rotary_dim / 2 = 32) of Float" in message
    assert "bytes of memory (RAM and swap) of this machine; pass a smaller max_seq_len" in message


def test_longrope_module_tables_count_both_halves():
    scaling = {
        "rope_type": "longrope",
        "short_factor": [1.0] * 32,
        "long_factor": [2.0] * 32,
        "original_max_position_embeddings": 4096,
        "factor": 8.0,
    }
    with pytest.raises(ValueError, match=rf"needs {2 * HUGE_BYTES} bytes .*each \(2199023255552,"):
        RoPE(10000.0, 64, HUGE, scaling=scaling)


def test_extend_tables_refused_keeps_the_tables():
    rope = RoPE(10000.0, 64, 32)
    before = (rope.cos, rope.cos.clone(), rope.max_seq_len)
    with pytest.raises(ValueError, match="max_seq_len"):
        rope.extend_tables(HUGE)
    assert rope.cos is before[0] and torch.equal(rope.cos, before[1])
    assert rope.max_seq_len == before[2]


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda n: RoPE(10000.0, 16, n), id="module"),
        pytest.param(lambda n: RoPE(10000.0, 16, 32).extend_tables(n), id="extend_tables"),
        pytest.param(lambda n: torch_rope.rope_tables(10000.0, 16, n), id="rope_tables"),
        pytest.param(
            lambda n: torch_rope.rope_tables_from_inv_freq(torch.ones(8, dtype=torch.float64), n),
            id="rope_tables_from_inv_freq",
        ),
    ],
)
@pytest.mark.parametrize("n", [2**64, 2**63, -(2**63) - 1], ids=["2**64", "2**63", "-2**63-1"])
def test_max_seq_len_beyond_int64_is_a_value_error_naming_it(build, n):
    with pytest.raises(
        ValueError, match=rf"max_seq_len must fit in int64, \[-2\*\*63, 2\*\*63 - 1\], got {n}$"
    ):
        build(n)


def test_d_k_mismatch_names_both_sizes():
    rope = RoPE(10000.0, 8, 32)
    with pytest.raises(
        ValueError,
        match=r"x.size\(-1\) must equal d_k = 8, got x of shape \[2, 3, 16\]",
    ):
        rope(torch.randn(2, 3, 16))
    with pytest.raises(ValueError, match="d_k = 8"):
        rope(torch.tensor(1.0))


def test_token_positions_must_be_a_tensor():
    rope = RoPE(10000.0, 8, 32)
    with pytest.raises(TypeError, match="token_positions must be an int32/int64 Tensor or None"):
        rope(torch.randn(3, 8), [0, 1, 2])


def test_cs336_signature_device_positional():
    rope = RoPE(10000.0, 16, 32, "cpu")
    assert rope.cos.device.type == "cpu"
    rope = RoPE(10000.0, 16, 32, torch.device("meta"))
    assert rope.cos.is_meta and rope.cos.shape == (32, 8)


@needs_torch("2.5", "torch.get_default_device() inside `with torch.device(...)`")
def test_default_device_context_is_followed():
    with torch.device("meta"):
        rope = RoPE(10000.0, 16, 32)
    assert rope.cos.is_meta


# ---- seq_dim: default positions and (S,) / (B, S) positions mean the same in both layouts -----


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_seq_dim_minus_3_matches_minus_2_on_the_transposed_input(device, interleaved):
    B, S, H, D = 2, 7, 3, 32
    bshd = RoPE(10000.0, D, 16, device, interleaved=interleaved, seq_dim=-3)
    bhsd = RoPE(10000.0, D, 16, device, interleaved=interleaved)
    x = randn(B, S, H, D, device=device)
    xt = x.transpose(1, 2)
    # Default positions follow the sequence axis, not the heads axis.
    torch.testing.assert_close(bshd(x).transpose(1, 2), bhsd(xt), rtol=0, atol=0)
    assert_matches_reference(bshd(x), x, torch.arange(S).view(S, 1), D, interleaved=interleaved)
    for positions in (torch.arange(3, 3 + S), torch.randint(0, 16, (B, S))):
        positions = positions.to(device)
        torch.testing.assert_close(
            bshd(x, positions).transpose(1, 2), bhsd(xt, positions), rtol=0, atol=0
        )
    pos = torch.randint(0, 16, (B, S))
    assert_matches_reference(
        bhsd(xt, pos.to(device)), xt, pos.view(B, 1, S), D, interleaved=interleaved
    )


def test_positions_of_three_dims_broadcast_as_the_op_does():
    rope = RoPE(10000.0, 16, 32)
    x = torch.randn(2, 3, 5, 16)
    pos = torch.randint(0, 32, (2, 3, 5))
    torch.testing.assert_close(rope(x, pos), torch_rope.apply(x, rope.cos, rope.sin, pos))


# ---- scaling in the module ------------------------------------------------------------------


def test_module_tables_are_the_builders_for_each_scaling():
    llama3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    rope = RoPE(500000.0, 32, 256, scaling=llama3, dtype=torch.float64)
    cos, sin = torch_rope.rope_tables(500000.0, 32, 256, scaling=llama3, dtype=torch.float64)
    assert torch.equal(rope.cos, cos) and torch.equal(rope.sin, sin)
    assert "scaling='llama3'" in repr(rope) and "float64" in repr(rope)


def _longrope(original=16):
    return {
        "rope_type": "longrope",
        "short_factor": [1.0, 1.5, 2.0, 2.5],
        "long_factor": [3.0, 4.0, 5.0, 6.0],
        "original_max_position_embeddings": original,
        "max_position_embeddings": 64,
    }


def test_longrope_switches_between_short_and_long_tables_per_call():
    rope = RoPE(10000.0, 8, 64, scaling=_longrope())
    short = RoPE(10000.0, 8, 64, scaling=dict(_longrope(), seq_len=16))
    long = RoPE(10000.0, 8, 64, scaling=dict(_longrope(), seq_len=17))
    assert rope.cos.shape == (128, 4)  # both variants in one allocation
    x = torch.randn(1, 2, 20, 8)
    # A call whose positions stay below the original length uses the short factors...
    torch.testing.assert_close(rope(x[:, :, :16]), short(x[:, :, :16]), rtol=0, atol=0)
    # ...and one that reaches past it uses the long ones, for every position of the call.
    torch.testing.assert_close(rope(x), long(x), rtol=0, atol=0)
    pos = torch.tensor([3, 40])
    torch.testing.assert_close(rope(x[:, :, :2], pos), long(x[:, :, :2], pos), rtol=0, atol=0)


class HostSyncDetector(TorchDispatchMode):
    """Fails on any device-to-host read (item(), bool(), int() of a tensor...)."""

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            raise AssertionError("forward read a value back to the host")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("scaling", [None, _longrope()], ids=["plain", "longrope"])
def test_forward_never_syncs_with_the_host(scaling):
    rope = RoPE(10000.0, 8, 64, scaling=scaling, seq_dim=-3)
    x = torch.randn(2, 20, 3, 8)
    with HostSyncDetector():
        rope(x)
        rope(x, torch.arange(20))
        rope(x, torch.randint(0, 64, (2, 20)))


# ---- growing the tables ---------------------------------------------------------------------


def test_extend_tables_grows_without_rebuilding_the_module():
    rope = RoPE(10000.0, 16, 32, rotary_dim=8)
    x = torch.randn(1, 40, 16)
    with pytest.raises(IndexError, match="max_seq_len"):
        rope(x)
    before = rope.cos.clone()
    rope.extend_tables(64)
    assert rope.max_seq_len == 64 and rope.cos.shape == (64, 4)
    assert torch.equal(rope.cos[:32], before)  # the rows we had do not change
    assert_matches_reference(rope(x), x, torch.arange(40), 8, interleaved=True)
    with pytest.raises(IndexError, match="max_seq_len"):
        rope(x, torch.tensor([64] * 40))
    with pytest.raises(TypeError, match="max_seq_len must be an int"):
        rope.extend_tables(80.0)
    assert rope.state_dict() == {}


def test_extend_tables_keeps_device_and_dtype():
    rope = RoPE(10000.0, 16, 32, dtype=torch.float64).to(torch.bfloat16)
    rope.extend_tables(48)
    assert rope.cos.dtype == torch.float64 and rope.cos.shape == (48, 8)


def test_dynamic_is_re_evaluated_at_the_new_length():
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 32}
    rope = RoPE(10000.0, 16, 32, scaling=dynamic)
    plain = RoPE(10000.0, 16, 32)
    assert torch.equal(rope.cos, plain.cos)  # at the pretraining length, dynamic is plain RoPE
    rope.extend_tables(64)
    want, _ = torch_rope.rope_tables(10000.0, 16, 64, scaling=dict(dynamic, seq_len=64))
    assert torch.equal(rope.cos, want) and not torch.equal(rope.cos[:32], plain.cos)


def test_compiled_forward_fullgraph_with_seq_dim_and_longrope():
    rope = RoPE(10000.0, 8, 64, scaling=_longrope(), seq_dim=-3)
    compiled = torch.compile(rope, fullgraph=True, backend="aot_eager")
    for length in (10, 20):
        x = torch.randn(2, length, 3, 8)
        torch.testing.assert_close(compiled(x), rope(x), rtol=0, atol=0)
