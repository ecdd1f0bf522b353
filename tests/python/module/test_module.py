# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.RotaryPositionalEmbedding and torch_rope.rope_tables."""

import pytest
import references as ref
import torch
from helpers import LAYOUT_IDS, LAYOUTS, assert_matches_reference, cpu_and_cuda, dtype_id, randn
from torch import nn

import torch_rope


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_module_buffers(device):
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 64, 100, device=device)
    want_cos, want_sin = ref.tables(100, 64, 10000.0, torch.float64)
    assert dict(rope.named_buffers()).keys() == {"cos", "sin"}
    assert rope.cos.dtype == torch.float32 and rope.cos.device.type == device
    torch.testing.assert_close(rope.cos.cpu().double(), want_cos, rtol=0, atol=1.2e-7)
    torch.testing.assert_close(rope.sin.cpu().double(), want_sin, rtol=0, atol=1.2e-7)
    assert list(rope.parameters()) == []


def test_state_dict_is_empty_and_loads_into_fresh_module():
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 32, 16)
    assert rope.state_dict() == {}
    fresh = torch_rope.RotaryPositionalEmbedding(10000.0, 32, 16)
    result = fresh.load_state_dict(rope.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(fresh.cos, rope.cos) and torch.equal(fresh.sin, rope.sin)


def test_state_dict_of_a_model_has_no_rope_keys():
    model = nn.Sequential(nn.Linear(8, 8), torch_rope.RotaryPositionalEmbedding(10000.0, 8, 16))
    assert set(model.state_dict()) == {"0.weight", "0.bias"}
    clone = nn.Sequential(nn.Linear(8, 8), torch_rope.RotaryPositionalEmbedding(10000.0, 8, 16))
    clone.load_state_dict(model.state_dict(), strict=True)


@pytest.mark.parametrize("cast", ["to_bfloat16", "half", "double", "to_float16"])
def test_cast_keeps_tables_float32_and_exact(cast):
    model = nn.Sequential(nn.Linear(16, 16), torch_rope.RotaryPositionalEmbedding(10000.0, 16, 64))
    cos, sin = model[1].cos.clone(), model[1].sin.clone()
    if cast == "to_bfloat16":
        model.to(torch.bfloat16)
    elif cast == "to_float16":
        model.to(dtype=torch.float16)
    elif cast == "half":
        model.half()
    else:
        model.double()
    rope = model[1]
    assert model[0].weight.dtype != torch.float32, "the rest of the model was cast"
    assert rope.cos.dtype == torch.float32 and rope.sin.dtype == torch.float32
    assert torch.equal(rope.cos, cos) and torch.equal(rope.sin, sin), "tables lost precision"


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_bfloat16_model_forward(device):
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 64, 32).to(device).to(torch.bfloat16)
    x = randn(2, 3, 8, 64, dtype=torch.bfloat16, device=device)
    out = rope(x)
    assert out.dtype == torch.bfloat16
    assert_matches_reference(out, x, torch.arange(8), 64, interleaved=True)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_to_device_moves_tables(device):
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 16, 8).to(device)
    assert rope.cos.device.type == device and rope.sin.device.type == device
    back = rope.to("cpu")
    assert back.cos.device.type == "cpu"


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("shape", [(2, 3, 9, 64), (9, 64), (2, 9, 64)])
def test_default_positions_are_arange(shape, interleaved, device):
    rope = torch_rope.RotaryPositionalEmbedding(
        10000.0, 64, 32, interleaved=interleaved, device=device
    )
    x = randn(*shape, device=device)
    seq = torch.arange(shape[-2], device=device)
    assert torch.equal(rope(x), rope(x, seq))
    assert_matches_reference(rope(x), x, seq, 64, interleaved=interleaved)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64], ids=dtype_id)
def test_forward_with_token_positions_and_partial_rotary(pos_dtype, interleaved, device):
    rope = torch_rope.RotaryPositionalEmbedding(
        500000.0, 80, 64, rotary_dim=32, interleaved=interleaved, device=device
    )
    x = randn(2, 7, 80, device=device)
    positions = torch.randint(0, 64, (2, 7), device=device, dtype=pos_dtype)
    out = rope(x, positions)
    assert_matches_reference(out, x, positions, 32, interleaved=interleaved, theta=500000.0)


def test_module_attributes_and_repr():
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 64, 32, rotary_dim=32, interleaved=False)
    assert rope.rotary_dim == 32 and rope.d_k == 64 and rope.interleaved is False
    assert rope.cos.shape == (32, 16)
    text = repr(rope)
    assert "rotary_dim=32" in text and "interleaved=False" in text


@pytest.mark.parametrize("rotary_dim", [7, 66, 0, -2])
def test_bad_rotary_dim_raises(rotary_dim):
    with pytest.raises((ValueError, RuntimeError), match=rf"rotary_dim.*{rotary_dim}"):
        torch_rope.RotaryPositionalEmbedding(10000.0, 64, 32, rotary_dim=rotary_dim)


def test_odd_d_k_without_rotary_dim_raises():
    with pytest.raises((ValueError, RuntimeError), match="rotary_dim"):
        torch_rope.RotaryPositionalEmbedding(10000.0, 63, 32)


def test_compiled_with_cuda_is_a_bool():
    assert isinstance(torch_rope.compiled_with_cuda(), bool)


