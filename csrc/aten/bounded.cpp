#include "aten/bounded.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>
#include <unordered_map>

namespace torch_tpu::aten {
namespace {

using runtime::Runtime;
using stablehlo::TensorType;

int64_t product(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{1}, std::multiplies<>());
}

// The storage's padded dims as parts.
std::vector<Part> storage_parts(const runtime::Padding& p) {
  std::vector<Part> parts;
  for (size_t d = 0; d < p.sizes.size(); ++d) parts.push_back({p.sizes[d], p.buckets[d]});
  return parts;
}

std::atomic<bool> any_padded{false};  // see padded_storages_exist
std::atomic<int64_t> live_padded{0};  // see padded_storages_live

pjrt::BufferPtr uploaded_sizes(const std::vector<int64_t>& sizes, int device);

const std::shared_ptr<runtime::DeviceSize>& find_size(const std::vector<std::shared_ptr<runtime::DeviceSize>>& unknown,
                                                      int64_t id) {
  auto it = std::find_if(unknown.begin(), unknown.end(), [&](const auto& u) { return u->id == id; });
  TORCH_INTERNAL_ASSERT(it != unknown.end(), "torch_tpu: a deferred size without its device count");
  return *it;
}

// A device size's value: the window flushed and the count read, once.
int64_t read_size(runtime::DeviceSize& size) {
  if (!size.value) {
    Runtime::get().resolve(*size.count, "size_read");
    int32_t count = 0;
    Runtime::get().download(*size.count, &count, sizeof count);
    size.value = count;
    Runtime::get().count("deferred_size_reads");
  }
  return *size.value;
}

// A tensor over a storage whose sizes are still on the device (deferred()):
// its sizes, strides and element count are learned on first read, which
// flushes the Fused window and reads the count; from then on it is an
// ordinary tensor over a padded storage. Its rank, dtype and device are
// known without a read, and it is contiguous.
class DeferredSizesImpl final : public c10::TensorImpl {
 public:
  DeferredSizesImpl(c10::Storage storage, caffe2::TypeMeta dtype, const std::vector<int64_t>& padded,
                    std::vector<std::vector<int64_t>> reals, std::vector<std::shared_ptr<runtime::DeviceSize>> unknown)
      : TensorImpl(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype),
        reals_(std::move(reals)),
        unknown_(std::move(unknown)) {
    set_sizes_contiguous(padded);
    set_custom_sizes_strides(SizesStridesPolicy::CustomSizes);
  }
  bool learned() const { return learned_; }
  int parts(int64_t d) const { return static_cast<int>(reals_[static_cast<size_t>(d)].size()); }
  void learn() const { const_cast<DeferredSizesImpl*>(this)->learn_now(); }

  c10::intrusive_ptr<TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& version,
                                                         bool allow_metadata_change) const override {
    learn();
    return TensorImpl::shallow_copy_and_detach(version, allow_metadata_change);
  }
  c10::intrusive_ptr<TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& version,
                                                         bool allow_metadata_change) const override {
    learn();
    return TensorImpl::shallow_copy_and_detach(std::move(version), allow_metadata_change);
  }
  void shallow_copy_from(const c10::intrusive_ptr<TensorImpl>& impl) override {
    learn();
    TensorImpl::shallow_copy_from(impl);
  }

 protected:
  at::IntArrayRef sizes_custom() const override { return learn(), sizes_default(); }
  at::IntArrayRef strides_custom() const override { return learn(), strides_default(); }
  int64_t numel_custom() const override { return learn(), numel_default(); }
  int64_t dim_custom() const override { return dim_default(); }
  int64_t storage_offset_custom() const override { return 0; }
  c10::SymIntArrayRef sym_sizes_custom() const override { return learn(), sym_sizes_default(); }
  c10::SymIntArrayRef sym_strides_custom() const override { return learn(), sym_strides_default(); }
  c10::SymInt sym_numel_custom() const override { return learn(), sym_numel_default(); }
  c10::SymInt sym_storage_offset_custom() const override { return 0; }
  c10::SymBool sym_is_contiguous_custom(at::MemoryFormat format) const override {
    if (format == at::MemoryFormat::Contiguous) return true;
    return learn(), is_contiguous_default(format);
  }
  bool is_strides_like_custom(at::MemoryFormat format) const override {
    return learn(), is_strides_like_default(format);
  }
  c10::SymBool sym_is_non_overlapping_and_dense_custom() const override { return true; }

 private:
  void learn_now() {
    if (learned_) return;
    DeviceStorage& s = *static_cast<DeviceStorage*>(storage_.data_ptr().get());
    learn_sizes(s);
    std::vector<int64_t> sizes;
    for (const auto& parts : reals_) {
      int64_t n = 1;
      for (int64_t real : parts) n *= real >= 0 ? real : read_size(*find_size(unknown_, -real));
      sizes.push_back(n);
    }
    learned_ = true;
    set_custom_sizes_strides(SizesStridesPolicy::Default);
    sizes_and_strides_.set_sizes(sizes);
    refresh_numel();
    empty_tensor_restride(at::MemoryFormat::Contiguous);
    storage_.unsafeGetStorageImpl()->set_nbytes(s.nbytes);
  }
  std::vector<std::vector<int64_t>> reals_;  // per dim, its parts' real sizes (-id: unknown_'s)
  std::vector<std::shared_ptr<runtime::DeviceSize>> unknown_;
  bool learned_ = false;
};

