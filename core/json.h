// Strict JSON: a parser that rejects duplicate keys, and a reader that rejects unknown keys.
//
//   nlohmann::json doc = parse_json_file("ds_config.json");
//   JsonObjectReader r(doc, "config");
//   int64_t batch = r.required<int64_t>("train_batch_size");
//   JsonObjectReader zero = r.object("zero_optimization");
//   int64_t stage = zero.get_in_range<int64_t>("stage", 0, 0, 3);
//   r.finish();  // throws on any key nobody asked for, in every object that was opened
//
// Every error is one line naming the JSON path ("$.zero_optimization.stage"), what was
// expected and what was found; an unknown key also names the closest key the reader was
// asked about ("did you mean ...?").
//
// Note [Strict config reading]
// DeepSpeed silently ignores unknown top-level keys (a typo such as
// "grandient_accumulation_steps" lives on in its own tests) and its JSON loader keeps the
// last of two duplicate keys. Tessera fails on both: a config is read by asking for each
// key it understands, and finish() turns every key nobody asked for into an error with a
// suggestion, so a typo can never silently fall back to a default.
//
// Note [One pass]
// A reader that collect_errors() was called on reports every problem of a document at
// once, so that a file with five mistakes takes one run to fix, not five: a getter that
// finds a wrong type, an out-of-range value, a value outside its set or a missing required
// key records the problem and returns its fallback (a default value for a required key),
// finish() records every unknown key, and finish() on the root throws them all in one error
// (one line when there is one problem, else a count and one line each). A check outside the
// reader that throws after a problem was collected may be its consequence (it read the
// fallback), so its catcher reports the collected problems instead (throw_if_collected(),
// then rethrow); likewise
// the unknown keys below an object whose required choice from a set was bad (a "type"
// whose schema the objects below follow) and the problems inside a required object that is
// missing go unreported. Without
// collect_errors() the first problem throws, as before.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace tessera {

// The most arrays and objects parse_json lets nest inside each other by default: deeper
// than any config, safetensors header, tokenizer or checkpoint file needs.
inline constexpr int kMaxJsonDepth = 64;

// Parses strict JSON text (no comments, no trailing commas, no duplicate keys at any
// depth, at most `max_depth` nested arrays and objects). `source` names the text in errors
// (a file name, or "<string>"). Syntax errors name the source, the byte offset, line and
// column; duplicate keys and too deep a nesting name the JSON path. Time and memory are
// linear in the size of the text.
nlohmann::json parse_json(std::string_view text, std::string_view source = "<string>",
                          int max_depth = kMaxJsonDepth);
// Reads the file at `path` and parses it as parse_json does.
nlohmann::json parse_json_file(const std::string& path);

// The JSON path of `key` inside the value at `parent`: "$.a.b", or `$.a["odd key"]` for
// keys that are not identifiers.
std::string json_key_path(std::string_view parent, std::string_view key);
// A short description of a JSON value for messages: `string "5e8x"`, `number 2.5`,
// `boolean true`, `null`, `object`, `array`.
std::string describe_json(const nlohmann::json& value);
// Edit distance (insertions, deletions, substitutions) between two strings.
size_t levenshtein(std::string_view a, std::string_view b);

// Converts one JSON value to T or throws "[component] <path>: expected <kind>, found
// <value>". T is one of bool, int, int64_t, float, double, std::string, or a std::vector
// of int, int64_t, double or std::string. Integers accept integral numbers written as
// floats (2.0, 5e8); floating types accept any number; bool accepts only true/false.
template <class T>
T json_as(const nlohmann::json& value, const std::string& path,
          std::string_view component = "json");
extern template bool json_as<bool>(const nlohmann::json&, const std::string&, std::string_view);
extern template int json_as<int>(const nlohmann::json&, const std::string&, std::string_view);
extern template int64_t json_as<int64_t>(const nlohmann::json&, const std::string&,
                                         std::string_view);
extern template float json_as<float>(const nlohmann::json&, const std::string&, std::string_view);
extern template double json_as<double>(const nlohmann::json&, const std::string&, std::string_view);
extern template std::string json_as<std::string>(const nlohmann::json&, const std::string&,
                                                 std::string_view);
extern template std::vector<int> json_as<std::vector<int>>(const nlohmann::json&,
                                                           const std::string&, std::string_view);
