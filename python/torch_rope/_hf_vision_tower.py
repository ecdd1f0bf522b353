# SPDX-License-Identifier: BSD-3-Clause
"""Vision towers loaded on their own (transformers registers them as model types of their own,
``qwen2_5_vl_vision`` ...: users load them alone as image encoders).

Such a model has the vision rotary module and the vision blocks of its vision-language model and
no text tower: :func:`torch_rope.hf.patch` puts torch_rope under its blocks exactly as under the
vision tower of the whole model (``_patch_vision``: the axial 2-D tables, the self-check of each
block class), with nothing to do for a text RoPE.
"""

import torch
from torch import Tensor

#: The vision-tower model types :func:`torch_rope.hf.patch` knows: each rotates
#: ``rotate_half`` over the whole head, the first half of the planes by the patch's row and the
#: second half by its column, each axis with the same frequencies (Pixtral: each with its own,
#: :func:`split_frequencies`); tests/python/integrations/test_hf_vision_tower.py checks each
#: against the unpatched tower.
MODEL_TYPES = (
    "qwen2_5_vl_vision",
    "qwen3_vl_vision",
    "qwen3_vl_moe_vision",
    "qwen3_5_vision",
    "qwen3_5_moe_vision",
    "glm4v_vision",
    "glm4v_moe_vision",
    "glm_ocr_vision",
    "glm5_next_vision",
    "video_llama_3_vision",
    "lfm3_vl_vision",
    "exaone4_5_vision",
    "muse_spark_vision",
    "pixtral",
    "muse_glimmer_vision",
    "qwen4_exp_vision",
    "cohere_compass_vision",
    "inkling2_vision",
)

#: Towers whose planes are laid out otherwise, as (interleaved, column_first): Inkling2's
#: rotates GPT-J pairs (``rotate_pairwise``, cos/sin ``repeat_interleave``-d) and turns its first
#: half of the planes by the column, the second by the row. The self-check confirms the layout.
LAYOUTS = {"inkling2_vision": (True, True)}

#: Vision towers whose attention layers rotate through the text models' ``apply_rotary_pos_emb``
#: (with ``unsqueeze_dim=0``: q/k are a batch of one, ``(1, H, N, D)``), not through
#: ``apply_rotary_pos_emb_vision``.
TEXT_NAMED_APPLY = ("pixtral",)


def split_frequencies(theta: float, head_dim: int) -> Tensor:
    """Pixtral's per-plane frequencies, float64: of the ``head_dim / 2`` frequencies
    ``theta^(-2i/head_dim)``, the even-numbered ones turn the row's planes (the first quarter of
    the head, and its rotate_half partner) and the odd-numbered ones the column's. Unlike the
    other axial towers, the two axes do not share their frequencies."""
    full = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return torch.cat([full[0::2], full[1::2]])


def text_rotary_refusal(model_type: str, found: int) -> str:
    """The error of a model of a vision-tower type that also has a text rotary module: patch
    would leave that RoPE as it is, so it refuses instead."""
    return (
        f"torch_rope.hf.patch: expected a {model_type} model to be a vision tower alone (only a "
        f"vision rotary embedding module), found {found} text rotary module(s); not patching"
    )
