# SPDX-License-Identifier: BSD-3-Clause
"""The bad-input catalogue, one block of bad calls per op family: every case raises the expected
exception type with a message that names the argument, what was expected and what came; it is run
on CPU, on meta tensors (the kernels torch.compile and export trace with, which must reject
exactly what CPU rejects) and on CUDA when present; and a call that raises writes nothing: every
tensor of the call (a KV cache included) keeps its bits.

A family block is a :class:`Family` (a valid call's arguments on a device, how to run each of its
ops, and its cases, each a :class:`Bad` that changes the valid call) passed to
:func:`register_family`; the three ``test_bad_input_*`` tests run every registered case on every
device it applies to (pytest_generate_tests, so a block appended below this file's tests is
collected too). After the catalogue: the rope family's out= table and the checks that need more
than one bad call (late bad positions, strided views on the autograd path, compile)."""

import re
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

import pytest
import torch
from helpers import make_tables, needs_cuda, same_bits
from torch import Tensor

import torch_rope

# ---- the catalogue: families of bad calls and the tests that run them ----------------------------

DEVICES = ("cpu", "meta", "cuda")


@dataclass
class Bad:
    change: Callable[[dict], None]  # edits the good inputs in place
    error: object  # exception type (or tuple)
    pattern: str  # after "rope.<op>: "; {x} stands for the argument's name
    ops: Optional[Tuple[str, ...]] = None  # None: every op of the family
    needs_data: bool = False  # a value check: CPU only (meta has no data, CUDA asserts)
    needs_memory: bool = False  # a memory-overlap check: not on meta (no memory)
    devices: Tuple[str, ...] = field(default=DEVICES)
    absent: Optional[str] = None  # a pattern the message must not contain


@dataclass
class Family:
    """One op family's bad calls. ``good_inputs(device)``: a valid call's arguments by name
    (tensors made on ``device``, meta included, so views keep their strides); ``call(op, args)``
    runs one of ``ops``; ``cases`` change the valid call, each in one way. ``op_name(op)`` is
    the name messages start with, ``arg_name(op)`` what ``{x}`` in a pattern stands for;
    ``prepare(op, args)`` completes a changed call for one op (apply.out's buffer)."""

    ops: Tuple[str, ...]
    good_inputs: Callable[[str], dict]
    call: Callable[[str, dict], object]
    cases: Dict[str, Bad]
    op_name: Callable[[str], str]
    arg_name: Callable[[str], str] = lambda op: "x"
    prepare: Callable[[str, dict], None] = lambda op, args: None  # e.g. adds an out buffer
    # op -> the torch.ops.rope overload it reaches (test_catalogue.py holds every overload to a
    # family that has bad calls of it).
    overloads: Dict[str, object] = field(default_factory=dict)


CATALOGUE: Dict[str, Family] = {}
_FAMILY_OF_CASE: Dict[str, Family] = {}


def register_family(name: str, family: Family):
    assert name not in CATALOGUE, f"family {name} registered twice"
    clash = set(family.cases) & set(_FAMILY_OF_CASE)
    assert not clash, f"bad-call names used by two families: {sorted(clash)}"
    assert set(family.overloads) == set(family.ops), f"family {name}: the overload of each op"
    for case_name, bad in family.cases.items():
        assert set(bad.ops or family.ops) <= set(family.ops), (name, case_name)
        _FAMILY_OF_CASE[case_name] = family
    CATALOGUE[name] = family


def _params(device):
    return [
        pytest.param(name, op, id=f"{name}-{op}")
        for family in CATALOGUE.values()
        for name, bad in family.cases.items()
        for op in bad.ops or family.ops
        if device in bad.devices
        and not (bad.needs_data and device != "cpu")
        and not (bad.needs_memory and device == "meta")
    ]


def _tensors(args):
    return {k: v for k, v in args.items() if isinstance(v, Tensor)}


def _run_case(name, op, device):
    family = _FAMILY_OF_CASE[name]
    bad = family.cases[name]
    args = family.good_inputs(device)
    bad.change(args)
    family.prepare(op, args)
    # Every tensor with data (the call may mix meta tensors in) must keep its bits.
    before = {k: v.clone() for k, v in _tensors(args).items() if not v.is_meta}
    message = re.escape(family.op_name(op)) + r": .*" + bad.pattern.format(x=family.arg_name(op))
    with pytest.raises(bad.error, match=message) as info:
        family.call(op, args)
    if bad.absent is not None:
        assert not re.search(bad.absent, str(info.value)), str(info.value)
    for k, v in before.items():
        assert same_bits(args[k], v), f"{k} was written by a call that raised"


def pytest_generate_tests(metafunc):
    # At collection, after the whole module ran: every family registered, wherever its block is.
    device = {
        "test_bad_input_cpu": "cpu",
        "test_bad_input_meta": "meta",
        "test_bad_input_cuda": "cuda",
    }.get(metafunc.function.__name__)
    if device is not None:
        metafunc.parametrize("name,op", _params(device))


def test_bad_input_cpu(name, op):
    _run_case(name, op, "cpu")


def test_bad_input_meta(name, op):
    """Meta (and so FakeTensor under torch.compile/export) rejects what CPU rejects, with the
    same exception type and words."""
    _run_case(name, op, "meta")


@needs_cuda
def test_bad_input_cuda(name, op):
    _run_case(name, op, "cuda")


# ---- family: rope (apply, apply_, apply.out, apply_qk) -------------------------------------------

MAX_SEQ_LEN, ROTARY_DIM, HEAD_DIM = 16, 8, 16
# The op under test; for apply_qk the bad tensor is passed as q or as k, the other one is valid.
OPS = ["apply", "apply_", "apply.out", "apply_qk:q", "apply_qk:k"]
SUPPORTED = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def good_inputs(device="cpu"):
    cos, sin = make_tables(MAX_SEQ_LEN, ROTARY_DIM, device)  # "meta" works too
    return dict(
        x=torch.randn(2, 3, 5, HEAD_DIM, device=device),
        cos=cos,
        sin=sin,
        positions=torch.arange(5, device=device),
    )


def call(op, x, cos, sin, positions, out=None, **kw):
    """Run `op` with `x` as the input under test; `kw`: the multi-axis keywords, if any."""
    if op == "apply":
        return torch_rope.apply(x, cos, sin, positions, **kw)
    if op == "apply_":
        return torch_rope.apply_(x, cos, sin, positions, **kw)
    if op == "apply.out":
        if out is None:
            dtype = x.dtype if x.dtype in SUPPORTED else torch.float32
            out = torch.empty(x.shape, dtype=dtype, device=x.device)
        return torch_rope.apply(x, cos, sin, positions, out=out, **kw)
    rows = x.shape[:-1] if x.dim() else ()
    dtype = x.dtype if x.dtype in SUPPORTED else torch.float32
    device = x.device if cos is None or x.device == cos.device else cos.device
    good = torch.randn(rows + (HEAD_DIM,), device=device, dtype=dtype)
    if op == "apply_qk:q":
        return torch_rope.apply_qk(x, good, cos, sin, positions, **kw)
    return torch_rope.apply_qk(good, x, cos, sin, positions, **kw)


def op_name(op):
    return "rope." + op.split(":")[0]


def arg_name(op):
    return op.split(":")[1] if ":" in op else "x"


X_OPS = tuple(OPS)
SHARED_OPS = ("apply", "apply_", "apply.out", "apply_qk:q")  # bad positions/tables: q == k case


def _to(device):
    return lambda t: t.to(device)


BAD_INPUTS = {
    # ---- x / q / k
    "head_dim_below_rotary_dim": Bad(
        lambda a: a.update(x=a["x"][..., :6].contiguous()),
        RuntimeError,
        r"{x}\.size\(-1\) \(head_dim\) must be >= rotary_dim = 2 \* cos\.size\(-1\) = 8, got 6",
        X_OPS,
    ),
    "integer_x": Bad(
        lambda a: a.update(x=torch.randint(0, 9, (2, 3, 5, HEAD_DIM), device=a["x"].device)),
        RuntimeError,
        r"{x} must be a floating tensor of dtype float64, float32, float16 or "
        r"bfloat16, got Long",
        X_OPS,
    ),
    "float8_x": Bad(
        lambda a: a.update(x=a["x"].to(torch.float8_e4m3fn)),
        RuntimeError,
        r"{x} must be a floating tensor of dtype .*got Float8_e4m3fn",
        ("apply", "apply_qk:k"),
    ),
    "complex_x": Bad(
        lambda a: a.update(
            x=torch.randn(2, 3, 5, HEAD_DIM, dtype=torch.cfloat, device=a["x"].device)
        ),
        RuntimeError,
        r"{x} must be a floating tensor .*got ComplexFloat",
        ("apply",),
    ),
    "zero_dim_x": Bad(
        lambda a: a.update(
            x=torch.tensor(1.0, device=a["x"].device),
            positions=torch.tensor(0, device=a["x"].device),
        ),
        RuntimeError,
        r"{x} must have at least 1 dim",
        ("apply", "apply_", "apply_qk:q"),
    ),
    # ---- positions
    "none_positions": Bad(
        lambda a: a.update(positions=None),
        TypeError,
        r"give positions or cu_seqlens= \(packed sequences\)$",
        SHARED_OPS,
    ),
    "float_positions": Bad(
        lambda a: a.update(positions=a["positions"].float()),
        RuntimeError,
        r"positions must be an integer tensor \(int32 or int64\), got Float",
        SHARED_OPS,
    ),
    "bool_positions": Bad(
        lambda a: a.update(positions=a["positions"] > 1),
        RuntimeError,
        r"positions must be an integer tensor.*got Bool",
        SHARED_OPS,
    ),
    "int16_positions": Bad(
        lambda a: a.update(positions=a["positions"].short()),
        RuntimeError,
        r"positions must be an integer tensor.*got Short",
        ("apply",),
    ),
    "positions_too_long": Bad(
        lambda a: a.update(positions=torch.arange(6, device=a["x"].device)),
        RuntimeError,
        r"positions of shape \[6\] cannot be broadcast to {x}\.shape\[:-1\] = \[2, 3, 5\]",
        SHARED_OPS,
    ),
    "positions_too_many_dims": Bad(
        lambda a: a.update(
            positions=torch.zeros(1, 2, 3, 5, dtype=torch.long, device=a["x"].device)
        ),
        RuntimeError,
        r"positions of shape \[1, 2, 3, 5\] cannot be broadcast",
        SHARED_OPS,
    ),
    "positions_bshd_shape_for_bhsd_input": Bad(
        lambda a: a.update(positions=torch.arange(5, device=a["x"].device).view(5, 1)),
        RuntimeError,
        r"positions of shape \[5, 1\] cannot be broadcast",
        SHARED_OPS,
    ),
    "position_above_table": Bad(
        lambda a: a.update(positions=torch.tensor([0, 1, 2, 23, 4])),
        IndexError,
        r"positions must be in \[0, max_seq_len\) with max_seq_len = cos\.size\(0\) = 16, "
        r"got 23 at flat index 3",
        SHARED_OPS,
        needs_data=True,
    ),
    "position_equal_to_table_length": Bad(
        lambda a: a.update(positions=torch.tensor([0, 1, 2, 3, 16], dtype=torch.int32)),
        IndexError,
        r"positions must be in \[0, max_seq_len\).*16.*got 16",
        SHARED_OPS,
        needs_data=True,
    ),
    "negative_position": Bad(
        lambda a: a.update(positions=torch.tensor([0, -1, 2, 3, 4])),
        IndexError,
        r"positions must be in \[0, max_seq_len\).*16.*got -1",
        SHARED_OPS,
        needs_data=True,
    ),
    # ---- tables
    # A missing angle source (cos and sin, or freqs=) or position source is a TypeError naming
    # it, in every wrapper (the raw op would say "cos must be a tensor", a RuntimeError).
    "none_sin": Bad(
        lambda a: a.update(sin=None),
        TypeError,
        r"give the cos and sin tables or freqs=, got only cos$",
        SHARED_OPS,
    ),
    "no_angle_source": Bad(
        lambda a: a.update(cos=None, sin=None),
        TypeError,
        r"give the cos and sin tables or freqs=, got no angle source$",
        SHARED_OPS,
    ),
    "cos_sin_shapes_differ": Bad(
        lambda a: a.update(sin=a["sin"][:8]),
        RuntimeError,
        r"cos and sin must have the same shape, got cos \[16, 4\] and sin \[8, 4\]",
        SHARED_OPS,
    ),
    "cos_sin_dtypes_differ": Bad(
        lambda a: a.update(sin=a["sin"].double()),
        RuntimeError,
        r"cos and sin must have the same dtype, got cos Float and sin Double",
        SHARED_OPS,
    ),
    "one_dim_tables": Bad(
        lambda a: a.update(cos=a["cos"][0], sin=a["sin"][0]),
        RuntimeError,
        r"cos must be a 2-D table \[max_seq_len, rotary_dim / 2\], got 1-D",
        SHARED_OPS,
    ),
    "half_precision_tables": Bad(
        lambda a: a.update(cos=a["cos"].half(), sin=a["sin"].half()),
        RuntimeError,
        r"cos must be float32 or float64 .*got Half",
        SHARED_OPS,
    ),
    "bfloat16_tables": Bad(
        lambda a: a.update(cos=a["cos"].bfloat16(), sin=a["sin"].bfloat16()),
        RuntimeError,
        r"cos must be float32 or float64 .*got BFloat16",
        ("apply",),
    ),
    # ---- devices: meta mixed with real tensors (the dispatcher routes such a call to the
    # Meta kernel, which used to return uninitialised memory)
    "x_on_meta": Bad(
        lambda a: a.update(x=a["x"].to("meta")),
        RuntimeError,
        r"{x} and cos must be on the same device, got {x} on meta and cos on cpu",
        ("apply", "apply_", "apply.out", "apply_qk:q"),
        devices=("cpu",),
    ),
    "cos_on_meta": Bad(
        lambda a: a.update(cos=a["cos"].to("meta")),
        RuntimeError,
        r"cos and sin must be on the same device, got cos on meta and sin on cpu",
        SHARED_OPS,
        devices=("cpu",),
    ),
    "tables_on_meta": Bad(
        lambda a: a.update(cos=a["cos"].to("meta"), sin=a["sin"].to("meta")),
        RuntimeError,
        r"{x} and cos must be on the same device, got {x} on cpu and cos on meta",
        SHARED_OPS,
        devices=("cpu",),
    ),
    "positions_on_meta": Bad(
        lambda a: a.update(positions=a["positions"].to("meta")),
        RuntimeError,
        r"positions and {x} must be on the same device, got positions on meta and {x} on cpu",
        SHARED_OPS,
        devices=("cpu",),
    ),
    "tables_on_cpu": Bad(
        lambda a: a.update(cos=a["cos"].cpu(), sin=a["sin"].cpu()),
        RuntimeError,
        r"{x} and cos must be on the same device, got {x} on cuda:0 and cos on cpu",
        SHARED_OPS,
        devices=("cuda",),
    ),
    "positions_on_cpu": Bad(
        lambda a: a.update(positions=a["positions"].cpu()),
        RuntimeError,
        r"positions and {x} must be on the same device, got positions on cpu and {x} on cuda",
        SHARED_OPS,
        devices=("cuda",),
    ),
    "sin_on_cpu": Bad(
        lambda a: a.update(sin=a["sin"].cpu()),
        RuntimeError,
        r"cos and sin must be on the same device, got cos on cuda:0 and sin on cpu",
        ("apply",),
        devices=("cuda",),
    ),
    # ---- writing ops
    "inplace_on_expanded_x": Bad(
        lambda a: a.update(x=a["x"][:1].expand(2, 3, 5, HEAD_DIM)),
        RuntimeError,
        r"x has overlapping memory \(e\.g\. a result of expand\(\)\), so it cannot be written "
        r"in place; pass x\.clone\(\)",
        ("apply_",),
    ),
    "inplace_on_self_overlapping_x": Bad(
        # Rows start HEAD_DIM // 2 apart: each shares half its elements with the next. PyTorch's
        # own check calls this "too hard"; written by several threads it is a data race.
        lambda a: a.update(x=_self_overlapping(a["x"])),
        RuntimeError,
        r"x has overlapping memory: two of its elements share an address \(sizes \[2, 3, 5, "
        r"16\], strides \[120, 40, 8, 1\]\), so writing it is a data race; pass x\.clone\(\)",
        ("apply_",),
    ),
}


