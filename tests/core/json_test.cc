#include "core/json.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "tests/testing.h"

using Catch::Matchers::Contains;
using tessera::JsonObjectReader;
using tessera::parse_json;
using Json = nlohmann::json;

namespace {

using tessera::testing::error_of;

// Seconds that `f` takes, the least of three runs.
double seconds_of(const std::function<void()>& f) {
  double best = 1e300;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// A safetensors-like header of `n` zero-size tensors: n sibling objects.
std::string many_objects(int n) {
  std::string s = "{";
  for (int i = 0; i < n; ++i) {
    if (i > 0) s += ",";
    s += "\"t" + std::to_string(i) + "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}";
  }
  return s + "}";
}

// A flat object of string values, at least `bytes` long.
std::string flat_object(size_t bytes) {
  std::string s = "{";
  for (int i = 0; s.size() < bytes; ++i) {
    if (i > 0) s += ",";
    s += "\"t" + std::to_string(i) + "\":\"F32 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\"";
  }
  return s + "}";
}

}  // namespace

TEST_CASE("parse_json reads strict JSON", "[json]") {
  const Json j = parse_json(R"({"a": 1, "b": [1, 2.5, "x"], "c": {"d": null}})");
  CHECK(j["a"] == 1);
  CHECK(j["b"][1] == 2.5);
  CHECK(j["c"]["d"].is_null());
}

TEST_CASE("parse_json rejects duplicate keys at any depth, naming the path", "[json]") {
  CHECK_THAT(error_of([] { parse_json(R"({"a": 1, "a": 2})", "cfg.json"); }),
             Contains("cfg.json") && Contains("duplicate key \"a\" in $"));
  CHECK_THAT(error_of([] { parse_json(R"({"zero_optimization": {"stage": 1, "stage": 2}})"); }),
             Contains("duplicate key \"stage\" in $.zero_optimization"));
  CHECK_THAT(error_of([] { parse_json(R"({"l": [{"x": 1}, {"y": 1, "y": 2}]})"); }),
             Contains("duplicate key \"y\" in $.l[1]"));
  CHECK_THAT(error_of([] { parse_json(R"({"l": [[0], 5, {"k": {"m": 1, "m": 1}}]})"); }),
             Contains("duplicate key \"m\" in $.l[2].k"));
  // The same key in sibling objects is fine.
  CHECK_NOTHROW(parse_json(R"({"a": {"k": 1}, "b": {"k": 2}, "l": [{"k": 1}, {"k": 2}]})"));
}

// Linear time in sibling objects: nlohmann's callback parser scans the parent object
// after each child object ends, which made 20,000 siblings take seconds.
TEST_CASE("parse_json takes time linear in the number of sibling objects", "[json]") {
  const std::string objects = many_objects(50'000);  // 3 MB
  const std::string flat = flat_object(objects.size());
  const double t_objects = seconds_of([&] { CHECK(parse_json(objects).size() == 50'000); });
  const double t_flat = seconds_of([&] { parse_json(flat); });
  INFO(objects.size() << " bytes of objects in " << t_objects << " s, a flat object of "
                      << flat.size() << " bytes in " << t_flat << " s");
  // Three values and two arrays per object: a few times the flat file's work, not hundreds.
  CHECK(t_objects <= 20 * t_flat);
}

TEST_CASE("parse_json bounds the nesting depth, naming it and the path", "[json]") {
  const auto nested = [](int depth, char open, char close) {
    return std::string(depth, open) + std::string(depth, close);
  };
  CHECK_NOTHROW(parse_json(nested(tessera::kMaxJsonDepth, '[', ']')));
  CHECK(error_of([&] { parse_json(nested(tessera::kMaxJsonDepth + 1, '[', ']'), "deep.json"); }) ==
        "[json] deep.json: expected at most 64 nested arrays and objects, found more at $" + [] {
          std::string path;
          for (int i = 0; i < tessera::kMaxJsonDepth; ++i) path += "[0]";
          return path;
        }());
  CHECK_THAT(error_of([] { parse_json(R"({"a": {"b": [1, {"c": [[[]]]}]}})", "x", 5); }),
             Contains("expected at most 5 nested arrays and objects, found more at $.a.b[1].c[0]"));
  // A deep document fails at once, in time and memory bounded by the limit: the depth of
  // 100,000 once took 750 MB per 40 KB.
  std::string deep;
  for (int i = 0; i < 100'000; ++i) deep += "{\"a\":";
  const double t_deep = seconds_of([&] { CHECK_THROWS(parse_json(deep)); });
  const double t_flat = seconds_of([&] { parse_json(flat_object(deep.size())); });
  INFO("depth 100,000 rejected in " << t_deep << " s; a flat object of the same size parsed in "
                                    << t_flat << " s");
  CHECK(t_deep <= 20 * t_flat);
}

TEST_CASE("parse_json errors name the source and the position", "[json]") {
  const std::string msg = error_of([] { parse_json("{\n  \"a\": 1,\n  \"b\": }", "x.json"); });
  CHECK_THAT(msg, Contains("x.json") && Contains("parse error at byte 19") &&
                      Contains("line 3, column 8"));
  CHECK_THAT(error_of([] { parse_json(R"({"a": 1,})"); }), Contains("<string>"));
  CHECK_THAT(error_of([] { parse_json(""); }), Contains("parse error at byte 0"));
  CHECK_THAT(error_of([] { parse_json(R"({"a": 1e400})", "big.json"); }),
             Contains("big.json") && Contains("number overflow"));
  CHECK_THAT(error_of([] { parse_json(R"({"a": 1} x)"); }), Contains("parse error at byte 9"));
  // Comments are not JSON.
  CHECK_THAT(error_of([] { parse_json("{\"a\": 1 // one\n}"); }), Contains("parse error"));
}

TEST_CASE("parse_json_file reads a file and names it in errors", "[json]") {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/cfg.json";
  {
    std::ofstream out(path);
    out << R"({"train_batch_size": 8, "x": )";
  }
  CHECK_THAT(error_of([&] { tessera::parse_json_file(path); }),
             Contains(path) && Contains("parse error"));
  {
    std::ofstream out(path);
    out << R"({"train_batch_size": 8})";
  }
  CHECK(tessera::parse_json_file(path)["train_batch_size"] == 8);
  CHECK_THAT(error_of([] { tessera::parse_json_file("/nonexistent/cfg.json"); }),
             Contains("cannot open \"/nonexistent/cfg.json\""));
  // A directory and a file with a NUL byte are named as what they are, not as parse errors.
  const std::string dir = std::string(std::getenv("TEST_TMPDIR"));
  CHECK(error_of([&] { tessera::parse_json_file(dir); }) ==
        "[json] \"" + dir + "\": expected a JSON file, found a directory");
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string("{\"a\": 1,\0 \"b\": 2}", 17);
  }
  CHECK(error_of([&] { tessera::parse_json_file(path); }) ==
        "[json] " + path + ": expected JSON text, found a NUL byte at byte 8 (a binary file?)");
  std::remove(path.c_str());
}

TEST_CASE("json paths and levenshtein", "[json]") {
  CHECK(tessera::json_key_path("$", "a_1") == "$.a_1");
  CHECK(tessera::json_key_path("$.x", "odd key") == "$.x[\"odd key\"]");
  CHECK(tessera::json_key_path("$", "1abc") == "$[\"1abc\"]");
  CHECK(tessera::levenshtein("", "") == 0);
  CHECK(tessera::levenshtein("abc", "") == 3);
  CHECK(tessera::levenshtein("kitten", "sitting") == 3);
  CHECK(tessera::levenshtein("stage3_prefetch_bucket_sise", "stage3_prefetch_bucket_size") == 1);
  CHECK(tessera::levenshtein("grandient_accumulation_steps", "gradient_accumulation_steps") == 1);
}

TEST_CASE("reader: defaults, present values and required keys", "[json]") {
  const Json j = parse_json(R"({"a": 3, "b": 0.5, "c": true, "d": "adam",
                                "e": [1, 2, 3], "f": ["x", "y"], "g": [0.9, 0.999]})");
  JsonObjectReader r(j, "config");
  CHECK(r.get<int64_t>("a", 7) == 3);
  CHECK(r.get<int>("a", 7) == 3);
  CHECK(r.get<double>("b", 1.0) == 0.5);
  CHECK(r.get<float>("b", 1.0f) == 0.5f);
  CHECK(r.get<bool>("c", false) == true);
  CHECK(r.get<std::string>("d", "sgd") == "adam");
  CHECK(r.get<std::vector<int64_t>>("e", {}) == std::vector<int64_t>{1, 2, 3});
  CHECK(r.get<std::vector<int>>("e", {}) == std::vector<int>{1, 2, 3});
  CHECK(r.get<std::vector<std::string>>("f", {}) == std::vector<std::string>{"x", "y"});
  CHECK(r.get<std::vector<double>>("g", {}) == std::vector<double>{0.9, 0.999});
  // Absent keys give their fallbacks.
  CHECK(r.get<int64_t>("missing_int", 42) == 42);
  CHECK(r.get<std::string>("missing_str", "none") == "none");
  CHECK_FALSE(r.optional<double>("missing_double").has_value());
  CHECK(r.optional<int64_t>("a") == 3);
  CHECK(r.has("a"));
  CHECK_FALSE(r.has("zzz"));
  CHECK(r.required<std::string>("d") == "adam");
  CHECK_THAT(error_of([&] { r.required<int64_t>("train_batch_size"); }),
             Contains("[config] $.train_batch_size: required key missing"));
  CHECK_NOTHROW(r.finish());
}

TEST_CASE("reader: integers written as floats", "[json]") {
  const Json j = parse_json(R"({"a": 2.0, "b": 5e8, "c": 2.5, "d": 1e30, "e": -3,
                                "f": 18446744073709551615, "g": 3000000000})");
  JsonObjectReader r(j);
  CHECK(r.get<int64_t>("a", 0) == 2);
  CHECK(r.get<int64_t>("b", 0) == 500000000);
  CHECK(r.get<int>("b", 0) == 500000000);
  CHECK(r.get<int64_t>("e", 0) == -3);
  CHECK(r.get<int64_t>("g", 0) == 3000000000);
  CHECK_THAT(error_of([&] { r.get<int64_t>("c", 0); }),
             Contains("$.c: expected integer, found number 2.5"));
  CHECK_THAT(error_of([&] { r.get<int64_t>("d", 0); }), Contains("$.d: expected integer"));
  CHECK_THAT(error_of([&] { r.get<int64_t>("f", 0); }), Contains("$.f: expected a 64-bit integer"));
  CHECK_THAT(error_of([&] { r.get<int>("g", 0); }),
             Contains("$.g: expected a 32-bit integer, found number 3000000000"));
  // Any number is a valid double.
  CHECK(r.get<double>("e", 0.0) == -3.0);
}

TEST_CASE("reader: wrong types name the path, the expected kind and the value", "[json]") {
  const Json j = parse_json(R"({"train_batch_size": "5e8x", "fp16": {"enabled": 1},
                                "betas": [0.9, "x"], "lr": "1e-3", "name": 5, "zero": [1],
                                "flag": null})");
  JsonObjectReader r(j, "config");
  CHECK_THAT(error_of([&] { r.get<int64_t>("train_batch_size", 1); }),
             Contains("[config] $.train_batch_size: expected integer, found string \"5e8x\""));
  CHECK_THAT(error_of([&] { r.object("fp16").get<bool>("enabled", false); }),
             Contains("$.fp16.enabled: expected boolean, found number 1"));
  CHECK_THAT(error_of([&] { r.get<std::vector<double>>("betas", {}); }),
             Contains("$.betas[1]: expected number, found string \"x\""));
  CHECK_THAT(error_of([&] { r.get<double>("lr", 0.0); }),
             Contains("$.lr: expected number, found string \"1e-3\""));
  CHECK_THAT(error_of([&] { r.get<std::string>("name", ""); }),
             Contains("$.name: expected string, found number 5"));
  CHECK_THAT(error_of([&] { r.object("zero"); }), Contains("$.zero: expected object, found array"));
  CHECK_THAT(error_of([&] { r.get<std::vector<int64_t>>("name", {}); }),
             Contains("$.name: expected array, found number 5"));
  const Json b = parse_json(R"({"stage": true})");
  JsonObjectReader rb(b, "config");
  CHECK_THAT(error_of([&] { rb.get<int64_t>("stage", 0); }),
             Contains("$.stage: expected integer, found boolean true"));
  CHECK_THAT(error_of([&] { rb.get<double>("stage", 0); }),
             Contains("$.stage: expected number, found boolean true"));
  CHECK_THAT(error_of([&] { r.get<bool>("flag", false); }),
             Contains("$.flag: expected boolean, found null"));
  CHECK_THAT(error_of([] { JsonObjectReader(Json::array(), "config"); }),
             Contains("[config] $: expected object, found array"));
}

TEST_CASE("reader: ranges and enumerations", "[json]") {
  const Json j = parse_json(R"({"zero_optimization": {"stage": 4, "reduce_bucket_size": -1,
                                "ok": 2}, "lr": 2.0, "clip": -0.5, "type": "Adamw",
                                "mode": "fixed"})");
  JsonObjectReader r(j, "config");
  JsonObjectReader zero = r.object("zero_optimization");
  CHECK_THAT(error_of([&] { zero.get_in_range<int64_t>("stage", 0, 0, 3); }),
             Contains("$.zero_optimization.stage: expected an integer in [0, 3], found 4"));
  CHECK_THAT(
      error_of([&] {
        zero.get_in_range<int64_t>("reduce_bucket_size", 500000000, 0,
                                   std::numeric_limits<int64_t>::max());
      }),
      Contains("$.zero_optimization.reduce_bucket_size: expected an integer >= 0, found -1"));
  CHECK(zero.get_in_range<int64_t>("ok", 0, 0, 3) == 2);
  CHECK(zero.get_in_range<int64_t>("absent", 9, 0, 3) == 9);  // fallbacks are not checked
  CHECK_THAT(error_of([&] { r.required_in_range<double>("lr", 0.0, 1.0); }),
             Contains("$.lr: expected a number in [0, 1], found 2"));
  CHECK_THAT(error_of([&] {
               r.get_in_range<double>("clip", 0.0, std::numeric_limits<double>::lowest(), -1.0);
             }),
             Contains("$.clip: expected a number <= -1, found -0.5"));
  CHECK_THAT(error_of([&] { r.required_in_range<int>("missing", 0, 1); }),
             Contains("$.missing: required key missing"));
  CHECK_THAT(error_of([&] {
               r.get_one_of("type", "Adam", {"Adam", "AdamW", "Lamb"});
             }),
             Contains("$.type: expected one of \"Adam\", \"AdamW\", \"Lamb\"; found \"Adamw\""));
  CHECK(r.get_one_of("mode", "dense", {"fixed", "variable"}) == "fixed");
  CHECK(r.get_one_of("absent_mode", "dense", {"fixed", "variable"}) == "dense");
  CHECK_THAT(error_of([&] {
               r.required_one_of("kind", {"a", "b"});
             }),
             Contains("$.kind: required key missing"));
}

