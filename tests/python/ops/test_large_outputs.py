# SPDX-License-Identifier: BSD-3-Clause
"""Large CPU outputs (16 MiB and up) live in mappings of their own (csrc/cpu/common_fresh_output.h):
they must be ordinary tensors to the user (right values, resizable, shareable, serialisable), a
freed one's mapping serves the next output of its length, and what is kept stays within 256 MiB."""

import io
import os
import sys

import pytest
import references as ref
import torch

import torch_rope

OWN_PAGES_BYTES = 16 << 20  # kOwnPagesBytes in csrc/cpu/common_fresh_output.h
KEPT_BYTES = 256 << 20  # KeptMappings::kKeptBytes


# (seq, 32, 64) float32 tensors (8 KiB a row) on either side of the threshold, and one that ends
# inside a 2 MiB page (the mapping's tail is in small pages).
@pytest.mark.parametrize("seq", [2047, 2048, 2049, 2100])
def test_outputs_around_the_threshold_match_the_reference(seq):
    g = torch.Generator().manual_seed(seq)
    x = torch.randn(seq, 32, 64, generator=g)
    cos, sin = ref.tables(seq, 64)
    positions = torch.arange(seq)[:, None]
    out = torch_rope.apply(x, cos, sin, positions, interleaved=False)
    assert (out.nbytes >= OWN_PAGES_BYTES) == (seq >= 2048)
    torch.testing.assert_close(
        out.double(),
        ref.rope_with_tables(x.double(), cos, sin, positions, interleaved=False),
        rtol=0,
        atol=2e-6,
    )


def large_output():
    x = torch.randn(8192, 32, 64, generator=torch.Generator().manual_seed(1))
    cos, sin = ref.tables(8192, 64)
    return torch_rope.apply(x, cos, sin, torch.arange(8192)[:, None], interleaved=False)


def test_a_large_output_behaves_like_any_tensor():
    out = large_output()
    assert out.nbytes >= OWN_PAGES_BYTES
    kept = out.clone()
    out.add_(1.0)
    torch.testing.assert_close(out, kept + 1.0, rtol=0, atol=0)
    # Resizing reallocates through the storage's allocator: larger keeps the data, smaller too.
    out.resize_(8192 * 2, 32, 64)
    torch.testing.assert_close(out[:8192], kept + 1.0, rtol=0, atol=0)
    out.resize_(16, 32, 64)
    torch.testing.assert_close(out, kept[:16] + 1.0, rtol=0, atol=0)
    # Shared memory and serialisation copy the bytes out of the mapping.
    shared = large_output().share_memory_()
    assert shared.is_shared()
    torch.testing.assert_close(shared, kept, rtol=0, atol=0)
    buffer = io.BytesIO()
    torch.save(large_output(), buffer)
    buffer.seek(0)
    torch.testing.assert_close(torch.load(buffer), kept, rtol=0, atol=0)


def test_a_large_output_takes_part_in_autograd():
    x = torch.randn(8192, 32, 64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    cos, sin = ref.tables(8192, 64)
    out = torch_rope.apply(x, cos, sin, torch.arange(8192)[:, None], interleaved=False)
    grad = torch.randn_like(out)
    out.backward(grad)
    # The rotation is orthogonal: the gradient is the inverse rotation.
    expected = ref.rope_with_tables(
        grad.double(), cos, sin, torch.arange(8192)[:, None], interleaved=False, inverse=True
    )
    torch.testing.assert_close(x.grad.double(), expected, rtol=0, atol=2e-6)


def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rotate_64_mib():
    x = torch.ones(4, 32, 1024, 128)
    cos, sin = ref.tables(1024, 128)
    return lambda: torch_rope.apply(x, cos, sin, torch.arange(1024))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_a_freed_output_serves_the_next_one_of_its_length():
    call = rotate_64_mib()
    first = call()
    address = first.data_ptr()
    del first
    second = call()
    assert second.data_ptr() == address  # the kept mapping, not a new one
    torch.testing.assert_close(second[0, 0, 0], call()[0, 0, 0], rtol=0, atol=0)
    before = resident_mib()
    latest = [second]
    del second
    for _ in range(40):  # 2.5 GiB in all if nothing were reused
        latest[0] = None  # freed before the next call, as a model's step frees it
        latest[0] = call()
    assert resident_mib() - before < 64


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_what_is_kept_after_outputs_die_stays_within_its_bound():
    call = rotate_64_mib()
    before = resident_mib()
    alive = [call() for _ in range(12)]  # 768 MiB of outputs alive at once
    assert resident_mib() - before > 600
    del alive  # 4 of them fit the 256 MiB kept; the other 8 must be unmapped
    assert resident_mib() - before < KEPT_BYTES / 2**20 + 64
