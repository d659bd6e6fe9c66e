// How a tpu tensor's elements are reached: its storage's DeviceStorage seen
// through (sizes, strides, offset), as DESIGN.md's storage model says.
#pragma once

#include <ATen/ATen.h>

#include "runtime/runtime.h"

namespace torch_tpu::aten {

using runtime::DeviceStorage;
using stablehlo::DType;

DType to_dtype(at::ScalarType t);  // throws a clear error for unsupported dtypes
at::ScalarType to_scalar_type(DType t);
// Whether `data` is a storage torch_tpu's allocator made (a DeviceStorage).
bool is_device_storage(const c10::DataPtr& data);
DeviceStorage& storage_of(const at::Tensor& t);
int device_index(const at::Tensor& t);

// The tensor's elements as a flat dense buffer of its dtype (row-major).
// A contiguous tensor covering its whole storage is the storage value itself;
// any other view is read by a cached view-read program.
pjrt::BufferPtr read_dense(const at::Tensor& t);
// Writes a flat dense buffer of t's dtype into t's elements; every alias of
// the storage sees the write.
void write_dense(const at::Tensor& t, pjrt::BufferPtr value);

// A new tpu tensor of `sizes` and `dtype` on `device`, holding `value`: its
// elements in the memory order of `strides` (row-major when empty).
at::Tensor wrap_buffer(pjrt::BufferPtr value, at::IntArrayRef sizes, at::ScalarType dtype, int device,
                       at::IntArrayRef strides = {});

// Host <-> device copies of a tensor's elements.
pjrt::BufferPtr upload(const at::Tensor& cpu, int device);  // cpu must be contiguous
at::Tensor download(const at::Tensor& t);                   // a contiguous CPU tensor

// Raises a failed device check (runtime::DeviceCheckFailed's message) with the
// class CPU raises for it: IndexError, or RuntimeError; `note` is appended.
[[noreturn]] void raise_check(const std::string& check, const std::string& note = "");

// "2,3,4": sizes as program keys and messages spell them.
std::string dims_key(at::IntArrayRef v);
// Appends dims_key(v) to `key` without temporaries (the per-op path).
void append_dims(std::string& key, at::IntArrayRef v);

// The shape/strides part of a program key: "2,3:3,1@0".
std::string layout_key(const at::Tensor& t);

}  // namespace torch_tpu::aten
