# SPDX-License-Identifier: BSD-3-Clause
"""Tiny random-weight transformers models for the integration tests, built from configs only.

No download: every model comes from ``AutoModelForCausalLM.from_config`` on a config written
here. The entries cover the rotary variants the patch must handle: Llama in each scaling
variant, Qwen2 (theta 1e6), Qwen3 (q/k norm), Mistral, Phi3 (partial rotary, longrope), GPT-NeoX
(rotary_pct 0.25), Gemma and Gemma3 (sliding and full layers, linear scaling on the full ones),
plus a few more supported types.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

# Small enough to build and generate in well under a second per model, big enough for GQA.
COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=None,
    tie_word_embeddings=False,
)
HEAD_DIM = 16
ORIGINAL = 16  # "pretraining" length of the scaled variants: generation runs past it


def _planes(n, scale):
    return [1.0 + scale * k / n for k in range(n)]


LLAMA_SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    # max_position_embeddings 16: prompt plus generation outgrow it, so the frequencies regrow.
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": ORIGINAL,
    },
    "longrope": {
        "rope_type": "longrope",
        "short_factor": _planes(HEAD_DIM // 2, 0.5),
        "long_factor": _planes(HEAD_DIM // 2, 6.0),
        "original_max_position_embeddings": ORIGINAL,
    },
    "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.5},
}


def config(name):
    """The transformers config of one test model (``'llama'``, ``'llama-yarn'``, ``'phi3'``..., or
    ``'tiny:<model type>'`` for a model type of :data:`TINY`)."""
    import transformers as tf

    if name == "llama" or name.startswith("llama-"):
        variant = name.partition("-")[2] or "default"
        params = LLAMA_SCALINGS[variant]
        kwargs = dict(COMMON, head_dim=HEAD_DIM, rope_theta=500000.0)
        if params is not None:
            kwargs["rope_parameters"] = dict(params, rope_theta=500000.0)
        if variant == "dynamic":
            kwargs["max_position_embeddings"] = ORIGINAL
        return tf.LlamaConfig(**kwargs)
    if name == "qwen2":
        return tf.Qwen2Config(**COMMON, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    if name == "qwen3":
        return tf.Qwen3Config(
            **COMMON, head_dim=HEAD_DIM, rope_parameters={"rope_type": "default", "rope_theta": 1e6}
        )
    if name == "mistral":
        return tf.MistralConfig(**COMMON, head_dim=HEAD_DIM, sliding_window=8)
    if name == "mixtral":
        return tf.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2)
    if name == "phi3":
        rotary = int(HEAD_DIM * 0.5)
        return tf.Phi3Config(
            **dict(COMMON, num_key_value_heads=4),
            partial_rotary_factor=0.5,
            original_max_position_embeddings=ORIGINAL,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": _planes(rotary // 2, 0.3),
                "long_factor": _planes(rotary // 2, 4.0),
            },
        )
    if name == "gpt_neox":
        kwargs = {k: v for k, v in COMMON.items() if k != "num_key_value_heads"}
        return tf.GPTNeoXConfig(**kwargs, rotary_pct=0.25, use_parallel_residual=True)
    if name == "gemma":
        return tf.GemmaConfig(**COMMON, head_dim=HEAD_DIM)
    if name == "gemma2":
        return tf.Gemma2Config(
            **COMMON, head_dim=HEAD_DIM, sliding_window=8, query_pre_attn_scalar=HEAD_DIM
        )
    if name == "gemma3":
        return tf.Gemma3TextConfig(
            **COMMON,
            head_dim=HEAD_DIM,
            sliding_window=4,
            query_pre_attn_scalar=HEAD_DIM,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            },
        )
    if name == "qwen2_moe":
        return tf.Qwen2MoeConfig(
            **COMMON,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        )
    if name == "qwen3_moe":
        return tf.Qwen3MoeConfig(
            **COMMON,
            head_dim=HEAD_DIM,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
        )
    if name == "olmo2":
        return tf.Olmo2Config(**COMMON)
    if name == "granite":
        return tf.GraniteConfig(**COMMON)
    if name == "starcoder2":
        return tf.Starcoder2Config(**COMMON, sliding_window=8)
    if name in GENERIC:
        return tf.AutoConfig.for_model(name, **COMMON)
    if name == "roformer-rotary_value":  # RoFormer rotating v as well as q and k
        return tiny_config("roformer", rotary_value=True)
    if name.startswith("tiny:"):  # a model type of TINY (gemma3 is also a hand-built name)
        return tiny_config(name[len("tiny:") :])
    if name.startswith("base:"):  # a model type of BASE
        return tiny_config(name[len("base:") :])
    if name.startswith("image_text:"):  # a model type of IMAGE_TEXT
        return tiny_config(name[len("image_text:") :])
    if name.startswith("vlm_text:"):  # the text tower of a VLM type, on its own
        return vlm_config(name[len("vlm_text:") :]).text_config
    if name.startswith("text:"):  # a model type of TEXT (its causal LM: the text model's type)
        return tiny_config(name[len("text:") :])
    raise KeyError(name)


#: Llama-like model types whose default config needs nothing beyond COMMON.
GENERIC = ("olmo", "olmo3", "smollm3", "arcee", "exaone4", "granitemoe", "seed_oss", "apertus")

#: Model types built by :func:`tiny_config` from transformers' default config, shrunk.
TINY = (
    "afmoe",
    "aria_text",
    "axk1",
    "bailing_hybrid",
    "bamba",
    "beam",
    "bitnet",
    "cohere",
    "cohere2",
    "cohere2_moe",
    "cohere_compass_text",
    "cwm",
    "dbrx",
    "deepseek_v3",
    "diffllama",
    "doge",
    "dots1",
    "ernie4_5",
    "ernie4_5_moe",
    "exaone_moe",
    "falcon",
    "falcon_h1",
    "flex_olmo",
    "flint",
    "gemma3",
    "gemma3n_text",
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
    "granitemoehybrid",
    "granitemoeshared",
    # A rotary module per RoPE theta, side by side, the model handing each layer its theta's.
    "granite_swa",
    "granitemoe_swa",
    "helium",
    "hrm_text",
    "hunyuan_v1_dense",
    "hunyuan_v1_moe",
    "hy_v3",
    "hyperclovax",
    "internlm3",
    "iquestcoder",
    "jais2",
    "jetmoe",
    "kolibri1",
    "laguna",
    "lfm2",
    "lfm2_moe",
    "lfm3",
    "longcat_flash",
    "mellum",
    "mimo_v2_flash",
    "minicpm3",
    "minimax",
    "minimax_m2",
    "minimax_m3_vl_text",
    "ministral",
    "ministral3",
    "modernbert-decoder",
    # A rotary module inside each attention layer (MoshiForCausalLM, its text decoder alone).
    "moshi",
    "nanochat",
    "nemotron",
    "olmo_hybrid",
    "olmoe",
    "persimmon",
    "phi",
    "phi4_multimodal",
    "phimoe",
    "qwen3_5_moe_text",
    "qwen3_5_text",
    "qwen3_next",
    "solar_open",
    "stablelm",
    "vaultgemma",
    "youtu",
    # GPT-J family: each attention layer's own sin | cos table, GPT-J pairs over rotary_dim.
    "gptj",
    "codegen",
    # Complex-form RoPE (freqs_cis and apply_rotary_emb): Llama 4's text model (with a NoPE layer,
    # the tiny config keeps one of each) and DeepSeek-V2 (MLA's rotary slice).
    "deepseek_v2",
    "llama4_text",
    # Untested-build family: default configs completed in _TINY_OVERRIDES.
    "recurrent_gemma",
    "zamba2",
    # RoFormer: its encoder's sinusoid rows rotate q/k in a method of each self-attention layer
    # (a decoder, so that its causal LM caches; also "roformer-rotary_value", v rotated too).
    "roformer",
    # DeepSeek Sparse Attention: a DSA indexer inside each (indexed) attention layer rotates its
    # own q/k with the layer's cos/sin, in the MLA's pair layout (GLM-MoE-DSA, dots.3-note) or
    # another (DeepSeek-V3.2, A.X K2: rotate_half beside the MLA's GPT-J pairs; HY V4: both
    # rotate_half).
    "axk2",
    "deepseek_v32",
    "dots3_note_text",
    "glm_moe_dsa",
    "hy_v4",
)


#: Model types whose forward takes more than tokens, or none (audio encoders, neural audio codecs
#: and their halves, a time-series model, speech-to-text models), built as ``'base:<model type>'``
#: and run from two rows of random inputs (:func:`batch_for`) of the kind named here: log-mel
#: features ``(B, mel bins, frames)`` (``mel_frames``: ``(B, 256 frames, mel bins)``), audio samples
#: ``(B, 1, samples)`` (1.6 s at 24 kHz: 20 codec frames), a codec's latents ``(B, hidden, 16
#: frames)``, an ASR encoder's states ``(B, 16 frames, hidden)`` (``encoder_states``: what
#: Nemotron 3.5 Transcribe's word-timestamp encoder reads), a series of 128 steps, or tokens with
#: the features their audio encoder reads (the second row left-padded; PE Audio: tokens and audio
#: samples, one for each of its two towers).
FEATURES = {
    "glmasr_encoder": "mel",
    "voxtral_realtime_encoder": "mel",
    "nemotron3_5_transcribe_asr_audio": "mel_frames",
    "nemotron3_diarization_audio": "mel_frames",
    "nemotron3_diarization": "mel_frames",
    "nemotron3_5_transcribe_audio": "mel_frames",
    "nemotron3_5_transcribe_word_timestamp": "encoder_states",
    "pe_audio_encoder": "samples",
    "mimi_encoder": "samples",
    "mimi_decoder": "latents",
    "pocket_tts_audio_tokenizer": "samples",
    "pocket_tts_audio_tokenizer_encoder": "samples",
    "pocket_tts_audio_tokenizer_decoder": "latents",
    "timesfm2_5": "series",
    # Speech-to-text models whose text model reads an audio encoder's states: GLM-ASR's in place
    # of AUDIO placeholder tokens (8 per row: 64 mel frames, halved, merged by 4), Voxtral
    # Realtime's added to its tokens' embeddings (8 mel frames a token after the halving and the
    # downsampling by 4).
    "glmasr": "speech_tokens",
    "voxtral_realtime": "speech_stream",
    # PE Audio: a contrastive pair of towers, its text tower (ModernBERT) reading the tokens and
    # its audio encoder the samples; the tests compare both towers' last hidden states.
    "pe_audio": "text_samples",
}
AUDIO = 250  # GLM-ASR's placeholder token


#: Rotary model types with no causal-LM class (encoders, embedding models, backbones), built tiny
#: like :data:`TINY` as transformers' ``AutoModel`` (``'base:<model type>'``): the tests compare
#: their last hidden states. Only types whose every RoPE is the text one: a vision-language base
#: model whose vision tower rotates too (2-D RoPE) is not here.
BASE = (
    "aria",
    "chameleon",
    "cosmos3_edge_text",
    "embedding_gemma2",
    "embedding_gemma2_text",
    "esmc",
    "eurobert",
    "glm_image",  # a vision-language model with no LM head (and no RoPE in its vision tower)
    "glm_image_text",
    "glm_ocr_text",
    "granite_docling_text",
    "gte",
    "higgs_audio_v2",
    "jina_embeddings_v3",
    "mistral4",
    "modernbert",
    # A scaled and an unscaled rotary module side by side, the first layer on the unscaled one.
    "molmo2_text",
    "muse_glimmer_text",
    "nomic_bert",
    "openai_privacy_filter",
    "ultrabert",
    # Untested-build family: ESM's rotary variant; the encoder-decoders, whose base model's last
    # hidden states are its decoder's (test_hf.logits feeds the decoder the same tokens).
    "esm",
    "t5gemma",
    "t5gemma2",
    "t5gemma2_encoder",
    # Text-to-speech backbones, run from text tokens alone (no voice prompt, no audio latents).
    "pocket_tts",
    "gradium_phonon_tts",
    # Speech-to-text from text and audio-code frames (FRAMES); a rotary module in each attention
    # layer.
    "kyutai_speech_to_text",
    # Text-to-speech encoder-decoder: text into its encoder, audio-code frames into its decoder
    # (DECODER_FRAMES).
    "dia",
    # Speech-to-text encoder-decoder: audio into its encoder (AUDIO_ENCODER), tokens into its
    # decoder, the one stack that rotates.
    "moonshine_streaming",
    # The same, both stacks rotating (a rotary module each, GPT-J pairs over 0.9 of the head).
    "moonshine",
    # The text decoder of Voxtral Realtime, with a random time conditioning (TIME_CONDITIONED),
    # built from its unexported class (UNEXPORTED).
    "voxtral_realtime_text",
    # Audio encoders, audio codecs and a time-series model, run from the inputs FEATURES makes.
    *FEATURES,
    # A bidirectional encoder whose two M-RoPE axes alternate plane by plane, with a table per
    # layer type (one of them partial); its zero-initialised output projections redrawn
    # (ZERO_INITIALISED), else its attention would add nothing.
    "neomme",
)

#: Types whose fresh model zero-initialises the projections that write attention (and MLP)
#: outputs into the residual stream, so that no output depends on RoPE: :func:`build` redraws
#: those weights (the names' last parts), normal with std 0.2.
ZERO_INITIALISED = {"neomme": ("o_proj", "down_proj")}


#: Vision-language model types whose vision tower has no RoPE, built tiny like :data:`TINY` as
#: transformers' ``AutoModelForImageTextToText`` (``'image_text:<model type>'``) and run from token
#: ids: patch rotates only their text tower, which an image would not reach differently.
IMAGE_TEXT = (
    "cosmos3_edge",
    "granite4_vision",
    "granite_docling",
    "unlimited_ocr",
    # Emu3's images are VQ-VAE tokens in the text stream; Mllama's text model reads its vision
    # model's states through cross-attention layers, which do not rotate.
    "emu3",
    "mllama",
    # Molmo 2's vision transformer has learned position embeddings; its text model is molmo2_text.
    "molmo2",
)


#: Model types whose causal-LM class is their text model, of another model type
#: (``Emu3ForCausalLM``: ``emu3_text_model``), built tiny like :data:`TINY` as
#: ``'text:<model type>'``; patch and the tests see the text model's type.
TEXT = ("emu3", "mllama")


def build(name, seed=0):
    """A fresh random-weight model in eval mode (fp32, eager attention: deterministic on CPU);
    ``'base:<model type>'`` builds transformers' ``AutoModel`` (no LM head),
    ``'image_text:<model type>'`` its ``AutoModelForImageTextToText``, the others a causal LM."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForImageTextToText

    torch.manual_seed(seed)
    if name.partition(":")[2] in UNEXPORTED:
        model_config = config(name)
        model = _unexported_base_class(model_config)._from_config(
            model_config, attn_implementation="eager", dtype=torch.float32
        )
        return model.eval()
    auto = AutoModel if name.startswith(("base:", "vlm_text:")) else AutoModelForCausalLM
    if name.startswith("image_text:"):
        auto = AutoModelForImageTextToText
    model = auto.from_config(config(name), attn_implementation="eager", dtype=torch.float32)
    redrawn = ZERO_INITIALISED.get(name.partition(":")[2], ())
    with torch.no_grad():
        for weight_name, weight in model.named_parameters():
            parts = weight_name.split(".")
            if len(parts) > 1 and parts[-2] in redrawn:
                weight.normal_(0.0, 0.2)
    return model.eval()


