# SPDX-License-Identifier: BSD-3-Clause
"""The table-free angle core (csrc/common_exact_angle.h) against mpmath, step by step.

Each step is reached through the test hooks `_C._exact_angle_test` / `_C._exact_rotation_test`
(csrc/python/exact_angle_hooks.cpp). The reference is mpmath at 200+ bits (60 decimal digits after
the reduction, which itself runs at the angle's magnitude plus 200 bits): the angle of plane k at
position p is the exact real number p * f_k, f_k the float64 frequency.

- frac(f / 2pi) as a 128-bit truncated fraction: bit-exact, for random finite doubles of every
  exponent and sign, subnormals, the neighbours of 2pi * 2^-128 (where the fraction leaves 0),
  theta-style frequencies (theta 1e4, 5e5, 1e6; d = 64, 128, 256), llama3 / YaRN-scaled ones and
  the largest doubles.
- t = the top 64 bits of frac(p * G): bit-exact against Python integers, and within
  [0, 2^-64 + p 2^-128) turns below the exact frac(p f / 2pi).
- cos / sin of 2pi t / 2^64: the double path within 1 ulp (of double) of cos(2pi t / 2^64) and
  of the exact cos(p f) up to the turn error above; the float path's hi within 0.5 ulp (of float)
  + 2^-30 af (the contract) and its hi + lo within 2^-35 af (what the derivation in the header
  claims), on positions spread over [0, 2^62] (log-uniform, 2^k, 2^k +- 1) and on the worst
  positions the continued fractions of f / (pi/4) and f / (pi/256) give: p f within a hair of a
  multiple of pi/4 (a zero of sin or cos, a quadrant edge of the double path) or of pi/256 (an
  edge of the float path's table).
- the rotation of a pair: every output within 2^-23 af (|xa| + |xb|) (+ 2^-147 absolute, for
  subnormal results) of af (xa cos - xb sin), over adversarial magnitudes: zeros, equal values,
  huge ratios, subnormals.

The long sweeps (more positions, every theta set's worst cases) carry the `slow` mark. The max
errors each test finds are printed (pytest -s).
"""

import math
import random
import struct

import mpmath
import numpy as np
import pytest
import torch
from mpmath import mp, mpf

from torch_rope import _C, rope_frequencies

TWO64 = 2**64
MASK64 = TWO64 - 1


# ---- reference (mpmath) -------------------------------------------------------------------------
def frac_turns(p, f, bits=200):
    """frac(p * f / 2pi) as an mpf correct to about 2^-bits (any sign of f; 1 - tiny included)."""
    x = mpf(f) * p if f != 0 else mpf(0)
    mag = abs(int(mpmath.mag(x))) if x != 0 else 0
    with mpmath.workprec(mag + bits + 64):
        y = mpf(f) * p / (2 * mp.pi)
        return y - mpmath.floor(y)


def fraction128(f):
    """floor(2^128 * frac(f / 2pi)) from mpmath, with a check that no rounding can flip it."""
    mag = abs(int(mpmath.mag(mpf(f)))) if f != 0 else 0
    with mpmath.workprec(mag + 800):
        y = mpf(f) / (2 * mp.pi)
        scaled = (y - mpmath.floor(y)) * mpf(2) ** 128
        n = int(mpmath.floor(scaled))
        assert scaled - n > mpf(2) ** -200 or abs(f) < 2.0**-125
    return n


def cos_sin_turns(v):
    """(cos, sin) of 2pi v at 250 bits, as mpmath's cos and sin of pi (2v): reduced exactly,
    without a rounded pi; exact at the quarter turns (0 and +-1, where a rounded pi would leave a
    sine of 1e-75 that no ulp could measure against)."""
    with mpmath.workprec(250):
        quarter = v * 4
        if quarter == mpmath.floor(quarter):
            return [(mpf(1), mpf(0)), (mpf(0), mpf(1)), (mpf(-1), mpf(0)), (mpf(0), mpf(-1))][
                int(quarter) % 4
            ]
        return mp.cospi_sinpi(2 * v)


