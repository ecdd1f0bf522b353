"""Bad input: every check raises a message naming the argument, the expectation and what came,
and apply_ writes nothing when it raises."""

import re

import pytest
import torch

import torch_rope
from helpers import make_tables, needs_cuda

MAX_SEQ_LEN, ROTARY_DIM, HEAD_DIM = 16, 8, 16
OPS = ["apply", "apply_", "apply_qk:q", "apply_qk:k"]


def good_inputs(device="cpu"):
    cos, sin = make_tables(MAX_SEQ_LEN, ROTARY_DIM, device)
    return dict(
        x=torch.randn(2, 3, 5, HEAD_DIM, device=device),
        cos=cos,
        sin=sin,
        positions=torch.arange(5, device=device),
    )


def call(op, x, cos, sin, positions):
    """Run `op` with `x` as the input under test; for apply_qk the other input is valid."""
    if op == "apply":
        return torch_rope.apply(x, cos, sin, positions)
    if op == "apply_":
        return torch_rope.apply_(x, cos, sin, positions)
    rows = x.shape[:-1] if x.dim() else ()
    dtype = x.dtype if x.dtype.is_floating_point else torch.float32
    good = torch.randn(rows + (HEAD_DIM,), device=x.device, dtype=dtype)
    if op == "apply_qk:q":
        return torch_rope.apply_qk(x, good, cos, sin, positions)
    return torch_rope.apply_qk(good, x, cos, sin, positions)


def op_name(op):
    return "rope." + op.split(":")[0]


def arg_name(op):
    return op.split(":")[1] if ":" in op else "x"


# name -> (change to the good inputs, exception type, message pattern; {x} is the argument name)
BAD_INPUTS = {
    "head_dim_below_rotary_dim": (
        lambda a: a.update(x=a["x"][..., :6].contiguous()),
        RuntimeError,
        r"{x}\.size\(-1\) \(head_dim\) must be >= rotary_dim.*8.*got 6",
    ),
    "float_positions": (
        lambda a: a.update(positions=a["positions"].float()),
        RuntimeError,
        r"positions must be an integer tensor.*Float",
    ),
    "bool_positions": (
        lambda a: a.update(positions=a["positions"] > 1),
        RuntimeError,
        r"positions must be an integer tensor.*Bool",
    ),
    "positions_too_long": (
        lambda a: a.update(positions=torch.arange(6)),
        RuntimeError,
        r"positions of shape \[6\] cannot be broadcast to {x}\.shape\[:-1\] = \[2, 3, 5\]",
    ),
    "positions_too_many_dims": (
        lambda a: a.update(positions=torch.zeros(1, 2, 3, 5, dtype=torch.long)),
        RuntimeError,
        r"positions of shape \[1, 2, 3, 5\] cannot be broadcast",
    ),
    "positions_bshd_shape_for_bhsd_input": (
        lambda a: a.update(positions=torch.arange(5).view(5, 1)),
        RuntimeError,
        r"positions of shape \[5, 1\] cannot be broadcast",
    ),
    "position_above_table": (
        lambda a: a.update(positions=torch.tensor([0, 1, 2, 23, 4])),
        (IndexError, RuntimeError),
        r"positions must be in \[0, max_seq_len\).*16.*got 23",
    ),
    "position_equal_to_table_length": (
        lambda a: a.update(positions=torch.tensor([0, 1, 2, 3, 16], dtype=torch.int32)),
        (IndexError, RuntimeError),
        r"positions must be in \[0, max_seq_len\).*16.*got 16",
    ),
    "negative_position": (
        lambda a: a.update(positions=torch.tensor([0, -1, 2, 3, 4])),
        (IndexError, RuntimeError),
        r"positions must be in \[0, max_seq_len\).*16.*got -1",
    ),
    "integer_x": (
        lambda a: a.update(x=torch.randint(0, 9, (2, 3, 5, HEAD_DIM))),
        RuntimeError,
        r"{x} must be a floating tensor.*got Long",
    ),
    "zero_dim_x": (
        lambda a: a.update(x=torch.tensor(1.0), positions=torch.tensor(0)),
        RuntimeError,
        r"{x} must have at least 1 dim",
    ),
    "cos_sin_shapes_differ": (
        lambda a: a.update(sin=a["sin"][:8]),
        RuntimeError,
        r"cos and sin must have the same shape, got cos \[16, 4\] and sin \[8, 4\]",
    ),
    "cos_sin_dtypes_differ": (
        lambda a: a.update(sin=a["sin"].double()),
        RuntimeError,
        r"cos and sin must have the same dtype, got cos Float and sin Double",
    ),
    "one_dim_tables": (
        lambda a: a.update(cos=a["cos"][0], sin=a["sin"][0]),
        RuntimeError,
        r"cos must be a 2-D table",
    ),
    "half_precision_tables": (
        lambda a: a.update(cos=a["cos"].half(), sin=a["sin"].half()),
        RuntimeError,
        r"cos must be float32 or float64.*got Half",
    ),
}


# Cases that change x itself are run with the bad tensor as q and as k; the others (positions,
# tables) are shared by q and k, so one apply_qk variant covers them.
X_CASES = {"head_dim_below_rotary_dim", "integer_x", "zero_dim_x"}
BAD_INPUT_PARAMS = [
    pytest.param(case, op, id=f"{case}-{op}")
    for case in BAD_INPUTS
    for op in OPS
    if case in X_CASES or op != "apply_qk:k"
]


