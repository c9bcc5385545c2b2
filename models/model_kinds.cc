// The model kinds a run config's model.type names. A new kind is one line in model_kinds().
#include "models/model_kinds.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "models/bert/spec.h"
#include "models/gpt2/spec.h"

namespace tessera {
namespace {

struct ModelKind {
  std::string type;
  std::function<std::shared_ptr<const ModelSpec>(JsonObjectReader&,
                                                 const std::optional<SparsityConfig>&)>
      parse;
};

const std::vector<ModelKind>& model_kinds() {
  static const std::vector<ModelKind> kinds = {
      {"gpt2", &GptSpec::parse},
      {"bert", &BertSpec::parse},
  };
  return kinds;
}

}  // namespace

std::shared_ptr<const ModelSpec> parse_model_spec(
    JsonObjectReader& model, const std::optional<SparsityConfig>& sparse_attention) {
  std::vector<std::string> types;
  for (const ModelKind& k : model_kinds()) types.push_back(k.type);
  const std::string type = model.required_one_of("type", types);
  const auto kind = std::find_if(model_kinds().begin(), model_kinds().end(),
                                 [&](const ModelKind& k) { return k.type == type; });
  // Only a reader collecting its problems returns from required_one_of without a kind
  // (Note [One pass] in core/json.h): nothing of the model can be read then.
  if (kind == model_kinds().end()) {
    model.throw_if_collected();
    TS_INTERNAL_ASSERT(false, "model.type \"", type, "\" is no kind, and no problem was collected");
  }
  return kind->parse(model, sparse_attention);
}

}  // namespace tessera
