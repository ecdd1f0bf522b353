# SPDX-License-Identifier: BSD-3-Clause
"""The tables a patched diffusers model rotates with: :class:`Tables`, one per RoPE of a model.

Float32 ``cos``/``sin`` buffers built in float64 from the model's per-axis frequencies, in one of
two forms, chosen per call by the patched RoPE module:

* **integer positions** (:meth:`Tables.integer_rows`): row ``p + origin`` holds position ``p`` on
  every axis, for the positions the model has used so far. The patched RoPE module reads the
  smallest and largest position of a call on the host (one sync per call; not while a graph is
  traced or captured) and the table grows to cover them, twice as long each time, so growth is
  rare. Growth keeps every row where it was unless a negative position moves the origin.
* **coordinates** (:meth:`Tables.coordinate_rows`): a grid whose coordinates are not integers (a
  crop of a base grid, normalised coordinates), separable per axis: row ``j`` holds, in the
  planes of axis ``a``, the angle of the ``j``-th coordinate of that axis. Positions are then the
  integer grid indices. Built once per set of coordinates and kept (the last
  :data:`COORDINATE_CACHE` sets), so a sampling loop at one resolution builds it once.

The buffers keep float32 when the model is cast (as ``torch_rope.hf``'s tables do), and follow it
to another device.
"""

from collections import OrderedDict
from typing import Hashable, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .._patching.host_reads import readable
from ..nn import apply_keeping_table_dtypes
from ..ops.tables import rope_tables_from_inv_freq

#: How many coordinate tables one :class:`Tables` keeps (one per resolution a pipeline samples at).
COORDINATE_CACHE = 8


def plane_axes(planes: int, section: Optional[Sequence[int]], mrope_interleaved: bool) -> Tensor:
    """The position axis each plane turns by, int64 ``(planes,)``: contiguous runs of
    ``section[a]`` planes (planes past the sections read axis 0, as the op does); with
    ``mrope_interleaved``, the Qwen3-VL rule the op applies (plane ``k`` reads axis 1 if
    ``k % 3 == 1 and k < 3 * section[1]``, axis 2 if ``k % 3 == 2 and k < 3 * section[2]``)."""
    axes = torch.zeros(planes, dtype=torch.long)
    if section is None:
        return axes
    if mrope_interleaved:
        k = torch.arange(planes)
        axes[(k % 3 == 1) & (k < 3 * section[1])] = 1
        axes[(k % 3 == 2) & (k < 3 * section[2])] = 2
        return axes
    start = 0
    for a, n in enumerate(section):
        axes[start : start + n] = a
        start += n
    return axes