@pytest.mark.parametrize("case,op", BAD_INPUT_PARAMS)
def test_bad_input_message(case, op):
    change, error, pattern = BAD_INPUTS[case]
    args = good_inputs()
    change(args)
    x_before = args["x"].clone()
    message = re.escape(op_name(op)) + r": .*" + pattern.format(x=arg_name(op))
    with pytest.raises(error, match=message):
        call(op, **args)
    assert torch.equal(args["x"], x_before), "the input was modified by a call that raised"


def test_apply_inplace_writes_nothing_when_a_late_position_is_bad():
    # Rows 0..3 are valid and would be rotated first by a kernel that checked as it went.
    # (CPU only: on CUDA an out-of-range position is a device-side assert, as in torch indexing.)
    cos, sin = make_tables(MAX_SEQ_LEN, ROTARY_DIM, "cpu")
    x = torch.randn(5, HEAD_DIM)
    before = x.clone()
    version = x._version
    with pytest.raises((IndexError, RuntimeError), match=r"max_seq_len.*16.*got 99"):
        torch_rope.apply_(x, cos, sin, torch.tensor([0, 1, 2, 3, 99]))
    assert torch.equal(x, before)
    assert x._version == version


def test_inplace_on_overlapping_memory_raises_and_writes_nothing():
    cos, sin = make_tables(MAX_SEQ_LEN, ROTARY_DIM, "cpu")
    base = torch.randn(1, 5, HEAD_DIM)
    before = base.clone()
    x = base.expand(3, 5, HEAD_DIM)
    with pytest.raises(RuntimeError, match=r"rope\.apply_: x has overlapping memory.*clone\(\)"):
        torch_rope.apply_(x, cos, sin, torch.arange(5))
    assert torch.equal(base, before)


def test_positions_broadcast_to_q_but_not_to_k():
    # GQA: per-head positions for 8 query heads cannot serve 2 key heads.
    cos, sin = make_tables(MAX_SEQ_LEN, ROTARY_DIM, "cpu")
    q, k = torch.randn(2, 8, 5, HEAD_DIM), torch.randn(2, 2, 5, HEAD_DIM)
    positions = torch.zeros(2, 8, 5, dtype=torch.long)
    with pytest.raises(RuntimeError, match=r"rope\.apply_qk: positions of shape \[2, 8, 5\] "
                                           r"cannot be broadcast to k\.shape\[:-1\] = \[2, 2, 5\]"):
        torch_rope.apply_qk(q, k, cos, sin, positions)


def test_apply_qk_dtype_mismatch():
    a = good_inputs()
    with pytest.raises(RuntimeError, match=r"rope\.apply_qk: q and k must have the same dtype, "
                                           r"got q Float and k Double"):
        torch_rope.apply_qk(a["x"], a["x"].double(), a["cos"], a["sin"], a["positions"])


def test_apply_qk_head_dim_mismatch():
    a = good_inputs()
    with pytest.raises(RuntimeError, match=r"rope\.apply_qk: q and k must have the same head_dim"
                                           r".*got q 16 and k 12"):
        torch_rope.apply_qk(a["x"], a["x"][..., :12], a["cos"], a["sin"], a["positions"])


# The fake (meta) kernels run under torch.compile and on meta tensors: same checks, same words.
META_CASES = [
    pytest.param("head_dim_below_rotary_dim", r"x\.size\(-1\) \(head_dim\) must be >= rotary"),
    pytest.param("float_positions", r"positions must be an integer tensor"),
    pytest.param("integer_x", r"x must be a floating tensor"),
    pytest.param("cos_sin_shapes_differ", r"cos and sin .*same shape"),
    pytest.param(
        "positions_too_long",
        r"positions of shape .*6.* cannot be broadcast",
    ),
]


@pytest.mark.parametrize("case,pattern", META_CASES)
def test_meta_tensors_get_the_same_checks(case, pattern):
    change, error, _ = BAD_INPUTS[case]
    args = good_inputs()
    change(args)
    args = {k: v.to("meta") for k, v in args.items()}
    with pytest.raises(error, match=r"rope\.apply: .*" + pattern):
        torch_rope.apply(**args)


@needs_cuda
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("moved", ["cos_and_sin", "positions", "x"])
def test_device_mismatch(moved, op):
    args = good_inputs("cuda")
    if moved == "cos_and_sin":
        args.update(cos=args["cos"].cpu(), sin=args["sin"].cpu())
        pattern = r"(cos.*device|device.*cos)"
    elif moved == "positions":
        args.update(positions=args["positions"].cpu())
        pattern = r"positions.*same device"
    else:
        args.update(x=args["x"].cpu())
        pattern = r"same device"
    x_before = args["x"].clone()
    with pytest.raises(RuntimeError, match=pattern):
        call(op, **args)
    assert torch.equal(args["x"], x_before)


@needs_cuda
def test_cos_and_sin_on_different_devices():
    a = good_inputs("cuda")
    with pytest.raises(RuntimeError, match=r"cos and sin must be on the same device"):
        torch_rope.apply(a["x"], a["cos"], a["sin"].cpu(), a["positions"])