TEST_CASE("reader: unknown keys at the top level suggest the nearest key", "[json]") {
  const Json j = parse_json(R"({"train_batch_size": 8, "grandient_accumulation_steps": 1})");
  JsonObjectReader r(j, "config");
  r.get<int64_t>("train_batch_size", 1);
  r.get<int64_t>("gradient_accumulation_steps", 1);
  r.get<int64_t>("train_micro_batch_size_per_gpu", 1);
  CHECK_THAT(error_of([&] { r.finish(); }),
             Contains("[config] unknown key $.grandient_accumulation_steps; did you mean "
                      "\"gradient_accumulation_steps\"?"));
}

TEST_CASE("reader: unknown nested keys suggest the nearest key", "[json]") {
  const Json j = parse_json(R"({"zero_optimization": {"stage": 3,
                                "stage3_prefetch_bucket_sise": 5e8}})");
  JsonObjectReader r(j, "config");
  JsonObjectReader zero = r.object("zero_optimization");
  zero.get_in_range<int64_t>("stage", 0, 0, 3);
  zero.get<int64_t>("stage3_prefetch_bucket_size", 50000000);
  zero.get<int64_t>("stage3_param_persistence_threshold", 100000);
  // The root's finish() checks every object opened from it.
  CHECK_THAT(error_of([&] { r.finish(); }),
             Contains("unknown key $.zero_optimization.stage3_prefetch_bucket_sise; did you mean "
                      "\"stage3_prefetch_bucket_size\"?"));
  CHECK_THAT(error_of([&] { zero.finish(); }), Contains("stage3_prefetch_bucket_sise"));
}

