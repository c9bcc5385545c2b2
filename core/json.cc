#include "core/json.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <set>

namespace tessera {
namespace {

using Json = nlohmann::json;

bool is_identifier(std::string_view key) {
  if (key.empty() || std::isdigit(static_cast<unsigned char>(key[0]))) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

std::string dump_for_message(const Json& value) {
  std::string s = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  constexpr size_t kMax = 60;
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

int64_t as_int64(const Json& v, const std::string& path, std::string_view component) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    TS_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "[", component, "] ",
             path, ": expected a 64-bit integer, found number ", u);
    return static_cast<int64_t>(u);
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // 2^63 is exact in double; [-2^63, 2^63) is exactly the int64 range.
    TS_CHECK(std::isfinite(d) && std::trunc(d) == d && d >= -9223372036854775808.0 &&
                 d < 9223372036854775808.0,
             "[", component, "] ", path, ": expected integer, found ", describe_json(v));
    return static_cast<int64_t>(d);
  }
  TS_FAIL("[", component, "] ", path, ": expected integer, found ", describe_json(v));
}

double as_double(const Json& v, const std::string& path, std::string_view component) {
  TS_CHECK(v.is_number(), "[", component, "] ", path, ": expected number, found ",
           describe_json(v));
  return v.get<double>();
}

const Json& empty_object() {
  static const Json empty = Json::object();
  return empty;
}

}  // namespace

std::string json_key_path(std::string_view parent, std::string_view key) {
  constexpr size_t kShown = 60;  // a long key is shown as dump_for_message shows values
  if (is_identifier(key) && key.size() <= kShown) return str_cat(parent, ".", key);
  return str_cat(parent, "[", dump_for_message(Json(std::string(key))), "]");
}

std::string describe_json(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return str_cat("boolean ", dump_for_message(value));
    case Json::value_t::string:
      return str_cat("string ", dump_for_message(value));
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      return str_cat("number ", dump_for_message(value));
    case Json::value_t::object:
      return "object";
    case Json::value_t::array:
      return "array";
    default:
      return "a non-JSON value";
  }
}

size_t levenshtein(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];  // row[i-1][j-1]
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// ---- conversions -----------------------------------------------------------------------------

template <class T>
T json_as(const Json& v, const std::string& path, std::string_view component) {
  if constexpr (std::is_same_v<T, bool>) {
    TS_CHECK(v.is_boolean(), "[", component, "] ", path, ": expected boolean, found ",
             describe_json(v));
    return v.get<bool>();
  } else if constexpr (std::is_same_v<T, int64_t>) {
    return as_int64(v, path, component);
  } else if constexpr (std::is_same_v<T, int>) {
    const int64_t i = as_int64(v, path, component);
    TS_CHECK(i >= std::numeric_limits<int>::min() && i <= std::numeric_limits<int>::max(), "[",
             component, "] ", path, ": expected a 32-bit integer, found number ", i);
    return static_cast<int>(i);
  } else if constexpr (std::is_same_v<T, double>) {
    return as_double(v, path, component);
  } else if constexpr (std::is_same_v<T, float>) {
    const double d = as_double(v, path, component);
    TS_CHECK(std::fabs(d) <= std::numeric_limits<float>::max(), "[", component, "] ", path,
             ": expected a number in float range, found ", describe_json(v));
    return static_cast<float>(d);
  } else if constexpr (std::is_same_v<T, std::string>) {
    TS_CHECK(v.is_string(), "[", component, "] ", path, ": expected string, found ",
             describe_json(v));
    return v.get<std::string>();
  } else {
    using E = typename T::value_type;
    TS_CHECK(v.is_array(), "[", component, "] ", path, ": expected array, found ",
             describe_json(v));
    T out;
    out.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      out.push_back(json_as<E>(v[i], str_cat(path, "[", i, "]"), component));
    }
    return out;
  }
}

