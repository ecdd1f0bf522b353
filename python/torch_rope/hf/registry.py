# SPDX-License-Identifier: BSD-3-Clause
"""The model types :func:`torch_rope.hf.patch` supports: one row each, the only place they are
listed (the tests list them too, to build each one).

A row says which family patches the type's text RoPE (:mod:`.families`), the rule of its
multi-axis text positions if it has them, and what its vision tower rotates with if it has one.
``SUPPORTED_MODEL_TYPES``, the dispatch of ``patch`` and the table of docs/hf_models.md
(``scripts/hf_models_table.py``) follow from these rows; :mod:`.refused` holds why each other
rotary type is refused. Each supported type is tested against the unpatched model
(tests/python/integrations/test_hf*.py): adding one is a row here and a line in the tests'
harness (tests/python/support/hf_models.py).
"""

from typing import NamedTuple, Optional

from .._patching.registry import Registry
from .refused import REFUSED


class MultiAxis(NamedTuple):
    """A text tower's multi-axis positions (M-RoPE: ``position_ids`` of shape ``(3, B, S)``,
    temporal, height and width), reaching ``apply_qk`` as ``(B, S, 3)`` with the model's
    ``mrope_section``."""

    interleaved: bool  # torch_rope's pair layout: GPT-J pairs (GLM-4V's text), or rotate_half
    mrope_interleaved: bool  # Qwen3-VL's rule dealing planes to axes, or contiguous sections
    # Two axes alternating plane by plane (NeoMME's row, column, row, ...), each plane its own
    # frequency: no rule of the op, so per-call rows (rotate.alternating_rows).
    alternating: bool = False


#: Contiguous runs of ``mrope_section`` planes per axis, rotate_half (Qwen2-VL).
SECTIONS = MultiAxis(interleaved=False, mrope_interleaved=False)
#: The same, GPT-J pairs (GLM-4V).
SECTIONS_GPTJ_PAIRS = MultiAxis(interleaved=True, mrope_interleaved=False)
#: Qwen3-VL's interleaved rule: plane k reads axis k % 3 within the sections, rotate_half.
INTERLEAVED_AXES = MultiAxis(interleaved=False, mrope_interleaved=True)
#: NeoMME's: two axes (row, column) alternating plane by plane, rotate_half.
ALTERNATING_AXES = MultiAxis(interleaved=False, mrope_interleaved=False, alternating=True)


class VisionRoPE(NamedTuple):
    """What a vision tower rotates with: the family that patches it (None: it has no RoPE, so
    only the text tower is patched) and, for an axial RoPE, its layout."""

    family: Optional[str]
    axes: int = 2  # position axes: (row, column), or (frame, row, column)
    interleaved: bool = False  # GPT-J pairs instead of rotate_half
    column_first: bool = False  # the first planes turn by the column
    text_apply: bool = False  # its layers call the text models' function, not the vision one
    alternating: bool = False  # the axes alternate plane by plane, not one run of planes each


#: A vision tower without RoPE (learned or no position embeddings): nothing to patch there.
NO_VISION_ROPE = VisionRoPE(None)
#: Qwen2-VL's axial 2-D RoPE: rotate_half over the head, the first half of the planes by the row,
#: the second by the column, each axis with the same frequencies.
AXIAL_VISION = VisionRoPE("axial_vision")
#: MiniMax-M3-VL's: a third of the head each for the frame, the row and the column.
AXIAL_VISION_3D = VisionRoPE("axial_vision", axes=3)
#: Pixtral's: the two axes with frequencies of their own, through the text models' function.
PIXTRAL_VISION = VisionRoPE("axial_vision", text_apply=True)
#: Inkling2's: GPT-J pairs, the first half of the planes turned by the column.
INKLING2_VISION = VisionRoPE("axial_vision", interleaved=True, column_first=True)
#: Step 3.7's: rotate_half, the first half of the planes turned by the column.
STEP3P7_VISION = VisionRoPE("axial_vision", column_first=True)
#: Kimi-K2.5's: rotate_half, the axes alternating plane by plane (column, row, column, ...), each
#: frequency turning a column plane and then a row plane.
KIMI_K25_VISION = VisionRoPE("axial_vision", column_first=True, alternating=True)
#: Llama 4's: a precomputed complex table over (column + 1, row + 1).
LLAMA4_VISION = VisionRoPE("llama4_vision")


