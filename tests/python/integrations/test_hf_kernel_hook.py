# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.hf_kernel through transformers' own ``rotary_pos_emb`` kernel hook, on tiny models.

transformers decorates ``apply_rotary_pos_emb`` with
``use_kernel_forward_from_hub("rotary_pos_emb")`` and each attention class with
``use_kernelized_func(apply_rotary_pos_emb)``, but only when its ``is_kernels_available()``
accepts the installed ``kernels`` (transformers 5.23: 0.18.2 <= version < 0.19.0); otherwise both
decorators are no-op stubs. PyPI as reachable here stops at kernels 0.17.2, so :func:`hook`
applies ``kernels``' own decorators to the modeling module exactly as transformers' would (and
undoes it), and :func:`kernelize` makes the call transformers' wrapper makes. With a kernels that
transformers accepts, both use transformers' own objects instead; and
test_transformers_own_wiring_* runs the real transformers path in a child process either way
(bypassing only the version gate when it is closed).

Every model check counts rope::apply_qk at the dispatcher (the hook must really run our op),
compares with the model before kernelize (fp32 logits to 1e-5, gradients), and has a negative
control: kernelize without our mapping leaves the op uncalled.
"""

import importlib
import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
kernels = pytest.importorskip(
    "kernels", reason="kernels (transformers' kernel hook) is not installed"
)

import hf_models  # noqa: E402
from helpers import run_python  # noqa: E402
from test_hf import OpCounter, rel_err  # noqa: E402
from transformers.utils import import_utils  # noqa: E402

import torch_rope.hf_kernel as hf_kernel  # noqa: E402

#: Whether transformers accepts the installed kernels (else its hook decorators are stubs).
TRANSFORMERS_HOOK_LIVE = import_utils.is_kernels_available()

#: model name -> (modeling module, attention class) of models whose rotation goes through the hook.
MODELS = {
    "llama": ("llama", "LlamaAttention"),
    "qwen3": ("qwen3", "Qwen3Attention"),
    "gemma3": ("gemma3", "Gemma3Attention"),
    "phi": ("phi", "PhiAttention"),  # partial rotary: the hook gets q[..., :rotary_ndims]
}


def build(name):
    if name == "phi":
        cfg = transformers.PhiConfig(
            **{k: v for k, v in hf_models.COMMON.items() if k != "num_key_value_heads"},
            partial_rotary_factor=0.5,
        )
        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(
            cfg, attn_implementation="eager"
        ).eval()
    return hf_models.build(name)


@pytest.fixture
def hook(monkeypatch):
    """Returns hook(name): the model's hooked ``apply_rotary_pos_emb``, set up as transformers
    sets it up when it accepts the installed kernels. kernelize replaces the forward of that one
    object, shared by every model of the architecture; teardown puts the original back."""
    hooked = []

    def install(name):
        module_name, attention_name = MODELS[name]
        modeling = importlib.import_module(
            f"transformers.models.{module_name}.modeling_{module_name}"
        )
        fn = modeling.apply_rotary_pos_emb
        if not hasattr(fn, "kernel_layer_name"):
            assert not TRANSFORMERS_HOOK_LIVE, "transformers should have decorated it itself"
            # What `@use_kernel_forward_from_hub("rotary_pos_emb")` and
            # `@use_kernelized_func(apply_rotary_pos_emb)` do in the modeling file.
            fn = kernels.use_kernel_forward_from_hub(hf_kernel.LAYER_NAME)(fn)
            monkeypatch.setattr(modeling, "apply_rotary_pos_emb", fn)
            attention = getattr(modeling, attention_name)
            monkeypatch.setattr(attention, "__init__", attention.__init__)  # undone at teardown
            kernels.use_kernelized_func(fn)(attention)
        assert fn.kernel_layer_name == hf_kernel.LAYER_NAME
        hooked.append(fn)
        return fn

    yield install
    for fn in hooked:
        fn.__dict__.pop("forward", None)  # kernelize binds a forward on the instance


def kernelize(model, mode):
    """Activate the mapping on ``model`` the way transformers does."""
    if TRANSFORMERS_HOOK_LIVE:
        from transformers.integrations.hub_kernels import kernelize as transformers_kernelize

        transformers_kernelize(model, mode=mode)
    else:  # the call transformers' kernelize makes (integrations/hub_kernels.py)
        kernels.kernelize(
            model, device="cpu", mode=mode, use_fallback=kernels.KernelizeFallback.ALL
        )


def n_layers(model):
    return model.config.num_hidden_layers


def forward(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


# ---- through the mapping, on tiny models ------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_kernelized_model_calls_torch_rope_and_matches_in_inference_mode(hook, name):
    hook(name)
    model = build(name)
    ids, mask = hf_models.batch()
    with OpCounter() as counter:
        want = forward(model, ids, mask)
    assert counter.counts.get("rope.apply_qk", 0) == 0  # not kernelized yet: HF's own rotation

    with kernels.use_kernel_mapping(hf_kernel.kernel_mapping()):
        kernelize(model, kernels.Mode.INFERENCE)
    with OpCounter() as counter:
        got = forward(model, ids, mask)
    assert counter.counts.get("rope.apply_qk", 0) == n_layers(model), counter.counts
    assert rel_err(got, want) <= 1e-5, rel_err(got, want)


def test_negative_control_kernelize_without_our_mapping_leaves_the_op_uncalled(hook):
    hook("llama")
    model = build("llama")
    ids, mask = hf_models.batch()
    with kernels.use_kernel_mapping(hf_kernel.kernel_mapping()):
        kernelize(model, kernels.Mode.INFERENCE)
    with OpCounter() as counter:
        forward(model, ids, mask)
    assert counter.counts.get("rope.apply_qk", 0) == n_layers(model)

    # The same model kernelized under a mapping without rotary_pos_emb: back to HF's function.
    with kernels.use_kernel_mapping({}, inherit_mapping=False):
        kernelize(model, kernels.Mode.INFERENCE)
    with OpCounter() as counter:
        forward(model, ids, mask)
    assert counter.counts.get("rope.apply_qk", 0) == 0, counter.counts
    assert counter.counts.get("aten.cat", 0) > 0  # rotate_half ran instead


@pytest.mark.parametrize("name", ["llama", "phi"])
def test_kernelized_model_in_training_mode_gradients_match(hook, name):
    hook(name)
    ids, mask = hf_models.batch()
    reference, model = build(name).train(), build(name).train()
    reference(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()  # before kernelize

    with kernels.use_kernel_mapping(hf_kernel.kernel_mapping()):
        kernelize(model, kernels.Mode.TRAINING)
    with OpCounter() as counter:
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
    assert counter.counts.get("rope.apply_qk", 0) == n_layers(model), counter.counts
    for (pname, p), q in zip(reference.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=pname)


def test_register_puts_the_layer_in_the_global_mapping(hook):
    hook("llama")
    model = build("llama")
    ids, mask = hf_models.batch()
    want = forward(model, ids, mask)
    # A scratch copy of the global mapping, so that register() does not outlive the test.
    with kernels.use_kernel_mapping({}, inherit_mapping=True):
        hf_kernel.register()
        kernelize(model, kernels.Mode.INFERENCE)
    with OpCounter() as counter:
        got = forward(model, ids, mask)
    assert counter.counts.get("rope.apply_qk", 0) == n_layers(model)
    assert rel_err(got, want) <= 1e-5


def test_kernelized_model_compiles_fullgraph_with_the_op_in_the_graph(hook):
    hook("llama")
    model = build("llama")
    ids, mask = hf_models.batch()
    want = forward(model, ids, mask)
    with kernels.use_kernel_mapping(hf_kernel.kernel_mapping()):
        kernelize(model, kernels.Mode.INFERENCE | kernels.Mode.TORCH_COMPILE)

    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=recording_backend)
    got = forward(compiled, ids, mask)
    torch._dynamo.reset()
    assert sum(g.count("rope.apply_qk") for g in graphs) == n_layers(model), graphs
    assert rel_err(got, want) <= 1e-5


def test_kernelized_model_trains_under_compile(hook):
    hook("llama")
    ids, mask = hf_models.batch()
    reference, model = build("llama").train(), build("llama").train()
    reference(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    with kernels.use_kernel_mapping(hf_kernel.kernel_mapping()):
        kernelize(model, kernels.Mode.TRAINING | kernels.Mode.TORCH_COMPILE)
    graphs = []

    def recording_aot_eager(gm, example_inputs):
        from torch._dynamo.backends.registry import lookup_backend

        graphs.append(str(gm.graph))
        return lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=recording_aot_eager)
    compiled(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    torch._dynamo.reset()
    assert sum(g.count("rope.apply_qk") for g in graphs) == n_layers(model), graphs
    for (pname, p), q in zip(reference.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=pname)


# ---- transformers' own wiring, in a child process -------------------------------------------

_TRANSFORMERS_WIRING = """
import json, sys
import torch
from transformers.utils import import_utils
gate_bypassed = False
if not import_utils.is_kernels_available():
    # Only the version gate: transformers' hub_kernels and modeling files, imported after this,
    # then use the installed kernels' decorators, mapping and kernelize.
    import transformers.utils
    def accept(*args, **kwargs):
        return True

    import_utils.is_kernels_available = transformers.utils.is_kernels_available = accept
    gate_bypassed = True