const DeferredSizesImpl* deferred_impl(const at::Tensor& t) {
  const auto* impl = dynamic_cast<const DeferredSizesImpl*>(t.unsafeGetTensorImpl());
  return impl && !impl->learned() ? impl : nullptr;
}

bool has_unknown(const DeviceStorage& s) { return s.padding && !s.padding->unknown.empty(); }

// Accounts the padding's bytes of `s` (now `bytes`); every storage that
// becomes padded passes here.
void set_padding_bytes(DeviceStorage& s, int64_t bytes) {
  note_padding(s);
  if (bytes != s.padding_bytes) Runtime::get().resize(s.device, bytes - s.padding_bytes);
  s.padding_bytes = bytes;
}

int64_t padding_bytes_of(const DeviceStorage& s) {
  if (!s.padding) return 0;
  return (product(s.padding->padded()) - product(s.padding->sizes)) *
         static_cast<int64_t>(stablehlo::byte_size(s.dtype));
}

// A storage that just took a padded value made on the device: its padding
// counted in the metrics and accounted in memory.
void account_padded_output(DeviceStorage& s) {
  const int64_t bytes = padding_bytes_of(s);
  Runtime::get().count("padded_elements", bytes / static_cast<int64_t>(stablehlo::byte_size(s.dtype)));
  Runtime::get().count("bounded_real_elements", product(s.padding->sizes));
  set_padding_bytes(s, bytes);
}

// Pads the real tensor `real` (host, contiguous) into a new value for `s`.
void store_padded(DeviceStorage& s, const at::Tensor& real, runtime::Padding padding) {
  at::Tensor host = at::zeros(padding.padded(), real.options());
  at::Tensor window = host;
  for (int64_t d = 0; d < real.dim(); ++d) window = window.narrow(d, 0, real.size(d));
  window.copy_(real);
  s.value = upload(host, s.device);
  s.dtype = to_dtype(real.scalar_type());
  s.padding = std::move(padding);
  set_padding_bytes(s, padding_bytes_of(s));
}

// A view of a padded storage that is a box of it (x[..., a:b], x.chunk(),
// an expand, a static dim split in several, x[:, -1]): each of its dims steps
// along one storage dim; a bounded one is taken whole by one dim, or indexed
// (the view takes one of its elements, at a runtime offset: no program per
// size). Read by a strided read of the padded value (a program per bucket);
// nullopt for any other view.
std::optional<PaddedRead> box_read(const at::Tensor& t, const DeviceStorage& s, bool plain_only = false) {
  const auto& real = s.padding->sizes;
  const auto padded = s.padding->padded();
  const size_t rank = real.size();
  std::vector<int64_t> real_strides(rank), padded_strides(rank);
  for (size_t i = rank; i-- > 0;) {
    real_strides[i] = i + 1 < rank ? real_strides[i + 1] * real[i + 1] : 1;
    padded_strides[i] = i + 1 < rank ? padded_strides[i + 1] * padded[i + 1] : 1;
  }
  std::vector<int64_t> start(rank);
  for (size_t i = 0; i < rank; ++i) start[i] = (t.storage_offset() / real_strides[i]) % real[i];
  PaddedRead read;
  std::vector<int64_t> sizes, strides;
  std::vector<int64_t> last(start);  // per storage dim, the last index the view reaches
  std::vector<bool> bounded_used(rank, false);
  int64_t extent = 1;  // elements of the padded value the view spans from its first
  for (int64_t j = 0; j < t.dim(); ++j) {
    const int64_t size = t.size(j), stride = t.stride(j);
    auto& parts = read.dims.emplace_back();
    if (size == 1 || stride == 0) {  // no step along the storage
      parts.push_back({size, 0});
      sizes.push_back(size);
      strides.push_back(0);
      continue;
    }
    size_t i = 0;
    while (i < rank && real_strides[i] > stride) ++i;
    if (i == rank || stride % real_strides[i]) return std::nullopt;
    const int64_t step = stride / real_strides[i];
    last[i] += (size - 1) * step;
    if (last[i] >= real[i]) return std::nullopt;
    const int64_t bucket = s.padding->buckets[i];
    if (bucket && (bounded_used[i] || step != 1 || start[i] != 0 || size != real[i]))
      return std::nullopt;  // a bounded dim is taken whole
    bounded_used[i] = bucket != 0;
    parts.push_back({size, bucket});
    sizes.push_back(parts.back().padded());
    strides.push_back(step * padded_strides[i]);
    extent += (sizes.back() - 1) * strides.back();
  }
  if (plain_only && std::find(bounded_used.begin(), bounded_used.end(), true) != bounded_used.end())
    return std::nullopt;  // the caller reads it exactly: no padded view read to throw away
  // The view's first element: a static offset, plus the index into each
  // bounded dim it does not step along (x[:, -1] of [b, n, h]: n - 1).
  int64_t offset = 0, runtime_offset = 0;
  std::string indexed;
  for (size_t i = 0; i < rank; ++i) {
    if (s.padding->buckets[i] && !bounded_used[i]) {
      runtime_offset += start[i] * padded_strides[i];
      indexed += std::to_string(i) + ",";
    } else {
      offset += start[i] * padded_strides[i];
    }
  }
  const DType dtype = s.dtype;
  const int64_t storage_numel = product(padded);
  std::string key = "padded_view|" + stablehlo::mlir_name(dtype) + "|" + std::to_string(storage_numel) + "|" +
                    dims_key(sizes) + ":" + dims_key(strides) + "@" + std::to_string(offset);
  std::vector<pjrt::BufferPtr> inputs{s.value};
  if (!indexed.empty()) {
    key += "+[" + indexed + "]/" + std::to_string(extent);
    inputs.push_back(uploaded_sizes({runtime_offset}, s.device));
  }
  auto program = Runtime::get().program(key, [&] {
    stablehlo::Builder b;
    auto storage = b.parameter(TensorType{dtype, {storage_numel}});
    stablehlo::Value out;
    if (indexed.empty()) {
      out = lowering::strided_read(b, storage, sizes, strides, offset);
    } else {  // the span from the runtime offset, then a static strided read of it
      auto at = b.reshape(b.parameter(TensorType{DType::Int32, {1}}), {});
      at = b.binary(stablehlo::Binary::Add, at, b.constant_int(offset, TensorType{DType::Int32, {}}));
      out = lowering::strided_read(b, b.dynamic_slice(storage, {at}, {extent}), sizes, strides, 0);
    }
    return std::make_pair(b.module({out}), std::vector<TensorType>{{dtype, {product(sizes)}}});
  });
  read.value = Runtime::get().execute(program, inputs, s.device, "bounded view read")[0];
  read.whole = false;
  read.box_strides = strides;
  read.stored = sizes;
  for (int64_t j = 0; j < t.dim(); ++j) read.memory_dims.push_back(j);
  return read;
}

}  // namespace