TEST_CASE("reader: unknown keys far from every known key list the valid keys", "[json]") {
  const Json j = parse_json(R"({"fp16": {"enabled": true, "completely_different": 1}})");
  JsonObjectReader r(j, "config");
  JsonObjectReader fp16 = r.object("fp16");
  fp16.get<bool>("enabled", false);
  fp16.get<double>("loss_scale", 0.0);
  CHECK_THAT(error_of([&] { r.finish(); }),
             Contains("unknown key $.fp16.completely_different; valid keys: enabled, loss_scale"));
  // A section nobody opened is itself an unknown key.
  const Json k = parse_json(R"({"steps": 1, "sparse_attention": {"mode": "fixed"}})");
  JsonObjectReader r2(k, "config");
  r2.get<int64_t>("steps", 0);
  CHECK_THAT(error_of([&] { r2.finish(); }),
             Contains("unknown key $.sparse_attention; valid keys: steps"));
}

TEST_CASE("reader: nested objects, arrays of objects and raw values", "[json]") {
  const Json j = parse_json(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3,
                                "betas": [0.9, 0.95]}}, "layers": [{"n": 1}, {"n": 2, "other": 3}],
                                "free": {"anything": [1, {"x": 2}]}})");
  JsonObjectReader r(j, "config");
  JsonObjectReader opt = r.required_object("optimizer");
  CHECK(opt.path() == "$.optimizer");
  CHECK(opt.required<std::string>("type") == "AdamW");
  JsonObjectReader params = opt.object("params");
  CHECK(params.get<double>("lr", 0.0) == 1e-3);
  CHECK(params.get<std::vector<double>>("betas", {}) == std::vector<double>{0.9, 0.95});
  // Opening the same object again shares what was asked about.
  CHECK(opt.object("params").get<double>("eps", 1e-8) == 1e-8);
  std::vector<JsonObjectReader> layers = r.objects("layers");
  REQUIRE(layers.size() == 2);
  CHECK(layers[1].path() == "$.layers[1]");
  for (JsonObjectReader& l : layers) CHECK(l.get<int64_t>("n", 0) > 0);
  const Json* free = r.raw("free");
  REQUIRE(free != nullptr);
  CHECK((*free)["anything"][1]["x"] == 2);
  CHECK(r.raw("absent") == nullptr);
  CHECK_THAT(error_of([&] { r.finish(); }),
             Contains("unknown key $.layers[1].other; valid keys: n"));
  layers[1].get<int64_t>("other", 0);
  CHECK_NOTHROW(r.finish());

  // An absent object reads as empty; required_object says what is missing.
  JsonObjectReader sched = r.object("scheduler");
  CHECK(sched.path() == "$.scheduler");
  CHECK(sched.get<std::string>("type", "none") == "none");
  CHECK_FALSE(r.has("scheduler"));
  CHECK_THAT(error_of([&] { r.required_object("model"); }),
             Contains("$.model: required key missing"));
  CHECK(r.objects("absent_list").empty());
  CHECK_THAT(error_of([&] { r.objects("optimizer"); }),
             Contains("$.optimizer: expected array, found object"));
  // A short key one edit away from a known key is still a likely typo.
  const Json typo = parse_json(R"({"n": 1, "m": 2})");
  JsonObjectReader rt(typo);
  rt.get<int64_t>("n", 0);
  CHECK_THAT(error_of([&] { rt.finish(); }), Contains("unknown key $.m; did you mean \"n\"?"));
  const Json bad = parse_json(R"({"layers": [{"n": 1}, 7]})");
  JsonObjectReader rb(bad);
  CHECK_THAT(error_of([&] { rb.objects("layers"); }),
             Contains("$.layers[1]: expected object, found number 7"));
}

