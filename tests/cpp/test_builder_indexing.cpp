// The indexing ops of the builder: gather, scatter, pad, reverse. Shapes are
// checked at build time; every op is executed through the plugin against
// numbers computed by hand.
#include "plugin_fixture.h"

namespace torch_tpu {
namespace {

using stablehlo::Builder;
using stablehlo::DType;
using stablehlo::GatherDims;
using stablehlo::ScatterCombine;
using stablehlo::ScatterDims;
using stablehlo::TensorType;
using stablehlo::Value;
using test::run;

// x = [[0, 1, 2], [3, 4, 5], [6, 7, 8]] as float32 (a 3x3 parameter).
const TensorType f32x3x3{DType::Float32, {3, 3}};
const std::vector<float> x33{0, 1, 2, 3, 4, 5, 6, 7, 8};

TEST(BuilderIndexing, GatherRowsLikeIndexSelect) {
  Builder b;
  Value x = b.parameter(f32x3x3);
  Value idx = b.constant_int(2, {DType::Int64, {2}});  // rows [2, 2]
  GatherDims g;
  g.offset_dims = {1};
  g.collapsed_slice_dims = {0};
  g.start_index_map = {0};
  g.index_vector_dim = 1;
  Value r = b.gather(x, idx, g, {1, 3});
  EXPECT_EQ(r.shape(), (stablehlo::Shape{2, 3}));
  auto got = run<float>(b, r, {f32x3x3}, std::vector<std::vector<float>>{x33});
  EXPECT_EQ(got, (std::vector<float>{6, 7, 8, 6, 7, 8}));
}

TEST(BuilderIndexing, GatherPointsWithIndexVectors) {
  Builder b;
  Value x = b.parameter(f32x3x3);
  Value rows = b.iota({DType::Int32, {3, 1}}, 0);                                                       // 0, 1, 2
  Value cols = b.binary(stablehlo::Binary::Subtract, b.constant_int(2, {DType::Int32, {3, 1}}), rows);  // 2, 1, 0
  GatherDims g;  // (row, col) pairs along index dimension 1
  g.collapsed_slice_dims = {0, 1};
  g.start_index_map = {0, 1};
  g.index_vector_dim = 1;
  Value r = b.gather(x, b.concatenate({rows, cols}, 1), g, {1, 1});
  EXPECT_EQ(r.shape(), (stablehlo::Shape{3}));
  auto got = run<float>(b, r, {f32x3x3}, std::vector<std::vector<float>>{x33});
  EXPECT_EQ(got, (std::vector<float>{2, 4, 6}));  // the anti-diagonal
}

TEST(BuilderIndexing, GatherWithBatchingDims) {
  // Per row i, pick column idx[i]: operand dim 0 and index dim 0 are batching dimensions.
  Builder b;
  Value x = b.parameter(f32x3x3);
  Value idx = b.reshape(b.iota({DType::Int32, {3}}, 0), {3, 1});  // row i -> column i
  GatherDims g;
  g.collapsed_slice_dims = {1};
  g.operand_batching_dims = {0};
  g.start_indices_batching_dims = {0};
  g.start_index_map = {1};
  g.index_vector_dim = 1;
  auto got = run<float>(b, b.gather(x, idx, g, {1, 1}), {f32x3x3}, std::vector<std::vector<float>>{x33});
  EXPECT_EQ(got, (std::vector<float>{0, 4, 8}));  // the diagonal
}

TEST(BuilderIndexing, ScatterCombinesEachWay) {
  struct Case {
    ScatterCombine combine;
    std::vector<float> want;
  } cases[] = {
      // Updates 10 and 20 both go to element 1 of [0, 1, 2, 3]; 30 to element 3.
      {ScatterCombine::Add, {0, 31, 2, 33}},
      {ScatterCombine::Multiply, {0, 200, 2, 90}},
      {ScatterCombine::Maximum, {0, 20, 2, 30}},
      {ScatterCombine::Minimum, {0, 1, 2, 3}},
  };
  for (const auto& k : cases) {
    Builder b;
    TensorType f32x4{DType::Float32, {4}};
    Value x = b.parameter(f32x4);
    Value idx = b.reshape(b.constant_int(1, {DType::Int64, {3}}), {3, 1});
    idx = b.dynamic_update_slice(idx, b.constant_int(3, {DType::Int64, {1, 1}}),
                                 {b.constant_int(2, {DType::Int64, {}}), b.constant_int(0, {DType::Int64, {}})});
    Value upd = b.binary(
        stablehlo::Binary::Multiply,
        b.binary(stablehlo::Binary::Add, b.iota({DType::Float32, {3}}, 0), b.constant(1, {DType::Float32, {3}})),
        b.constant(10, {DType::Float32, {3}}));  // 10, 20, 30
    ScatterDims s;
    s.inserted_window_dims = {0};
    s.scatter_dims_to_operand_dims = {0};
    s.index_vector_dim = 1;
    Value r = b.scatter(x, idx, upd, s, k.combine);
    auto got = run<float>(b, r, {f32x4}, std::vector<std::vector<float>>{{0, 1, 2, 3}});
    EXPECT_EQ(got, k.want) << "combine " << static_cast<int>(k.combine);
  }
}

TEST(BuilderIndexing, ScatterReplacesRowWindows) {
  Builder b;
  Value x = b.parameter(f32x3x3);
  Value idx = b.constant_int(1, {DType::Int64, {1, 1}});  // row 1
  Value upd = b.constant(-1, {DType::Float32, {1, 3}});
  ScatterDims s;
  s.update_window_dims = {1};
  s.inserted_window_dims = {0};
  s.scatter_dims_to_operand_dims = {0};
  s.index_vector_dim = 1;
  auto got = run<float>(b, b.scatter(x, idx, upd, s, ScatterCombine::Replace), {f32x3x3},
                        std::vector<std::vector<float>>{x33});
  EXPECT_EQ(got, (std::vector<float>{0, 1, 2, -1, -1, -1, 6, 7, 8}));
}

TEST(BuilderIndexing, ScatterOnBooleansUsesLogicalOps) {
  Builder b;
  TensorType flags{DType::Bool, {3}};
  Value idx = b.constant_int(2, {DType::Int32, {1, 1}});
  ScatterDims s;
  s.inserted_window_dims = {0};
  s.scatter_dims_to_operand_dims = {0};
  s.index_vector_dim = 1;
  Value r = b.scatter(b.constant(0, flags), idx, b.constant(1, {DType::Bool, {1}}), s, ScatterCombine::Add);
  std::string text = b.module({r});
  EXPECT_NE(text.find("stablehlo.or"), std::string::npos) << text;
  auto got = run<int32_t>(b, b.convert(r, DType::Int32), {}, std::vector<std::vector<float>>{});
  EXPECT_EQ(got, (std::vector<int32_t>{0, 0, 1}));
}

TEST(BuilderIndexing, PadGrowsCropsAndInterleaves) {
  TensorType f32x4{DType::Float32, {4}};
  {
    Builder b;
    Value x = b.parameter(f32x4);
    Value r = b.pad(x, b.scalar(9, DType::Float32), {2}, {-1}, {0});  // two 9s before, last element cropped
    EXPECT_EQ(r.shape(), (stablehlo::Shape{5}));
    auto got = run<float>(b, r, {f32x4}, std::vector<std::vector<float>>{{1, 2, 3, 4}});
    EXPECT_EQ(got, (std::vector<float>{9, 9, 1, 2, 3}));
  }
  {
    Builder b;
    Value x = b.parameter(f32x4);
    Value r = b.pad(x, b.scalar(0, DType::Float32), {-1}, {1}, {1});  // 1 0 2 0 3 0 4 -> crop 1, add a 0
    EXPECT_EQ(r.shape(), (stablehlo::Shape{7}));
    auto got = run<float>(b, r, {f32x4}, std::vector<std::vector<float>>{{1, 2, 3, 4}});
    EXPECT_EQ(got, (std::vector<float>{0, 2, 0, 3, 0, 4, 0}));
  }
}

TEST(BuilderIndexing, ReverseAlongChosenDims) {
  Builder b;
  Value x = b.parameter(f32x3x3);
  auto got = run<float>(b, b.reverse(x, {1}), {f32x3x3}, std::vector<std::vector<float>>{x33});
  EXPECT_EQ(got, (std::vector<float>{2, 1, 0, 5, 4, 3, 8, 7, 6}));
  Builder b2;
  Value y = b2.parameter(f32x3x3);
  auto both = run<float>(b2, b2.reverse(y, {0, 1}), {f32x3x3}, std::vector<std::vector<float>>{x33});
  EXPECT_EQ(both, (std::vector<float>{8, 7, 6, 5, 4, 3, 2, 1, 0}));
}

TEST(BuilderIndexing, MalformedUsesAreRefused) {
  Builder b;
  Value x = b.parameter(f32x3x3);
  Value fidx = b.constant(0, {DType::Float32, {2, 1}});
  Value idx = b.constant_int(0, {DType::Int64, {2, 1}});
  GatherDims g;
  g.offset_dims = {1};
  g.collapsed_slice_dims = {0};
  g.start_index_map = {0};
  g.index_vector_dim = 1;
  EXPECT_THROW(b.gather(x, fidx, g, {1, 3}), std::invalid_argument);  // float indices
  EXPECT_THROW(b.gather(x, idx, g, {1, 4}), std::invalid_argument);   // slice larger than the operand
  EXPECT_THROW(b.gather(x, idx, g, {2, 3}), std::invalid_argument);   // collapsed dim with size 2
  GatherDims two = g;
  two.start_index_map = {0, 1};  // index vectors hold one element
  EXPECT_THROW(b.gather(x, idx, two, {1, 3}), std::invalid_argument);
  ScatterDims s;
  s.update_window_dims = {1};
  s.inserted_window_dims = {0};
  s.scatter_dims_to_operand_dims = {0};
  s.index_vector_dim = 1;
  EXPECT_THROW(b.scatter(x, idx, b.constant(0, {DType::Float32, {3, 3}}), s, ScatterCombine::Add),
               std::invalid_argument);  // 3 updates for 2 indices
  EXPECT_THROW(b.scatter(x, idx, b.constant(0, {DType::Int32, {2, 3}}), s, ScatterCombine::Add),
               std::invalid_argument);  // dtype mismatch
  EXPECT_THROW(b.scatter(x, idx, b.constant(0, {DType::Float32, {2, 4}}), s, ScatterCombine::Add),
               std::invalid_argument);  // window wider than the operand
  EXPECT_THROW(b.pad(x, b.scalar(0, DType::Int32), {0, 0}, {0, 0}, {0, 0}), std::invalid_argument);
  EXPECT_THROW(b.pad(x, b.scalar(0, DType::Float32), {0}, {0}, {0}), std::invalid_argument);
  EXPECT_THROW(b.pad(x, b.scalar(0, DType::Float32), {-2, 0}, {-2, 0}, {0, 0}), std::invalid_argument);
  EXPECT_THROW(b.pad(x, b.scalar(0, DType::Float32), {0, 0}, {0, 0}, {-1, 0}), std::invalid_argument);
  EXPECT_THROW(b.reverse(x, {2}), std::invalid_argument);
  EXPECT_THROW(b.reverse(x, {0, 0}), std::invalid_argument);
  try {
    b.gather(x, fidx, g, {1, 3});
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("stablehlo.gather"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("tensor<2x1xf32>"), std::string::npos);
  }
}

}  // namespace
}  // namespace torch_tpu
