#include "parallel/zero/flat_layout.h"

#include <map>

#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "core/json.h"

namespace tessera::parallel {

FlatLayout make_flat_layout(const std::vector<FlatParamInfo>& params, int world,
                            int64_t block_numel) {
  TS_CHECK(world >= 1, "[zero layout] expected a world size >= 1, found ", world);
  TS_CHECK(block_numel >= 1, "[zero layout] expected a block size >= 1 element, found ",
           block_numel);
  FlatLayout layout;
  layout.world = world;
  layout.block_numel = block_numel;
  FlatLayout::Block open;  // the block being filled; empty when end_param == first_param
  auto close = [&] {
    if (open.end_param == open.first_param) return;
    open.numel = (open.numel + world - 1) / world * world;
    open.chunk = open.numel / world;
    open.shard_offset =
        layout.blocks.empty() ? 0 : layout.blocks.back().shard_offset + layout.blocks.back().chunk;
    layout.numel += open.numel;
    layout.blocks.push_back(open);
    open = FlatLayout::Block{};
    open.offset = layout.numel;
    open.first_param = open.end_param = static_cast<int64_t>(layout.params.size());
  };
  for (const FlatParamInfo& p : params) {
    const int64_t n = numel_of(p.shape);
    TS_CHECK(n > 0, "[zero layout] parameter \"", p.name, "\" has no elements");
    // Every offset, padding included, stays far below int64's limit.
    constexpr int64_t kMaxNumel = int64_t{1} << 62;
    TS_CHECK(n <= kMaxNumel - layout.numel - open.numel - 2 * int64_t{world},
             "[zero layout] parameter \"", p.name, "\" of ", n,
             " elements takes the layout past 2^62 elements");
    TS_CHECK(layout.params.empty() || p.group >= layout.params.back().group,
             "[zero layout] parameter \"", p.name, "\" of group ", p.group,
             " follows one of group ", layout.params.back().group,
             "; expected parameters in group order");
    const bool fits = open.numel + n <= block_numel;
    if (open.end_param > open.first_param && (p.group != open.group || !fits)) close();
    if (open.end_param == open.first_param) open.group = p.group;
    layout.params.push_back({p.name, p.shape, p.group, open.offset + open.numel, n,
                             static_cast<int64_t>(layout.blocks.size())});
    open.numel += n;
    open.end_param = static_cast<int64_t>(layout.params.size());
    layout.param_numel += n;
  }
  close();
  return layout;
}

nlohmann::json FlatLayout::to_json() const {
  nlohmann::json ps = nlohmann::json::array();
  for (const Param& p : params) {
    ps.push_back({{"name", p.name}, {"shape", p.shape}, {"group", p.group}});
  }
  return {{"world", world}, {"block_numel", block_numel}, {"params", ps}};
}

FlatLayout FlatLayout::from_json(const nlohmann::json& doc, const std::string& source) {
  JsonObjectReader r(doc, "zero layout", source);
  const int world = r.required_in_range<int>("world", 1, 1 << 20);
  const int64_t block = r.required_in_range<int64_t>("block_numel", 1, int64_t{1} << 62);
  std::vector<FlatParamInfo> params;
  for (JsonObjectReader p : r.objects("params")) {
    FlatParamInfo info;
    info.name = p.required<std::string>("name");
    info.shape = p.required<std::vector<int64_t>>("shape");
    info.group = p.required_in_range<int>("group", 0, 1 << 20);
    p.finish();
    params.push_back(std::move(info));
  }
  r.finish();
  return make_flat_layout(params, world, block);
}

std::vector<std::pair<std::string, Tensor>> unshard(const FlatLayout& layout,
                                                    const std::vector<Tensor>& shards) {
  TS_CHECK(static_cast<int>(shards.size()) == layout.world, "[zero unshard] expected ",
           layout.world, " shards (the layout's world size), found ", shards.size());
  NoGradGuard no_grad;
  const DType dtype = shards.front().dtype();
  for (size_t r = 0; r < shards.size(); ++r) {
    TS_CHECK(shards[r].dim() == 1 && shards[r].numel() == layout.shard_numel() &&
                 shards[r].dtype() == dtype,
             "[zero unshard] shard ", r, ": expected ", dtype_name(dtype), " (",
             layout.shard_numel(), "), found ", shards[r].str());
  }
  // Reassemble the padded flat buffer block by block, then cut out the parameters.
  const Tensor flat = empty({layout.numel}, {dtype});
  for (const FlatLayout::Block& b : layout.blocks) {
    for (int r = 0; r < layout.world; ++r) {
      flat.narrow(0, b.offset + r * b.chunk, b.chunk)
          .copy_(shards[r].narrow(0, b.shard_offset, b.chunk));
    }
  }
  std::vector<std::pair<std::string, Tensor>> out;
  for (const FlatLayout::Param& p : layout.params) {
    out.emplace_back(p.name, flat.narrow(0, p.offset, p.numel).view(p.shape));
  }
  return out;
}

Tensor shard(const FlatLayout& layout, int rank,
             const std::vector<std::pair<std::string, Tensor>>& whole) {
  TS_CHECK(rank >= 0 && rank < layout.world, "[zero shard] expected a rank in [0, ", layout.world,
           "), found ", rank);
  NoGradGuard no_grad;
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : whole) by_name[name] = &t;
  Tensor out;
  for (const FlatLayout::Block& b : layout.blocks) {
    const int64_t lo = b.offset + rank * b.chunk, hi = lo + b.chunk;
    for (int64_t i = b.first_param; i < b.end_param; ++i) {
      const FlatLayout::Param& p = layout.params[i];
      const auto it = by_name.find(p.name);
      TS_CHECK(it != by_name.end(), "[zero shard] expected a tensor for parameter \"", p.name,
               "\", found none");
      const Tensor& t = *it->second;
      TS_CHECK(t.shape() == p.shape, "[zero shard] \"", p.name, "\": expected shape ",
               shape_str(p.shape), ", found ", shape_str(t.shape()));
      if (!out.defined()) out = zeros({layout.shard_numel()}, {t.dtype()});
      // The part of this parameter inside [lo, hi).
      const int64_t from = std::max(lo, p.offset), to = std::min(hi, p.offset + p.numel);
      if (from >= to) continue;
      out.narrow(0, b.shard_offset + (from - lo), to - from)
          .copy_(t.contiguous().view({p.numel}).narrow(0, from - p.offset, to - from));
    }
  }
  TS_CHECK(out.defined(), "[zero shard] the layout has no parameters");
  return out;
}

}  // namespace tessera::parallel