#define TS_INSTANTIATE_JSON_AS(T) \
  template T json_as<T>(const Json&, const std::string&, std::string_view);
TS_INSTANTIATE_JSON_AS(bool)
TS_INSTANTIATE_JSON_AS(int)
TS_INSTANTIATE_JSON_AS(int64_t)
TS_INSTANTIATE_JSON_AS(float)
TS_INSTANTIATE_JSON_AS(double)
TS_INSTANTIATE_JSON_AS(std::string)
TS_INSTANTIATE_JSON_AS(std::vector<int>)
TS_INSTANTIATE_JSON_AS(std::vector<int64_t>)
TS_INSTANTIATE_JSON_AS(std::vector<double>)
TS_INSTANTIATE_JSON_AS(std::vector<std::string>)
#undef TS_INSTANTIATE_JSON_AS

// ---- JsonObjectReader ------------------------------------------------------------------------

// Bookkeeping shared by all readers of one document.
struct JsonObjectReader::Tree {
  std::string component;
  std::vector<std::string> warnings;
  const void* root = nullptr;         // the root's Node
  bool collect = false;               // Note [One pass]
  std::vector<std::string> problems;  // collected, each without the "[component] " lead
};

// One object that was opened, with the keys it was asked about.
struct JsonObjectReader::Node {
  const Json* value = nullptr;
  std::string path;
  // A required object that is missing or not an object, and what is opened from it: read
  // as empty, its own problems are consequences and go unreported (Note [One pass]).
  bool quiet = false;
  // A required choice from a set is missing or bad here (a "type"): the objects opened from
  // this one may follow a schema that depends on it, so their unknown keys go unreported.
  bool bad_choice = false;
  std::vector<std::string> known;                // in the order first asked, for suggestions
  std::set<std::string, std::less<>> known_set;  // the same keys, for lookup
  std::map<std::string, std::string, std::less<>> alias_of;  // new key -> deprecated key
  // Children opened by object()/objects(), in opening order.
  std::vector<std::pair<std::string, std::vector<std::shared_ptr<Node>>>> children;

  void mark_known(std::string_view key) {
    if (known_set.insert(std::string(key)).second) known.emplace_back(key);
  }
  const Json* lookup(std::string_view key) const {
    auto it = value->find(std::string(key));
    return it == value->end() ? nullptr : &*it;
  }
  std::vector<std::shared_ptr<Node>>* opened(std::string_view key) {
    for (auto& [k, nodes] : children) {
      if (k == key) return &nodes;
    }
    return nullptr;
  }
};

JsonObjectReader::JsonObjectReader(const Json& root, std::string component, std::string path)
    : tree_(std::make_shared<Tree>()), node_(std::make_shared<Node>()) {
  tree_->component = std::move(component);
  tree_->root = node_.get();
  node_->value = &root;
  node_->path = std::move(path);
  if (!root.is_object()) {
    fail(str_cat(node_->path, ": expected object, found ", describe_json(root)));
  }
}

JsonObjectReader::JsonObjectReader(std::shared_ptr<Tree> tree, std::shared_ptr<Node> node)
    : tree_(std::move(tree)), node_(std::move(node)) {}

const std::string& JsonObjectReader::path() const { return node_->path; }

std::string JsonObjectReader::key_path(std::string_view key) const {
  return json_key_path(node_->path, key);
}

const std::string& JsonObjectReader::component() const { return tree_->component; }

void JsonObjectReader::fail(const std::string& message) const {
  TS_FAIL("[", tree_->component, "] ", message);
}

bool JsonObjectReader::collecting() const { return tree_->collect; }

void JsonObjectReader::problem(const std::string& message) const {
  if (tree_->collect && node_->quiet) return;
  if (!tree_->collect) {
    // json_as's messages carry the component already.
    if (message.rfind("[", 0) == 0) TS_FAIL(message);
    fail(message);
  }
  const std::string lead = "[" + tree_->component + "] ";
  std::string text = message.rfind(lead, 0) == 0 ? message.substr(lead.size()) : message;
  if (std::find(tree_->problems.begin(), tree_->problems.end(), text) == tree_->problems.end())
    tree_->problems.push_back(std::move(text));
}

