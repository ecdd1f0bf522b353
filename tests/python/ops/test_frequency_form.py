# SPDX-License-Identifier: BSD-3-Clause
"""The frequency form (table-free: each angle from the float64 frequencies and the position, so
any int64 position and nothing stored per position): rope.apply.freqs and its siblings held to
bounds that do not loosen with the position, which is what the form is for, against a reference
computed from the exact angle p * f in mpmath (references.exact_cos_sin: the reduction at the
angle's magnitude plus 160 bits).

- float32: every output of a pair (a, b) within 2^-23 af (|a| + |b|) (+ 2^-147 for subnormal
  results) of af (a cos - b sin), at positions spread over [0, 2^40] and int64 ones up to 2^62;
- 16-bit: the float32 result rounded once (bit for bit as c10 rounds);
- float64: within a few float64 ulps of the pair's magnitude;
- every scaling variant (and the vision axial rules) works table-free and agrees with its float64
  tables; every CPU kernel copy this CPU has gives the same bits.
The long sweeps (more positions, every theta set's worst cases) are behind the `slow` mark.
The max errors found are printed (pytest -s).
"""

import random

import pytest
import references as ref
import torch
from helpers import LAYOUT_IDS, LAYOUTS, cpu_and_cuda, cpu_flags, missing_cpu_flags, run_python

import torch_rope

U23 = 2.0**-23
# The reference's own error: float64 cos / sin (0.5 ulp each) and the float64 rotation.
REF_SLACK = 2.0**-48


def theta_freqs(theta, rotary_dim):
    return ref.inv_freq(rotary_dim, theta)


def spread_positions(n_random, rng, top=40):
    """0, 1, the powers of two up to 2^top and their neighbours, and log-uniform ones."""
    ps = {0, 1, 2, 3}
    for k in range(1, top + 1):
        ps.update({2**k - 1, 2**k, 2**k + 1})
    ps.update(int(2.0 ** rng.uniform(0, top)) for _ in range(n_random))
    return sorted(p for p in ps if p <= 2**top)


def adversarial_pairs(n_rows, half, rng):
    """(n_rows, 2 * half) float32 rows whose pairs have every kind of magnitude: equal, opposite,
    zero, huge ratios, small and large exponents."""
    x = torch.empty(n_rows, 2 * half, dtype=torch.float64)
    for i in range(n_rows):
        for j in range(2 * half):
            kind = rng.random()
            if kind < 0.05:
                v = 0.0
            elif kind < 0.15:
                v = rng.choice((1.0, -1.0, 0.5))
            else:
                v = rng.uniform(1, 2) * 2.0 ** rng.randint(-60, 60) * rng.choice((1, -1))
            x[i, j] = v
    return x.to(torch.float32)


def pair_bound(x, interleaved, af):
    """2^-23 af (|a| + |b|) of each feature's pair, in float64, shaped like x."""
    half = x.shape[-1] // 2
    a64 = x.double().abs()
    if interleaved:
        pairs = a64.view(*x.shape[:-1], half, 2).sum(-1)
        per_feature = pairs.repeat_interleave(2, dim=-1)
    else:
        pairs = a64[..., :half] + a64[..., half:]
        per_feature = torch.cat([pairs, pairs], dim=-1)
    return per_feature * abs(af)


