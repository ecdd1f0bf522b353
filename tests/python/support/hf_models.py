# SPDX-License-Identifier: BSD-3-Clause
"""Tiny random-weight transformers models for the integration tests, built from configs only.

No download: every model comes from ``AutoModelForCausalLM.from_config`` on a config written
here. Each entry is the issue's list: Llama in each scaling variant, Qwen2 (theta 1e6), Qwen3
(q/k norm), Mistral, Phi3 (partial rotary, longrope), GPT-NeoX (rotary_pct 0.25), Gemma and Gemma3
(sliding and full layers, linear scaling on the full ones), plus a few more supported types.
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
    """The transformers config of one test model (``'llama'``, ``'llama-yarn'``, ``'phi3'``...)."""
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
    raise KeyError(name)


#: Llama-like model types whose default config needs nothing beyond COMMON.
GENERIC = ("olmo", "olmo3", "smollm3", "arcee", "exaone4", "granitemoe", "seed_oss", "apertus")


def build(name, seed=0):
    """A fresh random-weight model in eval mode (fp32, eager attention: deterministic on CPU)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(name), attn_implementation="eager")
    return model.eval()


def batch(vocab=256, length=12, pad=3, seed=1):
    """Two prompts of ``length`` tokens; the second row is left-padded by ``pad`` tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (2, length), generator=g)
    mask = torch.ones_like(ids)
    ids[1, :pad] = 0
    mask[1, :pad] = 0
    return ids, mask