std::optional<pjrt::BufferPtr> plain_box_value(const at::Tensor& t) {
  const DeviceStorage& s = storage_of(t);
  if (!s.padding || !s.value || to_dtype(t.scalar_type()) != s.dtype || t.numel() == 0) return std::nullopt;
  auto read = box_read(t, s, /*plain_only=*/true);
  if (!read) return std::nullopt;
  return read->value;
}

std::vector<int64_t> PaddedRead::shape() const {
  std::vector<int64_t> s;
  for (const auto& parts : dims) {
    int64_t n = 1;
    for (const Part& p : parts) n *= p.padded();
    s.push_back(n);
  }
  return s;
}

bool padded_storages_live() { return live_padded.load(std::memory_order_relaxed) > 0; }

namespace {
// The real sizes of the bounded dims of the storages padded last: a factory
// of such a size (torch.arange(ids.shape[1])) is bounded at once.
constexpr size_t kRecentSizes = 16;
std::array<std::atomic<int64_t>, kRecentSizes> recent_sizes{};
std::atomic<size_t> next_recent{0};

void note_bounded_sizes(const runtime::Padding& p) {
  for (size_t d = 0; d < p.sizes.size(); ++d) {
    const int64_t n = p.sizes[d];
    if (p.buckets[d] == 0 || n <= 1) continue;
    bool known = false;
    for (const auto& r : recent_sizes) known |= r.load(std::memory_order_relaxed) == n;
    if (!known) recent_sizes[next_recent.fetch_add(1, std::memory_order_relaxed) % kRecentSizes].store(n);
  }
}

bool a_recent_bounded_size(int64_t n) {
  for (const auto& r : recent_sizes)
    if (r.load(std::memory_order_relaxed) == n) return true;
  return false;
}
}  // namespace

void note_padding(DeviceStorage& s) {
  if (s.padding) any_padded.store(true, std::memory_order_relaxed);
  if (s.padding.has_value() == s.counted_padded) return;
  s.counted_padded = s.padding.has_value();
  live_padded.fetch_add(s.counted_padded ? 1 : -1, std::memory_order_relaxed);
  if (s.padding) note_bounded_sizes(*s.padding);
}

bool is_padded(const at::Tensor& t) { return storage_of(t).padding.has_value(); }

bool padded_storages_exist() { return any_padded.load(std::memory_order_relaxed); }