#: (name, seed) -> (the model :func:`build` gave :func:`built`, the RNG state that build left).
_BUILT = {}


def built(name, seed=0):
    """:func:`build`'s model, built once per process: a deep copy of it (about a fifth of a
    build's time), with torch's RNG left as that build left it, so that the caller sees what a
    build of its own would give. Only for tests that build a model as it comes: a model built
    under a test's own patches (of a class's ``__init__``, say) needs :func:`build`."""
    import copy

    key = (name, seed)
    if key not in _BUILT:
        model = build(name, seed)
        _BUILT[key] = (model, torch.get_rng_state())
    model, rng_state = _BUILT[key]
    torch.set_rng_state(rng_state)
    return copy.deepcopy(model)


#: Base-model types whose class transformers' auto mapping names but the package does not export
#: (``AutoModel`` cannot find it): built from the class in the type's modeling module.
UNEXPORTED = ("voxtral_realtime_text",)


def _unexported_base_class(model_config):
    """The base-model class the auto mapping names for ``model_config``'s type, from the modeling
    module beside its configuration module."""
    import importlib

    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    module = type(model_config).__module__.replace(".configuration_", ".modeling_")
    return getattr(importlib.import_module(module), MODEL_MAPPING_NAMES[model_config.model_type])


# ---- any model type, shrunk from its default config ------------------------------------------

# How many experts each token is routed to: at most 2, and never more than the config had (some
# models allow only their own top-k).
_TOP_K = (
    "num_experts_per_tok",
    "num_experts_per_token",
    "moe_top_k",
    "moe_topk",
    "top_k",
    "moe_k",
)

