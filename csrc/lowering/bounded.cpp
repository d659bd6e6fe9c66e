// Bounded dynamic shapes in the lowering (README "Bounded dynamic shapes"): how an op that is not
// pointwise treats the padding of its padded inputs. A pointwise op needs no
// rule: padding stays padding. An op that reduces or contracts over a bounded
// dim first fills the padding with what does not change its result (0 for a
// sum or a matmul, the lowest value for a max, -inf for a softmax), and a
// mean divides by the real count (LoweringContext::count). Ops not listed
// here read exact shapes.
#include <algorithm>
#include <map>
#include <mutex>

#include "lowering/registry.h"

namespace torch_tpu::lowering {

Value real_elements(Builder& b, const BoundedDims& dims, const Shape& shape) {
  Value all = b.constant(1, {DType::Bool, shape});
  for (size_t d = 0; d < dims.size(); ++d) {
    int64_t inner = 1;  // elements of the parts after this one
    for (auto part = dims[d].rbegin(); part != dims[d].rend(); ++part) {
      if (!part->real.name.empty()) {
        TensorType index_type{DType::Int32, shape};
        Value index = b.iota(index_type, static_cast<int64_t>(d));
        if (inner > 1) index = b.binary(stablehlo::Binary::Divide, index, b.constant_int(inner, index_type));
        if (part->padded != shape[d] / inner)
          index = b.binary(stablehlo::Binary::Remainder, index, b.constant_int(part->padded, index_type));
        Value real = b.broadcast_to(b.cast(part->real, DType::Int32), shape);
        all = b.binary(stablehlo::Binary::And, all, b.compare(stablehlo::Compare::LT, index, real));
      }
      inner *= part->padded;
    }
  }
  return all;
}

Value LoweringContext::masked(size_t i, const Value& fill) const {
  const Value& x = tensor(i);
  if (!bounds || i >= bounds->size() || (*bounds)[i].empty()) return x;
  Value f = b.broadcast_to(b.cast(b.reshape(fill, {}), x.dtype()), x.shape());
  return b.select(real_elements(b, (*bounds)[i], x.shape()), x, f);
}

Value LoweringContext::count(size_t i, const std::vector<int64_t>& dims, DType dtype) const {
  const Value& x = tensor(i);
  int64_t fixed = 1;
  std::vector<Value> reals;
  const bool padded = bounds && i < bounds->size() && !(*bounds)[i].empty();
  for (int64_t d : dims) {
    if (!padded) {
      fixed *= x.shape().at(d);
      continue;
    }
    for (const BoundedPart& part : (*bounds)[i].at(d)) {
      if (part.real.name.empty())
        fixed *= part.padded;
      else
        reals.push_back(part.real);
    }
  }
  Value n = b.scalar(static_cast<double>(fixed), dtype);
  for (const Value& r : reals) n = b.binary(stablehlo::Binary::Multiply, n, b.cast(b.reshape(r, {}), dtype));
  return n;
}

namespace {

std::map<std::string, LoweringRule, std::less<>>& bounded_rules() {
  static std::map<std::string, LoweringRule, std::less<>> rules;
  return rules;
}

struct BoundedRegistrar {
  BoundedRegistrar(std::string op, LoweringRule rule) { bounded_rules().emplace(std::move(op), std::move(rule)); }
};
#define BOUNDED(op, rule) static const BoundedRegistrar TORCH_TPU_CONCAT(bounded_rule_, __LINE__)(op, rule)

// What padding is filled with, for a tensor of `dtype`.
using Fill = std::function<Value(Builder&, DType)>;
const Fill kZero = [](Builder& b, DType t) { return b.scalar(0, t); };
const Fill kLowest = [](Builder& b, DType t) { return lowest(b, t); };
const Fill kHighest = [](Builder& b, DType t) { return highest(b, t); };
// The op's own rule run on `with` (c's arguments with some padding filled);
// its checks join c's.
std::vector<Value> own_rule(LoweringContext& c, std::string_view op, const std::vector<LoweringArg>& with) {
  LoweringContext inner{c.b, with, c.outputs, {}};
  inner.bounds = c.bounds;
  std::vector<Value> out = (*find_rule(op))(inner);
  c.checks.insert(c.checks.end(), inner.checks.begin(), inner.checks.end());
  return out;
}

// The op's own rule, run with the padding of tensor arguments `args` filled.
LoweringRule filled(std::string_view op, std::vector<size_t> args, Fill fill) {
  return [op = std::string(op), args = std::move(args), fill](LoweringContext& c) {
    std::vector<LoweringArg> with = c.args;
    for (size_t i : args)
      if (c.has(i) && with[i].kind == LoweringArg::Tensor) with[i].tensor = c.masked(i, fill(c.b, c.tensor(i).dtype()));
    return own_rule(c, op, with);
  };
}

// Whether any part of tensor argument `i`'s dims from `first` on is bounded.
bool bounded_from(const LoweringContext& c, size_t i, int64_t first) {
  if (!c.bounds || i >= c.bounds->size()) return false;
  const BoundedDims& dims = (*c.bounds)[i];
  for (size_t d = static_cast<size_t>(std::max<int64_t>(first, 0)); d < dims.size(); ++d)
    for (const BoundedPart& p : dims[d])
      if (!p.real.name.empty()) return true;
  return false;
}

// A rule that indexes into dim `dim` of tensor argument `arg` (embedding's
// weight rows, nll_loss's classes) checks indices against its size and
// would read padding: that dim must be static.
LoweringRule indexing_into(LoweringRule rule, size_t arg, int64_t dim) {
  return [rule = std::move(rule), arg, dim](LoweringContext& c) {
    if (c.bounds && arg < c.bounds->size() && !(*c.bounds)[arg].empty()) {
      const BoundedDims& dims = (*c.bounds)[arg];
      const int64_t d = dim < 0 ? dim + static_cast<int64_t>(dims.size()) : dim;
      if (d >= 0 && d < static_cast<int64_t>(dims.size()))
        for (const BoundedPart& p : dims[d])
          if (!p.real.name.empty()) throw NotBounded("indexes into a bounded dim");
    }
    return rule(c);
  };
}

// nll_loss's class dim: dim 1, or dim 0 of one unbatched sample.
LoweringRule classes_static(LoweringRule rule, size_t self) {
  return [rule = std::move(rule), self](LoweringContext& c) {
    return indexing_into(rule, self, c.tensor(self).rank() == 1 ? 0 : 1)(c);
  };
}

// Layer norm normalizes over the last len(normalized_shape) dims: those must
// be static (rows are independent, so a bounded row dim is fine).
LoweringRule layer_norm_rows(std::string_view op, size_t input, size_t normalized, std::vector<size_t> fill_args) {
  LoweringRule rule = filled(op, std::move(fill_args), kZero);
  return [rule, input, normalized](LoweringContext& c) {
    const int64_t rank = c.tensor(input).rank();
    if (bounded_from(c, input, rank - static_cast<int64_t>(c.ints(normalized).size())))
      throw NotBounded("layer norm over a bounded dim");
    return rule(c);
  };
}

// nll_loss: a padded target row is ignore_index (argument `ignore`), so it
// adds nothing to the loss nor to the total weight; padded log-probabilities are 0.
LoweringRule nll_ignoring_padding(std::string_view op, size_t self, size_t target, size_t ignore) {
  return [op = std::string(op), self, target, ignore](LoweringContext& c) {
    std::vector<LoweringArg> with = c.args;
    with[self].tensor = c.masked(self, c.b.scalar(0, c.tensor(self).dtype()));
    with[target].tensor = c.masked(target, c.b.scalar(static_cast<double>(c.integer(ignore)), DType::Int64));
    return own_rule(c, op, with);
  };
}

// embedding_dense_backward: padded indices add a zero gradient to row 0;
// scale_grad_by_freq would count them.
LoweringRule embedding_backward_rows(std::string_view op) {
  LoweringRule rule = filled(op, {0, 1}, kZero);
  return [rule](LoweringContext& c) {
    if (c.has(4) && c.args[4].kind == LoweringArg::Bool && c.args[4].b && bounded_from(c, 1, 0))
      throw NotBounded("scale_grad_by_freq counts the padding");
    return rule(c);
  };
}

// The op finds elements by position along `dims` of tensor argument `arg`
// (triu's diagonal, the index max returns): a real element's padded position
// is its real one when a dim's bounded part is its outermost.
LoweringRule by_position(LoweringRule rule, size_t arg, std::function<std::vector<int64_t>(LoweringContext&)> dims) {
  return [rule = std::move(rule), arg, dims = std::move(dims)](LoweringContext& c) {
    if (c.bounds && arg < c.bounds->size() && !(*c.bounds)[arg].empty()) {
      const BoundedDims& parts = (*c.bounds)[arg];
      for (int64_t d : dims(c)) {
        if (d < 0) d += static_cast<int64_t>(parts.size());
        if (d < 0 || d >= static_cast<int64_t>(parts.size())) throw NotBounded("dim out of range");
        const auto& dim = parts[static_cast<size_t>(d)];
        for (size_t j = 1; j < dim.size(); ++j)
          if (!dim[j].real.name.empty()) throw NotBounded("a bounded part inside a merged dim");
      }
    }
    return rule(c);
  };
}
// Dim argument `i` (a reduction over all dims when absent: positions in the flattening differ).
std::function<std::vector<int64_t>(LoweringContext&)> dim_arg(size_t i) {
  return [i](LoweringContext& c) -> std::vector<int64_t> {
    if (!c.has(i)) throw NotBounded("a position over all dims");
    return {c.integer(i)};
  };
}
std::vector<int64_t> last_two(LoweringContext&) { return {-2, -1}; }

// index_copy(self, dim, index, source) with a padded index and source (a
// static KV cache written at a padded cache_position): padded entries point
// past self's dim, where XLA's scatter skips them.
std::vector<Value> index_copy_skipping_padding(LoweringContext& c) {
  const BoundedDims &self_dims = (*c.bounds)[0], &index_dims = (*c.bounds)[2], &source_dims = (*c.bounds)[3];
  if (!self_dims.empty()) throw NotBounded("index_copy into a padded tensor");
  const Value &self = c.tensor(0), &index = c.tensor(2), &source = c.tensor(3);
  if (self.rank() == 0 || index.rank() != 1 || source.rank() != self.rank()) throw NotBounded("one element");
  const int64_t dim = normalize_dim(c.integer(1), self.rank()), size = self.shape()[dim];
  // The index and the source's dim padded alike, nothing else padded.
  auto bounded_parts = [](const BoundedDims& dims, size_t d) {
    return d < dims.size() &&
           std::any_of(dims[d].begin(), dims[d].end(), [](const BoundedPart& p) { return !p.real.name.empty(); });
  };
  bool other_bounded = false;
  for (size_t d = 0; d < source_dims.size(); ++d)
    other_bounded |= d != static_cast<size_t>(dim) && bounded_parts(source_dims, d);
  if (!bounded_parts(index_dims, 0) || !bounded_parts(source_dims, static_cast<size_t>(dim)) || other_bounded ||
      index.shape()[0] != source.shape()[dim])
    throw NotBounded("index and source padded differently");
  std::vector<LoweringArg> with = c.args;
  with[2].tensor = c.masked(2, c.b.scalar(static_cast<double>(size), index.dtype()));
  return own_rule(c, "aten::index_copy", with);  // which checks the index with its padding as 0
}
const Fill kOne = [](Builder& b, DType t) { return b.scalar(1, t); };

}  // namespace

const LoweringRule* find_bounded_rule(std::string_view op) {
  auto& rules = bounded_rules();
  auto it = rules.find(op);
  return it == rules.end() ? nullptr : &it->second;
}

BOUNDED("aten::sum.dim_IntList", filled("aten::sum.dim_IntList", {0}, kZero));
BOUNDED("aten::sum", filled("aten::sum", {0}, kZero));
BOUNDED("aten::mean.dim", filled("aten::mean.dim", {0}, kZero));
BOUNDED("aten::mean", filled("aten::mean", {0}, kZero));
BOUNDED("aten::amax", filled("aten::amax", {0}, kLowest));
BOUNDED("aten::amin", filled("aten::amin", {0}, kHighest));
BOUNDED("aten::prod", filled("aten::prod", {0}, kOne));
BOUNDED("aten::prod.dim_int", filled("aten::prod.dim_int", {0}, kOne));
BOUNDED("aten::any", filled("aten::any", {0}, kZero));
BOUNDED("aten::any.dim", filled("aten::any.dim", {0}, kZero));
BOUNDED("aten::all", filled("aten::all", {0}, kOne));
BOUNDED("aten::all.dim", filled("aten::all.dim", {0}, kOne));
BOUNDED("aten::max", filled("aten::max", {0}, kLowest));
BOUNDED("aten::min", filled("aten::min", {0}, kHighest));
BOUNDED("aten::logsumexp", filled("aten::logsumexp", {0}, kLowest));
// Ties go to the first: a real element, before the padding of its row.
BOUNDED("aten::max.dim", by_position(filled("aten::max.dim", {0}, kLowest), 0, dim_arg(1)));
BOUNDED("aten::min.dim", by_position(filled("aten::min.dim", {0}, kHighest), 0, dim_arg(1)));
BOUNDED("aten::argmax", by_position(filled("aten::argmax", {0}, kLowest), 0, dim_arg(1)));
BOUNDED("aten::argmin", by_position(filled("aten::argmin", {0}, kHighest), 0, dim_arg(1)));
// A prefix of real elements holds no padding once the padding inside merged dims adds nothing.
BOUNDED("aten::cumsum", filled("aten::cumsum", {0}, kZero));
BOUNDED("aten::cumprod", filled("aten::cumprod", {0}, kOne));
// Elementwise in `elements`; `test_elements` is searched whole, so it must be plain.
BOUNDED("aten::isin.Tensor_Tensor", [](LoweringContext& c) {
  if (bounded_from(c, 1, 0)) throw NotBounded("searches padded test_elements");
  return (*find_rule("aten::isin.Tensor_Tensor"))(c);
});
BOUNDED("aten::triu", by_position(filled("aten::triu", {}, kZero), 0, last_two));
BOUNDED("aten::tril", by_position(filled("aten::tril", {}, kZero), 0, last_two));
BOUNDED("aten::_softmax", filled("aten::_softmax", {0}, kLowest));
BOUNDED("aten::_log_softmax", filled("aten::_log_softmax", {0}, kLowest));
BOUNDED("aten::_safe_softmax", filled("aten::_safe_softmax", {0}, kLowest));
BOUNDED("aten::_softmax_backward_data", filled("aten::_softmax_backward_data", {0, 1}, kZero));
BOUNDED("aten::_log_softmax_backward_data", filled("aten::_log_softmax_backward_data", {0}, kZero));
BOUNDED("aten::mm", filled("aten::mm", {0, 1}, kZero));
BOUNDED("aten::bmm", filled("aten::bmm", {0, 1}, kZero));
BOUNDED("aten::addmm", filled("aten::addmm", {1, 2}, kZero));
BOUNDED("aten::embedding", indexing_into(filled("aten::embedding", {1}, kZero), 0, 0));
BOUNDED("aten::index_copy", index_copy_skipping_padding);
// Along a static dim; along a bounded one the output's size (a sum of sizes) is no bucket: exact.
BOUNDED("aten::cat", filled("aten::cat", {}, kZero));
BOUNDED("aten::embedding_dense_backward", embedding_backward_rows("aten::embedding_dense_backward"));
BOUNDED("aten::native_layer_norm", layer_norm_rows("aten::native_layer_norm", 0, 1, {}));
BOUNDED("aten::native_layer_norm_backward", layer_norm_rows("aten::native_layer_norm_backward", 1, 2, {0, 1, 3, 4}));
BOUNDED("aten::nll_loss_forward", classes_static(nll_ignoring_padding("aten::nll_loss_forward", 0, 1, 4), 0));
BOUNDED("aten::nll_loss_backward", classes_static(nll_ignoring_padding("aten::nll_loss_backward", 1, 2, 5), 1));

}  // namespace torch_tpu::lowering
