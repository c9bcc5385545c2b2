// DeepSpeed's sparse_attention section and layouts: the reference layouts of deepspeed.md
// 3.1 bit for bit, the random blocks, DeepSpeed's errors and the strict JSON reading.
#include "models/sparse/sparsity_config.h"

#include <string>
#include <vector>

#include "core/json.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using Catch::Contains;
using testing::error_of;

SparsityConfig parse(const std::string& section) {
  const nlohmann::json doc = parse_json(str_cat(R"({"sparse_attention": )", section, "}"));
  JsonObjectReader r(doc, "config");
  SparsityConfig c = SparsityConfig::from_json(r.object("sparse_attention"));
  r.finish();
  return c;
}

// Head h's rows as "0"/"1" strings, row = query block.
std::vector<std::string> rows(const Tensor& layout, int64_t h) {
  const int64_t nb = layout.shape()[1];
  const std::vector<int64_t> v = layout.to_vector<int64_t>();
  std::vector<std::string> out;
  for (int64_t r = 0; r < nb; ++r) {
    std::string row;
    for (int64_t c = 0; c < nb; ++c) row += v[(h * nb + r) * nb + c] ? '1' : '0';
    out.push_back(row);
  }
  return out;
}

// Layout of `section` with block 16 and nb blocks per row.
Tensor layout_of(const std::string& section, int64_t nb, int64_t heads = 1, uint64_t seed = 7) {
  return make_sparsity_layout(parse(section), heads, nb * 16, seed);
}

bool lower_triangular(const Tensor& layout) {
  const int64_t nb = layout.shape()[1];
  for (int64_t h = 0; h < layout.shape()[0]; ++h) {
    const std::vector<std::string> r = rows(layout, h);
    for (int64_t i = 0; i < nb; ++i) {
      if (r[i].find('1', i + 1) != std::string::npos) return false;
    }
  }
  return true;
}

TEST_CASE("fixed layouts match DeepSpeed's") {
  const Tensor bi = layout_of(R"({"mode": "fixed", "num_local_blocks": 4})", 8);
  CHECK(bi.dtype() == DType::i64);
  CHECK(bi.shape() == Shape{1, 8, 8});
  CHECK(rows(bi, 0) == std::vector<std::string>{"11110001", "11110001", "11110001", "11110001",
                                                "00011111", "00011111", "00011111", "00011111"});
  const Tensor uni = layout_of(R"({"attention": "unidirectional"})", 8);
  CHECK(rows(uni, 0) == std::vector<std::string>{"10000000", "11000000", "11100000", "11110000",
                                                 "00011000", "00011100", "00011110", "00011111"});
  // A short last window keeps G global blocks, moved left to fit: min(end + first, nb - G).
  const Tensor g2 = layout_of(R"({"num_global_blocks": 2})", 10);
  CHECK(rows(g2, 0)[0] == "1111001111");
  CHECK(rows(g2, 0)[8] == "0011001111");
}

TEST_CASE("fixed global patterns differ per head, with horizontal rows") {
  const Tensor t = layout_of(R"({"num_different_global_patterns": 2,
      "different_layout_per_head": true, "horizontal_global_attention": true})",
                             10, /*heads=*/4);
  const std::vector<std::string> h0 = rows(t, 0), h1 = rows(t, 1);
  CHECK(h0[0] == "1111000101");
  CHECK(h0[3] == "1111111111");
  CHECK(h0[8] == "0001000111");
  CHECK(h1[0] == "1111001001");
  CHECK(h1[2] == "1111111111");
  // Pattern h % P: heads 2 and 3 repeat heads 0 and 1.
  CHECK(rows(t, 2) == h0);
  CHECK(rows(t, 3) == h1);
}

