// SPDX-License-Identifier: BSD-3-Clause
#include "common_kernel_choice.h"

#include <ATen/Version.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

namespace rope::cpu {
namespace {

struct Choice {
  RotateRowsFn fn;
  const char* isa;
  const char* variant;
};

// Kernel copies from narrowest to widest; a ceiling admits a prefix of this list.
enum Level { kDefault = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

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

// torch's capability string says only "AVX512"; the bfloat16 instructions need their own CPUID
// bit (Cooper Lake, Sapphire Rapids and later Intel; AMD Zen 4 and later).
bool cpu_has_avx512_bf16() { return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16"); }

Level hardware_level() {
  __builtin_cpu_init();
  if (cpu_has_avx512_bf16()) return kAvx512Bf16;
  if (cpu_has_avx512()) return kAvx512;
  if (cpu_has_avx2()) return kAvx2;
  return kDefault;
}
#else
Level hardware_level() { return kDefault; }
#endif

// torch's setting: "AVX512" admits both AVX-512 copies.
Level torch_level() {
  const std::string allowed = at::get_cpu_capability();
  if (allowed == "AVX512") return kAvx512Bf16;
  if (allowed == "AVX2") return kAvx2;
  return kDefault;
}

Level env_level() {
  // Read once, under the static initialisation of chosen().
  const char* value = std::getenv("TORCH_ROPE_CPU_KERNEL");
  if (value == nullptr || *value == '\0') {
    return kAvx512Bf16;
  }
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (v == "default") return kDefault;
  if (v == "avx2") return kAvx2;
  if (v == "avx512") return kAvx512;
  if (v == "avx512_bf16") return kAvx512Bf16;
  TORCH_CHECK(false,
              "TORCH_ROPE_CPU_KERNEL must be one of default, avx2, avx512, avx512_bf16, got '",
              value, "'");
}

// The widest copy this build holds at or below `level`; DEFAULT is always built.
Level built_at_or_below(Level level) {
  if (level >= kAvx512Bf16 && ROPE_CPU_HAS_AVX512_BF16) return kAvx512Bf16;
  if (level >= kAvx512 && ROPE_CPU_HAS_AVX512) return kAvx512;
  if (level >= kAvx2 && ROPE_CPU_HAS_AVX2) return kAvx2;
  return kDefault;
}

Choice choose() {
  const Level level = built_at_or_below(std::min({hardware_level(), torch_level(), env_level()}));
  switch (level) {
#if ROPE_CPU_HAS_AVX512_BF16
    case kAvx512Bf16:
      return {AVX512_BF16::rotate_rows, "AVX512", "AVX512_BF16"};
#endif
#if ROPE_CPU_HAS_AVX512
    case kAvx512:
      return {AVX512::rotate_rows, "AVX512", "AVX512"};
#endif
#if ROPE_CPU_HAS_AVX2
    case kAvx2:
      return {AVX2::rotate_rows, "AVX2", "AVX2"};
#endif
    default:
      return {DEFAULT::rotate_rows, "DEFAULT", "DEFAULT"};
  }
}

const Choice& chosen() {
  static const Choice choice = choose();
  return choice;
}

}  // namespace

RotateRowsFn row_kernel() { return chosen().fn; }

const char* row_kernel_name() { return chosen().isa; }

const char* row_kernel_variant() { return chosen().variant; }

}  // namespace rope::cpu