def test_module_deep_copies_and_pickles_with_scaling():
    # FSDP/TP recipes deep-copy models and torch.save(model) pickles them: the module must hold
    # nothing that cannot be copied (regression: it once kept a pybind scaling object).
    import copy
    import io

    rope = torch_rope.RotaryPositionalEmbedding(
        10000.0, 16, 64, scaling={"rope_type": "linear", "factor": 2.0}
    )
    x = torch.randn(2, 5, 16)
    buf = io.BytesIO()
    torch.save(rope, buf)
    buf.seek(0)
    for other in (copy.deepcopy(rope), torch.load(buf, weights_only=False)):
        assert torch.equal(other(x), rope(x))
        assert other.scaling == rope.scaling


def test_call_takes_nn_module_path_when_hooks_exist():
    # __call__ skips nn.Module's bookkeeping only when there is nothing for it to do: hooks (on
    # the module and global ones) still run, and see the arguments as given.
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 8, 16)
    x, positions = torch.randn(2, 5, 8), torch.arange(5)
    want = rope.forward(x, positions)
    seen = []
    handle = rope.register_forward_pre_hook(lambda module, args: seen.append(len(args)))
    assert torch.equal(rope(x, positions), want) and torch.equal(rope(x), want)
    assert seen == [2, 1]
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: out * 2 if module is rope else None
    )
    try:
        assert torch.equal(rope(x, token_positions=positions), want * 2)
    finally:
        handle.remove()
    assert torch.equal(rope(x, positions), want)
    rope.forward = lambda x, token_positions=None: x  # an instance's own forward is honoured
    assert torch.equal(rope(x, positions), x)


def test_fast_call_reports_bad_input_as_forward_does():
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 8, 16)
    with pytest.raises(ValueError, match=r"must equal d_k = 8, got x of shape \[2, 4\]"):
        rope(torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"seq_dim = -2, got x of shape \[8\]"):
        rope(torch.randn(8))
    with pytest.raises(TypeError, match="token_positions must be an int32/int64 Tensor"):
        rope(torch.randn(2, 8), [0, 1])
    with pytest.raises(IndexError, match="positions must be in"):
        rope(torch.randn(2, 8), torch.tensor([0, 16]))


@pytest.mark.parametrize("path", ["eager_fast_path", "nn_module_path", "compiled"])
def test_positions_that_do_not_fit_get_the_modules_rule(path):
    # (S, 1) is the op's advice for (B, S, H, D); the module reads 2-D positions as (B, S), so its
    # message must state its own rule and name seq_dim=-3, on every path a call can take.
    rope = torch_rope.RotaryPositionalEmbedding(10000.0, 8, 16)
    x, positions = torch.randn(2, 5, 3, 8), torch.arange(5).view(5, 1)
    call = rope
    if path == "nn_module_path":
        rope.register_forward_pre_hook(lambda module, args: None)
    elif path == "compiled":
        torch._dynamo.reset()
        call = torch.compile(rope, backend="eager", fullgraph=True)
    with pytest.raises(Exception) as info:
        call(x, positions)
    message = str(info.value)
    fit = "token_positions of shape [5, 1] do not fit x of shape [2, 5, 3, 8] with seq_dim = -2"
    assert fit in message
    assert "2-D positions as (B, S)" in message and "seq_dim=-3" in message
    assert "(S, 1) for" not in message
    if path != "compiled":  # Dynamo wraps what the traced code raised
        assert type(info.value) is ValueError
    # Built for (B, S, H, D), the same call works.
    rope_bshd = torch_rope.RotaryPositionalEmbedding(10000.0, 8, 16, seq_dim=-3)
    assert rope_bshd(x, torch.arange(5).expand(2, 5)).shape == x.shape


def test_integrations_are_attributes_loaded_on_first_use():
    # `import torch_rope; torch_rope.hf.patch(model)` must work, and a bare import must not pull
    # in transformers or torchtune.
    from helpers import run_python

    script = (
        "import sys, torch_rope\n"
        "assert 'transformers' not in sys.modules and 'torchtune' not in sys.modules\n"
        "assert 'hf' in dir(torch_rope) and 'torchtune' in dir(torch_rope)\n"
        "try:\n"
        "    import transformers  # noqa\n"
        "except ImportError:\n"
        "    print('no transformers'); sys.exit(0)\n"
        "assert callable(torch_rope.hf.patch) and torch_rope.hf.__name__ == 'torch_rope.hf'\n"
        "print('ok')\n"
    )
    result = run_python(script)
    assert result.returncode == 0, result.stderr
    if "no transformers" in result.stdout:
        pytest.skip("transformers is not installed: checked only that the import stays lazy")
    assert "ok" in result.stdout
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        torch_rope.nothing_here  # noqa: B018


def test_call_override_knows_every_hook_registry_torch_reads():
    # RotaryPositionalEmbedding.__call__ skips nn.Module.__call__ when no hook is registered. A
    # registry that a newer torch adds to _call_impl would be silently ignored: fail instead.
    import inspect
    import re

    from torch_rope.nn import CALL_HOOK_REGISTRIES

    source = inspect.getsource(nn.Module._call_impl)
    read = set(re.findall(r"self\.(_\w*hooks\w*)\b", source))
    read |= set(re.findall(r"\b(_global_\w*hooks\w*)\b", source))
    read = {name for name in read if not callable(getattr(nn.Module, name, None))}  # methods
    assert "_forward_hooks" in read, "the scan no longer finds torch's hook registries"
    unknown = sorted(read - set(CALL_HOOK_REGISTRIES))
    assert not unknown, f"nn.Module._call_impl reads hook registries __call__ ignores: {unknown}"
