#include "parallel/expert/expert_groups.h"

#include "core/error.h"

namespace tessera::parallel {

ExpertGroups make_expert_groups(Communicator& data, int ep) {
  TS_CHECK(ep >= 1 && data.size() % ep == 0, "[expert parallel] ep_size ", ep,
           ": expected a divisor of the data-parallel group's ", data.size(), " ranks");
  const int r = data.rank();
  ExpertGroups g;
  g.expert = data.split(r / ep, r);
  g.expert_data = data.split(r % ep, r);
  return g;
}

}  // namespace tessera::parallel