TEST_CASE("reader: deprecated, ignored and unsupported keys", "[json]") {
  // A deprecated spelling maps onto the new key with a warning.
  const Json old_only = parse_json(R"({"prefetch_bucket_size": 100})");
  JsonObjectReader r1(old_only, "config");
  r1.deprecated_alias("prefetch_bucket_size", "stage3_prefetch_bucket_size");
  CHECK(r1.get<int64_t>("stage3_prefetch_bucket_size", 5) == 100);
  CHECK(r1.has("stage3_prefetch_bucket_size"));
  REQUIRE(r1.warnings().size() == 1);
  CHECK_THAT(r1.warnings()[0], Contains("$.prefetch_bucket_size is deprecated; use "
                                        "$.stage3_prefetch_bucket_size instead"));
  CHECK_NOTHROW(r1.finish());

  // Both spellings at once is an error.
  const Json both =
      parse_json(R"({"prefetch_bucket_size": 100, "stage3_prefetch_bucket_size": 1})");
  JsonObjectReader r2(both, "config");
  CHECK_THAT(
      error_of([&] { r2.deprecated_alias("prefetch_bucket_size", "stage3_prefetch_bucket_size"); }),
      Contains("deprecated key $.prefetch_bucket_size and its replacement "
               "$.stage3_prefetch_bucket_size cannot be given together"));

  // A deprecated key whose value the caller maps (DeepSpeed's zero cpu_offload).
  const Json cpu = parse_json(R"({"zero_optimization": {"cpu_offload": true}})");
  JsonObjectReader r3(cpu, "config");
  JsonObjectReader z3 = r3.object("zero_optimization");
  CHECK(z3.deprecated("cpu_offload", "offload_optimizer"));
  CHECK(z3.get<bool>("cpu_offload", false));
  CHECK(r3.warnings().size() == 1);
  CHECK_NOTHROW(r3.finish());
  const Json cpu_both =
      parse_json(R"({"cpu_offload": true, "offload_optimizer": {"device": "cpu"}})");
  JsonObjectReader r4(cpu_both, "config");
  CHECK_THAT(error_of([&] { r4.deprecated("cpu_offload", "offload_optimizer"); }),
             Contains("cannot be given together"));
  const Json neither = parse_json("{}");
  JsonObjectReader r5(neither);
  CHECK_FALSE(r5.deprecated("cpu_offload", "offload_optimizer"));
  CHECK(r5.warnings().empty());

  // Ignored keys are accepted with a warning; unsupported keys are errors that say so.
  const Json misc = parse_json(R"({"wall_clock_breakdown": true, "amp": {"enabled": true}})");
  JsonObjectReader r6(misc, "config");
  r6.ignored("wall_clock_breakdown", "Tessera always reports timings");
  r6.ignored("dump_state", "never used");
  CHECK(r6.warnings().size() == 1);
  CHECK_THAT(r6.warnings()[0], Contains("$.wall_clock_breakdown is ignored"));
  CHECK_THAT(error_of([&] { r6.unsupported("amp", "use \"fp16\" or \"bf16\""); }),
             Contains("[config] $.amp is not supported: use \"fp16\" or \"bf16\""));
  r6.unsupported("absent_feature", "not implemented");  // absent: fine
}