# The size fields of transformers' configs, under the names they use, and the tiny value each
# gets: the same model as COMMON (hidden 64, 4 heads of 16, 2 kv heads, 2 layers, vocab 256).
_TINY = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "embed_dim"), 64),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "n_layers", "num_layers"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "kv_n_heads", "n_kv_heads"), 2),
    **dict.fromkeys(("head_dim", "attention_head_dim", "qk_head_dim"), HEAD_DIM),
    **dict.fromkeys(("vocab_size",), 256),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"), 64),
    # Shorter than the test prompt plus its generation, so the window really slides.
    **dict.fromkeys(("sliding_window", "attention_window", "sliding_window_size"), 8),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(_TOP_K, 2),
    **dict.fromkeys(
        (
            "n_group",
            "num_expert_group",
            "topk_group",
            "n_shared_experts",
            "num_shared_experts",
            "first_k_dense_replace",
        ),
        1,
    ),
    **dict.fromkeys(("zero_expert_num",), 2),  # LongCat-Flash's identity experts
    # GPT-J style: rotary over half the head.
    **dict.fromkeys(("rotary_dim", "rotary_emb_dim"), HEAD_DIM // 2),
    # MLA: q/kv compressed to 32, each head 8 nope + 8 rope features, values 16.
    **dict.fromkeys(("q_lora_rank", "kv_lora_rank"), 32),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim"), HEAD_DIM // 2),
    **dict.fromkeys(("v_head_dim",), HEAD_DIM),
    # SSM layers of the hybrid models.
    **dict.fromkeys(("mamba_d_state", "ssm_state_size", "mamba_dt_rank", "time_step_rank"), 8),
    # mamba_n_heads * mamba_d_head = mamba_expand (2) * hidden_size, as the configs require.
    **dict.fromkeys(("mamba_n_heads",), 8),
    **dict.fromkeys(("mamba_n_groups", "n_groups"), 2),
    **dict.fromkeys(("mamba_d_head", "mamba_head_dim"), 16),
    **dict.fromkeys(("mamba_d_ssm",), 128),
    **dict.fromkeys(("linear_num_key_heads", "linear_num_value_heads"), 2),
    **dict.fromkeys(("linear_key_head_dim", "linear_value_head_dim"), 16),
}
_SPECIAL_TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=None)


# Size fields that some default configs leave None although their modeling code reads them as
# sizes (``config.head_dim ** -0.5``, ``range(config.n_routed_experts)``): given the tiny value
# they stand for (head_dim: hidden over heads; num_key_value_heads: one kv head per head, as the
# configs that derive it make it; the expert counts: the tiny MoE's; ESM's vocab_size, which its
# tokenizer sets).
_NONE_SIZES = dict(
    vocab_size=COMMON["vocab_size"],
    head_dim=HEAD_DIM,
    num_key_value_heads=COMMON["num_attention_heads"],
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
)


def _tiny_value(key, value):
    """The tiny value of one config field, or ``value`` when it is not a size."""
    if value is None:
        return _NONE_SIZES.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        return value
    if key in _TOP_K:
        return min(value, _TINY[key])
    if key in _TINY:
        return _TINY[key]
    if key.startswith("vocab_size"):
        return 256
    if "intermediate_size" in key or "ffn_hidden_size" in key or key in ("n_inner", "ffn_dim"):
        # Expert MLPs smaller than the dense one, as in the real MoE checkpoints.
        return 32 if ("moe" in key or "expert" in key) else 128
    return value


def _layer_picks(fields, n_layers):
    """Two layers to keep of ``n_layers``: the first, and the first that differs from it in some
    per-layer list (a full layer after a sliding one, a NoPE layer after a RoPE one), so that the
    tiny model still has both kinds."""
    per_layer = [v for v in fields.values() if isinstance(v, list) and len(v) == n_layers]
    if len(set(map(str, fields.get("layer_types") or []))) > 1:
        per_layer = [fields["layer_types"]]  # the attention kinds matter more than the MLP kinds
    for j in range(1, n_layers):
        if any(v[j] != v[0] for v in per_layer):
            return [0, j]
    return [0, 1]


def _layer_overrides(overrides, fields):
    """One layer's ``per_layer_config`` overrides made tiny as :func:`_shrink` makes the global
    fields, except a head width that differs from the global one: it keeps its ratio to it (Gemma
    4's full layers have heads twice as wide as its sliding ones), so the tiny config stays
    heterogeneous, as the real one is, rather than shrinking both widths to the same value."""
    tiny = _shrink(overrides)
    for key, value in overrides.items():
        base = fields.get(key)
        if (
            key in ("head_dim", "attention_head_dim")
            and isinstance(value, int)
            and isinstance(base, int)
            and value != base
            and base > 0
            and value % base == 0
        ):
            tiny[key] = _tiny_value(key, base) * (value // base)
    return tiny


def _shrink(fields):
    """A config's to_dict() made tiny: sizes replaced, per-layer lists cut to the two layers
    :func:`_layer_picks` keeps, nested config dicts (but not rope_parameters) shrunk alike."""
    n_layers = next(
        (fields[k] for k in ("num_hidden_layers", "n_layer", "n_layers") if k in fields), None
    )
    picks = _layer_picks(fields, n_layers) if isinstance(n_layers, int) and n_layers > 2 else None
    tiny = {}
    for key, value in fields.items():
        if picks and isinstance(value, list) and len(value) == n_layers:
            value = [value[i] for i in picks]
        elif isinstance(value, dict) and "model_type" in value:
            value = _shrink(value)
        elif key == "per_layer_config" and picks:
            # Gemma 4's overrides keyed by layer index ("05"): those of the kept layers, renumbered.
            kept = {int(i): v for i, v in value.items() if int(i) in picks}
            value = {f"{picks.index(i):02d}": _layer_overrides(v, fields) for i, v in kept.items()}
        if isinstance(value, list) and all(isinstance(v, int) for v in value):
            # A size per layer (Gemma 3n's intermediate_size): each made tiny.
            tiny[key] = [_tiny_value(key, v) for v in value]
        else:
            tiny[key] = _tiny_value(key, value)
    tiny.update((k, v) for k, v in _SPECIAL_TOKENS.items() if k in fields)  # within the vocab
    factors = [fields.get("partial_rotary_factor")]
    factors += [
        p.get("partial_rotary_factor")
        for p in (fields.get("rope_parameters") or {}).values()
        if isinstance(p, dict)
    ]
    for factor in {f for f in factors if isinstance(f, float)}:
        # A rotary width int(head_dim * factor) that is odd on the tiny head (MiMo's 0.334 of 16)
        # has no pairs to rotate: widen the head, by 8 at a time, until it is even, as the real
        # head's is.
        while isinstance(tiny.get("head_dim"), int) and int(tiny["head_dim"] * factor) % 2:
            tiny["head_dim"] += 8
    if isinstance(fields.get("num_kv_shared_layers"), int) and picks:
        # The last layers that reuse earlier layers' KV caches (Gemma 3n): the same share of the
        # tiny model's layers, rounded down (of two layers, none: one kind each, nothing to share).
        tiny["num_kv_shared_layers"] = fields["num_kv_shared_layers"] * len(picks) // n_layers
    rope = tiny.get("rope_parameters")
    if isinstance(rope, dict) and isinstance(rope.get("mrope_section"), list):
        # M-RoPE: the sections deal the rotary planes to the position axes; scaled down to the
        # tiny head's planes (largest remainders, so that they still cover every plane).
        section = rope["mrope_section"]
        factor = rope.get("partial_rotary_factor", 1.0)
        while isinstance(tiny.get("head_dim"), int) and int(tiny["head_dim"] * factor) // 2 < len(
            section
        ):
            tiny["head_dim"] += 8  # at least one plane per axis (Qwen3.5: a quarter of the head)
        head = tiny.get("head_dim") or tiny["hidden_size"] // tiny["num_attention_heads"]
        planes = int(head * factor) // 2
        exact = [s * planes / sum(section) for s in section]
        scaled = [int(x) for x in exact]
        by_remainder = sorted(range(len(exact)), key=lambda i: scaled[i] - exact[i])
        for i in by_remainder[: planes - sum(scaled)]:
            scaled[i] += 1
        tiny["rope_parameters"] = dict(rope, mrope_section=scaled)
    if "qk_rope_head_dim" in tiny:
        # MLA: the config names its rotary slice head_dim too (the rotary module reads that), and
        # every head has its own keys (no GQA grouping of the expanded latent).
        if fields.get("head_dim") == fields["qk_rope_head_dim"]:
            tiny["head_dim"] = tiny["qk_rope_head_dim"]
        if fields.get("num_key_value_heads") == fields.get("num_attention_heads"):
            tiny["num_key_value_heads"] = tiny["num_attention_heads"]
    return tiny


_MOLMO2_TEXT = dict(
    rope_parameters=dict(rope_type="linear", factor=4.0, rope_theta=1e4),
    rope_scaling_layers=[1],
    initializer_range=0.2,
)

_RANGE = dict(initializer_range=0.2)
# DSA indexers (DeepSeek-V3.2's kind): 4 heads of 16 (the first 8 features rotated), keeping the 4
# best-scored keys of each query, fewer than the test prompt has: the indexer's choice, and so its
# rotation, moves the logits.
_DSA = dict(index_n_heads=4, index_head_dim=HEAD_DIM, index_topk=4)
_CODEC = dict(_RANGE, upsample_groups=64)
# Nemotron's audio encoders: one kv head per head (their v projection has a head per query head).
_NEMOTRON_ENCODER = dict(_RANGE, num_key_value_heads=4)
_NEMOTRON_DIARIZATION = dict(head_config=dict(audio_hidden_size=64), audio_config=_NEMOTRON_ENCODER)