std::optional<PaddedRead> padded_read(const at::Tensor& t) {
  DeviceStorage& s = storage_of(t);
  if (has_unknown(s) && deferred_impl(t)) {  // the whole storage, row-major, its sizes on the device
    const auto& impl = *deferred_impl(t);
    PaddedRead read;
    std::vector<Part> storage = storage_parts(*s.padding);
    size_t next = 0;
    for (int64_t d = 0; d < t.dim(); ++d) {
      auto& parts = read.dims.emplace_back();
      for (int k = 0; k < impl.parts(d); ++k) parts.push_back(storage[next++]);
      read.memory_dims.push_back(d);
    }
    read.stored = read.shape();
    read.value = s.value;
    read.unknown = s.padding->unknown;
    return read;
  }
  if (has_unknown(s)) learn_sizes(s);
  if (!s.padding || !s.value || to_dtype(t.scalar_type()) != s.dtype || t.numel() == 0) return std::nullopt;
  if (t.storage_offset() != 0 || t.numel() != product(s.padding->sizes)) return box_read(t, s);
  // The tensor's dims in memory order, densely laid out; size-1 dims only
  // when contiguous (elsewhere their strides say nothing of their place).
  const bool contiguous = t.is_contiguous();
  std::vector<int64_t> order;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1 || contiguous) order.push_back(d);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  int64_t expected = 1;
  for (auto d = order.rbegin(); d != order.rend(); ++d) {
    if (t.size(*d) == 1) continue;
    if (t.stride(*d) != expected) return box_read(t, s);
    expected *= t.size(*d);
  }
  // Each dim, in memory order, takes the storage's padded dims whose real
  // sizes multiply to its size (a size-1 dim: those of size 1 next); a static
  // one may split. Parts stay in the storage's order, so any such grouping
  // reads the padded value right.
  std::vector<Part> storage = storage_parts(*s.padding);
  PaddedRead read;
  read.dims.resize(t.dim());
  size_t next = 0;
  for (int64_t d : order) {
    const int64_t size = t.size(d);
    int64_t have = 1;
    auto& parts = read.dims[d];
    bool took_bounded = false;  // a size-1 dim takes one bounded part of size 1
    while (have < size || (next < storage.size() && storage[next].real == 1 &&
                           (storage[next].bucket == 0 || (size == 1 && !took_bounded)))) {
      if (next >= storage.size()) return std::nullopt;
      Part p = storage[next];
      took_bounded |= p.bucket != 0;
      if (have * p.real > size) {
        const int64_t want = size / have;
        if (p.bucket || size % have || p.real % want) return std::nullopt;
        parts.push_back({want, 0});
        storage[next].real /= want;
        have = size;
        break;
      }
      parts.push_back(p);
      have *= p.real;
      ++next;
    }
    read.stored.push_back(0);
    read.memory_dims.push_back(d);
  }
  // Bounded dims of real size 1 left over belong to the innermost dim.
  for (; next < storage.size(); ++next) {
    if (storage[next].real != 1 || order.empty()) return std::nullopt;
    read.dims[order.back()].push_back(storage[next]);
  }
  const auto shape = read.shape();
  for (size_t k = 0; k < order.size(); ++k) read.stored[k] = shape[order[k]];
  read.value = s.value;
  return read;
}

stablehlo::Value padded_value(stablehlo::Builder& b, const stablehlo::Value& flat, const PaddedRead& read) {
  auto x = b.reshape(flat, read.stored);
  // The stored dims in the tensor's order, then its size-1 dims put back.
  std::vector<int64_t> perm(read.memory_dims.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::sort(perm.begin(), perm.end(), [&](int64_t a, int64_t c) { return read.memory_dims[a] < read.memory_dims[c]; });
  bool identity = true;
  for (size_t k = 0; k < perm.size(); ++k) identity &= perm[k] == static_cast<int64_t>(k);
  if (!identity) x = b.transpose(x, perm);
  return b.reshape(x, read.shape());
}

pjrt::BufferPtr unpadded_value(const DeviceStorage& s) {
  if (has_unknown(s)) learn_sizes(const_cast<DeviceStorage&>(s));
  const auto padded = s.padding->padded();
  const auto& sizes = s.padding->sizes;
  if (padded == sizes) return s.value;  // every bucket full: the value is the real elements
  const DType dtype = s.dtype;
  std::string key = "unpad|" + stablehlo::mlir_name(dtype) + "|" + dims_key(padded) + "|" + dims_key(sizes);
  auto program = Runtime::get().program(key, [&] {
    stablehlo::Builder b;
    auto x = b.reshape(b.parameter(TensorType{dtype, {product(padded)}}), padded);
    std::vector<int64_t> start(padded.size(), 0), step(padded.size(), 1);
    auto real = b.reshape(b.slice(x, start, sizes, step), {product(sizes)});
    return std::make_pair(b.module({real}), std::vector<TensorType>{real.type});
  });
  Runtime::get().count("bounded_unpads");
  return Runtime::get().execute(program, {s.value}, s.device, "bounded read")[0];
}

void make_plain(DeviceStorage& s) {
  if (!s.padding) return;
  learn_sizes(s);
  if (s.value) s.value = unpadded_value(s);
  s.padding.reset();
  set_padding_bytes(s, 0);
}

at::Tensor download_padded(const DeviceStorage& s) {
  if (has_unknown(s)) learn_sizes(const_cast<DeviceStorage&>(s));
  const auto padded = s.padding->padded();
  at::Tensor host = at::empty(padded, at::TensorOptions().dtype(to_scalar_type(s.dtype)));
  Runtime::get().download(*s.value, host.data_ptr(), host.nbytes());
  for (size_t d = 0; d < padded.size(); ++d) host = host.narrow(static_cast<int64_t>(d), 0, s.padding->sizes[d]);
  return host.contiguous().view({-1});
}

at::Tensor wrap_padded(pjrt::BufferPtr value, const PaddedDims& dims, at::ScalarType dtype, int device,
                       const std::vector<std::shared_ptr<runtime::DeviceSize>>& unknown) {
  runtime::Padding padding;
  std::vector<int64_t> sizes, padded;
  std::vector<std::vector<int64_t>> reals;
  for (const auto& parts : dims) {
    int64_t n = 1, m = 1;
    for (const Part& p : parts) {
      padding.sizes.push_back(p.real);
      // A bucket of 1 pads nothing (unless the size is on the device).
      padding.buckets.push_back(p.bucket > 1 || p.real < 0 ? p.bucket : 0);
      n *= p.real;
      m *= p.padded();
      if (p.real < 0)
        for (const auto& u : unknown)
          if (u->id == -p.real && std::find(padding.unknown.begin(), padding.unknown.end(), u) == padding.unknown.end())
            padding.unknown.push_back(u);
    }
    sizes.push_back(n);
    padded.push_back(m);
    auto& dim_reals = reals.emplace_back();
    for (const Part& p : parts) dim_reals.push_back(p.real);
  }
  if (!padding.unknown.empty()) {  // deferred: the storage holds the padded value; learned on a size read
    c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
    const int64_t nbytes = product(padded) * static_cast<int64_t>(c10::elementSize(dtype));
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, c10::GetAllocator(c10::DeviceType::PrivateUse1),
                         /*resizable=*/true);
    at::Tensor t = at::detail::make_tensor<DeferredSizesImpl>(std::move(storage), c10::scalarTypeToTypeMeta(dtype),
                                                              padded, std::move(reals), padding.unknown);
    DeviceStorage& s = storage_of(t);
    s.value = std::move(value);
    s.dtype = to_dtype(dtype);
    s.padding = std::move(padding);
    note_padding(s);
    Runtime::get().count("deferred_tensors");
    return t;
  }
  at::Tensor t = wrap_buffer(std::move(value), sizes, dtype, device);
  DeviceStorage& s = storage_of(t);
  s.padding = std::move(padding);
  account_padded_output(s);
  return t;
}

