# SPDX-License-Identifier: BSD-3-Clause
"""Tiny random-weight diffusers models for the integration tests, built from their own configs.

No download: every model comes from its class's ``__init__`` with a few small arguments (most
from diffusers' own tests, checked against 0.42.1 by building and running each), and its inputs
are one denoising step's, with integer position ids where the model takes ids (the pipelines'
ids are integers; diffusers' own tests draw random float ones, which ``test_diffusers.py`` covers
separately). Models whose pipeline builds the RoPE tables get them from the pipeline's own helper.

``rope_model_classes()`` finds every model class of the installed diffusers that applies RoPE,
independently of torch_rope's registry.
"""

import copy
import importlib
import inspect
import os
import pathlib
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

BUILDERS = {}


def builder(name):
    def register(function):
        BUILDERS[name] = function
        return function

    return register


class _Inputs:
    """Random inputs from one seeded generator, so every build is the same."""

    def __init__(self, seed=0):
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, *shape):
        return torch.randn(*shape, generator=self.generator)


def grid_ids(rows, columns, frame=0, axes=3):
    """FLUX's image ids of a rows x columns latent grid, float as the pipelines pass them."""
    ids = torch.zeros(rows, columns, axes)
    ids[..., 0] = frame
    ids[..., 1] = torch.arange(rows)[:, None]
    ids[..., 2] = torch.arange(columns)[None, :]
    return ids.reshape(rows * columns, axes)


def _diffusers():
    import diffusers

    return diffusers


# --------------------------------------------------------------------- FLUX-style (ids in)
FLUX = dict(
    patch_size=1,
    in_channels=4,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    pooled_projection_dim=32,
    axes_dims_rope=[4, 4, 8],
)


def _flux_inputs(rn, text=8, rows=4, columns=4, channels=4, pooled=True):
    inputs = dict(
        hidden_states=rn(1, rows * columns, channels),
        encoder_hidden_states=rn(1, text, 32),
        img_ids=grid_ids(rows, columns),
        txt_ids=torch.zeros(text, 3),
        timestep=torch.tensor([1.0]),
        return_dict=False,
    )
    if pooled:
        inputs["pooled_projections"] = rn(1, 32)
    return inputs


@builder("FluxTransformer2DModel")
def _(rn):
    return _diffusers().FluxTransformer2DModel(**FLUX), _flux_inputs(rn)


@builder("FluxControlNetModel")
def _(rn):
    inputs = _flux_inputs(rn)
    inputs["controlnet_cond"] = rn(1, 16, 4)
    return _diffusers().FluxControlNetModel(**FLUX), inputs


@builder("FluxMultiControlNetModel")
def _(rn):
    inner, inputs = BUILDERS["FluxControlNetModel"](rn)
    model = _diffusers().FluxMultiControlNetModel([inner])
    inputs.update(
        controlnet_cond=[inputs["controlnet_cond"]],
        controlnet_mode=[torch.tensor([0])],  # read as mode[:, None]; only a union net embeds it
        conditioning_scale=[1.0],
    )
    return model, inputs


@builder("ChromaTransformer2DModel")
def _(rn):
    config = dict(FLUX, approximator_num_channels=8, approximator_hidden_dim=16)
    config.update(approximator_layers=1)
    del config["pooled_projection_dim"]
    return _diffusers().ChromaTransformer2DModel(**config), _flux_inputs(rn, pooled=False)


def _flux2_ids(text, rows, columns, frame=0):
    image = torch.cartesian_prod(
        torch.tensor([frame]), torch.arange(rows), torch.arange(columns), torch.arange(1)
    )
    tokens = torch.cartesian_prod(
        torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(text)
    )
    return image, tokens


@builder("Flux2Transformer2DModel")
def _(rn):
    config = dict(FLUX, timestep_guidance_channels=256, axes_dims_rope=[4, 4, 4, 4])
    del config["pooled_projection_dim"]
    image, tokens = _flux2_ids(8, 4, 4)
    inputs = dict(
        hidden_states=rn(1, 16, 4),
        encoder_hidden_states=rn(1, 8, 32),
        img_ids=image[None],
        txt_ids=tokens[None],
        timestep=torch.tensor([1.0]),
        guidance=torch.tensor([1.0]),
        return_dict=False,
    )
    return _diffusers().Flux2Transformer2DModel(**config), inputs


@builder("Flux3Transformer2DModel")
def _(rn):
    config = dict(
        in_channels=4,
        cond_in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        timestep_channels=16,
        mlp_ratio=2.0,
        axes_dims_rope=(4, 4, 4, 4),
    )
    image, tokens = _flux2_ids(8, 4, 4)
    cond, _ = _flux2_ids(8, 4, 4, frame=1)
    inputs = dict(
        hidden_states=rn(1, 16, 4),
        encoder_hidden_states=rn(1, 8, 32),
        timestep=torch.tensor([0.5]),
        img_ids=image,
        txt_ids=tokens,
        image_cond_hidden_states=rn(1, 16, 4),
        image_cond_ids=cond,
        return_dict=False,
    )
    return _diffusers().Flux3Transformer2DModel(**config), inputs


@builder("BriaTransformer2DModel")
def _(rn):
    config = dict(FLUX, attention_head_dim=8, pooled_projection_dim=None, axes_dims_rope=[0, 4, 4])
    return _diffusers().BriaTransformer2DModel(**config), _flux_inputs(rn, pooled=False)


@builder("BriaFiboTransformer2DModel")
def _(rn):
    config = dict(FLUX, in_channels=48, attention_head_dim=8, joint_attention_dim=64)
    config.update(text_encoder_dim=32, pooled_projection_dim=None, axes_dims_rope=[0, 4, 4])
    inputs = _flux_inputs(rn, channels=48, pooled=False)
    text = rn(1, 8, 64)
    inputs.update(encoder_hidden_states=text, text_encoder_layers=[text[..., :32]] * 2)
    return _diffusers().BriaFiboTransformer2DModel(**config), inputs


@builder("LongCatImageTransformer2DModel")
def _(rn):
    inputs = _flux_inputs(rn, pooled=False)
    text = torch.zeros(8, 3)
    text[:, 1] = text[:, 2] = torch.arange(8)  # LongCat's text ids run along both spatial axes
    image = grid_ids(4, 4, frame=1)
    image[:, 1:] += 8
    inputs.update(txt_ids=text, img_ids=image, guidance=torch.tensor([3.5]))
    return _diffusers().LongCatImageTransformer2DModel(**FLUX), inputs


@builder("OvisImageTransformer2DModel")
def _(rn):
    config = dict(FLUX, out_channels=4)
    del config["pooled_projection_dim"]
    return _diffusers().OvisImageTransformer2DModel(**config), _flux_inputs(rn, pooled=False)