class Tables(nn.Module):
    """One RoPE's tables: ``inv_freq`` (float64, one frequency per plane), the ``section`` of
    planes per position axis (None: one axis), the pair layout (``interleaved``: GPT-J pairs;
    else halves) and the axis rule (``mrope_interleaved``), which the patched rotations pass to
    the op with the current ``cos``/``sin`` buffers. The integer tables cover positions ``low ..
    rows - 1`` at first (``low`` <= 0), and grow from there in eager mode."""

    def __init__(
        self,
        inv_freq: Tensor,
        section: Optional[Sequence[int]],
        interleaved: bool,
        mrope_interleaved: bool = False,
        rows: int = 1024,
        device: Optional[torch.device] = None,
        low: int = 0,
    ) -> None:
        super().__init__()
        self.inv_freq = inv_freq.detach().to("cpu", torch.float64)
        self.section = None if section is None else [int(n) for n in section]
        self.interleaved = bool(interleaved)
        self.mrope_interleaved = bool(mrope_interleaved)
        self.rotary_dim = 2 * self.inv_freq.numel()
        self._axes = plane_axes(self.inv_freq.numel(), self.section, self.mrope_interleaved)
        self.origin = 0
        self.rows = 0
        self._coordinates: "OrderedDict[Hashable, Tuple[Tensor, Tensor]]" = OrderedDict()
        self._integer: Optional[Tuple[Tensor, Tensor]] = None
        cos, sin = rope_tables_from_inv_freq(self.inv_freq, max(int(rows), 1), device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self._integer = (cos, sin)
        self.rows = cos.size(0)
        if low < 0:  # negative positions from the start (centred grids): the origin moves now
            self.integer_rows(int(low), self.rows - 1)

    @property
    def num_axes(self) -> int:
        return 1 if self.section is None else len(self.section)

    def _use(self, cos: Tensor, sin: Tensor) -> None:
        self._buffers["cos"] = cos
        self._buffers["sin"] = sin

    def integer_rows(self, low: int, high: int) -> int:
        """Make the current tables the integer ones, covering positions ``[low, high]``; returns
        the origin (add it to a position to get its row)."""
        origin, rows = self.origin, self.rows
        if low + origin < 0:
            origin = max(-low, 2 * origin)
        if high + origin >= rows:
            rows = max(high + origin + 1, 2 * rows)
        if self._integer is None or (origin, rows) != (self.origin, self.rows):
            self._integer = self._build(
                torch.arange(-origin, rows - origin, dtype=torch.float64), self.cos.device
            )
            self.origin, self.rows = origin, rows
        self._use(*self._integer)
        return origin

    def cover(self, low: int, high: int) -> int:
        """:meth:`integer_rows` for positions known on the host (Python ints), except while
        torch.compile traces (the tables stay as they are); returns the origin."""
        if torch.compiler.is_compiling():
            return self.origin
        return self.integer_rows(low, high)

    def coordinate_rows(self, key: Hashable, coordinates: Sequence[Tensor]) -> None:
        """Make the current tables those of one set of per-axis coordinates (``coordinates[a]``:
        axis ``a``'s values, float64, in the order of their grid index), built once per ``key``
        (what determines the coordinates: a grid shape, a scale) and kept."""
        found = self._coordinates.get(key)
        if found is None or found[0].device != self.cos.device:
            if len(coordinates) != self.num_axes:
                raise ValueError(
                    f"torch_rope.diffusers: {len(coordinates)} coordinate axes for tables of "
                    f"{self.num_axes} axes"
                )
            n = max(int(c.numel()) for c in coordinates)
            padded = torch.zeros(self.num_axes, n, dtype=torch.float64)
            for a, c in enumerate(coordinates):
                padded[a, : c.numel()] = c.detach().to("cpu", torch.float64).reshape(-1)
            found = self._build(padded[self._axes].t(), self.cos.device)
            self._coordinates[key] = found
            while len(self._coordinates) > COORDINATE_CACHE:
                self._coordinates.popitem(last=False)
        self._coordinates.move_to_end(key)
        self._use(*found)

    def frequency_rows(self, key: Hashable, inv_freq: Tensor, scaling: float, rows: int) -> None:
        """Make the current tables those of positions ``0 .. rows - 1`` at other frequencies
        (``inv_freq``, float64) with cos and sin multiplied by ``scaling``: a RoPE that switches
        between frequency sets by the call (OmniGen's short and long factors). Built once per
        ``key`` and kept; the origin stays 0."""
        found = self._coordinates.get(key)
        if found is None or found[0].device != self.cos.device or found[0].size(0) < rows:
            found = rope_tables_from_inv_freq(
                inv_freq.to(torch.float64),
                max(rows, 1),
                self.cos.device,
                attention_scaling=float(scaling),
            )
            self._coordinates[key] = found
            while len(self._coordinates) > COORDINATE_CACHE:
                self._coordinates.popitem(last=False)
        self._coordinates.move_to_end(key)
        self._use(*found)

    def token_tables(self, ids: Tensor) -> Tuple[Tensor, Tensor]:
        """diffusers-form cos/sin ``(S, rotary_dim)`` (each plane's value twice, as pairs or
        halves) for per-token coordinates ``ids`` ``(S, A)`` that are not integers, built in
        float64 once per set of ids and kept (FLUX-style models whose pipelines pass float ids;
        see :func:`..families.flux_ids`)."""
        host = ids.detach().to("cpu", torch.float64)
        key = ("tokens", tuple(host.shape), host.numpy().tobytes())
        found = self._coordinates.get(key)
        if found is None or found[0].device != ids.device:
            values = host if host.dim() == 2 else host.reshape(-1, host.size(-1))
            cos, sin = self._build(values[:, self._axes], ids.device)
            if self.interleaved:
                cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
            else:
                cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
            found = (cos.reshape(*host.shape[:-1], -1), sin.reshape(*host.shape[:-1], -1))
            self._coordinates[key] = found
            while len(self._coordinates) > COORDINATE_CACHE:
                self._coordinates.popitem(last=False)
        self._coordinates.move_to_end(key)
        return found

    def _build(self, values: Tensor, device) -> Tuple[Tensor, Tensor]:
        """float32 ``cos``/``sin`` of ``values * inv_freq`` in float64: ``values`` is ``(rows,)``
        (the same value in every plane) or ``(rows, planes)`` (a value per plane)."""
        if values.dim() == 1:
            values = values[:, None]
        angles = values * self.inv_freq[None, :]
        return (
            torch.cos(angles).to(device=device, dtype=torch.float32),
            torch.sin(angles).to(device=device, dtype=torch.float32),
        )

    def _apply(self, fn, recurse=True):
        # Device moves apply to the tables, dtype casts do not; the kept tables are rebuilt on
        # the new device when next used.
        apply_keeping_table_dtypes(self, super()._apply, fn, recurse)
        if self._integer is not None and self._integer[0].device != self.cos.device:
            self._integer = None
        return self

    def extra_repr(self) -> str:
        return (
            f"rotary_dim={self.rotary_dim}, section={self.section}, "
            f"interleaved={self.interleaved}, rows={self.rows}, origin={self.origin}"
        )


def integer_rows(tables: Tables, ids: Tensor) -> Optional[Tensor]:
    """The table rows of positions ``ids`` (any shape; float with integer values, or int), after
    making ``tables`` cover them; None when they are not all integers (then the caller takes its
    fractional path). Reads the ids' extremes on the host, one sync, unless that is not allowed
    now (:func:`~torch_rope._patching.host_reads.readable`): then the tables stay as they are,
    the ids are taken as integers, and a position past the tables raises in the op."""
    if ids.numel() == 0 or not readable(ids):
        return ids.long() + tables.origin if tables.origin else ids.long()
    if ids.is_floating_point():
        fractional, low, high = torch.stack(
            [(ids != ids.round()).any().to(ids.dtype), ids.min(), ids.max()]
        ).tolist()
        if fractional:
            return None
    else:
        low, high = torch.stack([ids.min(), ids.max()]).tolist()
    origin = tables.integer_rows(int(low), int(high))
    return ids.long() + origin if origin else ids.long()