at::Tensor as_padded(const at::Tensor& full, at::IntArrayRef real, at::IntArrayRef bounded) {
  TORCH_CHECK(full.device().type() == c10::DeviceType::PrivateUse1 && static_cast<size_t>(full.dim()) == real.size(),
              "torch_tpu: as_padded: expected a tpu tensor of ", real.size(), " dims, got ", full.sizes(), " on ",
              full.device().str());
  PaddedDims dims;
  for (int64_t d = 0; d < full.dim(); ++d) {
    const int64_t n = real[static_cast<size_t>(d)];
    const bool is_bounded = std::find(bounded.begin(), bounded.end(), d) != bounded.end();
    TORCH_CHECK(n >= 0 && (is_bounded ? n <= full.size(d) : n == full.size(d)), "torch_tpu: as_padded: sizes ", real,
                " do not fit in the padded tensor of shape ", full.sizes(), " (bounded dims ", bounded, ")");
    dims.push_back({Part{n, is_bounded ? full.size(d) : 0}});
  }
  return wrap_padded(read_dense(full.contiguous()), dims, full.scalar_type(), device_index(full));
}

bool copy_padded(const at::Tensor& src, const at::Tensor& dst) {
  if (!dynamic_shapes_enabled() || src.sizes() != dst.sizes() || !dst.is_contiguous() || dst.storage_offset() != 0 ||
      static_cast<size_t>(dst.nbytes()) != storage_of(dst).nbytes)
    return false;
  auto read = padded_read(src);
  if (!read) return false;
  const DType from = to_dtype(src.scalar_type()), to = to_dtype(dst.scalar_type());
  std::string key = "copy_padded|" + stablehlo::mlir_name(from) + "|" + dims_key(read->stored) + "|" +
                    dims_key(read->memory_dims) + "|" + dims_key(read->shape()) + "|" + stablehlo::mlir_name(to);
  auto program = Runtime::get().program(key, [&] {
    stablehlo::Builder b;
    auto x = padded_value(b, b.parameter(TensorType{from, {product(read->stored)}}), *read);
    auto out = b.reshape(b.cast(x, to), {x.type.numel()});
    return std::make_pair(b.module({out}), std::vector<TensorType>{out.type});
  });
  auto value = Runtime::get().execute(program, {read->value}, device_index(dst), "copy_")[0];
  DeviceStorage& s = storage_of(dst);
  runtime::Padding padding;
  for (const auto& parts : read->dims)
    for (const Part& p : parts) {
      padding.sizes.push_back(p.real);
      padding.buckets.push_back(p.bucket);
    }
  Runtime::get().replaced(value, s.value);
  s.value = std::move(value);
  s.dtype = to;
  // A box with no bounded dim left (x[:, -1]) is plain.
  const bool bounded = std::any_of(padding.buckets.begin(), padding.buckets.end(), [](int64_t b) { return b != 0; });
  s.padding = bounded ? std::optional<runtime::Padding>(std::move(padding)) : std::nullopt;
  set_padding_bytes(s, padding_bytes_of(s));
  return true;
}