@builder("Krea2Transformer2DModel")
def _(rn):
    config = dict(
        in_channels=16,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=32,
        timestep_embed_dim=8,
        text_hidden_dim=16,
        num_text_layers=3,
        text_num_attention_heads=2,
        text_num_key_value_heads=1,
        text_intermediate_size=16,
        num_layerwise_text_blocks=1,
        num_refiner_text_blocks=1,
        axes_dims_rope=(4, 2, 2),
        rope_theta=1000.0,
    )
    text, rows, columns = 4, 2, 2
    positions = torch.zeros(text + rows * columns, 3)
    positions[text:, 1:] = grid_ids(rows, columns)[:, 1:]
    inputs = dict(
        hidden_states=rn(1, rows * columns, 16),
        encoder_hidden_states=rn(1, text, 3, 16),
        timestep=torch.tensor([0.5]),
        position_ids=positions,
        encoder_attention_mask=torch.ones(1, text, dtype=torch.bool),
        return_dict=False,
    )
    return _diffusers().Krea2Transformer2DModel(**config), inputs


# --------------------------------------------------------------------- HunyuanVideo-style (grid)
@builder("HunyuanVideoTransformer3DModel")
def _(rn):
    config = dict(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=10,
        num_layers=1,
        num_single_layers=1,
        num_refiner_layers=1,
        patch_size=1,
        patch_size_t=1,
        guidance_embeds=True,
        text_embed_dim=16,
        pooled_projection_dim=8,
        rope_axes_dim=(2, 4, 4),
        image_condition_type=None,
    )
    inputs = dict(
        hidden_states=rn(1, 4, 2, 4, 4),
        timestep=torch.tensor([500.0]),
        encoder_hidden_states=rn(1, 6, 16),
        pooled_projections=rn(1, 8),
        encoder_attention_mask=torch.ones(1, 6),
        guidance=torch.tensor([3.0]),
        return_dict=False,
    )
    return _diffusers().HunyuanVideoTransformer3DModel(**config), inputs


@builder("HunyuanVideo15Transformer3DModel")
def _(rn):
    config = dict(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=2,
        num_refiner_layers=1,
        mlp_ratio=2.0,
        patch_size=1,
        patch_size_t=1,
        text_embed_dim=16,
        text_embed_2_dim=8,
        image_embed_dim=12,
        rope_axes_dim=(2, 2, 4),
        target_size=16,
        task_type="t2v",
    )
    inputs = dict(
        hidden_states=rn(1, 4, 2, 4, 4),
        timestep=torch.tensor([1.0]),
        encoder_hidden_states=rn(1, 6, 16),
        encoder_hidden_states_2=rn(1, 4, 8),
        encoder_attention_mask=torch.ones(1, 6),
        encoder_attention_mask_2=torch.ones(1, 4),
        image_embeds=torch.zeros(1, 3, 12),
        return_dict=False,
    )
    return _diffusers().HunyuanVideo15Transformer3DModel(**config), inputs


@builder("HunyuanImageTransformer2DModel")
def _(rn):
    config = dict(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=1,
        num_single_layers=1,
        num_refiner_layers=1,
        mlp_ratio=2.0,
        patch_size=(1, 1),
        guidance_embeds=False,
        text_embed_dim=16,
        text_embed_2_dim=None,
        rope_axes_dim=(4, 4),
    )
    inputs = dict(
        hidden_states=rn(1, 4, 4, 6),
        timestep=torch.tensor([500.0]),
        encoder_hidden_states=rn(1, 6, 16),
        encoder_attention_mask=torch.ones(1, 6),
        return_dict=False,
    )
    return _diffusers().HunyuanImageTransformer2DModel(**config), inputs


@builder("MotifVideoTransformer3DModel")
def _(rn):
    config = dict(
        in_channels=33,
        out_channels=16,
        num_attention_heads=2,
        attention_head_dim=12,
        num_layers=1,
        num_single_layers=1,
        num_decoder_layers=0,
        mlp_ratio=2.0,
        patch_size=1,
        patch_size_t=1,
        qk_norm="rms_norm",
        norm_type="layer_norm",
        text_embed_dim=32,
        image_embed_dim=4,
        rope_theta=256.0,
        rope_axes_dim=(4, 4, 4),
    )
    inputs = dict(
        hidden_states=rn(1, 33, 3, 4, 4),
        encoder_hidden_states=rn(1, 6, 32),
        timestep=torch.tensor([500]),
        return_dict=False,
    )
    return _diffusers().MotifVideoTransformer3DModel(**config), inputs


# --------------------------------------------------------------------- Qwen-Image-style
QWEN = dict(
    patch_size=2,
    in_channels=16,
    out_channels=4,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    joint_attention_dim=16,
    axes_dims_rope=(8, 4, 4),
)


def _qwen_inputs(rn, rows=4, columns=6):
    return dict(
        hidden_states=rn(1, rows * columns, 16),
        encoder_hidden_states=rn(1, 8, 16),
        encoder_hidden_states_mask=torch.ones(1, 8, dtype=torch.long),
        timestep=torch.tensor([1.0]),
        img_shapes=[(1, rows, columns)],
        return_dict=False,
    )


@builder("QwenImageTransformer2DModel")
def _(rn):
    config = dict(QWEN, guidance_embeds=False)
    return _diffusers().QwenImageTransformer2DModel(**config), _qwen_inputs(rn)


@builder("QwenImageControlNetModel")
def _(rn):
    inputs = _qwen_inputs(rn)
    inputs["controlnet_cond"] = rn(1, 24, 16)
    return _diffusers().QwenImageControlNetModel(**QWEN), inputs


@builder("QwenImageMultiControlNetModel")
def _(rn):
    inner, inputs = BUILDERS["QwenImageControlNetModel"](rn)
    inputs.update(controlnet_cond=[inputs["controlnet_cond"]], conditioning_scale=[1.0])
    return _diffusers().QwenImageMultiControlNetModel([inner]), inputs


@builder("NucleusMoEImageTransformer2DModel")
def _(rn):
    config = dict(QWEN, moe_enabled=False, capacity_factors=[8.0, 8.0])
    return _diffusers().NucleusMoEImageTransformer2DModel(**config), _qwen_inputs(rn)


# --------------------------------------------------------------------- grids over halves
@builder("CosmosTransformer3DModel")
def _(rn):
    # concat_padding_mask=True would need torchvision, which the test environment does not have.
    config = dict(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=12,
        num_layers=2,
        mlp_ratio=2,
        text_embed_dim=16,
        adaln_lora_dim=4,
        max_size=(4, 32, 32),
        patch_size=(1, 2, 2),
        rope_scale=(2.0, 1.0, 1.0),
        concat_padding_mask=False,
        extra_pos_embed_type="learnable",
    )
    inputs = dict(
        hidden_states=rn(1, 4, 2, 8, 8),
        timestep=torch.tensor([500]),
        encoder_hidden_states=rn(1, 6, 16),
        attention_mask=torch.ones(1, 6),
        fps=30,  # a video: the frames' positions scaled by base_fps / fps
        return_dict=False,
    )
    return _diffusers().CosmosTransformer3DModel(**config), inputs


