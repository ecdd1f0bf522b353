# SPDX-License-Identifier: BSD-3-Clause
"""Builds the torch-rope wheel by driving the project's one CMake build (CMakeLists.txt).

    pip install --no-build-isolation .      # uses the torch already installed
    pip wheel --no-build-isolation .

The wheel holds the Python package, torch_rope/_C (the pybind11 module), torch_rope/lib/librope.so
(which _C links through its $ORIGIN/lib rpath rather than recompiling the kernels), the public
headers in torch_rope/include and the CMake package in torch_rope/lib/cmake/TorchRope.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


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
        # TORCH_ROPE_CUDA_ARCHITECTURES (CMake's form, e.g. "90-real") replaces the default list
        # of CMakeLists.txt; unset or empty keeps it (scripts/wheel_smoke.sh passes its
        # TORCH_ROPE_WHEEL_CUDA_ARCHITECTURES here).
        architectures = os.environ.get("TORCH_ROPE_CUDA_ARCHITECTURES")
        if architectures:
            arch_list = ";".join(
                f"{a.split('-')[0][:-1]}.{a.split('-')[0][-1]}" for a in architectures.split(";")
            )
            configure += [
                f"-DCMAKE_CUDA_ARCHITECTURES={architectures}",
                f"-DTORCH_CUDA_ARCH_LIST={arch_list}",
            ]
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
setup(
    ext_modules=[CMakeExtension("torch_rope._C")],
    cmdclass={"build_ext": CMakeBuild},
)
