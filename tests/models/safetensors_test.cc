// Safetensors reading and writing: round trips, a file from an independent writer, one
// case per validation rule (Note [Safetensors validation]), mapped reading (Note [Mapped
// tensors]) and writing tensors produced in pieces.
#include "models/io/safetensors.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/factories.h"
#include "core/grad_mode.h"
#include "tests/test_files.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using testing::error_of;
using testing::require_close;

std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file made of the given header text and data bytes, with a correct header length.
std::string file_bytes(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}

// Writes a hand-made file and returns the error reading it gives.
std::string read_error(const std::string& name, const std::string& bytes) {
  const std::string path = testing::temp_path(name).string();
  testing::write_bytes(path, bytes);
  return error_of([&] { read_safetensors(path); });
}

const Tensor& find(const StateDict& sd, const std::string& name) {
  for (const auto& [n, t] : sd) {
    if (n == name) return t;
  }
  FAIL("no tensor named " << name);
  static Tensor none;
  return none;
}

std::vector<std::string> names_of(const StateDict& sd) {
  std::vector<std::string> out;
  for (const auto& [n, t] : sd) out.push_back(n);
  return out;
}

// How many entries the directory of `path` holds (a failed write leaves no temporary file).
int files_beside(const std::string& path) {
  int files = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
    (void)e;
    ++files;
  }
  return files;
}

// 12 bytes of data for one F32 tensor of shape (3).
const std::string kTwelveBytes(12, '\0');

TEST_CASE("write_safetensors then read_safetensors round-trips every dtype", "[safetensors]") {
  Generator gen(5);
  const Tensor f32 = randn({3, 4}, gen);
  const Tensor f64 = randn({2, 2}, gen, {DType::f64});
  const Tensor f16 = randn({5}, gen).to(DType::f16);
  const Tensor bf16 = randn({2, 3}, gen).to(DType::bf16);
  const Tensor i32 = from_vector<int32_t>({-3, 0, 7, INT32_MAX}, {2, 2});
  const Tensor i64 = from_vector<int64_t>({-(int64_t{1} << 50), 9});
  const Tensor u8 = from_vector<uint8_t>({0, 200, 255});
  const Tensor flags = from_vector(std::vector<bool>{true, false, false, true});
  const Tensor scalar = scalar_tensor(2.5);
  const Tensor none = zeros({0, 4});
  const Tensor strided = randn({3, 5}, gen).transpose(0, 1);  // not contiguous
  REQUIRE_FALSE(strided.is_contiguous());
  const StateDict in = {{"z.f32", f32},     {"f64", f64},   {"f16", f16},        {"bf16", bf16},
                        {"i32", i32},       {"i64", i64},   {"u8", u8},          {"flags", flags},
                        {"scalar", scalar}, {"none", none}, {"strided", strided}};
  const std::string path = testing::temp_path("round_trip.safetensors").string();
  write_safetensors(path, in, {{"format", "pt"}, {"note", "h\u00e9llo \"quoted\""}});

  const SafetensorsFile out = read_safetensors(path);
  REQUIRE(names_of(out.tensors) == names_of(in));  // file order is the order written
  for (size_t i = 0; i < in.size(); ++i) {
    const Tensor& want = in[i].second;
    const Tensor& got = out.tensors[i].second;
    INFO(in[i].first);
    CHECK(got.dtype() == want.dtype());
    CHECK(got.shape() == want.shape());
    CHECK(got.device() == Device::cpu());
    CHECK(got.is_contiguous());
    CHECK(got.to_vector<double>() == want.to_vector<double>());
  }
  CHECK(out.metadata ==
        std::map<std::string, std::string>{{"format", "pt"}, {"note", "h\u00e9llo \"quoted\""}});

  // Layout: header length is a multiple of 8, the header starts with '{' and may end in
  // spaces, the data section is the tensors back to back.
  const std::string bytes = testing::read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);
  CHECK(bytes[8] == '{');
  size_t data_bytes = 0;
  for (const auto& [name, t] : in) data_bytes += t.nbytes();
  CHECK(bytes.size() == 8 + n + data_bytes);
  const std::string header = bytes.substr(8, n);
  CHECK(header.find_last_not_of(' ') == header.find_last_of('}'));
}

