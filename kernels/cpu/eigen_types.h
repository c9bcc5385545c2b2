// Eigen views of contiguous tensor memory, shared by the CPU kernels (the only place
// Eigen is used).
#pragma once

#include <Eigen/Core>

namespace tessera::kernels::cpu {

template <class T>
using ArrayX = Eigen::Array<T, Eigen::Dynamic, 1>;
// A contiguous run of elements seen as an Eigen array (vectorized math).
template <class T>
using ArrayMap = Eigen::Map<ArrayX<T>>;
template <class T>
using ConstArrayMap = Eigen::Map<const ArrayX<T>>;

}  // namespace tessera::kernels::cpu