TEST_CASE("bigbird and bslongformer layouts match DeepSpeed's") {
  const std::vector<std::string> want = {"11111111", "11100000", "11110000", "10111000",
                                         "10011100", "10001110", "10000111", "10000011"};
  const Tensor bigbird = layout_of(
      R"({"mode": "bigbird", "num_random_blocks": 0, "num_sliding_window_blocks": 3,
          "num_global_blocks": 1})",
      8);
  CHECK(rows(bigbird, 0) == want);
  const Tensor longformer = layout_of(R"({"mode": "bslongformer", "num_sliding_window_blocks": 3,
                    "global_block_indices": [0]})",
                                      8);
  CHECK(rows(longformer, 0) == want);
  // A range [1, 3) is two global rows and columns.
  const Tensor range = layout_of(
      R"({"mode": "bslongformer", "global_block_indices": [1], "global_block_end_indices": [3]})",
      6);
  CHECK(rows(range, 0) ==
        std::vector<std::string>{"111000", "111111", "111111", "011110", "011111", "011011"});
}

TEST_CASE("variable and local sliding window layouts match DeepSpeed's") {
  const Tensor variable = layout_of(
      R"({"mode": "variable", "local_window_blocks": [2, 4], "global_block_indices": [0]})", 10);
  CHECK(rows(variable, 0) == std::vector<std::string>{"1100000000", "1100000000", "1011110000",
                                                      "1011110000", "1011110000", "1011110000",
                                                      "1000001111", "1000001111", "1000001111",
                                                      "1000001111"});
  const Tensor sliding =
      layout_of(R"({"mode": "local_sliding_window", "num_sliding_window_blocks": 3})", 8);
  CHECK(rows(sliding, 0) == std::vector<std::string>{"10000000", "11000000", "01100000", "00110000",
                                                     "00011000", "00001100", "00000110",
                                                     "00000011"});
  const Tensor both_ways =
      layout_of(R"({"mode": "local_sliding_window", "attention": "bidirectional"})", 4);
  CHECK(rows(both_ways, 0) == std::vector<std::string>{"1100", "1110", "0111", "0011"});
  const Tensor dense = layout_of(R"({"mode": "dense"})", 3, /*heads=*/2);
  CHECK(dense.to_vector<int64_t>() == std::vector<int64_t>(18, 1));
}

TEST_CASE("unidirectional layouts are lower triangular") {
  CHECK(lower_triangular(layout_of(R"({"attention": "unidirectional",
      "num_different_global_patterns": 4, "different_layout_per_head": true})",
                                   13, 4)));
  CHECK(lower_triangular(layout_of(R"({"mode": "bigbird", "attention": "unidirectional",
      "num_random_blocks": 3, "num_global_blocks": 2, "different_layout_per_head": true})",
                                   16, 3)));
  CHECK(lower_triangular(layout_of(R"({"mode": "bslongformer", "attention": "unidirectional",
      "global_block_indices": [0, 5], "global_block_end_indices": [2, 8]})",
                                   12)));
  CHECK(lower_triangular(layout_of(R"({"mode": "variable", "attention": "unidirectional",
      "local_window_blocks": [1, 3], "global_block_indices": [2, 6]})",
                                   12)));
  CHECK(lower_triangular(
      layout_of(R"({"mode": "local_sliding_window", "num_sliding_window_blocks": 5})", 9)));
  // DeepSpeed's variable mode samples random blocks from the whole row even when
  // unidirectional; the attention's causal mask hides them.
  CHECK_FALSE(lower_triangular(layout_of(R"({"mode": "variable", "attention": "unidirectional",
      "num_random_blocks": 4})",
                                         16)));
}

TEST_CASE("one layout for all heads copies head 0; per-head random layouts differ") {
  const std::string shared = R"({"mode": "bigbird", "num_random_blocks": 2})";
  const Tensor t = layout_of(shared, 16, /*heads=*/4);
  for (int64_t h = 1; h < 4; ++h) CHECK(rows(t, h) == rows(t, 0));
  // Head 0 of a per-head layout is the shared layout: same (seed, head, row) streams.
  const Tensor per_head = layout_of(
      R"({"mode": "bigbird", "num_random_blocks": 2, "different_layout_per_head": true})", 16, 4);
  CHECK(rows(per_head, 0) == rows(t, 0));
  CHECK(rows(per_head, 1) != rows(per_head, 0));
}