def check_bound(got, want, x, interleaved, af, what):
    """Every float32 output within the bound; returns the largest error / bound."""
    bound = pair_bound(x, interleaved, af)
    err = (got.double().cpu() - want).abs()
    allowed = (U23 + REF_SLACK) * bound + 2.0**-147
    ratio = (err / (U23 * bound + 2.0**-147)).max().item()
    bad = err > allowed
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} outputs outside 2^-23 af (|a| + |b|); worst "
        f"{(err / allowed).max().item():.3f} of the bound"
    )
    return ratio


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_float32_within_one_ulp_of_the_pair_up_to_2_pow_40(interleaved, inverse, device):
    rng = random.Random(340 + 2 * interleaved + inverse)
    freqs = theta_freqs(10000.0, 32)  # 16 planes, from 1 down to 1e4^-(15/16)
    positions = torch.tensor(spread_positions(40, rng, top=40))
    x = adversarial_pairs(positions.numel() * 2, 16, rng).view(positions.numel(), 2, 32)
    got = torch_rope.apply(
        x.to(device),
        freqs=freqs.to(device),
        positions=positions.to(device).unsqueeze(-1),
        interleaved=interleaved,
        inverse=inverse,
    )
    want = ref.rope_with_frequencies(
        x, freqs, positions.unsqueeze(-1), interleaved=interleaved, inverse=inverse
    )
    worst = check_bound(got, want, x, interleaved, 1.0, "float32")
    print(f"[float32, {positions.numel()} positions up to 2^40] max error / bound = {worst:.4f}")


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_int64_positions_to_2_pow_62_and_the_attention_factor(device):
    rng = random.Random(341)
    freqs, af = torch_rope.rope_frequencies(
        1e6,
        32,
        scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    )
    assert af != 1.0
    positions = torch.tensor(
        [2**62, 2**62 - 1, 2**55 + 12345, 2**48 + 7, 2**41 + 3, 3 * 2**45 + 1]
        + [int(2.0 ** rng.uniform(40, 62)) for _ in range(20)]
    )
    x = adversarial_pairs(positions.numel() * 3, 16, rng).view(positions.numel(), 3, 32)
    for interleaved in (True, False):
        got = torch_rope.apply(
            x.to(device),
            freqs=freqs.to(device),
            positions=positions.to(device).unsqueeze(-1),
            attention_factor=af,
            interleaved=interleaved,
        )
        want = ref.rope_with_frequencies(
            x, freqs, positions.unsqueeze(-1), attention_factor=af, interleaved=interleaved
        )
        worst = check_bound(got, want, x, interleaved, af, "int64 positions")
        print(f"[int64 positions to 2^62, YaRN af {af:.4f}] max error / bound = {worst:.4f}")


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
def test_16_bit_outputs_are_the_float32_result_rounded_once(dtype, interleaved, device):
    rng = random.Random(342)
    freqs = theta_freqs(500000.0, 64)
    positions = torch.tensor(spread_positions(10, rng, top=40)).to(device)
    x = torch.randn(positions.numel(), 4, 80, dtype=torch.float64).to(dtype=dtype, device=device)
    kw = dict(freqs=freqs.to(device), interleaved=interleaved)
    got = torch_rope.apply(x, positions=positions.unsqueeze(-1), **kw)
    want = torch_rope.apply(x.float(), positions=positions.unsqueeze(-1), **kw).to(dtype)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    # apply_qk and the packed form round the same way.
    q, k = torch_rope.apply_qk(x, x[:, :2], positions=positions.unsqueeze(-1), **kw)
    assert torch.equal(q.view(torch.int16), want.view(torch.int16))
    assert torch.equal(k.view(torch.int16), want[:, :2].view(torch.int16))


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_float64_within_a_few_ulps_of_the_pair(device):
    rng = random.Random(343)
    freqs = theta_freqs(10000.0, 16)
    positions = torch.tensor(spread_positions(20, rng, top=62))
    x = adversarial_pairs(positions.numel(), 8, rng).view(positions.numel(), 1, 16).double()
    for interleaved in (True, False):
        got = torch_rope.apply(
            x.to(device),
            freqs=freqs.to(device),
            positions=positions.to(device).unsqueeze(-1),
            interleaved=interleaved,
        )
        want = ref.rope_with_frequencies(x, freqs, positions.unsqueeze(-1), interleaved=interleaved)
        bound = pair_bound(x, interleaved, 1.0) * 2.0**-50
        assert ((got.cpu() - want).abs() <= bound).all()


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_table_free_tables_would_fail_where_it_holds(device):
    """Why the form exists, as a check: at position 2^31 a float32 table (or HF's float32 eager
    formula) is off by far more than one ulp of the pair, the frequency form is not."""
    freqs = theta_freqs(10000.0, 16)
    positions = torch.tensor([2**31 - 1, 2**31 + 12345])
    x = torch.randn(2, 1, 16)
    want = ref.rope_with_frequencies(x, freqs, positions.unsqueeze(-1), interleaved=False)
    got = torch_rope.apply(
        x.to(device), freqs=freqs.to(device), positions=positions.to(device).unsqueeze(-1),
        interleaved=False,
    )  # fmt: skip
    check_bound(got, want, x, False, 1.0, "frequency form")
    # HF's eager formula in float32: angle = float32(p) * float32(inv_freq).
    angle = positions.float().unsqueeze(-1) * freqs.float()
    c, s = angle.cos(), angle.sin()
    a, b = x[..., :8], x[..., 8:]
    c, s = c.unsqueeze(1), s.unsqueeze(1)
    hf = torch.cat([a * c - b * s, a * s + b * c], -1)
    assert ((hf.double() - want).abs() > 1e3 * U23 * pair_bound(x, False, 1.0)).any()


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_positions_int32_and_int64_agree_and_broadcast(device):
    freqs = theta_freqs(10000.0, 64).to(device)
    x = torch.randn(2, 4, 9, 64, device=device)
    p64 = torch.arange(9, device=device) * 1000003
    a = torch_rope.apply(x, freqs=freqs, positions=p64)
    b = torch_rope.apply(x, freqs=freqs, positions=p64.int())
    assert torch.equal(a, b)
    # (B, 1, S) per sequence, and an expanded (stride 0) positions tensor.
    per_seq = torch.stack([p64, p64 + 7]).unsqueeze(1)
    c = torch_rope.apply(x, freqs=freqs, positions=per_seq)
    assert torch.equal(c[0], a[0])
    d = torch_rope.apply(x, freqs=freqs, positions=p64.expand(2, 4, 9))
    assert torch.equal(d, a)