def _torchvision_resize_shim():
    """CosmosControlNetModel resizes its padding mask with torchvision, which the test
    environment does not have: a nearest resize in its place (the RoPE path does not use it)."""
    import types

    import diffusers.models.controlnets.controlnet_cosmos as module

    if "transforms" not in vars(module):

        def resize(x, size, interpolation=None):
            return torch.nn.functional.interpolate(x, size=size, mode="nearest")

        module.transforms = types.SimpleNamespace(
            functional=types.SimpleNamespace(resize=resize),
            InterpolationMode=types.SimpleNamespace(NEAREST=None),
        )


@builder("CosmosControlNetModel")
def _(rn):
    config = dict(
        n_controlnet_blocks=2,
        in_channels=18,
        latent_channels=18,
        model_channels=32,
        num_attention_heads=2,
        attention_head_dim=16,
        mlp_ratio=2,
        text_embed_dim=32,
        adaln_lora_dim=4,
        patch_size=(1, 2, 2),
        max_size=(4, 32, 32),
        rope_scale=(2.0, 1.0, 1.0),
        extra_pos_embed_type=None,
        img_context_dim_in=32,
        img_context_dim_out=32,
        use_crossattn_projection=False,
    )
    _torchvision_resize_shim()
    inputs = dict(
        controls_latents=rn(1, 16, 2, 8, 8),
        latents=rn(1, 16, 2, 8, 8),
        timestep=torch.tensor([0.5]),
        encoder_hidden_states=(rn(1, 12, 32), rn(1, 4, 32)),
        condition_mask=torch.ones(1, 1, 2, 8, 8),
        conditioning_scale=1.0,
        padding_mask=torch.zeros(1, 1, 8, 8),
        return_dict=False,
    )
    return _diffusers().CosmosControlNetModel(**config), inputs


@builder("CogView4Transformer2DModel")
def _(rn):
    config = dict(
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        out_channels=4,
        text_embed_dim=8,
        time_embed_dim=8,
        condition_dim=4,
        rope_axes_dim=(16, 16),
    )
    size = torch.tensor([[64, 64]])
    inputs = dict(
        hidden_states=rn(1, 4, 8, 12),
        encoder_hidden_states=rn(1, 8, 8),
        timestep=torch.tensor([500]),
        original_size=size,
        target_size=size,
        crop_coords=torch.tensor([[0, 0]]),
        return_dict=False,
    )
    return _diffusers().CogView4Transformer2DModel(**config), inputs


@builder("GlmImageTransformer2DModel")
def _(rn):
    config = dict(
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        text_embed_dim=32,
        time_embed_dim=16,
        condition_dim=8,
        prior_vq_quantizer_codebook_size=64,
    )
    inputs = dict(
        hidden_states=rn(1, 4, 8, 12),
        encoder_hidden_states=rn(1, 12, 32),
        prior_token_id=torch.arange(24).remainder(64)[None],
        prior_token_drop=torch.zeros(1, dtype=torch.bool),
        timestep=torch.tensor([500]),
        target_size=torch.tensor([[8.0, 12.0]]),
        crop_coords=torch.tensor([[0.0, 0.0]]),
        return_dict=False,
    )
    return _diffusers().GlmImageTransformer2DModel(**config), inputs


# --------------------------------------------------------------------- one-axis (audio, text)
ACE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rope_theta=10000.0,
    sliding_window=16,
)


@builder("AceStepTransformer1DModel")
def _(rn):
    config = dict(ACE, num_hidden_layers=2, in_channels=24, audio_acoustic_hidden_dim=8)
    config.update(patch_size=2, rms_norm_eps=1e-6)
    inputs = dict(
        hidden_states=rn(1, 8, 8),
        timestep=torch.tensor([0.5]),
        timestep_r=torch.tensor([0.3]),
        encoder_hidden_states=rn(1, 10, 32),
        context_latents=rn(1, 8, 16),
        return_dict=False,
    )
    return _diffusers().AceStepTransformer1DModel(**config), inputs


@builder("AceStepAudioTokenizer")
def _(rn):
    model = _diffusers().AceStepAudioTokenizer(
        **ACE,
        audio_acoustic_hidden_dim=8,
        pool_window_size=5,
        fsq_dim=32,
        num_attention_pooler_hidden_layers=1,
    )
    return model, dict(hidden_states=rn(1, 2, 5, 8))  # (B, T / window, window, acoustic)


@builder("AceStepAudioTokenDetokenizer")
def _(rn):
    model = _diffusers().AceStepAudioTokenDetokenizer(
        **ACE, audio_acoustic_hidden_dim=8, pool_window_size=5, num_attention_pooler_hidden_layers=1
    )
    return model, dict(hidden_states=rn(1, 2, 32))


@builder("AceStepConditionEncoder")
def _(rn):
    model = _diffusers().AceStepConditionEncoder(
        **ACE,
        text_hidden_dim=16,
        timbre_hidden_dim=8,
        num_lyric_encoder_hidden_layers=1,
        num_timbre_encoder_hidden_layers=1,
    )
    inputs = dict(
        text_hidden_states=rn(1, 5, 16),
        text_attention_mask=torch.ones(1, 5),
        lyric_hidden_states=rn(1, 7, 16),
        lyric_attention_mask=torch.ones(1, 7),
        refer_audio_acoustic_hidden_states_packed=rn(1, 6, 8),
        refer_audio_order_mask=torch.zeros(1, dtype=torch.long),
    )
    return model, inputs


@builder("AceStepLyricEncoder")
def _(rn):
    from diffusers.pipelines.ace_step.modeling_ace_step import AceStepLyricEncoder

    model = AceStepLyricEncoder(**ACE, text_hidden_dim=16, num_lyric_encoder_hidden_layers=2)
    return model, dict(inputs_embeds=rn(1, 7, 16), attention_mask=torch.ones(1, 7))


@builder("AceStepTimbreEncoder")
def _(rn):
    from diffusers.pipelines.ace_step.modeling_ace_step import AceStepTimbreEncoder

    model = AceStepTimbreEncoder(**ACE, timbre_hidden_dim=8, num_timbre_encoder_hidden_layers=2)
    inputs = dict(
        refer_audio_acoustic_hidden_states_packed=rn(2, 6, 8),
        refer_audio_order_mask=torch.tensor([0, 0]),
    )
    return model, inputs


