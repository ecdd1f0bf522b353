# SPDX-License-Identifier: BSD-3-Clause
"""RoPE scaling variants: Hugging Face ``rope_parameters`` dicts -> the C++ builder's typed options.

The keys and defaults are those of transformers' ``ROPE_INIT_FUNCTIONS`` (``modeling_rope_utils``),
plus two that a transformers config keeps outside the dict:

* ``max_position_embeddings``: ``config.max_position_embeddings``. Required by ``dynamic`` (its
  pretraining length); read by ``yarn`` and ``longrope`` only when ``factor`` is absent.
* ``seq_len``: the sequence length ``dynamic`` and ``longrope`` are evaluated at (default: the
  table's ``max_seq_len``).

The math itself is C++ (``csrc/scaling.cpp``), in float64.
"""

import math
import numbers
from typing import Any, Mapping, Optional, Tuple

import torch
from torch import Tensor

from . import _C

#: rope_type -> (required keys, optional keys), as transformers validates them.
_KEYS = {
    "default": (set(), set()),
    "linear": ({"factor"}, set()),
    "dynamic": ({"factor", "max_position_embeddings"}, {"seq_len"}),
    "yarn": (
        {"original_max_position_embeddings"},
        {
            "factor",
            "max_position_embeddings",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "truncate",
        },
    ),
    "llama3": (
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
        set(),
    ),
    "longrope": (
        {"short_factor", "long_factor", "original_max_position_embeddings"},
        {"factor", "max_position_embeddings", "attention_factor", "seq_len"},
    ),
    "proportional": (set(), {"factor", "partial_rotary_factor"}),
}

#: Keys any variant may carry: the type, theta (checked against the theta argument) and the
#: rotary fraction, which the caller has already applied to rotary_dim (except 'proportional').
_COMMON = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}

SUPPORTED_ROPE_TYPES = tuple(_KEYS)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    return float(value)


def _integer(name: str, value: Any) -> int:
    """An int argument: a float (even 100.0) or a bool is a TypeError, as in Python's range()."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def _length(name: str, value: Any) -> int:
    """A length inside a rope_parameters dict: configs sometimes store 8192.0; accept exact ones."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return _integer(f"scaling[{name!r}]", value)


def _optional(params: Mapping[str, Any], key: str, convert):
    value = params.get(key)
    return None if value is None else convert(key, value)


def rope_type_of(scaling: Optional[Mapping[str, Any]]) -> str:
    """The variant a ``rope_parameters`` dict names (``'default'`` when it names none)."""
    if not scaling:
        return "default"
    return scaling.get("rope_type", scaling.get("type", "default")) or "default"