# The few types the generic shrink does not make testable. Bamba says where its attention layer
# is by index (two layers: one SSM, one attention). In the others the tiny random model's logits
# hardly depend on RoPE with the default initializer_range (0.02: q and k so small that attention
# is nearly uniform), so the wrong-layout control could not tell; 0.2 makes RoPE count, as for
# the vision-language models below.
_TINY_OVERRIDES = {
    "bamba": dict(attn_layer_indices=[1]),
    # Two RoPE thetas, one per layer: two rotary modules in use (besides the unused global one).
    "granite_swa": dict(layer_rope_theta=[1e4, 1e6]),
    "granitemoe_swa": dict(layer_rope_theta=[1e4, 1e6]),
    # Linear scaling in the second layer only (rope_scaling_layers): the first layer's rotary module
    # is the unscaled one, at the same theta.
    "molmo2_text": _MOLMO2_TEXT,
    "molmo2": dict(text_config=_MOLMO2_TEXT, adapter_config=dict(vision_feature_layer=[-1, -2])),
    # Default configs that do not build a model: the fields they leave unset, given.
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=1),
    "dbrx": dict(attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0)),
    "chameleon": dict(vocabulary_map={"<image>": 255}),
    # Its VQ-VAE image tokenizer (no RoPE) shrunk too: the default one has 246M parameters.
    "emu3": dict(
        vocabulary_map={"<image>": 255, "<|extra_200|>": 254},
        vq_config=dict(
            base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1, codebook_size=256
        ),
    ),
    # Its default is all Mamba layers and no RoPE: a Mamba layer, then a RoPE attention layer.
    "granitemoehybrid": dict(
        position_embedding_type="rope", layer_types=["linear_attention", "full_attention"]
    ),
    # Vision-language composites whose default configs leave a field their model needs unset, or
    # whose text attention does not group kv heads (its default has one kv head per head).
    "unlimited_ocr": dict(text_config=dict(num_key_value_heads=4)),
    "granite_docling": dict(text_config=dict(initializer_range=0.2)),  # as granite_docling_text
    "granite4_vision": dict(
        downsample_rate="2/4", deepstack_layer_map=[[-1, 0]], spatial_target_layers=[0, 1, 0, 1]
    ),
    # Its default config names no RoPE at all (its model reads one rope_parameters entry per
    # layer type): M-RoPE in the sliding layers (sections over the tiny head's 8 planes, as GLM-4V's
    # tiny text tower), none in the full ones, as Cohere 2 rotates; a sliding layer, a full one.
    "cohere_compass_text": dict(
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters=dict(
            sliding_attention=dict(rope_type="default", rope_theta=5e4, mrope_section=[2, 3, 3]),
            full_attention=None,
        ),
        initializer_range=0.2,
    ),
    # One layer a stack, each stack run once per cycle: two layers in all.
    "hrm_text": dict(
        num_layers_per_stack=1, H_cycles=1, L_cycles=1, num_hidden_layers=2, initializer_range=0.2
    ),
    # Untested-build family: default configs that leave a field unset or derive sizes the
    # generic shrink cannot (below, each with why).
    # ESM's default is absolute positions; its rotary variant is the one with RoPE.
    "esm": dict(position_embedding_type="rotary"),
    # Its block pattern (recurrent, recurrent, attention) repeats from layer 0, and each attention
    # layer holds a rotary module of its own: four layers, recurrent and attention twice, so that
    # two attention layers each rotate with their own (its recurrence as wide as the tiny model).
    "recurrent_gemma": dict(
        block_types=["recurrent", "attention"], num_hidden_layers=4, lru_width=64
    ),
    # RoPE in its shared attention block is off by default (use_mem_rope); its derived sizes
    # (from hidden 64, 4 heads, 8 Mamba heads) are stored in the config and kept as given, so
    # they are given here; its second tiny layer is the hybrid one.
    "zamba2": dict(
        use_mem_rope=True,
        attention_hidden_size=128,
        attention_head_dim=32,
        mamba_headdim=16,
        kv_channels=16,
        num_query_groups=4,
        hybrid_layer_ids=[1],
        initializer_range=0.2,  # (as below: RoPE must move the tiny model's output)
    ),
    # Step 3.7's text tower (a text model type of its own, but no AutoModel class): its default
    # is all full layers, but its model always builds a sliding-window mask too. A sliding layer
    # and a full one, each with its RoPE (as Gemma 3), the full one rotating half the head (its
    # modeling code's GLM-style partial rotary).
    "step3p5": dict(
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters=dict(
            sliding_attention=dict(rope_type="default", rope_theta=1e4),
            full_attention=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=0.5),
        ),
    ),
    # Its attention layers are NoPE (its config checks that they have no rotary slice).
    "glm5_next_text": dict(qk_rope_head_dim=0),
    # Its encoder's text config reads the dropout rate that only the encoder-decoder's config
    # sets.
    "t5gemma2_encoder": dict(text_config=dict(dropout_rate=0.0)),
    # Its attention views q with the kv-head count: no grouped-query attention.
    "moonshine_streaming": dict(num_key_value_heads=4),
    **dict.fromkeys(("axk2", "deepseek_v32", "glm_moe_dsa"), _DSA),
    # Its tiny random model's logits hardly depend on RoPE at the default initializer_range.
    "hy_v4": dict(_DSA, **_RANGE),
    # Its config requires one kv head per head (its MLA expands the latent for every head), in
    # its indexed layers and in its sliding ones (the second tiny layer, per_layer_config's).
    "dots3_note_text": dict(
        _DSA,
        num_key_value_heads=4,
        per_layer_config={
            "01": dict(
                num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=8
            )
        },
    ),
    # The same (per stack), and its stacks' sizes under names of their own: 2 layers of 4 heads of
    # 16 (of 8 heads, its partial rotary factor 0.9 would leave 7 features, an odd width).
    "moonshine": dict(
        **dict.fromkeys(("encoder_num_hidden_layers", "decoder_num_hidden_layers"), 2),
        **dict.fromkeys(
            (
                "encoder_num_attention_heads",
                "decoder_num_attention_heads",
                "encoder_num_key_value_heads",
                "decoder_num_key_value_heads",
            ),
            4,
        ),
    ),
    # Two audio codebooks of 16 tokens each (after the text vocabulary), and the padding token
    # the embedding table ends with (vocab + codebooks * 16).
    "kyutai_speech_to_text": dict(
        num_codebooks=2, codebook_vocab_size=16, audio_bos_token_id=15, audio_pad_token_id=288
    ),
    # The codecs (and their encoders and decoders alone): their upsampling is a depthwise
    # transposed convolution (as many groups as channels: the tiny hidden size); with the default
    # initializer_range their RoPE hardly moves the tiny codec's output. Pocket TTS's transformers
    # run at 200 frames a second: 320 positions in the test's 1.6 s.
    **dict.fromkeys(("mimi_encoder", "mimi_decoder"), _CODEC),
    # Its DAC audio embedder's convolutions narrower (24M parameters at the default widths).
    "pe_audio_encoder": dict(dac_config=dict(encoder_hidden_size=8, decoder_hidden_size=64)),
    # The same audio encoder, beside its text tower (as modernbert, below).
    "pe_audio": dict(
        audio_config=dict(dac_config=dict(encoder_hidden_size=8, decoder_hidden_size=64)),
        text_config=dict(initializer_range=0.2),
    ),
    # Nemotron's audio encoders: one kv head per head, as their default configs have.
    **dict.fromkeys(
        ("nemotron3_5_transcribe_asr_audio", "nemotron3_diarization_audio"), _NEMOTRON_ENCODER
    ),
    # The diarization model around that encoder: its head reads the tiny encoder's width.
    "nemotron3_diarization": _NEMOTRON_DIARIZATION,
    # Nemotron 3.5 Transcribe's audio model: the ASR encoder and the diarization model above, side
    # by side on the same features, the diarization model initialised as the encoders are (at its
    # default initializer_range its speaker logits, which the tests compare beside the states, are
    # a thousandth of them).
    "nemotron3_5_transcribe_audio": dict(
        asr_config=_NEMOTRON_ENCODER, diarization_config=dict(_NEMOTRON_DIARIZATION, **_RANGE)
    ),
    # Its word-timestamp encoder (the ASR encoder's layers): its blank is the last of the tiny
    # vocabulary's classes.
    "nemotron3_5_transcribe_word_timestamp": dict(_NEMOTRON_ENCODER, blank_token_id=255),
    **dict.fromkeys(
        (
            "pocket_tts_audio_tokenizer",
            "pocket_tts_audio_tokenizer_encoder",
            "pocket_tts_audio_tokenizer_decoder",
        ),
        dict(_CODEC, max_position_embeddings=512),
    ),
    # Its decoder's cross-attention reads the encoder's states (as wide as the tiny encoder); two
    # audio channels, each delayed by its own step.
    "dia": dict(
        decoder_config=dict(
            cross_hidden_size=64,
            cross_num_attention_heads=4,
            cross_num_key_value_heads=2,
            cross_head_dim=16,
            num_channels=2,
        ),
        delay_pattern=[0, 1],
    ),
    # The flow head is conditioned on the backbone's hidden states: as wide as the tiny backbone.
    "pocket_tts": dict(flow_head_config=dict(condition_dim=64)),
    "gradium_phonon_tts": dict(flow_head_config=dict(condition_dim=64)),
    "glmasr": dict(audio_token_id=AUDIO, text_config=_RANGE, audio_config=_RANGE),
    "voxtral_realtime": dict(text_config=_RANGE, audio_config=_RANGE),
    # A decoder (its causal LM caches only then), its embeddings as wide as its hidden states.
    "roformer": dict(is_decoder=True, embedding_size=64, initializer_range=0.2),
    **dict.fromkeys(
        (
            "minimax",
            "modernbert-decoder",
            "vaultgemma",
            "granite_docling_text",
            "gte",
            "jina_embeddings_v3",
            "modernbert",
            "nomic_bert",
        ),
        dict(initializer_range=0.2),
    ),
}