import transformers.models.llama.modeling_llama as modeling
import hf_models
import torch_rope.hf_kernel
from torch.utils._python_dispatch import TorchDispatchMode


class OpCounter(TorchDispatchMode):  # test_hf's, which this child cannot import
    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        name = str(func.overloadpacket)
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


assert type(modeling.apply_rotary_pos_emb).__name__ == "Func"  # transformers' hook is live
ids, mask = hf_models.batch()
model = hf_models.build("llama")
with torch.no_grad():
    want = model(input_ids=ids, attention_mask=mask).logits
reference = hf_models.build("llama").train()
reference(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()

torch_rope.hf_kernel.register()
model.set_use_kernels(True)  # what from_pretrained(use_kernels=True) calls: eval -> INFERENCE
with OpCounter() as counter, torch.no_grad():
    got = model(input_ids=ids, attention_mask=mask).logits
inference = counter.counts.get("rope.apply_qk", 0)
err = ((got - want).abs().max() / want.abs().max()).item()

model.train()  # a kernelized model re-kernelizes on a mode switch: TRAINING
with OpCounter() as counter:
    model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
training = counter.counts.get("rope.apply_qk", 0)
grad_err = max(
    ((q.grad - p.grad).abs().max() / p.grad.abs().max().clamp_min(1e-12)).item()
    for p, q in zip(reference.parameters(), model.parameters())
)
print(json.dumps(dict(gate_bypassed=gate_bypassed, inference=inference, training=training,
                      err=err, grad_err=grad_err, use_kernels=model.use_kernels)))
"""


def test_transformers_own_wiring_set_use_kernels_runs_torch_rope_in_both_modes():
    """transformers' decorators, ``set_use_kernels`` (default mapping registered, then its
    ``kernelize``) and its re-kernelize on ``model.train()``, with torch_rope registered."""
    out = run_python(_TRANSFORMERS_WIRING, with_test_modules=True, HF_HUB_OFFLINE="1")
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["gate_bypassed"] == (not TRANSFORMERS_HOOK_LIVE)
    assert result["use_kernels"] is True
    assert result["inference"] == 2 and result["training"] == 2, result
    assert result["err"] <= 1e-5 and result["grad_err"] <= 1e-4, result


# ---- the layer itself -------------------------------------------------------------------------


def _devices():
    devices = ["cpu"]
    if torch.cuda.is_available() and torch_rope_compiled_with_cuda():
        devices.append("cuda")
    return devices


def torch_rope_compiled_with_cuda():
    import torch_rope

    return torch_rope.compiled_with_cuda()


def hf_cos_sin(batch, seq, rotary_dim, device, theta=10000.0):
    inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    pos = torch.randint(0, 100, (batch, seq)).double()
    emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)
    return emb.cos().float().to(device), emb.sin().float().to(device)


def reference_apply(q, k, cos, sin, unsqueeze_dim=1):
    """HF's rotate_half rotation of the first R features (GPT-NeoX's partial rotary)."""
    r = cos.size(-1)
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

    def rot(x):
        x_rot, x_pass = x[..., :r], x[..., r:]
        x1, x2 = x_rot[..., : r // 2], x_rot[..., r // 2 :]
        return torch.cat([x_rot * cos + torch.cat([-x2, x1], -1) * sin, x_pass], -1)

    return rot(q), rot(k)


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("rotary_dim", [32, 8], ids=["full", "partial"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_layer_forward_and_backward_match_hf(device, rotary_dim, layout):
    cos, sin = hf_cos_sin(2, 7, rotary_dim, device)
    q_shape, k_shape = (
        ((2, 4, 7, 32), (2, 2, 7, 32)) if layout == "bhsd" else ((2, 7, 4, 32), (2, 7, 2, 32))
    )
    unsqueeze_dim = 1 if layout == "bhsd" else 2
    q = torch.randn(q_shape, device=device, requires_grad=True)
    k = torch.randn(k_shape, device=device, requires_grad=True)
    layer = hf_kernel.RotaryPosEmb()
    with OpCounter() as counter:
        got = layer(q, k, cos, sin, unsqueeze_dim)
    assert counter.counts.get("rope.apply_qk", 0) == 1
    want = reference_apply(q, k, cos, sin, unsqueeze_dim)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    grads = [torch.randn_like(t) for t in got]
    got_grad = torch.autograd.grad(got, (q, k), grads)
    want_grad = torch.autograd.grad(want, (q, k), grads)
    for g, w in zip(got_grad, want_grad):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_layer_compiles_fullgraph_with_inductor():
    cos, sin = hf_cos_sin(2, 5, 16, "cpu")
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    torch._dynamo.reset()
    compiled = torch.compile(hf_kernel.RotaryPosEmb(), fullgraph=True)
    got = compiled(q, k, cos, sin)
    torch._dynamo.reset()
    for g, w in zip(got, reference_apply(q, k, cos, sin)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_layer_passes_kernels_validation_against_transformers_function():
    """kernels only accepts a stateless layer whose forward has the hooked function's arguments."""
    from kernels.layer.layer import _validate_layer
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    fn = getattr(apply_rotary_pos_emb, "__wrapped__", apply_rotary_pos_emb)
    hooked = kernels.use_kernel_forward_from_hub(hf_kernel.LAYER_NAME)(fn)
    _validate_layer(
        check_cls=type(hooked), cls=hf_kernel.RotaryPosEmb, repo=hf_kernel.TorchRopeRepository()
    )
    assert hf_kernel.RotaryPosEmb.has_backward and hf_kernel.RotaryPosEmb.can_torch_compile


def test_kernel_mapping_covers_every_mode_and_refuses_other_devices():
    mapping = hf_kernel.kernel_mapping()
    assert set(mapping) == {"rotary_pos_emb"}
    assert set(mapping["rotary_pos_emb"]) == {"cpu", "cuda"}
    modes = mapping["rotary_pos_emb"]["cpu"]
    assert kernels.Mode.TRAINING in modes and kernels.Mode.INFERENCE in modes
    assert kernels.Mode.TRAINING | kernels.Mode.TORCH_COMPILE in modes
    assert all(r.load() is hf_kernel.RotaryPosEmb for r in modes.values())
    assert hash(hf_kernel.TorchRopeRepository()) == hash(hf_kernel.TorchRopeRepository())
    with pytest.raises(ValueError, match="xpu"):
        hf_kernel.kernel_mapping(["cpu", "xpu"])


def test_importing_torch_rope_hf_kernel_imports_neither_transformers_nor_kernels():
    out = run_python(
        "import sys, torch_rope, torch_rope.hf_kernel\n"
        "assert torch_rope.hf_kernel.RotaryPosEmb\n"
        "print('transformers' in sys.modules, 'kernels' in sys.modules)"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"], out