# ---- every scaling variant, table-free ------------------------------------------------------

SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 512},
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 256},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
    "longrope": {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.1 * k for k in range(16)],
        "long_factor": [2.0 + 0.2 * k for k in range(16)],
        "original_max_position_embeddings": 256,
        "factor": 4.0,
    },
    "proportional": {"rope_type": "proportional", "factor": 2.0, "partial_rotary_factor": 0.5},
}


@pytest.mark.parametrize("name", list(SCALINGS))
def test_every_scaling_variant_agrees_with_its_float64_tables(name):
    """rope_frequencies gives each variant's float64 frequencies and attention factor; the
    frequency form with them rotates as the float64 tables of the same variant (rope_tables:
    the same builder) within float32 rounding."""
    scaling = SCALINGS[name]
    seq_len = 1024
    freqs, af = torch_rope.rope_frequencies(5e5, 32, scaling=scaling, seq_len=seq_len)
    assert freqs.dtype == torch.float64 and freqs.shape == (16,)
    # rope_tables evaluates dynamic and longrope at the table length, as rope_frequencies does
    # at seq_len.
    cos, sin = torch_rope.rope_tables(5e5, 32, seq_len, scaling=scaling, dtype=torch.float64)
    x = torch.randn(3, 2, 40, seq_len // 8, dtype=torch.float64).transpose(-1, -2).contiguous()
    x = x[..., :32].contiguous()
    positions = torch.arange(0, seq_len, 8)
    for interleaved in (True, False):
        got = torch_rope.apply(
            x, freqs=freqs, positions=positions, attention_factor=af, interleaved=interleaved
        )
        want = torch_rope.apply(x, cos, sin, positions, interleaved=interleaved)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        got32 = torch_rope.apply(
            x.float(), freqs=freqs, positions=positions, attention_factor=af,
            interleaved=interleaved,
        )  # fmt: skip
        torch.testing.assert_close(got32, want.float(), rtol=2e-6, atol=2e-6)


def test_vision_axial_frequencies_table_free():
    """A vision tower's 2-D RoPE (axial_inv_freq, patch_positions, mrope_section) table-free
    equals its float64 tables."""
    inv_freq, section = torch_rope.vision.axial_inv_freq(10000.0, 32, num_axes=2)
    positions = torch_rope.vision.patch_positions(torch.tensor([[1, 4, 6], [2, 2, 2]]), 2)
    cos, sin = torch_rope.rope_tables_from_inv_freq(inv_freq, 16, dtype=torch.float64)
    q = torch.randn(positions.shape[0], 3, 32, dtype=torch.float64)
    p = positions.unsqueeze(-2)
    for per_axis in ("restart", "alternate"):
        inv_freq, section = torch_rope.vision.axial_inv_freq(10000.0, 32, 2, per_axis=per_axis)
        cos, sin = torch_rope.rope_tables_from_inv_freq(inv_freq, 16, dtype=torch.float64)
        got = torch_rope.apply(
            q, freqs=inv_freq, positions=p, interleaved=False, mrope_section=section
        )
        want = torch_rope.apply(q, cos, sin, p, interleaved=False, mrope_section=section)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mrope_interleaved", [False, True])
def test_multi_axis_positions_use_each_planes_axis(mrope_interleaved):
    section = [2, 3, 3]
    freqs = theta_freqs(10000.0, 16)
    x = torch.randn(5, 2, 16)
    positions = torch.randint(0, 2**40, (5, 1, 3))
    for interleaved in (True, False):
        got = torch_rope.apply(
            x, freqs=freqs, positions=positions, interleaved=interleaved,
            mrope_section=section, mrope_interleaved=mrope_interleaved,
        )  # fmt: skip
        want = ref.rope_with_frequencies(
            x, freqs, positions, interleaved=interleaved, mrope_section=section,
            mrope_interleaved=mrope_interleaved,
        )  # fmt: skip
        check_bound(got, want, x, interleaved, 1.0, "multi-axis")


# ---- every CPU kernel copy gives the same bits -------------------------------------------------

_SCRIPT = """
import torch, torch_rope, references as ref, sys
torch.manual_seed(0)
out = []
for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
    for il in (True, False):
        x = torch.randn(3, 5, 2, 112, dtype=torch.float64).to(dtype)
        f = ref.inv_freq(104, 1e4)
        p = torch.tensor([0, 5, 2**40 + 3, 2**61 + 1, 77])
        y = torch_rope.apply(x, freqs=f, positions=p.view(5, 1), interleaved=il, inverse=not il)
        cu = torch.tensor([0, 2, 2, 5])
        z = torch_rope.apply(x[0], freqs=f, cu_seqlens=cu, seq_offsets=torch.tensor([9, 0, 2**50]),
                             interleaved=il, attention_factor=1.25)
        out.append(torch.cat([y.double().flatten(), z.double().flatten()]))
torch.save(torch.cat(out), sys.argv[1] if len(sys.argv) > 1 else "/dev/null")
print(torch_rope._C.cpu_kernel_variant())
"""


def test_every_cpu_kernel_copy_gives_the_same_bits(tmp_path):
    flags = cpu_flags()
    results = {}
    for kernel in ("default", "avx2", "avx512", "avx512_bf16"):
        if flags is None or missing_cpu_flags(kernel, flags):
            continue  # a copy this CPU cannot run (test_cpu_capability names the skip)
        path = tmp_path / f"{kernel}.pt"
        default_path = 'sys.argv[1] if len(sys.argv) > 1 else "/dev/null"'
        script = _SCRIPT.replace(default_path, repr(str(path)))
        done = run_python(script, with_test_modules=True, TORCH_ROPE_CPU_KERNEL=kernel)
        assert done.returncode == 0, done.stderr
        results[kernel] = torch.load(path)
    assert "default" in results
    for kernel, values in results.items():
        assert torch.equal(values.view(torch.int64), results["default"].view(torch.int64)), kernel


# ---- the long sweeps ----------------------------------------------------------------------------


def convergent_positions(f, unit, limit=2**40):
    """Positions p <= limit with p f within a hair of a multiple of `unit` (the denominators of
    the continued fraction of f / unit): the angles nearest a zero of sin or cos."""
    import mpmath

    qs = []
    with mpmath.workprec(400):
        v = abs(mpmath.mpf(f)) / unit
        q_prev, q = 1, 0
        for _ in range(200):
            a = int(mpmath.floor(v))
            q_prev, q = q, a * q + q_prev
            if q > limit:
                break
            qs.append(q)
            rest = v - a
            if rest == 0:
                break
            v = 1 / rest
    return qs


@pytest.mark.slow
@pytest.mark.parametrize("theta,rotary_dim", [(1e4, 128), (5e5, 128), (1e6, 64)])
def test_float32_bound_at_the_worst_positions(theta, rotary_dim):
    import mpmath

    freqs = theta_freqs(theta, rotary_dim)
    rng = random.Random(344)
    worst = 0.0
    for k in range(0, rotary_dim // 2, 4):
        f = float(freqs[k])
        with mpmath.workprec(400):
            near_quarter = set(convergent_positions(f, mpmath.pi / 2))
            ps = sorted(near_quarter | set(convergent_positions(f, mpmath.pi)))
        positions = torch.tensor(ps)
        x = adversarial_pairs(positions.numel(), rotary_dim // 2, rng).view(
            positions.numel(), 1, rotary_dim
        )
        for interleaved in (True, False):
            got = torch_rope.apply(
                x, freqs=freqs, positions=positions.unsqueeze(-1), interleaved=interleaved
            )
            want = ref.rope_with_frequencies(
                x, freqs, positions.unsqueeze(-1), interleaved=interleaved
            )
            worst = max(worst, check_bound(got, want, x, interleaved, 1.0, "worst positions"))
    print(f"[worst positions, theta {theta}, d {rotary_dim}] max error / bound = {worst:.4f}")


@pytest.mark.slow
def test_float32_bound_long_sweep():
    rng = random.Random(345)
    freqs = torch.tensor([2.0 ** rng.uniform(-30, 4) for _ in range(24)], dtype=torch.float64)
    positions = torch.tensor(spread_positions(400, rng, top=62))
    x = adversarial_pairs(positions.numel(), 24, rng).view(positions.numel(), 1, 48)
    worst = 0.0
    for interleaved in (True, False):
        got = torch_rope.apply(
            x, freqs=freqs, positions=positions.unsqueeze(-1), interleaved=interleaved,
            attention_factor=1.3,
        )  # fmt: skip
        want = ref.rope_with_frequencies(
            x, freqs, positions.unsqueeze(-1), attention_factor=1.3, interleaved=interleaved
        )
        worst = max(worst, check_bound(got, want, x, interleaved, 1.3, "long sweep"))
    print(f"[long sweep, {positions.numel()} positions to 2^62] max error / bound = {worst:.4f}")
