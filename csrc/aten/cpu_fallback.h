#pragma once

namespace torch_tpu::aten {
// Whether an op without a lowering raises (true) or runs on CPU (false).
void set_fallback_raises(bool raises);
bool fallback_raises_errors();
}  // namespace torch_tpu::aten
