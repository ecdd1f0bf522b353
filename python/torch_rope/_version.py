# SPDX-License-Identifier: BSD-3-Clause
# The one version of torch-rope: CMakeLists.txt reads this line, and pyproject.toml takes the
# package version from this module.
__version__ = "0.1.0"