def ulp64(v):
    if v == 0:
        return 2.0**-1074
    return 2.0 ** max(int(mpmath.frexp(v)[1]) - 1 - 52, -1074)


def ulp32(v):
    if v == 0:
        return 2.0**-149
    return 2.0 ** max(int(mpmath.frexp(v)[1]) - 1 - 23, -149)


def u64(x):
    return int(x) & MASK64


# ---- inputs -------------------------------------------------------------------------------------
def theta_freqs(theta, d):
    k = np.arange(0, d, 2, dtype=np.float64)
    return (1.0 / theta ** (k / d)).tolist()


def scaled_freqs():
    """(freqs, attention_factor) of llama3 and YaRN from the library's frequency builder (inputs
    only: the reference never uses it)."""
    llama3 = rope_frequencies(
        500000.0,
        128,
        scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    yarn = rope_frequencies(
        1000000.0,
        128,
        scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    )
    return [(llama3[0].tolist(), float(llama3[1])), (yarn[0].tolist(), float(yarn[1]))]


def random_doubles(n, rng):
    """Finite doubles of every exponent (bit patterns: uniform exponent field), both signs."""
    out = []
    while len(out) < n:
        bits = rng.getrandbits(64)
        if (bits >> 52) & 0x7FF == 0x7FF:
            continue
        out.append(struct.unpack("<d", struct.pack("<Q", bits))[0])
    return out


def spread_positions(n_random, rng):
    ps = {0, 1, 2, 3, 2**62}
    for k in range(1, 63):
        ps.update({2**k - 1, 2**k, min(2**k + 1, 2**62)})
    for _ in range(n_random):
        ps.add(int(2.0 ** rng.uniform(0, 62)))
    return sorted(ps)


def convergent_positions(f, unit, limit=2**62, semi=False):
    """Positions p <= limit with p * f within a hair of a multiple of `unit` (an mpf): the
    denominators q_k of the continued fraction of |f| / unit, whose |q_k f / unit - n| are the
    smallest of all p < q_{k+1}; with `semi`, also q_{k-1} + j q_k for j = 1, 2."""
    qs = []
    with mpmath.workprec(400):
        x = abs(mpf(f)) / unit
        q_prev, q = 1, 0  # q_{-2}, q_{-1}
        for _ in range(200):
            a = int(mpmath.floor(x))
            q_prev, q = q, a * q + q_prev
            if q > limit:
                break
            qs.append(q)
            rest = x - a
            if rest == 0:
                break
            x = 1 / rest
    out = set(qs)
    if semi:
        for q0, q1 in zip(qs, qs[1:]):
            out.update(q0 + j * q1 for j in (1, 2) if q0 + j * q1 <= limit)
    return sorted(out)


def call(positions, freqs, path, af=1.0):
    fr, turns, c, s = _C._exact_angle_test(
        torch.tensor(positions, dtype=torch.int64),
        torch.tensor(freqs, dtype=torch.float64),
        path,
        af,
    )
    return fr, turns, c, s


# ---- checks -------------------------------------------------------------------------------------
class Worst:
    """Largest errors seen, printed at the end of a test."""

    def __init__(self, name):
        self.name = name
        self.values = {}

    def add(self, key, value, where):
        if key not in self.values or value > self.values[key][0]:
            self.values[key] = (value, where)

    def report(self):
        for key, (value, where) in sorted(self.values.items()):
            print(f"[{self.name}] max {key} = {value:.4g} at {where}")


def check_turn(p, f, g, t, worst):
    """Step 2: t bit-exact against integers, and 0 <= frac(p f / 2pi) - t / 2^64 < 2^-64 + p
    2^-128. Returns the exact turn and that bound."""
    assert t == ((p * g) % 2**128) >> 64, (p, f)
    v = frac_turns(p, f)
    gap = v - mpf(t) / TWO64
    if gap < 0:  # wrapped: the exact turn is just above an integer, t just below
        gap += 1
    turn_err = 2.0**-64 + p * 2.0**-128
    assert 0 <= gap < turn_err, (p, f, float(gap))
    worst.add("turn error / (2^-64 + p 2^-128)", float(gap) / turn_err, (p, f))
    return v, turn_err


def check_sincos_f64(p, f, v, t, turn_err, cos, sin, af, worst):
    """Step 3a: within 1 ulp of cos(2pi t / 2^64) (1.5 with af != 1: one more rounding), and of
    the exact cos(p f) up to the turn error."""
    ce, se = cos_sin_turns(v)
    ct, st = cos_sin_turns(mpf(t) / TWO64)
    angle_err = 2 * math.pi * turn_err * abs(af)  # bound of |cos(p f) - cos(2pi t / 2^64)|
    ulps = 1.0 if af == 1.0 else 1.5
    for name, got, exact_pf, exact_t in (
        ("cos", cos, ce * af, ct * af),
        ("sin", sin, se * af, st * af),
    ):
        e_t = float(abs(got - exact_t)) / ulp64(exact_t)
        worst.add(f"f64 {name} error vs cos(2pi t) [ulp]", e_t, (p, f))
        assert e_t <= ulps, (name, p, f, e_t)
        assert float(abs(got - exact_pf)) <= ulps * ulp64(exact_pf) + angle_err, (name, p, f)
    return ce, se


def check_sincos_f32(p, f, ce, se, cos_pair, sin_pair, af, worst):
    """Step 3b against the exact angle p f: hi + lo within 2^-35 af, hi within 0.5 ulp +
    2^-30 af, hi = hi + lo rounded to float."""
    for name, pair, exact in (("cos", cos_pair, ce * af), ("sin", sin_pair, se * af)):
        hi, lo = float(pair[0]), float(pair[1])
        e_ff = float(abs(mpf(hi) + lo - exact))
        worst.add(f"f32 {name} hi+lo error / af [2^-35]", e_ff / abs(af) / 2.0**-35, (p, f))
        assert e_ff <= 2.0**-35 * abs(af), (name, p, f, e_ff)
        e_hi = float(abs(hi - exact))
        u = ulp32(exact)
        allowed = 0.5 * u + 2.0**-30 * abs(af)
        worst.add(f"f32 {name} hi error / (0.5 ulp + 2^-30 af)", e_hi / allowed, (p, f))
        if abs(exact) >= 2.0**-5:  # where 2^-30 is below 1/64 ulp: how hi is rounded
            worst.add(f"f32 {name} hi error [ulp], |value| >= 2^-5", e_hi / u, (p, f))
        assert e_hi <= allowed, (name, p, f, e_hi / u)
        assert hi == float(np.float32(mpf(hi) + lo)), (name, p, f)


def check_points(points, worst, af=1.0):
    """points: (positions, freqs) grids. Checks the turns and both sincos paths."""
    count = 0
    with mpmath.workprec(300):
        for positions, freqs in points:
            fr64, t64, c64, s64 = call(positions, freqs, "f64", af)
            fr32, t32, c32, s32 = call(positions, freqs, "f32", af)
            assert torch.equal(fr64, fr32) and torch.equal(t64, t32)
            # Python numbers, exactly the tensors' values (int64, and float64 or float32 as a
            # double): indexing a tensor one element at a time cost a third of the loop below.
            fr64, t64, c64, s64, c32, s32 = (x.tolist() for x in (fr64, t64, c64, s64, c32, s32))
            for k, f in enumerate(freqs):
                g = (u64(fr64[k][0]) << 64) | u64(fr64[k][1])
                for i, p in enumerate(positions):
                    t = u64(t64[i][k])
                    v, turn_err = check_turn(p, f, g, t, worst)
                    cos, sin = float(c64[i][k]), float(s64[i][k])
                    ce, se = check_sincos_f64(p, f, v, t, turn_err, cos, sin, af, worst)
                    check_sincos_f32(p, f, ce, se, c32[i][k], s32[i][k], af, worst)
                    count += 1
    return count


# ---- step 1 -------------------------------------------------------------------------------------
def extreme_freqs():
    tiny = 2.0 * math.pi * 2.0**-128  # the fraction leaves 0 here
    out = [
        0.0,
        -0.0,
        5e-324,
        -5e-324,
        2.0**-1022,
        2.0**-1000,
        2.0**-130,
        2.0**-126,
        2.0**-125,
        tiny,
        math.nextafter(tiny, 0),
        math.nextafter(tiny, 1),
        -tiny,
        1.0,
        -1.0,
        0.5,
        math.pi,
        2 * math.pi,
        math.nextafter(2 * math.pi, 0),
        math.nextafter(2 * math.pi, 10),
        1e10,
        2.0**52,
        2.0**53 + 2,
        1e100,
        1e200,
        1e300,
        1e308,
        2.0**1023,
        1.7976931348623157e308,
        -1.7976931348623157e308,
    ]
    for theta in (1e4, 5e5, 1e6):
        for d in (64, 128, 256):
            out += theta_freqs(theta, d)
    for freqs, _ in scaled_freqs():
        out += freqs
    return out


def check_fractions(freqs):
    fr, _, _, _ = call([0], freqs, "f64")
    for k, f in enumerate(freqs):
        got = (u64(fr[k, 0]) << 64) | u64(fr[k, 1])
        assert got == fraction128(f), (f, hex(got), hex(fraction128(f)))


def test_fraction_exact_extremes():
    check_fractions(extreme_freqs())


def test_fraction_exact_random():
    rng = random.Random(34)
    check_fractions(random_doubles(3000, rng) + [2.0 ** rng.uniform(-40, 40) for _ in range(1000)])


def carry_frequencies(rng, exponents, per_exponent):
    """Frequencies m 2^e whose 53 x 256-bit product with the window of 1/(2pi) carries between
    its 64-bit words (into bits 128 and 64 of the product: one random mantissa in 4096 does), so
    that a dropped or misplaced carry of the reduction shows. Only the choice of inputs looks at
    the algorithm's words; the expected fractions come from mpmath, as for every other input."""
    with mpmath.workprec(1600):
        inv = int(mpmath.floor(mpf(2) ** 1400 / (2 * mp.pi)))  # 1/(2pi) 2^1400
    out = []
    for _ in range(exponents):
        e = rng.randint(-178, 971)
        window = (inv >> (1400 - 256 - e)) % 2**256 if e <= 1144 else 0  # bits e+1 .. e+256
        words = [(window >> (64 * (3 - k))) % 2**64 for k in range(4)]
        found = {"128": 0, "64": 0}
        for _ in range(200000):
            if min(found.values()) >= per_exponent:
                break
            m = rng.randrange(2**52, 2**53)
            hi3 = (m * words[3]) >> 64
            lo2, hi2 = (m * words[2]) % 2**64, (m * words[2]) >> 64
            lo1 = (m * words[1]) % 2**64
            kind = "64" if hi3 + lo2 >= 2**64 else "128" if lo1 + hi2 >= 2**64 else None
            if kind and found[kind] < per_exponent:
                found[kind] += 1
                out.append(math.ldexp(m, e) * rng.choice((1, -1)))
    return out


def test_fraction_exact_where_the_product_carries():
    check_fractions(carry_frequencies(random.Random(42), 40, 2))


def test_fraction_of_negative_frequency_is_the_complement():
    """floor(2^128 frac(-x)) = ~floor(2^128 frac(x)): checked by the reference above too; here
    on its own, since the sign rule is a design choice the kernels rely on."""
    rng = random.Random(35)
    freqs = [abs(x) for x in random_doubles(200, rng)] + [1.0, 1e-3, 2.0**-200]
    pos, _, _, _ = call([0], freqs, "f64")
    neg, _, _, _ = call([0], [-f for f in freqs], "f64")
    for k, f in enumerate(freqs):
        a = (u64(pos[k, 0]) << 64) | u64(pos[k, 1])
        b = (u64(neg[k, 0]) << 64) | u64(neg[k, 1])
        assert b == (~a) & (2**128 - 1), f


def test_fraction_of_non_finite_is_zero():
    fr, _, _, _ = call([0], [math.inf, -math.inf, math.nan], "f64")
    assert fr.eq(0).all()


# ---- steps 2 and 3 ------------------------------------------------------------------------------
def test_turns_and_sincos_spread():
    """theta 1e4, d = 128 at positions over [0, 2^62], and random frequencies."""
    rng = random.Random(36)
    worst = Worst("spread")
    positions = spread_positions(40, rng)
    n = check_points([(positions, theta_freqs(1e4, 128))], worst)
    freqs = [2.0 ** rng.uniform(-30, 20) * rng.choice((1, -1)) for _ in range(24)]
    n += check_points([(positions[::4], freqs)], worst)
    worst.report()
    print(f"[spread] {n} (position, frequency) pairs")


def test_sincos_attention_factor():
    """YaRN's attention factor scales both paths (f32: as a float-float)."""
    rng = random.Random(37)
    (llama3, _), (yarn, af) = scaled_freqs()
    assert af != 1.0
    worst = Worst("attention factor")
    positions = spread_positions(8, rng)[::3]
    check_points([(positions, yarn[::4])], worst, af=af)
    check_points([(positions, llama3[::8])], worst, af=0.7)
    worst.report()


def worst_case_points(freqs, semi=False):
    units = (mp.pi / 4, mp.pi / 256)
    out = []
    for f in freqs:
        ps = set()
        for unit in units:
            ps.update(convergent_positions(f, unit, semi=semi))
        out.append((sorted(ps), [f]))
    return out


def test_sincos_worst_positions_theta_1e4_d128():
    """Positions where p f is closest to a multiple of pi/4 or pi/256, for every plane of a
    theta-10000, d = 128 model."""
    worst = Worst("worst positions, theta 1e4 d 128")
    with mpmath.workprec(400):
        points = worst_case_points(theta_freqs(1e4, 128))
    n = check_points(points, worst)
    worst.report()
    print(f"[worst] {n} (position, frequency) pairs")


@pytest.mark.slow
def test_sincos_worst_positions_all_theta_sets():
    worst = Worst("worst positions, all sets")
    freqs = []
    for theta in (1e4, 5e5, 1e6):
        for d in (64, 256):
            freqs += theta_freqs(theta, d)
    for fs, _ in scaled_freqs():
        freqs += fs
    n = check_points(worst_case_points(freqs, semi=True), worst)
    worst.report()
    print(f"[worst, slow] {n} pairs")


@pytest.mark.slow
def test_sincos_spread_long():
    rng = random.Random(38)
    worst = Worst("spread, slow")
    positions = spread_positions(400, rng)
    n = 0
    for theta, d in ((1e4, 128), (5e5, 128), (1e6, 256)):
        n += check_points([(positions, theta_freqs(theta, d)[::2])], worst)
    freqs = [x for x in random_doubles(400, rng) if 2.0**-40 < abs(x) < 2.0**40][:64]
    freqs += [2.0 ** rng.uniform(-40, 40) for _ in range(64)]
    n += check_points([(positions[::8], freqs)], worst)
    worst.report()
    print(f"[spread, slow] {n} pairs")


# ---- step 4 -------------------------------------------------------------------------------------
def adversarial_pairs(rng, n_random):
    """(xa, xb) float32 pairs: zeros, equal, opposite, huge ratios, subnormals, random exponents."""
    f32 = np.float32
    specials = [
        1.0,
        -1.0,
        0.0,
        1.5,
        3.0,
        2.0**-30,
        2.0**30,
        1e-38,
        1.1754944e-38,  # smallest normal
        2.0**-149,  # smallest subnormal
        3.0 * 2.0**-149,
        1e-40,
        1e-45,
        3.0e38,
        65504.0,
    ]
    pairs = []
    for a in specials:
        for b in specials:
            pairs.append((a, b))
            pairs.append((a, -b))
    for _ in range(n_random):
        ea, eb = rng.randint(-149, 126), rng.randint(-149, 126)
        if rng.random() < 0.5:
            eb = ea + rng.randint(-30, 30)
        a = rng.uniform(1, 2) * 2.0**ea * rng.choice((1, -1))
        b = rng.uniform(1, 2) * 2.0 ** max(min(eb, 126), -149) * rng.choice((1, -1))
        pairs.append((a, b))
    xa = np.array([p[0] for p in pairs], dtype=f32)
    xb = np.array([p[1] for p in pairs], dtype=f32)
    return xa, xb


def rotation_angles(rng, count):
    """(p, f) pairs: theta 1e4 planes at spread and worst positions, plus random frequencies."""
    freqs = theta_freqs(1e4, 128)
    out = []
    for _ in range(count):
        f = rng.choice(freqs) if rng.random() < 0.7 else 2.0 ** rng.uniform(-20, 10)
        p = int(2.0 ** rng.uniform(0, 62)) if rng.random() < 0.8 else rng.randint(0, 1000)
        out.append((p, f))
    with mpmath.workprec(400):
        for f in freqs[::16]:
            out += [(p, f) for p in convergent_positions(f, mp.pi / 4)[-4:]]
    return out


def check_rotation(angles, xa, xb, af, path, worst):
    """Every pair of (xa, xb) rotated by every angle, against af (xa cos - xb sin) in float64
    from mpmath's cos / sin (whose own error, under 2^-51 af (|xa| + |xb|), is allowed for).
    Asserted: the bound the header proves, 2^-24 (1 + 2^-10) af (|xa| + |xb|) + 2^-147, half the
    contract's; reported: the error over the contract's 2^-23 af (|xa| + |xb|) + 2^-147."""
    A = np.abs(xa.astype(np.float64))
    B = np.abs(xb.astype(np.float64))
    bound = 2.0**-23 * af * (A + B) + 2.0**-147
    proven = 2.0**-24 * (1 + 2.0**-10) * af * (A + B) + 2.0**-147
    ref_slack = 2.0**-50 * af * (A + B)
    n = len(xa)
    for p, f in angles:
        _, _, c, s = call([p], [f], path, af)
        ce, se = cos_sin_turns(frac_turns(p, f))
        cos_e, sin_e = float(ce), float(se)
        if path == "f32":
            cc = c[0, 0].expand(n, 2).contiguous()
            ss = s[0, 0].expand(n, 2).contiguous()
        else:
            cc = c[0, 0].expand(n).contiguous()
            ss = s[0, 0].expand(n).contiguous()
        ya, yb = _C._exact_rotation_test(torch.from_numpy(xa), torch.from_numpy(xb), cc, ss, path)
        ya = ya.numpy().astype(np.float64)
        yb = yb.numpy().astype(np.float64)
        a64, b64 = xa.astype(np.float64), xb.astype(np.float64)
        ref_a = af * (a64 * cos_e - b64 * sin_e)
        ref_b = af * (a64 * sin_e + b64 * cos_e)
        for name, got, ref in (("ya", ya, ref_a), ("yb", yb, ref_b)):
            err = np.abs(got - ref)
            ratio = err / bound
            i = int(np.argmax(ratio))
            worst.add(
                f"{path} {name} error / 2^-23 af (|xa| + |xb|)",
                float(ratio[i]),
                (p, f, xa[i], xb[i]),
            )
            bad = err > proven + ref_slack
            assert not bad.any(), (
                path,
                name,
                p,
                f,
                xa[bad][:3],
                xb[bad][:3],
                got[bad][:3],
                ref[bad][:3],
            )


@pytest.mark.parametrize("path", ["f32", "f64"])
def test_rotation_bound_float32(path):
    rng = random.Random(39)
    xa, xb = adversarial_pairs(rng, 1500)
    finite = np.abs(xa.astype(np.float64)) + np.abs(xb.astype(np.float64)) < 1e38
    xa, xb = xa[finite], xb[finite]  # overflow: its own test below
    worst = Worst(f"rotation {path}")
    angles = rotation_angles(rng, 60)
    check_rotation(angles, xa, xb, 1.0, path, worst)
    (_, _), (_, af) = scaled_freqs()
    check_rotation(angles[::6], xa, xb, af, path, worst)
    worst.report()


def test_rotation_overflow_is_inf():
    """A result beyond the float range is +-inf on the float path (not inf - inf = NaN in the
    compensation), and a result just inside it stays finite."""
    xa = np.array([3.0e38, -3.0e38, 3.0e38, 3.0e38, 2.0e38], dtype=np.float32)
    xb = np.array([-3.0e38, 3.0e38, 3.0e38, 0.0, -2.0e38], dtype=np.float32)
    _, _, c, s = call([1], [math.pi / 4], "f32")  # cos = sin = 0.7071...
    n = len(xa)
    ya, yb = _C._exact_rotation_test(
        torch.from_numpy(xa),
        torch.from_numpy(xb),
        c[0, 0].expand(n, 2).contiguous(),
        s[0, 0].expand(n, 2).contiguous(),
        "f32",
    )
    cos_e = sin_e = math.cos(math.pi / 4)
    flt_max = float(np.finfo(np.float32).max)
    for a, b, got_a, got_b in zip(xa.tolist(), xb.tolist(), ya.tolist(), yb.tolist()):
        for got, ref in ((got_a, a * cos_e - b * sin_e), (got_b, a * sin_e + b * cos_e)):
            if abs(ref) > flt_max * (1 + 2.0**-23):
                assert got == math.copysign(math.inf, ref), (a, b, got, ref)
            else:
                assert math.isfinite(got) and abs(got - ref) <= 2.0**-23 * (abs(a) + abs(b))


@pytest.mark.slow
def test_rotation_bound_float32_long():
    rng = random.Random(40)
    xa, xb = adversarial_pairs(rng, 20000)
    finite = np.abs(xa.astype(np.float64)) + np.abs(xb.astype(np.float64)) < 1e38
    xa, xb = xa[finite], xb[finite]
    worst = Worst("rotation, slow")
    angles = rotation_angles(rng, 300)
    for path in ("f32", "f64"):
        check_rotation(angles, xa, xb, 1.0, path, worst)
    worst.report()


def test_rotation_float64_inputs():
    """float64 x: rotation in double with double cos / sin, within 2^-50.5 af (|xa| + |xb|)."""
    rng = random.Random(41)
    worst = Worst("rotation f64 inputs")
    pairs = [(rng.uniform(-1, 1) * 2.0 ** rng.randint(-60, 60), 0.0) for _ in range(20)]
    pairs += [
        (rng.uniform(-1, 1), rng.uniform(-1, 1) * 2.0 ** rng.randint(-40, 40)) for _ in range(80)
    ]
    pairs += [(1.0, 1.0), (1.0, -1.0), (0.0, 1.0), (1e-300, 1e-300)]
    xa = torch.tensor([q[0] for q in pairs], dtype=torch.float64)
    xb = torch.tensor([q[1] for q in pairs], dtype=torch.float64)
    n = len(pairs)
    for p, f in rotation_angles(rng, 12):
        _, _, c, s = call([p], [f], "f64")
        ya, yb = _C._exact_rotation_test(
            xa, xb, c[0, 0].expand(n).contiguous(), s[0, 0].expand(n).contiguous(), "f64"
        )
        ce, se = cos_sin_turns(frac_turns(p, f))
        for j, (a, b) in enumerate(pairs):
            with mpmath.workprec(250):
                ra = mpf(a) * ce - mpf(b) * se
                rb = mpf(a) * se + mpf(b) * ce
            bound = 2.0**-50.5 * (abs(a) + abs(b)) + 2.0**-1070
            for got, ref in ((float(ya[j]), ra), (float(yb[j]), rb)):
                err = float(abs(got - ref))
                worst.add("f64-input error / bound", err / bound, (p, f, a, b))
                assert err <= bound, (p, f, a, b, got)
    worst.report()


def test_hook_rejects_bad_input():
    with pytest.raises(RuntimeError, match="positions must be >= 0"):
        call([-1], [1.0], "f64")
    with pytest.raises(RuntimeError, match="path must be 'f64' or 'f32'"):
        call([1], [1.0], "f16")