def _default_mrope_section(config):
    """The M-RoPE sections the model of ``config`` uses when its rope_parameters name none (the
    modeling code's own default, sized for the real head): read from its rotary module, built on
    the meta device. None for a config that names its sections, or a model without them."""
    import importlib

    from transformers import AutoModel

    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict) or "rope_type" not in params or "mrope_section" in params:
        return None
    modeling = type(config).__module__.replace(".configuration_", ".modeling_")
    try:
        source = importlib.util.find_spec(modeling).loader.get_source(modeling)
    except (ImportError, AttributeError):
        return None
    if "mrope_section" not in (source or ""):
        return None
    try:
        with torch.device("meta"):
            model = AutoModel.from_config(config)
    except ValueError:  # a text tower with no AutoModel class of its own (Qwen2.5-Omni's)
        return None
    return next(
        (
            list(m.mrope_section)
            for m in model.modules()
            if type(m).__name__.endswith("RotaryEmbedding")
            and not type(m).__name__.endswith("VisionRotaryEmbedding")
            and isinstance(getattr(m, "mrope_section", None), (list, tuple))
        ),
        None,
    )


# The fields of a composite's other sub-configs (vision, audio) that must equal its text tower's
# hidden size (their output is scattered onto the text embeddings).
_TEXT_WIDTH_FIELDS = ("out_hidden_size", "text_hidden_size")
_SUB_CONFIGS = ("text_config", "vision_config", "audio_config")


def _linked_to_text_tower(tiny):
    """A shrunk composite config (a ``text_config`` beside vision or audio sub-configs) whose
    sub-configs' outputs are as wide as the tiny text tower again (the shrink left those widths,
    which are not sizes of their own tower, at the real text tower's)."""
    text = tiny.get("text_config")
    if not isinstance(text, dict) or "hidden_size" not in text:
        return tiny
    linked = dict(tiny)
    for key, sub in tiny.items():
        if key != "text_config" and isinstance(sub, dict):
            fields = [f for f in _TEXT_WIDTH_FIELDS if isinstance(sub.get(f), int)]
            if fields:
                linked[key] = dict(sub, **dict.fromkeys(fields, text["hidden_size"]))
    return linked


def _with_overrides(tiny, *overrides):
    """``tiny`` with each of ``overrides`` (a dict or None) laid over it: a composite's sub-config
    (:data:`_SUB_CONFIGS`, or any nested config with a model_type) is updated field by field, any
    other field replaced."""
    merged = dict(tiny)
    for override in overrides:
        for key, value in (override or {}).items():
            nested = merged.get(key)
            if (
                isinstance(value, dict)
                and isinstance(nested, dict)
                and (key in _SUB_CONFIGS or "model_type" in nested)
            ):
                # A sub-config (a composite's tower, a flow head): set field by field.
                value = _with_overrides(nested, value)
            merged[key] = value
    return merged


def tiny_config(model_type, **fields_set):
    """transformers' default config of ``model_type`` with its own size fields shrunk
    (:data:`_TINY`), built again through the config class so its derived fields follow;
    ``fields_set`` last (a variant of the type)."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    fields = {
        k: v
        for k, v in default.to_dict().items()
        if k not in ("model_type", "transformers_version", "architectures", "id2label", "label2id")
        and (v is not None or k in _NONE_SIZES)
    }
    section = _default_mrope_section(default)
    if section is not None:
        fields["rope_parameters"] = dict(fields["rope_parameters"], mrope_section=section)
    text = getattr(default, "text_config", None)
    section = _default_mrope_section(text) if text is not None else None
    if section is not None:
        # A composite whose text tower's sections are its modeling code's default: named, so that
        # the shrink scales them to the tiny head as it does a text model's.
        rope = dict(fields["text_config"]["rope_parameters"], mrope_section=section)
        fields["text_config"] = dict(fields["text_config"], rope_parameters=rope)
    tiny = _linked_to_text_tower(_shrink(fields))
    tiny = _with_overrides(tiny, dict(pad_token_id=0), _TINY_OVERRIDES.get(model_type))
    tiny.update(fields_set)
    try:
        return AutoConfig.for_model(model_type, **tiny)
    except Exception:
        # A config that refuses grouped-query attention (ESM C): one kv head per head, as in its
        # default config.
        heads = fields.get("num_attention_heads")
        if heads is None or fields.get("num_key_value_heads") != heads:
            raise
        tiny["num_key_value_heads"] = tiny["num_attention_heads"]
        return AutoConfig.for_model(model_type, **tiny)


def batch(vocab=256, length=12, pad=3, seed=1):
    """Two prompts of ``length`` tokens; the second row is left-padded by ``pad`` tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (2, length), generator=g)
    mask = torch.ones_like(ids)
    ids[1, :pad] = 0
    mask[1, :pad] = 0
    return ids, mask


#: Model types whose input ids are frames: a text token, then one token per audio codebook, shape
#: (batch, seq, 1 + codebooks) (Kyutai's speech-to-text model reads its text stream and the audio
#: codes of each step together).
FRAMES = ("kyutai_speech_to_text",)
#: Encoder-decoders whose decoder reads frames of audio codes, one per channel, shape
#: (batch, seq, channels) (Dia: text into the encoder, the audio codes so far into the decoder).
DECODER_FRAMES = ("dia",)
#: Speech encoder-decoders whose encoder reads audio samples (``input_values``) and whose decoder
#: reads tokens: the tests give the encoder 0.1 s of random audio.
AUDIO_ENCODER = ("moonshine_streaming", "moonshine")
#: Decoders whose layers scale their states by a time conditioning (``t_cond``, one vector per
#: sequence) that the whole speech model computes from the audio: the tests give a random one.
TIME_CONDITIONED = ("voxtral_realtime_text",)


def batch_for(name):
    """:func:`batch` for the test model ``name``: ``(ids, mask)``. For a type of :data:`FRAMES`,
    each token made a frame with random audio codes after it; for one of
    :data:`DECODER_FRAMES`, ``ids`` is the dict of the model's inputs: the tokens into the
    encoder, random audio-code frames (not the special ids 0 and 1) into the decoder, both under
    the same mask; for one of :data:`AUDIO_ENCODER`, random audio into the encoder and the tokens
    into the decoder; for one of :data:`TIME_CONDITIONED`, the tokens and a random ``t_cond``."""
    ids, mask = batch()
    model_type = name.partition(":")[2]
    g = torch.Generator().manual_seed(2)
    if model_type in FRAMES:
        config = tiny_config(model_type)
        shape = (*ids.shape, config.num_codebooks)
        codes = torch.randint(0, config.codebook_vocab_size, shape, generator=g)
        return torch.cat([ids.unsqueeze(-1), codes], dim=-1), mask
    if model_type in DECODER_FRAMES:
        decoder = tiny_config(model_type).decoder_config
        shape = (*ids.shape, decoder.num_channels)
        codes = torch.randint(2, decoder.vocab_size, shape, generator=g)
        inputs = dict(
            input_ids=ids, attention_mask=mask, decoder_input_ids=codes, decoder_attention_mask=mask
        )
        return inputs, mask
    if model_type in AUDIO_ENCODER:
        config = tiny_config(model_type)
        samples = getattr(getattr(config, "encoder_config", config), "sample_rate", 16000) // 10
        audio = torch.randn(ids.size(0), samples, generator=g)
        return dict(input_values=audio, decoder_input_ids=ids, decoder_attention_mask=mask), mask
    if model_type in FEATURES:
        config, kind = tiny_config(model_type), FEATURES[model_type]
        if kind == "mel":
            return dict(input_features=torch.randn(2, config.num_mel_bins, 64, generator=g)), mask
        if kind == "mel_frames":
            encoder = getattr(config, "audio_config", None) or getattr(config, "asr_config", config)
            bins = encoder.num_mel_bins
            return dict(input_features=torch.randn(2, 256, bins, generator=g)), mask
        if kind == "samples":
            return dict(input_values=torch.randn(2, 1, 38400, generator=g)), mask
        if kind == "text_samples":
            audio = torch.randn(2, 1, 38400, generator=g)
            return dict(input_ids=ids, attention_mask=mask, input_values=audio), mask
        if kind == "speech_tokens":
            rows = []
            for i in range(2):
                text = torch.randint(2, 240, (5 + 2 * (1 - i),), generator=g).tolist()
                rows.append([0] * (2 * i) + text[:3] + [AUDIO] * 8 + text[3:])
            ids = torch.tensor(rows)
            features = torch.randn(2, config.audio_config.num_mel_bins, 64, generator=g)
            frames = torch.ones(2, 64, dtype=torch.long)
            inputs = dict(input_ids=ids, input_features=features, input_features_mask=frames)
            return dict(inputs, attention_mask=(ids != 0).long()), mask
        if kind == "speech_stream":
            features = torch.randn(
                2, config.audio_config.num_mel_bins, 8 * ids.size(1), generator=g
            )
            return dict(input_ids=ids, attention_mask=mask, input_features=features), mask
        if kind == "encoder_states":
            return dict(inputs_embeds=torch.randn(2, 16, config.hidden_size, generator=g)), mask
        if kind == "latents":
            return dict(latents=torch.randn(2, config.hidden_size, 16, generator=g)), mask
        return dict(past_values=torch.randn(2, 128, generator=g)), mask
    if model_type in TIME_CONDITIONED:
        t_cond = torch.randn(ids.size(0), 1, tiny_config(model_type).hidden_size, generator=g)
        return dict(input_ids=ids, attention_mask=mask, t_cond=t_cond), mask
    return ids, mask


