# SPDX-License-Identifier: BSD-3-Clause
"""The rotations users write instead of torch_rope, each as a zero-argument callable over prepared
inputs, so the benchmark times exactly one call of each.

- HF transformers: ``apply_rotary_pos_emb`` (half split, ``rotate_half``) on (B, H, S, D), with
  cos/sin gathered per call from full-width (max_seq_len, D) tables by ``position_ids``, as a
  model with cached tables does. The real functions are used when transformers is installed.
- Meta's Llama reference: complex multiplication (``view_as_complex``) on (B, S, H, D), with the
  ``freqs_cis`` rows gathered per call.
- torchtune: ``RotaryPositionalEmbeddings`` (its float32 cache and reshape form) on (B, S, H, D);
  the real module when torchtune is installed.
- torch_rope.eager: the library's plain-PyTorch reference (the eager formula).
Each of them can also be wrapped in torch.compile.

Every alternative computes the same rotation of the same data as torch_rope (same positions,
same layout of planes), checked by ``check_agreement`` before anything is timed.
"""

from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch

import torch_rope
from torch_rope import eager  # the plain-PyTorch math

try:  # the real HF functions, when installed
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply_qk
    from transformers.models.llama.modeling_llama import rotate_half as hf_rotate_half

    HF_SOURCE = "transformers"
