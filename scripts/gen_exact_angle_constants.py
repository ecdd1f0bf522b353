#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Writes csrc/common_exact_angle_constants.h: the constants of csrc/common_exact_angle.h,
computed with mpmath.

    .venv/bin/python scripts/gen_exact_angle_constants.py            # rewrite the header
    .venv/bin/python scripts/gen_exact_angle_constants.py --check    # exit 1 if it is stale

What it computes, and what it proves on the way (each check stops the script if it fails):

- The bits of 1/(2*pi), preceded by kInvTwoPiPadBits zero bits, for the Payne-Hanek reduction of
  any finite double f: frac(f / 2pi) comes from a 256-bit window of these bits. The window is
  exact only if no m * 2^e (1 <= m < 2^53, every exponent e of a double) lands within 2^-75 of an
  integer after the scaling by 2^128 / (2*pi): the guard bits below the 128 result bits would
  then be all ones and the dropped tail could carry into the result. For every exponent the
  script takes the continued fraction of beta_e = frac(2^(e+128) / (2*pi)); by the
  best-approximation property of convergents, min over 1 <= m < 2^53 of dist(m * beta_e, Z) is
  dist(q * beta_e, Z) for the last convergent denominator q < 2^53. The smallest over all
  exponents must exceed 2^-75 (it is written into the header).