TEST_CASE("random blocks depend only on the seed") {
  const std::string section = R"({"mode": "variable", "num_random_blocks": 3,
      "local_window_blocks": [1], "global_block_indices": [], "different_layout_per_head": true})";
  const Tensor a = layout_of(section, 32, 8, /*seed=*/11);
  const Tensor b = layout_of(section, 32, 8, /*seed=*/11);
  const Tensor c = layout_of(section, 32, 8, /*seed=*/12);
  CHECK(a.to_vector<int64_t>() == b.to_vector<int64_t>());
  CHECK(a.to_vector<int64_t>() != c.to_vector<int64_t>());
  // The pattern is the diagonal plus 3 distinct random columns; every column is drawn.
  std::vector<int64_t> hits(32, 0);
  for (int64_t h = 0; h < 8; ++h) {
    const std::vector<std::string> r = rows(a, h);
    for (int64_t i = 0; i < 32; ++i) {
      CHECK(r[i][i] == '1');
      const auto ones = std::count(r[i].begin(), r[i].end(), '1');
      CHECK((ones == 3 || ones == 4));
      for (int64_t j = 0; j < 32; ++j) hits[j] += r[i][j] == '1' && j != i;
    }
  }
  for (int64_t j = 0; j < 32; ++j) CHECK(hits[j] > 0);
}

TEST_CASE("bigbird unidirectional rows sample their past, all of it when it is short") {
  const Tensor t = layout_of(R"({"mode": "bigbird", "attention": "unidirectional",
      "num_random_blocks": 3, "num_sliding_window_blocks": 1})",
                             12);
  const std::vector<std::string> r = rows(t, 0);
  CHECK(r[0] == "100000000000");
  CHECK(r[1] == "110000000000");
  CHECK(r[2] == "111000000000");
  // Later rows: column 0, the diagonal and 3 distinct past columns.
  for (int64_t i = 3; i < 12; ++i) {
    const auto ones = std::count(r[i].begin(), r[i].end(), '1');
    CHECK((ones >= 3 && ones <= 5));
  }
}

TEST_CASE("DeepSpeed's constructor errors") {
  CHECK_THAT(error_of([] { parse(R"({"num_local_blocks": 4, "num_global_blocks": 3})"); }),
             Contains("[sparse_attention] $.sparse_attention: Number of blocks in a local "
                      "window, 4, must be dividable by number of global blocks, 3!"));
  CHECK_THAT(error_of([] { parse(R"({"num_different_global_patterns": 2})"); }),
             Contains("Number of different layouts cannot be more than one when you have set a "
                      "single layout for all heads! Set different_layout_per_head to True."));
  CHECK_THAT(error_of([] {
               parse(R"({"num_global_blocks": 2, "num_different_global_patterns": 3,
                         "different_layout_per_head": true})");
             }),
             Contains("Number of layout versions (num_different_global_patterns), 3, cannot be "
                      "larger than number of local window blocks divided by number of global "
                      "blocks, 4 / 2 = 2!"));
  for (const char* mode : {"fixed", "variable"}) {
    CHECK_THAT(error_of([&] {
                 parse(str_cat(R"({"mode": ")", mode,
                               R"(", "attention": "unidirectional",
                                "horizontal_global_attention": true})"));
               }),
               Contains("only \"bi-directional\" attentions can support horizontal global "
                        "attention!"));
  }
  CHECK_THAT(error_of([] { parse(R"({"attention": "causal"})"); }),
             Contains("$.sparse_attention.attention: expected one of \"unidirectional\", "
                      "\"bidirectional\"; found \"causal\""));
  for (const char* mode : {"variable", "bslongformer"}) {
    CHECK_THAT(error_of([&] {
                 parse(str_cat(R"({"mode": ")", mode,
                               R"(", "global_block_indices": [0, 4],
                                "global_block_end_indices": [2]})"));
               }),
               Contains("Global block start indices length, 2, must be same as global block end "
                        "indices length, 1!"));
    CHECK_THAT(error_of([&] {
                 parse(str_cat(R"({"mode": ")", mode,
                               R"(", "global_block_indices": [0, 4],
                                "global_block_end_indices": [2, 4]})"));
               }),
               Contains("Global block start index, 4, must be smaller than global block end "
                        "index, 4!"));
  }
  CHECK_THAT(error_of([] { parse(R"({"mode": "variable", "global_block_end_indices": []})"); }),
             Contains("must be same as global block end indices length, 0!"));
  CHECK_THAT(error_of([] { parse(R"({"mode": "sparse"})"); }),
             Contains("$.sparse_attention.mode: expected one of \"dense\", \"fixed\", "
                      "\"variable\", \"bigbird\", \"bslongformer\", \"local_sliding_window\"; "
                      "found \"sparse\""));
  // Programmatic configs get the same checks.
  SparsityConfig empty_windows;
  empty_windows.mode = SparsityMode::variable;
  empty_windows.local_window_blocks = {};
  CHECK_THAT(error_of([&] { empty_windows.validate(); }),
             Contains("[sparse_attention] local_window_blocks: expected a non-empty list of "
                      "sizes >= 1, found []"));
}

