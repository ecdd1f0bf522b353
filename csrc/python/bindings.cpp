// torch_rope._C: the Python extension module. Loading it loads librope, whose static initialisers
// register the rope:: ops with the dispatcher; the bindings here are the few non-op entry points.
#include <torch/extension.h>
#include <torch_rope/ops.h>

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch-rope native module: loading it registers torch.ops.rope.*";
  m.def("rope_tables", &rope::rope_tables, pybind11::arg("theta"), pybind11::arg("rotary_dim"),
        pybind11::arg("max_seq_len"), pybind11::arg("device") = std::nullopt,
        "float32 (cos, sin) tables of shape (max_seq_len, rotary_dim // 2); see rope::rope_tables");
  m.def("compiled_with_cuda", &rope::compiled_with_cuda,
        "True when the library was built with its CUDA kernels");
  m.def("cpu_kernel_isa", &rope::cpu_kernel_isa,
        "Instruction set of the CPU kernel this process runs (AVX512, AVX2 or DEFAULT)");
  m.def("cpu_kernel_variant", &rope::cpu_kernel_variant,
        "The CPU kernel copy this process runs (AVX512_BF16, AVX512, AVX2 or DEFAULT)");
}