TEST_CASE("write_safetensors accepts tensors that require grad", "[safetensors]") {
  Tensor w = ones({2, 2});
  w.set_requires_grad(true);
  const std::string path = testing::temp_path("requires_grad.safetensors").string();
  write_safetensors(path, {{"w", w}});
  require_close(read_safetensors(path).tensors.at(0).second, {1, 1, 1, 1}, 0);
}

TEST_CASE("a file from an independent writer reads back", "[safetensors]") {
  // tests/models/data/safetensors_fixture.safetensors, from
  // tools/golden/make_safetensors_fixture.py (torch tensors, bytes laid out in Python).
  const SafetensorsFile f = read_safetensors("tests/models/data/safetensors_fixture.safetensors");
  // Data order (dtype size, then name), not the header's alphabetical order.
  CHECK(names_of(f.tensors) == std::vector<std::string>{"a.f64", "e.i64", "b.f32", "empty", "f.i32",
                                                        "scalar", "c.f16", "d.bf16", "g.u8",
                                                        "h.bool"});
  CHECK(f.metadata.at("format") == "pt");
  const Tensor& a = find(f.tensors, "a.f64");
  CHECK(a.dtype() == DType::f64);
  CHECK(a.to_vector<double>() == std::vector<double>{M_PI, -M_E});
  const Tensor& b = find(f.tensors, "b.f32");
  CHECK(b.shape() == Shape{2, 3});
  CHECK(b.to_vector<double>() == std::vector<double>{-1, -0.5, 0, 0.5, 1, 1.5});
  const Tensor& c = find(f.tensors, "c.f16");
  CHECK(c.dtype() == DType::f16);
  CHECK(c.to_vector<double>() == std::vector<double>{1.5, -2.25, 65504, 0});
  const Tensor& d = find(f.tensors, "d.bf16");
  CHECK(d.dtype() == DType::bf16);
  CHECK(d.to_vector<float>() ==
        std::vector<float>{1.0f, -3.5f, static_cast<float>(BFloat16(1.0e38f))});
  CHECK(find(f.tensors, "e.i64").to_vector<int64_t>() ==
        std::vector<int64_t>{-(int64_t{1} << 40), 5});
  const Tensor& i = find(f.tensors, "f.i32");
  CHECK(i.shape() == Shape{3, 1});
  CHECK(i.to_vector<int32_t>() == std::vector<int32_t>{-7, 0, INT32_MAX});
  CHECK(find(f.tensors, "g.u8").to_vector<int>() == std::vector<int>{0, 255, 7});
  const Tensor& h = find(f.tensors, "h.bool");
  CHECK(h.dtype() == DType::boolean);
  CHECK(h.to_vector<int>() == std::vector<int>{1, 0, 1});
  const Tensor& s = find(f.tensors, "scalar");
  CHECK(s.dim() == 0);
  CHECK(s.item<float>() == 42.0f);
  CHECK(find(f.tensors, "empty").shape() == Shape{0, 3});

  // Written back by Tessera and read again, the tensors are unchanged.
  const std::string path = testing::temp_path("fixture_copy.safetensors").string();
  write_safetensors(path, f.tensors, f.metadata);
  const SafetensorsFile g = read_safetensors(path);
  REQUIRE(names_of(g.tensors) == names_of(f.tensors));
  for (size_t k = 0; k < f.tensors.size(); ++k) {
    CHECK(g.tensors[k].second.to_vector<double>() == f.tensors[k].second.to_vector<double>());
  }
}

