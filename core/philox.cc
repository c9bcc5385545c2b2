#include "core/philox.h"

namespace tessera {

uint64_t hash_name(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  uint64_t z = h ^ (seed + 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Generator Generator::for_name(uint64_t seed, std::string_view name) {
  return Generator(hash_name(seed, name), 0);
}

}  // namespace tessera
