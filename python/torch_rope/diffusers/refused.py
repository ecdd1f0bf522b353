# SPDX-License-Identifier: BSD-3-Clause
"""Why :func:`torch_rope.diffusers.patch` refuses each RoPE model class of diffusers it does not
support: one reason per class, shared by a family where the cause is the same.
docs/diffusers_models.md lists them (a test keeps the table and this dict in step), and another
test checks that every RoPE model class of the installed diffusers is either supported or here.

Three kinds of reason: the RoPE is not a rotation at integer positions that any table can hold
(learned, mixed, averaged, not norm-preserving); its positions are fractional coordinates or its
tables come from the caller, which the families here do not build yet; or its attention runs
outside the processors patch rebuilds.
"""

from typing import Dict

_AVERAGED_HISTORY = (
    "its history latents (2x/4x, mid/long) are rotated by cos/sin averaged over neighbouring "
    "positions (avg_pool3d of the tables), which is not a rotation at any position: no table "
    "row holds it"
)
_LTX_COORDINATES = (
    "LTX-2's RoPE (coordinates at the midpoints of patch bounds, in seconds for audio) comes in "
    "a 'split' form whose frequency vector spans the heads, (B, H, T, D / 2), with separate "
    "video, audio and cross-modal tables, q and k of different modalities in cross-attention; "
    "the ltx_coords family covers LTX-Video's interleaved form only"
)
_MINIMAX_H3 = (
    "one inv_freq shared by the frame, row and column axes over aspect-normalised fractional "
    "coordinates computed in float64 by its pipeline, applied to the first 6 * rope_freq_dim "
    "features; no family builds these coordinate tables yet"
)
_INLINE_MROPE = (
    "its processor writes the rotation inline (q * cos + _rotate_half(q) * sin, no rotation "
    "function a patch could replace) on cos/sin its model casts to the model's dtype; its "
    "interleaved M-RoPE (Qwen3-VL's rule, which the op has) runs at positions from 15,000 "
    "(Cosmos 3's modality margin) to 65,536 + the grid (Ideogram 4), with float32 angles in "
    "diffusers"
)

#: The other RoPE model classes of diffusers 0.42.1 (as the tests'
#: ``diffusers_models.rope_model_classes()`` finds them), each with why
#: :func:`torch_rope.diffusers.patch` refuses it (it raises NotImplementedError with the reason).
REFUSED: Dict[str, str] = {
    "MochiTransformer3DModel": (
        "its RoPE frequencies are a learned parameter (3, heads, head_dim / 2) and each plane's "
        "angle sums all three axes' positions (centred, rescaled to a fixed area), per head: "
        "not an axial RoPE with a table per axis"
    ),
    "ErnieImageTransformer2DModel": (
        "its RoPE duplicates angles pairwise ([t0, t0, t1, t1, ...]) but rotates halves, so "
        "feature k turns by t_(k // 2) and its partner k + D / 2 by t_(k // 2 + D / 4): not a "
        "rotation (pair norms are not kept), which no RoPE table expresses"
    ),
    "SanaWMTransformer3DModel": (
        "its RoPE is composed with camera ray transforms (UCPE) inside attention modules that "
        "have no processor (gated delta-net and softmax camera attention), on (B, H, D, S) "
        "layouts"
    ),
    "HunyuanVideoFramepackTransformer3DModel": _AVERAGED_HISTORY,
    "HeliosTransformer3DModel": _AVERAGED_HISTORY,
    "AnyFlowFARTransformer3DModel": (
        "its compressed context frames are rotated by complex tables averaged over a block "
        "(avg_pool1d) and renormalised: their angles are not those of any integer position"
    ),
    "LuminaNextDiT2DModel": (
        "its 2-D RoPE alternates axes plane by plane (plane 2j by the row, 2j + 1 by the column), "
        "which neither contiguous sections nor the interleaved M-RoPE rule express, and its "
        "pipeline hands in a complex table rebuilt every step with time-aware scaling"
    ),
    "LTX2VideoTransformer3DModel": _LTX_COORDINATES,
    "SanaWMLTX2RefinerTransformer3DModel": _LTX_COORDINATES,
    "LTX2TextConnectors": _LTX_COORDINATES,
    "LTX2VideoDiffusionDecoderModel": (
        "its RoPE module rotates hidden_states itself (no processor calls a rotation function), "
        "on (B, T, H, W, heads, D) inside flex neighbourhood attention"
    ),
    "MiniMaxH3Transformer3DModel": _MINIMAX_H3,
    "AutoencoderKLMiniMaxH3": (
        "its ViT decoder's RoPE is over length-normalised coordinates in [-1, 1) x 2 pi, written "
        "inline in its processor; no family builds these coordinate tables yet"
    ),
    "Kandinsky6Transformer3DModel": (
        "five RoPE modules (the video grid's, the audio's with its own frequency scaling, and a "
        "text RoPE per video and audio stream) into one processor class whose audio-video "
        "cross-attention rotates q by one stream's RoPE and k by the other's (rope_q, rope_kv); "
        "the rounded_pairs family has one text and one video RoPE per model, and rounds to "
        "bfloat16, which Kandinsky 6's module-level apply_rotary does not (it keeps x's dtype); "
        "not covered yet"
    ),
    "Kandinsky6SRTransformer3DModel": (
        "its RoPE matrices (one 3-D RoPE at the config's scale_factor, the grid reordered into "
        "8 x 8 blocks) are rotated by a module-level apply_rotary that keeps x's dtype, in a "
        "processor that always dispatches on the flex backend (NABLA block-sparse attention); "
        "the rounded_pairs family rounds to bfloat16 and takes a text and a video RoPE; not "
        "covered yet"
    ),
    "Ideogram4Transformer2DModel": _INLINE_MROPE,
    "Cosmos3OmniTransformer": _INLINE_MROPE,
    "JoyImageEditTransformer3DModel": (
        "it computes its RoPE in a model method (get_rotary_pos_embed, no RoPE module), text "
        "positions after the largest visual index on all axes; not covered yet"
    ),
    "JoyImageEditPlusTransformer3DModel": (
        "per-sample tables, a frame offset accumulated over reference images and padding "
        "rows, built in a model method; not covered yet"
    ),
    "QwenImage21Transformer2DModel": (
        "its RoPE is applied one call down, in _qwenimage21_prepare_qkv, with positions read "
        "from the image mask on the host every forward (text advancing on all axes, image "
        "blocks centred); not covered yet"
    ),
    "AnyFlowTransformer3DModel": (
        "its RoPE is complex128 (q and k rotated in float64) through a dict of per-stream "
        "tables; not covered yet"
    ),
    "WanAnimate2Transformer3DModel": (
        "its rope_apply loops over samples with their own grid sizes, time stride and "
        "reference offsets (complex128); not covered yet"
    ),
}
