# SPDX-License-Identifier: BSD-3-Clause
# The one version of torch-rope: CMakeLists.txt and setup.py read this line.
__version__ = "0.1.0"
