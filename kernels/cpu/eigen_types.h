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

// A contiguous row-major (rows, cols) block of memory seen as an Eigen matrix.
template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MatrixMap = Eigen::Map<Matrix<T>>;
template <class T>
using ConstMatrixMap = Eigen::Map<const Matrix<T>>;

}  // namespace tessera::kernels::cpu