void JsonObjectReader::collect_errors() { tree_->collect = true; }

void JsonObjectReader::throw_if_collected() const {
  if (tree_->collect && !tree_->problems.empty()) throw_collected();
}

void JsonObjectReader::throw_collected() const {
  std::string message = "[" + tree_->component + "] ";
  if (tree_->problems.size() == 1) {
    message += tree_->problems[0];
  } else {
    message += str_cat(tree_->problems.size(), " problems:");
    for (const std::string& p : tree_->problems) message += "\n  " + p;
  }
  TS_FAIL(message);
}

const Json* JsonObjectReader::find(std::string_view key) {
  node_->mark_known(key);
  if (const Json* v = node_->lookup(key)) return v;
  auto alias = node_->alias_of.find(key);
  return alias == node_->alias_of.end() ? nullptr : node_->lookup(alias->second);
}

bool JsonObjectReader::has(std::string_view key) { return find(key) != nullptr; }

std::string JsonObjectReader::get_one_of(std::string_view key, std::string fallback,
                                         const std::vector<std::string>& allowed) {
  const std::optional<std::string> v = optional<std::string>(key);
  if (!v) return fallback;
  if (std::find(allowed.begin(), allowed.end(), *v) == allowed.end()) {
    std::string list;
    for (size_t i = 0; i < allowed.size(); ++i) {
      list += str_cat(i ? ", " : "", dump_for_message(Json(allowed[i])));
    }
    problem(
        str_cat(key_path(key), ": expected one of ", list, "; found ", dump_for_message(Json(*v))));
    return fallback;
  }
  return *v;
}

std::string JsonObjectReader::required_one_of(std::string_view key,
                                              const std::vector<std::string>& allowed) {
  if (find(key) == nullptr) problem(str_cat(key_path(key), ": required key missing"));
  const std::string v = get_one_of(key, "", allowed);
  if (v.empty()) node_->bad_choice = true;
  return v;
}

JsonObjectReader JsonObjectReader::object(std::string_view key) {
  const Json* v = find(key);
  bool quiet = node_->quiet;
  if (v != nullptr && !v->is_object()) {
    problem(str_cat(key_path(key), ": expected object, found ", describe_json(*v)));
    v = nullptr;  // read as absent
    quiet = true;
  }
  return open(key, v, quiet);
}

JsonObjectReader JsonObjectReader::open(std::string_view key, const Json* v, bool quiet) {
  std::vector<std::shared_ptr<Node>>* nodes = node_->opened(key);
  if (nodes != nullptr && !nodes->empty()) return JsonObjectReader(tree_, nodes->front());
  auto node = std::make_shared<Node>();
  node->value = v != nullptr ? v : &empty_object();
  node->path = key_path(key);
  node->quiet = quiet;
  if (nodes != nullptr) {
    nodes->push_back(node);
  } else {
    node_->children.emplace_back(std::string(key), std::vector<std::shared_ptr<Node>>{node});
  }
  return JsonObjectReader(tree_, std::move(node));
}

JsonObjectReader JsonObjectReader::required_object(std::string_view key) {
  if (find(key) != nullptr) return object(key);
  problem(str_cat(key_path(key), ": required key missing"));
  return open(key, nullptr, true);
}

