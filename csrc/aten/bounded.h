// Bounded dynamic shapes, the tensor side (README "Bounded dynamic shapes"): padded storages, how a
// tensor over one is read padded, torch_tpu.mark_dynamic, host reads.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/stack.h>

#include <optional>
#include <string>

#include "aten/tensor_access.h"
#include "lowering/registry.h"

namespace torch_tpu::aten {

// One padded part of a tensor dim: its real size and, when bounded, its
// bucket (the padded size); bucket 0: static.
struct Part {
  int64_t real = 1, bucket = 0;
  int64_t padded() const { return bucket ? bucket : real; }
};
using PaddedDims = std::vector<std::vector<Part>>;  // per tensor dim, outermost part first

// A tpu tensor read padded: its storage's padded value, with each tensor dim
// the row-major merge of one or more of the storage's padded dims.
struct PaddedRead {
  pjrt::BufferPtr value;             // flat: the storage's padded value
  std::vector<int64_t> stored;       // the value's shape, the tensor's dims (size-1 dims left out) in memory order
  std::vector<int64_t> memory_dims;  // the tensor dim of each stored dim
  PaddedDims dims;                   // per tensor dim
  bool whole = true;                 // the tensor is its whole storage (not a box of it: then `value` is a copy)
  // A box's strides over the padded storage: how PyTorch would lay out the
  // outputs (empty: row-major in memory_dims' order).
  std::vector<int64_t> box_strides;
  // The device sizes its parts' negative real sizes stand for (a deferred
  // tensor's, see deferred()).
  std::vector<std::shared_ptr<runtime::DeviceSize>> unknown;
  std::vector<int64_t> shape() const;  // per tensor dim, its padded size
};

// Whether any storage of this process was ever padded (until then no op
// looks for padded inputs).
bool padded_storages_exist();
// Whether padded storages are alive now (the automatic bounds of factories
// under TORCH_TPU_DYNAMIC=marked follow them), and what keeps that count:
// called wherever a storage's padding changes, and as it dies (reset first).
bool padded_storages_live();
void note_padding(DeviceStorage& s);
// Whether t's storage is padded (t a tpu tensor).
bool is_padded(const at::Tensor& t);
// How `t` reads padded: its storage is padded, its dtype is the storage's,
// and it covers the storage densely (the whole of it, in some order of its
// dims). nullopt otherwise: t is then read through read_dense's exact path.
std::optional<PaddedRead> padded_read(const at::Tensor& t);
// A view of a padded storage that takes no bounded dim whole (x[:, -1]:
// each bounded dim indexed): its elements, read at a runtime offset (a
// program per bucket). nullopt for any other tensor.
std::optional<pjrt::BufferPtr> plain_box_value(const at::Tensor& t);
// The padded value as a value of the tensor's padded shape (transposed into its dim order).
stablehlo::Value padded_value(stablehlo::Builder& b, const stablehlo::Value& flat, const PaddedRead& read);

// The storage's real elements as a plain flat value (a program per real size).
pjrt::BufferPtr unpadded_value(const DeviceStorage& s);
// The storage becomes plain: its value the real elements only.
void make_plain(DeviceStorage& s);
// The real elements of a padded storage on the host, flat (the padded value
// is copied and cut there: no program per size).
at::Tensor download_padded(const DeviceStorage& s);
// A new tpu tensor of `dtype` holding a padded value laid out row-major in
// `dims`' parts. A part of negative real size -id stands for the one of
// `unknown` of that id: the tensor is then deferred (below).
at::Tensor wrap_padded(pjrt::BufferPtr value, const PaddedDims& dims, at::ScalarType dtype, int device,
                       const std::vector<std::shared_ptr<runtime::DeviceSize>>& unknown = {});

// Deferred sizes (README "Data-dependent ops in Fused windows"): in Fused
// mode a nonzero, masked_select or x[mask] keeps its count on the device and
// its result padded to the largest count; the window goes on. The tensor's
// sizes are learned (the window flushed, the count read: one sync) when
// anything reads them (.shape, printing, an op that needs them); until
// then ops that can take the count as a runtime size run on the padding.
bool defer_data_dependent_sizes();  // Fused mode, and TORCH_TPU_DYNAMIC is not off
// A new device size for an int32[1] count on the device.
std::shared_ptr<runtime::DeviceSize> device_size(pjrt::BufferPtr count);
// Whether t's sizes are still on the device (reading them learns them).
bool deferred(const at::Tensor& t);
// Reads the storage's unknown sizes (one sync for all) and makes it an
// ordinary padded storage.
void learn_sizes(DeviceStorage& s);
// x[mask] for a bool mask over x's leading dims, deferred (nullopt: not
// Fused mode, or not such a call; the general path then runs it).
std::optional<at::Tensor> deferred_mask_index(const at::Tensor& self,
                                              const c10::List<std::optional<at::Tensor>>& indices);
// x[mask] = values (index_put_ with a bool mask over x's leading dims) in
// Fused mode without reading the mask's count: values that broadcast to one
// selected row are a where(); values with a row per selected row are
// scattered in order (masked_scatter_), and a device check says whether the
// mask selected that many. False: not such a call (values deferred too: their
// sizes were read by PyTorch's indexing before this op anyway).
bool deferred_mask_put(const std::string& op, const std::vector<c10::IValue>& args, torch::jit::Stack* stack);
// `full` (a contiguous tpu tensor at its bucket sizes) as a tensor of `real`
// sizes padded in `bounded` dims: no copy, no program.
at::Tensor as_padded(const at::Tensor& full, at::IntArrayRef real, at::IntArrayRef bounded);
// copy_ from a padded tensor into a tpu tensor that covers its storage, of
// the same sizes: dst becomes padded like src (a program per bucket). False:
// not such a copy.
bool copy_padded(const at::Tensor& src, const at::Tensor& dst);

// TORCH_TPU_DYNAMIC=off keeps exact static shapes everywhere.
bool dynamic_shapes_enabled();
// Sets TORCH_TPU_DYNAMIC ("off", "marked", "auto") from now on; returns the
// setting it replaces.
std::string set_dynamic_setting(const std::string& setting);
// Under auto: forgets the sizes copies took, so no class of copies is bounded
// (a test starts as a fresh process would).
void forget_auto_bounds();
// The bucket a bounded dim of real size n is padded to: the smallest of
// TORCH_TPU_DYNAMIC_BUCKETS (default: powers of two) that holds n, at most `max`.
int64_t bucket_for(int64_t n, std::optional<int64_t> max);
// torch_tpu.mark_dynamic(t, dim, max): t's storage becomes padded in `dim`.
void mark_dynamic(const at::Tensor& t, int64_t dim, std::optional<int64_t> max);
// Copies a contiguous host tensor into `dst` (a tpu tensor that is its whole
// storage, of the same sizes) padded in the dims that copies of its dtype
// and shape have turned bounded: a dim that took kAutoAfter distinct sizes
// across such copies (the others equal) is bounded from then on, with a
// warning once. False (nothing copied) when no dim is bounded.
bool upload_bounded(const at::Tensor& host, const at::Tensor& dst);

// Factories of a bounded size (README "Bounded dynamic shapes"):
// arange.start_out, and a fill_ of a whole plain tensor (torch.ones and
// full are empty + fill_), in a dim whose size is the real size of a
// dim padded lately (arange(ids.shape[1]), a causal mask of ids' length) come
// out padded to its bucket: the program runs at the bucket, so no program
// per size, and the positions and masks built from them stay padded. Only
// while padded tensors live; true when it ran the call.
enum class Factory : uint8_t { None, Arange, Fill };
Factory factory_kind(const std::string& op);  // looked up once per op (its plan)
bool padded_factory(Factory kind, const std::vector<c10::IValue>& args, torch::jit::Stack* stack);
// Factories run plain while one lives: the bucket-sized call inside
// padded_factory, and new memory's deterministic fill (not a user's factory).
struct PlainFactoryScope {
  PlainFactoryScope();
  ~PlainFactoryScope();
  PlainFactoryScope(const PlainFactoryScope&) = delete;
  PlainFactoryScope& operator=(const PlainFactoryScope&) = delete;

 private:
  bool was_;
};

// The real sizes of a bounded call's symbols as an int32[k] device buffer
// (cached); a negative size -id is taken from the device size of that id
// among `unknown`, on the device.
pjrt::BufferPtr sizes_buffer(const std::vector<int64_t>& sizes,
                             const std::vector<std::shared_ptr<runtime::DeviceSize>>& unknown, int device);

}  // namespace torch_tpu::aten