class ModelType(NamedTuple):
    """How patch puts torch_rope under one model type."""

    multi_axis: Optional[MultiAxis] = None  # None: 1-D text positions
    vision: Optional[VisionRoPE] = None  # None: no vision tower
    text: Optional[str] = "rotary_module"  # the text family (.families); None: no text RoPE


#: A text model with a rotary module whose layers call ``apply_rotary_pos_emb``.
TEXT = ModelType()
#: Complex-number RoPE (``freqs_cis`` and ``apply_rotary_emb``).
COMPLEX = ModelType(text="complex_form")
#: No rotary module: each attention layer gathers its own sinusoid table (GPT-J, CodeGen).
GPTJ = ModelType(text="gptj")
#: No rotary module: the encoder's sinusoid module and a rotation method per layer.
ROFORMER = ModelType(text="roformer")
#: A vision tower loaded on its own (an image encoder): only its axial RoPE.
VISION_TOWER = ModelType(vision=AXIAL_VISION, text=None)
#: A whole vision-language model whose text tower has no RoPE: only its vision tower's (the same
#: row: the family finds the vision tower in either, and refuses a model with a text RoPE).
VISION_ONLY = VISION_TOWER

REGISTRY = Registry(
    "torch_rope.hf.patch",
    {
        "afmoe": TEXT,
        "apertus": TEXT,
        "arcee": TEXT,
        "aria": TEXT,
        "aria_text": TEXT,
        "axk1": TEXT,
        "axk2": TEXT,  # a DSA indexer in each attention layer, rotate_half beside MLA's pairs
        "bailing_hybrid": TEXT,
        "bamba": TEXT,
        "beam": TEXT,
        "bitnet": TEXT,
        "chameleon": TEXT,
        "codegen": GPTJ,
        "cohere": TEXT,
        "cohere2": TEXT,
        "cohere2_moe": TEXT,
        "cohere_compass": ModelType(INTERLEAVED_AXES, AXIAL_VISION),  # an M-RoPE per layer type
        "cohere_compass_text": ModelType(INTERLEAVED_AXES),  # an M-RoPE per layer type
        "cohere_compass_vision": VISION_TOWER,
        "cosmos3_edge": ModelType(INTERLEAVED_AXES, NO_VISION_ROPE),
        "cosmos3_edge_text": ModelType(INTERLEAVED_AXES),
        "cwm": TEXT,
        "dbrx": TEXT,
        "deepseek_v2": COMPLEX,
        "deepseek_v3": TEXT,
        "deepseek_v32": TEXT,  # the same
        "dia": TEXT,
        "diffllama": TEXT,
        "doge": TEXT,
        "dots1": TEXT,
        "dots3_note_text": TEXT,  # a DSA indexer in each attention layer
        "embedding_gemma2": TEXT,
        "embedding_gemma2_text": TEXT,
        "emu3": ModelType(vision=NO_VISION_ROPE),  # its images: VQ-VAE tokens, no RoPE
        "emu3_text_model": TEXT,
        "ernie4_5": TEXT,
        "ernie4_5_moe": TEXT,
        "esm": TEXT,
        "esmc": TEXT,
        "eurobert": TEXT,
        "exaone4": TEXT,
        "exaone4_5": ModelType(vision=AXIAL_VISION),
        "exaone4_5_vision": VISION_TOWER,
        "exaone_moe": TEXT,
        "falcon": TEXT,
        "falcon_h1": TEXT,
        "flex_olmo": TEXT,
        "flint": TEXT,
        "gemma": TEXT,
        "gemma2": TEXT,
        "gemma3": TEXT,
        "gemma3_text": TEXT,
        "gemma3n_text": TEXT,
        "gemma4": TEXT,
        "gemma4_text": TEXT,
        "gemma4_unified": TEXT,
        "gemma4_unified_text": TEXT,
        "glm": TEXT,
        "glm4": TEXT,
        "glm4_moe": TEXT,
        "glm4_moe_lite": TEXT,
        "glm4v": ModelType(SECTIONS_GPTJ_PAIRS, AXIAL_VISION),
        "glm4v_moe": ModelType(SECTIONS, AXIAL_VISION),
        "glm4v_moe_text": ModelType(SECTIONS),
        "glm4v_moe_vision": VISION_TOWER,
        "glm4v_text": ModelType(SECTIONS_GPTJ_PAIRS),
        "glm4v_vision": VISION_TOWER,
        "glm5_next": VISION_ONLY,  # its attention layers NoPE
        "glm5_next_vision": VISION_TOWER,
        "glm_image": ModelType(SECTIONS, NO_VISION_ROPE),
        "glm_image_text": ModelType(SECTIONS),
        "glm_moe_dsa": TEXT,  # a DSA indexer in each attention layer
        "glm_ocr": ModelType(SECTIONS_GPTJ_PAIRS, AXIAL_VISION),
        "glm_ocr_text": ModelType(SECTIONS_GPTJ_PAIRS),
        "glm_ocr_vision": VISION_TOWER,
        "glmasr": TEXT,  # its audio encoder's rotary module and its text model's
        "glmasr_encoder": TEXT,
        "gpt_neox": TEXT,
        "gpt_neox_japanese": TEXT,
        "gpt_oss": TEXT,
        "gptj": GPTJ,
        "gradium_phonon_tts": TEXT,
        "granite": TEXT,
        "granite4_vision": ModelType(vision=NO_VISION_ROPE),
        "granite_docling": ModelType(vision=NO_VISION_ROPE),
        "granite_docling_text": TEXT,
        "granite_swa": TEXT,  # a rotary module per theta, side by side
        "granitemoe": TEXT,
        "granitemoe_swa": TEXT,
        "granitemoehybrid": TEXT,
        "granitemoeshared": TEXT,
        "gte": TEXT,
        "helium": TEXT,
        "higgs_audio_v2": TEXT,
        "hrm_text": TEXT,
        "hunyuan_v1_dense": TEXT,
        "hunyuan_v1_moe": TEXT,
        "hy_v3": TEXT,
        "hy_v4": TEXT,  # a DSA indexer in each attention layer
        "hyperclovax": TEXT,
        "inkling2": ModelType(vision=INKLING2_VISION, text=None),  # relative logits in its text
        "inkling2_vision": ModelType(vision=INKLING2_VISION, text=None),
        "internlm3": TEXT,
        "iquestcoder": TEXT,
        "jais2": TEXT,
        "jetmoe": TEXT,
        "jina_embeddings_v3": TEXT,
        "kimi_k25": ModelType(vision=KIMI_K25_VISION),  # its text tower DeepSeek-V3's
        "kimi_k25_vision": ModelType(vision=KIMI_K25_VISION, text=None),
        "kolibri1": TEXT,
        "kyutai_speech_to_text": TEXT,
        "laguna": TEXT,
        "lfm2": TEXT,
        "lfm2_moe": TEXT,
        "lfm3": TEXT,
        "lfm3_vl": ModelType(vision=AXIAL_VISION),
        "lfm3_vl_vision": VISION_TOWER,
        "llama": TEXT,
        "llama4": ModelType(vision=LLAMA4_VISION, text="complex_form"),
        "llama4_text": COMPLEX,
        "longcat_flash": TEXT,
        "mellum": TEXT,
        "mimi_decoder": TEXT,
        "mimi_encoder": TEXT,
        "mimo_v2_flash": TEXT,
        "minicpm3": TEXT,
        "minimax": TEXT,
        "minimax_m2": TEXT,
        "minimax_m3_vl": ModelType(vision=AXIAL_VISION_3D),
        "minimax_m3_vl_text": TEXT,
        "ministral": TEXT,
        "ministral3": TEXT,
        "mistral": TEXT,
        "mistral4": TEXT,
        "mixtral": TEXT,
        "mllama": ModelType(vision=NO_VISION_ROPE),  # cross-attends to its vision states
        "mllama_text_model": TEXT,
        "modernbert": TEXT,
        "modernbert-decoder": TEXT,
        "molmo2": ModelType(vision=NO_VISION_ROPE),
        "molmo2_text": TEXT,  # a scaled and an unscaled rotary module, side by side
        "moonshine": TEXT,  # a rotary module per stack
        "moonshine_streaming": TEXT,
        "moshi": TEXT,  # a rotary module in each attention layer
        "muse_glimmer_text": TEXT,
        "muse_glimmer_vision": VISION_TOWER,
        "muse_spark_vision": VISION_TOWER,
        "nanochat": TEXT,  # turns by minus the angle (rotate_half returns (x2, -x1))
        "nemotron": TEXT,
        "nemotron3_5_transcribe_asr_audio": TEXT,
        "nemotron3_5_transcribe_audio": TEXT,  # its ASR and diarization encoders' rotary modules
        "nemotron3_5_transcribe_word_timestamp": TEXT,
        "nemotron3_diarization": TEXT,
        "nemotron3_diarization_audio": TEXT,
        "neomme": ModelType(ALTERNATING_AXES),  # an encoder, a table per layer type
        "nomic_bert": TEXT,
        "olmo": TEXT,
        "olmo2": TEXT,
        "olmo3": TEXT,
        "olmo_hybrid": TEXT,
        "olmoe": TEXT,
        "openai_privacy_filter": TEXT,
        "paddleocr_vl": ModelType(SECTIONS, AXIAL_VISION),
        "pe_audio": TEXT,  # its audio encoder's rotary module and its text tower's (ModernBERT)
        "pe_audio_encoder": TEXT,
        "persimmon": TEXT,
        "phi": TEXT,
        "phi3": TEXT,
        "phi4_multimodal": TEXT,
        "phimoe": TEXT,
        "pixtral": ModelType(vision=PIXTRAL_VISION, text=None),
        "pocket_tts": TEXT,
        "pocket_tts_audio_tokenizer": TEXT,
        "pocket_tts_audio_tokenizer_decoder": TEXT,
        "pocket_tts_audio_tokenizer_encoder": TEXT,
        "qwen2": TEXT,
        "qwen2_5_omni_thinker": ModelType(SECTIONS, AXIAL_VISION),  # an audio encoder, no RoPE
        "qwen2_5_vl": ModelType(SECTIONS, AXIAL_VISION),
        "qwen2_5_vl_text": ModelType(SECTIONS),
        "qwen2_5_vl_vision": VISION_TOWER,
        "qwen2_moe": TEXT,
        "qwen2_vl": ModelType(SECTIONS, AXIAL_VISION),
        "qwen2_vl_text": ModelType(SECTIONS),
        "qwen3": TEXT,
        "qwen3_5": ModelType(INTERLEAVED_AXES, AXIAL_VISION),
        "qwen3_5_moe": ModelType(INTERLEAVED_AXES, AXIAL_VISION),
        "qwen3_5_moe_text": ModelType(INTERLEAVED_AXES),
        "qwen3_5_moe_vision": VISION_TOWER,
        "qwen3_5_text": ModelType(INTERLEAVED_AXES),
        "qwen3_5_vision": VISION_TOWER,
        "qwen3_moe": TEXT,
        "qwen3_next": TEXT,
        "qwen3_vl": ModelType(INTERLEAVED_AXES, AXIAL_VISION),
        "qwen3_vl_moe": ModelType(INTERLEAVED_AXES, AXIAL_VISION),
        "qwen3_vl_moe_text": ModelType(INTERLEAVED_AXES),
        "qwen3_vl_moe_vision": VISION_TOWER,
        "qwen3_vl_text": ModelType(INTERLEAVED_AXES),
        "qwen3_vl_vision": VISION_TOWER,
        "qwen4_exp_vision": VISION_TOWER,
        "recurrent_gemma": TEXT,
        "roformer": ROFORMER,
        "seed_oss": TEXT,
        "smollm3": TEXT,
        "solar_open": TEXT,
        "stablelm": TEXT,
        "starcoder2": TEXT,
        "step3p7": ModelType(vision=STEP3P7_VISION),  # its text tower a table per layer type
        "t5gemma": TEXT,
        "t5gemma2": TEXT,
        "t5gemma2_encoder": TEXT,
        "timesfm2_5": TEXT,
        "ultrabert": TEXT,
        "unlimited_ocr": ModelType(vision=NO_VISION_ROPE),
        "vaultgemma": TEXT,
        "video_llama_3": ModelType(vision=AXIAL_VISION),
        "video_llama_3_vision": VISION_TOWER,
        "voxtral_realtime": TEXT,  # its audio encoder's rotary module and its text model's
        "voxtral_realtime_encoder": TEXT,
        "voxtral_realtime_text": TEXT,
        "youtu": TEXT,
        "zamba2": TEXT,
    },
    REFUSED,
)

#: transformers model types that :func:`torch_rope.hf.patch` knows, each checked against the
#: unpatched model by this project's tests.
SUPPORTED_MODEL_TYPES = REGISTRY.supported
