#include "core/device.h"

#include <charconv>

#include "core/error.h"

namespace tessera {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.starts_with("cuda:")) {
    std::string_view digits = text.substr(5);
    int index = -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && index >= 0) {
      return cuda(index);
    }
  }
  TS_FAIL("[device] expected \"cpu\", \"cuda\" or \"cuda:N\"; found \"", text, "\"");
}

std::string Device::str() const { return is_cpu() ? "cpu" : str_cat("cuda:", index); }

std::ostream& operator<<(std::ostream& os, const Device& device) { return os << device.str(); }

}  // namespace tessera
