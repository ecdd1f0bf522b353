#include "kernel_choice.h"

#include <ATen/Version.h>

#include <string>

namespace rope::cpu {
namespace {

struct Choice {
  RotateRowsFn fn;
  const char* name;
};

#ifdef TORCH_ROPE_CPU_X86_DISPATCH
// What the hardware (and the OS, which must save the wide registers) supports. torch's
// capability string alone is not enough: ATEN_CPU_CAPABILITY=avx512 makes it report "AVX512" on a
// CPU without AVX-512, and torch's own kernels check the hardware again, so must we.
// __builtin_cpu_supports reads CPUID and XCR0 through libgcc.
bool cpu_has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

bool cpu_has_avx512() {
  // The flags the AVX512 copy is compiled with (CMakeLists.txt), which are also what
  // torch's AVX512 capability requires.
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
}
#endif

Choice choose() {
#ifdef TORCH_ROPE_CPU_X86_DISPATCH
  __builtin_cpu_init();
  const std::string allowed = at::get_cpu_capability();
  if (allowed == "AVX512" && cpu_has_avx512()) {
    return {AVX512::rotate_rows, "AVX512"};
  }
  if ((allowed == "AVX512" || allowed == "AVX2") && cpu_has_avx2()) {
    return {AVX2::rotate_rows, "AVX2"};
  }
#endif
  return {DEFAULT::rotate_rows, "DEFAULT"};
}

const Choice& chosen() {
  static const Choice choice = choose();
  return choice;
}

}  // namespace

RotateRowsFn row_kernel() { return chosen().fn; }

const char* row_kernel_name() { return chosen().name; }

}  // namespace rope::cpu
