# SPDX-License-Identifier: BSD-3-Clause
"""The public API, pinned: every public name of ``torch_rope`` and of its public modules, and every
``torch.ops.rope`` overload with its schema. Moving code between files must leave both as they
are; a name or an overload added, renamed or dropped on purpose is written down here.

A module's public names are its ``__all__`` where it declares one; otherwise the names ``dir()``
shows without a leading underscore, less the modules and what other packages define (``torch``,
``Tensor``, ``Optional``: names the module uses, not names of its own).
"""

import importlib
import re
import types

import pytest
import torch

import torch_rope  # noqa: F401  (registers torch.ops.rope)


def public_names(module) -> list:
    if hasattr(module, "__all__"):
        return sorted(module.__all__)
    names = []
    for name in dir(module):
        value = getattr(module, name)
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        owner = getattr(value, "__module__", None)
        if isinstance(owner, str) and owner.split(".")[0] != "torch_rope":
            continue
        names.append(name)
    return sorted(names)


PUBLIC = {
    "torch_rope": [
        "RotaryPositionalEmbedding",
        "__version__",
        "apply",
        "apply_",
        "apply_qk",
        "apply_qk_cache",
        "apply_qk_fp8",
        "apply_qk_fp8_dynamic",
        "cmake_prefix_path",
        "compiled_with_cuda",
        "distributed",
        "eager",
        "mla_apply_cache",
        "rms_norm_apply_qk",
        "rms_norm_apply_qk_cache",
        "rope_frequencies",
        "rope_tables",
        "rope_tables_from_inv_freq",
        "vision",
    ],
    "torch_rope.ops": [
        "apply",
        "apply_",
        "apply_qk",
        "apply_qk_cache",
        "apply_qk_fp8",
        "apply_qk_fp8_dynamic",
        "eager_fast_path",
        "mla_apply_cache",
        "rms_norm_apply_qk",
        "rms_norm_apply_qk_cache",
        "rope_tables",
    ],
    "torch_rope.compat": [
        "apply_llama31_rope",
        "apply_llama31_rope_inplace",
        "apply_llama31_rope_pos_ids",
        "apply_llama31_rope_pos_ids_inplace",
        "apply_rope",
        "apply_rope_inplace",
        "apply_rope_pos_ids",
        "apply_rope_pos_ids_inplace",
        "apply_rope_with_cos_sin_cache",
        "apply_rope_with_cos_sin_cache_inplace",
        "apply_rotary_emb",
        "apply_rotary_pos_emb",
        "concat_and_cache_mla",
        "mla_rope_quantize_fp8",
        "rope_quantize_fp8",
        "rope_quantize_fp8_append_paged_kv_cache",
        "rotary_embedding",
    ],
    "torch_rope.nn": [
        "CALL_HOOK_REGISTRIES",
        "RotaryPositionalEmbedding",
        "apply",
        "apply_keeping_table_dtypes",
        "as_dtensors_like",
        "check_module_input",
        "eager_fast_path",
        "long_rope_positions",
        "module_positions",
        "parse_scaling",
    ],
    "torch_rope.functional": [
        "RotaryEmbedding",
        "rotary_embedding",
    ],
    "torch_rope.distributed": [
        "register_sharding_rules",
    ],
    "torch_rope.vision": [
        "axes_inv_freq",
        "axes_tables",
        "axial_inv_freq",
        "flux_ids",
        "grid_positions",
        "patch_positions",
    ],
    "torch_rope.eager": [
        "apply",
        "apply_qk",
    ],
}


