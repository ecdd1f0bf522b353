# SPDX-License-Identifier: BSD-3-Clause
# Which CUDA architectures librope's kernels are compiled for.
#
# torch's CMake config turns TORCH_CUDA_ARCH_LIST (torch's form: "8.0;9.0+PTX") into nvcc's
# -gencode flags and switches CMake's own CMAKE_CUDA_ARCHITECTURES off, so TORCH_CUDA_ARCH_LIST is
# the one list that counts. Empty (the default) means TORCH_ROPE_DEFAULT_CUDA_ARCH_LIST. A
# CMAKE_CUDA_ARCHITECTURES given in CMake's form (-DCMAKE_CUDA_ARCHITECTURES=90-real, as
# scripts/gpu_check.sh passes) is translated into TORCH_CUDA_ARCH_LIST once and then reset to
# OFF: before, torch silently ignored it and every default architecture was compiled.

# 90-real -> 9.0, 90 -> 9.0+PTX, 90a-real -> 9.0a, 120-real -> 12.0; native -> torch's Auto
# (the GPUs of this machine). PTX alone (90-virtual), all and all-major have no torch form.
function(torch_rope_cuda_arch_list_from_cmake out_var cmake_architectures)
  set(result "")
  foreach(arch IN LISTS cmake_architectures)
    if(arch STREQUAL "native")
      list(APPEND result "Auto")
    elseif(arch MATCHES "^([0-9]+)([0-9])([af]?)(-real)?$")
      set(torch_arch "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}${CMAKE_MATCH_3}")
      if(NOT CMAKE_MATCH_4)
        string(APPEND torch_arch "+PTX")
      endif()
      list(APPEND result "${torch_arch}")
    else()
      message(FATAL_ERROR "torch-rope: CMAKE_CUDA_ARCHITECTURES entry '${arch}' has no "
              "TORCH_CUDA_ARCH_LIST form (expected e.g. 90-real, 90 or native); give "
              "-DTORCH_CUDA_ARCH_LIST=... (torch's form, e.g. \"8.0;9.0+PTX\") instead")
    endif()
  endforeach()
  set(${out_var} "${result}" PARENT_SCOPE)
endfunction()

# Sets TORCH_CUDA_ARCH_LIST (the normal variable torch's config reads) to the list this build
# compiles, and TORCH_ROPE_CUDA_ARCH_LIST_SOURCE to where it came from.
macro(torch_rope_resolve_cuda_architectures)
  set(TORCH_CUDA_ARCH_LIST "" CACHE STRING
      "CUDA architectures, torch's form (\"8.0;9.0+PTX\"); empty: ${TORCH_ROPE_DEFAULT_CUDA_ARCH_LIST}")
  set(CMAKE_CUDA_ARCHITECTURES OFF CACHE STRING
      "CMake's form (e.g. 90-real): read once into TORCH_CUDA_ARCH_LIST, then OFF")
  if(CMAKE_CUDA_ARCHITECTURES)
    torch_rope_cuda_arch_list_from_cmake(_torch_rope_translated "${CMAKE_CUDA_ARCHITECTURES}")
    message(STATUS "torch-rope: CMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES} read as "
            "TORCH_CUDA_ARCH_LIST=${_torch_rope_translated}")
    set(TORCH_CUDA_ARCH_LIST "${_torch_rope_translated}" CACHE STRING "" FORCE)
    set(CMAKE_CUDA_ARCHITECTURES OFF CACHE STRING "" FORCE)
  endif()
  if(TORCH_CUDA_ARCH_LIST)
    set(TORCH_ROPE_CUDA_ARCH_LIST_SOURCE "TORCH_CUDA_ARCH_LIST")
  else()
    set(TORCH_CUDA_ARCH_LIST "${TORCH_ROPE_DEFAULT_CUDA_ARCH_LIST}")
    set(TORCH_ROPE_CUDA_ARCH_LIST_SOURCE "the default list")
  endif()
endmacro()

# Blackwell's machine code from one device pass. torch's config gives each architecture its own
# -gencode, so sm_100 and sm_120 each cost a cicc run (the front half of nvcc, about 9 s of
# rope_rotate's 17 s per architecture). The kernels branch on __CUDA_ARCH__ only below 8.0 and
# from 10.0 up (kSmallSm, kBlackwell in csrc/cuda/rope_kernel.cuh), so compute_100's PTX is the
# same program for both and ptxas alone tells them apart:
# -gencode arch=compute_100,code=[sm_100,sm_120]. Every .cu file then takes 4 cicc runs by the
# default list instead of 5; the SASS check still reads both cubins. Only the plain (not a/f)
# pairs of 10.x and 12.x fold, and only when compute_100 is there to serve them.
function(torch_rope_share_blackwell_device_pass)
  set(flags "${CMAKE_CUDA_FLAGS}")
  set(pattern "-gencode arch=compute_(1[02][0-9]),code=sm_([0-9]+)")
  if(NOT flags MATCHES "-gencode arch=compute_100,code=sm_100( |$)")
    return()
  endif()
  set(folded "")
  string(REGEX MATCHALL "${pattern}" pairs "${flags}")
  foreach(pair IN LISTS pairs)
    if(pair MATCHES "^${pattern}$" AND CMAKE_MATCH_1 STREQUAL CMAKE_MATCH_2)
      list(APPEND folded "sm_${CMAKE_MATCH_2}")
      string(REPLACE "${pair}" "" flags "${flags}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES folded)
  list(LENGTH folded count)
  if(count LESS 2)
    return()
  endif()
  list(JOIN folded "," codes)
  string(REGEX REPLACE "  +" " " flags "${flags} -gencode arch=compute_100,code=[${codes}]")
  string(STRIP "${flags}" flags)
  message(STATUS "torch-rope: ${codes} from one compute_100 device pass")
  set(CMAKE_CUDA_FLAGS "${flags}" PARENT_SCOPE)
endfunction()
