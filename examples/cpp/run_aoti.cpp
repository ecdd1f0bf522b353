// SPDX-License-Identifier: BSD-3-Clause
// Loads an AOTInductor package (.pt2) compiled in Python from a block that calls
// torch.ops.rope.apply, and runs it.
//
//   run_aoti <model.pt2> <inputs.pt> <outputs.pt>
//
// AOTInductor compiles the surrounding graph to C++ and calls our custom op back through the
// dispatcher by name, so the program only needs librope linked (TorchRope::rope) for the op to be
// registered.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <iterator>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: " << argv[0] << " <model.pt2> <inputs.pt> <outputs.pt>\n";
    return 2;
  }
  torch::inductor::AOTIModelPackageLoader loader(argv[1]);

  std::ifstream in(argv[2], std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto inputs = torch::pickle_load(bytes).toGenericDict();
  torch::NoGradGuard no_grad;
  auto outputs = loader.run({inputs.at("x").toTensor(), inputs.at("positions").toTensor()});

  auto saved = torch::pickle_save(outputs.at(0));
  std::ofstream(argv[3], std::ios::binary)
      .write(saved.data(), static_cast<std::streamsize>(saved.size()));
  std::cout << "run_aoti: ran " << argv[1] << " -> output " << outputs.at(0).sizes() << "\n";
  return 0;
}