@builder("MiniMaxMusic3Transformer1DModel")
def _(rn):
    config = dict(
        in_channels=8,
        condition_dim=16,
        num_layers=2,
        num_attention_heads=2,
        attention_head_dim=8,
        ff_inner_dim=32,
        rotary_dim=4,
        fourier_embedding_dim=8,
    )
    inputs = dict(
        hidden_states=rn(1, 8, 24),
        encoder_hidden_states=rn(1, 24, 16),
        timestep=torch.full((1,), 0.5),
        return_dict=False,
    )
    return _diffusers().MiniMaxMusic3Transformer1DModel(**config), inputs


@builder("StableAudio3DiTModel")
def _(rn):
    config = dict(
        io_channels=8,
        patch_size=1,
        embed_dim=32,
        depth=2,
        num_heads=4,
        cond_token_dim=16,
        global_cond_dim=12,
        local_add_cond_dim=5,
        timestep_features_dim=16,
        ff_mult=2,
        num_memory_tokens=3,
        use_differential_attention=False,
    )
    inputs = dict(
        hidden_states=rn(1, 8, 16),
        timestep=torch.tensor([0.4]),
        encoder_hidden_states=rn(1, 4, 16),
        global_hidden_states=rn(1, 12),
        return_dict=False,
    )
    return _diffusers().StableAudio3DiTModel(**config), inputs


@builder("LongCatAudioDiTTransformer")
def _(rn):
    config = dict(dit_dim=64, dit_depth=2, dit_heads=4, dit_text_dim=32, latent_dim=8)
    config["text_conv"] = False
    inputs = dict(
        hidden_states=rn(1, 16, 8),
        encoder_hidden_states=rn(1, 10, 32),
        encoder_attention_mask=torch.ones(1, 10, dtype=torch.bool),
        attention_mask=torch.ones(1, 16, dtype=torch.bool),
        timestep=torch.ones(1),
        return_dict=False,
    )
    return _diffusers().LongCatAudioDiTTransformer(**config), inputs


@builder("AnimaTextConditioner")
def _(rn):
    config = dict(source_dim=16, target_dim=16, model_dim=16, num_layers=1, num_attention_heads=2)
    config.update(mlp_ratio=2.0, target_vocab_size=64, min_sequence_length=8)
    inputs = dict(source_hidden_states=rn(1, 5, 16), target_input_ids=torch.arange(6)[None] * 7)
    return _diffusers().AnimaTextConditioner(**config), inputs


@builder("AutoencoderSAME")
def _(rn):
    config = dict(
        audio_channels=2,
        patch_size=16,
        encoder_channels=16,
        encoder_c_mults=(2,),
        encoder_strides=(2,),
        encoder_transformer_depths=(1,),
        latent_dim=8,
        use_differential_attention=False,
        dim_heads=8,
        ff_mult=2,
    )
    return _diffusers().AutoencoderSAME(**config), dict(sample=rn(1, 2, 256), return_dict=False)


# --------------------------------------------------------------------- ids gathered from tables
ZIMAGE = dict(
    all_patch_size=(2,),
    all_f_patch_size=(1,),
    in_channels=16,
    dim=16,
    n_layers=1,
    n_refiner_layers=1,
    n_heads=1,
    n_kv_heads=2,
    qk_norm=True,
    cap_feat_dim=16,
    rope_theta=256.0,
    t_scale=1000.0,
    axes_dims=[8, 4, 4],
    axes_lens=[256, 32, 32],
)


@builder("ZImageTransformer2DModel")
def _(rn):
    inputs = dict(x=[rn(16, 1, 8, 8)], cap_feats=[rn(10, 16)], t=torch.tensor([0.5]))
    inputs["return_dict"] = False
    return _diffusers().ZImageTransformer2DModel(**ZIMAGE), inputs


@builder("ZImageControlNetModel")
def _(rn):
    control = dict(ZIMAGE, control_layers_places=[0], control_refiner_layers_places=[0])
    control.update(control_in_dim=16)
    for key in ("in_channels", "n_layers", "cap_feat_dim", "rope_theta", "t_scale"):
        control.pop(key)
    for key in ("axes_dims", "axes_lens"):
        control.pop(key)
    model = _diffusers().ZImageControlNetModel(**control)
    base = _diffusers().ZImageTransformer2DModel(**ZIMAGE)
    model = _diffusers().ZImageControlNetModel.from_transformer(model, base)
    inputs = dict(
        x=[rn(16, 1, 8, 8)],
        t=torch.tensor([0.5]),
        cap_feats=[rn(10, 16)],
        control_context=[rn(16, 1, 8, 8)],
    )
    return model, inputs


@builder("BriaFibo2Transformer2DModel")
def _(rn):
    config = dict(
        in_channels=4,
        patch_size=2,
        dim=32,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=2,
        cap_feat_dim=24,
        injection_layer_ids=(1,),
        perceiver_num_layers=1,
        min_num_gist_tokens=4,
        max_num_gist_tokens=8,
        gist_step=4,
        gist_min_text_len=4,
        gist_max_text_len=16,
        axes_dims=(4, 6, 6),
        axes_lens=(16, 16, 16),
    )
    inputs = dict(
        hidden_states=rn(1, 4, 8, 8),
        timestep=torch.tensor([0.5]),
        encoder_hidden_states=rn(1, 2, 6, 24),
        return_dict=False,
    )
    return _diffusers().BriaFibo2Transformer2DModel(**config), inputs


@builder("Lumina2Transformer2DModel")
def _(rn):
    config = dict(
        sample_size=16,
        patch_size=2,
        in_channels=4,
        hidden_size=24,
        num_layers=2,
        num_refiner_layers=1,
        num_attention_heads=3,
        num_kv_heads=1,
        multiple_of=2,
        ffn_dim_multiplier=None,
        norm_eps=1e-5,
        scaling_factor=1.0,
        axes_dim_rope=(4, 2, 2),
        axes_lens=(128, 128, 128),
        cap_feat_dim=32,
    )
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, 6:] = False  # a padded caption
    inputs = dict(
        hidden_states=rn(2, 4, 8, 8),
        encoder_hidden_states=rn(2, 8, 32),
        timestep=torch.tensor([0.3, 0.6]),
        encoder_attention_mask=mask,
        return_dict=False,
    )
    return _diffusers().Lumina2Transformer2DModel(**config), inputs


# --------------------------------------------------------------------- 2x2 rotation matrices
@builder("HiDreamImageTransformer2DModel")
def _(rn):
    config = dict(
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_channels=[8, 4],
        text_emb_dim=8,
        num_routed_experts=2,
        num_activated_experts=2,
        axes_dims_rope=(4, 2, 2),
        max_resolution=(32, 32),
        llama_layers=(0, 1),
        force_inference_output=True,
    )
    inputs = dict(
        hidden_states=rn(1, 4, 8, 12),
        encoder_hidden_states_t5=rn(1, 8, 8),
        encoder_hidden_states_llama3=rn(2, 1, 8, 4),
        pooled_embeds=rn(1, 8),
        timesteps=torch.tensor([500]),
        return_dict=False,
    )
    return _diffusers().HiDreamImageTransformer2DModel(**config), inputs


