# SPDX-License-Identifier: BSD-3-Clause
"""Errors of the compat layers in the peer's words: an entry point under a peer's name is called
with the peer's argument names (FlashInfer's ``indptr``, ``pos_ids``, vLLM's ``query``), while
the op it runs on checks torch-rope's (``cu_seqlens``, ``positions``, ``x``). Every compat entry
point runs its ops through :func:`peer_words`, which re-raises an op's error under the peer's
function name with each torch-rope argument name replaced by the peer's, so that the message
names what the caller passed.

Only the messages of the exception types the ops raise (``RuntimeError``, ``ValueError``,
``TypeError``, ``IndexError``, exactly those types) are rewritten; anything else (an
out-of-memory error, a CUDA error) passes through unchanged. The try block costs nothing when
nothing is raised.
"""

import re
from typing import Dict

# The exception types the ops' checks raise (TORCH_CHECK, TORCH_CHECK_VALUE, TORCH_CHECK_INDEX,
# TORCH_CHECK_TYPE and the Python wrappers' own checks).
_TRANSLATED = (RuntimeError, ValueError, TypeError, IndexError)

# "rope.apply_qk.varlen: " and the like, at the start of an op's message.
_OP_PREFIX = re.compile(r"^rope\.[\w.]+: ")


class PeerNames:
    """torch-rope's names -> the peer's, for one entry point. The substitution is compiled on the
    first error (longest name first, so that a phrase such as ``2 * cos.size(-1)`` is replaced
    before the word ``cos``); making one costs nothing on the calls that raise nothing."""

    def __init__(self, peer: str, names: Dict[str, str]):
        self.peer = peer
        self.names = dict(names)
        self._pattern = None

    def _compiled(self):
        if self._pattern is None:
            words = sorted(self.names, key=len, reverse=True)
            # A name is a whole word: not part of a longer identifier ("x" in "max_seq_len",
            # "positions" in "token_positions").
            self._pattern = re.compile(
                "|".join(rf"(?<![\w.]){re.escape(w)}(?!\w)" for w in words) if words else r"(?!)"
            )
        return self._pattern

    def rewrite(self, message: str) -> str:
        body = _OP_PREFIX.sub("", message, count=1)
        body = self._compiled().sub(lambda m: self.names[m.group(0)], body)
        return f"{self.peer}: {body}"


def in_peer_words(error: BaseException, names: PeerNames) -> BaseException:
    """``error`` re-made with ``names``' words, or ``error`` itself when its type is not one the
    ops' checks raise."""
    if type(error) not in _TRANSLATED:
        return error
    return type(error)(names.rewrite(str(error)))


def peer_words(names: PeerNames, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, its errors in the peer's words."""
    try:
        return fn(*args, **kwargs)
    except _TRANSLATED as error:
        translated = in_peer_words(error, names)
        if translated is error:
            raise
        raise translated from None