TEST_CASE("the header may be unpadded or padded with spaces", "[safetensors]") {
  const std::string header = R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
  for (const std::string& h : {header, header + "      ", header + " "}) {
    const std::string path = testing::temp_path("padding.safetensors").string();
    testing::write_bytes(path, file_bytes(h, kTwelveBytes));
    const SafetensorsFile f = read_safetensors(path);
    REQUIRE(f.tensors.size() == 1);
    CHECK(f.tensors[0].second.shape() == Shape{3});
    CHECK(f.metadata.empty());
  }
  // So may JSON whitespace before the '{', as the reference reader accepts.
  const std::string path_ws = testing::temp_path("leading.safetensors").string();
  testing::write_bytes(path_ws, file_bytes(" \n\t" + header, kTwelveBytes));
  CHECK(read_safetensors(path_ws).tensors.size() == 1);
  // An empty file list is a valid file.
  const std::string path = testing::temp_path("no_tensors.safetensors").string();
  write_safetensors(path, {});
  CHECK(read_safetensors(path).tensors.empty());
}

TEST_CASE("write_safetensors is atomic and validates names", "[safetensors]") {
  const std::string path = testing::temp_path("atomic/model.safetensors").string();
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  write_safetensors(path, {{"a", ones({2})}});
  write_safetensors(path, {{"b", zeros({3})}});  // replaces the file
  CHECK(names_of(read_safetensors(path).tensors) == std::vector<std::string>{"b"});

  CHECK(error_of([&] {
          write_safetensors(path, {{"a", ones({1})}, {"a", ones({1})}});
        }) == "[safetensors] " + path + ": duplicate tensor name \"a\"");
  CHECK_THAT(error_of([&] {
               write_safetensors(path, {{"", ones({1})}});
             }),
             Catch::Contains("non-empty"));
  CHECK_THAT(error_of([&] {
               write_safetensors(path, {{"__metadata__", ones({1})}});
             }),
             Catch::Contains("reserved"));
  CHECK(error_of([&] {
          write_safetensors(path, {{std::string("a\0b", 3), ones({1})}});
        }) == "[safetensors] " + path +
                  ": tensor name \"a\\u0000b\" holds a NUL byte at 1; expected names without one");
  CHECK(error_of([&] {
          write_safetensors(path, {{"deep", ones(Shape(65, 1))}});
        }) == "[safetensors] " + path + ": tensor \"deep\" has 65 dimensions; expected at most 64");
  CHECK_THAT(error_of([&] {
               write_safetensors(path, {{"u", Tensor()}});
             }),
             Catch::Contains("tensor \"u\" is undefined"));
  CHECK_THAT(error_of([&] {
               write_safetensors(testing::temp_path("no/such/dir/x.safetensors").string(), {});
             }),
             Catch::Contains("cannot create a temporary file"));
  // Failed writes left the last good file and no temporary files.
  CHECK(names_of(read_safetensors(path).tensors) == std::vector<std::string>{"b"});
  CHECK(files_beside(path) == 1);
}