# ---- which transformers models use RoPE ------------------------------------------------------

# What a modeling module that rotates q/k with RoPE defines or calls.
_ROTARY_MARKERS = ("apply_rotary_pos_emb", "rotate_half", "rotate_every_two", "RotaryEmbedding")


def _rotary_types(mapping):
    """The model types of a transformers auto-class mapping (type -> class name) whose class is
    defined in a modeling file that names one of :data:`_ROTARY_MARKERS` (read from the source,
    no model module imported)."""
    import glob
    import re

    import transformers

    defined_in = {}  # class name -> its modeling file's source
    root = os.path.join(os.path.dirname(transformers.__file__), "models")
    for path in sorted(glob.glob(os.path.join(root, "*", "modeling_*.py"))):
        with open(path, encoding="utf-8") as f:
            source = f.read()
        for name in re.findall(r"^class (\w+)\(", source, flags=re.MULTILINE):
            defined_in.setdefault(name, source)
    found = set()
    for model_type, class_names in mapping.items():
        names = class_names if isinstance(class_names, (tuple, list)) else (class_names,)
        if any(m in defined_in.get(n, "") for n in names for m in _ROTARY_MARKERS):
            found.add(model_type)
    return found


def rotary_model_types():
    """The causal-LM model types of the installed transformers whose modeling module uses RoPE:
    each type's causal-LM class is found in the modeling file that defines it, and that file must
    name one of :data:`_ROTARY_MARKERS`."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(_rotary_types(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))


def rotary_base_model_types():
    """The other rotary model types: those with a base (``AutoModel``) class in a modeling file
    that uses RoPE but no rotary causal-LM class (encoders, embedding models, vision-language,
    vision and audio models)."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return sorted(_rotary_types(MODEL_MAPPING_NAMES) - set(rotary_model_types()))


# ---- vision-language models ------------------------------------------------------------------

#: The vision-language model types, each built tiny with a 2-layer text tower (head_dim 32: 16
#: rotary planes, so the sections below deal them to three axes as the real checkpoints do) and
#: a 2-block vision tower (head_dim 16, patches of 4x4 pixels).
VLM = (
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "glm4v",
    "glm4v_moe",
    "glm_ocr",
    "paddleocr_vl",
    "cohere_compass",
    "qwen3_5",
    "qwen3_5_moe",
    # Qwen2.5-Omni's thinker: Qwen2.5-VL's text and vision RoPE beside an audio encoder (no RoPE:
    # sinusoidal positions), run here with an image and no audio.
    "qwen2_5_omni_thinker",
)
IMAGE, VIDEO, VISION_START, VISION_END = 250, 251, 252, 253
_VLM_TEXT = dict(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=None,
)
# initializer_range: with the default 0.02 the random q and k are so small that attention is
# nearly uniform and the vision RoPE barely moves anything; 0.2 makes it count.
_VISION = dict(
    depth=2,
    num_heads=2,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=2,
    initializer_range=0.2,
)
_TOKENS = dict(image_token_id=IMAGE, video_token_id=VIDEO)


def vlm_config(name):
    """The transformers config of one tiny vision-language test model (a name of :data:`VLM`)."""
    import transformers as tf

    if name == "paddleocr_vl":
        # Contiguous sections as Qwen2-VL's; patches of one frame, (N, C, P, P).
        text = dict(
            _VLM_TEXT,
            head_dim=32,
            rope_parameters=dict(rope_type="default", rope_theta=5e5, mrope_section=[6, 5, 5]),
        )
        vision = dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            patch_size=4,
            spatial_merge_size=2,
            image_size=32,
            initializer_range=0.2,
        )
        tokens = dict(_TOKENS, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END)
        config = tf.PaddleOCRVLConfig(text_config=text, vision_config=vision, **tokens)
        config.vision_config.temporal_patch_size = 1
        config.vision_config.in_channels = 3
        return config
    if name == "qwen2_5_omni_thinker":
        # Qwen2.5-VL's text and vision towers (below), and a one-layer audio encoder of 2 heads
        # (its default's 20 heads would stay on the shrunk width), its output as wide as the text.
        text = dict(
            _VLM_TEXT,
            rope_parameters=dict(rope_type="default", rope_theta=1e6, mrope_section=[4, 6, 6]),
        )
        vision = dict(
            _VISION,
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=128,
            window_size=16,
            fullatt_block_indexes=[1],
        )
        audio = dict(
            d_model=32,
            encoder_layers=1,
            encoder_attention_heads=2,
            encoder_ffn_dim=64,
            output_dim=128,
            num_mel_bins=16,
        )
        tokens = dict(
            _TOKENS,
            vision_start_token_id=VISION_START,
            vision_end_token_id=VISION_END,
            audio_token_id=249,
            audio_start_token_id=247,
            audio_end_token_id=248,
        )
        return tf.Qwen2_5OmniThinkerConfig(
            text_config=text, vision_config=vision, audio_config=audio, **tokens
        )
    if name in ("qwen2_vl", "qwen2_5_vl"):
        # Contiguous sections, as Qwen2-VL's [16, 24, 24] of 64 planes.
        text = dict(
            _VLM_TEXT,
            rope_parameters=dict(rope_type="default", rope_theta=1e6, mrope_section=[4, 6, 6]),
        )
        if name == "qwen2_vl":
            vision = dict(_VISION, embed_dim=32, hidden_size=128, mlp_ratio=2)
            cls = tf.Qwen2VLConfig
        else:  # window attention in block 0, full attention in block 1
            vision = dict(
                _VISION,
                hidden_size=32,
                intermediate_size=64,
                out_hidden_size=128,
                window_size=16,
                fullatt_block_indexes=[1],
            )
            cls = tf.Qwen2_5_VLConfig
        tokens = dict(_TOKENS, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END)
        return cls(text_config=text, vision_config=vision, **tokens)
    if name in ("qwen3_vl", "qwen3_vl_moe"):
        # Qwen3-VL's interleaved rule, sections as its [24, 20, 20] of 64 planes.
        text = dict(
            _VLM_TEXT,
            head_dim=32,
            rope_parameters=dict(
                rope_type="default", rope_theta=5e6, mrope_section=[6, 5, 5], mrope_interleaved=True
            ),
        )
        vision = dict(
            _VISION,
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=128,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        )
        cls = tf.Qwen3VLConfig
        if name == "qwen3_vl_moe":
            text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
            cls = tf.Qwen3VLMoeConfig
        tokens = dict(_TOKENS, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END)
        return cls(text_config=text, vision_config=vision, **tokens)
    if name in ("qwen3_5", "qwen3_5_moe"):
        # Qwen3-VL's interleaved rule over a quarter of the head (partial rotary, as Qwen3.5's 64
        # of 256: 8 of the tiny head's 32 planes, [3, 3, 2] as its default [11, 11, 10]), in its
        # full-attention layers; a Gated DeltaNet layer (no RoPE) before one.
        text = dict(
            _VLM_TEXT,
            head_dim=64,
            layer_types=["linear_attention", "full_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            rope_parameters=dict(
                rope_type="default",
                rope_theta=1e7,
                partial_rotary_factor=0.25,
                mrope_section=[3, 3, 2],
                mrope_interleaved=True,
            ),
        )
        vision = dict(
            _VISION,
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=128,
            num_position_embeddings=64,
        )
        cls = tf.Qwen3_5Config
        if name == "qwen3_5_moe":
            text.update(
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=32,
            )
            cls = tf.Qwen3_5MoeConfig
        tokens = dict(_TOKENS, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END)
        return cls(text_config=text, vision_config=vision, **tokens)
    if name == "cohere_compass":
        # Qwen3-VL's interleaved rule, one M-RoPE table per layer type (sliding, full), each with
        # its own theta; an axial 2-D vision RoPE as Qwen2-VL's.
        sections = dict(mrope_section=[6, 5, 5])
        text = dict(
            _VLM_TEXT,
            head_dim=32,
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=8,
            rope_parameters=dict(
                sliding_attention=dict(rope_type="default", rope_theta=1e4, **sections),
                full_attention=dict(rope_type="default", rope_theta=1e6, **sections),
            ),
        )
        vision = dict(
            _VISION,
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=128,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
            rope_parameters=dict(rope_type="axial", rope_theta=1e4),
        )
        tokens = dict(_TOKENS, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END)
        return tf.CohereCompassConfig(text_config=text, vision_config=vision, **tokens)
    if name in ("glm4v", "glm4v_moe", "glm_ocr"):
        # Partial rotary (half the head), sections as GLM-4.1V's [8, 12, 12] of 32 planes.
        text = dict(
            _VLM_TEXT,
            rope_parameters=dict(
                rope_type="default",
                rope_theta=1e4,
                mrope_section=[2, 3, 3],
                partial_rotary_factor=0.5,
            ),
        )
        vision = dict(
            _VISION, hidden_size=32, intermediate_size=64, out_hidden_size=128, image_size=32
        )
        cls = tf.Glm4vConfig
        if name == "glm4v_moe":
            text.update(
                n_routed_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                first_k_dense_replace=1,
            )
            cls = tf.Glm4vMoeConfig
        if name == "glm_ocr":
            cls = tf.GlmOcrConfig
        tokens = dict(
            _TOKENS,
            image_start_token_id=VISION_START,
            image_end_token_id=VISION_END,
            video_start_token_id=248,
            video_end_token_id=249,
        )
        return cls(text_config=text, vision_config=vision, **tokens)
    raise KeyError(name)