def parse_scaling(scaling: Optional[Mapping[str, Any]], theta: float):
    """Validate a ``rope_parameters`` dict and return the C++ option object for it."""
    if scaling is None:
        return _C.NoScaling()
    if not isinstance(scaling, Mapping):
        raise TypeError(
            "scaling must be a transformers rope_parameters dict such as "
            f"{{'rope_type': 'llama3', 'factor': 8.0, ...}} or None, got {type(scaling).__name__}"
        )
    rope_type = rope_type_of(scaling)
    if rope_type not in _KEYS:
        raise ValueError(
            f"scaling: rope_type {rope_type!r} is not supported; supported rope types: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    required, optional = _KEYS[rope_type]
    present = {k for k, v in scaling.items() if v is not None}
    missing = sorted(required - present)
    if missing:
        raise ValueError(f"scaling: rope_type {rope_type!r} needs {', '.join(missing)}")
    unknown = sorted(set(scaling) - required - optional - _COMMON)
    if unknown:
        raise ValueError(
            f"scaling: unexpected key(s) {', '.join(map(repr, unknown))} for rope_type "
            f"{rope_type!r} (accepted: {', '.join(sorted(required | optional | _COMMON))})"
        )
    if scaling.get("rope_theta") is not None:
        given = _number("rope_theta", scaling["rope_theta"])
        if not math.isclose(given, theta, rel_tol=1e-12):
            raise ValueError(
                f"scaling: rope_theta = {given} disagrees with theta = {theta}; pass the same value"
            )

    p = scaling
    if rope_type == "default":
        return _C.NoScaling()
    if rope_type == "linear":
        return _C.LinearScaling(factor=_number("factor", p["factor"]))
    if rope_type == "dynamic":
        return _C.DynamicNTKScaling(
            factor=_number("factor", p["factor"]),
            max_position_embeddings=_length(
                "max_position_embeddings", p["max_position_embeddings"]
            ),
            seq_len=_optional(p, "seq_len", _length),
        )
    if rope_type == "yarn":
        # transformers: `get("beta_fast") or 32`, so 0 and None both mean the default.
        return _C.YarnScaling(
            factor=_optional(p, "factor", _number),
            original_max_position_embeddings=_length(
                "original_max_position_embeddings", p["original_max_position_embeddings"]
            ),
            max_position_embeddings=_optional(p, "max_position_embeddings", _length),
            beta_fast=_number("beta_fast", p.get("beta_fast") or 32),
            beta_slow=_number("beta_slow", p.get("beta_slow") or 1),
            mscale=_optional(p, "mscale", _number),
            mscale_all_dim=_optional(p, "mscale_all_dim", _number),
            attention_factor=_optional(p, "attention_factor", _number),
            truncate=bool(p.get("truncate", True)),
        )
    if rope_type == "llama3":
        return _C.Llama3Scaling(
            factor=_number("factor", p["factor"]),
            low_freq_factor=_number("low_freq_factor", p["low_freq_factor"]),
            high_freq_factor=_number("high_freq_factor", p["high_freq_factor"]),
            original_max_position_embeddings=_length(
                "original_max_position_embeddings", p["original_max_position_embeddings"]
            ),
        )
    if rope_type == "longrope":
        return _C.LongRopeScaling(
            short_factor=[_number("short_factor", f) for f in p["short_factor"]],
            long_factor=[_number("long_factor", f) for f in p["long_factor"]],
            original_max_position_embeddings=_length(
                "original_max_position_embeddings", p["original_max_position_embeddings"]
            ),
            factor=_optional(p, "factor", _number),
            max_position_embeddings=_optional(p, "max_position_embeddings", _length),
            attention_factor=_optional(p, "attention_factor", _number),
            seq_len=_optional(p, "seq_len", _length),
        )
    assert rope_type == "proportional"
    return _C.ProportionalScaling(
        factor=_number("factor", p.get("factor", 1.0)),
        partial_rotary_factor=_number("partial_rotary_factor", p.get("partial_rotary_factor", 1.0)),
    )


def rope_frequencies(
    theta: float,
    rotary_dim: int,
    *,
    scaling: Optional[Mapping[str, Any]] = None,
    seq_len: int = 1,
) -> Tuple[Tensor, float]:
    """``(inv_freq, attention_scaling)`` of a scaling variant: float64 ``(rotary_dim // 2,)``.

    What the table builder uses: ``cos[p, k] = attention_scaling * cos(p * inv_freq[k])``.
    ``seq_len`` is the length ``dynamic`` and ``longrope`` are evaluated at (a ``seq_len`` key in
    ``scaling`` wins). Compare with transformers' ``ROPE_INIT_FUNCTIONS[rope_type](config)``.
    """
    theta = _number("theta", theta)
    return _C.rope_frequencies(
        theta,
        _integer("rotary_dim", rotary_dim),
        parse_scaling(scaling, theta),
        _integer("seq_len", seq_len),
    )


def rope_tables_from_inv_freq(
    inv_freq: Tensor,
    max_seq_len: int,
    device: Optional[torch.device] = None,
    *,
    attention_scaling: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> Tuple[Tensor, Tensor]:
    """``(cos, sin)`` tables from a ready ``inv_freq`` (``(rotary_dim // 2,)``, any float dtype).

    ``cos[p, k] = attention_scaling * cos(p * inv_freq[k])``, angles in float64, rounded once to
    ``dtype`` (float32 or float64). ``device`` defaults to ``inv_freq``'s.
    """
    if not isinstance(inv_freq, Tensor):
        raise TypeError(f"inv_freq must be a Tensor, got {type(inv_freq).__name__}")
    return _C.rope_tables_from_inv_freq(
        inv_freq,
        _integer("max_seq_len", max_seq_len),
        _number("attention_scaling", attention_scaling),
        dtype,
        None if device is None else torch.device(device),
    )
