# SPDX-License-Identifier: BSD-3-Clause
"""RotaryPositionalEmbedding(..., tables=False) and the module's packed sequences: its only
floating buffers are the float64 frequencies (and LongRoPE's long set), non-persistent and float64
whatever the model is cast to; any max_seq_len up to 2^62, nothing allocated per position; forward
rotates as the op's frequency form does, and as the tables module does where both apply;
forward(x, cu_seqlens=...) in both modes equals forward with the positions the packing gives."""

import pickle

import pytest
import references as ref
import torch
from helpers import cpu_and_cuda

import torch_rope
from torch_rope import RotaryPositionalEmbedding


def test_only_float64_frequencies_as_non_persistent_buffers():
    m = RotaryPositionalEmbedding(10000.0, 64, 2**62, tables=False)
    buffers = dict(m.named_buffers())
    assert set(buffers) == {"freqs"}
    assert buffers["freqs"].dtype == torch.float64 and buffers["freqs"].shape == (32,)
    assert m.state_dict() == {}
    assert not hasattr(m, "cos") or "cos" not in m._buffers
    # The C++ builder's float64 frequencies: within an ulp of theta^(-2k/d) (pow, not exp/log).
    torch.testing.assert_close(m.freqs, ref.inv_freq(64), rtol=2.3e-16, atol=0)
    for cast in (torch.bfloat16, torch.float16, torch.float32):
        m.to(cast)
        assert m.freqs.dtype == torch.float64
    m.half()
    assert m.freqs.dtype == torch.float64
    moved = m.to("meta")
    assert moved.freqs.device.type == "meta" and moved.freqs.dtype == torch.float64
    assert "tables=False" in repr(m)


def test_any_max_seq_len_up_to_2_pow_62():
    m = RotaryPositionalEmbedding(10000.0, 16, 2**62, tables=False)
    assert m.max_seq_len == 2**62
    assert sum(b.numel() for b in m.buffers()) == 8  # nothing per position
    with pytest.raises(ValueError, match=r"max_seq_len must be in \[1, 2\^62\]"):
        RotaryPositionalEmbedding(10000.0, 16, 2**62 + 1, tables=False)
    with pytest.raises(ValueError, match=r"max_seq_len must be in \[1, 2\^62\]"):
        RotaryPositionalEmbedding(10000.0, 16, 0, tables=False)
    # The tables module keeps its own bound (2^53 / rotary_dim).
    with pytest.raises(ValueError, match="max_seq_len \\* rotary_dim must be <= 2\\^53"):
        RotaryPositionalEmbedding(10000.0, 16, 2**62)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("seq_dim", [-2, -3])
def test_forward_equals_the_tables_module_and_the_op(interleaved, seq_dim, device):
    kw = dict(interleaved=interleaved, seq_dim=seq_dim, rotary_dim=24, dtype=torch.float64)
    tables = RotaryPositionalEmbedding(5e5, 32, 512, device, **kw)
    free = RotaryPositionalEmbedding(5e5, 32, 512, device, tables=False, **kw)
    shape = (2, 4, 7, 32) if seq_dim == -2 else (2, 7, 4, 32)  # (B, H, S, D) or (B, S, H, D)
    x = torch.randn(*shape, dtype=torch.float64, device=device)
    positions = torch.randint(0, 512, (2, 7), device=device)
    torch.testing.assert_close(free(x), tables(x), rtol=0, atol=1e-12)
    torch.testing.assert_close(free(x, positions), tables(x, positions), rtol=0, atol=1e-12)
    # Beyond any table: the op's frequency form at the same aligned positions.
    far = positions + 2**40
    got = free(x.float(), far)
    p = far.view(2, 1, 7) if seq_dim == -2 else far.view(2, 7, 1)
    want = torch_rope.apply(x.float(), freqs=free.freqs, positions=p, interleaved=interleaved)
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["default", "llama3", "yarn", "dynamic"])
def test_scaling_variants_as_the_tables_module(name):
    scalings = {
        "default": None,
        "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        "dynamic": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64},
    }  # fmt: skip
    scaling = scalings[name]
    tables = RotaryPositionalEmbedding(1e4, 16, 256, scaling=scaling, dtype=torch.float64)
    free = RotaryPositionalEmbedding(1e4, 16, 256, scaling=scaling, tables=False)
    x = torch.randn(1, 2, 256, 16, dtype=torch.float64)
    torch.testing.assert_close(free(x), tables(x), rtol=0, atol=1e-12)
    if name == "yarn":
        assert free.attention_factor != 1.0
    if name == "dynamic":
        # Evaluated at max_seq_len, re-evaluated by extend_tables, as the tables are.
        tables.extend_tables(1024)
        free.extend_tables(1024)
        x = torch.randn(1, 2, 1024, 16, dtype=torch.float64)
        torch.testing.assert_close(free(x), tables(x), rtol=0, atol=1e-12)