def build_vlm(name, seed=0):
    """A fresh random-weight vision-language model in eval mode (fp32, eager attention)."""
    from transformers import AutoModelForImageTextToText

    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(vlm_config(name), attn_implementation="eager")
    return model.eval()


def vlm_batch(config, seed=1, pad=2):
    """Model inputs with one image per row: ``input_ids`` (text, the image's placeholder tokens,
    text; the second row left-padded by ``pad``), ``attention_mask``, ``pixel_values``,
    ``image_grid_thw`` and ``mm_token_type_ids`` (but for Qwen2.5-Omni's thinker, which takes
    none).

    The first image is 4x6 patches (2x3 tokens after the 2x2 merge), the second 6x4: the text
    tower's three position axes (temporal, height, width) differ over the image tokens, and so do
    the vision tower's rows and columns."""
    g = torch.Generator().manual_seed(seed)
    patch = config.vision_config.patch_size
    grids = torch.tensor([[1, 4, 6], [1, 6, 4]])
    merge = config.vision_config.spatial_merge_size
    n_image = [int(t * h * w) // merge**2 for t, h, w in grids.tolist()]
    rows = []
    for i, n in enumerate(n_image):
        text = torch.randint(2, 240, (5 + pad * (1 - i),), generator=g).tolist()
        rows.append(
            [0] * (pad * i) + text[:3] + [VISION_START] + [IMAGE] * n + [VISION_END] + text[3:]
        )
    ids = torch.tensor(rows)
    mask = (ids != 0).long()
    channels = config.vision_config.in_channels * config.vision_config.temporal_patch_size
    pixels = torch.randn(int(grids.prod(-1).sum()), channels * patch * patch, generator=g)
    if config.model_type == "paddleocr_vl":  # patches as images
        pixels = pixels.view(-1, channels, patch, patch)
    inputs = dict(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids)
    if config.model_type != "qwen2_5_omni_thinker":  # it finds the images by their tokens alone
        inputs["mm_token_type_ids"] = (ids == IMAGE).int()
    return inputs


# ---- vision-language models with a 1-D text RoPE ---------------------------------------------

#: Vision-language model types whose text tower rotates with ordinary 1-D positions and whose
#: vision tower has a 2-D RoPE (Qwen2-VL's axial one, or a kin of it), each with the model type of
#: its text tower. Each is
#: built tiny by :func:`build_vision_vlm`: the text tower as :func:`tiny_config` makes that type,
#: the default vision tower shrunk to 2 layers of 2 heads of 16 with 4x4-pixel patches.
VISION_VLM = {
    "video_llama_3": "qwen2",
    "lfm3_vl": "lfm3",
    "exaone4_5": "exaone4",
    "minimax_m3_vl": "minimax_m3_vl_text",
    # Llama 4: its vision tower's complex 2-D RoPE is over one fixed image size (whole images,
    # not patch lists: see build_vision_vlm), its text model's complex 1-D RoPE as llama4_text.
    "llama4": "llama4_text",
    # Step 3.7: the column first in its vision tower's axial RoPE, over whole images of one size
    # (see build_vision_vlm); its text tower's type is step3p5 (a table per layer type).
    "step3p7": "step3p5",
    # Text towers with no RoPE (GLM-5-Next's NoPE attention, Inkling2's relative logits): only the
    # vision tower rotates, and is patched (NO_TEXT_ROPE).
    "glm5_next": "glm5_next_text",
    "inkling2": "inkling2_text",
    # Kimi-K2.5: its vision tower's axes alternate plane by plane; its text tower DeepSeek-V3's.
    "kimi_k25": "deepseek_v3",
}
#: The models of :data:`VISION_VLM` whose text tower does not rotate at all.
NO_TEXT_ROPE = ("glm5_next", "inkling2")
# Vision config fields given by hand: Llama 4's one image size (4x4 patches of 4 pixels) and its
# projector sizes (the shrink leaves them at the real model's 4096 and 7680).
_VISION_OVERRIDES = {
    "llama4": dict(
        image_size=16, projector_input_dim=64, projector_output_dim=64, vision_output_dim=64
    ),
    # Its learned position embeddings are over an 8x8 patch grid, interpolated to each image's.
    "step3p7": dict(image_size=32),
    "glm5_next": dict(depth=2),  # its layer count, under the name Qwen2-VL's towers give it
    # The same (its num_hidden_layers is an alias of depth, which the shrink does not see), with
    # one windowed block and one of full attention, as the real tower has both.
    "exaone4_5": dict(depth=2, fullatt_block_indexes=[1]),
}
# Top-level config fields given by hand: Kimi-K2.5's projector normalises the vision states, as
# wide as the shrunk tower.
_TOP_OVERRIDES = {"kimi_k25": dict(projection_hidden_size=32)}
_CONFIG_ONLY = ("model_type", "transformers_version", "architectures", "id2label", "label2id")
# The top-level fields of the tiny VLM configs: the test batch's token ids, projector sizes.
_VLM_TOP = {
    **dict.fromkeys(("image_token_id", "image_token_index"), IMAGE),
    **dict.fromkeys(("video_token_id", "video_token_index"), VIDEO),
    "vision_start_token_id": VISION_START,
    "vision_end_token_id": VISION_END,
    "projector_hidden_size": 64,
}


def _fields(config):
    return {
        k: v for k, v in config.to_dict().items() if k not in _CONFIG_ONLY[1:] and v is not None
    }


def vision_vlm_config(name):
    """The transformers config of one tiny model of :data:`VISION_VLM`."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(name)
    # initializer_range 0.2: RoPE must move the tiny random model's output (see _VISION).
    text = dict(_fields(tiny_config(VISION_VLM[name])), initializer_range=0.2)
    vision = _shrink(_fields(default.vision_config))
    vision.update(hidden_size=32, patch_size=4, initializer_range=0.2)
    vision.update(_VISION_OVERRIDES.get(name, {}))
    for key in ("num_attention_heads", "num_heads", "num_key_value_heads"):
        if key in vision:
            vision[key] = 2
    for key in _TEXT_WIDTH_FIELDS:  # the merger's output, as wide as the text tower
        if key in vision:
            vision[key] = text["hidden_size"]
    top = {
        k: _VLM_TOP.get(k, v)
        for k, v in default.to_dict().items()
        if k not in _CONFIG_ONLY and k not in ("vision_config", "text_config")
    }
    top.update(_TOP_OVERRIDES.get(name, {}))
    return type(default)(text_config=text, vision_config=vision, **top)


def build_vision_vlm(name, seed=0):
    """``(model, inputs, text_layers, vision_layers, vision_states)`` of one tiny model of
    :data:`VISION_VLM`: the fresh random-weight model (fp32, eager attention, eval mode), its
    inputs (one image per row, 4x6 and 6x4 patches, the second row left-padded), its attention
    layers that rotate (text, vision), and a function of (model, inputs) giving the vision
    tower's last hidden states."""
    from transformers import AutoModelForImageTextToText

    from torch_rope.hf.families.axial_vision import HF_VISION_NAME
    from torch_rope.hf.model_parts import calls_hf_apply

    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(
        vision_vlm_config(name), attn_implementation="eager"
    ).eval()
    if name == "llama4":
        return (model, *_llama4_inputs_and_layers(model))
    if name == "step3p7":
        return (model, *_whole_images_inputs_and_layers(model))
    g = torch.Generator().manual_seed(1)
    grids = torch.tensor([[1, 4, 6], [1, 6, 4]])
    pad, merge, rows = 2, 2, []
    for i, (t, h, w) in enumerate(grids.tolist()):
        text = torch.randint(2, 240, (5 + pad * (1 - i),), generator=g).tolist()
        rows.append([0] * (pad * i) + text[:3] + [IMAGE] * (t * h * w // merge**2) + text[3:])
    ids = torch.tensor(rows)
    vision = model.config.vision_config
    channels = getattr(vision, "in_channels", None) or getattr(vision, "num_channels", 3)
    channels *= getattr(vision, "temporal_patch_size", None) or 1
    pixels = torch.randn(int(grids.prod(-1).sum()), channels * vision.patch_size**2, generator=g)
    inputs = dict(
        input_ids=ids, attention_mask=(ids != 0).long(), pixel_values=pixels, image_grid_thw=grids
    )
    if name == "kimi_k25":  # its patch embedding a Conv2d over (N, C, patch, patch)
        inputs["pixel_values"] = pixels.view(-1, channels, vision.patch_size, vision.patch_size)
    extra = {}
    if name == "video_llama_3":
        inputs["image_merge_sizes"] = extra["merge_sizes"] = torch.tensor([merge, merge])
    towers = ("visual", "vision_tower", "vision_model")
    tower = next(n for n, _ in model.model.named_children() if n in towers)
    grid_name = "grid_thw"
    if name == "inkling2":  # one merged 2x2 patch a token, (tokens, side, side, channels)
        side = vision.patch_size * merge
        tokens = int(grids.prod(-1).sum()) // merge**2
        inputs["pixel_values"] = torch.randn(tokens, side, side, 3, generator=g)
        inputs["image_grid_thw"] = grids // torch.tensor([1, merge, merge])
        grid_name = "image_grid_thw"

    def vision_states(m, x):
        with torch.no_grad():
            grid = {grid_name: x["image_grid_thw"]}
            out = getattr(m.model, tower)(x["pixel_values"], **grid, **extra)
        return out.last_hidden_state

    modules = list(model.modules())
    text_layers = [m for m in modules if calls_hf_apply(m)]
    vision_layers = [m for m in modules if calls_hf_apply(m, (HF_VISION_NAME,))]
    return model, inputs, text_layers, vision_layers, vision_states


def _whole_images_inputs_and_layers(model):
    """build_vision_vlm's (inputs, text_layers, vision_layers, vision_states) for Step 3.7, whose
    vision tower reads a batch of whole images of one size, ``(B, C, H, W)``: two images of 8x12
    patches (its rows and columns differ), each 2x3 tokens after its two stride-2 convolutions,
    the second row left-padded."""
    from torch_rope.hf.families.axial_vision import HF_VISION_NAME
    from torch_rope.hf.model_parts import calls_hf_apply

    g = torch.Generator().manual_seed(1)
    vision = model.config.vision_config
    height, width = 8 * vision.patch_size, 12 * vision.patch_size
    pad, rows = 2, []
    for i in range(2):
        text = torch.randint(2, 240, (5 + pad * (1 - i),), generator=g).tolist()
        rows.append([0] * (pad * i) + text[:3] + [IMAGE] * 6 + text[3:])
    ids = torch.tensor(rows)
    pixels = torch.randn(2, vision.num_channels, height, width, generator=g)
    inputs = dict(input_ids=ids, attention_mask=(ids != 0).long(), pixel_values=pixels)

    def vision_states(m, x):
        with torch.no_grad():
            return m.model.vision_model(x["pixel_values"]).last_hidden_state

    modules = list(model.modules())
    text_layers = [m for m in modules if calls_hf_apply(m)]
    vision_layers = [m for m in modules if calls_hf_apply(m, (HF_VISION_NAME,))]
    return inputs, text_layers, vision_layers, vision_states


def _llama4_inputs_and_layers(model):
    """build_vision_vlm's (inputs, text_layers, vision_layers, vision_states) for Llama 4: one
    whole image per row (its vision RoPE is over one fixed image size), each image 4 tokens after
    the pixel shuffle, the second row left-padded; its layers call the complex-form rotations."""
    from torch_rope.hf.families import complex_form, llama4_vision

    g = torch.Generator().manual_seed(1)
    vision = model.config.vision_config
    side = vision.image_size // vision.patch_size
    tokens = int(side * vision.pixel_shuffle_ratio) ** 2
    pad, rows = 2, []
    for i in range(2):
        text = torch.randint(2, 240, (5 + pad * (1 - i),), generator=g).tolist()
        rows.append([0] * (pad * i) + text[:3] + [IMAGE] * tokens + text[3:])
    ids = torch.tensor(rows)
    pixels = torch.randn(2, vision.num_channels, vision.image_size, vision.image_size, generator=g)
    inputs = dict(input_ids=ids, attention_mask=(ids != 0).long(), pixel_values=pixels)

    def vision_states(m, x):
        with torch.no_grad():
            return m.vision_model(x["pixel_values"]).last_hidden_state

    def calls(module, name):
        code = getattr(type(module).forward, "__code__", None)
        return code is not None and name in code.co_names

    modules = list(model.modules())
    text_layers = [m for m in modules if calls(m, complex_form.HF_NAME)]
    vision_layers = [m for m in modules if calls(m, llama4_vision.HF_NAME)]
    return inputs, text_layers, vision_layers, vision_states


# ---- vision towers on their own --------------------------------------------------------------

#: Vision-tower model types (AutoModel types of their own: an image encoder loaded alone) with the
#: axial 2-D RoPE of :data:`VLM`'s towers. Each is built tiny by :func:`build_vision_tower` from
#: its own default config, shrunk as :func:`vision_vlm_config` shrinks a VLM's vision config: 2
#: blocks of 2 heads of 16, 4x4-pixel patches, initializer_range 0.2 (see _VISION).
VISION_TOWERS = (
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
    "kimi_k25_vision",
)


def vision_tower_config(name):
    """The transformers config of one tiny vision tower of :data:`VISION_TOWERS`."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(name)
    fields = _shrink(_fields(default))
    fields.update(hidden_size=32, patch_size=4, initializer_range=0.2)
    for key in ("num_attention_heads", "num_heads", "num_key_value_heads"):
        if key in fields:
            fields[key] = 2
    for key in ("depth", "num_hidden_layers"):
        if key in fields:
            fields[key] = 2
    for key in ("out_hidden_size", "text_hidden_size", "projection_hidden_dim"):
        if key in fields:  # the merger's or projector's widths, up to the text tower's
            fields[key] = 64
    fields.pop("model_type", None)
    return type(default)(**fields)


def build_vision_tower(name, seed=0):
    """``(model, inputs)`` of one tiny vision tower of :data:`VISION_TOWERS`: the fresh
    random-weight tower (fp32, eager attention, eval mode) and the keyword arguments of its
    forward: two images of 4x6 and 6x4 patches (their rows and columns differ) as the packed
    patches and the ``grid_thw`` the tower's forward takes (Pixtral: the images, padded to one
    size, and their ``image_sizes``)."""
    import inspect

    from transformers import AutoModel

    torch.manual_seed(seed)
    model = AutoModel.from_config(vision_tower_config(name), attn_implementation="eager").eval()
    config = model.config
    grids = torch.tensor([[1, 4, 6], [1, 6, 4]])
    channels = getattr(config, "in_channels", None) or getattr(config, "num_channels", 3)
    frames = getattr(config, "temporal_patch_size", None) or getattr(config, "patch_temporal", 1)
    g = torch.Generator().manual_seed(1)
    patch = channels * frames * config.patch_size**2
    pixels = torch.randn(int(grids.prod(-1).sum()), patch, generator=g)
    parameters = inspect.signature(model.forward).parameters
    if "image_sizes" in parameters:  # Pixtral's: a batch of images, each cropped to its size
        sizes = grids[:, 1:] * config.patch_size
        side = int(sizes.max())
        images = torch.randn(len(grids), channels, side, side, generator=g)
        return model, {"pixel_values": images, "image_sizes": sizes}
    if "image_grid_thw" in parameters:  # Inkling2's: merged tokens of merge x merge patches
        merge = config.spatial_merge_size
        side = config.patch_size * merge
        tokens = torch.randn(int(grids.prod(-1).sum()) // merge**2, side, side, 3, generator=g)
        return model, {"pixel_values": tokens, "image_grid_thw": grids // torch.tensor([1, 2, 2])}
    if name == "kimi_k25_vision":  # its patch embedding a Conv2d over (N, C, patch, patch)
        pixels = pixels.view(-1, channels, config.patch_size, config.patch_size)
    # The first argument is the patches, named hidden_states or pixel_values.
    inputs = {next(iter(parameters)): pixels, "grid_thw": grids}
    if "merge_sizes" in parameters:  # VideoLLaMA3's
        inputs["merge_sizes"] = torch.tensor([2, 2])
    return model, inputs