SCHEMAS = {
    "apply.default": (
        "rope::apply(Tensor x, Tensor cos, Tensor sin, Tensor positions, *, "
        "bool interleaved=True, bool inverse=False, int[]? mrope_section=None, "
        "bool mrope_interleaved=False) -> Tensor"
    ),
    "apply.freqs": (
        "rope::apply.freqs(Tensor x, Tensor freqs, Tensor positions, *, "
        "float attention_factor=1., bool interleaved=True, bool inverse=False, "
        "int[]? mrope_section=None, bool mrope_interleaved=False) -> Tensor"
    ),
    "apply.freqs_out": (
        "rope::apply.freqs_out(Tensor x, Tensor freqs, Tensor positions, *, "
        "float attention_factor=1., bool interleaved=True, bool inverse=False, "
        "int[]? mrope_section=None, bool mrope_interleaved=False, Tensor(a!) out) -> ()"
    ),
    "apply.freqs_varlen": (
        "rope::apply.freqs_varlen(Tensor x, Tensor freqs, Tensor cu_seqlens, *, "
        "Tensor? seq_offsets=None, int cp_size=1, int cp_rank=0, float attention_factor=1., "
        "bool interleaved=True, bool inverse=False) -> Tensor"
    ),
    "apply.freqs_varlen_out": (
        "rope::apply.freqs_varlen_out(Tensor x, Tensor freqs, Tensor cu_seqlens, *, "
        "Tensor? seq_offsets=None, int cp_size=1, int cp_rank=0, float attention_factor=1., "
        "bool interleaved=True, bool inverse=False, Tensor(a!) out) -> ()"
    ),
    "apply.out": (
        "rope::apply.out(Tensor x, Tensor cos, Tensor sin, Tensor positions, *, "
        "bool interleaved=True, bool inverse=False, int[]? mrope_section=None, "
        "bool mrope_interleaved=False, Tensor(a!) out) -> ()"
    ),
    "apply.varlen": (
        "rope::apply.varlen(Tensor x, Tensor cos, Tensor sin, Tensor cu_seqlens, *, "
        "Tensor? seq_offsets=None, int cp_size=1, int cp_rank=0, bool interleaved=True, "
        "bool inverse=False) -> Tensor"
    ),
    "apply.varlen_out": (
        "rope::apply.varlen_out(Tensor x, Tensor cos, Tensor sin, Tensor cu_seqlens, *, "
        "Tensor? seq_offsets=None, int cp_size=1, int cp_rank=0, bool interleaved=True, "
        "bool inverse=False, Tensor(a!) out) -> ()"
    ),
    "apply_.default": (
        "rope::apply_(Tensor(a!) x, Tensor cos, Tensor sin, Tensor positions, *, "
        "bool interleaved=True, bool inverse=False, int[]? mrope_section=None, "
        "bool mrope_interleaved=False) -> ()"
    ),
    "apply_.freqs": (
        "rope::apply_.freqs(Tensor(a!) x, Tensor freqs, Tensor positions, *, "
        "float attention_factor=1., bool interleaved=True, bool inverse=False, "
        "int[]? mrope_section=None, bool mrope_interleaved=False) -> ()"
    ),
    "apply_.freqs_varlen": (
        "rope::apply_.freqs_varlen(Tensor(a!) x, Tensor freqs, Tensor cu_seqlens, *, "
        "Tensor? seq_offsets=None, int cp_size=1, int cp_rank=0, float attention_factor=1., "
        "bool interleaved=True, bool inverse=False) -> ()"
    ),
    "apply_.varlen": (
        "rope::apply_.varlen(Tensor(a!) x, Tensor cos, Tensor sin, Tensor cu_seqlens, *, "
        "Tensor? seq_offsets=None, int cp_size=1, int cp_rank=0, bool interleaved=True, "
        "bool inverse=False) -> ()"
    ),
    "apply_qk.default": (
        "rope::apply_qk(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor positions, *, "
        "bool interleaved=True, bool inverse=False, int[]? mrope_section=None, "
        "bool mrope_interleaved=False) -> (Tensor, Tensor)"
    ),
    "apply_qk.freqs": (
        "rope::apply_qk.freqs(Tensor q, Tensor k, Tensor freqs, Tensor positions, *, "
        "float attention_factor=1., bool interleaved=True, bool inverse=False, "
        "int[]? mrope_section=None, bool mrope_interleaved=False) -> (Tensor, Tensor)"
    ),
    "apply_qk.freqs_varlen": (
        "rope::apply_qk.freqs_varlen(Tensor q, Tensor k, Tensor freqs, Tensor cu_seqlens, *, "
        "Tensor? seq_offsets=None, int cp_size=1, int cp_rank=0, float attention_factor=1., "
        "bool interleaved=True, bool inverse=False) -> (Tensor, Tensor)"
    ),
    "apply_qk.varlen": (
        "rope::apply_qk.varlen(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor cu_seqlens, *, "
        "Tensor? seq_offsets=None, int cp_size=1, int cp_rank=0, bool interleaved=True, "
        "bool inverse=False) -> (Tensor, Tensor)"
    ),
    "apply_qk_cache.default": (
        "rope::apply_qk_cache(Tensor q, Tensor k, Tensor? v, Tensor cos, Tensor sin, "
        "Tensor positions, Tensor(a!) k_cache, Tensor(b!)? v_cache, Tensor slot_mapping, *, "
        "bool interleaved=True, Tensor? k_scale=None, Tensor? v_scale=None, "
        "int[]? mrope_section=None, bool mrope_interleaved=False) -> Tensor"
    ),
    "apply_qk_fp8.default": (
        "rope::apply_qk_fp8(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor positions, *, "
        "Tensor? q_nope=None, Tensor? k_nope=None, Tensor? q_scale=None, Tensor? k_scale=None, "
        "ScalarType? dtype=None, bool interleaved=True, bool multiply_by_scale=False, "
        "int[]? mrope_section=None, bool mrope_interleaved=False, bool inverse=False) -> "
        "(Tensor, Tensor, Tensor, Tensor)"
    ),
    "apply_qk_fp8.out": (
        "rope::apply_qk_fp8.out(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor positions, *, "
        "Tensor? q_nope=None, Tensor? k_nope=None, Tensor? q_scale=None, Tensor? k_scale=None, "
        "bool interleaved=True, bool multiply_by_scale=False, int[]? mrope_section=None, "
        "bool mrope_interleaved=False, bool inverse=False, Tensor(a!) q_out, Tensor(b!) k_out, "
        "Tensor(c!)? q_nope_out=None, Tensor(d!)? k_nope_out=None) -> ()"
    ),
    "apply_qk_fp8_dynamic.default": (
        "rope::apply_qk_fp8_dynamic(Tensor q, Tensor k, Tensor cos, Tensor sin, "
        "Tensor positions, *, ScalarType? dtype=None, bool interleaved=True, "
        "bool per_token=False, bool pow2_scale=False, int[]? mrope_section=None, "
        "bool mrope_interleaved=False, bool inverse=False) -> (Tensor, Tensor, Tensor, Tensor)"
    ),
    "apply_qk_fp8_dynamic.out": (
        "rope::apply_qk_fp8_dynamic.out(Tensor q, Tensor k, Tensor cos, Tensor sin, "
        "Tensor positions, *, bool interleaved=True, bool per_token=False, "
        "bool pow2_scale=False, int[]? mrope_section=None, bool mrope_interleaved=False, "
        "bool inverse=False, Tensor(a!) q_out, Tensor(b!) k_out, Tensor(c!) q_scale_out, "
        "Tensor(d!) k_scale_out) -> ()"
    ),
    "mla_apply_cache.default": (
        "rope::mla_apply_cache(Tensor q_pe, Tensor k_pe, Tensor kv_c, Tensor cos, Tensor sin, "
        "Tensor positions, Tensor(a!) kv_cache, Tensor(b!)? kpe_cache, Tensor slot_mapping, *, "
        "Tensor? q_nope=None, Tensor? v=None, Tensor(c!)? v_cache=None, bool interleaved=True, "
        "Tensor? kv_scale=None, Tensor? v_scale=None, ScalarType? q_dtype=None, "
        "Tensor? q_scale=None, bool multiply_by_scale=False) -> (Tensor, Tensor)"
    ),
    "rms_norm_apply_qk.default": (
        "rope::rms_norm_apply_qk(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, "
        "Tensor cos, Tensor sin, Tensor positions, *, float eps=9.9999999999999995e-07, "
        "float weight_offset=0., bool interleaved=True, bool inverse=False, "
        "int[]? mrope_section=None, bool mrope_interleaved=False) -> (Tensor, Tensor)"
    ),
    "rms_norm_apply_qk_cache.default": (
        "rope::rms_norm_apply_qk_cache(Tensor q, Tensor k, Tensor? v, Tensor q_weight, "
        "Tensor k_weight, Tensor cos, Tensor sin, Tensor positions, Tensor(a!) k_cache, "
        "Tensor(b!)? v_cache, Tensor slot_mapping, *, float eps=9.9999999999999995e-07, "
        "float weight_offset=0., bool interleaved=True, Tensor? k_scale=None, "
        "Tensor? v_scale=None, ScalarType? q_dtype=None, Tensor? q_scale=None, "
        "int[]? mrope_section=None, bool mrope_interleaved=False) -> Tensor"
    ),
}


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_public_names(module_name):
    module = importlib.import_module(module_name)
    assert public_names(module) == PUBLIC[module_name]
    for name in PUBLIC[module_name]:
        getattr(module, name)


def test_every_rope_overload_and_its_schema():
    schemas = {
        f"{s.name[len('rope::') :]}.{s.overload_name or 'default'}": str(s)
        for s in torch._C._jit_get_all_schemas()
        if s.name.startswith("rope::")
    }
    assert schemas == SCHEMAS
    for key, schema in SCHEMAS.items():
        op, overload = key.split(".")
        assert str(getattr(getattr(torch.ops.rope, op), overload)._schema) == schema


@pytest.mark.parametrize("module_name", ["torch_rope", "torch_rope.ops"])
def test_docstring_names_every_op(module_name):
    """The package docstrings list the ops; one added without its line there fails here."""
    ops = {
        s.name[len("rope::") :]
        for s in torch._C._jit_get_all_schemas()
        if s.name.startswith("rope::")
    }
    doc = importlib.import_module(module_name).__doc__
    missing = sorted(op for op in ops if not re.search(rf"``(torch\.ops\.rope\.)?{op}``", doc))
    assert not missing, f"{module_name}'s docstring does not name {missing}"
