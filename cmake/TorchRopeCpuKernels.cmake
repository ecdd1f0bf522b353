# SPDX-License-Identifier: BSD-3-Clause
# Which copies of the CPU row kernels are built (TORCH_ROPE_CPU_KERNELS).
#
# "all" (the default, and what wheels and the test command build): every copy, so that one
# librope runs at its best on any x86 CPU. "native": DEFAULT plus the widest copy the CPU of the
# build machine runs, for a build that only ever runs here (scripts/demo.sh): the same copy runs
# as in an "all" build, so the speed is the same, and the others (about half of the C++ compile
# time of librope) are not compiled. The rule is the one csrc/cpu/common_kernel_choice.cpp
# applies at run time to the CPU's features, read here from /proc/cpuinfo.

# Copies from narrowest to widest, as common_kernel_choice.cpp's levels.
set(TORCH_ROPE_X86_CPU_KERNELS DEFAULT AVX2 AVX512 AVX512_BF16)

# The widest copy a CPU with these /proc/cpuinfo flags runs (a "flags : ..." line or the flags).
function(torch_rope_widest_cpu_kernel out_var flags_line)
  string(REGEX REPLACE "^flags[ \t]*:" "" flags "${flags_line}")
  string(REGEX REPLACE "[ \t]+" ";" flags "${flags}")
  set(AVX2_needs avx2 fma f16c)
  set(AVX512_needs ${AVX2_needs} avx512f avx512bw avx512vl avx512dq)
  set(AVX512_BF16_needs ${AVX512_needs} avx512_bf16)
  set(widest DEFAULT)
  foreach(copy IN ITEMS AVX2 AVX512 AVX512_BF16)
    set(has_all TRUE)
    foreach(flag IN LISTS ${copy}_needs)
      if(NOT flag IN_LIST flags)
        set(has_all FALSE)
      endif()
    endforeach()
    if(has_all)
      set(widest ${copy})
    endif()
  endforeach()
  set(${out_var} ${widest} PARENT_SCOPE)
endfunction()

function(torch_rope_native_cpu_kernel out_var)
  set(flag_line "")
  if(EXISTS /proc/cpuinfo)
    file(STRINGS /proc/cpuinfo flag_line REGEX "^flags[ \t]*:" LIMIT_COUNT 1)
  endif()
  torch_rope_widest_cpu_kernel(widest "${flag_line}")
  set(${out_var} ${widest} PARENT_SCOPE)
endfunction()

# Sets TORCH_ROPE_CPU_KERNEL_COPIES (the copies to build) and TORCH_ROPE_CPU_KERNELS_LEFT_OUT.
function(torch_rope_select_cpu_kernels)
  if(NOT CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    set(copies DEFAULT)
    set(left_out "")
  elseif(TORCH_ROPE_CPU_KERNELS STREQUAL "all")
    set(copies ${TORCH_ROPE_X86_CPU_KERNELS})
    set(left_out "")
  elseif(TORCH_ROPE_CPU_KERNELS STREQUAL "native")
    torch_rope_native_cpu_kernel(widest)
    set(copies DEFAULT ${widest})
    list(REMOVE_DUPLICATES copies)
    set(left_out ${TORCH_ROPE_X86_CPU_KERNELS})
    list(REMOVE_ITEM left_out ${copies})
  else()
    message(FATAL_ERROR "torch-rope: TORCH_ROPE_CPU_KERNELS must be all or native, got "
            "'${TORCH_ROPE_CPU_KERNELS}'")
  endif()
  set(TORCH_ROPE_CPU_KERNEL_COPIES ${copies} PARENT_SCOPE)
  set(TORCH_ROPE_CPU_KERNELS_LEFT_OUT ${left_out} PARENT_SCOPE)
endfunction()
