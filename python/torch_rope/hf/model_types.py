# SPDX-License-Identifier: BSD-3-Clause
"""The model types patch knows, by what each needs (replaced by one registry in the next step)."""

from typing import Dict, Tuple

from .families import axial_vision, complex_form, gptj, llama4_vision, roformer

#: Vision-language models: a text tower with multi-axis positions (M-RoPE: ``position_ids`` of
#: shape ``(3, B, S)``, temporal/height/width) and a vision tower with 2-D (row, column) RoPE.
#: Per model type: the text tower's pair layout (torch_rope's ``interleaved``: GLM-4V's text
#: rotates GPT-J pairs, the others ``rotate_half``) and how its planes are dealt to the three axes
#: (``mrope_interleaved``: Qwen3-VL's interleaved rule; the others contiguous runs of
#: ``mrope_section``). The vision towers all rotate ``rotate_half`` over the whole head, the first
#: half of the planes by the row and the second half by the column, each half with its own
#: frequencies ``theta^(-2j/(head_dim/2))``.
VLM_TYPES: Dict[str, Tuple[bool, bool]] = {
    "qwen2_vl": (False, False),
    "qwen2_5_vl": (False, False),
    "qwen3_vl": (False, True),
    "qwen3_vl_moe": (False, True),
    "glm4v": (True, False),
    "glm4v_moe": (False, False),
    "glm_ocr": (True, False),
    "paddleocr_vl": (False, False),
    "cohere_compass": (False, True),  # one M-RoPE table per layer type
    # Whole models whose vision tower has no RoPE (UNROTATED_VISION): only the text is patched.
    "cosmos3_edge": (False, True),
    "glm_image": (False, False),
    # Text towers on their own: multi-axis text positions, no vision tower to patch.
    "qwen2_vl_text": (False, False),
    "qwen2_5_vl_text": (False, False),
    "qwen3_vl_text": (False, True),
    "qwen3_vl_moe_text": (False, True),
    "glm4v_text": (True, False),
    "glm4v_moe_text": (False, False),
    "cosmos3_edge_text": (False, True),
    "glm_image_text": (False, False),
    "glm_ocr_text": (True, False),
    "qwen3_5_text": (False, True),
    "qwen3_5_moe_text": (False, True),
    # Per-layer-type M-RoPE (its sliding layers rotate, its full ones do not), Qwen3-VL's rule.
    "cohere_compass_text": (False, True),
}
#: The types of :data:`VLM_TYPES` that are a text tower alone (a ``*TextModel`` loaded by itself,
#: or a causal LM whose model is one): patch rotates their text with multi-axis positions and has no
#: vision tower to patch.
TEXT_TOWERS = (
    "qwen2_vl_text",
    "qwen2_5_vl_text",
    "qwen3_vl_text",
    "qwen3_vl_moe_text",
    "glm4v_text",
    "glm4v_moe_text",
    "cosmos3_edge_text",
    "glm_image_text",
    "glm_ocr_text",
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "cohere_compass_text",
)

#: Vision-language models whose vision tower has no RoPE (a SigLIP, CLIP or SAM-style tower with
#: learned or no positions): patch puts torch_rope under their text tower only, with multi-axis
#: positions for those in :data:`VLM_TYPES`, as a text model's otherwise.
UNROTATED_VISION = (
    "cosmos3_edge",
    "glm_image",
    "granite_docling",
    "granite4_vision",
    "unlimited_ocr",
)