# ---- multi-axis positions (mrope_section): the good call has section [2, 1, 1] (rotary_dim / 2 =
# 4 planes) and positions (5, 3), axis a in column a; each case breaks one thing.


def _multi_axis(section=(2, 1, 1), positions=None, mrope_interleaved=False, **changes):
    def change(a):
        device = a["x"].device
        num_axes = max(len(section), 1)
        p = positions
        if p is None:
            p = torch.arange(5 * num_axes, device=device).view(num_axes, 5).t() % MAX_SEQ_LEN
        elif callable(p):
            p = p(device)
        a.update(positions=p, mrope_section=list(section), mrope_interleaved=mrope_interleaved)
        a.update(changes)

    return change


def _bad_position_at(axis, value, dtype=torch.int64):
    def make(device):
        p = torch.arange(15, device=device).view(5, 3) % MAX_SEQ_LEN
        p[4, axis] = value  # the last row: a kernel that checked as it went would write first
        return p.to(dtype)

    return make


MULTI_AXIS_BAD_INPUTS = {
    "mrope_section_sum_above_planes": Bad(
        _multi_axis(section=(2, 1, 2)),
        RuntimeError,
        r"sum\(mrope_section\) must equal rotary_dim / 2 = cos\.size\(-1\) = 4, got "
        r"sum\(\[2, 1, 2\]\) = 5",
        SHARED_OPS,
    ),
    "mrope_section_sum_below_planes": Bad(
        _multi_axis(section=(1, 1, 1)),
        RuntimeError,
        r"sum\(mrope_section\) must equal .* = 4, got sum\(\[1, 1, 1\]\) = 3",
        ("apply", "apply_qk:k"),
    ),
    "mrope_section_negative": Bad(
        _multi_axis(section=(3, -1, 2)),
        RuntimeError,
        r"mrope_section\[1\] must be >= 0, got -1 in mrope_section=\[3, -1, 2\]",
        SHARED_OPS,
    ),
    "mrope_section_empty": Bad(
        _multi_axis(section=(), positions=lambda d: torch.zeros(5, 0, dtype=torch.long, device=d)),
        RuntimeError,
        r"mrope_section must list the planes of 1 to 4 axes, got 0 entries",
        SHARED_OPS,
    ),
    "mrope_section_five_axes": Bad(
        _multi_axis(section=(1, 1, 1, 1, 0)),
        RuntimeError,
        r"mrope_section must list the planes of 1 to 4 axes, got 5 entries: \[1, 1, 1, 1, 0\]",
        SHARED_OPS,
    ),
    # Entries that are not ints are refused, not truncated: each of these would truncate to the
    # valid section [2, 1, 1].
    "mrope_section_float": Bad(
        _multi_axis(section=(2.7, 1.2, 1.1)),
        TypeError,
        r"mrope_section\[0\] must be an int \(a number of planes\), got float 2\.7 in "
        r"mrope_section=\[2\.7, 1\.2, 1\.1\]",
        SHARED_OPS,
    ),
    "mrope_section_integral_float": Bad(
        _multi_axis(section=(2, 1.0, 1)),
        TypeError,
        r"mrope_section\[1\] must be an int \(a number of planes\), got float 1\.0",
        SHARED_OPS,
    ),
    "mrope_section_bool": Bad(
        _multi_axis(section=(2, True, 1)),
        TypeError,
        r"mrope_section\[1\] must be an int \(a number of planes\), got bool True",
        SHARED_OPS,
    ),
    "mrope_section_float_tensor_entry": Bad(
        _multi_axis(section=(torch.tensor(2.5), 1, 1)),
        TypeError,
        r"mrope_section\[0\] must be an int \(a number of planes\), got Tensor tensor\(2\.5",
        ("apply", "apply_qk:k"),
    ),
    "mrope_interleaved_with_two_axes": Bad(
        _multi_axis(section=(2, 2), mrope_interleaved=True),
        RuntimeError,
        r"mrope_interleaved=True \(Qwen3-VL\) needs 3 axes \(time, height, width\), got "
        r"mrope_section=\[2, 2\] with 2",
        SHARED_OPS,
    ),
    "mrope_interleaved_with_four_axes": Bad(
        _multi_axis(section=(1, 1, 1, 1), mrope_interleaved=True),
        RuntimeError,
        r"mrope_interleaved=True \(Qwen3-VL\) needs 3 axes .*with 4",
        ("apply",),
    ),
    "mrope_interleaved_without_section": Bad(
        lambda a: a.update(mrope_interleaved=True),
        RuntimeError,
        r"mrope_interleaved=True needs mrope_section \(the planes per axis\), got "
        r"mrope_section=None",
        SHARED_OPS,
    ),
    "mrope_positions_without_axis_dim": Bad(
        _multi_axis(positions=lambda d: torch.arange(5, device=d)),
        RuntimeError,
        r"positions must have a trailing axis dim of size len\(mrope_section\) = 3 "
        r"\(positions\[\.\.\., a\] is axis a\), got positions of shape \[5\]",
        SHARED_OPS,
    ),
    "mrope_positions_0_dim": Bad(
        _multi_axis(positions=lambda d: torch.tensor(3, device=d)),
        RuntimeError,
        r"positions must have a trailing axis dim of size len\(mrope_section\) = 3, got a "
        r"0-dim tensor",
        SHARED_OPS,
    ),
    "mrope_positions_too_few_axes": Bad(
        _multi_axis(positions=lambda d: torch.zeros(5, 2, dtype=torch.long, device=d)),
        RuntimeError,
        r"trailing axis dim of size len\(mrope_section\) = 3 .*got positions of shape \[5, 2\]",
        SHARED_OPS,
    ),
    "mrope_positions_axis_dim_first": Bad(
        # HF's (3, S) position_ids passed as they are, not moved to the end.
        _multi_axis(positions=lambda d: torch.zeros(3, 5, dtype=torch.long, device=d)),
        RuntimeError,
        r"trailing axis dim of size len\(mrope_section\) = 3 .*got positions of shape \[3, 5\]",
        SHARED_OPS,
    ),
    "mrope_one_axis_positions_of_one_axis_section": Bad(
        _multi_axis(section=(4,), positions=lambda d: torch.arange(5, device=d)),
        RuntimeError,
        r"trailing axis dim of size len\(mrope_section\) = 1 .*got positions of shape \[5\]",
        ("apply", "apply_qk:q"),
    ),
    "mrope_positions_rows_not_broadcastable": Bad(
        _multi_axis(positions=lambda d: torch.zeros(6, 3, dtype=torch.long, device=d)),
        RuntimeError,
        r"positions\.shape\[:-1\] \(without the axis dim\) of shape \[6\] cannot be "
        r"broadcast to {x}\.shape\[:-1\] = \[2, 3, 5\]",
        SHARED_OPS,
    ),
    "mrope_positions_rows_too_many_dims": Bad(
        _multi_axis(positions=lambda d: torch.zeros(1, 2, 3, 5, 3, dtype=torch.long, device=d)),
        RuntimeError,
        r"positions\.shape\[:-1\] \(without the axis dim\) of shape \[1, 2, 3, 5\] cannot be "
        r"broadcast",
        ("apply", "apply_", "apply_qk:k"),
    ),
    "mrope_float_positions": Bad(
        _multi_axis(positions=lambda d: torch.zeros(5, 3, device=d)),
        RuntimeError,
        r"positions must be an integer tensor \(int32 or int64\), got Float",
        ("apply", "apply_"),
    ),
    "mrope_position_above_table_on_axis_2": Bad(
        _multi_axis(positions=_bad_position_at(2, 16)),
        IndexError,
        r"positions of axis 2 \(positions\[\.\.\., 2\]\) must be in \[0, max_seq_len\) with "
        r"max_seq_len = cos\.size\(0\) = 16, got 16 at flat index 14",
        SHARED_OPS,
        needs_data=True,
    ),
    "mrope_negative_position_on_axis_1": Bad(
        _multi_axis(positions=_bad_position_at(1, -3, torch.int32)),
        IndexError,
        r"positions of axis 1 \(positions\[\.\.\., 1\]\) must be in \[0, max_seq_len\).*"
        r"got -3 at flat index 13",
        SHARED_OPS,
        needs_data=True,
    ),
    "mrope_position_above_table_on_axis_0": Bad(
        _multi_axis(positions=_bad_position_at(0, 99)),
        IndexError,
        r"positions of axis 0 \(positions\[\.\.\., 0\]\).*got 99 at flat index 12",
        ("apply", "apply_qk:k"),
        needs_data=True,
    ),
}
assert not set(MULTI_AXIS_BAD_INPUTS) & set(BAD_INPUTS)
BAD_INPUTS.update(MULTI_AXIS_BAD_INPUTS)


def _self_overlapping(t, shape=(2, 3, 5, HEAD_DIM), strides=(120, 40, 8, 1)):
    return t.new_zeros(256).normal_().as_strided(shape, strides)


def _add_out(op, args):
    # apply.out writes a filled buffer of x's dtype (when that dtype is one the op takes): the
    # catalogue then sees that out keeps its bits.
    x = args["x"]
    if op == "apply.out" and isinstance(x, Tensor) and x.dtype in SUPPORTED:
        args["out"] = torch.full(x.shape, 7.0, dtype=x.dtype, device=x.device)


register_family(
    "rope",
    Family(
        ops=tuple(OPS),
        good_inputs=good_inputs,
        call=lambda op, args: call(op, **args),
        cases=BAD_INPUTS,
        prepare=_add_out,
        op_name=op_name,
        arg_name=arg_name,
        overloads={
            "apply": torch.ops.rope.apply.default,
            "apply_": torch.ops.rope.apply_.default,
            "apply.out": torch.ops.rope.apply.out,
            "apply_qk:q": torch.ops.rope.apply_qk.default,
            "apply_qk:k": torch.ops.rope.apply_qk.default,
        },
    ),
)


# out= only: (change to the good inputs and a good `out`, error, pattern, needs_memory)
BAD_OUTS = {
    "out_wrong_shape": (
        lambda a, o: (a, o[..., :8]),
        r"out must have x's shape \[2, 3, 5, 16\], "
        r"got \[2, 3, 5, 8\] \(out= never resizes\)",
        False,
    ),
    "out_wrong_dtype": (
        lambda a, o: (a, o.double()),
        r"out must have x's dtype Float, got Double",
        False,
    ),
    "out_expanded": (
        lambda a, o: (a, o[:1].expand(2, 3, 5, HEAD_DIM)),
        r"out has overlapping memory",
        False,
    ),
    "out_self_overlapping": (
        lambda a, o: (a, _self_overlapping(o)),
        r"out has overlapping memory: two of its elements share an address",
        False,
    ),
    "out_is_x": (lambda a, o: (a, a["x"]), r"out shares memory with x", True),
    "out_overlaps_x": (lambda a, o: _overlapping_out(a), r"out shares memory with x", True),
    "out_is_cos": (lambda a, o: _out_over_table(a), r"out shares memory with cos", True),
}


def _overlapping_out(a):
    buf = torch.randn(2 * 3 * 5 * HEAD_DIM + 8, device=a["x"].device)
    a["x"] = buf[:-8].view(2, 3, 5, HEAD_DIM)
    return a, buf[8:].view(2, 3, 5, HEAD_DIM)


