// All differentiable ops (the list is autograd/op_list.h).
#pragma once

#include "autograd/ops/block_sparse.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/nn.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