namespace {
// TORCH_TPU_DYNAMIC: "auto" (the default: mark_dynamic, and dims that took
// kAutoAfter sizes in copies), "marked" (mark_dynamic only), "off" (exact shapes only).
// Read once; set_dynamic_setting changes it for the rest of the process.
enum class Dynamic { Off, Marked, Auto };
constexpr const char* kDynamicNames[] = {"off", "marked", "auto"};

Dynamic parse_setting(std::string s) {
  if (s == "0") s = "off";
  for (int i = 0; i < 3; ++i)
    if (s == kDynamicNames[i]) return static_cast<Dynamic>(i);
  TORCH_CHECK(false, "TORCH_TPU_DYNAMIC='", s, "' is not one of auto (the default), marked, off");
}

std::atomic<Dynamic>& setting() {
  static std::atomic<Dynamic> value{[] {
    const char* v = std::getenv("TORCH_TPU_DYNAMIC");
    return parse_setting(v && *v ? v : "auto");
  }()};
  return value;
}
Dynamic dynamic_setting() { return setting().load(std::memory_order_relaxed); }
}  // namespace

std::string set_dynamic_setting(const std::string& value) {
  return kDynamicNames[static_cast<int>(setting().exchange(parse_setting(value)))];
}

bool dynamic_shapes_enabled() { return dynamic_setting() != Dynamic::Off; }

int64_t bucket_for(int64_t n, std::optional<int64_t> max) {
  static const std::vector<int64_t> buckets = [] {
    std::vector<int64_t> list;
    if (const char* v = std::getenv("TORCH_TPU_DYNAMIC_BUCKETS"); v && *v) {
      std::string s(v);
      size_t at = 0;
      while (at <= s.size()) {
        size_t end = s.find(',', at);
        if (end == std::string::npos) end = s.size();
        const std::string item = s.substr(at, end - at);
        char* rest = nullptr;
        const long long x = std::strtoll(item.c_str(), &rest, 10);
        TORCH_CHECK(!item.empty() && rest && *rest == '\0' && x > 0, "TORCH_TPU_DYNAMIC_BUCKETS='", s,
                    "' is not a comma-separated list of positive sizes (e.g. 64,128,512)");
        list.push_back(x);
        at = end + 1;
      }
      std::sort(list.begin(), list.end());
    }
    return list;
  }();
  int64_t bucket = 0;
  if (buckets.empty()) {
    bucket = 1;
    while (bucket < n) bucket *= 2;
  } else {
    auto it = std::lower_bound(buckets.begin(), buckets.end(), n);
    TORCH_CHECK(it != buckets.end() || max, "torch_tpu: a bounded dim of size ", n,
                " is larger than every bucket of TORCH_TPU_DYNAMIC_BUCKETS (largest ", buckets.back(),
                "); add a larger bucket or pass max= to mark_dynamic");
    bucket = it == buckets.end() ? *max : *it;
  }
  return max ? std::min(bucket, *max) : bucket;
}

void mark_dynamic(const at::Tensor& t, int64_t dim, std::optional<int64_t> max) {
  TORCH_CHECK(t.defined() && t.device().type() == c10::DeviceType::PrivateUse1,
              "torch_tpu.mark_dynamic: expected a tpu tensor, got one on ",
              t.defined() ? t.device().str() : "(undefined)", "; move it first (t.to('tpu'))");
  TORCH_CHECK_INDEX(t.dim() > 0 && dim >= -t.dim() && dim < t.dim(), "torch_tpu.mark_dynamic: dim ", dim,
                    " is out of range for a tensor of shape ", t.sizes(), " (", t.dim(), " dims)");
  if (dim < 0) dim += t.dim();
  const int64_t n = t.size(dim);
  TORCH_CHECK(!max || *max >= 1, "torch_tpu.mark_dynamic: max=", max.value_or(0), " must be at least 1");
  TORCH_CHECK(!max || n <= *max, "torch_tpu.mark_dynamic: dim ", dim, " of the tensor of shape ", t.sizes(),
              " has size ", n, ", above its declared bound max=", *max,
              "; raise max or cut the tensor to the bound first");
  if (!dynamic_shapes_enabled() || n == 0) return;
  DeviceStorage& s = storage_of(t);
  const bool whole = t.is_contiguous() && t.storage_offset() == 0 && static_cast<size_t>(t.nbytes()) == s.nbytes &&
                     (!s.padding || at::IntArrayRef(s.padding->sizes) == t.sizes());
  TORCH_CHECK(whole, "torch_tpu.mark_dynamic: the tensor of shape ", t.sizes(),
              " is a view of a larger storage (or not contiguous); mark a tensor that owns its storage, e.g. ",
              "t = t.contiguous().clone()");
  runtime::Padding padding =
      s.padding.value_or(runtime::Padding{t.sizes().vec(), std::vector<int64_t>(static_cast<size_t>(t.dim()), 0), {}});
  const int64_t bucket = bucket_for(n, max);
  if (padding.buckets[dim] == bucket || bucket == 1) return;  // a bucket of 1 pads nothing
  const bool was_bounded = padding.buckets[dim] != 0;
  padding.buckets[dim] = bucket;
  // Padded through the host: one copy each way, and no program per size.
  store_padded(s, s.padding ? download_padded(s).view(t.sizes()) : download(t), std::move(padding));
  if (!was_bounded) Runtime::get().count("dynamic_dims");
}

