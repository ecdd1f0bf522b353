# SPDX-License-Identifier: BSD-3-Clause
"""The diffusers model classes :func:`torch_rope.diffusers.patch` supports: one row each, the only
place they are listed (the tests list them too, to build each one).

A row says which family patches the class (:mod:`.families`) and where its RoPE module is.
``SUPPORTED_MODEL_CLASSES``, the dispatch of ``patch`` and the table of docs/diffusers_models.md
(``scripts/diffusers_models_table.py``) follow from these rows; :mod:`.refused` holds why each
other RoPE class of diffusers is refused. Each supported class is tested against the unpatched
model (tests/python/integrations/test_diffusers*.py): adding one is a row here and a tiny build
in the tests' harness (tests/python/support/diffusers_models.py).
"""

from typing import NamedTuple, Tuple

from .._patching.registry import Registry
from .refused import REFUSED


class ModelClass(NamedTuple):
    """How patch puts torch_rope under one model class."""

    family: str  # the family that patches it (.families)
    rope: Tuple[str, ...] = ()  # the attributes that hold its RoPE module(s)
    variant: str = ""  # which of its family's forms it takes (the family says)


#: A FLUX-style model: ids in, its RoPE module at ``pos_embed``.
FLUX = ModelClass("flux_ids", ("pos_embed",))
#: A Wan-style model: the latent grid's positions, its RoPE module at ``rope``.
WAN = ModelClass("wan_grid", ("rope",))
#: A HunyuanVideo-style model: the latent grid's positions, its RoPE module at ``rope``.
HUNYUAN = ModelClass("hunyuan_grid", ("rope",))
#: A Qwen-Image-style model: centred image grids and text after them, its RoPE at ``pos_embed``.
QWEN = ModelClass("qwen_centered", ("pos_embed",))
#: A grid over halves (Cosmos, CogView4, GLM-Image), its RoPE module at ``rope``.
HALF_GRID = ModelClass("half_grid", ("rope",))
#: ACE-Step's models (the DiT, its encoders and audio tokenizers): RoPE from a function.
ACE = ModelClass("sequence_1d", variant="ace")
#: Z-Image-style: per-axis complex tables gathered by ids through a plain ``rope_embedder``.
ID_GATHER = ModelClass("id_gather", ("rope_embedder",))
#: Tables built by the pipeline and handed in: CogVideoX-style 3-D, HunyuanDiT's 2-D crops.
COGVIDEOX = ModelClass("caller_tables", variant="cogvideox")
HUNYUAN_DIT = ModelClass("caller_tables", variant="hunyuandit")
#: A model that holds others (``nets``) and runs them.
WRAPPER = ModelClass("wrapper")

REGISTRY = Registry(
    "torch_rope.diffusers.patch",
    {
        "FluxTransformer2DModel": FLUX,
        "FluxControlNetModel": FLUX,
        "FluxMultiControlNetModel": WRAPPER,
        "ChromaTransformer2DModel": FLUX,
        "Flux2Transformer2DModel": FLUX,
        "Flux3Transformer2DModel": FLUX,
        "BriaTransformer2DModel": FLUX,
        "BriaFiboTransformer2DModel": FLUX,
        "LongCatImageTransformer2DModel": FLUX,
        "OvisImageTransformer2DModel": FLUX,
        "Krea2Transformer2DModel": ModelClass("flux_ids", ("rotary_emb",)),
        "HunyuanVideoTransformer3DModel": HUNYUAN,
        "HunyuanVideo15Transformer3DModel": HUNYUAN,
        "HunyuanImageTransformer2DModel": HUNYUAN,
        "MotifVideoTransformer3DModel": HUNYUAN,
        "QwenImageTransformer2DModel": QWEN,
        "QwenImageControlNetModel": QWEN,
        "QwenImageMultiControlNetModel": WRAPPER,
        "NucleusMoEImageTransformer2DModel": QWEN,
        "CosmosTransformer3DModel": HALF_GRID,
        "CosmosControlNetModel": HALF_GRID,
        "CogView4Transformer2DModel": HALF_GRID,
        "GlmImageTransformer2DModel": HALF_GRID,
        "AceStepTransformer1DModel": ACE,
        "AceStepAudioTokenizer": ACE,
        "AceStepAudioTokenDetokenizer": ACE,
        "AceStepConditionEncoder": ACE,
        "AceStepLyricEncoder": ACE,
        "AceStepTimbreEncoder": ACE,
        "MiniMaxMusic3Transformer1DModel": ModelClass("sequence_1d", ("rotary_emb",), "cos_sin"),
        "LongCatAudioDiTTransformer": ModelClass("sequence_1d", ("rotary_embed",), "cos_sin"),
        "StableAudio3DiTModel": ModelClass("sequence_1d", ("rotary_pos_emb",), "angles"),
        # SAME's RoPE module sits on each attention module ("*rope").
        "AutoencoderSAME": ModelClass("sequence_1d", ("*rope",), "angles"),
        "AnimaTextConditioner": ModelClass("sequence_1d", ("rotary_emb",), "position_ids"),
        "ZImageTransformer2DModel": ID_GATHER,
        "ZImageControlNetModel": ID_GATHER,
        "BriaFibo2Transformer2DModel": ID_GATHER,
        "Lumina2Transformer2DModel": ModelClass("id_gather", ("rope_embedder",), "module"),
        "HiDreamImageTransformer2DModel": ModelClass("matrix_pairs", ("pe_embedder",), "qk"),
        "PRXTransformer2DModel": ModelClass("matrix_pairs", ("pe_embedder",)),
        "CogVideoXTransformer3DModel": COGVIDEOX,
        "ConsisIDTransformer3DModel": COGVIDEOX,
        "HunyuanDiT2DModel": HUNYUAN_DIT,
        "HunyuanDiT2DControlNetModel": HUNYUAN_DIT,
        "HunyuanDiT2DMultiControlNetModel": WRAPPER,
        "StableAudioDiTModel": ModelClass("caller_tables", variant="stable_audio"),
        "EasyAnimateTransformer3DModel": ModelClass("caller_tables", variant="easyanimate"),
        # Three per-axis tables from the pipeline, the head rotated in thirds.
        "AllegroTransformer3DModel": ModelClass("axis_chunks"),
        # Text and video RoPE modules; q and k rounded to bf16 after the rotation.
        "Kandinsky5Transformer3DModel": ModelClass(
            "rounded_pairs", ("text_rope_embeddings", "visual_rope_embeddings")
        ),
        "LTXVideoTransformer3DModel": ModelClass("ltx_coords", ("rope",)),
        "OmniGenTransformer2DModel": ModelClass("su_scaled", ("rope",)),
        "WanTransformer3DModel": WAN,
        "WanVACETransformer3DModel": WAN,
        "WanAnimateTransformer3DModel": WAN,
        "SkyReelsV2Transformer3DModel": WAN,
        "ChronoEditTransformer3DModel": WAN,
        "SanaVideoTransformer3DModel": WAN,
    },
    REFUSED,
    kind="model class",
)

#: The model classes patch supports, in the registry's order.
SUPPORTED_MODEL_CLASSES = REGISTRY.supported
