#include "lowering/registry.h"
#include "plugin_fixture.h"

namespace torch_tpu {
namespace {

using lowering::LoweringArg;
using lowering::LoweringContext;
using stablehlo::Builder;
using stablehlo::DType;
using stablehlo::TensorType;
using stablehlo::Value;

TEST(LoweringRegistry, HasTheSkeletonOps) {
  for (const char* op : {"aten::add.Tensor", "aten::sub.Scalar", "aten::mul.Tensor", "aten::div.Tensor", "aten::neg",
                         "aten::exp", "aten::relu", "aten::mm", "aten::sum.dim_IntList", "aten::mean.dim"})
    EXPECT_NE(lowering::find_rule(op), nullptr) << op;
  EXPECT_EQ(lowering::find_rule("aten::no_such_op"), nullptr);
}

TEST(LoweringRules, AddWithAlphaPromotesToOutputType) {
  Builder b;
  TensorType xi{DType::Int32, {3}}, yf{DType::Float32, {3}};
  std::vector<LoweringArg> args(3);
  args[0].kind = LoweringArg::Tensor;
  args[0].tensor = b.parameter(xi);
  args[1].kind = LoweringArg::Tensor;
  args[1].tensor = b.parameter(yf);
  args[2].kind = LoweringArg::Double;
  args[2].d = 0.5;
  std::vector<TensorType> outs{{DType::Float32, {3}}};
  LoweringContext ctx{b, args, outs};
  auto result = (*lowering::find_rule("aten::add.Tensor"))(ctx);
  ASSERT_EQ(result.size(), 1u);
  EXPECT_EQ(result[0].type, outs[0]);
  auto exe = test::client().compile(b.module(result), pjrt::single_device_compile_options());
  std::vector<int32_t> x{1, 2, 3};
  std::vector<float> y{2, 4, 6}, out(3);
  auto bx = test::client().buffer_from_host(x.data(), PJRT_Buffer_Type_S32, {3}, test::client().devices()[0]);
  auto by = test::client().buffer_from_host(y.data(), PJRT_Buffer_Type_F32, {3}, test::client().devices()[0]);
  exe->execute({bx->raw(), by->raw()}, test::client().devices()[0])[0]->to_host(out.data(), 12);
  EXPECT_EQ(out, (std::vector<float>{2, 4, 6}));
}

// A transposed 2x3 view of a 6-element storage reads as [0,3,1,4,2,5]; writing
// through it lands at the strided positions.
TEST(StridedAccess, ReadAndWriteThroughTransposedView) {
  TensorType storage{DType::Float32, {6}};
  std::vector<float> s{0, 1, 2, 3, 4, 5};
  {
    Builder b;
    Value p = b.parameter(storage);
    Value r = lowering::strided_read(b, p, {3, 2}, {1, 3}, 0);
    auto got = test::run<float>(b, r, {storage}, std::vector<std::vector<float>>{s});
    EXPECT_EQ(got, (std::vector<float>{0, 3, 1, 4, 2, 5}));
  }
  {
    Builder b;
    Value p = b.parameter(storage);
    Value update = b.iota({DType::Float32, {2}}, 0);  // [0, 1] into column 1 of the 2x3 view
    Value w = lowering::strided_write(b, p, b.binary(stablehlo::Binary::Add, update, b.constant(10, update.type)), {2},
                                      {3}, 1);
    auto got = test::run<float>(b, w, {storage}, std::vector<std::vector<float>>{s});
    EXPECT_EQ(got, (std::vector<float>{0, 10, 2, 3, 11, 5}));
  }
  {
    Builder b;
    Value p = b.parameter(storage);
    Value w = lowering::strided_write(b, p, b.constant(7, {DType::Float32, {3}}), {3}, {1}, 3);  // row 1
    auto got = test::run<float>(b, w, {storage}, std::vector<std::vector<float>>{s});
    EXPECT_EQ(got, (std::vector<float>{0, 1, 2, 7, 7, 7}));
  }
}

}  // namespace
}  // namespace torch_tpu