namespace {

constexpr size_t kAutoAfter = 3;

// The bounded dims of host-to-device copies of `host`'s dtype and shape
// (per dim: its bucket, or 0), counting `host`'s sizes first.
struct AutoClass {
  std::vector<int64_t> sizes;  // distinct, up to kAutoAfter
  bool bounded = false;
};
std::mutex auto_mutex;
std::unordered_map<std::string, AutoClass> auto_classes;  // by "int64[8, *]"

std::vector<int64_t> auto_buckets(const at::Tensor& host) {
  auto& classes = auto_classes;
  std::vector<int64_t> buckets(static_cast<size_t>(host.dim()), 0);
  std::lock_guard<std::mutex> lock(auto_mutex);
  if (classes.size() > 65536) classes.clear();  // a process of endless shapes: start counting again
  for (int64_t d = 0; d < host.dim(); ++d) {
    std::string name = std::string(c10::getDtypeNames(host.scalar_type()).first) + "[";
    for (int64_t k = 0; k < host.dim(); ++k) name += (k ? ", " : "") + (k == d ? "*" : std::to_string(host.size(k)));
    name += "]";
    AutoClass& c = classes[name];
    const int64_t n = host.size(d);
    if (!c.bounded && std::find(c.sizes.begin(), c.sizes.end(), n) == c.sizes.end()) {
      c.sizes.push_back(n);
      if (c.sizes.size() >= kAutoAfter) {
        c.bounded = true;
        Runtime::get().count("dynamic_dims");
        Runtime::get().count("dynamic_dim::copy " + name + " dim " + std::to_string(d));
        TORCH_WARN("torch_tpu: dim ", d, " of ", name, " tensors copied to tpu took ", kAutoAfter, " sizes (",
                   dims_key(c.sizes),
                   "): it is bounded from now on, padded to power-of-two buckets, so the ops over it compile once "
                   "per bucket, not once per size. torch_tpu.mark_dynamic(t, ",
                   d, ", max=...) declares it ahead; TORCH_TPU_DYNAMIC=marked keeps exact shapes elsewhere.");
      }
    }
    if (c.bounded && n > 1) buckets[d] = bucket_for(n, std::nullopt);
  }
  return buckets;
}

// `t` (plain, contiguous, its whole storage) takes `full`, its value computed
// at the padded shape `padding.padded()`, as its padded value.
void adopt_padded(const at::Tensor& t, const at::Tensor& full, runtime::Padding padding) {
  DeviceStorage& s = storage_of(t);
  auto value = read_dense(full);
  Runtime::get().replaced(value, s.value);
  s.value = std::move(value);
  s.dtype = to_dtype(full.scalar_type());
  s.padding = std::move(padding);
  account_padded_output(s);
}

bool whole_plain(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 && t.is_contiguous() &&
         t.storage_offset() == 0 && static_cast<size_t>(t.nbytes()) == storage_of(t).nbytes && !is_padded(t) &&
         t.numel() > 0;
}

thread_local bool in_padded_factory = false;

}  // namespace

void forget_auto_bounds() {
  std::lock_guard<std::mutex> lock(auto_mutex);
  auto_classes.clear();
}

PlainFactoryScope::PlainFactoryScope() : was_(in_padded_factory) { in_padded_factory = true; }
PlainFactoryScope::~PlainFactoryScope() { in_padded_factory = was_; }

Factory factory_kind(const std::string& op) {
  // (Not zero_: zeros_like(p) is how optimizers make their states, of a parameter's size.)
  if (op == "aten::arange.start_out") return Factory::Arange;
  if (op == "aten::fill_.Scalar") return Factory::Fill;
  return Factory::None;
}

bool padded_factory(Factory kind, const std::vector<c10::IValue>& args, torch::jit::Stack* stack) {
  if (kind == Factory::None || in_padded_factory || !padded_storages_live() || !dynamic_shapes_enabled()) return false;
  const bool arange = kind == Factory::Arange;
  auto bucket_of = [](int64_t n) { return n > 1 && a_recent_bounded_size(n) ? bucket_for(n, std::nullopt) : 0; };
  // A size that fills its bucket (a power of two) is too often a static size
  // (ones(n, 8) beside head_dim 8): it is bounded only where every dim has it
  // (arange(n), a causal mask ones(n, n)).
  auto fills_bucket = [](int64_t n) { return n > 1 && bucket_for(n, std::nullopt) == n; };
  if (arange) {  // (start, end, step, out): exact integer positions only
    const at::Tensor& out = args[3].toTensor();
    const c10::Scalar start = args[0].toScalar(), end = args[1].toScalar(), step = args[2].toScalar();
    const double a = start.toDouble(), z = end.toDouble(), h = step.toDouble();
    if (h == 0 || a != std::floor(a) || h != std::floor(h) || std::abs(a) > 1e15 || std::abs(z) > 1e15 ||
        std::abs(h) > 1e15 || out.device().type() != c10::DeviceType::PrivateUse1 || out.dim() > 1)
      return false;
    const int64_t n = static_cast<int64_t>(std::ceil((z - a) / h)), bucket = bucket_of(n);
    if (bucket == 0) return false;
    out.resize_({n});
    if (!whole_plain(out)) return false;  // a view given as out=: the exact path writes it
    at::Tensor full;
    {
      PlainFactoryScope plain;
      full = at::empty({bucket}, out.options());
      at::arange_out(full, start, a + static_cast<double>(bucket) * h, step);
    }
    adopt_padded(out, full, runtime::Padding{{n}, {bucket}, {}});
  } else {
    const at::Tensor& self = args[0].toTensor();
    if (!whole_plain(self) || self.dim() == 0 || self.requires_grad()) return false;  // (a parameter's init)
    std::vector<int64_t> buckets;
    const bool square =
        std::all_of(self.sizes().begin(), self.sizes().end(), [&](int64_t size) { return size == self.size(0); });
    for (int64_t size : self.sizes()) buckets.push_back(fills_bucket(size) && !square ? 0 : bucket_of(size));
    if (std::all_of(buckets.begin(), buckets.end(), [](int64_t b) { return b == 0; })) return false;
    runtime::Padding padding{self.sizes().vec(), buckets, {}};
    at::Tensor full;
    {
      PlainFactoryScope plain;
      full = at::empty(padding.padded(), self.options());
      full.fill_(args[1].toScalar());
    }
    adopt_padded(self, full, std::move(padding));
  }
  Runtime::get().count("padded_factories");
  const at::Tensor result = args[arange ? 3 : 0].toTensor();
  torch::jit::drop(*stack, args.size());
  stack->push_back(result);
  return true;
}

