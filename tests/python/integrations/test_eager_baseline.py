# SPDX-License-Identifier: BSD-3-Clause
"""torch_rope.eager (the plain-PyTorch baseline shipped for users, the benchmarks' "eager") agrees
with the tests' own oracle. It is checked here, and never used as the oracle elsewhere."""

import pytest
import torch
from helpers import (
    LAYOUT_IDS,
    LAYOUTS,
    assert_matches_reference,
    make_tables,
    randn,
    table_dtype_for,
)

import torch_rope


@pytest.mark.parametrize("interleaved", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.bfloat16], ids=["float64", "float32", "bfloat16"]
)
def test_eager_baseline_matches_oracle(dtype, inverse, interleaved):
    cos, sin = make_tables(40, 32, "cpu", table_dtype_for(dtype))
    x = randn(2, 9, 3, 48, dtype=dtype)
    positions = torch.randint(0, 40, (9, 1))
    kw = dict(interleaved=interleaved, inverse=inverse)
    out = torch_rope.eager.apply(x, cos, sin, positions, **kw)
    assert_matches_reference(out, x, positions, 32, **kw)
    q, k = torch_rope.eager.apply_qk(x, x[:, :, :1], cos, sin, positions, **kw)
    assert torch.equal(q, out)
    assert_matches_reference(k, x[:, :, :1], positions, 32, **kw)