TEST_CASE("DeepSpeed's layout-time errors") {
  const SparsityConfig fixed = parse("{}");
  CHECK_THAT(error_of([&] { make_sparsity_layout(fixed, 2, 100, 0); }),
             Contains("[sparse_attention] Sequence Length, 100, needs to be dividable by Block "
                      "size 16!"));
  CHECK_THAT(error_of([] { layout_of(R"({"mode": "variable", "num_random_blocks": 9})", 8); }),
             Contains("[sparse_attention] Number of random blocks, 9, must be smaller than "
                      "overall number of blocks in a row, 8!"));
  CHECK_THAT(
      error_of([] { layout_of(R"({"mode": "bigbird", "num_sliding_window_blocks": 9})", 8); }),
      Contains("Number of sliding window blocks, 9, must be smaller than overall number of "
               "blocks in a row, 8!"));
  CHECK_THAT(error_of([] { layout_of(R"({"mode": "bigbird", "num_global_blocks": 9})", 8); }),
             Contains("Number of global blocks, 9, must be smaller than overall number of "
                      "blocks in a row, 8!"));
  CHECK_THAT(error_of([] {
               layout_of(R"({"mode": "local_sliding_window", "num_sliding_window_blocks": 5})", 4);
             }),
             Contains("Number of sliding window blocks, 5, must be smaller"));
  // Local windows longer than the row are cut, as in DeepSpeed.
  CHECK(rows(layout_of(R"({"num_local_blocks": 8})", 3), 0) ==
        std::vector<std::string>{"111", "111", "111"});
}

TEST_CASE("from_json defaults follow DeepSpeed's config.py") {
  const SparsityConfig fixed = parse("{}");
  CHECK(fixed.mode == SparsityMode::fixed);
  CHECK(fixed.block == 16);
  CHECK(fixed.num_local_blocks == 4);
  CHECK(fixed.num_global_blocks == 1);
  CHECK_FALSE(fixed.unidirectional);
  CHECK_FALSE(fixed.horizontal_global_attention);
  CHECK_FALSE(fixed.different_layout_per_head);
  CHECK(fixed.num_different_global_patterns == 1);
  const SparsityConfig bigbird = parse(R"({"mode": "bigbird"})");
  CHECK(bigbird.num_random_blocks == 0);  // config.py's default; the class's is 1
  CHECK(bigbird.num_sliding_window_blocks == 3);
  CHECK(bigbird.num_global_blocks == 1);
  const SparsityConfig variable = parse(R"({"mode": "variable",
      "global_block_end_indices": null})");
  CHECK(variable.local_window_blocks == std::vector<int64_t>{4});
  CHECK(variable.global_block_indices == std::vector<int64_t>{0});
  CHECK(variable.global_block_end_indices.empty());
  CHECK(parse(R"({"mode": "local_sliding_window"})").unidirectional);
  CHECK_FALSE(parse(R"({"mode": "bslongformer"})").unidirectional);
  CHECK(std::string(sparsity_mode_name(SparsityMode::bslongformer)) == "bslongformer");
}

