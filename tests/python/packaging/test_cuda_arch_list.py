# SPDX-License-Identifier: BSD-3-Clause
"""Which CUDA architectures a build compiles.

`pip install .` (setup.py) follows torch's rule for extensions: TORCH_CUDA_ARCH_LIST when set,
otherwise the GPUs present (the newest with PTX, clamped to what torch was built for), otherwise
CMake's default list. CMake itself reads a CMAKE_CUDA_ARCHITECTURES given in CMake's form into
torch's list, which torch's CMake config would otherwise ignore. The expected values are written
here from those rules (and from torch.utils.cpp_extension's), not computed by the code under test.
"""

import importlib.util
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def load_setup():
    spec = importlib.util.spec_from_file_location("torch_rope_setup", REPO / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: setup() does not run
    return module


@pytest.mark.parametrize(
    "env, expected",
    [
        ("8.0", "8.0"),
        ("8.6 9.0+PTX", "8.6;9.0+PTX"),  # torch accepts spaces
        ("7.5;12.0;", "7.5;12.0"),
        ("Hopper", "Hopper"),  # torch's names go through to torch's CMake config
    ],
)
def test_set_list_wins_over_the_gpus_present(env, expected):
    arch_list, why = load_setup().cuda_arch_list(env, [(9, 0)], (12, 0))
    assert (arch_list, why) == (expected, "TORCH_CUDA_ARCH_LIST")


@pytest.mark.parametrize("env", [None, "", " ", "native"])
@pytest.mark.parametrize(
    "gpus, expected",
    [
        ([(9, 0)], "9.0+PTX"),
        ([(8, 6), (9, 0), (8, 6)], "8.6;9.0+PTX"),  # each once, sorted, PTX for the newest
        ([(13, 1)], "12.0+PTX"),  # newer than this torch: clamped, as torch clamps
    ],
)
def test_unset_list_means_the_gpus_present(env, gpus, expected):
    assert load_setup().cuda_arch_list(env, gpus, (12, 0)) == (expected, "the GPUs present")


def test_no_gpu_means_the_default_list():
    arch_list, why = load_setup().cuda_arch_list(None, [], (0, 0))
    assert arch_list == ""  # CMake then compiles TORCH_ROPE_DEFAULT_CUDA_ARCH_LIST
    assert "no GPU" in why


def cmake_translate(cmake_form):
    """torch_rope_cuda_arch_list_from_cmake run by cmake -P: (exit code, output)."""
    script = (
        "cmake_minimum_required(VERSION 3.22)\n"
        f'include("{REPO}/cmake/TorchRopeCudaArchitectures.cmake")\n'
        f'torch_rope_cuda_arch_list_from_cmake(out "{cmake_form}")\n'
        'message(STATUS "result=${out}")\n'
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "check.cmake"
        path.write_text(script)
        done = subprocess.run(["cmake", "-P", str(path)], capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
@pytest.mark.parametrize(
    "cmake_form, torch_form",
    [
        ("90-real", "9.0"),  # what scripts/gpu_check.sh passes for an H100
        ("90", "9.0+PTX"),  # CMake's bare number: machine code and PTX
        ("90a-real", "9.0a"),
        ("120-real;100", "12.0;10.0+PTX"),
        # The list CMakeLists.txt used to cache: an old build directory keeps its architectures.
        ("75-real;80-real;90;100-real;120-real", "7.5;8.0;9.0+PTX;10.0;12.0"),
        ("native", "Auto"),
    ],
)
def test_cmake_form_is_read_into_torchs_list(cmake_form, torch_form):
    code, out = cmake_translate(cmake_form)
    assert code == 0, out
    assert f"result={torch_form}\n" in out


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
@pytest.mark.parametrize("cmake_form", ["90-virtual", "all-major", "sm_90"])
def test_cmake_form_without_a_torch_form_is_refused(cmake_form):
    code, out = cmake_translate(cmake_form)
    assert code != 0
    assert f"'{cmake_form}'" in out and "TORCH_CUDA_ARCH_LIST" in out
