#include "parallel/comm/flat_pieces.h"

#include <algorithm>

#include "core/factories.h"

namespace tessera::parallel {

Tensor flat_piece(const Tensor& t, const Communicator& group) {
  const int parts = group.size();
  const int64_t n = t.numel(), piece = (n + parts - 1) / parts;
  const int64_t begin = std::min(n, piece * group.rank());
  const int64_t len = std::min(n, begin + piece) - begin;
  const Tensor flat = t.contiguous().view({n});
  if (len == piece) return flat.narrow(0, begin, piece);
  Tensor padded = zeros({piece}, {t.dtype(), t.device()});  // the last piece, short
  if (len > 0) padded.narrow(0, 0, len).copy_(flat.narrow(0, begin, len));
  return padded;
}

Tensor gather_flat_pieces(const Tensor& piece, const Shape& shape, Communicator& group) {
  const Tensor all = empty({piece.numel() * group.size()}, {piece.dtype(), piece.device()});
  group.all_gather(piece, all);
  return all.narrow(0, 0, numel_of(shape)).view(shape);
}

}  // namespace tessera::parallel
