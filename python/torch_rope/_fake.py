"""Fake (meta) kernels: output shapes without computing, for torch.compile, export and meta tensors.

``torch.library.register_fake`` also registers them for the Meta dispatch key. They work on
symbolic shapes, and check what can be checked without data; value checks (position range) happen
in the real kernels.
"""

import torch

_FLOATING = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _check(op: str, name: str, x, cos, sin, positions) -> None:
    torch._check(
        x.dtype in _FLOATING,
        lambda: f"{op}: {name} must be a floating tensor (float64, float32, float16 or "
        f"bfloat16), got {x.dtype}",
    )
    torch._check(
        cos.dim() == 2 and cos.shape == sin.shape,
        lambda: f"{op}: cos and sin must be 2-D tables of the same shape, got cos "
        f"{tuple(cos.shape)} and sin {tuple(sin.shape)}",
    )
    torch._check(
        positions.dtype in (torch.int32, torch.int64),
        lambda: f"{op}: positions must be an integer tensor (int32 or int64), got "
        f"{positions.dtype}",
    )
    torch._check(x.dim() >= 1, lambda: f"{op}: {name} must have at least 1 dim (..., head_dim)")
    torch._check(
        x.shape[-1] >= 2 * cos.shape[-1],
        lambda: f"{op}: {name}.size(-1) (head_dim) must be >= rotary_dim = 2 * cos.size(-1) = "
        f"{2 * cos.shape[-1]}, got {x.shape[-1]}",
    )
    # positions must broadcast *to* x.shape[:-1] (aligned right), as the real kernels require.
    row_shape = x.shape[:-1]
    broadcastable = positions.dim() <= len(row_shape) and all(
        p == 1 or p == r for p, r in zip(reversed(positions.shape), reversed(row_shape))
    )
    torch._check(
        broadcastable,
        lambda: f"{op}: positions of shape {list(positions.shape)} cannot be broadcast to "
        f"{name}.shape[:-1] = {list(row_shape)}"
        # distributed: DTensor checks shapes here, on global shapes (torch_rope.distributed)
        f" (if {name} is a DTensor, these are global shapes: positions must be global and "
        "broadcastable to the global shape)",
    )


@torch.library.register_fake("rope::apply")
def _apply_fake(x, cos, sin, positions, *, interleaved=True, inverse=False):
    _check("rope.apply", "x", x, cos, sin, positions)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("rope::apply_")
def _apply_inplace_fake(x, cos, sin, positions, *, interleaved=True, inverse=False):
    _check("rope.apply_", "x", x, cos, sin, positions)
    return None


@torch.library.register_fake("rope::apply_qk")
def _apply_qk_fake(q, k, cos, sin, positions, *, interleaved=True, inverse=False):
    _check("rope.apply_qk", "q", q, cos, sin, positions)
    _check("rope.apply_qk", "k", k, cos, sin, positions)
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        torch.empty_like(k, memory_format=torch.contiguous_format),
    )
