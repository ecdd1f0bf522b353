# SPDX-License-Identifier: BSD-3-Clause
"""What every integration that patches a loaded model shares, whatever library built the model:

* :mod:`.namespace`: a class's ``forward`` rebuilt over a copy of its module's globals in which
  the library's rotation function is ours, so one instance is patched, never the class;
* :mod:`.self_check`: the tolerance a patched layer's probe output must meet.
"""