std::vector<JsonObjectReader> JsonObjectReader::objects(std::string_view key) {
  const Json* v = find(key);
  if (v != nullptr && !v->is_array()) {
    problem(str_cat(key_path(key), ": expected array, found ", describe_json(*v)));
    v = nullptr;  // read as absent
  }
  std::vector<std::shared_ptr<Node>>* nodes = node_->opened(key);
  if (nodes == nullptr) {
    std::vector<std::shared_ptr<Node>> created;
    if (v != nullptr) {
      for (size_t i = 0; i < v->size(); ++i) {
        auto node = std::make_shared<Node>();
        node->value = &(*v)[i];
        node->path = str_cat(key_path(key), "[", i, "]");
        node->quiet = node_->quiet;
        if (!node->value->is_object()) {
          problem(str_cat(node->path, ": expected object, found ", describe_json(*node->value)));
          continue;
        }
        created.push_back(std::move(node));
      }
    }
    node_->children.emplace_back(std::string(key), std::move(created));
    nodes = &node_->children.back().second;
  }
  std::vector<JsonObjectReader> out;
  for (const std::shared_ptr<Node>& n : *nodes) out.push_back(JsonObjectReader(tree_, n));
  return out;
}

const Json* JsonObjectReader::raw(std::string_view key) { return find(key); }

void JsonObjectReader::deprecated_alias(std::string_view old_key, std::string_view new_key) {
  if (deprecated(old_key, new_key)) node_->alias_of.emplace(new_key, old_key);
}

bool JsonObjectReader::deprecated(std::string_view old_key, std::string_view new_key) {
  node_->mark_known(old_key);
  node_->mark_known(new_key);
  if (node_->lookup(old_key) == nullptr) return false;
  if (node_->lookup(new_key) != nullptr) {
    problem(str_cat("deprecated key ", key_path(old_key), " and its replacement ",
                    key_path(new_key), " cannot be given together"));
    return false;
  }
  warn(str_cat("[", component(), "] ", key_path(old_key), " is deprecated; use ", key_path(new_key),
               " instead"));
  return true;
}

void JsonObjectReader::ignored(std::string_view key, std::string_view why) {
  node_->mark_known(key);
  if (node_->lookup(key) != nullptr) {
    warn(str_cat("[", component(), "] ", key_path(key), " is ignored: ", why));
  }
}

void JsonObjectReader::unsupported(std::string_view key, std::string_view why) {
  node_->mark_known(key);
  if (node_->lookup(key) != nullptr) problem(str_cat(key_path(key), " is not supported: ", why));
}

void JsonObjectReader::warn(std::string message) { tree_->warnings.push_back(std::move(message)); }

const std::vector<std::string>& JsonObjectReader::warnings() const { return tree_->warnings; }

void JsonObjectReader::finish() const {
  record_unknown_keys();
  if (tree_->collect && node_.get() == tree_->root && !tree_->problems.empty()) throw_collected();
}

void JsonObjectReader::record_unknown_keys() const {
  for (const auto& [key, value] : node_->value->items()) {
    if (node_->known_set.count(key)) continue;
    // Suggest the nearest known key when it is close enough to be a typo of it.
    const std::string* best = nullptr;
    size_t best_distance = 0;
    for (const std::string& k : node_->known) {
      const size_t d = levenshtein(key, k);
      if (best == nullptr || d < best_distance) {
        best = &k;
        best_distance = d;
      }
    }
    if (best != nullptr && best_distance <= std::max<size_t>(2, key.size() / 3)) {
      problem(str_cat("unknown key ", key_path(key), "; did you mean ",
                      dump_for_message(Json(*best)), "?"));
    } else if (node_->known.empty()) {
      problem(str_cat("unknown key ", key_path(key), "; ", path(), " takes no keys"));
    } else {
      std::vector<std::string> valid = node_->known;
      std::sort(valid.begin(), valid.end());
      std::string list;
      for (size_t i = 0; i < valid.size(); ++i) list += str_cat(i ? ", " : "", valid[i]);
      problem(str_cat("unknown key ", key_path(key), "; valid keys: ", list));
    }
  }
  if (tree_->collect && node_->bad_choice) return;
  for (const auto& [key, nodes] : node_->children) {
    for (const std::shared_ptr<Node>& n : nodes) JsonObjectReader(tree_, n).record_unknown_keys();
  }
}

}  // namespace tessera