- Minimax polynomials (Remez, relative error) for sin and cos on [-pi/4, pi/4] (the double path).
- sin(i * pi / 128), i = 0..64, as float-float pairs (the float path's table), and pi as a
  double-double and as a float-float.
"""

import argparse
import math
import struct
import sys
from pathlib import Path

import mpmath
from mpmath import mp, mpf

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "csrc" / "common_exact_angle_constants.h"

PAD_BITS = 192  # zero bits before 1/(2pi): the window of the smallest reduced exponent starts there
WINDOW_BITS = 256  # bits of 1/(2pi) that one reduction multiplies by (4 words)
RESULT_BITS = 128
MIN_EXPONENT = -178  # below: |f| < 2^-125 < 2pi * 2^-128, the fraction truncates to 0
MAX_EXPONENT = 971  # f = m * 2^e, m < 2^53: the largest double has e = 1023 - 52
TABLE_STEPS = 64  # float path: sin(i * pi / 128), i = 0..64 (a quadrant in steps of pi/128)
SIN_TERMS = 6  # sin t = t + t^3 * (s0 + s1 z + ... + s5 z^5), z = t^2
COS_TERMS = 6  # cos t = 1 - z/2 + z^2 * (c0 + c1 z + ... + c5 z^5)


# ---- 1/(2pi) ------------------------------------------------------------------------------------
def inv_two_pi_words():
    """(words, worst): the padded bit string of 1/(2pi) as 64-bit words, MSB first, long enough for
    the window of the largest exponent plus one word for the shift; and log2 of the smallest
    dist(m * beta_e, Z) over all exponents (see the module docstring)."""
    # The window of exponent e starts at bit PAD_BITS + e (0-based) and spans 5 words (4 whole ones
    # once shifted into place).
    words = ((PAD_BITS + MAX_EXPONENT) >> 6) + 5
    total = 64 * words
    mp.prec = total + 512
    inv = 1 / (2 * mp.pi)  # < 1: its bits r_1 r_2 ... start right after the binary point
    bits = int(mpmath.floor(inv * mpf(2) ** (total - PAD_BITS)))
    assert bits.bit_length() <= total - PAD_BITS
    out = [(bits >> (64 * (words - 1 - k))) & (2**64 - 1) for k in range(words)]

    # The proof of the window's exactness: continued fractions of beta_e = frac(2^(e+128) / 2pi),
    # from 300 bits past the binary point (plenty for denominators near 2^53).
    extra = 300
    scale_bits = int(mpmath.floor(inv * mpf(2) ** (MAX_EXPONENT + RESULT_BITS + extra + 64)))
    worst = (1.0, None)
    for e in range(MIN_EXPONENT, MAX_EXPONENT + 1):
        shift = MAX_EXPONENT + 64 - e  # scale_bits >> shift = floor(2^(e+128+extra) / 2pi)
        num = (scale_bits >> shift) % (1 << extra)
        den = 1 << extra
        x, y = num, den
        q_prev, q = 0, 1  # convergent denominators (q_{-1} = 0, q_0 = 1)
        best_q = 1
        first = True
        while y:
            a = x // y
            x, y = y, x - a * y
            if first:  # a_0 = floor(beta) = 0: q_0 = 1 already
                first = False
                continue
            q_prev, q = q, a * q + q_prev
            if q >= 2**53:
                break
            best_q = q
        dist = abs(best_q * num - round(best_q * num / den) * den) / den
        if dist < worst[0]:
            worst = (dist, e)
    worst_log2 = math.log2(worst[0])
    # floor((m * window) mod 2^256 / 2^128) differs from the exact fraction only if the 128 guard
    # bits plus the m < 2^53 dropped tail carry: frac(m * beta_e) > 1 - 2^(53 - 128).
    if not worst_log2 > 53 - (WINDOW_BITS - RESULT_BITS):
        sys.exit(f"the {WINDOW_BITS}-bit window is not exact: worst case 2^{worst_log2:.2f}")
    return out, worst_log2, worst[1]


# ---- minimax polynomials ------------------------------------------------------------------------
def remez(f, weight, degree, a, b, iterations=30):
    """Coefficients (mpf, lowest first) of the degree-`degree` polynomial p minimising
    max |weight(z) * (f(z) - p(z))| over [a, b], and that maximum."""
    n = degree + 2
    nodes = [
        (a + b) / 2 - (b - a) / 2 * mpmath.cos(mp.pi * i / (n - 1)) for i in range(n)
    ]  # Chebyshev extrema
    grid = [a + (b - a) * mpf(i) / 4000 for i in range(4001)]
    for _ in range(iterations):
        rows = [
            [z**j for j in range(degree + 1)] + [(-1) ** i / weight(z)] for i, z in enumerate(nodes)
        ]
        sol = mpmath.lu_solve(mpmath.matrix(rows), mpmath.matrix([f(z) for z in nodes]))
        coeffs = [sol[j] for j in range(degree + 1)]

        def err(z, coeffs=coeffs):
            return weight(z) * (f(z) - mpmath.polyval(coeffs[::-1], z))

        values = [err(z) for z in grid]
        # Local extrema of the error (endpoints included), then one per run of equal signs.
        ext = [
            i
            for i in range(len(grid))
            if (i == 0 or abs(values[i]) >= abs(values[i - 1]))
            and (i == len(grid) - 1 or abs(values[i]) >= abs(values[i + 1]))
        ]
        runs = []
        for i in ext:
            if runs and (values[i] > 0) == (values[runs[-1]] > 0):
                if abs(values[i]) > abs(values[runs[-1]]):
                    runs[-1] = i
            else:
                runs.append(i)
        while len(runs) > n:  # drop the smaller end
            if abs(values[runs[0]]) < abs(values[runs[-1]]):
                runs.pop(0)
            else:
                runs.pop()
        if len(runs) < n:
            break
        nodes = [grid[i] for i in runs]
        levels = [abs(values[i]) for i in runs]
        if max(levels) / min(levels) < 1 + mpf(10) ** -6:
            break
    return coeffs, max(abs(v) for v in values)


def to_double(x):
    return float(mpf(x))  # mpf -> nearest double


def sin_core():
    """s0..s5 of sin t = t + t^3 * S(t^2), minimax in relative error on |t| <= pi/4; s0 is rounded
    to a double first and the rest refitted, so the rounding of -1/6 costs nothing."""
    zmax = (mp.pi / 4) ** 2

    def s(z):
        t = mpmath.sqrt(z)
        return (mpmath.sin(t) - t) / t**3

    def w(z):  # relative error of sin from an error of S
        t = mpmath.sqrt(z)
        return t**3 / mpmath.sin(t)

    lo = mpf(10) ** -6  # the weights vanish at 0: nothing to fit below
    s0 = to_double(remez(s, w, SIN_TERMS - 1, lo, zmax)[0][0])
    rest, err = remez(lambda z: (s(z) - s0) / z, lambda z: w(z) * z, SIN_TERMS - 2, lo, zmax)
    return [s0] + [to_double(c) for c in rest], float(err)


def cos_core():
    """c0..c5 of cos t = 1 - t^2/2 + t^4 * C(t^2), minimax in relative error on |t| <= pi/4."""
    zmax = (mp.pi / 4) ** 2

    def c(z):
        t = mpmath.sqrt(z)
        return (mpmath.cos(t) - 1 + z / 2) / z**2

    def w(z):
        return z**2 / mpmath.cos(mpmath.sqrt(z))

    lo = mpf(10) ** -6  # the weights vanish at 0: nothing to fit below
    c0 = to_double(remez(c, w, COS_TERMS - 1, lo, zmax)[0][0])
    rest, err = remez(lambda z: (c(z) - c0) / z, lambda z: w(z) * z, COS_TERMS - 2, lo, zmax)
    return [c0] + [to_double(c) for c in rest], float(err)


def check_core(coeffs, kind):
    """Max relative error of the double coefficients (evaluated exactly) on a fine grid."""
    worst = 0
    for i in range(1, 2001):
        t = mp.pi / 4 * i / 2000
        z = t * t
        p = mpmath.polyval([mpf(c) for c in coeffs[::-1]], z)
        if kind == "sin":
            approx, exact = t + t**3 * p, mpmath.sin(t)
        else:
            approx, exact = 1 - z / 2 + z**2 * p, mpmath.cos(t)
        worst = max(worst, abs(approx / exact - 1))
    return float(worst)


# ---- formatting ---------------------------------------------------------------------------------
def hex_double(x):
    return float(x).hex()


def f32(x):
    """Nearest float32 to the mpf x, as a Python float."""
    d = float(x)  # nearest double, then the float nearest to the exact value (double rounding is
    # avoided below by correcting against x)
    f = struct.unpack("f", struct.pack("f", d))[0]
    # The nearest float to x: compare the neighbours of f against x exactly.
    bits = struct.unpack("I", struct.pack("f", f))[0]
    cands = [f]
    for b in (bits - 1, bits + 1):
        if 0 <= b < 0x7F800000 or 0x80000000 <= b < 0xFF800000:
            cands.append(struct.unpack("f", struct.pack("I", b))[0])
    return min(cands, key=lambda c: abs(mpf(c) - x))


def hex_float(x):
    """A float32 value (exact as a double) as a C++ hex float literal without trailing zeros."""
    mantissa, exponent = float(x).hex().split("p")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}p{exponent}f"


def float_float(x):
    hi = f32(x)
    lo = f32(x - mpf(hi))
    return hi, lo


def render():
    words, worst_log2, worst_e = inv_two_pi_words()
    mp.prec = 200
    sin_c, _ = sin_core()
    cos_c, _ = cos_core()
    sin_chk, cos_chk = check_core(sin_c, "sin"), check_core(cos_c, "cos")
    pi_hi = to_double(mp.pi)
    pi_lo = to_double(mp.pi - mpf(pi_hi))
    pif_hi, pif_lo = float_float(mp.pi)
    table = [float_float(mpmath.sin(mp.pi * i / 128)) for i in range(TABLE_STEPS + 1)]

    tail_bits = 53 - (WINDOW_BITS - RESULT_BITS)

    def poly(coeffs):  # three to a line
        parts = [
            ", ".join(hex_double(c) for c in coeffs[i : i + 3]) for i in range(0, len(coeffs), 3)
        ]
        return ", \\\n    ".join(parts)

    sin_log, cos_log = math.log2(sin_chk), math.log2(cos_chk)
    head = f"""\
// SPDX-License-Identifier: BSD-3-Clause
// Constants of csrc/common_exact_angle.h, GENERATED by scripts/gen_exact_angle_constants.py
// (mpmath): do not edit; rerun it (`.venv/bin/python scripts/gen_exact_angle_constants.py`)
// instead. The initialiser lists are macros so that the header can place them in host and in
// device memory.
#pragma once

// clang-format off
// 1/(2*pi) as a bit string, MSB first, after ROPE_EXACT_ANGLE_PAD_BITS zero bits, in 64-bit words
// ({len(words)} of them: enough for the {WINDOW_BITS}-bit window of any exponent). The window is
// exact for every finite double (continued-fraction check of the generator): the minimum over
// 1 <= m < 2^53 and all exponents e of dist(m * 2^(e+128) / (2*pi), Z) is 2^{worst_log2:.2f} (at
// e = {worst_e}), above the 2^{tail_bits} that a carry from the dropped tail would need.
#define ROPE_EXACT_ANGLE_PAD_BITS {PAD_BITS}
#define ROPE_EXACT_ANGLE_INV_2PI_WORD_COUNT {len(words)}
#define ROPE_EXACT_ANGLE_INV_2PI_WORDS \\
  {{ \\"""
    out = head.splitlines()
    w = out.append
    for i in range(0, len(words), 3):
        chunk = ", ".join(f"0x{x:016x}ull" for x in words[i : i + 3])
        w(f"    {chunk}, \\")
    middle = f"""\
  }}

// pi as a double-double and as a float-float (hi + lo, |lo| <= ulp(hi) / 2).
#define ROPE_EXACT_ANGLE_PI_HI {hex_double(pi_hi)}
#define ROPE_EXACT_ANGLE_PI_LO {hex_double(pi_lo)}
#define ROPE_EXACT_ANGLE_PI_HI_F {hex_float(pif_hi)}
#define ROPE_EXACT_ANGLE_PI_LO_F {hex_float(pif_lo)}

// sin t = t + t^3 * S(t^2), cos t = 1 - t^2/2 + t^4 * C(t^2) on |t| <= pi/4: minimax (Remez,
// relative error) coefficients, lowest degree first. Relative error of the polynomials with these
// double coefficients, evaluated exactly: sin 2^{sin_log:.1f}, cos 2^{cos_log:.1f}.
#define ROPE_EXACT_ANGLE_SIN_POLY \\
  {{ {poly(sin_c)} }}
#define ROPE_EXACT_ANGLE_COS_POLY \\
  {{ {poly(cos_c)} }}

// sin(i * pi / 128) for i = 0..{TABLE_STEPS} as float-float {{hi, lo}} pairs (cos: the same table
// read backwards).
#define ROPE_EXACT_ANGLE_SIN_TABLE_STEPS {TABLE_STEPS}
#define ROPE_EXACT_ANGLE_SIN_TABLE_F \\
  {{ \\"""
    out.extend(middle.splitlines())
    for hi, lo in table:
        w(f"    {{{hex_float(hi)}, {hex_float(lo)}}}, \\")
    w("  }")
    w("// clang-format on")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the header is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if OUTPUT.read_text() != text:
            sys.exit(f"{OUTPUT.relative_to(REPO)} is stale: rerun {Path(__file__).name}")
        print(f"{OUTPUT.relative_to(REPO)} is up to date")
        return
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