@builder("HiDreamImageTransformer2DModel:half_rope")
def _(rn):
    # RoPE over the first half of the head (as the released model's 128 head with 64 rotated):
    # its processor chunks q and k and rotates the first halves.
    model, inputs = BUILDERS["HiDreamImageTransformer2DModel"](rn)
    config = dict(model.config, attention_head_dim=16)
    return type(model)(**{k: v for k, v in config.items() if not k.startswith("_")}), inputs


@builder("QwenImageTransformer2DModel:layered")
def _(rn):
    # Qwen-Image-Layered's RoPE: its last image is the condition, at frame -1.
    config = dict(QWEN, guidance_embeds=False, use_layer3d_rope=True)
    inputs = _qwen_inputs(rn)
    shapes = [[(1, 4, 6), (1, 4, 6), (1, 3, 4)]]
    inputs.update(hidden_states=rn(1, 2 * 24 + 12, 16), img_shapes=shapes)
    return _diffusers().QwenImageTransformer2DModel(**config), inputs


@builder("PRXTransformer2DModel")
def _(rn):
    config = dict(
        in_channels=4,
        patch_size=2,
        context_in_dim=32,
        hidden_size=64,
        mlp_ratio=2.0,
        num_heads=2,
        depth=2,
        axes_dim=[16, 16],
        theta=10_000,
    )
    inputs = dict(
        hidden_states=rn(1, 4, 8, 12),
        encoder_hidden_states=rn(1, 8, 32),
        timestep=torch.tensor([1.0]),
        return_dict=False,
    )
    return _diffusers().PRXTransformer2DModel(**config), inputs


KANDINSKY5 = dict(
    in_visual_dim=4,
    in_text_dim=16,
    in_text_dim2=8,
    time_dim=16,
    out_visual_dim=4,
    patch_size=(1, 2, 2),
    model_dim=32,
    ff_dim=64,
    num_text_blocks=1,
    num_visual_blocks=2,
    axes_dims=(4, 6, 6),
)


@builder("Kandinsky5Transformer3DModel")
def _(rn):
    # Head 16 = 4 + 6 + 6, 2 heads; the pipeline's positions: aranges over the 2 x 3 x 4 latent
    # grid and the 6 text tokens, at its (1, 2, 2) scale (fractional rows and columns).
    model = _diffusers().Kandinsky5Transformer3DModel(**KANDINSKY5)
    inputs = dict(
        hidden_states=rn(1, 2, 6, 8, 4),
        encoder_hidden_states=rn(1, 6, 16),
        timestep=torch.tensor([500.0]),
        pooled_projections=rn(1, 8),
        visual_rope_pos=[torch.arange(n) for n in (2, 3, 4)],
        text_rope_pos=torch.arange(6),
        scale_factor=(1, 2, 2),
        return_dict=False,
    )
    return model, inputs


# --------------------------------------------------------------------- tables from the pipeline
COGVIDEOX = dict(
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    time_embed_dim=2,
    text_embed_dim=8,
    num_layers=2,
    sample_width=8,
    sample_height=8,
    sample_frames=8,
    patch_size=2,
    patch_size_t=None,
    temporal_compression_ratio=4,
    max_text_seq_length=8,
    use_rotary_positional_embeddings=True,
)


def cogvideox_rope(model, height, width, frames):
    """CogVideoXPipeline._prepare_rotary_positional_embeddings on a latent grid: diffusers' own
    cos/sin (crop linspace for 1.0, integer slices for 1.5)."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed
    from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

    config = model.config
    rows, columns = height // config.patch_size, width // config.patch_size
    base_w, base_h = (
        config.sample_width // config.patch_size,
        config.sample_height // config.patch_size,
    )
    if getattr(config, "patch_size_t", None) is None:
        crops = get_resize_crop_region_for_grid((rows, columns), base_w, base_h)
        return get_3d_rotary_pos_embed(config.attention_head_dim, crops, (rows, columns), frames)
    frames = (frames + config.patch_size_t - 1) // config.patch_size_t
    return get_3d_rotary_pos_embed(
        config.attention_head_dim,
        None,
        (rows, columns),
        frames,
        grid_type="slice",
        max_size=(base_h, base_w),
    )


@builder("CogVideoXTransformer3DModel")
def _(rn):
    # A 4 x 6 latent grid of a 4 x 4 base: the crop's rows and columns are fractional.
    model = _diffusers().CogVideoXTransformer3DModel(**COGVIDEOX)
    inputs = dict(
        hidden_states=rn(1, 2, 4, 8, 12),
        encoder_hidden_states=rn(1, 8, 8),
        timestep=torch.tensor([500]),
        image_rotary_emb=cogvideox_rope(model, 8, 12, 2),
        return_dict=False,
    )
    return model, inputs


@builder("CogVideoXTransformer3DModel:1.5")
def _(rn):
    model = _diffusers().CogVideoXTransformer3DModel(**dict(COGVIDEOX, patch_size_t=2))
    inputs = dict(
        hidden_states=rn(1, 2, 4, 8, 8),
        encoder_hidden_states=rn(1, 8, 8),
        timestep=torch.tensor([500]),
        image_rotary_emb=cogvideox_rope(model, 8, 8, 2),
        return_dict=False,
    )
    return model, inputs


@builder("ConsisIDTransformer3DModel")
def _(rn):
    # attention_head_dim a multiple of 16 (the 3-D split); LFE_output_dim 2/3 of the inner dim.
    config = dict(COGVIDEOX, num_attention_heads=3, num_layers=1, cross_attn_interval=1)
    del config["patch_size_t"]
    config.update(is_kps=False, is_train_face=True, cross_attn_dim_head=1, cross_attn_num_heads=1)
    config.update(LFE_id_dim=2, LFE_vit_dim=2, LFE_depth=5, LFE_dim_head=8, LFE_num_heads=2)
    config.update(LFE_num_id_token=1, LFE_num_querie=1, LFE_output_dim=32, LFE_ff_mult=1)
    config.update(LFE_num_scale=1)
    model = _diffusers().ConsisIDTransformer3DModel(**config)
    model.config.patch_size_t = None
    inputs = dict(
        hidden_states=rn(1, 1, 4, 8, 12),
        encoder_hidden_states=rn(1, 8, 8),
        timestep=torch.tensor([500]),
        id_vit_hidden=[torch.ones(1, 2, 2)],
        id_cond=torch.ones(1, 2),
        image_rotary_emb=cogvideox_rope(model, 8, 12, 1),
        return_dict=False,
    )
    return model, inputs


ALLEGRO = dict(
    patch_size=2,
    patch_size_t=1,
    num_attention_heads=2,
    attention_head_dim=12,
    in_channels=4,
    out_channels=4,
    num_layers=2,
    cross_attention_dim=24,
    sample_height=8,
    sample_width=8,
    sample_frames=8,
    caption_channels=8,
)


def allegro_rope(model, frames, rows, columns):
    """AllegroPipeline._prepare_rotary_positional_embeddings on a latent grid (its body, without
    the pipeline): diffusers' three per-axis tables at the grid over the interpolation scales
    (2.2 and 2 by default: fractional coordinates), and the integer grid ``(3, 1, S)``."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed_allegro

    config = model.config
    scales = (
        config.interpolation_scale_t,
        config.interpolation_scale_h,
        config.interpolation_scale_w,
    )
    found = get_3d_rotary_pos_embed_allegro(
        config.attention_head_dim, ((0, 0), (rows, columns)), (rows, columns), frames, scales
    )
    grids = [g.to(dtype=torch.long) for g in found[3:]]
    pos = torch.cartesian_prod(*grids).reshape(-1, 3).transpose(0, 1).reshape(3, 1, -1)
    return tuple(found[:3]), tuple(pos.contiguous())