TEST_CASE("from_json rejects unknown keys, other modes' keys and bad values") {
  CHECK_THAT(error_of([] { parse(R"({"num_local_block": 4})"); }),
             Contains("unknown key $.sparse_attention.num_local_block; did you mean "
                      "\"num_local_blocks\"?"));
  CHECK_THAT(error_of([] { parse(R"({"mode": "bigbird", "num_local_blocks": 4})"); }),
             Contains("[sparse_attention] $.sparse_attention.num_local_blocks is not used by "
                      "mode \"bigbird\" (only by fixed)"));
  CHECK_THAT(error_of([] { parse(R"({"mode": "dense", "attention": "bidirectional"})"); }),
             Contains("$.sparse_attention.attention is not used by mode \"dense\" (only by "
                      "fixed, variable, bigbird, bslongformer, local_sliding_window)"));
  CHECK_THAT(error_of([] { parse(R"({"num_sliding_window_blocks": 3})"); }),
             Contains("(only by bigbird, bslongformer, local_sliding_window)"));
  CHECK_THAT(error_of([] { parse(R"({"block": 0})"); }),
             Contains("$.sparse_attention.block: expected an integer >= 1, found 0"));
  CHECK_THAT(error_of([] { parse(R"({"mode": "variable", "local_window_blocks": [2, 0]})"); }),
             Contains("local_window_blocks: expected a non-empty list of sizes >= 1, found "
                      "[2, 0]"));
  CHECK_THAT(error_of([] { parse(R"({"different_layout_per_head": 1})"); }),
             Contains("$.sparse_attention.different_layout_per_head: expected"));
}

TEST_CASE("to_json writes the mode's keys and round-trips") {
  const std::vector<std::string> sections = {
      R"({"mode": "dense", "block": 32})",
      R"({"mode": "fixed", "block": 8, "num_local_blocks": 6, "num_global_blocks": 2,
          "num_different_global_patterns": 3, "different_layout_per_head": true,
          "horizontal_global_attention": true})",
      R"({"mode": "variable", "num_random_blocks": 2, "local_window_blocks": [2, 3],
          "global_block_indices": [0, 5], "global_block_end_indices": [1, 7],
          "attention": "unidirectional"})",
      R"({"mode": "bigbird", "num_random_blocks": 1, "num_global_blocks": 2,
          "num_sliding_window_blocks": 5})",
      R"({"mode": "bslongformer", "global_block_indices": [3]})",
      R"({"mode": "local_sliding_window", "attention": "bidirectional"})",
  };
  for (const std::string& s : sections) {
    INFO(s);
    const SparsityConfig c = parse(s);
    const nlohmann::json j = c.to_json();
    const SparsityConfig back = parse(j.dump());
    CHECK(back.to_json() == j);
    CHECK(make_sparsity_layout(back, 3, 16 * 16, 5).to_vector<int64_t>() ==
          make_sparsity_layout(c, 3, 16 * 16, 5).to_vector<int64_t>());
  }
  const nlohmann::json bigbird = parse(R"({"mode": "bigbird"})").to_json();
  CHECK(bigbird == nlohmann::json::parse(R"({"mode": "bigbird", "block": 16,
            "different_layout_per_head": false, "num_global_blocks": 1,
            "attention": "bidirectional", "num_random_blocks": 0,
            "num_sliding_window_blocks": 3})"));
  CHECK(parse(R"({"mode": "dense"})").to_json() == nlohmann::json::parse(R"({"mode": "dense",
      "block": 16})"));
}

}  // namespace
}  // namespace tessera
