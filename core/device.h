// Where a tensor's memory lives: the host, or one CUDA device.
#pragma once

#include <ostream>
#include <string>
#include <string_view>

namespace tessera {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // CUDA ordinal; always 0 for the CPU

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  // Parses "cpu", "cuda" or "cuda:N"; throws naming the accepted forms.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;  // "cpu" or "cuda:N"

  friend bool operator==(const Device&, const Device&) = default;
};

std::ostream& operator<<(std::ostream& os, const Device& device);

}  // namespace tessera
