// SPDX-License-Identifier: BSD-3-Clause
// Loads a TorchScript module saved from Python (one that calls torch.ops.rope.apply) and runs it.
//
//   run_scripted <module.pt> <inputs.pt> <outputs.pt>
//
// It includes no torch-rope header and calls no torch-rope function on purpose: the rope ops
// must be registered just because the program links TorchRope::rope (librope is linked
// --no-as-needed, so its static registrations run at load).
#include <torch/script.h>
#include <torch/serialize.h>

#include <fstream>
#include <iostream>
#include <iterator>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: " << argv[0] << " <module.pt> <inputs.pt> <outputs.pt>\n";
    return 2;
  }
  torch::jit::Module module = torch::jit::load(argv[1]);
  module.eval();

  std::ifstream in(argv[2], std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto inputs = torch::pickle_load(bytes).toGenericDict();
  torch::NoGradGuard no_grad;
  auto out =
      module.forward({inputs.at("x").toTensor(), inputs.at("positions").toTensor()}).toTensor();

  auto saved = torch::pickle_save(out);
  std::ofstream(argv[3], std::ios::binary)
      .write(saved.data(), static_cast<std::streamsize>(saved.size()));
  std::cout << "run_scripted: ran " << argv[1] << " -> output " << out.sizes() << "\n";
  return 0;
}