except Exception:  # pragma: no cover - depends on the environment
    HF_SOURCE = "local copy of the HF formula"

    def hf_rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    def hf_apply_qk(q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + hf_rotate_half(q) * sin, k * cos + hf_rotate_half(k) * sin


try:
    from torchtune.modules import RotaryPositionalEmbeddings as TorchtuneRoPE

    TORCHTUNE_SOURCE = "torchtune"
except Exception:  # pragma: no cover - depends on the environment
    TorchtuneRoPE = None
    TORCHTUNE_SOURCE = "unavailable"


@dataclass
class Problem:
    """One rotation problem: q (and k) in (B, H, S, D) with per-sequence positions (B, S)."""

    q: torch.Tensor
    k: Optional[torch.Tensor]
    position_ids: torch.Tensor  # (B, S) int64
    cos: torch.Tensor  # (max_seq_len, D/2) float32, torch_rope's tables
    sin: torch.Tensor

    @property
    def positions(self):  # broadcast to (B, H, S): (B, 1, S)
        return self.position_ids.unsqueeze(1)


def hf_inputs(p: Problem):
    # HF keeps full-width tables: cos.repeat over both halves (emb = cat(freqs, freqs)).
    return torch.cat([p.cos, p.cos], -1), torch.cat([p.sin, p.sin], -1)


def hf_rotate_q(q, cos_full, sin_full, position_ids):
    cos, sin = cos_full[position_ids].unsqueeze(1), sin_full[position_ids].unsqueeze(1)
    return (q * cos + hf_rotate_half(q) * sin).to(q.dtype)


def hf_rotate_qk(q, k, cos_full, sin_full, position_ids):
    cos, sin = cos_full[position_ids], sin_full[position_ids]
    qe, ke = hf_apply_qk(q, k, cos, sin)
    return qe.to(q.dtype), ke.to(k.dtype)


def meta_rotate(x_bshd, freqs_cis, position_ids):
    # Llama reference: pairs as complex numbers times e^{i p theta_k}, in float32.
    freqs = freqs_cis[position_ids].unsqueeze(2)  # (B, S, 1, D/2)
    xc = torch.view_as_complex(x_bshd.float().reshape(*x_bshd.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs).flatten(3).type_as(x_bshd)


def meta_rotate_qk(q_bshd, k_bshd, freqs_cis, position_ids):
    return meta_rotate(q_bshd, freqs_cis, position_ids), meta_rotate(
        k_bshd, freqs_cis, position_ids
    )


def build(p: Problem, compile_alternatives: bool) -> Dict[str, Callable[[], object]]:
    """Zero-argument callables: torch_rope (both layouts), the alternatives, and clone."""
    q, k, pos, ids = p.q, p.k, p.positions, p.position_ids
    cos, sin = p.cos, p.sin
    pair = k is not None
    # Layout-native copies for the (B, S, H, D) implementations, made once outside the timing.
    q_bshd = q.transpose(1, 2).contiguous()
    k_bshd = k.transpose(1, 2).contiguous() if pair else None
    cos_full, sin_full = hf_inputs(p)
    freqs_cis = torch.polar(torch.ones_like(cos), torch.atan2(sin, cos))  # e^{i angle}

    fns: Dict[str, Callable[[], object]] = {}
    if pair:
        fns["clone"] = lambda: (q.clone(), k.clone())
        fns["torch_rope"] = lambda: torch_rope.apply_qk(q, k, cos, sin, pos)
        fns["torch_rope half-split"] = lambda: torch_rope.apply_qk(
            q, k, cos, sin, pos, interleaved=False
        )
    else:
        fns["clone"] = lambda: q.clone()
        fns["torch_rope"] = lambda: torch_rope.apply(q, cos, sin, pos)
        fns["torch_rope half-split"] = lambda: torch_rope.apply(q, cos, sin, pos, interleaved=False)

    impls = {}
    if pair:
        impls["HF"] = (hf_rotate_qk, (q, k, cos_full, sin_full, ids))
        impls["Meta complex"] = (meta_rotate_qk, (q_bshd, k_bshd, freqs_cis, ids))
        impls["reference"] = (eager.apply_qk, (q, k, cos, sin, pos))
    else:
        impls["HF"] = (hf_rotate_q, (q, cos_full, sin_full, ids))
        impls["Meta complex"] = (meta_rotate, (q_bshd, freqs_cis, ids))
        impls["reference"] = (eager.apply, (q, cos, sin, pos))
    if TorchtuneRoPE is not None:
        tt = TorchtuneRoPE(q.size(-1), max_seq_len=cos.size(0))
        if pair:
            impls["torchtune"] = (
                lambda a, b, i: (tt(a, input_pos=i), tt(b, input_pos=i)),
                (q_bshd, k_bshd, ids),
            )
        else:
            impls["torchtune"] = (lambda a, i: tt(a, input_pos=i), (q_bshd, ids))
    for name, (fn, args) in impls.items():
        fns[name] = lambda f=fn, a=args: f(*a)
        if compile_alternatives:
            compiled = torch.compile(fn)
            fns[name + " compiled"] = lambda f=compiled, a=args: f(*a)
    return fns


def check_agreement(p: Problem, fns: Dict[str, Callable[[], object]]) -> Dict[str, float]:
    """Which alternatives do not rotate the same planes by the same angles as torch_rope (to within
    the rounding of different float32 formulas and table sources): {name: max error}. The
    benchmark drops those from the timing and records them, so what it times compares like with
    like."""

    def as_bhsd(name, out):
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if name.startswith(("Meta", "torchtune")):
            outs = [o.transpose(1, 2) for o in outs]
        return outs

    want_interleaved = as_bhsd("torch_rope", fns["torch_rope"]())
    want_half = as_bhsd("torch_rope", fns["torch_rope half-split"]())
    # Loose: torchtune computes its angles in float32 (an error of ~1e-4 rad at position 4000);
    # a wrong layout or position would be off by O(1).
    tol = 3e-2 if p.q.dtype in (torch.bfloat16, torch.float16) else 1e-2
    wrong = {}
    for name, fn in fns.items():
        if name == "clone" or name.startswith("torch_rope"):
            continue
        want = want_half if name.startswith("HF") else want_interleaved
        for got, ref in zip(as_bhsd(name, fn()), want):
            err = (got.float() - ref.float()).abs().max().item()
            scale = ref.float().abs().max().item() + 1e-6
            if not err <= tol * scale:  # NaN counts as wrong
                wrong[name] = max(wrong.get(name, 0.0), err)
    return wrong