@builder("AllegroTransformer3DModel")
def _(rn):
    # Head 12: thirds of 4 features, 2 planes each; a 3 x 4 x 6 latent grid.
    model = _diffusers().AllegroTransformer3DModel(**ALLEGRO)
    inputs = dict(
        hidden_states=rn(1, 4, 3, 8, 12),
        encoder_hidden_states=rn(1, 8, 8),
        timestep=torch.tensor([500]),
        image_rotary_emb=allegro_rope(model, 3, 4, 6),
        return_dict=False,
    )
    return model, inputs


HUNYUAN_DIT = dict(
    sample_size=8,
    patch_size=2,
    in_channels=4,
    num_layers=2,
    attention_head_dim=8,
    num_attention_heads=2,
    cross_attention_dim=8,
    cross_attention_dim_t5=8,
    pooled_projection_dim=4,
    hidden_size=16,
    text_len=4,
    text_len_t5=4,
    activation_fn="gelu-approximate",
)


def hunyuan_dit_rope(rows, columns, base):
    """HunyuanDiTPipeline's RoPE: a crop of a ``base`` grid (fractional steps when the grid is
    larger than the base, as at the default 1024 pixels)."""
    from diffusers.models.embeddings import get_2d_rotary_pos_embed
    from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import get_resize_crop_region_for_grid

    crops = get_resize_crop_region_for_grid((rows, columns), base)
    return get_2d_rotary_pos_embed(8, crops, (rows, columns))


def _hunyuan_dit_inputs(rn):
    meta = torch.tensor([[1024, 1024, 64, 64, 0, 0]], dtype=torch.float32)
    return dict(
        hidden_states=rn(1, 4, 8, 12),
        timestep=torch.tensor([500.0]),
        encoder_hidden_states=rn(1, 4, 8),
        text_embedding_mask=torch.ones(1, 4),
        encoder_hidden_states_t5=rn(1, 4, 8),
        text_embedding_mask_t5=torch.ones(1, 4),
        image_meta_size=meta,
        style=torch.zeros(1, dtype=torch.long),
        image_rotary_emb=hunyuan_dit_rope(4, 6, 3),
        return_dict=False,
    )


@builder("HunyuanDiT2DModel")
def _(rn):
    return _diffusers().HunyuanDiT2DModel(**HUNYUAN_DIT), _hunyuan_dit_inputs(rn)


@builder("HunyuanDiT2DControlNetModel")
def _(rn):
    # The controlnet builds transformer_num_layers // 2 - 1 blocks.
    config = dict(HUNYUAN_DIT, conditioning_channels=3, transformer_num_layers=6)
    for key in ("num_layers", "activation_fn"):
        del config[key]
    inputs = _hunyuan_dit_inputs(rn)
    inputs["controlnet_cond"] = rn(1, 4, 8, 12)  # the pipeline passes the control image's latents
    return _diffusers().HunyuanDiT2DControlNetModel(**config), inputs


@builder("HunyuanDiT2DMultiControlNetModel")
def _(rn):
    inner, inputs = BUILDERS["HunyuanDiT2DControlNetModel"](rn)
    inputs.update(controlnet_cond=[inputs["controlnet_cond"]], conditioning_scale=[1.0])
    return _diffusers().HunyuanDiT2DMultiControlNetModel([inner]), inputs


@builder("EasyAnimateTransformer3DModel")
def _(rn):
    config = dict(
        attention_head_dim=16,
        num_attention_heads=2,
        in_channels=4,
        mmdit_layers=2,
        num_layers=2,
        out_channels=4,
        patch_size=2,
        sample_height=60,
        sample_width=90,
        text_embed_dim=16,
        time_embed_dim=8,
        time_position_encoding_type="3d_rope",
        timestep_activation_fn="silu",
    )
    # A 4 x 6 grid crops its 30 x 45 base: fractional coordinates.
    inputs = dict(
        hidden_states=rn(1, 4, 2, 8, 12),
        timestep=torch.tensor([500]),
        timestep_cond=None,
        encoder_hidden_states=rn(1, 8, 16),
        encoder_hidden_states_t5=None,
        inpaint_latents=None,
        control_latents=None,
        return_dict=False,
    )
    return _diffusers().EasyAnimateTransformer3DModel(**config), inputs


@builder("StableAudioDiTModel")
def _(rn):
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    config = dict(
        sample_size=16,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        num_key_value_attention_heads=1,
        out_channels=4,
        cross_attention_dim=8,
        time_proj_dim=8,
        global_states_input_dim=8,
        cross_attention_input_dim=8,
    )
    frames = 16
    # StableAudioPipeline: half the head, the latent frames and one global token.
    rope = get_1d_rotary_pos_embed(4, frames + 1, use_real=True, repeat_interleave_real=False)
    inputs = dict(
        hidden_states=rn(1, 4, frames),
        timestep=torch.tensor([500]),
        encoder_hidden_states=rn(1, 6, 8),
        global_hidden_states=rn(1, 1, 8),
        rotary_embedding=rope,
        return_dict=False,
    )
    return _diffusers().StableAudioDiTModel(**config), inputs


# --------------------------------------------------------------------- LTX-Video's coordinates
LTX = dict(
    in_channels=4,
    out_channels=4,
    num_attention_heads=2,
    attention_head_dim=8,
    cross_attention_dim=16,
    num_layers=1,
    qk_norm="rms_norm_across_heads",
    caption_channels=16,
)


def _ltx_inputs(rn, **more):
    frames, height, width = 2, 4, 4
    inputs = dict(
        hidden_states=rn(1, frames * height * width, 4),
        encoder_hidden_states=rn(1, 6, 16),
        timestep=torch.tensor([500]),
        encoder_attention_mask=torch.ones(1, 6).bool(),
        num_frames=frames,
        height=height,
        width=width,
        rope_interpolation_scale=(torch.tensor(8 / 25.0), 32, 32),  # as LTXPipeline's
        return_dict=False,
    )
    inputs.update(more)
    return inputs


