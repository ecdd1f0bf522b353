# SPDX-License-Identifier: BSD-3-Clause
"""Why :func:`torch_rope.hf.patch` refuses each rotary model type of transformers it does not
support: one reason per type, shared by a family where the cause is the same. docs/hf_models.md
lists them (a test keeps the table and this dict in step), and another test checks that every
rotary type of the installed transformers is either supported or here."""

from typing import Dict

# Why patch refuses each of the other rotary model types: one reason per family.
_NO_ROPE = "its modeling file defines the RoPE helpers, but its attention layers use no RoPE"
_RELATIVE_POSITIONS = (
    "its model has no RoPE: its (Conformer) attention adds relative position embeddings "
    "(Transformer-XL style) to its scores; the RoPE helpers in its modeling file are unused or "
    "another model's"
)

#: The other rotary model types of transformers 5.23 (as the tests'
#: ``hf_models.rotary_model_types()`` and ``rotary_base_model_types()`` find them), each with why
#: :func:`torch_rope.hf.patch` refuses it (it raises NotImplementedError with the reason).
REFUSED: Dict[str, str] = {
    "inkling2_text": "its text model has no rotary embedding; only its vision tower rotates",
    "blt": (
        "not tested: transformers 5.23's own BltForCausalLM cannot generate with a KV cache (it "
        "builds DynamicCache(config=BltConfig), and BltConfig has no num_hidden_layers), so the "
        "tests' generation check against the unpatched model cannot run; its four rotary "
        "modules (local encoder, global transformer, local decoder, entropy patcher) each feed "
        "the layers of their own sub-model, as the stacks patch expects"
    ),
    "deepseek_v4": (
        "its attention layer computes with the sin it is handed (it turns the attention output "
        "back by minus the angle, apply_rotary_pos_emb(out, cos, -sin)) and picks its cos/sin "
        "out of a dict per rope layer type, and its compressor and indexer call rotary modules "
        "of their own on other positions: patch hands a layer positions and tables, not cos/sin"
    ),
    **dict.fromkeys(("jamba", "nemotron_h"), _NO_ROPE),
    "dots3_note": (
        "not tested whole: its text tower is dots3_note_text's (supported: MLA and a DSA indexer "
        "in its layers), but its audio encoder has a rotary module of its own beside it and its "
        "vision tower an axial 2-D RoPE (apply_rotary_pos_emb_vision); the tests build no tiny "
        "model with both images and audio"
    ),
    **dict.fromkeys(
        ("qwen4_exp", "qwen4_exp_text"),
        "its attention layers compute with the cos/sin they are handed: the model hands them "
        "cos/sin over all positions, cached ones included, and each layer slices its tokens' "
        "rows out of them (x[:, -S:, :]), while its QSA indexer gathers rows at the first "
        "position of each key block (index_select) to rotate the pooled block keys one row per "
        "block; patch hands a layer positions and tables, not cos/sin (and its default config "
        "leaves the indexer's sizes unset)",
    ),
    "mimi": (
        "not tested whole: its output is audio decoded from the discrete codes of its quantizer, "
        "which on the tests' tiny random codec do not change with the rotation (the "
        "wrong-layout control moves nothing); its encoder and decoder alone, mimi_encoder and "
        "mimi_decoder, are supported"
    ),
    "zaya": (
        "not tested: its tiny random model's output does not depend on the rotation (the "
        "wrong-pair-layout control moves nothing), so a test could not tell a wrong patch"
    ),
    "gemma3n": (
        "not tested: its vision tower needs the timm library, which the tests do not install "
        "(its text model, gemma3n_text, is supported)"
    ),
    # Types with a rotary base model but no causal-LM class (hf_models.rotary_base_model_types).
    **dict.fromkeys(
        (
            "edgetam_video",
            "sam2_video",
            "sam3",
            "sam3_tracker_video",
            "sam3_vision_model",
            "sam3_vit_model",
        ),
        (
            "not supported: SAM's 2-D RoPE (the rows' planes, then the columns', in GPT-J pairs, "
            "over a window's or the image's patch grid, in its vision encoder or its memory "
            "attention) goes through its own apply_rotary_pos_emb_2d on windowed q/k, which "
            "neither vision family (axial RoPE over packed patches, Llama 4's complex table) "
            "patches; not tested"
        ),
    ),
    **dict.fromkeys(
        ("pe_audio_video", "pe_audio_video_encoder", "pe_video", "pe_video_encoder"),
        "not tested: its video encoder needs the timm library, which the tests do not install",
    ),
    "efficientloftr": (
        "not tested: its default config does not shrink generically (its hidden_size must "
        "equal the last of its stage widths)"
    ),
    "idefics": (
        "not tested: its attention layers hold and call their own rotary modules, and the "
        "self-check's probe fails in them (they read an input the probe leaves None), so patch "
        "refuses it"
    ),
    **dict.fromkeys(
        ("lasr_ctc", "lasr_encoder"),
        (
            "its encoder applies dropout to the cos and sin of its rotary module "
            "(dropout_positions) before handing them to its layers: it computes with cos/sin, "
            "and patch hands the layers positions and tables"
        ),
    ),
    **dict.fromkeys(
        ("neucodec", "xcodec2"),
        (
            "its RoPE turns each head by its head index, not each token by its position "
            "(position_ids of shape (1, num_heads); cos/sin broadcast over the sequence with "
            "unsqueeze_dim=2), which is no rotation of a row by its token's position"
        ),
    ),
    "muse_glimmer_assistant": (
        "its attention (DFlash drafting) computes k and v over the main model's context states "
        "and the diffusion window but q over the window only, and its rotation slices the "
        "cos/sin to q's last positions: q and k of different lengths rotated at different "
        "positions (and its forward needs those context states)"
    ),
    **dict.fromkeys(
        (
            "gemma3n_audio",
            "gemma4_audio",
            "nemotron_asr_streaming",
            "nemotron_asr_streaming_encoder",
            "parakeet_ctc",
            "parakeet_encoder",
            "parakeet_rnnt",
            "parakeet_tdt",
        ),
        _RELATIVE_POSITIONS,
    ),
    **dict.fromkeys(
        ("glm_image_vqmodel", "muse_spark_audio"),
        (
            "its model has no RoPE (no rotary module, no layer that rotates): the RoPE in its "
            "modeling file is the text model's"
        ),
    ),
    "lightglue": (
        "its cos/sin are of a learned linear projection of each keypoint's continuous image "
        "coordinates (Fourier features), computed per call, not rows of a table of integer "
        "positions"
    ),
    # Vision-language text towers whose multi-axis (M-RoPE) rule torch_rope does not express.
    **dict.fromkeys(
        ("hunyuan_vl", "hunyuan_vl_text"),
        (
            "its 4-axis text M-RoPE splits HF's duplicated (cos, cos) row into mrope_section runs "
            "over the whole head, so the two features of one rotate_half pair read different "
            "position axes: not one angle per plane, as torch_rope's rotation is (and its "
            "default config names no sections, which its rotary module needs)"
        ),
    ),
    "ernie4_5_vl_moe": (
        "its text M-RoPE permutes the frequencies (inv_freq pre-rotated, even planes' then odd "
        "planes' over the height/width part) and alternates height and width plane by plane; "
        "neither torch_rope's frequency builder nor its multi-axis rules express that"
    ),
    "muse_spark": (
        "not tested whole: its text tower is muse_spark_text's, refused for its bf16 error on "
        "the tests' tiny model (2x transformers' own); its vision tower rotates too"
    ),
    "qwen3_omni_moe_thinker": (
        "its M-RoPE position ids are floats (get_rope_index turns a video's frames by seconds per "
        "grid times position_id_per_seconds, unrounded, and casts every axis to float), which its "
        "rotary module multiplies by the frequencies: torch_rope's ops take integer positions into "
        "their tables"
    ),
    "deepseek_ocr2": (
        "its vision encoder rotates through the same apply_rotary_pos_emb as its text model, "
        "with a rotary module of its own: two rotary modules, and patch hands positions from "
        "exactly one"
    ),
    "musicflamingo": (
        "besides its language model's RoPE, it rotates its audio encoder's output states (not q "
        "and k) in the model's forward by rotary time embeddings (RoTE: axial over the window "
        "index and the time index within a window, modulated by absolute timestamps in "
        "seconds), which are no rows of a table of integer positions"
    ),
    "mistral_large4": (
        "the self-check refuses it: a patched PixtralAttention (its vision tower's, which rotates "
        "through the same apply_rotary_pos_emb) disagrees with the unpatched one"
    ),
    "mistral_large4_text": (
        "the self-check refuses it: its attention layer uses cos/sin beyond handing them to "
        "apply_rotary_pos_emb (it reads their shape), and patch hands it positions and tables"
    ),
    # Untested-build family: tried with completed tiny configs, each refused for what was found.
    "clvp": (
        "its attention rotates the values as well as q and k, through its own "
        "apply_rotary_pos_emb(q, k, v, cos, sin, position_ids), from a rotary module without a "
        "config that returns one raw frequency table; patch rotates q and k only"
    ),
    "csm": (
        "not tested: its tiny model does not build (a convolution of its audio codec, Mimi, gets "
        "channels not divisible by its groups once shrunk), and besides its backbone's it has "
        "rotary modules in its depth decoder and in that codec"
    ),
    "nemo_speechlm": (
        "not tested: its default config does not shrink generically (its head's audio width must "
        "match its audio tower's), and its audio tower has rotary modules (the ASR encoder's and "
        "the word-timestamp model's) besides its language model's"
    ),
    "evolla": (
        "not tested: transformers 5.23's AutoModel.from_config refuses its config, and its "
        "protein encoder (SaProt) has a rotary module besides its language model's"
    ),
    "glm5_next_text": (
        "its text model has no rotary embedding (its attention layers are NoPE: qk_rope_head_dim "
        "0); only the vision tower of glm5_next rotates"
    ),
    "diffusion_gemma": (
        "its vision tower is Gemma 4's (gemma4_vision), whose 2-D RoPE turns each half of the "
        "head by one axis with rotate_half inside that half, which the vision patch does not "
        "reproduce (see gemma4_vision); the whole model is not tested"
    ),
    # Vision towers on their own (python/torch_rope/hf/families/axial_vision.py) whose vision
    # RoPE is not the axial kind patch knows, or which have none.
    **dict.fromkeys(
        ("cosmos3_edge_vision", "glm_image_vision", "hunyuan_vl_vision"),
        (
            "a vision tower with no RoPE: its patches get learned position embeddings, "
            "interpolated to each image's grid and added to the patch embeddings; the RoPE in its "
            "modeling file is the text tower's"
        ),
    ),
    "granite_docling_vision": (
        "a vision tower with no RoPE: fixed 2-D sinusoidal position embeddings are added to its "
        "patches; the RoPE in its modeling file is the text tower's"
    ),
    "gemma4_vision": (
        "not supported: its vision RoPE turns each half of the head by one axis (row, column) with "
        "rotate_half inside that half (apply_multidimensional_rope, called on q and k apart), "
        "which the vision patch (one apply_qk per block, axis runs over a rotate_half head) does "
        "not reproduce; not tested"
    ),
    **dict.fromkeys(
        ("mlcd", "mlcd_vision_model"),
        (
            "its vision model rotates the class token by learned angles (class_pos_emb, whose "
            "cos/sin the model's forward computes and puts ahead of the patches' 2-D RoPE "
            "cos/sin), which are no row of a position table"
        ),
    ),
    **dict.fromkeys(
        ("dinov3_vit", "sapiens2"),
        (
            "its 2-D RoPE turns by the patches' continuous centre coordinates, normalised to "
            "[-1, 1] for each image's size (and shifted, jittered and rescaled in training), not "
            "by the integer positions a table is indexed with"
        ),
    ),
    "muse_glimmer": (
        "not supported: on the tests' tiny model (its vision tower patched too) its bf16 error "
        "is 1.6x transformers' own (the bar is 1.5x)"
    ),
    **dict.fromkeys(
        ("muse_spark_text",),
        (
            "not supported: on the tests' tiny model its bf16 error is 2x transformers' own (the "
            "bar is 1.5x)"
        ),
    ),
}