extern template std::vector<int64_t> json_as<std::vector<int64_t>>(const nlohmann::json&,
                                                                   const std::string&,
                                                                   std::string_view);
extern template std::vector<double> json_as<std::vector<double>>(const nlohmann::json&,
                                                                 const std::string&,
                                                                 std::string_view);
extern template std::vector<std::string> json_as<std::vector<std::string>>(const nlohmann::json&,
                                                                           const std::string&,
                                                                           std::string_view);

// Reads the keys of one JSON object, remembering which keys it was asked about.
//
// Readers opened with object()/objects() share bookkeeping with their parent, so finish()
// on the root checks the whole tree that was opened. Copies of a reader share it too. The
// JSON document must outlive every reader over it. A key given as null is a type error,
// not an absent key.
class JsonObjectReader {
 public:
  // A reader over `root`, which must be an object. `component` leads every message
  // ("[config] ..."); `path` is the JSON path of `root` in its document.
  explicit JsonObjectReader(const nlohmann::json& root, std::string component = "json",
                            std::string path = "$");

  // The JSON path of this object ("$", "$.zero_optimization", "$.layers[2]").
  const std::string& path() const;
  // The JSON path of `key` inside this object.
  std::string key_path(std::string_view key) const;

  // True when `key` is present (directly or through a deprecated alias); marks it known.
  bool has(std::string_view key);
  // The value of `key` when present, else `fallback`.
  template <class T>
  T get(std::string_view key, T fallback);
  // The value of `key`; throws "<path>: required key missing" when absent.
  template <class T>
  T required(std::string_view key);
  // The value of `key` when present.
  template <class T>
  std::optional<T> optional(std::string_view key);

  // get()/required() for a number that must lie in [lo, hi]; the error names the range.
  // A fallback is returned unchecked.
  template <class T>
  T get_in_range(std::string_view key, T fallback, T lo, T hi);
  template <class T>
  T required_in_range(std::string_view key, T lo, T hi);
  // A string from a fixed set (case-sensitive); the error lists the allowed values.
  std::string get_one_of(std::string_view key, std::string fallback,
                         const std::vector<std::string>& allowed);
  std::string required_one_of(std::string_view key, const std::vector<std::string>& allowed);

  // A reader over the nested object at `key`; over an empty object when absent, so that
  // its getters return their fallbacks. Throws when `key` holds a non-object (records it
  // and reads an empty object when collecting). Opening the
  // same key twice returns readers that share their bookkeeping.
  JsonObjectReader object(std::string_view key);
  // As object(), but throws when `key` is absent.
  JsonObjectReader required_object(std::string_view key);
  // Readers over the elements of the array of objects at `key` (none when absent).
  std::vector<JsonObjectReader> objects(std::string_view key);
  // The raw value at `key` (nullptr when absent), accepted as is; for values whose keys
  // are not fixed. The caller validates it.
  const nlohmann::json* raw(std::string_view key);

  // Declares `old_key` a deprecated spelling of `new_key`; declare it before reading
  // `new_key`. When only `old_key` is given, reading `new_key` returns its value and a
  // warning is recorded; when both are given, throws.
  void deprecated_alias(std::string_view old_key, std::string_view new_key);
  // Declares `old_key` deprecated in favour of `new_key` where the caller maps the value
  // itself: returns whether `old_key` is present (recording a warning) and throws when
  // both are given. Read the old value with get() afterwards.
  bool deprecated(std::string_view old_key, std::string_view new_key);
  // Accepts `key` without using it; when present, records a warning saying `why`.
  void ignored(std::string_view key, std::string_view why);
  // Throws when `key` is present: "<path> is not supported: <why>".
  void unsupported(std::string_view key, std::string_view why);

  // Records problems instead of throwing at the first (Note [One pass]); call it on the
  // root before reading.
  void collect_errors();
  // Throws the problems collected so far, if any (Note [One pass]): for a caller that cannot
  // go on without a valid value, and in the handler of an error that a check outside the
  // reader threw, which may follow from them.
  void throw_if_collected() const;

  // Records a warning for the caller to log (the reader itself never logs).
  void warn(std::string message);
  // The warnings recorded so far by every reader of this tree, in order.
  const std::vector<std::string>& warnings() const;

