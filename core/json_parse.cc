// Strict JSON parsing (core/json.h): the document built from nlohmann's SAX events with
// duplicate keys and depth checked, and parse errors reported with their position.
#include <string>
#include <vector>

#include "core/file_io.h"
#include "core/json.h"

namespace tessera {
namespace {

using Json = nlohmann::json;
// nlohmann's message cut to 200 characters: it quotes the text last read, which can be a
// whole long string or number.
std::string shortened(const std::string& message) {
  constexpr size_t kMax = 200;
  if (message.size() <= kMax) return message;
  return str_cat(message.substr(0, kMax), "... (", message.size(), " characters)");
}

// Builds the document from nlohmann's SAX events (its parser keeps an explicit stack, so
// nothing recurses), rejecting duplicate keys and nesting deeper than `max_depth`. Each
// value is placed once: in its parent array, or at the map node its key made. Keys are
// looked up in their object's map, and a path is spelled only for an error, so the time
// is linear in the text (nlohmann's callback parser instead scans the parent object after
// each child object ends) and the memory too (a path per open level would be quadratic).
class StrictDomBuilder {
 public:
  StrictDomBuilder(std::string_view source, int max_depth)
      : source_(source), max_depth_(max_depth) {}

  Json take() { return std::move(root_); }

  bool null() { return add(nullptr); }
  bool boolean(bool v) { return add(v); }
  bool number_integer(Json::number_integer_t v) { return add(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return add(v); }
  bool number_float(Json::number_float_t v, const Json::string_t& /*text*/) { return add(v); }
  bool string(Json::string_t& v) { return add(std::move(v)); }
  bool binary(Json::binary_t& /*v*/) { TS_FAIL("[json] ", source_, ": binary value in JSON text"); }

  bool start_object(size_t /*elements*/) { return open(Json::value_t::object); }
  bool start_array(size_t /*elements*/) { return open(Json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(Json::string_t& key) {
    Json& object = *open_.back();
    TS_CHECK(!object.contains(key), "[json] ", source_, ": duplicate key \"",
             key.size() <= 60 ? key : key.substr(0, 60) + "...", "\" in ", path(open_.size()),
             " (each key may appear once)");
    next_ = &object[key];
    at_.back().key = std::move(key);
    return true;
  }

  bool parse_error(size_t /*position*/, const std::string& /*last_token*/,
                   const Json::exception& e) {
    if (const auto* syntax = dynamic_cast<const Json::parse_error*>(&e)) throw *syntax;
    TS_FAIL("[json] ", source_, ": ", shortened(e.what()));
  }

 private:
  // The value being parsed inside an open container: its key (objects) or index (arrays).
  struct Place {
    std::string key;
    int64_t index = 0;
  };

  // A number, string, boolean or null: placed, and ended.
  template <typename V>
  bool add(V&& value) {
    place(Json(std::forward<V>(value)));
    end_value();
    return true;
  }

  // A value ended: the next one in an array has the next index.
  void end_value() {
    if (!open_.empty() && open_.back()->is_array()) ++at_.back().index;
  }

  // Places `value` as the next value of the innermost open container (or as the root).
  Json* place(Json value) {
    if (open_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    *next_ = std::move(value);
    return next_;
  }

  bool open(Json::value_t kind) {
    const int depth = static_cast<int>(open_.size()) + 1;
    TS_CHECK(depth <= max_depth_, "[json] ", source_, ": expected at most ", max_depth_,
             " nested arrays and objects, found more at ", path(open_.size() + 1));
    open_.push_back(place(Json(kind)));
    at_.emplace_back();
    return true;
  }

  bool close() {
    open_.pop_back();
    at_.pop_back();
    end_value();
    return true;
  }

  // The JSON path of the value at `level` (0: the root) along the open containers: the
  // path of the innermost open one for level open_.size(), of the value inside it being
  // parsed now for open_.size() + 1.
  std::string path(size_t level) const {
    std::string p = "$";
    for (size_t i = 0; i + 1 < level; ++i) {
      p = open_[i]->is_object() ? json_key_path(p, at_[i].key) : str_cat(p, "[", at_[i].index, "]");
    }
    return p;
  }

  std::string source_;
  int max_depth_;
  Json root_;
  std::vector<Json*> open_;  // the open arrays and objects, outermost first
  std::vector<Place> at_;    // per open container: the key or index being parsed in it
  Json* next_ = nullptr;     // the node the last key made in the innermost open object
};

// "syntax error while parsing ..." from nlohmann's "[json.exception.parse_error.101]
// parse error at line 1, column 2: syntax error while parsing ...; last read: '...'".
std::string parse_reason(const std::string& what) {
  const size_t at = what.find("parse error");
  const size_t colon = what.find(": ", at == std::string::npos ? 0 : at);
  return shortened(colon == std::string::npos ? what : what.substr(colon + 2));
}

}  // namespace

Json parse_json(std::string_view text, std::string_view source, int max_depth) {
  // JSON text holds no NUL byte (a string spells it \u0000): say so rather than a parse
  // error about what follows it.
  const size_t nul = text.find('\0');
  TS_CHECK(nul == std::string_view::npos, "[json] ", source,
           ": expected JSON text, found a NUL byte at byte ", nul, " (a binary file?)");
  StrictDomBuilder builder(source, max_depth);
  try {
    Json::sax_parse(text.begin(), text.end(), &builder, nlohmann::json::input_format_t::json,
                    /*strict=*/true, /*ignore_comments=*/false);
    return builder.take();
  } catch (const Json::parse_error& e) {
    // nlohmann's byte is 1-based and points at the last character read.
    const size_t offset = e.byte == 0 ? 0 : std::min(e.byte - 1, text.size());
    size_t line = 1, column = 1;
    for (size_t i = 0; i < offset; ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    TS_FAIL("[json] ", source, ": parse error at byte ", offset, " (line ", line, ", column ",
            column, "): ", parse_reason(e.what()));
  } catch (const Json::exception& e) {
    TS_FAIL("[json] ", source, ": ", shortened(e.what()));
  }
}

Json parse_json_file(const std::string& path) {
  return parse_json(read_whole_file(path, "json", "a JSON file"), path);
}

}  // namespace tessera