@builder("LTXVideoTransformer3DModel")
def _(rn):
    # inner dim 16: 16 % 6 = 4, so two still planes lead (LTX-Video's 2048 has one).
    return _diffusers().LTXVideoTransformer3DModel(**LTX), _ltx_inputs(rn)


@builder("LTXVideoTransformer3DModel:video_coords")
def _(rn):
    # Coordinates from the caller (the condition pipeline's), per token and fractional.
    coords = torch.rand(1, 3, 32, generator=rn.generator) * torch.tensor([20.0, 64, 64])[:, None]
    model = _diffusers().LTXVideoTransformer3DModel(
        **dict(LTX, attention_head_dim=6, cross_attention_dim=12)
    )
    return model, _ltx_inputs(rn, video_coords=coords, rope_interpolation_scale=None)


# --------------------------------------------------------------------- OmniGen's su-scaled RoPE
def _omnigen(rn, original):
    config = dict(
        hidden_size=16,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=32,
        num_layers=2,
        pad_token_id=0,
        vocab_size=1000,
        in_channels=4,
        time_step_dim=4,
        max_position_embeddings=64,
        original_max_position_embeddings=original,
        rope_scaling={"long_factor": [1.0, 2.0], "short_factor": [1.0, 1.5]},
    )
    text, rows, columns = 8, 8, 8
    length = text + 1 + rows * columns // 4
    inputs = dict(
        hidden_states=rn(1, 4, rows, columns),
        timestep=torch.tensor([0.3]),
        input_ids=torch.arange(1, text + 1)[None],
        input_img_latents=[],
        input_image_sizes={},
        attention_mask=torch.ones(1, length, length),
        position_ids=torch.arange(length)[None],
        return_dict=False,
    )
    return _diffusers().OmniGenTransformer2DModel(**config), inputs


@builder("OmniGenTransformer2DModel")
def _(rn):
    return _omnigen(rn, original=32)  # 25 positions: the short factors


@builder("OmniGenTransformer2DModel:long")
def _(rn):
    return _omnigen(rn, original=16)  # past the original length: the long factors, scaled


# --------------------------------------------------------------------- Wan-style (video grid)
WAN = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=12,
    in_channels=4,
    out_channels=4,
    text_dim=16,
    freq_dim=256,
    ffn_dim=32,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=32,
)


def _wan_inputs(rn, channels=4, frames=2, text_dim=16):
    return dict(
        hidden_states=rn(1, channels, frames, 8, 8),
        timestep=torch.tensor([500]),
        encoder_hidden_states=rn(1, 6, text_dim),
        return_dict=False,
    )


@builder("WanTransformer3DModel")
def _(rn):
    return _diffusers().WanTransformer3DModel(**WAN), _wan_inputs(rn, frames=3)


@builder("SkyReelsV2Transformer3DModel")
def _(rn):
    return _diffusers().SkyReelsV2Transformer3DModel(**WAN), _wan_inputs(rn)


@builder("ChronoEditTransformer3DModel")
def _(rn):
    config = dict(WAN, in_channels=16, out_channels=16, attention_head_dim=12, text_dim=32)
    config.update(freq_dim=16, rope_max_seq_len=64, rope_temporal_skip_len=8)
    # Two frames: ChronoEdit's edit pair, at frame positions 0 and temporal_skip_len - 1.
    inputs = _wan_inputs(rn, channels=16, text_dim=32)
    inputs["encoder_hidden_states_image"] = None
    return _diffusers().ChronoEditTransformer3DModel(**config), inputs


@builder("WanVACETransformer3DModel")
def _(rn):
    config = dict(WAN, in_channels=16, out_channels=16, text_dim=32, num_layers=4)
    config.update(vace_layers=[0, 2], vace_in_channels=48)
    inputs = _wan_inputs(rn, channels=16, text_dim=32)
    inputs["control_hidden_states"] = rn(1, 48, 2, 8, 8)
    return _diffusers().WanVACETransformer3DModel(**config), inputs


@builder("WanAnimateTransformer3DModel")
def _(rn):
    config = dict(WAN, in_channels=12, latent_channels=4, image_dim=16, motion_encoder_size=16)
    config.update(
        motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16},
        motion_style_dim=8,
        motion_dim=4,
        motion_encoder_dim=16,
        face_encoder_hidden_dim=16,
        face_encoder_num_heads=2,
        inject_face_latents_blocks=2,
    )
    # F + 1 latent frames and face frames that its face encoder's strides divide into F
    # motion tokens (diffusers' test: 20 and 77; 4 and 13 are the smallest that run).
    frames = 4
    inputs = _wan_inputs(rn, channels=12, frames=frames + 1)
    inputs.update(
        encoder_hidden_states_image=rn(1, 4, 16),
        pose_hidden_states=rn(1, 4, frames, 8, 8),
        face_pixel_values=rn(1, 3, 13, 16, 16),
    )
    return _diffusers().WanAnimateTransformer3DModel(**config), inputs


@builder("SanaVideoTransformer3DModel")
def _(rn):
    config = dict(
        in_channels=16,
        out_channels=16,
        num_attention_heads=2,
        attention_head_dim=12,
        num_layers=2,
        num_cross_attention_heads=2,
        cross_attention_head_dim=12,
        cross_attention_dim=24,
        caption_channels=16,
        mlp_ratio=2.5,
        sample_size=8,
        patch_size=(1, 2, 2),
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )
    return _diffusers().SanaVideoTransformer3DModel(**config), _wan_inputs(rn, channels=16)


# --------------------------------------------------------------------- building and outputs
def _wake_zero_weights(model, seed):
    """Give the weights diffusers initialises to zero (controlnets' output projections, adaLN
    gates) small random values, so that every block contributes to the output the tests
    compare."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() and not parameter.any():
                parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))


def recipes(classes):
    """The builders of ``classes``: each class's own, and its variants (``Class:variant``)."""
    return [name for name in BUILDERS if name.split(":")[0] in classes]


def build(name, seed=0):
    """``(model, inputs)`` of one recipe (a class, or ``Class:variant``), weights seeded, in eval
    mode."""
    torch.manual_seed(seed)
    model, inputs = BUILDERS[name](_Inputs(seed))
    _wake_zero_weights(model, seed)
    return model.eval(), inputs


def flat(output):
    """Every tensor of a model's output, flattened into one float tensor."""
    if isinstance(output, torch.Tensor):
        return output.reshape(-1)
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        parts = [flat(o) for o in output if o is not None and not isinstance(o, (int, float))]
        parts = [p for p in parts if p is not None and p.numel()]
        dtype = torch.float64 if any(p.dtype == torch.float64 for p in parts) else torch.float32
        return torch.cat([p.to(dtype) for p in parts])
    return None


