# SPDX-License-Identifier: BSD-3-Clause
"""What every integration that patches a loaded model shares, whatever library built the model
(``torch_rope.hf`` for transformers today; a diffusers integration would reuse it as it is):

* :mod:`.registry`: one row per model type (what the integration needs to know of it), the
  supported types that follow from the rows, and the refusal of every other type, with its reason;
* :mod:`.record`: what a patch changed on one model, as undo callbacks kept on the model;
* :mod:`.self_check`: one probe forward of a layer unpatched and one patched, in eval mode, seeded,
  without autograd, compared within a tolerance for the layer's dtype; and the refusal of a model
  without weights (the meta device), which the check cannot run;
* :mod:`.namespace`: a class's ``forward`` rebuilt over a copy of its module's globals in which
  the library's rotation function is ours, so one instance is patched, never the class.
"""
