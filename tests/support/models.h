// The real models of ../shared/models and their golden folders.
#pragma once

#include <string>
#include <vector>

namespace kvx::testing {

struct RealModel {
  std::string name;        // golden folder / perplexity.json "model"
  std::string model_path;  // relative to the shared folder
};

inline const std::vector<RealModel>& RealModels() {
  static const std::vector<RealModel> kModels = {
      {"stories260K", "models/stories260K/stories260K-F32.gguf"},
      {"tinystories656K", "models/tinystories656K/TinyStories-656K-F32.gguf"},
      {"probe", "models/probe/probe-llama-6L-d256-f32.gguf"},
  };
  return kModels;
}

}  // namespace kvx::testing