TEST_CASE("reader: an object that takes no keys says so", "[json]") {
  const Json j = parse_json(R"({"empty": {"x": 1}})");
  JsonObjectReader r(j);
  r.object("empty");
  CHECK_THAT(error_of([&] { r.finish(); }),
             Contains("unknown key $.empty.x; $.empty takes no keys"));
}

TEST_CASE("reader: collecting reports every problem in one error", "[json]") {
  const Json j = parse_json(R"({
    "batch": "12",
    "zero": {"stage": 7, "reduce_bucket_sise": 5},
    "sched": {"type": "Cosine", "params": {"anything": 1}},
    "opt": 3,
    "extra": true
  })");
  JsonObjectReader r(j, "config");
  r.collect_errors();
  CHECK(r.get<int64_t>("batch", 1) == 1);  // the fallback after a recorded problem
  JsonObjectReader zero = r.object("zero");
  CHECK(zero.get_in_range<int64_t>("stage", 0, 0, 3) == 0);
  zero.get<int64_t>("reduce_bucket_size", 0);
  JsonObjectReader sched = r.object("sched");
  sched.required_one_of("type", {"WarmupLR", "OneCycle"});
  sched.object("params");                   // its keys depend on the bad type: not reported
  r.object("opt").get<double>("lr", 1e-3);  // not an object: read as empty, quietly
  JsonObjectReader data = r.required_object("data");
  data.required<std::string>("train");  // inside a missing required object: not reported
  CHECK(error_of([&] { r.finish(); }) ==
        "[config] 7 problems:\n"
        "  $.batch: expected integer, found string \"12\"\n"
        "  $.zero.stage: expected an integer in [0, 3], found 7\n"
        "  $.sched.type: expected one of \"WarmupLR\", \"OneCycle\"; found \"Cosine\"\n"
        "  $.opt: expected object, found number 3\n"
        "  $.data: required key missing\n"
        "  unknown key $.extra; valid keys: batch, data, opt, sched, zero\n"
        "  unknown key $.zero.reduce_bucket_sise; did you mean \"reduce_bucket_size\"?");
  // A check outside the reader after a collected problem is taken for its consequence.
  JsonObjectReader again(j, "config");
  again.collect_errors();
  again.get<int64_t>("batch", 1);
  CHECK(error_of([&] {
          try {
            TS_FAIL("[config] batch 1 does not divide the world");
          } catch (const tessera::Error&) {
            again.throw_if_collected();
            throw;
          }
        }) == "[config] $.batch: expected integer, found string \"12\"");
  // Without collecting, the first problem throws as before.
  JsonObjectReader first(j, "config");
  CHECK(error_of([&] { first.get<int64_t>("batch", 1); }) ==
        "[config] $.batch: expected integer, found string \"12\"");
}