def test_longrope_switches_frequency_sets_as_the_tables_do():
    scaling = {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.05 * k for k in range(8)],
        "long_factor": [3.0 + 0.3 * k for k in range(8)],
        "original_max_position_embeddings": 64,
        "factor": 8.0,
    }
    tables = RotaryPositionalEmbedding(1e4, 16, 512, scaling=scaling, dtype=torch.float64)
    free = RotaryPositionalEmbedding(1e4, 16, 512, scaling=scaling, tables=False)
    assert set(dict(free.named_buffers())) == {"freqs", "long_freqs"}
    assert free.long_freqs.dtype == torch.float64
    x = torch.randn(1, 2, 100, 16, dtype=torch.float64)
    short = torch.arange(30)  # max < 64: the short factors
    long = torch.arange(100)  # max >= 64: the long ones, for every token of the call
    for p in (short, long):
        xs = x[:, :, : p.numel()]
        torch.testing.assert_close(free(xs, p), tables(xs, p), rtol=0, atol=1e-12)
    assert not torch.allclose(free(x[:, :, :30], short), free(x[:, :, :30], long[:30] + 64))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("tables", [True, False])
def test_packed_sequences_forward_in_both_modes(tables, device):
    m = RotaryPositionalEmbedding(1e4, 16, 128, device, tables=tables, dtype=torch.float64)
    cu = torch.tensor([0, 8, 8, 16], device=device)
    offsets = torch.tensor([3, 0, 10], device=device)
    x = torch.randn(8, 2, 3, 16, dtype=torch.float64, device=device)  # (T, H, 3, D)
    for cp_rank in (0, 1):
        got = m(x, cu_seqlens=cu, seq_offsets=offsets, cp_size=2, cp_rank=cp_rank)
        positions = ref.packed_positions(cu.cpu(), offsets.cpu(), 2, cp_rank).to(device)
        want = m(x, positions.view(8, 1, 1))
        assert torch.equal(got, want)
    with pytest.raises(TypeError, match="need cu_seqlens"):
        m(x, seq_offsets=offsets)
    with pytest.raises(ValueError, match="not both"):
        m(x, torch.arange(8), cu_seqlens=cu)


def test_packed_sequences_switch_longrope_by_their_largest_position():
    scaling = {
        "rope_type": "longrope",
        "short_factor": [1.0] * 4,
        "long_factor": [4.0] * 4,
        "original_max_position_embeddings": 16,
        "factor": 4.0,
    }
    for tables in (True, False):
        m = RotaryPositionalEmbedding(1e4, 8, 64, scaling=scaling, tables=tables,
                                      dtype=torch.float64)  # fmt: skip
        x = torch.randn(12, 8, dtype=torch.float64)
        for offsets in (torch.tensor([0, 0]), torch.tensor([0, 20])):
            cu = torch.tensor([0, 6, 12])
            got = m(x, cu_seqlens=cu, seq_offsets=offsets)
            positions = ref.packed_positions(cu, offsets)
            assert torch.equal(got, m(x, positions)), (tables, offsets)


def test_compile_and_torch_func_through_the_table_free_module():
    m = RotaryPositionalEmbedding(1e4, 16, 2**40, tables=False)
    x = torch.randn(2, 3, 5, 16)
    p = torch.arange(5) + 2**35
    want = m(x, p)
    torch._dynamo.reset()
    got = torch.compile(m, backend="aot_eager", fullgraph=True)(x, p)
    assert torch.equal(got, want)
    g = torch.func.grad(lambda t: m(t, p).sum())(x)
    assert g.shape == x.shape
    cu = torch.tensor([0, 2, 5])
    y = torch.randn(5, 2, 16)
    packed = torch.compile(lambda t: m(t, cu_seqlens=cu), backend="aot_eager", fullgraph=True)
    assert torch.equal(packed(y), m(y, cu_seqlens=cu))


def test_pickles_and_deep_copies():
    m = RotaryPositionalEmbedding(1e4, 16, 2**50, tables=False)
    m2 = pickle.loads(pickle.dumps(m))
    assert torch.equal(m2.freqs, m.freqs) and m2.tables is False
    x = torch.randn(1, 2, 3, 16)
    assert torch.equal(m2(x), m(x))
