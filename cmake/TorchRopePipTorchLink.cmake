# SPDX-License-Identifier: BSD-3-Clause
# Linking executables against a pip-installed torch.
#
# The torch wheel keeps its CUDA libraries in site-packages/nvidia/*/lib; at run time
# libtorch_cuda.so finds them through its own $ORIGIN rpath. When linking an *executable*, GNU ld
# resolves those transitive dependencies itself and, once any -rpath is on the command line,
# ignores the library's rpath, so it can pick an older system copy (e.g. the toolkit's
# libnccl.so.2) and fail with undefined nccl* symbols. -rpath-link to the wheel's copies fixes the
# link and changes nothing at run time. Needs TORCH_INSTALL_PREFIX (set by find_package(Torch)).
function(torch_rope_pip_torch_rpath_link_dirs out_var)
  set(${out_var} "" PARENT_SCOPE)
  get_filename_component(nvidia_dir "${TORCH_INSTALL_PREFIX}/../nvidia" ABSOLUTE)
  if(EXISTS "${nvidia_dir}")
    file(GLOB lib_dirs LIST_DIRECTORIES true "${nvidia_dir}/*/lib")
    list(JOIN lib_dirs ":" joined)
    set(${out_var} "${joined}" PARENT_SCOPE)
  endif()
endfunction()