bool upload_bounded(const at::Tensor& host, const at::Tensor& dst) {
  if (dynamic_setting() != Dynamic::Auto || host.numel() == 0 || host.dim() == 0) return false;
  const auto buckets = auto_buckets(host);
  if (std::all_of(buckets.begin(), buckets.end(), [](int64_t b) { return b == 0; })) return false;
  DeviceStorage& s = storage_of(dst);
  if (!dst.is_contiguous() || dst.storage_offset() != 0 || static_cast<size_t>(dst.nbytes()) != s.nbytes ||
      dst.sizes() != host.sizes() || dst.scalar_type() != host.scalar_type())
    return false;
  store_padded(s, host, runtime::Padding{host.sizes().vec(), buckets, {}});
  return true;
}

namespace {
pjrt::BufferPtr uploaded_sizes(const std::vector<int64_t>& sizes, int device) {
  static std::mutex mutex;
  static std::map<std::pair<int, std::vector<int64_t>>, pjrt::BufferPtr> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_pair(device, sizes);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  std::vector<int32_t> values(sizes.begin(), sizes.end());
  auto buffer = Runtime::get().upload(values.data(), DType::Int32, {static_cast<int64_t>(values.size())}, device);
  if (cache.size() > 4096) cache.clear();
  cache.emplace(key, buffer);
  return buffer;
}
}  // namespace

pjrt::BufferPtr sizes_buffer(const std::vector<int64_t>& sizes,
                             const std::vector<std::shared_ptr<runtime::DeviceSize>>& unknown, int device) {
  if (std::all_of(sizes.begin(), sizes.end(), [](int64_t n) { return n >= 0; })) return uploaded_sizes(sizes, device);
  // The known sizes uploaded (cached), each unknown one written in on the device.
  std::vector<int64_t> known(sizes);
  std::vector<pjrt::BufferPtr> buffers{nullptr};
  std::vector<int64_t> at;
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] >= 0) continue;
    known[k] = 0;
    buffers.push_back(find_size(unknown, -sizes[k])->count);
    at.push_back(static_cast<int64_t>(k));
  }
  buffers[0] = uploaded_sizes(known, device);
  const int64_t k = static_cast<int64_t>(sizes.size());
  auto program = Runtime::get().program("device_sizes|" + std::to_string(k) + "|" + dims_key(at), [&] {
    stablehlo::Builder b;
    auto out = b.parameter(TensorType{DType::Int32, {k}});
    std::vector<stablehlo::Value> counts;
    for (size_t j = 0; j < at.size(); ++j) counts.push_back(b.parameter(TensorType{DType::Int32, {1}}));
    for (size_t j = 0; j < at.size(); ++j)
      out = b.dynamic_update_slice(out, counts[j], {b.constant_int(at[j], TensorType{DType::Int32, {}})});
    return std::make_pair(b.module({out}), std::vector<TensorType>{out.type});
  });
  return Runtime::get().execute(program, buffers, device, "bounded sizes")[0];
}

bool defer_data_dependent_sizes() {
  return Runtime::get().mode() == runtime::EagerMode::Fused && dynamic_shapes_enabled();
}

std::shared_ptr<runtime::DeviceSize> device_size(pjrt::BufferPtr count) {
  static std::atomic<int64_t> next_id{1};
  auto size = std::make_shared<runtime::DeviceSize>();
  size->id = next_id.fetch_add(1);
  size->count = std::move(count);
  return size;
}

bool deferred(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 && deferred_impl(t) &&
         has_unknown(storage_of(t));
}

void learn_sizes(DeviceStorage& s) {
  if (!has_unknown(s)) return;
  auto& padding = *s.padding;
  for (auto& n : padding.sizes)
    if (n < 0) n = read_size(*find_size(padding.unknown, -n));  // one flush: the first read
  padding.unknown.clear();
  // The storage held its padded bytes; now its real bytes plus their padding.
  const int64_t real_bytes = product(padding.sizes) * static_cast<int64_t>(stablehlo::byte_size(s.dtype));
  Runtime::get().resize(s.device, real_bytes - static_cast<int64_t>(s.nbytes));
  s.nbytes = static_cast<size_t>(real_bytes);
  set_padding_bytes(s, padding_bytes_of(s));
}

}  // namespace torch_tpu::aten