  // Throws for the first key, in this object or any object opened from it, that nothing
  // asked about: "unknown key $.zero_optimization.stage3_prefetch_bucket_sise; did you
  // mean \"stage3_prefetch_bucket_size\"?", or the valid keys when none is close. When
  // collecting (Note [One pass]) it records every such key instead, and on the root throws
  // everything collected.
  void finish() const;

 private:
  struct Node;
  struct Tree;
  JsonObjectReader(std::shared_ptr<Tree> tree, std::shared_ptr<Node> node);

  // The value of `key` (or of its deprecated alias), or nullptr; marks `key` known.
  const nlohmann::json* find(std::string_view key);
  const std::string& component() const;
  [[noreturn]] void fail(const std::string& message) const;
  // Throws `message`, or records it when collecting (and then returns).
  void problem(const std::string& message) const;
  bool collecting() const;
  // json_as<T> of `v` at `key`; a conversion error is recorded when collecting, and then
  // `fallback` is returned.
  template <class T>
  T convert(const nlohmann::json& v, std::string_view key, T fallback) const;
  // Whether lo <= value <= hi; otherwise the error names the range (problem()).
  template <class T>
  bool check_range(std::string_view key, T value, T lo, T hi) const;
  // The reader over the object `v` at `key` (absent: an empty object), made once.
  JsonObjectReader open(std::string_view key, const nlohmann::json* v, bool quiet);
  // Records the unknown keys of this object and of the objects opened from it.
  void record_unknown_keys() const;
  // Throws every collected problem as one error (Note [One pass]).
  [[noreturn]] void throw_collected() const;

  std::shared_ptr<Tree> tree_;
  std::shared_ptr<Node> node_;
};

// ---- template definitions ------------------------------------------------------------------

template <class T>
T JsonObjectReader::convert(const nlohmann::json& v, std::string_view key, T fallback) const {
  if (!collecting()) return json_as<T>(v, key_path(key), component());
  try {
    return json_as<T>(v, key_path(key), component());
  } catch (const Error& e) {
    problem(e.what());
    return fallback;
  }
}

template <class T>
T JsonObjectReader::get(std::string_view key, T fallback) {
  const nlohmann::json* v = find(key);
  return v ? convert<T>(*v, key, fallback) : std::move(fallback);
}

template <class T>
T JsonObjectReader::required(std::string_view key) {
  const nlohmann::json* v = find(key);
  if (v == nullptr) {
    problem(str_cat(key_path(key), ": required key missing"));
    return T{};
  }
  return convert<T>(*v, key, T{});
}

template <class T>
std::optional<T> JsonObjectReader::optional(std::string_view key) {
  const nlohmann::json* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!collecting()) return json_as<T>(*v, key_path(key), component());
  try {
    return json_as<T>(*v, key_path(key), component());
  } catch (const Error& e) {
    problem(e.what());
    return std::nullopt;
  }
}

template <class T>
bool JsonObjectReader::check_range(std::string_view key, T value, T lo, T hi) const {
  static_assert(std::is_arithmetic_v<T>, "range checks are for numbers");
  if (value >= lo && value <= hi) return true;
  const char* kind = std::is_integral_v<T> ? "an integer" : "a number";
  if (hi == std::numeric_limits<T>::max()) {
    problem(str_cat(key_path(key), ": expected ", kind, " >= ", lo, ", found ", value));
  } else if (lo == std::numeric_limits<T>::lowest()) {
    problem(str_cat(key_path(key), ": expected ", kind, " <= ", hi, ", found ", value));
  } else {
    problem(str_cat(key_path(key), ": expected ", kind, " in [", lo, ", ", hi, "], found ", value));
  }
  return false;
}

template <class T>
T JsonObjectReader::get_in_range(std::string_view key, T fallback, T lo, T hi) {
  const std::optional<T> v = optional<T>(key);
  if (!v) return fallback;
  return check_range(key, *v, lo, hi) ? *v : fallback;
}

template <class T>
T JsonObjectReader::required_in_range(std::string_view key, T lo, T hi) {
  if (!has(key)) {
    problem(str_cat(key_path(key), ": required key missing"));
    return lo;
  }
  const std::optional<T> v = optional<T>(key);  // a wrong type is recorded once
  return v && check_range(key, *v, lo, hi) ? *v : lo;
}

}  // namespace tessera
