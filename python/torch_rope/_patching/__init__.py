# SPDX-License-Identifier: BSD-3-Clause
"""What every integration that patches a loaded model shares, whatever library built the model
(``torch_rope.hf`` for transformers, ``torch_rope.diffusers`` for diffusers):

* :mod:`.registry`: one row per model type (what the integration needs to know of it), the
  supported types that follow from the rows, and the refusal of every other type, with its reason;
* :mod:`.record`: what a patch changed on one model, as undo callbacks kept on the model (and the
  refusal of a module whose forward was set on the instance, which a patch would overwrite);
* :mod:`.self_check`: one probe forward of a layer unpatched and one patched, in eval mode, seeded,
  without autograd, compared within a tolerance for the layer's dtype; and the refusal of a model
  without weights (the meta device), which the check cannot run;
* :mod:`.namespace`: a function (a class's ``forward``, a processor's ``__call__``) rebuilt over a
  copy of its module's globals in which the library's rotation function is ours, so one instance
  is patched, never the class;
* :mod:`.host_reads`: whether positions may be read on the host now (not while a graph is traced
  or captured), for tables that grow to the positions a call needs.
"""