TEST_CASE("malformed files are rejected with a specific one-line error", "[safetensors]") {
  const std::string good = R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
  const std::string path = testing::temp_path("bad.safetensors").string();
  auto err = [&](const std::string& bytes) { return read_error("bad.safetensors", bytes); };
  auto with_header = [&](const std::string& header, const std::string& data = kTwelveBytes) {
    return err(file_bytes(header, data));
  };

  SECTION("missing file") {
    CHECK_THAT(error_of([] { read_safetensors("/nonexistent/x.safetensors"); }),
               Catch::Contains("/nonexistent/x.safetensors: cannot open"));
  }
  SECTION("shorter than the header length") {
    CHECK(err("abc") == "[safetensors] " + path +
                            ": file is truncated: expected at least 8 bytes (the header length), "
                            "found 3");
  }
  SECTION("truncated data") {
    const std::string e = err(file_bytes(good, kTwelveBytes.substr(0, 10)));
    CHECK(e == "[safetensors] " + path +
                   ": file is truncated: the tensors need 12 data bytes, found 10 (expected file "
                   "size " +
                   std::to_string(8 + good.size() + 12) + ", found " +
                   std::to_string(8 + good.size() + 10) + ")");
  }
  SECTION("header length past the end of the file") {
    const std::string bytes = u64_le(1000) + good;
    CHECK(err(bytes) == "[safetensors] " + path + ": file is truncated: header length 1000 runs " +
                            "past the end of the file (expected at most " +
                            std::to_string(good.size()) + ", the file has " +
                            std::to_string(bytes.size()) + " bytes)");
  }
  SECTION("header length over the limit") {
    CHECK_THAT(err(u64_le(uint64_t{1} << 62) + good),
               Catch::Contains("header length 4611686018427387904 exceeds the limit of "
                               "100000000 bytes"));
  }
  SECTION("bad JSON") {
    const std::string e = with_header(R"({"x":{"dtype":"F32",)");
    CHECK_THAT(e, Catch::StartsWith("[safetensors] " + path + ": header is not valid JSON: "));
  }
  SECTION("header that is not an object") {
    CHECK_THAT(with_header("[1, 2]", ""), Catch::Contains("expected a JSON object starting with "
                                                          "'{', found byte 91"));
    CHECK_THAT(with_header("", ""), Catch::Contains("found an empty header"));
  }
  SECTION("duplicate key") {
    const std::string e = with_header(
        R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"x":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})");
    CHECK_THAT(
        e, Catch::Contains("header is not valid JSON") && Catch::Contains("duplicate key \"x\""));
  }
  SECTION("duplicate key inside an entry") {
    CHECK_THAT(
        with_header(R"({"x":{"dtype":"F32","dtype":"F32","shape":[3],"data_offsets":[0,12]}})"),
        Catch::Contains("duplicate key \"dtype\""));
  }
  SECTION("unknown dtype") {
    CHECK(with_header(R"({"x":{"dtype":"I8","shape":[12],"data_offsets":[0,12]}})") ==
          "[safetensors] " + path +
              ": tensor \"x\": unsupported dtype \"I8\" (expected one of F32, F16, BF16, F64, "
              "I32, I64, U8, BOOL)");
  }
  SECTION("offsets with a gap") {
    CHECK(with_header(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("y":{"dtype":"U8","shape":[2],"data_offsets":[10,12]}})") ==
          "[safetensors] " + path +
              ": tensor \"y\": data_offsets [10, 12] leave a gap: expected begin 8, found 10 (2 "
              "unused bytes after tensor \"x\")");
    CHECK_THAT(with_header(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})"),
               Catch::Contains("gap: expected begin 0, found 4 (4 unused bytes after the start "
                               "of the data section)"));
  }
  SECTION("overlapping offsets") {
    CHECK(with_header(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})") ==
          "[safetensors] " + path +
              ": tensor \"y\": data_offsets [4, 12] overlap tensor \"x\": expected begin 8, "
              "found 4");
  }
  SECTION("data size does not match dtype and shape") {
    CHECK(with_header(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})") ==
          "[safetensors] " + path +
              ": tensor \"x\": data_offsets [0, 12] hold 12 bytes, expected 8 (F32 (2))");
  }
  SECTION("trailing bytes") {
    const std::string e = with_header(good, kTwelveBytes + "xyz");
    CHECK(e == "[safetensors] " + path +
                   ": 3 trailing bytes after the last tensor: expected file size " +
                   std::to_string(8 + good.size() + 12) + ", found " +
                   std::to_string(8 + good.size() + 15));
  }
  SECTION("end before begin") {
    CHECK_THAT(with_header(R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[12,0]}})"),
               Catch::Contains("tensor \"x\": data_offsets [12, 0]: expected end >= begin"));
  }
  SECTION("negative or fractional dims and offsets") {
    CHECK_THAT(with_header(R"({"x":{"dtype":"F32","shape":[-3],"data_offsets":[0,12]}})"),
               Catch::Contains("tensor \"x\": shape[0]: expected a non-negative integer, found "
                               "number -3"));
    CHECK_THAT(with_header(R"({"x":{"dtype":"F32","shape":[3.0],"data_offsets":[0,12]}})"),
               Catch::Contains("shape[0]: expected a non-negative integer"));
    CHECK_THAT(with_header(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,12,14]}})"),
               Catch::Contains("data_offsets: expected an array [begin, end]"));
    CHECK_THAT(with_header(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,"12"]}})"),
               Catch::Contains("data_offsets[1]: expected a non-negative integer"));
  }
  SECTION("byte count overflow") {
    CHECK_THAT(with_header(R"({"x":{"dtype":"F64","shape":[4294967296,4294967296],)"
                           R"("data_offsets":[0,12]}})"),
               Catch::Contains("is too large"));
  }
  SECTION("missing or unknown entry keys") {
    CHECK(with_header(R"({"x":{"dtype":"F32","data_offsets":[0,12]}})") ==
          "[safetensors] " + path + ": tensor \"x\": missing \"shape\"");
    CHECK_THAT(with_header(R"({"x":{"dtype":"F32","shape":[3],"offsets":[0,12]}})"),
               Catch::Contains("tensor \"x\": unknown key \"offsets\""));
    CHECK_THAT(with_header(R"({"x":[1]})"), Catch::Contains("tensor \"x\": expected an object"));
  }
  SECTION("names and shapes past the limits") {
    CHECK(with_header(R"({"":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})") ==
          "[safetensors] " + path + ": tensor names must be non-empty");
    CHECK_THAT(with_header(R"({"x\u0000y":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})"),
               Catch::Contains("holds a NUL byte at 1; expected names without one"));
    std::string dims = "[3";
    for (int i = 0; i < 64; ++i) dims += ",1";
    CHECK(with_header(R"({"x":{"dtype":"F32","shape":)" + dims + R"(],"data_offsets":[0,12]}})") ==
          "[safetensors] " + path +
              ": tensor \"x\": shape: expected at most 64 dimensions, found 65");
    CHECK(with_header("   ", "") ==
          "[safetensors] " + path +
              ": header: expected a JSON object starting with '{', found only whitespace");
    CHECK_THAT(with_header(" [1]", ""), Catch::Contains("found byte 91 at 1"));
  }
  SECTION("metadata that is not a string map") {
    CHECK(with_header(R"({"__metadata__":{"step":3},)"
                      R"("x":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})") ==
          "[safetensors] " + path + ": __metadata__[\"step\"]: expected a string, found number 3");
  }
  SECTION("BOOL bytes other than 0 and 1") {
    CHECK_THAT(with_header(R"({"b":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})",
                           std::string("\x01\x02", 2)),
               Catch::Contains("tensor \"b\": BOOL element 1: expected byte 0 or 1, found 2"));
  }
}

