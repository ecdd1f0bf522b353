# SPDX-License-Identifier: BSD-3-Clause
"""The cos/sin tables and frequencies of plain or scaled RoPE, from the C++ builder
(``rope_tables`` is re-exported by :mod:`torch_rope.ops`; it, ``rope_frequencies`` and
``rope_tables_from_inv_freq`` by :mod:`torch_rope`), and the scaling variants they take.

Scaling variants: Hugging Face ``rope_parameters`` dicts -> the C++ builder's options.

This module only coerces Python values to C++ types; the keys, defaults and checks of each variant
are C++'s (``csrc/scaling_parameters.cpp``, one key table per variant). The keys and defaults are
those of transformers' ``ROPE_INIT_FUNCTIONS`` (``modeling_rope_utils``), plus two that a
transformers config keeps outside the dict:

* ``max_position_embeddings``: ``config.max_position_embeddings``. Required by ``dynamic`` (its
  pretraining length); read by ``yarn`` and ``longrope`` only when ``factor`` is absent.
* ``seq_len``: the sequence length ``dynamic`` and ``longrope`` are evaluated at (default: the
  table's ``max_seq_len``).

The math itself is C++ (``csrc/scaling.cpp``), in float64.
"""

import numbers
from typing import Any, Mapping, Optional, Tuple

import torch
from torch import Tensor

from ._native import _C

#: The rope_type names the C++ parser accepts (csrc/scaling_parameters.cpp holds their keys).
SUPPORTED_ROPE_TYPES = tuple(_C.supported_rope_types())


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    return float(value)


def _integer(name: str, value: Any) -> int:
    """An int argument: a float (even 100.0) or a bool is a TypeError, as in Python's range(); an
    int that C++'s int64_t cannot hold is a ValueError naming the argument (the binding would
    raise a TypeError that names none)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{name} must fit in int64, [-2**63, 2**63 - 1], got {value}")
    return value


def _coerce(key: str, value: Any):
    """One rope_parameters value as the C++ parser's types: bool, int, float, a list of floats
    (per-plane factors) or str. Validation of keys and values is the C++ parser's."""
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (list, tuple)) or (isinstance(value, Tensor) and value.dim() == 1):
        values = value.tolist() if isinstance(value, Tensor) else value
        if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
            return [float(v) for v in values]
    raise TypeError(
        f"scaling[{key!r}] must be a number, a bool, a str or a list of numbers, got "
        f"{type(value).__name__} {value!r}"
    )


def parse_scaling(scaling: Optional[Mapping[str, Any]], theta: float):
    """Validate a ``rope_parameters`` dict and return the C++ option object for it (the keys,
    defaults and checks of each variant are C++'s: csrc/scaling_parameters.cpp)."""
    if scaling is None:
        return _C.Scaling()
    if not isinstance(scaling, Mapping):
        raise TypeError(
            "scaling must be a transformers rope_parameters dict such as "
            f"{{'rope_type': 'llama3', 'factor': 8.0, ...}} or None, got {type(scaling).__name__}"
        )
    parameters = {
        str(key): _coerce(str(key), value) for key, value in scaling.items() if value is not None
    }
    return _C.parse_scaling(parameters, theta)


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


def rope_tables(
    theta: float,
    rotary_dim: int,
    max_seq_len: int,
    device: Optional[torch.device] = None,
    *,
    scaling: Optional[dict] = None,
    dtype: torch.dtype = torch.float32,
) -> Tuple[Tensor, Tensor]:
    """Build ``(cos, sin)`` tables of shape ``(max_seq_len, rotary_dim // 2)``.

    ``cos[p, k] = attention_scaling * cos(p * inv_freq[k])``, with ``inv_freq[k] =
    theta ** (-2k / rotary_dim)`` unless ``scaling`` says otherwise. ``scaling`` is a transformers
    ``rope_parameters`` dict (``{"rope_type": "llama3", "factor": 8.0, ...}``; see docs/api.md,
    "Scaling variants"). Angles are computed in float64 and rounded once to ``dtype`` (float32,
    or float64 for float64 inputs). Built in chunks by the same C++ function the C++ module
    uses, so the peak memory is the tables themselves.
    """
    theta = _number("theta", theta)
    return _C.rope_tables(
        theta,
        _integer("rotary_dim", rotary_dim),
        _integer("max_seq_len", max_seq_len),
        None if device is None else torch.device(device),
        scaling=parse_scaling(scaling, theta),
        dtype=dtype,
    )