def _cast(value, dtype):
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_cast(v, dtype) for v in value)
    return value


class _Float64(TorchFunctionMode):
    """Where diffusers asks for float32 whatever the model's dtype (``dtype=torch.float32``,
    ``.float()``, ``.to(torch.float32)``: timestep projections, norms, RoPE angles), float64."""

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        elif func is torch.Tensor.to:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        return func(*args, **kwargs)


def float64_output(model, inputs):
    """The model's output computed in float64, the reference of the precision tests: a copy of
    the model cast to float64, every module's floating inputs upcast on the way in, and every
    float32 that diffusers asks for made float64 (:class:`_Float64`)."""
    reference = copy.deepcopy(model).double()
    handle = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, args: tuple(_cast(a, torch.float64) for a in args)
    )
    try:
        with torch.no_grad(), _Float64():
            return flat(reference(**cast_inputs(inputs, torch.float64))).double()
    finally:
        handle.remove()


def cast_inputs(inputs, dtype):
    """``inputs`` with every floating tensor (also inside lists and tuples) cast to ``dtype``."""
    return {k: _cast(v, dtype) for k, v in inputs.items()}


# --------------------------------------------------------------------- what diffusers has
# A model file applies RoPE when it names a rotary embedding or RoPE (word boundaries, so that
# "property" does not count).
_ROPE_MARK = re.compile(r"rotary|\brope\b|_rope\b|\brope_|freqs_cis|RoPE")


def rope_model_classes():
    """``{class name: module}`` of every ``ModelMixin`` class of the installed diffusers whose
    module applies RoPE: the modules under ``diffusers/models`` and the model files of
    ``diffusers/pipelines`` (not the ``pipeline_*.py`` files), read as text first and imported
    only when they define a model and mention RoPE."""
    import diffusers
    from diffusers.models.modeling_utils import ModelMixin

    root = pathlib.Path(diffusers.__file__).parent
    found = {}
    for part in ("models", "pipelines"):
        for path in sorted((root / part).rglob("*.py")):
            if part == "pipelines" and path.name.startswith("pipeline_"):
                continue
            text = path.read_text(encoding="utf-8")
            if "ModelMixin" not in text or not _ROPE_MARK.search(text):
                continue
            name = "diffusers." + ".".join(path.relative_to(root).with_suffix("").parts)
            module = importlib.import_module(name)
            for class_name, cls in vars(module).items():
                if (
                    inspect.isclass(cls)
                    and issubclass(cls, ModelMixin)
                    and cls.__module__ == name
                    and cls.__name__ not in ("ModelMixin", "LegacyModelMixin")
                ):
                    found[class_name] = name
    return found


# --------------------------------------------------------------------- a whole tiny pipeline
def _clip_tokenizer(directory):
    """A CLIP tokenizer over a written vocabulary (a-z, with and without ``</w>``) and no merges:
    no download."""
    import json

    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for code in range(ord("a"), ord("z") + 1):
        vocab.setdefault(chr(code), len(vocab))
        vocab.setdefault(chr(code) + "</w>", len(vocab))
    with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f)
    with open(os.path.join(directory, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
    return CLIPTokenizer(
        os.path.join(directory, "vocab.json"),
        os.path.join(directory, "merges.txt"),
        pad_token="<|endoftext|>",
        model_max_length=77,
    )


def _t5_tokenizer():
    """A one-token-per-letter T5 tokenizer built in memory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "</s>", "<unk>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=512,
    )


def flux_pipeline(directory, seed=0):
    """A whole FluxPipeline, every component tiny and built from a config (CLIP and T5 text
    encoders with tokenizers made here, a one-channel VAE), all in eval mode: no download."""
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    diffusers = _diffusers()
    torch.manual_seed(seed)
    transformer = diffusers.FluxTransformer2DModel(**FLUX)
    clip = CLIPTextConfig(
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        hidden_size=32,
        intermediate_size=37,
        num_attention_heads=4,
        num_hidden_layers=2,
        vocab_size=64,
        projection_dim=32,
        max_position_embeddings=77,
    )
    t5 = T5Config(
        vocab_size=32,
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    vae = diffusers.AutoencoderKL(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(4,),
        layers_per_block=1,
        latent_channels=1,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )
    encoders = (CLIPTextModel(clip), T5EncoderModel(t5))
    for module in (transformer, vae) + encoders:
        module.eval()  # built from a config, so in training mode (T5's dropout) until now
    return diffusers.FluxPipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=encoders[0],
        tokenizer=_clip_tokenizer(directory),
        text_encoder_2=encoders[1],
        tokenizer_2=_t5_tokenizer(),
        transformer=transformer,
    )


def sample(pipeline, steps=3):
    """The latents after ``steps`` sampling steps of a 32 x 32 image."""
    generator = torch.Generator().manual_seed(0)
    return pipeline(
        prompt="a squirrel eating a burger",
        generator=generator,
        num_inference_steps=steps,
        guidance_scale=5.0,
        height=32,
        width=32,
        max_sequence_length=16,
        output_type="latent",
    ).images


def cogvideox_pipeline(seed=0):
    """A whole CogVideoXPipeline (CogVideoX 1.0: no temporal patch), tiny: a T5 encoder with the
    tokenizer made here, a small 3-D VAE, all in eval mode; a 1 x 1 base grid, so that a 2 x 3
    latent grid takes fractional crop coordinates."""
    from transformers import T5Config, T5EncoderModel

    diffusers = _diffusers()
    torch.manual_seed(seed)
    transformer = diffusers.CogVideoXTransformer3DModel(
        **dict(COGVIDEOX, num_attention_heads=4, text_embed_dim=32, sample_width=2, sample_height=2)
    )
    blocks = 4
    vae = diffusers.AutoencoderKLCogVideoX(
        in_channels=3,
        out_channels=3,
        down_block_types=("CogVideoXDownBlock3D",) * blocks,
        up_block_types=("CogVideoXUpBlock3D",) * blocks,
        block_out_channels=(8,) * blocks,
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=2,
        temporal_compression_ratio=4,
    )
    t5 = T5Config(
        vocab_size=32,
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    encoder = T5EncoderModel(t5)
    for module in (transformer, vae, encoder):
        module.eval()
    return diffusers.CogVideoXPipeline(
        tokenizer=_t5_tokenizer(),
        text_encoder=encoder,
        vae=vae,
        transformer=transformer,
        scheduler=diffusers.CogVideoXDDIMScheduler(),
    )


def sample_video(pipeline, steps=2):
    generator = torch.Generator().manual_seed(0)
    return pipeline(
        prompt="dance monkey",
        generator=generator,
        num_inference_steps=steps,
        guidance_scale=6.0,
        height=32,
        width=48,
        num_frames=5,
        max_sequence_length=16,
        output_type="latent",
    ).frames