TEST_CASE("every read error is one line", "[safetensors]") {
  const std::string e = read_error("oneline.safetensors", file_bytes("{\n\"x\": 1\n}", ""));
  CHECK(e.find('\n') == std::string::npos);
  CHECK_THAT(e, Catch::Contains("tensor \"x\": expected an object"));
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Whether this process maps the file at `path` (a line of /proc/self/maps names it).
bool maps_file(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  const std::string full = std::filesystem::canonical(path).string();
  for (std::string line; std::getline(maps, line);) {
    if (line.size() >= full.size() &&
        line.compare(line.size() - full.size(), full.size(), full) == 0)
      return true;
  }
  return false;
}

TEST_CASE("read_safetensors maps the file; its tensors are private views", "[safetensors]") {
  const std::string path = testing::temp_path("mapped.safetensors").string();
  // Five f32 values put the i64 tensor at 4 bytes past an 8-byte boundary: it is read
  // into memory of its own, the f32 one mapped (Note [Mapped tensors]).
  write_safetensors(path, {{"f", from_vector<float>({1, 2, 3, 4, 5})},
                           {"i", from_vector<int64_t>({-7, 1LL << 40})}});
  const std::string before = testing::read_bytes(path);
  {
    const SafetensorsFile f = read_safetensors(path);
    CHECK(maps_file(path));
    CHECK(find(f.tensors, "i").to_vector<int64_t>() == std::vector<int64_t>{-7, 1LL << 40});
    Tensor t = find(f.tensors, "f");
    CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5});
    t.fill_(9.0);  // a private copy of the page: the file stays as it was
    CHECK(t.to_vector<float>() == std::vector<float>(5, 9.0f));
    // The file replaced (an atomic rename) or removed leaves the views as they were.
    write_safetensors(path, {{"g", zeros({1})}});
    CHECK(t.to_vector<float>() == std::vector<float>(5, 9.0f));
    std::filesystem::remove(path);
    CHECK(find(f.tensors, "i").to_vector<int64_t>() == std::vector<int64_t>{-7, 1LL << 40});
    testing::write_bytes(path, before);
  }
  CHECK_FALSE(maps_file(path));  // unmapped with the last view
  CHECK(testing::read_bytes(path) == before);
  CHECK(find(read_safetensors(path).tensors, "f").to_vector<float>() ==
        std::vector<float>{1, 2, 3, 4, 5});
}

