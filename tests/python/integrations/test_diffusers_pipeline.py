# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.diffusers.patch on a whole pipeline, and the states a patch meets.

* A tiny FluxPipeline (every component built from a config, tokenizers made in the test, all in
  eval mode) samples 3 steps patched and unpatched to the same latents; ``patch(pipeline)``
  patches its transformer and leaves its text encoders and VAE alone.
* Refusals: an unknown class, a refused class (naming its reason), the meta device, something
  that is neither a model nor a pipeline, a pipeline with no RoPE model; a pipeline with a
  refused RoPE component is left wholly unpatched.
* A processor replaced after patch (``set_attn_processor``) makes ``is_patched`` false, and patch
  then patches again; unpatch leaves such a processor alone.
* FLUX-style ids that are not integers (diffusers' own tests draw them at random) rotate exactly
  through token tables built once; tables grow past ``max_positions`` in eager mode; a cast to
  bf16 keeps them float32.
* Pipelines that build their transformer's RoPE (CogVideoX, HunyuanDiT, Stable Audio, Allegro)
  hand it positions once patched; Kandinsky 5's positions follow its sparse-attention block order.
"""

import copy

import pytest
import torch

pytest.importorskip("diffusers", reason="diffusers is not installed")

import diffusers_models as dm  # noqa: E402
from test_diffusers import counted_run, run  # noqa: E402

import torch_rope.diffusers as trd  # noqa: E402


def test_a_tiny_flux_pipeline_samples_the_same_latents_patched(tmp_path):
    pipeline = dm.flux_pipeline(str(tmp_path))
    want = dm.sample(pipeline)
    assert torch.equal(want, dm.sample(pipeline)), "the unpatched pipeline is not deterministic"
    assert trd.patch(pipeline) is pipeline
    assert trd.is_patched(pipeline) and trd.is_patched(pipeline.transformer)
    assert not hasattr(pipeline.vae, "_torch_rope_patch")
    got = dm.sample(pipeline)
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
    trd.unpatch(pipeline)
    assert not trd.is_patched(pipeline)
    assert torch.equal(dm.sample(pipeline), want)


def test_an_unknown_class_and_a_non_model_are_refused():
    vae = dm._diffusers().AutoencoderKL(block_out_channels=(4,), norm_num_groups=1)
    with pytest.raises(NotImplementedError, match="'AutoencoderKL' is not supported: not one of"):
        trd.patch(vae)
    with pytest.raises(TypeError, match="expected a diffusers model"):
        trd.patch(object())


def _mochi():
    config = dict(patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=1)
    config.update(pooled_projection_dim=16, in_channels=4, text_embed_dim=16, time_embed_dim=4)
    return dm._diffusers().MochiTransformer3DModel(**config)


def test_a_refused_class_is_refused_naming_why():
    with pytest.raises(NotImplementedError, match="'MochiTransformer3DModel'.*learned parameter"):
        trd.patch(_mochi())


class _Pipeline:
    def __init__(self, **components):
        self.components = components


def test_a_pipeline_with_a_refused_rope_model_is_left_unpatched():
    flux, _ = dm.build("FluxTransformer2DModel")
    pipeline = _Pipeline(transformer=flux, transformer_2=_mochi())
    with pytest.raises(NotImplementedError, match="MochiTransformer3DModel"):
        trd.patch(pipeline)
    assert not trd.is_patched(flux) and not any(hasattr(m, "torch_rope") for m in flux.modules())


def test_a_pipeline_without_rope_models_is_refused():
    vae = dm._diffusers().AutoencoderKL(block_out_channels=(4,), norm_num_groups=1)
    with pytest.raises(ValueError, match="no component that applies RoPE.*vae"):
        trd.patch(_Pipeline(vae=vae, scheduler=None))


def test_a_model_on_the_meta_device_is_refused():
    with torch.device("meta"):
        model = dm._diffusers().FluxTransformer2DModel(**dm.FLUX)
    with pytest.raises(ValueError, match="meta device"):
        trd.patch(model)
    assert not trd.is_patched(model)


def test_a_subclass_of_a_supported_class_is_patched_as_that_class():
    model, inputs = dm.build("WanTransformer3DModel")
    subclass = type("MyWan", (type(model),), {})
    mine = copy.deepcopy(model)
    mine.__class__ = subclass
    want = run(model, inputs)
    trd.patch(mine)
    assert trd.is_patched(mine)
    assert (run(mine, inputs) - want).abs().max().item() <= 1e-5


def test_a_processor_replaced_after_patch_is_seen_and_left_alone():
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

    model, inputs = dm.build("FluxTransformer2DModel")
    want = run(model, inputs)
    trd.patch(model)
    with pytest.warns(UserWarning, match="is being replaced"):  # the patch is undone
        model.set_attn_processor(FluxAttnProcessor())  # e.g. loading IP adapters, fusing QKV
    assert not trd.is_patched(model)
    trd.patch(model)  # patches again, from scratch
    assert trd.is_patched(model)
    assert (run(model, inputs) - want).abs().max().item() <= 1e-5
    replaced = FluxAttnProcessor()
    first = next(iter(model.attn_processors))
    with pytest.warns(UserWarning, match="is being replaced"):
        model.set_attn_processor({**model.attn_processors, first: replaced})
    trd.unpatch(model)
    assert model.attn_processors[first] is replaced
    # The others got the patched model's own processors back: patched again, as diffusers'.
    assert (run(model, inputs) - want).abs().max().item() <= 1e-5
    trd.patch(model)
    assert trd.is_patched(model)
    assert (run(model, inputs) - want).abs().max().item() <= 1e-5


def test_fractional_ids_take_token_tables_built_once():
    """diffusers' own FLUX tests pass random float ids: the patched model matches, and the second
    forward builds no cos/sin (the token tables are kept)."""
    model, inputs = dm.build("FluxTransformer2DModel")
    generator = torch.Generator().manual_seed(3)
    inputs.update(
        img_ids=torch.randn(16, 3, generator=generator),
        txt_ids=torch.randn(8, 3, generator=generator),
    )
    want = run(model, inputs)
    patched = trd.patch(copy.deepcopy(model))
    assert (run(patched, inputs) - want).abs().max().item() <= 1e-5
    got, counter = counted_run(patched, inputs)
    assert (got - want).abs().max().item() <= 1e-5
    assert counter.count("trig", inside=True) == 0
    assert counter.count("rope") > 0


def test_tables_grow_past_max_positions_in_eager_mode_and_stay_float32():
    model, inputs = dm.build("FluxTransformer2DModel")
    image = dm.grid_ids(4, 4)
    image[:, 1:] += 40  # rows and columns 40..43, past the 8 positions asked for
    inputs["img_ids"] = image
    want = run(model, inputs)
    patched = trd.patch(copy.deepcopy(model), max_positions=8)
    tables = patched.pos_embed.torch_rope
    assert tables.cos.size(0) == 8
    assert (run(patched, inputs) - want).abs().max().item() <= 1e-5
    assert tables.cos.size(0) >= 44
    patched.to(torch.bfloat16)
    assert tables.cos.dtype == torch.float32 and tables.sin.dtype == torch.float32


def test_max_positions_must_be_a_positive_int():
    model, _ = dm.build("FluxTransformer2DModel")
    with pytest.raises(ValueError, match="max_positions must be an int >= 1, got 0"):
        trd.patch(model, max_positions=0)
    assert not trd.is_patched(model)


def test_a_cogvideox_pipeline_hands_its_transformer_coordinate_positions():
    """CogVideoX 1.0's pipeline builds cos/sin from a crop of its base grid, fractional here:
    patched, its helper returns grid indices into float64-built coordinate tables of the
    transformer instead, and 2 sampling steps give the same latents."""
    pipeline = dm.cogvideox_pipeline()
    pipeline.set_progress_bar_config(disable=True)
    want = dm.sample_video(pipeline)
    trd.patch(pipeline)
    assert "_prepare_rotary_positional_embeddings" in vars(pipeline)
    rows, _ = pipeline._prepare_rotary_positional_embeddings(32, 48, 2, torch.device("cpu"))
    assert rows.dtype == torch.long and rows.shape == (2 * 2 * 3, 3)
    got = dm.sample_video(pipeline)
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
    trd.unpatch(pipeline)
    assert "_prepare_rotary_positional_embeddings" not in vars(pipeline)
    assert torch.equal(dm.sample_video(pipeline), want)


def test_hunyuan_dit_positions_at_the_default_resolution_match_diffusers():
    """At 1024 pixels HunyuanDiT's grid (64 x 64 at patch 2) crops a 32 x 32 base: coordinates
    0, 0.5, 1, ... The coordinate tables patch builds for them rotate as diffusers' own cos/sin
    (columns on the first planes)."""
    from diffusers.models.embeddings import apply_rotary_emb, get_2d_rotary_pos_embed
    from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import get_resize_crop_region_for_grid

    from torch_rope.diffusers.families import caller_tables
    from torch_rope.diffusers.rotate import embeddings_apply

    model, _ = dm.build("HunyuanDiT2DModel")
    tables = caller_tables.make_tables(model, "hunyuandit", torch.device("cpu"))
    crops = get_resize_crop_region_for_grid((64, 64), 32)
    want_freqs = get_2d_rotary_pos_embed(8, crops, (64, 64))
    positions = caller_tables.hunyuandit_positions(tables, 8, crops, (64, 64))
    q = torch.randn(1, 2, 64 * 64, 8, generator=torch.Generator().manual_seed(0))
    want = apply_rotary_emb(q.double(), tuple(f.double() for f in want_freqs))
    got = embeddings_apply(tables, q, positions)
    assert (got.double() - want).abs().max().item() <= 1e-5


def test_hunyuan_dit_and_stable_audio_pipelines_get_their_call_rebuilt():
    """Their pipelines build the RoPE inline in ``__call__``: patched, the pipeline is a
    same-named subclass whose ``__call__`` (still under torch.no_grad) calls torch_rope's
    function in place of diffusers', and unpatch gives the instance its class back."""
    import functools

    import diffusers

    from torch_rope.diffusers.families import caller_tables

    for pipeline_class, name, recipe in [
        (diffusers.HunyuanDiTPipeline, "get_2d_rotary_pos_embed", "HunyuanDiT2DModel"),
        (diffusers.StableAudioPipeline, "get_1d_rotary_pos_embed", "StableAudioDiTModel"),
    ]:
        model, _ = dm.build(recipe)
        trd.patch(model)
        pipeline = object.__new__(pipeline_class)
        record = model._torch_rope_patch
        row = trd.registry.REGISTRY.row(recipe)
        assert caller_tables.patch_pipeline(pipeline, [model], row, record, record.patcher)
        installed = type(pipeline)
        assert installed is not pipeline_class and installed.__name__ == pipeline_class.__name__
        function = installed.__call__.__wrapped__.__globals__[name]
        assert isinstance(function, functools.partial)
        assert function.args[0].tables == [model.torch_rope_tables]
        trd.unpatch(model)
        assert type(pipeline) is pipeline_class


def test_an_allegro_pipeline_hands_its_transformer_rows_of_coordinate_tables():
    """Allegro's pipeline builds three per-axis tables at the grid over its interpolation scales
    (frames / 2.2, rows and columns / 2: fractional): patched, its helper returns each token's
    row, on each axis, of one float64-built table of the three axes' coordinates, and the
    transformer rotates with it as with diffusers' own helper's tables; unpatch removes it."""
    import diffusers

    from torch_rope.diffusers.families import axis_chunks

    model, inputs = dm.build("AllegroTransformer3DModel")
    pipeline = object.__new__(diffusers.AllegroPipeline)
    vars(pipeline).update(vae_scale_factor_spatial=8, transformer=model)
    frames, rows, columns = inputs["hidden_states"].shape[2:]
    size = (1, rows * 8, columns * 8, frames, torch.device("cpu"))  # pixels: 8x the latents
    theirs = diffusers.AllegroPipeline._prepare_rotary_positional_embeddings(pipeline, *size)
    want = run(model, dict(inputs, image_rotary_emb=theirs))

    trd.patch(model)
    record = model._torch_rope_patch
    row = trd.registry.REGISTRY.row("AllegroTransformer3DModel")
    assert axis_chunks.patch_pipeline(pipeline, [model], row, record, record.patcher)
    ours = pipeline._prepare_rotary_positional_embeddings(*size)
    tokens = frames * (rows // 2) * (columns // 2)
    assert all(r.dtype == torch.long and r.shape == (1, tokens) for r in ours[0])
    got, counter = counted_run(model, dict(inputs, image_rotary_emb=ours))
    assert counter.count("rope") > 0
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
    trd.unpatch(model)
    assert "_prepare_rotary_positional_embeddings" not in vars(pipeline)
    assert torch.equal(run(model, dict(inputs, image_rotary_emb=theirs)), want)


def test_kandinsky5_positions_follow_its_sparse_attention_block_order():
    """With sparse attention (``to_fractal``) Kandinsky 5 reorders the video tokens into 8 x 8
    blocks, its RoPE matrices with them: the patched RoPE's positions go through the same
    reordering and rotate each token as its matrix does (the rotation written here, before the
    bf16 rounding both apply)."""
    from diffusers.models.transformers.transformer_kandinsky import fractal_flatten
    from test_diffusers import NoBf16Rounding

    from torch_rope.diffusers.families import rounded_pairs

    model, _ = dm.build("Kandinsky5Transformer3DModel")
    rope = model.visual_rope_embeddings
    shape, scales = (1, 2, 16, 8), (1, 2, 2)
    pos = [torch.arange(n) for n in shape[1:]]
    theirs = rope(shape, pos, scales)
    trd.patch(model)
    ours = rope(shape, pos, scales)
    assert ours.dtype == torch.long
    hidden = torch.zeros(*shape, 1)
    theirs = fractal_flatten(hidden, theirs, shape, block_mask=True)[1]
    ours = fractal_flatten(hidden, ours, shape, block_mask=True)[1]
    q = torch.randn(1, 16 * 16, 2, 16, generator=torch.Generator().manual_seed(0))
    want = (theirs * q.reshape(*q.shape[:-1], -1, 1, 2)).sum(-1).reshape(q.shape)
    with NoBf16Rounding():
        got = rounded_pairs.rounded_apply(rope.torch_rope, q, ours)
    assert (got - want).abs().max().item() <= 1e-5
    assert torch.equal(rounded_pairs.rounded_apply(rope.torch_rope, q, ours), got.bfloat16())
