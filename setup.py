# SPDX-License-Identifier: BSD-3-Clause
"""Builds the torch-rope wheel by driving the project's one CMake build (CMakeLists.txt).

    pip install --no-build-isolation .      # uses the torch already installed
    pip wheel --no-build-isolation .

The wheel holds the Python package, torch_rope/_C (the pybind11 module), torch_rope/lib/librope.so
(which _C links through its $ORIGIN/lib rpath rather than recompiling the kernels), the public
headers in torch_rope/include and the CMake package in torch_rope/lib/cmake/TorchRope.

The CUDA architectures follow the convention of torch extensions (torch.utils.cpp_extension):
TORCH_CUDA_ARCH_LIST when set ("8.0;9.0+PTX", spaces or semicolons, torch's names such as
"Hopper"); otherwise those of the GPUs present, the newest with PTX; with no GPU present, the
default list of CMakeLists.txt (TORCH_ROPE_DEFAULT_CUDA_ARCH_LIST: Turing to Blackwell and Hopper
PTX, what the test command builds and checks). TORCH_ROPE_CUDA=OFF builds the CPU backend only.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def cuda_arch_list(env_value, capabilities, newest_supported):
    """(TORCH_CUDA_ARCH_LIST for CMake, why), torch's rule for extensions.

    env_value: TORCH_CUDA_ARCH_LIST from the environment (None when unset); capabilities: the
    (major, minor) of each GPU present; newest_supported: the newest (major, minor) this torch
    was built for, to which a newer GPU is clamped, as torch does. An empty list means CMake's
    default list.
    """
    if env_value and env_value.strip() and env_value.strip() != "native":
        return ";".join(env_value.replace(" ", ";").split(";")).strip(";"), "TORCH_CUDA_ARCH_LIST"
    present = sorted({min(tuple(c), tuple(newest_supported)) for c in capabilities})
    if not present:
        return "", "no GPU present: the default list of CMakeLists.txt"
    arches = [f"{major}.{minor}" for major, minor in present]
    arches[-1] += "+PTX"
    return ";".join(arches), "the GPUs present"


def gpus_present():
    """(capabilities of the GPUs present, the newest capability this torch was built for)."""
    import torch

    if not torch.cuda.is_available():
        return [], (0, 0)
    capabilities = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    built = [a[3:].rstrip("af") for a in torch.cuda.get_arch_list() if a.startswith("sm_")]
    newest = max(((int(a[:-1]), int(a[-1])) for a in built), default=max(capabilities))
    return capabilities, newest


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        import torch

        package_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        # TORCH_ROPE_CMAKE_BUILD_DIR: scripts/wheel_smoke.sh builds in build-wheel/, beside build/
        # at the same depth, so that ccache (with CCACHE_BASEDIR) finds the main build's objects.
        build_dir = Path(
            os.environ.get("TORCH_ROPE_CMAKE_BUILD_DIR")
            or Path(self.build_temp).resolve() / "cmake"
        ).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake",
            "-S",
            str(ROOT),
            "-B",
            str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DTORCH_ROPE_PYTHON_PACKAGE_DIR={package_dir}",
            # librope, its headers and the CMake package go to torch_rope/{lib,include}, so
            # one pip install serves Python and C++ (torch_rope.cmake_prefix_path).
            f"-DCMAKE_INSTALL_PREFIX={package_dir}",
            "-DCMAKE_INSTALL_LIBDIR=lib",
            "-DTORCH_ROPE_COPY_LIB_TO_PACKAGE=OFF",
            f"-DTORCH_ROPE_CUDA={os.environ.get('TORCH_ROPE_CUDA', 'AUTO')}",
            "-DTORCH_ROPE_BUILD_TESTS=OFF",
        ]
        # Passed every time (empty: CMake's default list), so that a build directory kept from
        # an earlier install does not keep that install's list.
        if os.environ.get("TORCH_ROPE_CUDA", "AUTO").upper() != "OFF":
            arch_list, why = cuda_arch_list(os.environ.get("TORCH_CUDA_ARCH_LIST"), *gpus_present())
            print(f"torch-rope: CUDA architectures: {arch_list or 'the default list'} ({why})")
            configure += [f"-DTORCH_CUDA_ARCH_LIST={arch_list}", "-DCMAKE_CUDA_ARCHITECTURES=OFF"]
        if shutil.which("ccache"):
            os.environ.setdefault("CCACHE_BASEDIR", str(ROOT))
            # The build directory out of the hash (scripts/build.sh says why).
            os.environ.setdefault("CCACHE_NOHASHDIR", "1")
            configure += [
                "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
                "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache",
            ]
        if (
            subprocess.call(
                ["ninja", "--version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            == 0
        ):
            configure += ["-G", "Ninja"]
        subprocess.check_call(configure)
        jobs = os.environ.get("BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", str(build_dir), "--parallel", jobs])
        subprocess.check_call(["cmake", "--install", str(build_dir)])


# Metadata, packages and the version live in pyproject.toml; this file only adds the CMake step.
# (setuptools runs this file as __main__; tests import it for cuda_arch_list.)
if __name__ == "__main__":
    setup(
        ext_modules=[CMakeExtension("torch_rope._C")],
        cmdclass={"build_ext": CMakeBuild},
    )