def _out_over_table(a):
    # out is a view of a buffer that also holds the cos table.
    buf = torch.randn(2 * 3 * 5 * HEAD_DIM, device=a["x"].device)
    a["cos"] = buf[: MAX_SEQ_LEN * (ROTARY_DIM // 2)].view(MAX_SEQ_LEN, ROTARY_DIM // 2)
    return a, buf.view(2, 3, 5, HEAD_DIM)


@pytest.mark.parametrize("device", ["cpu", "meta", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("name", list(BAD_OUTS))
def test_bad_out(name, device):
    change, pattern, needs_memory = BAD_OUTS[name]
    if needs_memory and device == "meta":
        pytest.skip("meta tensors have no memory to overlap")
    args = good_inputs(device)
    out = torch.full_like(args["x"], 7.0)
    args, out = change(args, out)
    if device != "meta":
        before = {k: v.clone() for k, v in args.items()}
        out_before = out.clone()
    with pytest.raises(RuntimeError, match=r"rope\.apply\.out: " + pattern):
        torch_rope.apply(**args, out=out)
    if device != "meta":
        for k, v in args.items():
            assert torch.equal(v, before[k]), f"{k} was written by a call that raised"
        assert torch.equal(out, out_before), "out was written by a call that raised"


@pytest.mark.parametrize("device", ["cpu", "meta", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("op", ["apply", "apply_", "apply_qk"])
def test_raw_ops_refuse_mrope_interleaved_without_section(op, device):
    a = good_inputs(device)
    x, cos, sin, positions = a["x"], a["cos"], a["sin"], a["positions"]
    before = x.clone()
    args = (x, x.clone()) if op == "apply_qk" else (x,)
    with pytest.raises(
        RuntimeError,
        match=rf"rope\.{op}: mrope_interleaved=True needs mrope_section \(the planes per axis\)",
    ):
        getattr(torch.ops.rope, op)(*args, cos, sin, positions, mrope_interleaved=True)
    if device != "meta":
        assert torch.equal(x, before)


@pytest.mark.parametrize("device", ["cpu", "meta", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize(
    "section",
    [[2.7, 1.2, 1.1], (2.0, 1, 1)] + [torch.tensor([2.7, 1.2, 1.1])],
    ids=["float_list", "integral_float_tuple", "float_tensor"],
)
@pytest.mark.parametrize("op", ["apply", "apply_", "apply.out", "apply_qk", "rms_norm_apply_qk"])
def test_every_wrapper_refuses_a_float_mrope_section(op, section, device):
    # Truncated, each of these sections would be the valid [2, 1, 1]: the wrappers refuse it as
    # the raw ops (int[]) and the module do, naming the op and the entry, and write nothing.
    a = good_inputs(device)
    x, cos, sin = a["x"], a["cos"], a["sin"]
    positions = torch.arange(15, device=device).view(5, 3) % MAX_SEQ_LEN
    out = torch.full_like(x, 7.0)
    before = (x.clone(), out.clone())
    kw = dict(mrope_section=section)
    message = re.escape(f"rope.{op}: mrope_section[0] must be an int (a number of planes), got ")
    with pytest.raises(TypeError, match=message):
        if op == "apply.out":
            torch_rope.apply(x, cos, sin, positions, out=out, **kw)
        elif op == "apply_qk":
            torch_rope.apply_qk(x, x.clone(), cos, sin, positions, **kw)
        elif op == "rms_norm_apply_qk":
            w = torch.ones(HEAD_DIM, device=device)
            torch_rope.rms_norm_apply_qk(x, x.clone(), w, w, cos, sin, positions, **kw)
        else:
            getattr(torch_rope, op)(x, cos, sin, positions, **kw)
    if device != "meta":
        assert torch.equal(x, before[0]) and torch.equal(out, before[1])


@pytest.mark.parametrize("op", ["apply", "apply_", "apply.out", "apply_qk"])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "non_leaf_with_grad"])
def test_multi_axis_bad_late_position_writes_nothing(grad, op):
    # The last axis of the last row is out of range; every other position is valid, so a kernel
    # that rotated row by row before checking would have written most of x (or out). x is a
    # last-dim-strided view (apply_ rotates a copy and writes it back), and with grad a non-leaf
    # that requires grad (the autograd path).
    if grad and op == "apply.out":
        pytest.skip("out= is not differentiable")
    cos, sin = make_tables(MAX_SEQ_LEN, ROTARY_DIM, "cpu")
    base = torch.randn(2, 3, HEAD_DIM, 5, requires_grad=grad)
    x = (base * 1.0 if grad else base).transpose(-1, -2)
    positions = torch.randint(0, MAX_SEQ_LEN, (2, 1, 5, 3))
    positions[-1, 0, -1, -1] = MAX_SEQ_LEN
    kw = dict(mrope_section=[1, 1, 2], mrope_interleaved=False)
    before = x.detach().clone()
    out = torch.full(x.shape, 7.0)
    with pytest.raises(IndexError, match=rf"rope\.{op}: positions of axis 2 .*got 16"):
        if op == "apply_":
            torch_rope.apply_(x, cos, sin, positions, **kw)
        elif op == "apply.out":
            torch_rope.apply(x, cos, sin, positions, out=out, **kw)
        elif op == "apply_qk":
            torch_rope.apply_qk(x, x[:, :1], cos, sin, positions, **kw)
        else:
            torch_rope.apply(x, cos, sin, positions, **kw)
    assert torch.equal(x.detach(), before), "x was modified by a call that raised"
    assert torch.equal(out, torch.full(x.shape, 7.0)), "out was written by a call that raised"


def test_compile_reports_bad_mrope_section_at_trace_time():
    torch._dynamo.reset()
    a = good_inputs()

    def f(x, positions):
        return torch_rope.apply(x, a["cos"], a["sin"], positions, mrope_section=[2, 2, 1])

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match=r"sum\(mrope_section\) must equal"):
        compiled(a["x"], torch.zeros(5, 3, dtype=torch.long))


def test_out_on_another_device_than_x():
    a = good_inputs()
    with pytest.raises(
        RuntimeError,
        match=r"rope\.apply\.out: out and x must be on the same "
        r"device, got out on meta and x on cpu",
    ):
        torch_rope.apply(**a, out=torch.empty(2, 3, 5, HEAD_DIM, device="meta"))


def test_apply_inplace_writes_nothing_when_a_late_position_is_bad():
    # Rows 0..3 are valid and would be rotated first by a kernel that checked as it went.
    # (CPU only: on CUDA an out-of-range position is a device-side assert, as in torch indexing.)
    cos, sin = make_tables(MAX_SEQ_LEN, ROTARY_DIM, "cpu")
    x = torch.randn(5, HEAD_DIM)
    before = x.clone()
    version = x._version
    with pytest.raises(IndexError, match=r"max_seq_len.*16.*got 99"):
        torch_rope.apply_(x, cos, sin, torch.tensor([0, 1, 2, 3, 99]))
    assert torch.equal(x, before)
    assert x._version == version


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "non_leaf_with_grad"])
@pytest.mark.parametrize(
    "bad",
    [
        "position_out_of_range",
        "negative_position",
        "float_positions",
        "positions_not_broadcastable",
        "cos_sin_shapes_differ",
        "half_tables",
        "head_dim_below_rotary_dim",
    ],
)
def test_failed_inplace_call_on_a_strided_view_writes_nothing(bad, grad):
    # x with last-dim stride 5 (a transposed view): apply_ rotates a copy and writes it back, and
    # a call that fails must not get as far as the write-back. With grad, x is a non-leaf that
    # requires grad: the autograd path of apply_. Every position but the last is valid, so a
    # kernel that ran before the checks would have written most of x.
    cos, sin = make_tables(MAX_SEQ_LEN, ROTARY_DIM, "cpu")
    base = torch.randn(2, 3, HEAD_DIM, 5, requires_grad=grad)
    x = (base * 1.0 if grad else base).transpose(-1, -2)
    assert x.stride(-1) == 5
    positions = torch.arange(5)
    if bad == "position_out_of_range":
        positions = torch.tensor([0, 1, 2, 3, 99])
    elif bad == "negative_position":
        positions = torch.tensor([0, 1, 2, 3, -2], dtype=torch.int32)
    elif bad == "float_positions":
        positions = positions.float()
    elif bad == "positions_not_broadcastable":
        positions = torch.arange(3)
    elif bad == "cos_sin_shapes_differ":
        sin = sin[:, :2]
    elif bad == "half_tables":
        cos, sin = cos.half(), sin.half()
    else:
        x = x[..., :6]
    before = x.detach().clone()
    with pytest.raises((IndexError, RuntimeError), match=r"rope\.apply_: "):
        torch_rope.apply_(x, cos, sin, positions)
    assert torch.equal(x.detach(), before), "x was modified by a call that raised"


def test_inplace_errors_on_the_autograd_path_name_apply_():
    # Regression: when x requires grad, apply_ rotates out of place and copies; its errors named
    # rope.apply.
    cos, sin = make_tables(MAX_SEQ_LEN, ROTARY_DIM, "cpu")
    x = torch.randn(2, 3, 5, HEAD_DIM, requires_grad=True) * 1.0
    with pytest.raises(IndexError, match=r"rope\.apply_: "):
        torch_rope.apply_(x, cos, sin, torch.tensor([0, 1, 2, 3, 99]))


def test_positions_broadcast_to_q_but_not_to_k():
    # GQA: per-head positions for 8 query heads cannot serve 2 key heads.
    cos, sin = make_tables(MAX_SEQ_LEN, ROTARY_DIM, "cpu")
    q, k = torch.randn(2, 8, 5, HEAD_DIM), torch.randn(2, 2, 5, HEAD_DIM)
    positions = torch.zeros(2, 8, 5, dtype=torch.long)
    with pytest.raises(
        RuntimeError,
        match=r"rope\.apply_qk: positions of shape \[2, 8, 5\] "
        r"cannot be broadcast to k\.shape\[:-1\] = \[2, 2, 5\]",
    ):
        torch_rope.apply_qk(q, k, cos, sin, positions)


@pytest.mark.parametrize("device", ["cpu", "meta", pytest.param("cuda", marks=needs_cuda)])
def test_apply_qk_dtype_mismatch(device):
    a = {k: v.to(device) for k, v in good_inputs().items()}
    with pytest.raises(
        RuntimeError,
        match=r"rope\.apply_qk: q and k must have the same dtype, "
        r"got q Float and k Double",
    ):
        torch_rope.apply_qk(a["x"], a["x"].double(), a["cos"], a["sin"], a["positions"])


@pytest.mark.parametrize("device", ["cpu", "meta", pytest.param("cuda", marks=needs_cuda)])
def test_apply_qk_head_dim_mismatch(device):
    a = {k: v.to(device) for k, v in good_inputs().items()}
    with pytest.raises(
        RuntimeError,
        match=r"rope\.apply_qk: q and k must have the same head_dim"
        r".*got q 16 and k 12",
    ):
        torch_rope.apply_qk(a["x"], a["x"][..., :12], a["cos"], a["sin"], a["positions"])


def test_compile_reports_bad_input_at_trace_time():
    # The Meta kernel runs the CPU checks, so torch.compile fails while tracing (a
    # float16-table call used to pass the fake kernel and fail only at run time, or never).
    torch._dynamo.reset()
    a = good_inputs()
    cos16, sin16 = a["cos"].half(), a["sin"].half()

    def f(x, positions):
        return torch_rope.apply(x, cos16, sin16, positions)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match=r"cos must be float32 or float64"):
        compiled(a["x"], a["positions"])


def test_module_built_on_meta_refuses_a_cpu_input():
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, HEAD_DIM, MAX_SEQ_LEN, device="meta")
    with pytest.raises(
        RuntimeError,
        match=r"x and cos must be on the same device, got x on cpu "
        r"and cos on meta",
    ):
        rope(torch.randn(2, 5, HEAD_DIM))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_interleaved_but_disjoint_views_are_written_in_place(device):
    # Rows at 0, 6, 12 (one dim) and 8, 14, 20 (the other): the dims interleave, so the cheap
    # proof of no overlap fails, but no two elements share an address. The exact check must
    # accept it, and the in-place result must equal the out-of-place one.
    a = good_inputs(device)
    cos, sin = a["cos"][:, :1], a["sin"][:, :1]  # rotary_dim 2 == head_dim
    x = torch.randn(32, device=device).as_strided((2, 3, 2), (8, 6, 1))
    positions = torch.tensor([1, 7, 15], device=device)
    want = torch_rope.apply(x, cos, sin, positions)
    torch_rope.apply_(x, cos, sin, positions)
    torch.testing.assert_close(x, want, rtol=0, atol=0)
    out = torch.zeros(32, device=device).as_strided((2, 3, 2), (8, 6, 1))
    torch_rope.apply(x, cos, sin, positions, inverse=True, out=out)
    want = torch_rope.apply(x, cos, sin, positions, inverse=True)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


@pytest.mark.parametrize("op", ["apply_", "apply.out"])
def test_interleaved_view_too_large_to_check_is_refused(op):
    # The exact check lists the addresses; past 2^22 elements it refuses instead of spending the
    # time, and says what to pass. Meta tensors: the check reads only sizes and strides.
    a = good_inputs("meta")
    cos, sin = a["cos"][:, :1], a["sin"][:, :1]
    n = (1 << 21) + 1
    big = torch.empty(16 * n, device="meta").as_strided((2, n, 2), (8, 6, 1))
    positions = torch.zeros(n, dtype=torch.long, device="meta")
    name = "x" if op == "apply_" else "out"
    with pytest.raises(RuntimeError, match=rf"{name} may have overlapping memory: its strides"):
        if op == "apply_":
            torch_rope.apply_(big, cos, sin, positions)
        else:
            torch_rope.apply(torch.empty(big.shape, device="meta"), cos, sin, positions, out=big)


# ---- family: rms_norm (rms_norm_apply_qk) --------------------------------------------------------
# The valid call: q (2, 4, 3, 16), k (2, 2, 3, 16), weights (16,), tables (8, 8), positions (3,).
# Each op runs through the typed wrapper and as the raw op (the wrapper takes a C++ fast path).

RMS_NORM_OPS = ("rms_norm_apply_qk", "raw.rms_norm_apply_qk")


def _rms_norm_good_inputs(device):
    cos, sin = make_tables(8, 16, device)
    return dict(
        q=torch.randn(2, 4, 3, 16, device=device),
        k=torch.randn(2, 2, 3, 16, device=device),
        q_weight=torch.ones(16, device=device),
        k_weight=torch.ones(16, device=device),
        cos=cos,
        sin=sin,
        positions=torch.arange(3, device=device),
    )


def _rms_norm_call(op, args):
    args = dict(args)
    tensors = [args.pop(n) for n in ("q", "k", "q_weight", "k_weight", "cos", "sin", "positions")]
    if op.startswith("raw."):
        return torch.ops.rope.rms_norm_apply_qk(*tensors, **args)
    return torch_rope.rms_norm_apply_qk(*tensors, **args)


def _zeros_qk(dtype):
    """q and k of zeros in ``dtype`` on the call's device: the rows eps must keep finite."""

    def change(a):
        a["q"] = torch.zeros(2, 4, 3, 16, dtype=dtype, device=a["q"].device)
        a["k"] = torch.zeros(2, 2, 3, 16, dtype=dtype, device=a["q"].device)

    return change


_EPS_FLOAT32 = (
    r"eps must be a normal float32 number, in \[1\.17549e-38, 3\.40282e\+38\], for {dtype} inputs "
    r"\(they are normalised in float32, where a smaller eps rounds to 0 or to a subnormal, which "
    r"flush-to-zero makes 0, so an all-zero row would give NaN, and a larger one rounds to inf\), "
    r"got {got}$"
)

RMS_NORM_BAD_INPUTS = {
    "q_weight_wrong_shape": Bad(
        lambda a: a.update(q_weight=torch.ones(8, device=a["q"].device)),
        RuntimeError,
        r"q_weight must have shape \(head_dim,\) = \(16,\) of q, got shape \[8\]",
    ),
    "k_weight_2d": Bad(
        lambda a: a.update(k_weight=torch.ones(1, 16, device=a["q"].device)),
        RuntimeError,
        r"k_weight must be 1-D of shape \(head_dim,\) = \(16,\), got shape \[1, 16\]",
    ),
    "q_weight_integer": Bad(
        lambda a: a.update(q_weight=torch.ones(16, dtype=torch.long, device=a["q"].device)),
        RuntimeError,
        r"q_weight must be a floating tensor of dtype float64, float32, float16 or bfloat16, "
        r"got Long",
    ),
    "rms_norm_none_cos": Bad(
        lambda a: a.update(cos=None),
        TypeError,
        r"give the cos and sin tables and positions \(tensors\), got None for cos$",
        ("rms_norm_apply_qk",),
    ),
    "rms_norm_none_positions": Bad(
        lambda a: a.update(positions=None),
        TypeError,
        r"got None for positions$",
        ("rms_norm_apply_qk",),
    ),
    "k_weight_none": Bad(
        lambda a: a.update(k_weight=None), RuntimeError, r"k_weight must be a tensor, got None"
    ),
    "q_weight_on_meta": Bad(
        lambda a: a.update(q_weight=torch.ones(16, device="meta")),
        RuntimeError,
        r"q_weight and q must be on the same device, got q_weight on meta and q on cpu",
        devices=("cpu",),
    ),
    "k_weight_on_cpu": Bad(
        lambda a: a.update(k_weight=torch.ones(16)),
        RuntimeError,
        r"k_weight and k must be on the same device, got k_weight on cpu and k on cuda:0",
        devices=("cuda",),
    ),
    "eps_zero": Bad(
        lambda a: a.update(eps=0.0), RuntimeError, r"eps must be a finite number > 0, got 0$"
    ),
    "eps_negative": Bad(
        lambda a: a.update(eps=-1e-6),
        RuntimeError,
        r"eps must be a finite number > 0, got -1e-06$",
    ),
    "eps_nan": Bad(
        lambda a: a.update(eps=float("nan")),
        RuntimeError,
        r"eps must be a finite number > 0, got nan$",
    ),
    # eps is added to mean(x^2) in float32 for float32/16-bit inputs: it must stay a normal
    # float32 (1e-300 rounds to 0 there, and an all-zero row would give NaN).
    "eps_0_in_float32": Bad(
        lambda a: a.update(eps=1e-300),
        RuntimeError,
        _EPS_FLOAT32.format(dtype="Float", got="1e-300"),
    ),
    "eps_subnormal_in_float32": Bad(
        lambda a: a.update(eps=1e-40), RuntimeError, _EPS_FLOAT32.format(dtype="Float", got="1e-40")
    ),
    "eps_inf_in_float32": Bad(
        lambda a: a.update(eps=1e39),
        RuntimeError,
        _EPS_FLOAT32.format(dtype="Float", got=r"1e\+39"),
    ),
    "eps_0_in_float32_for_bfloat16": Bad(
        lambda a: (_zeros_qk(torch.bfloat16)(a), a.update(eps=1e-300)),
        RuntimeError,
        _EPS_FLOAT32.format(dtype="BFloat16", got="1e-300"),
    ),
    "eps_subnormal_in_float64": Bad(
        lambda a: (_zeros_qk(torch.float64)(a), a.update(eps=1e-310)),
        RuntimeError,
        r"eps must be a normal float64 number, >= 2\.22507e-308 \(float64 inputs are normalised "
        r"in float64, where a smaller eps is subnormal, which flush-to-zero makes 0: an all-zero "
        r"row would give NaN\), got 1e-310$",
    ),
    "weight_offset_inf": Bad(
        lambda a: a.update(weight_offset=float("inf")),
        RuntimeError,
        r"weight_offset must be finite, got inf$",
    ),
    "rms_norm_position_above_table": Bad(
        lambda a: a.update(positions=torch.tensor([0, 1, 8])),
        IndexError,
        r"positions must be in \[0, max_seq_len\) with max_seq_len = cos\.size\(0\) = 8, got 8 "
        r"at flat index 2 of positions",
        needs_data=True,
    ),
    "rms_norm_head_dims_differ": Bad(
        lambda a: a.update(k=torch.randn(2, 2, 3, 24, device=a["q"].device)),
        RuntimeError,
        r"q and k must have the same head_dim \(size\(-1\)\), got q 16 and k 24",
    ),
    "rms_norm_dtypes_differ": Bad(
        lambda a: a.update(k=a["k"].double()),
        RuntimeError,
        r"q and k must have the same dtype, got q Float and k Double",
    ),
    "rms_norm_integer_q": Bad(
        lambda a: a.update(q=torch.ones(2, 4, 3, 16, dtype=torch.long, device=a["q"].device)),
        RuntimeError,
        r"q must be a floating tensor of dtype float64, float32, float16 or bfloat16, got Long",
    ),
    "rms_norm_float_positions": Bad(
        lambda a: a.update(positions=a["positions"].float()),
        RuntimeError,
        r"positions must be an integer tensor \(int32 or int64\), got Float",
    ),
    "rms_norm_positions_of_q_heads": Bad(
        # Per-head positions for 4 query heads cannot serve 2 key heads.
        lambda a: a.update(positions=torch.zeros(2, 4, 3, dtype=torch.long, device=a["q"].device)),
        RuntimeError,
        r"positions of shape \[2, 4, 3\] cannot be broadcast to k\.shape\[:-1\] = \[2, 2, 3\]",
    ),
    "rms_norm_half_tables": Bad(
        lambda a: a.update(cos=a["cos"].half(), sin=a["sin"].half()),
        RuntimeError,
        r"cos must be float32 or float64 \(half-precision tables lose accuracy at long context\), "
        r"got Half",
    ),
    "rms_norm_mrope_section_sum": Bad(
        lambda a: a.update(mrope_section=[1, 2]),
        RuntimeError,
        r"sum\(mrope_section\) must equal rotary_dim / 2 = cos\.size\(-1\) = 8, got "
        r"sum\(\[1, 2\]\) = 3",
    ),
}

register_family(
    "rms_norm",
    Family(
        ops=RMS_NORM_OPS,
        good_inputs=_rms_norm_good_inputs,
        call=_rms_norm_call,
        cases=RMS_NORM_BAD_INPUTS,
        op_name=lambda op: "rope." + op.removeprefix("raw."),
        overloads={op: torch.ops.rope.rms_norm_apply_qk.default for op in RMS_NORM_OPS},
    ),
)


# ---- family: kv_cache (apply_qk_cache) ----------------------------------------------------------
# The valid call: q (6, 8, 64), k and v (6, 2, 64), tables (96, 32), positions (6, 1), paged
# caches (5, 4, 2, 64) (20 slots), slot_mapping [3, 17, 0, -1, 9, 12]. Each op runs through the
# typed wrapper (which turns a Python-number scale into a tensor and checks it) and, where the
# arguments are tensors, as the raw op.

KV_CACHE_OPS = ("apply_qk_cache", "raw.apply_qk_cache")
WRAPPER_ONLY = ("apply_qk_cache",)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_CACHE_REMEDY = (
    r"allocate k_cache as a buffer of its own \(e\.g\. torch\.zeros of its shape\), whose "
    r"elements do not share memory$"
)


def _cache_good_inputs(device):
    cos, sin = make_tables(96, 64, device)
    return dict(
        q=torch.randn(6, 8, 64, device=device),
        k=torch.randn(6, 2, 64, device=device),
        v=torch.randn(6, 2, 64, device=device),
        cos=cos,
        sin=sin,
        positions=torch.tensor([[5], [0], [95], [7], [40], [3]], device=device),
        k_cache=torch.full((5, 4, 2, 64), 3.0, device=device),
        v_cache=torch.full((5, 4, 2, 64), 3.0, device=device),
        slot_mapping=torch.tensor([3, 17, 0, -1, 9, 12], device=device),
    )


def _cache_call(op, args):
    args = dict(args)
    names = ("q", "k", "v", "cos", "sin", "positions", "k_cache", "v_cache", "slot_mapping")
    tensors = [args.pop(n) for n in names]
    if op.startswith("raw."):
        return torch.ops.rope.apply_qk_cache(*tensors, **args)
    return torch_rope.apply_qk_cache(*tensors, **args)


def _device_of(a):
    return a["q"].device


def _slots(*values, dtype=torch.int64):
    return lambda a: a.update(slot_mapping=torch.tensor(values, dtype=dtype, device=_device_of(a)))


def _cache(name, shape, dtype=torch.float32):
    return lambda a: a.update({name: torch.full(shape, 3.0, device=_device_of(a)).to(dtype)})


def _fp8_caches(fp8, k_scale=0.5, v_scale=0.5):
    """Both caches float8 with scales (each a change to the valid call)."""

    def change(a):
        a["k_cache"], a["v_cache"] = a["k_cache"].to(fp8), a["v_cache"].to(fp8)
        a.update(k_scale=k_scale, v_scale=v_scale)

    return change


def _then(*changes):
    def change(a):
        for c in changes:
            c(a)

    return change


def _heads_share_memory(a):
    # Heads 32 elements apart in rows of 64: each head shares half its row with the next.
    a["k_cache"] = torch.zeros(5 * 4 * 2 * 64, device=_device_of(a)).as_strided(
        (5, 4, 2, 64), (512, 128, 32, 1)
    )


def _too_large_to_list(a):
    # (32769, 2, 64) at 192 s + 256 h + d: no two elements share an address, but the strides
    # interleave, so only listing the 4194432 addresses (past the 2^22 limit) could prove it.
    n = 32769
    buf = torch.zeros(192 * n + 320, device=_device_of(a))
    a.update(k_cache=buf.as_strided((n, 2, 64), (192, 256, 1)), v=None, v_cache=None)


KV_CACHE_BAD_INPUTS = {
    # ---- slot_mapping
    "slot_out_of_range": Bad(
        _slots(0, 1, 2, 20, 4, 5),
        IndexError,
        r"slot_mapping must be < the caches' slot count 20 \(negative = padding\), got 20 at "
        r"index 3",
        needs_data=True,  # on CUDA: a device assert
    ),
    "slot_repeated": Bad(
        _slots(0, 1, 2, 3, 4, 2),
        RuntimeError,
        r"slot_mapping holds slot 2 twice \(tokens 2 and 5\); each token needs its own slot",
        needs_data=True,  # on CUDA: not detected, which row the cache keeps is unspecified
    ),
    "slot_int32": Bad(
        _slots(3, 17, 0, -1, 9, 12, dtype=torch.int32),
        RuntimeError,
        r"slot_mapping must be int64 \(one cache slot per token, negative = padding\), got Int",
    ),
    "slot_wrong_length": Bad(
        _slots(0, 1, 2),
        RuntimeError,
        r"slot_mapping must have one entry per token, q\.size\(0\) = 6, got 3",
    ),
    "slot_2d": Bad(
        lambda a: a.update(slot_mapping=a["slot_mapping"].view(6, 1)),
        RuntimeError,
        r"slot_mapping must be 1-D \(num_tokens,\), got shape \[6, 1\]",
    ),
    # ---- q, k, v, positions
    "cache_position_out_of_range": Bad(
        lambda a: a["positions"].__setitem__((2, 0), 96),
        IndexError,
        r"positions must be in \[0, max_seq_len\) with max_seq_len = cos\.size\(0\) = 96, got 96 "
        r"at flat index 2 of positions",
        needs_data=True,
    ),
    "q_2d": Bad(
        lambda a: a.update(q=a["q"][:, 0]),
        RuntimeError,
        r"q must be 3-D \(num_tokens, num_heads, head_dim\), got shape \[6, 64\]",
    ),
    "k_tokens": Bad(
        lambda a: a.update(k=a["k"][:5]),
        RuntimeError,
        r"k\.size\(0\) \(tokens\) must equal q\.size\(0\) = 6, got k of shape \[5, 2, 64\]",
    ),
    "v_without_v_cache": Bad(
        lambda a: a.update(v_cache=None),
        RuntimeError,
        r"v and v_cache go together, got v a tensor and v_cache None",
    ),
    "v_dtype": Bad(
        lambda a: a.update(v=a["v"].double()),
        RuntimeError,
        r"v must have k's dtype Float, got Double",
    ),
    "v_heads": Bad(
        lambda a: a.update(v=torch.randn(6, 3, 64, device=_device_of(a))),
        RuntimeError,
        r"v must have k's head count k\.size\(1\) = 2, got v of shape \[6, 3, 64\]",
    ),
    # ---- the caches
    "k_cache_heads": Bad(
        _cache("k_cache", (5, 4, 3, 64)),
        RuntimeError,
        r"k_cache\.size\(-2\) \(heads\) must equal k\.size\(1\) = 2, got k_cache of shape "
        r"\[5, 4, 3, 64\]",
    ),
    "k_cache_head_dim": Bad(
        _cache("k_cache", (5, 4, 2, 32)),
        RuntimeError,
        r"k_cache\.size\(-1\) \(head_dim\) must equal k\.size\(-1\) = 64, got k_cache of shape "
        r"\[5, 4, 2, 32\]",
    ),
    "k_cache_dtype": Bad(
        _cache("k_cache", (5, 4, 2, 64), torch.float16),
        RuntimeError,
        r"k_cache must have k's dtype Float or be float8 \(torch\.float8_e4m3fn, "
        r"torch\.float8_e5m2\), got Half",
    ),
    "v_cache_dtype": Bad(
        _cache("v_cache", (5, 4, 2, 64), torch.float64),
        RuntimeError,
        r"v_cache must have v's dtype Float or be float8 \(torch\.float8_e4m3fn, "
        r"torch\.float8_e5m2\), got Double",
    ),
    "k_cache_5d": Bad(
        _cache("k_cache", (1, 5, 4, 2, 64)),
        RuntimeError,
        r"k_cache must be \(num_slots, num_heads, head_dim\) or paged \(num_blocks, block_size, "
        r"num_heads, head_dim\), got a 5-D tensor of shape \[1, 5, 4, 2, 64\]",
    ),
    "v_cache_slots": Bad(
        _cache("v_cache", (4, 4, 2, 64)),
        RuntimeError,
        r"v_cache must have k_cache's slots \(leading dims \[5, 4\]\), got v_cache of shape "
        r"\[4, 4, 2, 64\]",
    ),
    "k_cache_strided_last": Bad(
        lambda a: a.update(k_cache=torch.full((5, 4, 2, 128), 3.0, device=_device_of(a))[..., ::2]),
        RuntimeError,
        r"k_cache must have a unit last stride \(stride\(-1\) == 1\), got strides "
        r"\[1024, 256, 128, 2\]",
    ),
    "k_cache_aliases_k": Bad(
        lambda a: a.update(
            k_cache=a["k"], v=None, v_cache=None, slot_mapping=torch.arange(6, device=a["k"].device)
        ),
        RuntimeError,
        r"k_cache shares memory with k, which it would overwrite while reading; pass k\.clone\(\) "
        r"or a separate buffer",
        needs_memory=True,
    ),
    "v_cache_aliases_k_cache": Bad(
        lambda a: a.update(v_cache=a["k_cache"]),
        RuntimeError,
        r"k_cache shares memory with v_cache, which it would overwrite while reading; pass "
        r"v_cache\.clone\(\) or a separate buffer",
        needs_memory=True,
    ),
    # An overlapping cache: apply_qk_cache has no out-of-place form, so the message must not
    # recommend one but a cache of its own. (apply_ and out= do have the out-of-place op to
    # recommend: the rope family.)
    "k_cache_expanded": Bad(
        lambda a: a.update(
            k_cache=torch.full((5, 4, 1, 64), 3.0, device=_device_of(a)).expand(5, 4, 2, 64)
        ),
        RuntimeError,
        r"k_cache has overlapping memory \(e\.g\. a result of expand\(\)\), so it cannot be "
        r"written in place; " + _CACHE_REMEDY,
        absent="out-of-place",
    ),
    "k_cache_heads_share_memory": Bad(
        _heads_share_memory,
        RuntimeError,
        r"k_cache has overlapping memory: two of its elements share an address \(sizes "
        r"\[5, 4, 2, 64\], strides \[512, 128, 32, 1\]\), so writing it is a data race; "
        + _CACHE_REMEDY,
        absent="out-of-place",
    ),
    "k_cache_too_large_to_list": Bad(
        _too_large_to_list,
        RuntimeError,
        r"k_cache may have overlapping memory: its strides \[192, 256, 1\] for sizes "
        r"\[32769, 2, 64\] interleave, and with more than 4194304 elements the exact check is "
        r"not run; " + _CACHE_REMEDY,
        absent="out-of-place",
    ),
    "cache_none_tables": Bad(
        lambda a: a.update(cos=None, sin=None),
        TypeError,
        r"give the cos and sin tables and positions \(tensors\), got None for cos and sin$",
        WRAPPER_ONLY,
    ),
    # ---- scales
    "fp8_without_scale": Bad(
        lambda a: a.update(k_cache=a["k_cache"].to(torch.float8_e4m3fn)),
        RuntimeError,
        r"k_scale is required with a float8 k_cache \(stored = saturate\(value / k_scale\) in "
        r"Float8_e4m3fn\), got None",
    ),
    "fp8_scale_dtype": Bad(
        _then(
            _fp8_caches(torch.float8_e4m3fn),
            lambda a: a.update(
                k_scale=torch.tensor(1.0, dtype=torch.float64, device=_device_of(a)),
                v_scale=torch.tensor(1.0, device=_device_of(a)),
            ),
        ),
        RuntimeError,
        r"k_scale must be a float32 tensor \(or a Python float\), got Double",
    ),  # fmt: skip
    "fp8_scale_numel": Bad(
        _then(
            _fp8_caches(torch.float8_e4m3fn),
            lambda a: a.update(
                k_scale=torch.ones(2, device=_device_of(a)),
                v_scale=torch.tensor(1.0, device=_device_of(a)),
            ),
        ),
        RuntimeError,
        r"k_scale must hold one value \(0-d or 1 element\), got shape \[2\]",
    ),  # fmt: skip
    "k_scale_float_on_float32_cache": Bad(
        lambda a: a.update(k_scale=2.0),
        ValueError,
        r"k_scale=2\.0 applies to float8 caches only; the cache is torch\.float32 \(values are "
        r"stored unscaled\), so pass k_scale=None or 1$",
        WRAPPER_ONLY,
    ),
    "v_scale_tensor_on_float32_cache": Bad(
        lambda a: a.update(v_scale=torch.tensor(1.0, device=_device_of(a))),
        RuntimeError,
        r"v_scale applies to float8 caches only; v_cache is Float \(values are stored "
        r"unscaled\), so pass v_scale=None",
    ),
    "v_scale_float_without_v_cache": Bad(
        lambda a: a.update(v=None, v_cache=None, v_scale=0.5),
        ValueError,
        r"v_scale given without its cache \(None\)$",
        WRAPPER_ONLY,
    ),
    "v_scale_tensor_without_v_cache": Bad(
        lambda a: a.update(v=None, v_cache=None, v_scale=torch.tensor(0.5, device=_device_of(a))),
        RuntimeError,
        r"v_scale given without v_cache$",
    ),
}


# A scale that quantizes nothing: 0 would store +-max (NaN for a zero value), a negative scale
# flips signs, NaN stores NaN and inf zeros. Python numbers are checked by the wrapper on every
# device; tensor scales (0-d or (1,)) by the CPU kernel, through the wrapper and the raw op alike;
# a CUDA tensor scale is read by the kernel alone (no host sync, docs/api.md), so not here.
BAD_SCALES = [0.0, -0.5, float("nan"), float("inf"), float("-inf")]


def _bad_scale(fp8, which, value, form):
    def change(a):
        _fp8_caches(fp8)(a)
        if form == "python_float":
            a[which] = value
        else:
            t = torch.tensor(value, device=_device_of(a))
            a[which] = t if form == "tensor_0d" else t.view(1)
            other = "v_scale" if which == "k_scale" else "k_scale"
            a[other] = torch.tensor(0.5, device=_device_of(a))

    # Python's repr for a float, C++'s stream for the tensor's float32 value.
    got = repr(value) if form == "python_float" else {0.0: "0"}.get(value, repr(value))
    return Bad(
        change,
        ValueError,
        rf"{which} must be a finite number > 0 \(stored = saturate\(value / {which}\)\), got "
        rf"{re.escape(got)}$",
        WRAPPER_ONLY if form == "python_float" else KV_CACHE_OPS,
        needs_data=form != "python_float",
    )


# A Python number the float32 scale cannot hold: 1e-50 would become 0 (on CUDA no C++ check
# runs, and every element would saturate), 1e39 inf (torch.full refuses it without the name).
OUT_OF_FLOAT32_SCALES = [1e-50, 1e-39, 1e39]


def _scale_out_of_float32(fp8, which, value):
    def change(a):
        _fp8_caches(fp8)(a)
        a[which] = value

    return Bad(
        change,
        ValueError,
        rf"{which} must be within float32's normal range \[1\.175494e-38, 3\.402823e\+38\] "
        rf"\(the op reads it as a float32; stored = saturate\(value / {which}\)\), got "
        rf"{re.escape(repr(value))}$",
        WRAPPER_ONLY,
    )


for _fp8 in FP8:
    for _which in ("k_scale", "v_scale"):
        for _value in OUT_OF_FLOAT32_SCALES:
            _name = f"{_which}_{_value}_python_float_{str(_fp8).replace('torch.float8_', '')}"
            KV_CACHE_BAD_INPUTS[_name] = _scale_out_of_float32(_fp8, _which, _value)
        for _value in BAD_SCALES:
            for _form in ("python_float", "tensor_0d", "tensor_1"):
                _name = f"{_which}_{_value}_{_form}_{str(_fp8).replace('torch.float8_', '')}"
                KV_CACHE_BAD_INPUTS[_name] = _bad_scale(_fp8, _which, _value, _form)

register_family(
    "kv_cache",
    Family(
        ops=KV_CACHE_OPS,
        good_inputs=_cache_good_inputs,
        call=_cache_call,
        cases=KV_CACHE_BAD_INPUTS,
        op_name=lambda op: "rope." + op.removeprefix("raw."),
        overloads={op: torch.ops.rope.apply_qk_cache.default for op in KV_CACHE_OPS},
    ),
)


# ---- family: forms (the freqs= and packed-sequence overloads of the rope ops) ------------------
# The valid call: x (6, 2, 8), k (6, 1, 8) (apply_qk's k; x is its q), tables (64, 8) or freqs (4,)
# float64, positions (6, 1) (the freqs= form) or cu_seqlens [0, 3, 6] with seq_offsets [0, 1]
# (the packed forms). Each op is one overload, run through the typed wrapper; messages name it.

FREQS_OPS = ("apply.freqs", "apply_.freqs", "apply.freqs_out", "apply_qk.freqs")
TABLE_VARLEN_OPS = ("apply.varlen", "apply_.varlen", "apply.varlen_out", "apply_qk.varlen")
FREQS_VARLEN_OPS = (
    "apply.freqs_varlen", "apply_.freqs_varlen", "apply.freqs_varlen_out", "apply_qk.freqs_varlen"
)  # fmt: skip
VARLEN_OPS = TABLE_VARLEN_OPS + FREQS_VARLEN_OPS
FORM_OPS = FREQS_OPS + VARLEN_OPS
ALL_FREQS_OPS = FREQS_OPS + FREQS_VARLEN_OPS


def _form_overload(op):
    name, form = op.split(".")
    if form.endswith("_out"):
        return getattr(torch.ops.rope.apply, form)
    return getattr(getattr(torch.ops.rope, name), form)


def _form_good_inputs(device):
    cos, sin = make_tables(64, 8, device)
    freqs = 1.0 / 10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    return dict(
        x=torch.randn(6, 2, 8, device=device),
        k=torch.randn(6, 1, 8, device=device),
        cos=cos,
        sin=sin,
        freqs=freqs.to(device),
        positions=torch.arange(6, device=device).view(6, 1),
        cu_seqlens=torch.tensor([0, 3, 6], device=device),
        seq_offsets=torch.tensor([0, 1], device=device),
        cp_size=1,
        cp_rank=0,
    )


def _form_call(op, args):
    a = dict(args)
    x, k, out = a.pop("x"), a.pop("k"), a.pop("out", None)
    cos, sin, freqs = a.pop("cos"), a.pop("sin"), a.pop("freqs")
    positions = a.pop("positions")
    packed = {n: a.pop(n) for n in ("cu_seqlens", "seq_offsets", "cp_size", "cp_rank")}
    name, form = op.split(".")
    kw = dict(freqs=freqs) if form.startswith("freqs") else dict(cos=cos, sin=sin)
    kw.update(packed if "varlen" in form else dict(positions=positions))
    kw.update(a)  # the case's own keywords (attention_factor, mrope_section)
    if name == "apply_qk":
        return torch_rope.apply_qk(x, k, **kw)
    if name == "apply_":
        return torch_rope.apply_(x, **kw)
    if form.endswith("_out"):
        return torch_rope.apply(x, out=out, **kw)
    return torch_rope.apply(x, **kw)


def _form_add_out(op, args):
    x = args["x"]
    if op.endswith("_out") and isinstance(x, Tensor):
        dtype = x.dtype if x.dtype in SUPPORTED else torch.float32
        args["out"] = torch.full(x.shape, 7.0, dtype=dtype, device=x.device)


def _on(a, *values, dtype=None):
    return torch.tensor(values, dtype=dtype, device=a["x"].device)


FORM_BAD_INPUTS = {
    # ---- packed sequences: cu_seqlens, seq_offsets, cp_size, cp_rank
    "cu_seqlens_not_monotone": Bad(
        # three sequences, so three offsets: only the order is wrong
        lambda a: a.update(cu_seqlens=_on(a, 0, 5, 3, 6), seq_offsets=_on(a, 0, 1, 2)),
        ValueError,
        r"cu_seqlens must be non-decreasing.*cu_seqlens\[2\] = 3 after cu_seqlens\[1\] = 5",
        VARLEN_OPS,
        needs_data=True,
    ),
    "cu_seqlens_first_not_zero": Bad(
        lambda a: a.update(cu_seqlens=_on(a, 1, 3, 6)),
        ValueError,
        r"cu_seqlens\[0\] must be 0.*got 1",
        VARLEN_OPS,
        needs_data=True,
    ),
    "cu_seqlens_wrong_end": Bad(
        lambda a: a.update(cu_seqlens=_on(a, 0, 3, 5)),
        ValueError,
        r"cu_seqlens\[-1\] must equal x\.size\(0\) \* cp_size = 6 \* 1.*got 5",
        VARLEN_OPS,
        needs_data=True,
    ),
    "cu_seqlens_end_past_tokens": Bad(
        lambda a: a.update(cu_seqlens=_on(a, 0, 3, 7)),
        ValueError,
        r"cu_seqlens\[-1\] must equal.*got 7",
        VARLEN_OPS,
        needs_data=True,
    ),
    "cu_seqlens_float": Bad(
        lambda a: a.update(cu_seqlens=_on(a, 0.0, 3.0, 6.0)),
        RuntimeError,
        r"cu_seqlens must be an integer tensor \(int32 or int64\), got Float",
        VARLEN_OPS,
    ),
    "cu_seqlens_int16": Bad(
        lambda a: a.update(cu_seqlens=_on(a, 0, 3, 6, dtype=torch.int16)),
        RuntimeError,
        r"cu_seqlens must be an integer tensor.*got Short",
        VARLEN_OPS,
    ),
    "cu_seqlens_2d": Bad(
        lambda a: a.update(cu_seqlens=_on(a, 0, 3, 6).view(1, 3)),
        RuntimeError,
        r"cu_seqlens must be a 1-D tensor, got a 2-D tensor",
        VARLEN_OPS,
    ),
    "cu_seqlens_empty": Bad(
        lambda a: a.update(cu_seqlens=torch.zeros(0, dtype=torch.long, device=a["x"].device)),
        RuntimeError,
        r"cu_seqlens must hold N \+ 1 boundaries",
        VARLEN_OPS,
    ),
    "cu_seqlens_on_meta": Bad(
        lambda a: a.update(cu_seqlens=torch.tensor([0, 3, 6], device="meta")),
        RuntimeError,
        r"cu_seqlens must be on (x|q)'s device",
        VARLEN_OPS,
        devices=("cpu",),
    ),
    "seq_offsets_wrong_length": Bad(
        lambda a: a.update(seq_offsets=_on(a, 0, 1, 2)),
        RuntimeError,
        r"seq_offsets must hold one start position per sequence, N = cu_seqlens.size\(0\) - 1 = "
        r"2, got 3",
        VARLEN_OPS,
    ),
    "seq_offsets_negative": Bad(
        lambda a: a.update(seq_offsets=_on(a, 0, -1)),
        ValueError,
        r"seq_offsets must be >= 0.*got -1 for sequence 1",
        VARLEN_OPS,
        needs_data=True,
    ),
    "seq_offsets_float": Bad(
        lambda a: a.update(seq_offsets=_on(a, 0.0, 1.0)),
        RuntimeError,
        r"seq_offsets must be an integer tensor",
        VARLEN_OPS,
    ),
    "seq_offsets_past_int64": Bad(
        lambda a: a.update(seq_offsets=_on(a, 0, 2**63 - 2)),
        ValueError,
        r"seq_offsets\[1\] = 9223372036854775806 plus the sequence's positions \(up to 2\) "
        r"overflows int64",
        FREQS_VARLEN_OPS,
        needs_data=True,
    ),
    "cp_rank_too_large": Bad(
        lambda a: a.update(cp_size=2, cp_rank=2),
        RuntimeError,
        r"cp_rank must be in \[0, cp_size\) = \[0, 2\), got 2",
        VARLEN_OPS,
    ),
    "cp_rank_negative": Bad(
        lambda a: a.update(cp_rank=-1),
        RuntimeError,
        r"cp_rank must be in \[0, cp_size\) = \[0, 1\), got -1",
        VARLEN_OPS,
    ),
    "cp_size_zero": Bad(
        lambda a: a.update(cp_size=0), RuntimeError, r"cp_size must be >= 1.*got 0", VARLEN_OPS
    ),
    "cp_lengths_not_divisible": Bad(
        lambda a: a.update(cu_seqlens=_on(a, 0, 6, 12), cp_size=2),
        ValueError,
        r"with cp_size = 2 every sequence length must be divisible by 2 \* cp_size = 4.*got "
        r"length 6 of sequence 0",
        VARLEN_OPS,
        needs_data=True,
    ),
    "cp_wrong_end": Bad(
        lambda a: a.update(cu_seqlens=_on(a, 0, 4, 8), cp_size=2),
        ValueError,
        r"cu_seqlens\[-1\] must equal x\.size\(0\) \* cp_size = 6 \* 2.*got 8",
        VARLEN_OPS,
        needs_data=True,
    ),
    # sequence 1 (3 tokens) at 62, 63, 64: its last position is one past the 64-row tables
    "packed_position_past_the_tables": Bad(
        lambda a: a.update(seq_offsets=_on(a, 0, 62)),
        IndexError,
        r"positions from cu_seqlens and seq_offsets must be < max_seq_len = cos\.size\(0\) = 64, "
        r"got 64 for sequence 1",
        TABLE_VARLEN_OPS,
        needs_data=True,
    ),
    "packed_x_without_token_dim": Bad(
        lambda a: a.update(x=torch.randn(8, device=a["x"].device), cu_seqlens=_on(a, 0, 8)),
        RuntimeError,
        r"x must be \(T, \.\.\., head_dim\) with the tokens of the packed sequences on dim 0 when "
        r"cu_seqlens is given, got a 1-D tensor",
        tuple(op for op in VARLEN_OPS if not op.startswith("apply_qk")),
    ),
    "packed_k_of_other_token_count": Bad(
        lambda a: a.update(k=torch.randn(5, 1, 8, device=a["x"].device)),
        RuntimeError,
        r"q and k must have the same number of tokens",
        ("apply_qk.varlen", "apply_qk.freqs_varlen"),
    ),
    # ---- the frequencies
    "attention_factor_inf": Bad(
        lambda a: a.update(attention_factor=float("inf")),
        RuntimeError,
        r"attention_factor must be finite, got inf",
        ALL_FREQS_OPS,
    ),
    "attention_factor_nan": Bad(
        lambda a: a.update(attention_factor=float("nan")),
        RuntimeError,
        r"attention_factor must be finite, got nan",
        ALL_FREQS_OPS,
    ),
    "freqs_half": Bad(
        lambda a: a.update(freqs=a["freqs"].half()),
        RuntimeError,
        r"freqs must be float64 \(plane k turns by position \* freqs\[k\] exactly, with freqs\[k\] "
        r"as stored\), got Half",
        ALL_FREQS_OPS,
    ),
    "freqs_2d": Bad(
        lambda a: a.update(freqs=a["freqs"].view(1, 4)),
        RuntimeError,
        r"freqs must be a 1-D tensor of rotary_dim / 2 frequencies \(one per plane\), got a 2-D "
        r"tensor of shape \[1, 4\]",
        ALL_FREQS_OPS,
    ),
    "freqs_past_head_dim": Bad(
        lambda a: a.update(freqs=torch.ones(5, dtype=torch.float64, device=a["x"].device)),
        RuntimeError,
        r"{x}\.size\(-1\) \(head_dim\) must be >= rotary_dim = 2 \* freqs\.size\(0\) = 10, got 8",
        ALL_FREQS_OPS,
    ),
    "freqs_nan": Bad(
        lambda a: a["freqs"].__setitem__(0, float("nan")),
        ValueError,
        r"freqs must be finite, got nan at index 0 of freqs",
        ALL_FREQS_OPS,
        needs_data=True,
    ),
    "freqs_on_meta": Bad(
        lambda a: a.update(freqs=a["freqs"].to("meta")),
        RuntimeError,
        r"{x} and freqs must be on the same device, got {x} on cpu and freqs on meta",
        ALL_FREQS_OPS,
        devices=("cpu",),
    ),
    "freqs_float_positions": Bad(
        lambda a: a.update(positions=a["positions"].float()),
        RuntimeError,
        r"positions must be an integer tensor \(int32 or int64\), got Float",
        FREQS_OPS,
    ),
    "freqs_positions_not_broadcastable": Bad(
        lambda a: a.update(positions=a["positions"][:5]),
        RuntimeError,
        r"positions of shape \[5, 1\] cannot be broadcast to {x}\.shape\[:-1\] = \[6, 2\]",
        FREQS_OPS,
    ),
    "freqs_mrope_section_sum": Bad(
        lambda a: a.update(mrope_section=[1, 2]),
        RuntimeError,
        r"sum\(mrope_section\) must equal rotary_dim / 2 = freqs\.size\(0\) = 4, got "
        r"sum\(\[1, 2\]\) = 3",
        FREQS_OPS,
    ),
    "form_integer_x": Bad(
        lambda a: a.update(x=a["x"].long()),
        RuntimeError,
        r"x must be a floating tensor of dtype float64, float32, float16 or bfloat16, got Long",
        tuple(op for op in FORM_OPS if not op.startswith("apply_qk")),
    ),
}

register_family(
    "forms",
    Family(
        ops=FORM_OPS,
        good_inputs=_form_good_inputs,
        call=_form_call,
        cases=FORM_BAD_INPUTS,
        op_name=lambda op: "rope." + op,
        arg_name=lambda op: "q" if op.startswith("apply_qk") else "x",
        prepare=_form_add_out,
        overloads={op: _form_overload(op) for op in FORM_OPS},
    ),
)


# ---- family: qk_fp8 (apply_qk_fp8, apply_qk_fp8.out) -------------------------------------------
# The valid call: q (5, 4, 80), k (5, 2, 80), tables (64, 24) (rotary_dim 48), positions (5, 1),
# q_nope (5, 4, 16), k_nope (5, 2, 8), 0-d float32 scales; the .out ops write float8 buffers of
# those shapes. Each op runs through the typed wrapper and as the raw op.

QK_FP8_OPS = ("apply_qk_fp8", "raw.apply_qk_fp8", "apply_qk_fp8.out", "raw.apply_qk_fp8.out")
QK_FP8_OUT_OPS = ("apply_qk_fp8.out", "raw.apply_qk_fp8.out")
QK_FP8_FUNCTIONAL_OPS = ("apply_qk_fp8", "raw.apply_qk_fp8")
_QK_FP8_OUTS = ("q_out", "k_out", "q_nope_out", "k_nope_out")
E4M3 = torch.float8_e4m3fn


def _qk_fp8_good_inputs(device):
    cos, sin = make_tables(64, 48, device)
    shapes = dict(q=(5, 4, 80), k=(5, 2, 80), q_nope=(5, 4, 16), k_nope=(5, 2, 8))
    args = {name: torch.randn(*shape, device=device) for name, shape in shapes.items()}
    args.update(
        cos=cos,
        sin=sin,
        positions=(torch.arange(5, device=device) * 7).view(5, 1),
        q_scale=torch.tensor(0.5, device=device),
        k_scale=torch.tensor(0.25, device=device),
    )
    for out, shape in zip(_QK_FP8_OUTS, shapes.values()):
        args[out] = torch.full(shape, 3.0, device=device).to(E4M3)
    return args


def _qk_fp8_call(op, args):
    a = dict(args)
    tensors = [a.pop(n) for n in ("q", "k", "cos", "sin", "positions")]
    outs = {n: a.pop(n) for n in _QK_FP8_OUTS}
    if op == "raw.apply_qk_fp8.out":
        return torch.ops.rope.apply_qk_fp8.out(*tensors, **a, **outs)
    if op == "raw.apply_qk_fp8":
        return torch.ops.rope.apply_qk_fp8(*tensors, **a)
    if op == "apply_qk_fp8.out":
        return torch_rope.apply_qk_fp8(*tensors, out=tuple(outs.values()), **a)
    return torch_rope.apply_qk_fp8(*tensors, **a)


def _set(**values):
    """A change that sets arguments to tensors made on the call's device (``values``: functions
    of the device)."""
    return lambda a: a.update({n: f(a["cos"].device) for n, f in values.items()})


QK_FP8_BAD_INPUTS = {
    "qk_fp8_q_2d": Bad(
        lambda a: a.update(q=a["q"][:, 0]),
        RuntimeError,
        r"q must be 3-D \(num_tokens, num_heads, head_dim\), got shape \[5, 80\]",
    ),
    "qk_fp8_k_tokens": Bad(
        lambda a: a.update(k=a["k"][:4]),
        RuntimeError,
        r"k\.size\(0\) \(tokens\) must equal q\.size\(0\) = 5, got k of shape \[4, 2, 80\]",
    ),
    "qk_fp8_q_nope_heads": Bad(
        _set(q_nope=lambda d: torch.randn(5, 3, 16, device=d)),
        RuntimeError,
        r"q_nope must have q's head count q\.size\(1\) = 4, got q_nope of shape \[5, 3, 16\]",
    ),
    "qk_fp8_k_nope_dtype": Bad(
        lambda a: a.update(k_nope=a["k_nope"].double()),
        RuntimeError,
        r"k_nope must have k's dtype Float, got Double",
    ),
    "qk_fp8_dtype_not_fp8": Bad(
        lambda a: a.update(dtype=torch.float16),
        RuntimeError,
        r"dtype must be a float8 dtype \(torch\.float8_e4m3fn or torch\.float8_e5m2\), got Half",
        QK_FP8_FUNCTIONAL_OPS,
    ),
    "qk_fp8_scale_float64": Bad(
        _set(q_scale=lambda d: torch.tensor(1.0, dtype=torch.float64, device=d)),
        RuntimeError,
        r"q_scale must be a float32 tensor \(or a Python float\), got Double",
    ),
    "qk_fp8_scale_two_values": Bad(
        _set(k_scale=lambda d: torch.ones(2, device=d)),
        RuntimeError,
        r"k_scale must hold one value \(0-d or 1 element\), got shape \[2\]",
    ),
    "qk_fp8_scale_zero": Bad(
        _set(k_scale=lambda d: torch.tensor(0.0, device=d)),
        ValueError,
        r"k_scale must be a finite number > 0 \(stored = saturate\(value / k_scale\)\), got 0$",
        needs_data=True,  # a CUDA tensor scale is read by the kernel alone
    ),
    "qk_fp8_scale_nan": Bad(
        _set(q_scale=lambda d: torch.tensor(float("nan"), device=d)),
        ValueError,
        r"q_scale must be a finite number > 0 \(stored = saturate\(value / q_scale\)\), got nan$",
        needs_data=True,
    ),
    "qk_fp8_position_out_of_range": Bad(
        lambda a: a["positions"].__setitem__((2, 0), 64),
        IndexError,
        r"positions must be in \[0, max_seq_len\) with max_seq_len = cos\.size\(0\) = 64, got 64 "
        r"at flat index 2",
        needs_data=True,
    ),
    "qk_fp8_out_not_fp8": Bad(
        lambda a: a.update(q_out=a["q_out"].half()),
        RuntimeError,
        r"q_out must be float8 \(torch\.float8_e4m3fn or torch\.float8_e5m2\), got Half",
        QK_FP8_OUT_OPS,
    ),
    "qk_fp8_outs_of_two_formats": Bad(
        lambda a: a.update(k_out=a["k_out"].to(torch.float8_e5m2)),
        RuntimeError,
        r"k_out must be Float8_e4m3fn, got Float8_e5m2",
        QK_FP8_OUT_OPS,
    ),
    "qk_fp8_out_shape": Bad(
        _set(k_out=lambda d: torch.zeros(5, 3, 80, device=d).to(E4M3)),
        RuntimeError,
        r"k_out must have k's shape \[5, 2, 80\], got \[5, 3, 80\] \(out= never resizes\)",
        QK_FP8_OUT_OPS,
    ),
    "qk_fp8_out_missing_nope": Bad(
        lambda a: a.update(q_nope_out=None),
        RuntimeError,
        r"q_nope_out goes with q_nope, got q_nope a tensor and q_nope_out None",
        QK_FP8_OUT_OPS,
    ),
    "qk_fp8_out_aliases_q": Bad(
        lambda a: a.update(q_out=a["q"].view(torch.uint8)[..., :80].view(E4M3)),
        RuntimeError,
        r"q_out shares memory with q, which it would overwrite while reading",
        QK_FP8_OUT_OPS,
        needs_memory=True,
    ),
    "qk_fp8_outs_overlap": Bad(
        lambda a: a.update(k_out=a["q_out"][:, :2]),
        RuntimeError,
        r"q_out shares memory with k_out",
        QK_FP8_OUT_OPS,
        needs_memory=True,
    ),
    "qk_fp8_out_overlapping": Bad(
        _set(q_out=lambda d: torch.zeros(5, 1, 80, device=d).to(E4M3).expand(5, 4, 80)),
        RuntimeError,
        r"q_out has overlapping memory \(e\.g\. a result of expand\(\)\)",
        QK_FP8_OUT_OPS,
    ),
}

register_family(
    "qk_fp8",
    Family(
        ops=QK_FP8_OPS,
        good_inputs=_qk_fp8_good_inputs,
        call=_qk_fp8_call,
        cases=QK_FP8_BAD_INPUTS,
        op_name=lambda op: "rope.apply_qk_fp8" + (".out" if op.endswith(".out") else ""),
        overloads={
            op: torch.ops.rope.apply_qk_fp8.out
            if op.endswith(".out")
            else torch.ops.rope.apply_qk_fp8.default
            for op in QK_FP8_OPS
        },  # fmt: skip
    ),
)


# ---- family: qk_fp8_dynamic (apply_qk_fp8_dynamic, apply_qk_fp8_dynamic.out) ------------------
# The valid call: q (5, 4, 80), k (5, 2, 80), tables (64, 24) (rotary_dim 48), positions (5, 1);
# the .out ops write float8 rows of q's and k's shapes and float32 scales (5, 4, 1), (5, 2, 1).
# The checks are apply_qk_fp8's (one body); these cases hold the dynamic op to them, and the .out
# ops to their buffers' checks.

QK_FP8_DYNAMIC_OUT_OPS = ("apply_qk_fp8_dynamic.out", "raw.apply_qk_fp8_dynamic.out")
QK_FP8_DYNAMIC_FUNCTIONAL_OPS = ("apply_qk_fp8_dynamic", "raw.apply_qk_fp8_dynamic")
QK_FP8_DYNAMIC_OPS = QK_FP8_DYNAMIC_FUNCTIONAL_OPS + QK_FP8_DYNAMIC_OUT_OPS
_QK_FP8_DYNAMIC_OUTS = ("q_out", "k_out", "q_scale_out", "k_scale_out")


def _qk_fp8_dynamic_good_inputs(device):
    cos, sin = make_tables(64, 48, device)
    return dict(
        q=torch.randn(5, 4, 80, device=device),
        k=torch.randn(5, 2, 80, device=device),
        cos=cos,
        sin=sin,
        positions=(torch.arange(5, device=device) * 7).view(5, 1),
        q_out=torch.full((5, 4, 80), 3.0, device=device).to(E4M3),
        k_out=torch.full((5, 2, 80), 3.0, device=device).to(E4M3),
        q_scale_out=torch.full((5, 4, 1), -1.0, device=device),
        k_scale_out=torch.full((5, 2, 1), -1.0, device=device),
    )


def _qk_fp8_dynamic_call(op, args):
    a = dict(args)
    tensors = [a.pop(n) for n in ("q", "k", "cos", "sin", "positions")]
    outs = {n: a.pop(n) for n in _QK_FP8_DYNAMIC_OUTS}
    if op == "raw.apply_qk_fp8_dynamic.out":
        return torch.ops.rope.apply_qk_fp8_dynamic.out(*tensors, **a, **outs)
    if op == "raw.apply_qk_fp8_dynamic":
        return torch.ops.rope.apply_qk_fp8_dynamic(*tensors, **a)
    if op == "apply_qk_fp8_dynamic.out":
        return torch_rope.apply_qk_fp8_dynamic(*tensors, out=tuple(outs.values()), **a)
    return torch_rope.apply_qk_fp8_dynamic(*tensors, **a)


QK_FP8_DYNAMIC_BAD_INPUTS = {
    "qk_fp8_dynamic_q_2d": Bad(
        lambda a: a.update(q=a["q"][:, 0]),
        RuntimeError,
        r"q must be 3-D \(num_tokens, num_heads, head_dim\), got shape \[5, 80\]",
    ),
    "qk_fp8_dynamic_k_tokens": Bad(
        lambda a: a.update(k=a["k"][:4]),
        RuntimeError,
        r"k\.size\(0\) \(tokens\) must equal q\.size\(0\) = 5, got k of shape \[4, 2, 80\]",
    ),
    "qk_fp8_dynamic_k_dtype": Bad(
        lambda a: a.update(k=a["k"].double()),
        RuntimeError,
        r"q and k must have the same dtype, got q Float and k Double",
    ),
    "qk_fp8_dynamic_dtype_not_fp8": Bad(
        lambda a: a.update(dtype=torch.bfloat16),
        RuntimeError,
        r"dtype must be a float8 dtype \(torch\.float8_e4m3fn or torch\.float8_e5m2\), got "
        r"BFloat16",
        QK_FP8_DYNAMIC_FUNCTIONAL_OPS,
    ),
    "qk_fp8_dynamic_position_out_of_range": Bad(
        lambda a: a["positions"].__setitem__((3, 0), -1),
        IndexError,
        r"positions must be in \[0, max_seq_len\) with max_seq_len = cos\.size\(0\) = 64, got -1 "
        r"at flat index 3",
        needs_data=True,
    ),
    "qk_fp8_dynamic_out_not_fp8": Bad(
        _set(q_out=lambda d: torch.zeros(5, 4, 80, device=d, dtype=torch.bfloat16)),
        RuntimeError,
        r"q_out must be float8 \(torch\.float8_e4m3fn or torch\.float8_e5m2\), got BFloat16",
        QK_FP8_DYNAMIC_OUT_OPS,
    ),
    "qk_fp8_dynamic_scale_out_dtype": Bad(
        _set(k_scale_out=lambda d: torch.zeros(5, 2, 1, device=d, dtype=torch.float64)),
        RuntimeError,
        r"k_scale_out must be float32, got Double",
        QK_FP8_DYNAMIC_OUT_OPS,
    ),
    "qk_fp8_dynamic_scale_out_shape": Bad(
        _set(q_scale_out=lambda d: torch.zeros(5, 4, device=d)),
        RuntimeError,
        r"q_scale_out must have shape \[5, 4, 1\] \(tokens, heads, 1\), got \[5, 4\] "
        r"\(out= never resizes\)",
        QK_FP8_DYNAMIC_OUT_OPS,
    ),
    "qk_fp8_dynamic_scale_out_per_token_shape": Bad(
        lambda a: a.update(per_token=True),
        RuntimeError,
        r"q_scale_out must have shape \[5, 1, 1\] \(tokens, 1, 1\) with per_token, got "
        r"\[5, 4, 1\]",
        QK_FP8_DYNAMIC_OUT_OPS,
    ),
    "qk_fp8_dynamic_scale_out_aliases_q": Bad(
        lambda a: a.update(q_scale_out=a["q"][..., :1]),
        RuntimeError,
        r"q_scale_out shares memory with q, which it would overwrite while reading",
        QK_FP8_DYNAMIC_OUT_OPS,
        needs_memory=True,
    ),
    "qk_fp8_dynamic_scale_outs_overlap": Bad(
        lambda a: a.update(k_scale_out=a["q_scale_out"][:, :2]),
        RuntimeError,
        r"q_scale_out shares memory with k_scale_out",
        QK_FP8_DYNAMIC_OUT_OPS,
        needs_memory=True,
    ),
    "qk_fp8_dynamic_scale_out_expanded": Bad(
        _set(q_scale_out=lambda d: torch.zeros(5, 1, 1, device=d).expand(5, 4, 1)),
        RuntimeError,
        r"q_scale_out has overlapping memory \(e\.g\. a result of expand\(\)\)",
        QK_FP8_DYNAMIC_OUT_OPS,
    ),
}

register_family(
    "qk_fp8_dynamic",
    Family(
        ops=QK_FP8_DYNAMIC_OPS,
        good_inputs=_qk_fp8_dynamic_good_inputs,
        call=_qk_fp8_dynamic_call,
        cases=QK_FP8_DYNAMIC_BAD_INPUTS,
        op_name=lambda op: "rope.apply_qk_fp8_dynamic" + (".out" if op.endswith(".out") else ""),
        overloads={
            op: torch.ops.rope.apply_qk_fp8_dynamic.out
            if op.endswith(".out")
            else torch.ops.rope.apply_qk_fp8_dynamic.default
            for op in QK_FP8_DYNAMIC_OPS
        },  # fmt: skip
    ),
)


# ---- family: mla_cache (mla_apply_cache) -------------------------------------------------------
# The valid call: q_pe (7, 4, 16), k_pe (7, 16), kv_c (7, 40), tables (64, 8), positions (7, 1),
# one paged cache (6, 4, 56) (24 slots), slot_mapping of 7 distinct slots, q_nope (7, 4, 8).
# Checked on CPU and Meta (its CUDA glue's checks are the host run's, tests/cuda_host).

MLA_OPS = ("mla_apply_cache", "raw.mla_apply_cache")
_CPU_META = ("cpu", "meta")


def _mla_good_inputs(device):
    cos, sin = make_tables(64, 16, device)
    return dict(
        q_pe=torch.randn(7, 4, 16, device=device),
        k_pe=torch.randn(7, 16, device=device),
        kv_c=torch.randn(7, 40, device=device),
        cos=cos,
        sin=sin,
        positions=torch.tensor([[3], [0], [63], [5], [9], [2], [40]], device=device),
        kv_cache=torch.full((6, 4, 56), 3.0, device=device),
        kpe_cache=None,
        slot_mapping=torch.tensor([5, 0, 23, 7, 11, 2, 16], device=device),
        q_nope=torch.randn(7, 4, 8, device=device),
    )


def _mla_call(op, args):
    a = dict(args)
    names = ("q_pe", "k_pe", "kv_c", "cos", "sin", "positions", "kv_cache", "kpe_cache")
    tensors = [a.pop(n) for n in names] + [a.pop("slot_mapping")]
    if op.startswith("raw."):
        return torch.ops.rope.mla_apply_cache(*tensors, **a)
    return torch_rope.mla_apply_cache(*tensors, **a)


def _mla_fp8_cache(scale):
    def change(a):
        a["kv_cache"] = a["kv_cache"].to(E4M3)
        if scale is not None:
            a["kv_scale"] = torch.tensor(scale, device=a["kv_cache"].device)

    return change


def _mla_slot(index, value):
    return lambda a: a["slot_mapping"].__setitem__(index, value)


MLA_BAD_INPUTS = {
    "mla_slot_out_of_range": Bad(
        _mla_slot(3, 24),
        IndexError,
        r"slot_mapping must be < the caches' slot count 24 \(negative = padding\), got 24 at "
        r"index 3",
        needs_data=True,
        devices=_CPU_META,
    ),
    "mla_slot_repeated": Bad(
        _mla_slot(5, 0),
        RuntimeError,
        r"slot_mapping holds slot 0 twice \(tokens 1 and 5\)",
        needs_data=True,
        devices=_CPU_META,
    ),
    "mla_position_out_of_range": Bad(
        lambda a: a["positions"].__setitem__((2, 0), 64),
        IndexError,
        r"positions must be in \[0, max_seq_len\) with max_seq_len = cos\.size\(0\) = 64, got 64 "
        r"at flat index 2",
        needs_data=True,
        devices=_CPU_META,
    ),
    "mla_q_pe_2d": Bad(
        lambda a: a.update(q_pe=a["q_pe"][:, 0]),
        RuntimeError,
        r"q_pe must be 3-D",
        devices=_CPU_META,
    ),
    "mla_kv_c_tokens": Bad(
        lambda a: a.update(kv_c=a["kv_c"][:3]),
        RuntimeError,
        r"kv_c\.size\(0\) \(tokens\) must equal",
        devices=_CPU_META,
    ),
    "mla_kv_c_dtype": Bad(
        lambda a: a.update(kv_c=a["kv_c"].double()),
        RuntimeError,
        r"kv_c must have q_pe's dtype",
        devices=_CPU_META,
    ),
    "mla_cache_width": Bad(
        lambda a: a.update(kv_cache=a["kv_cache"][..., :5]),
        RuntimeError,
        r"kv_cache\.size\(-1\) must be kv_c\.size\(-1\) \+ k_pe\.size\(-1\) .* = 56, got "
        r"kv_cache of shape \[6, 4, 5\]",
        devices=_CPU_META,
    ),
    "mla_slots_int32": Bad(
        lambda a: a.update(slot_mapping=a["slot_mapping"].int()),
        RuntimeError,
        r"slot_mapping must be int64",
        devices=_CPU_META,
    ),
    "mla_fp8_cache_without_scale": Bad(
        _mla_fp8_cache(None), RuntimeError, r"kv_scale is required", devices=_CPU_META
    ),
    "mla_scale_for_16bit_cache": Bad(
        lambda a: a.update(kv_scale=0.5),
        ValueError,
        r"kv_scale=0\.5 applies to float8 caches only; the cache is torch\.float32 \(values are "
        r"stored unscaled\), so pass kv_scale=None or 1$",
        ("mla_apply_cache",),
        devices=_CPU_META,
    ),
    "mla_q_scale_without_fp8_q": Bad(
        lambda a: a.update(q_scale=0.5),
        ValueError,
        r"q_scale=0\.5 applies to a float8 q_dtype only; the q outputs are None \(values are "
        r"stored unscaled\), so pass q_scale=None or 1$",
        ("mla_apply_cache",),
        devices=_CPU_META,
    ),
    "mla_scale_zero": Bad(
        _mla_fp8_cache(0.0),
        ValueError,
        r"kv_scale must be a finite number > 0",
        needs_data=True,
        devices=_CPU_META,
    ),
    "mla_cache_aliases_kv_c": Bad(
        lambda a: a.update(kv_c=a["kv_cache"].view(-1, 56)[:7, :40]),
        RuntimeError,
        r"kv_cache shares memory with kv_c",
        needs_memory=True,
        devices=_CPU_META,
    ),
    "mla_kpe_cache_other_slots": Bad(
        lambda a: a.update(
            kv_cache=a["kv_cache"][..., :40].clone(),
            kpe_cache=torch.full((3, 4, 16), 3.0, device=a["kv_cache"].device),
        ),
        RuntimeError,
        r"kpe_cache must have kv_cache's slots",
        devices=_CPU_META,
    ),
}

register_family(
    "mla_cache",
    Family(
        ops=MLA_OPS,
        good_inputs=_mla_good_inputs,
        call=_mla_call,
        cases=MLA_BAD_INPUTS,
        op_name=lambda op: "rope.mla_apply_cache",
        arg_name=lambda op: "q_pe",
        overloads={op: torch.ops.rope.mla_apply_cache.default for op in MLA_OPS},
    ),
)


# ---- family: norm_cache (rms_norm_apply_qk_cache) ----------------------------------------------
# The valid call: q (6, 4, 80), k (6, 2, 80), v (6, 2, 40), weights (80,), tables (48, 24),
# positions (6, 1), paged float32 caches (6, 4, 2, 80) and (6, 4, 2, 40) (24 slots), slots with one
# padding token. Checked on CPU and Meta (its CUDA glue's checks are the host run's).

NORM_CACHE_OPS = ("rms_norm_apply_qk_cache", "raw.rms_norm_apply_qk_cache")
_NORM_CACHE_ARGS = ("q", "k", "v", "q_weight", "k_weight", "cos", "sin", "positions", "k_cache",
                    "v_cache", "slot_mapping")  # fmt: skip


def _norm_cache_good_inputs(device):
    cos, sin = make_tables(48, 48, device)
    return dict(
        q=torch.randn(6, 4, 80, device=device),
        k=torch.randn(6, 2, 80, device=device),
        v=torch.randn(6, 2, 40, device=device),
        q_weight=torch.ones(80, device=device),
        k_weight=torch.ones(80, device=device),
        cos=cos,
        sin=sin,
        positions=torch.tensor([[3], [0], [47], [5], [9], [2]], device=device),
        k_cache=torch.full((6, 4, 2, 80), 3.0, device=device),
        v_cache=torch.full((6, 4, 2, 40), 3.0, device=device),
        slot_mapping=torch.tensor([5, 0, -1, 23, 7, 11], device=device),
    )


def _norm_cache_call(op, args):
    a = dict(args)
    tensors = [a.pop(n) for n in _NORM_CACHE_ARGS]
    if op.startswith("raw."):
        return torch.ops.rope.rms_norm_apply_qk_cache(*tensors, **a)
    return torch_rope.rms_norm_apply_qk_cache(*tensors, **a)


def _norm_cache_slot(index, value):
    return lambda a: a["slot_mapping"].__setitem__(index, value)


NORM_CACHE_WRAPPER = ("rms_norm_apply_qk_cache",)

NORM_CACHE_BAD_INPUTS = {
    "norm_cache_slot_repeated": Bad(
        _norm_cache_slot(5, 5),
        RuntimeError,
        r"slot_mapping holds slot 5 twice \(tokens 0 and 5\)",
        needs_data=True,
        devices=_CPU_META,
    ),
    "norm_cache_slot_out_of_range": Bad(
        _norm_cache_slot(5, 24),
        IndexError,
        r"slot_mapping must be < the caches' slot count 24 \(negative = padding\), got 24 at "
        r"index 5",
        needs_data=True,
        devices=_CPU_META,
    ),
    "norm_cache_position_out_of_range": Bad(
        lambda a: a["positions"].__setitem__((5, 0), 48),
        IndexError,
        r"positions must be in \[0, max_seq_len\) with max_seq_len = cos\.size\(0\) = 48, got 48 "
        r"at flat index 5",
        needs_data=True,
        devices=_CPU_META,
    ),
    "norm_cache_q_scale_without_fp8_q": Bad(
        lambda a: a.update(q_scale=0.5),
        RuntimeError,
        r"q_scale applies to a float8 q_dtype only",
        NORM_CACHE_WRAPPER,
        devices=_CPU_META,
    ),
    "norm_cache_q_scale_zero": Bad(
        lambda a: a.update(q_dtype=E4M3, q_scale=0.0),
        ValueError,
        r"q_scale must be a finite number > 0",
        NORM_CACHE_WRAPPER,
        devices=_CPU_META,
    ),
    "norm_cache_q_dtype_not_fp8": Bad(
        lambda a: a.update(q_dtype=torch.float16),
        RuntimeError,
        r"q_dtype must be q's dtype Float or float8 \(torch\.float8_e4m3fn, torch\.float8_e5m2\), "
        r"got Half",
        devices=_CPU_META,
    ),
    "norm_cache_eps_zero": Bad(
        lambda a: a.update(eps=0.0),
        RuntimeError,
        r"eps must be a finite number > 0, got 0$",
        devices=_CPU_META,
    ),
    "norm_cache_scale_for_32bit_cache": Bad(
        lambda a: a.update(k_scale=0.5),
        ValueError,
        r"k_scale=0\.5 applies to float8 caches only; the cache is torch\.float32",
        NORM_CACHE_WRAPPER,
        devices=_CPU_META,
    ),
    "norm_cache_q_weight_short": Bad(
        lambda a: a.update(q_weight=a["q_weight"][:-1]),
        RuntimeError,
        r"q_weight must have shape \(head_dim,\) = \(80,\) of q, got shape \[79\]",
        devices=_CPU_META,
    ),
    "norm_cache_k_weight_in_k_cache": Bad(
        lambda a: a.update(k_weight=a["k_cache"].view(-1)[:80]),
        RuntimeError,
        r"k_cache shares memory with k_weight",
        needs_memory=True,
        devices=_CPU_META,
    ),
    "norm_cache_fp8_cache_without_scale": Bad(
        lambda a: a.update(k_cache=a["k_cache"].to(torch.float8_e5m2)),
        RuntimeError,
        r"k_scale is required",
        devices=_CPU_META,
    ),
}

register_family(
    "norm_cache",
    Family(
        ops=NORM_CACHE_OPS,
        good_inputs=_norm_cache_good_inputs,
        call=_norm_cache_call,
        cases=NORM_CACHE_BAD_INPUTS,
        op_name=lambda op: "rope.rms_norm_apply_qk_cache",
        overloads={op: torch.ops.rope.rms_norm_apply_qk_cache.default for op in NORM_CACHE_OPS},
    ),
)


# ---- Python-number fp8 scales of every fp8 wrapper ----------------------------------------------
# The kv_cache family's k_scale / v_scale are catalogue cases above; these are the other wrappers'
# scales. Each valid call below stores float8; a bad Python number is refused with the scale's
# name before anything is written.


def _fp8_scale_calls(device):
    T, R, L = 3, 16, 8
    fp8 = torch.float8_e4m3fn
    cos, sin = make_tables(8, R, device)
    pos = torch.tensor([[0], [5], [2]], device=device)
    slots = torch.tensor([1, 3, 0], device=device)

    def qk_fp8(**scale):
        q, k = torch.randn(T, 2, R, device=device), torch.randn(T, 1, R, device=device)
        return (q, k), lambda: torch_rope.apply_qk_fp8(q, k, cos, sin, pos, **scale)

    def mla(**scale):
        q_pe, k_pe = torch.randn(T, 2, R, device=device), torch.randn(T, R, device=device)
        kv_c = torch.randn(T, L, device=device)
        cache = torch.zeros(4, L + R, device=device).to(fp8)
        kw = dict(kv_scale=0.5, q_dtype=fp8, q_scale=0.5)
        kw.update(scale)
        return (cache,), lambda: torch_rope.mla_apply_cache(
            q_pe, k_pe, kv_c, cos, sin, pos, cache, None, slots, **kw
        )

    def norm_cache(**scale):
        q, k, v = (torch.randn(T, h, R, device=device) for h in (2, 1, 1))
        w = torch.ones(R, device=device)
        caches = [torch.zeros(4, 1, R, device=device).to(fp8) for _ in range(2)]
        kw = dict(k_scale=0.5, v_scale=0.5, q_dtype=fp8, q_scale=0.5)
        kw.update(scale)
        return tuple(caches), lambda: torch_rope.rms_norm_apply_qk_cache(
            q, k, v, w, w, cos, sin, pos, caches[0], caches[1], slots, **kw
        )

    return {
        ("rope.apply_qk_fp8", "q_scale", "/"): lambda v: qk_fp8(q_scale=v),
        ("rope.apply_qk_fp8", "k_scale", "*"): lambda v: qk_fp8(k_scale=v, multiply_by_scale=True),
        ("rope.mla_apply_cache", "kv_scale", "/"): lambda v: mla(kv_scale=v),
        ("rope.mla_apply_cache", "q_scale", "/"): lambda v: mla(q_scale=v),
        ("rope.rms_norm_apply_qk_cache", "q_scale", "/"): lambda v: norm_cache(q_scale=v),
        ("rope.rms_norm_apply_qk_cache", "k_scale", "/"): lambda v: norm_cache(k_scale=v),
        ("rope.rms_norm_apply_qk_cache", "v_scale", "/"): lambda v: norm_cache(v_scale=v),
    }


_FP8_SCALE_CALLS = list(_fp8_scale_calls("meta"))


@pytest.mark.parametrize("value", [1e-50, 1e-39, 1e39, 0.0, -1.0, float("nan"), float("inf")])
@pytest.mark.parametrize("which", _FP8_SCALE_CALLS, ids=lambda w: f"{w[0]}-{w[1]}")
@pytest.mark.parametrize("device", ["cpu", "meta", pytest.param("cuda", marks=needs_cuda)])
def test_every_fp8_wrapper_refuses_a_python_scale_that_quantizes_nothing(device, which, value):
    op, name, rule = which
    written, run = _fp8_scale_calls(device)[which](value)
    before = [t.clone() for t in written if not t.is_meta]
    if value > 0 and value != float("inf"):  # finite and > 0, but no float32 holds it
        pattern = (
            rf"{re.escape(op)}: {name} must be within float32's normal range "
            rf"\[1\.175494e-38, 3\.402823e\+38\] \(the op reads it as a float32; stored = "
            rf"saturate\(value {re.escape(rule)} {name}\)\), got {re.escape(repr(value))}$"
        )
    else:
        pattern = (
            rf"{re.escape(op)}: {name} must be a finite number > 0 \(stored = saturate\(value "
            rf"{re.escape(rule)} {name}\)\), got {re.escape(repr(value))}$"
        )
    with pytest.raises(ValueError, match=pattern):
        run()
    for t, b in zip([t for t in written if not t.is_meta], before):
        assert same_bits(t, b), "a refused call wrote its cache"


@pytest.mark.parametrize("missing", ["cos", "sin", "positions"])
@pytest.mark.parametrize("op", ["apply_qk_fp8", "mla_apply_cache", "rms_norm_apply_qk_cache"])
def test_fused_wrappers_refuse_a_missing_source_with_a_type_error(op, missing):
    T, R, L = 3, 16, 8
    fp8 = torch.float8_e4m3fn
    cos, sin = make_tables(8, R, "cpu")
    args = dict(cos=cos, sin=sin, positions=torch.tensor([[0], [5], [2]]))
    args[missing] = None
    slots = torch.tensor([1, 3, 0])
    q, k = torch.randn(T, 2, R), torch.randn(T, 1, R)
    if op == "apply_qk_fp8":
        calls = [
            lambda: torch_rope.apply_qk_fp8(q, k, **args),
            lambda: torch_rope.apply_qk_fp8(
                q, k, **args, out=(torch.empty(q.shape, dtype=fp8), torch.empty(k.shape, dtype=fp8))
            ),
        ]
    elif op == "mla_apply_cache":
        cache = torch.zeros(4, L + R)
        calls = [lambda: torch_rope.mla_apply_cache(
            q, k[:, 0], torch.randn(T, L), args["cos"], args["sin"], args["positions"], cache,
            None, slots)]  # fmt: skip
    else:
        w, caches = torch.ones(R), (torch.zeros(4, 1, R), torch.zeros(4, 1, R))
        calls = [lambda: torch_rope.rms_norm_apply_qk_cache(
            q, k, k.clone(), w, w, args["cos"], args["sin"], args["positions"], *caches, slots
        )]  # fmt: skip
    for run in calls:
        with pytest.raises(TypeError, match=rf"^rope\.{op}: give the cos and sin tables and "
                           rf"positions \(tensors\), got None for {missing}$"):  # fmt: skip
            run()