#: Vision-language models whose text tower rotates with ordinary 1-D positions (patched as a text
#: model is) and whose vision tower has the same axial 2-D RoPE as Qwen2-VL's (patched as the
#: vision towers of :data:`VLM_TYPES` are).
VISION_TOWER_TYPES = ("video_llama_3", "lfm3_vl", "exaone4_5", "minimax_m3_vl")
#: transformers model types that :func:`patch` knows: each was checked against the unpatched model
#: (fp32 logits, greedy generation with a KV cache, bf16 error) by this project's tests. The text
#: models rotate through a module-level ``apply_rotary_pos_emb(q, k, cos, sin)`` (Gemma 4: one
#: tensor a call; DeepSeek-style MLA: ``apply_rotary_pos_emb_interleave``, on each head's rotary
#: slice) called from the attention's forward, with ``rotate_half`` or GPT-J pairs (the
#: self-check finds which); Llama 4's text model and DeepSeek-V2 through complex-number
#: ``apply_rotary_emb(xq, xk, freqs_cis)`` (GPT-J pairs, :mod:`torch_rope._hf_complex`); the
#: vision-language models (:data:`VLM_TYPES`) also rotate their
#: vision tower's q/k, through ``apply_rotary_pos_emb_vision``.
SUPPORTED_MODEL_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "phi3",
    "gpt_neox",
    "gemma",
    "gemma2",
    "gemma3_text",
    "olmo2",
    "granite",
    "granitemoe",
    "starcoder2",
    "olmo",
    "olmo3",
    "smollm3",
    "arcee",
    "exaone4",
    "seed_oss",
    "apertus",
    # Built tiny from their default configs (tests/python/support/hf_models.py, TINY).
    "afmoe",
    "aria_text",
    "axk1",
    "bamba",
    "beam",
    "bitnet",
    "cohere",
    "cohere2",
    "cohere2_moe",
    "cwm",
    "deepseek_v3",
    "diffllama",
    "doge",
    "ernie4_5",
    "ernie4_5_moe",
    "exaone_moe",
    "falcon",
    "falcon_h1",
    "flex_olmo",
    "flint",
    "gemma3",
    "gemma4",
    "gemma4_text",
    "gemma4_unified",
    "gemma4_unified_text",
    "glm",
    "glm4",
    "glm4_moe",
    "glm4_moe_lite",
    "gpt_neox_japanese",
    "gpt_oss",
    "granitemoeshared",
    "helium",
    "hy_v3",
    "hyperclovax",
    "internlm3",
    "iquestcoder",
    "jais2",
    "jetmoe",
    "kolibri1",
    "laguna",
    "lfm2",
    "lfm3",
    "longcat_flash",
    "mellum",
    "minicpm3",
    "minimax",
    "minimax_m2",
    "minimax_m3_vl_text",
    "modernbert-decoder",
    "olmo_hybrid",
    "olmoe",
    "persimmon",
    "phi",
    "phi4_multimodal",
    "phimoe",
    "qwen3_next",
    "solar_open",
    "stablelm",
    "vaultgemma",
    "youtu",
    "bailing_hybrid",
    "dots1",
    "hunyuan_v1_dense",
    "hunyuan_v1_moe",
    "mimo_v2_flash",
    "ministral",
    "ministral3",
    "nemotron",
    "gemma3n_text",
    # Turns by minus the angle (its rotate_half returns (x2, -x1)): the layout check finds it.
    "nanochat",
    # Complex-form RoPE (freqs_cis and apply_rotary_emb): hf/families/complex_form.py.
    *complex_form.MODEL_TYPES,
    # Default configs completed by hand (hf_models._TINY_OVERRIDES).
    "dbrx",
    "granitemoehybrid",
    "hrm_text",
    "lfm2_moe",
    # The text models that emu3's and mllama's causal-LM classes are (hf_models.TEXT).
    "emu3_text_model",
    "mllama_text_model",
    # Base models with no causal-LM class (encoders, embedding models), tested on their last
    # hidden states (tests/python/support/hf_models.py, BASE).
    "aria",
    "chameleon",
    "embedding_gemma2",
    "embedding_gemma2_text",
    "esmc",
    "eurobert",
    "granite_docling_text",
    "gte",
    "higgs_audio_v2",
    "jina_embeddings_v3",
    "mistral4",
    "modernbert",
    "muse_glimmer_text",
    "nomic_bert",
    "openai_privacy_filter",
    "ultrabert",
    # GPT-J family: no rotary module; each attention layer gathers its own sin | cos table and
    # rotates GPT-J pairs (hf/families/gptj.py; tests: hf_models.TINY).
    *gptj.MODEL_TYPES,
    # Untested-build family: built tiny once their default configs were completed
    # (hf_models._TINY_OVERRIDES), patched part by part where they have a rotary module per stack
    # or per layer (_hf_stacks), and tested with the inputs beyond token ids that their forwards
    # read (hf_models.batch_for).
    "esm",
    "t5gemma",
    "t5gemma2",
    "t5gemma2_encoder",
    "pocket_tts",
    "kyutai_speech_to_text",
    "dia",
    "moonshine_streaming",
    "voxtral_realtime_text",
    "recurrent_gemma",
    "zamba2",
    # Vision-language models whose vision tower has no RoPE, tested whole from token ids
    # (hf_models.IMAGE_TEXT; glm_image, with no LM head, in hf_models.BASE).
    "granite_docling",
    "granite4_vision",
    "unlimited_ocr",
    # RoFormer: no rotary module; its encoder's sinusoid module hands rows to a rotation method
    # of each self-attention layer (hf/families/roformer.py; tests: hf_models.TINY).
    *roformer.MODEL_TYPES,
    # Llama 4 (vision-language): the text model as llama4_text, the vision tower's complex 2-D
    # RoPE as GPT-J pairs over two axes (hf/families/llama4_vision.py).
    *llama4_vision.MODEL_TYPES,
    *VLM_TYPES,
    *VISION_TOWER_TYPES,
    # Vision towers loaded on their own: only the vision RoPE
    # (hf/families/axial_vision.py; tests: test_hf_vision_tower.py).
    *axial_vision.MODEL_TYPES,
)