TEST_CASE("write_streamed_safetensors writes tensors produced in pieces", "[safetensors]") {
  const std::string path = testing::temp_path("streamed/pieces.safetensors").string();
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  // A (2, 3) f32 tensor in three pieces, a one-piece i64 after it.
  StreamedTensor m{"m", DType::f32, {2, 3}, [](const StreamedTensor::Take& take) {
                     take(from_vector<float>({0, 1}));
                     take(from_vector<float>({2}));
                     take(from_vector<float>({3, 4, 5}));
                   }};
  write_streamed_safetensors(path, {m, streamed("step", from_vector<int64_t>({3}))}, {{"k", "v"}});
  const SafetensorsFile f = read_safetensors(path);
  CHECK(names_of(f.tensors) == std::vector<std::string>{"m", "step"});
  CHECK(find(f.tensors, "m").shape() == Shape{2, 3});
  CHECK(find(f.tensors, "m").to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  CHECK(f.metadata.at("k") == "v");
  CHECK(materialize(m).to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  const std::string good = testing::read_bytes(path);

  // Pieces that do not fit their tensor fail the write; the last good file stays, with no
  // temporary file beside it.
  StreamedTensor short_pieces = m;
  short_pieces.produce = [](const StreamedTensor::Take& take) { take(zeros({4})); };
  CHECK(error_of([&] { write_streamed_safetensors(path, {short_pieces}); }) ==
        "[safetensors] " + path + ": tensor \"m\": expected 24 bytes, its pieces held 16");
  StreamedTensor long_pieces = m;
  long_pieces.produce = [](const StreamedTensor::Take& take) { take(zeros({7})); };
  CHECK_THAT(error_of([&] { write_streamed_safetensors(path, {long_pieces}); }),
             Catch::Contains("tensor \"m\": expected contiguous CPU f32 pieces of 24 bytes in all, "
                             "found"));
  StreamedTensor wrong_dtype = m;
  wrong_dtype.produce = [](const StreamedTensor::Take& take) { take(zeros({6}, {DType::f64})); };
  CHECK_THAT(error_of([&] { write_streamed_safetensors(path, {wrong_dtype}); }),
             Catch::Contains("expected contiguous CPU f32 pieces"));
  CHECK(testing::read_bytes(path) == good);
  CHECK(files_beside(path) == 1);
}

}  // namespace
}  // namespace tessera
