// Native CPU kernels of the fused ops, the extension module `wc_kernels._native`:
//   nft_loss_fwd(v_theta, v_old, v_target, r, sigma_or_None, beta, x0, grad_scale)
//     -> (loss [B], grad_scale * dloss/dv_theta [B, D])
//   flow_noise(x0 [S, D], sigmas [S, K], noise [S*K, D]) -> (x_t, v_target) [S*K, D]
//   sde_residual_sums(model_output, sample, prev_sample, ref_output_or_None, coef [B, 2])
//     -> [B, 2]: sum((prev_sample - a sample - c model_output)^2), sum((model_output - ref)^2)
//   sde_residual_sums_bwd(weights [B, 2], model_output, sample, prev_sample, ref_or_None, coef)
//     -> w1 * residual + w2 * (model_output - ref) [B, D]  (wc_kernels/ops/grpo_sde_loss/triton.py)
// The math is docs/design.md section 7 and each op's wc_kernels/ops/<op>/naive.py; this file holds the
// argument checks, the work split over threads and the pybind11 bindings. The vectorized inner
// loops are in simd_kernels.h, compiled here once per instruction set (see "Instruction sets").

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

// The AVX2 copy relies on GCC's target pragma; other compilers build the baseline copy only.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define WC_HAVE_X86_VARIANTS 1
#else
#define WC_HAVE_X86_VARIANTS 0
#endif

// ---- Instruction sets. The extension is built without -march flags so that one build runs on
// any x86-64 or aarch64 machine. The inner loops are therefore compiled several times on
// x86-64, each copy under its own target pragma: the baseline (SSE2), AVX2 + FMA + F16C
// (hardware fp16 conversion) and AVX-512; the best copy the CPU supports is chosen at run
// time. On one core of an AVX-512 Xeon the AVX-512 copy measured 1.2-1.5x faster than the AVX2
// one (fp32, bf16; a single core does not saturate memory bandwidth). This keeps the build to
// one translation unit and one compiler invocation. at::vec::Vectorized would not help: without
// per-file -mavx2 / -mavx512f flags it compiles to its scalar fallback, and including ATen's
// headers under a target pragma would give their inline functions AVX bodies that the linker
// may pick for baseline callers.

#define WC_ISA generic
#include "simd_kernels.h"
#undef WC_ISA

#if WC_HAVE_X86_VARIANTS
#define WC_ISA_F16C 1

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define WC_ISA avx2
#include "simd_kernels.h"
#undef WC_ISA
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#define WC_ISA avx512
#include "simd_kernels.h"
#undef WC_ISA
#pragma GCC pop_options

#undef WC_ISA_F16C
#endif

namespace wc_native {
namespace {

enum class Isa { generic, avx2, avx512 };

constexpr Isa kIsas[] = {Isa::generic, Isa::avx2, Isa::avx512};

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
    default:
      return "generic";
  }
}

bool cpu_supports(Isa isa) {
#if WC_HAVE_X86_VARIANTS
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  switch (isa) {
    case Isa::avx2:
      return avx2;
    case Isa::avx512:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    default:
      return true;
  }
#else
  return isa == Isa::generic;
#endif
}

Isa best_isa() {
  Isa best = Isa::generic;
  for (Isa isa : kIsas) {
    if (cpu_supports(isa)) best = isa;
  }
  return best;
}

// The instruction set in use: the best one the CPU has, unless set_isa chose another.
std::atomic<Isa> g_isa{best_isa()};

// When set, outputs are filled with NaN before the kernels run, so a test can tell an element
// the kernel never wrote from one it wrote (allocation may reuse memory holding old results).
std::atomic<bool> g_poison_outputs{false};

// Outputs of a pass larger than this together are written with streaming stores (see
// stream_bytes in simd_kernels.h). 32 MiB is one CCD's L3 on EPYC and about half a Xeon's:
// on a 2-core EPYC VM (32 MiB L3), flow_noise with plain stores was 1.4x faster at 16 MB of
// outputs and with streaming stores 1.4x faster at 96 MB (docs/experiment_log.md). A fixed size,
// because what sysconf reports for the last-level cache on a VM is the host's (256 MiB there).
std::atomic<int64_t> g_stream_min_bytes{int64_t{32} << 20};

int64_t set_stream_min_bytes(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "set_stream_min_bytes: bytes must be >= 0, got ", bytes);
  return g_stream_min_bytes.exchange(bytes);
}

// Makes a task's streaming stores visible before the thread that waits for it reads them.
void stream_fence() {
#if WC_HAVE_X86_VARIANTS
  _mm_sfence();
#endif
}

std::vector<std::string> available_isas() {
  std::vector<std::string> names;
  for (Isa isa : kIsas) {
    if (cpu_supports(isa)) names.emplace_back(isa_name(isa));
  }
  return names;
}

void set_isa(const std::string& name) {
  for (Isa isa : kIsas) {
    if (name == isa_name(isa) && cpu_supports(isa)) {
      g_isa = isa;
      return;
    }
  }
  TORCH_CHECK(false, "set_isa: unknown or unsupported instruction set '", name,
              "'; this CPU supports ", c10::Join(", ", available_isas()));
}

// The inner loops of one instruction set for input type T and accumulation type A.
template <class T, class A>
struct Kernels {
  void (*abs_sums)(const T*, const T*, const T*, int64_t, A, double*);
  void (*square_sums_grad)(const T*, const T*, const T*, T*, int64_t, A, A, A, double*);
  void (*flow_noise_segment)(const T*, const A*, int64_t, const T*, T*, T*, int64_t, int64_t,
                             bool);
  void (*sde_sums)(const T*, const T*, const T*, const T*, int64_t, A, A, double*);
  void (*sde_grad)(const T*, const T*, const T*, const T*, T*, int64_t, A, A, A, A);
};

// The kernels of instruction-set namespace `ns`.
#define WC_KERNELS(ns)                                                                   \
  Kernels<T, A> {                                                                        \
    ns::nft_abs_sums<T, A>, ns::nft_square_sums_grad<T, A>, ns::flow_noise_segment<T, A>, \
        ns::sde_sums<T, A>, ns::sde_grad<T, A>                                            \
  }

template <class T, class A>
Kernels<T, A> kernels() {
#if WC_HAVE_X86_VARIANTS
  if (g_isa == Isa::avx512) return WC_KERNELS(avx512);
  if (g_isa == Isa::avx2) return WC_KERNELS(avx2);
#endif
  return WC_KERNELS(generic);
}

#undef WC_KERNELS

// ---- Work split. Rows are cut into chunks of at most kChunk elements; a chunk is one unit of
// parallel work, and each chunk's partial sums are kept apart and added in chunk order. The
// chunk boundaries do not depend on the thread count, so the results are bitwise identical for
// any number of threads, and a single long row (B = 1) still spreads over all cores.
constexpr int64_t kChunk = 16384;
// The least number of elements worth handing to a thread.
constexpr int64_t kMinTaskElements = 32768;

struct RowChunks {
  int64_t rows;
  int64_t cols;
  int64_t chunk;    // elements per chunk (the last chunk of a row may be shorter)
  int64_t per_row;  // chunks per row

  RowChunks(int64_t rows_, int64_t cols_, int64_t max_chunk)
      : rows(rows_), cols(cols_), chunk(std::min(cols_, max_chunk)),
        per_row((cols_ + chunk - 1) / chunk) {}

  int64_t items() const { return rows * per_row; }
  int64_t grain(int64_t work_per_element = 1) const {
    return std::max<int64_t>(1, kMinTaskElements / (chunk * work_per_element));
  }
  int64_t row(int64_t item) const { return item / per_row; }
  int64_t begin(int64_t item) const { return (item % per_row) * chunk; }
  int64_t length(int64_t item) const { return std::min(chunk, cols - begin(item)); }
};

// Per-row totals of the two partial sums of every chunk, added in chunk order.
std::vector<double> row_totals(const RowChunks& rc, const std::vector<double>& partial) {
  std::vector<double> totals(2 * rc.rows, 0.0);
  for (int64_t item = 0; item < rc.items(); ++item) {
    totals[2 * rc.row(item)] += partial[2 * item];
    totals[2 * rc.row(item) + 1] += partial[2 * item + 1];
  }
  return totals;
}

// ---- Argument checks.

const char* dtype_name(at::ScalarType t) { return c10::toString(t); }

void check_float_matrix(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.dim() == 2, op, ": ", name, " must be 2-D, got shape ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous (call .contiguous())");
  const auto dt = t.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16 || dt == at::kDouble,
              op, ": ", name, " must be float32, float16, bfloat16 or float64, got ",
              dtype_name(dt));
}

void check_same(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                const at::Tensor& ref) {
  check_float_matrix(op, name, t);
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " must have the dtype of ",
              ref_name, " (", dtype_name(ref.scalar_type()), "), got ",
              dtype_name(t.scalar_type()));
  TORCH_CHECK(t.sizes() == ref.sizes(), op, ": ", name, " must have the shape of ", ref_name,
              " ", ref.sizes(), ", got ", t.sizes());
}

// A small per-row (or per-sample) float tensor of `shape`, returned in the accumulation type.
at::Tensor checked_params(const char* op, const char* name, const at::Tensor& t,
                          at::IntArrayRef shape, at::ScalarType acc) {
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.sizes() == shape, op, ": ", name, " must have shape ", shape, ", got ",
              t.sizes());
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous (call .contiguous())");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, op, ": ", name,
              " must be float32 or float64, got ", dtype_name(t.scalar_type()));
  return t.to(acc);
}

at::ScalarType acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// ---- Outputs. Every fresh page an output touches is a page fault, and glibc hands large
// blocks back to the system when they are freed: blocks above its mmap threshold (at most
// 32 MiB) are unmapped, and freeing a large block at the top of the heap trims it. So a
// kernel called in a loop faults its outputs in again on every call: 3808 faults per call for
// flow_noise's two 7.9 MB outputs (14 ms against about 1 ms of arithmetic, 2-core VM), 16384
// for a 64 MiB gradient. Outputs of at least kCachedMinBytes therefore come from blocks that
// are 2 MiB-aligned and marked for transparent huge pages (as c10 does for every allocation
// under THP_MEM_ALLOC_ENABLE=1), and a freed block is kept in a small cache (at most
// g_cache_limit bytes in all, 1 GiB unless set_output_cache_bytes changes it) and handed out
// again for the next output of the same rounded size, so a loop over one shape faults once.
// Smaller outputs use the default allocator. Where the kernel refuses huge pages the advice
// is ignored and nothing else changes.

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kCachedMinBytes = size_t{4} << 20;

class OutputCache {
 public:
  // A block of `size` bytes from the cache, or nullptr if none of that size is kept.
  void* take(size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
      if (it->second == size) {
        void* ptr = it->first;
        blocks_.erase(std::next(it).base());
        cached_ -= size;
        return ptr;
      }
    }
    return nullptr;
  }

  // Keeps a freed block, evicting the oldest ones to stay within the limit (or frees it).
  void give(void* ptr, size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (size > limit_) {
      std::free(ptr);
      return;
    }
    evict_to(limit_ - size);
    blocks_.emplace_back(ptr, size);
    cached_ += size;
  }

  size_t set_limit(size_t limit) {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t previous = limit_;
    limit_ = limit;
    evict_to(limit_);
    return previous;
  }

  size_t cached() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_;
  }

 private:
  void evict_to(size_t bytes) {
    while (cached_ > bytes) {
      std::free(blocks_.front().first);
      cached_ -= blocks_.front().second;
      blocks_.erase(blocks_.begin());
    }
  }

  std::mutex mutex_;
  std::vector<std::pair<void*, size_t>> blocks_;  // oldest first
  size_t cached_ = 0;
  size_t limit_ = size_t{1} << 30;
};

// Never destroyed: outputs may be freed during interpreter shutdown, after static destructors.
OutputCache& output_cache() {
  static auto* cache = new OutputCache;
  return *cache;
}

struct CachedBlock {
  void* ptr;
  size_t size;
};

void release_block(void* ctx) {
  auto* block = static_cast<CachedBlock*>(ctx);
  output_cache().give(block->ptr, block->size);
  delete block;
}

class CachingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes < kCachedMinBytes) return c10::GetCPUAllocator()->allocate(nbytes);
    const size_t size = (nbytes + kHugePage - 1) / kHugePage * kHugePage;
    void* ptr = output_cache().take(size);
    if (ptr == nullptr) {
      TORCH_CHECK(posix_memalign(&ptr, kHugePage, size) == 0,
                  "wc_kernels._native: out of memory allocating ", size, " bytes");
#if defined(__linux__) && defined(MADV_HUGEPAGE)
      madvise(ptr, size, MADV_HUGEPAGE);
#endif
    }
    return {ptr, new CachedBlock{ptr, size}, &release_block, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

at::Tensor new_output(at::IntArrayRef shape, at::ScalarType dtype) {
  static CachingAllocator allocator;
  at::Tensor out = at::detail::empty_generic(shape, &allocator,
                                             c10::DispatchKeySet(c10::DispatchKey::CPU), dtype,
                                             std::nullopt);
  if (g_poison_outputs) out.fill_(std::numeric_limits<double>::quiet_NaN());
  return out;
}

// ---- NFT loss.

constexpr double kX0WeightFloor = 1e-5;

// x0 space, pass 1: the weights w+- = max(sigma * mean|d+-|, floor) of every row.
template <class T, class A>
std::vector<double> x0_weights(const Kernels<T, A>& k, const RowChunks& rc, const T* vt,
                               const T* vo, const T* vs, const A* sigma, A beta) {
  std::vector<double> partial(2 * rc.items());
  at::parallel_for(0, rc.items(), rc.grain(), [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; ++item) {
      const int64_t offset = rc.row(item) * rc.cols + rc.begin(item);
      k.abs_sums(vt + offset, vo + offset, vs + offset, rc.length(item), beta,
                 &partial[2 * item]);
    }
  });
  std::vector<double> w = row_totals(rc, partial);
  for (int64_t row = 0; row < rc.rows; ++row) {
    const double scale = static_cast<double>(sigma[row]) / static_cast<double>(rc.cols);
    w[2 * row] = std::max(scale * w[2 * row], kX0WeightFloor);
    w[2 * row + 1] = std::max(scale * w[2 * row + 1], kX0WeightFloor);
  }
  return w;
}

// Row factors f+- such that L = f+ * sum(d+^2) + f- * sum(d-^2) and dL/dd+- = 2 f+- d+-:
// velocity f+ = r/D, f- = (1-r)/D; x0 f+ = r s^2/(D w+), f- = (1-r) s^2/(D w-).
template <class A>
std::vector<double> loss_factors(int64_t rows, int64_t cols, const A* r, const A* sigma,
                                 const std::vector<double>& w) {
  std::vector<double> f(2 * rows);
  for (int64_t row = 0; row < rows; ++row) {
    const double rr = r[row];
    double scale = 1.0 / static_cast<double>(cols);
    double pos = scale, neg = scale;
    if (sigma != nullptr) {
      scale *= static_cast<double>(sigma[row]) * static_cast<double>(sigma[row]);
      pos = scale / w[2 * row];
      neg = scale / w[2 * row + 1];
    }
    f[2 * row] = rr * pos;
    f[2 * row + 1] = (1.0 - rr) * neg;
  }
  return f;
}

template <class T, class A>
void nft_loss_typed(const at::Tensor& v_theta, const at::Tensor& v_old, const at::Tensor& v_target,
                    const at::Tensor& r, const std::optional<at::Tensor>& sigma, double beta,
                    double grad_scale, at::Tensor& loss, at::Tensor& grad) {
  const Kernels<T, A> k = kernels<T, A>();
  const RowChunks rc(v_theta.size(0), v_theta.size(1), kChunk);
  const T* vt = v_theta.const_data_ptr<T>();
  const T* vo = v_old.const_data_ptr<T>();
  const T* vs = v_target.const_data_ptr<T>();
  const A* sig = sigma ? sigma->const_data_ptr<A>() : nullptr;
  const A b = static_cast<A>(beta);

  const std::vector<double> w =
      sig ? x0_weights(k, rc, vt, vo, vs, sig, b) : std::vector<double>();
  const std::vector<double> f = loss_factors(rc.rows, rc.cols, r.const_data_ptr<A>(), sig, w);

  T* g = grad.data_ptr<T>();
  std::vector<double> partial(2 * rc.items());
  at::parallel_for(0, rc.items(), rc.grain(), [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; ++item) {
      const int64_t row = rc.row(item);
      const int64_t offset = row * rc.cols + rc.begin(item);
      k.square_sums_grad(vt + offset, vo + offset, vs + offset, g + offset, rc.length(item), b,
                         static_cast<A>(2.0 * beta * grad_scale * f[2 * row]),
                         static_cast<A>(2.0 * beta * grad_scale * f[2 * row + 1]),
                         &partial[2 * item]);
    }
  });
  const std::vector<double> sums = row_totals(rc, partial);
  A* out = loss.data_ptr<A>();
  for (int64_t row = 0; row < rc.rows; ++row) {
    out[row] = static_cast<A>(f[2 * row] * sums[2 * row] + f[2 * row + 1] * sums[2 * row + 1]);
  }
}

std::tuple<at::Tensor, at::Tensor> nft_loss_fwd(const at::Tensor& v_theta,
                                                const at::Tensor& v_old,
                                                const at::Tensor& v_target, const at::Tensor& r,
                                                const std::optional<at::Tensor>& sigma,
                                                double beta, bool x0, double grad_scale) {
  constexpr const char* op = "nft_loss_fwd";
  check_float_matrix(op, "v_theta", v_theta);
  check_same(op, "v_old", v_old, "v_theta", v_theta);
  check_same(op, "v_target", v_target, "v_theta", v_theta);
  TORCH_CHECK(v_theta.size(1) > 0, op, ": rows must be non-empty, got shape ", v_theta.sizes());
  TORCH_CHECK(std::isfinite(beta), op, ": beta must be finite, got ", beta);
  TORCH_CHECK(std::isfinite(grad_scale), op, ": grad_scale must be finite, got ", grad_scale);
  TORCH_CHECK(!x0 || sigma.has_value(), op, ": sigma [B] is required for the x0 space");
  const int64_t rows = v_theta.size(0);
  const at::ScalarType dt = v_theta.scalar_type();
  const at::ScalarType acc = acc_type(dt);
  const at::Tensor rr = checked_params(op, "r", r, {rows}, acc);
  std::optional<at::Tensor> sig;
  if (x0) sig = checked_params(op, "sigma", *sigma, {rows}, acc);

  at::Tensor loss = new_output({rows}, acc);
  at::Tensor grad = new_output(v_theta.sizes(), dt);
  if (rows == 0) return {loss, grad};
  switch (dt) {
    case at::kFloat:
      nft_loss_typed<float, float>(v_theta, v_old, v_target, rr, sig, beta, grad_scale, loss,
                                    grad);
      break;
    case at::kDouble:
      nft_loss_typed<double, double>(v_theta, v_old, v_target, rr, sig, beta, grad_scale, loss,
                                      grad);
      break;
    case at::kHalf:
      nft_loss_typed<c10::Half, float>(v_theta, v_old, v_target, rr, sig, beta, grad_scale,
                                        loss, grad);
      break;
    default:
      nft_loss_typed<c10::BFloat16, float>(v_theta, v_old, v_target, rr, sig, beta, grad_scale,
                                            loss, grad);
      break;
  }
  return {loss, grad};
}

// ---- Flow noise. The unit of work is one x0 row segment with its K noisy copies.

constexpr int64_t kNoiseSegment = 16384;

template <class T, class A>
void flow_noise_typed(const at::Tensor& x0, const at::Tensor& sigmas, const at::Tensor& noise,
                      at::Tensor& x_t, at::Tensor& v_target) {
  const Kernels<T, A> k = kernels<T, A>();
  const int64_t n_sig = sigmas.size(1);
  const RowChunks rc(x0.size(0), x0.size(1), kNoiseSegment);
  const T* x = x0.const_data_ptr<T>();
  const A* sig = sigmas.const_data_ptr<A>();
  const T* eps = noise.const_data_ptr<T>();
  T* xt = x_t.data_ptr<T>();
  T* v = v_target.data_ptr<T>();
  const bool stream = 2 * x_t.nbytes() > static_cast<size_t>(g_stream_min_bytes.load());
  at::parallel_for(0, rc.items(), rc.grain(2 * n_sig), [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; ++item) {
      const int64_t row = rc.row(item);
      const int64_t col = rc.begin(item);
      const int64_t out = row * n_sig * rc.cols + col;  // element of row s*K, column col
      k.flow_noise_segment(x + row * rc.cols + col, sig + row * n_sig, n_sig, eps + out,
                           xt + out, v + out, rc.length(item), rc.cols, stream);
    }
    if (stream) stream_fence();
  });
}

std::tuple<at::Tensor, at::Tensor> flow_noise(const at::Tensor& x0, const at::Tensor& sigmas,
                                              const at::Tensor& noise) {
  constexpr const char* op = "flow_noise";
  check_float_matrix(op, "x0", x0);
  check_float_matrix(op, "noise", noise);
  TORCH_CHECK(noise.scalar_type() == x0.scalar_type(), op, ": noise must have the dtype of x0 (",
              dtype_name(x0.scalar_type()), "), got ", dtype_name(noise.scalar_type()));
  TORCH_CHECK(sigmas.dim() == 2 && sigmas.size(0) == x0.size(0), op,
              ": sigmas must have shape [S, K] with S = x0.size(0) = ", x0.size(0), ", got ",
              sigmas.sizes());
  const int64_t rows = x0.size(0) * sigmas.size(1);
  TORCH_CHECK(noise.size(0) == rows && noise.size(1) == x0.size(1), op,
              ": noise must have shape [S*K, D] = [", rows, ", ", x0.size(1), "], got ",
              noise.sizes());
  const at::ScalarType dt = x0.scalar_type();
  const at::Tensor sig = checked_params(op, "sigmas", sigmas, sigmas.sizes(), acc_type(dt));

  at::Tensor x_t = new_output(noise.sizes(), dt);
  at::Tensor v_target = new_output(noise.sizes(), dt);
  if (noise.numel() == 0) return {x_t, v_target};
  switch (dt) {
    case at::kFloat:
      flow_noise_typed<float, float>(x0, sig, noise, x_t, v_target);
      break;
    case at::kDouble:
      flow_noise_typed<double, double>(x0, sig, noise, x_t, v_target);
      break;
    case at::kHalf:
      flow_noise_typed<c10::Half, float>(x0, sig, noise, x_t, v_target);
      break;
    default:
      flow_noise_typed<c10::BFloat16, float>(x0, sig, noise, x_t, v_target);
      break;
  }
  return {x_t, v_target};
}

// ---- GRPO SDE loss: per-row residual sums, and their gradient (two passes; see
// wc_kernels/ops/grpo_sde_loss/triton.py for why).

struct SdeInputs {
  at::Tensor m, x, p;
  std::optional<at::Tensor> ref;
  at::Tensor coef;  // [B, 2] in the accumulation type
};

SdeInputs checked_sde_inputs(const char* op, const at::Tensor& m, const at::Tensor& x,
                             const at::Tensor& p, const std::optional<at::Tensor>& ref,
                             const at::Tensor& coef) {
  check_float_matrix(op, "model_output", m);
  check_same(op, "sample", x, "model_output", m);
  check_same(op, "prev_sample", p, "model_output", m);
  if (ref) check_same(op, "ref_output", *ref, "model_output", m);
  const at::Tensor k = checked_params(op, "coef", coef, {m.size(0), 2}, acc_type(m.scalar_type()));
  return {m, x, p, ref, k};
}

template <class T, class A>
void sde_sums_typed(const SdeInputs& in, at::Tensor& sums) {
  const Kernels<T, A> k = kernels<T, A>();
  const RowChunks rc(in.m.size(0), in.m.size(1), kChunk);
  const T* m = in.m.const_data_ptr<T>();
  const T* x = in.x.const_data_ptr<T>();
  const T* p = in.p.const_data_ptr<T>();
  const T* r = in.ref ? in.ref->const_data_ptr<T>() : nullptr;
  const A* coef = in.coef.const_data_ptr<A>();
  std::vector<double> partial(2 * rc.items());
  at::parallel_for(0, rc.items(), rc.grain(), [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; ++item) {
      const int64_t row = rc.row(item);
      const int64_t offset = row * rc.cols + rc.begin(item);
      k.sde_sums(m + offset, x + offset, p + offset, r ? r + offset : nullptr, rc.length(item),
                 coef[2 * row], coef[2 * row + 1], &partial[2 * item]);
    }
  });
  const std::vector<double> totals = row_totals(rc, partial);
  A* out = sums.data_ptr<A>();
  for (int64_t i = 0; i < 2 * rc.rows; ++i) out[i] = static_cast<A>(totals[i]);
}

template <class T, class A>
void sde_grad_typed(const SdeInputs& in, const at::Tensor& weights, at::Tensor& grad) {
  const Kernels<T, A> k = kernels<T, A>();
  const RowChunks rc(in.m.size(0), in.m.size(1), kChunk);
  const T* m = in.m.const_data_ptr<T>();
  const T* x = in.x.const_data_ptr<T>();
  const T* p = in.p.const_data_ptr<T>();
  const T* r = in.ref ? in.ref->const_data_ptr<T>() : nullptr;
  const A* coef = in.coef.const_data_ptr<A>();
  const A* w = weights.const_data_ptr<A>();
  T* g = grad.data_ptr<T>();
  at::parallel_for(0, rc.items(), rc.grain(), [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; ++item) {
      const int64_t row = rc.row(item);
      const int64_t offset = row * rc.cols + rc.begin(item);
      k.sde_grad(m + offset, x + offset, p + offset, r ? r + offset : nullptr, g + offset,
                 rc.length(item), coef[2 * row], coef[2 * row + 1], w[2 * row], w[2 * row + 1]);
    }
  });
}

// Calls fn<T, A>() for the input dtype `dt`.
#define WC_DISPATCH_FLOAT(dt, fn, ...)                   \
  switch (dt) {                                          \
    case at::kFloat:                                     \
      fn<float, float>(__VA_ARGS__);                     \
      break;                                             \
    case at::kDouble:                                    \
      fn<double, double>(__VA_ARGS__);                   \
      break;                                             \
    case at::kHalf:                                      \
      fn<c10::Half, float>(__VA_ARGS__);                 \
      break;                                             \
    default:                                             \
      fn<c10::BFloat16, float>(__VA_ARGS__);             \
      break;                                             \
  }

at::Tensor sde_residual_sums(const at::Tensor& model_output, const at::Tensor& sample,
                             const at::Tensor& prev_sample,
                             const std::optional<at::Tensor>& ref_output, const at::Tensor& coef) {
  const SdeInputs in = checked_sde_inputs("sde_residual_sums", model_output, sample, prev_sample,
                                          ref_output, coef);
  at::Tensor sums = new_output({in.m.size(0), 2}, in.coef.scalar_type());
  if (in.m.numel() == 0) return sums.zero_();
  WC_DISPATCH_FLOAT(in.m.scalar_type(), sde_sums_typed, in, sums)
  return sums;
}

at::Tensor sde_residual_sums_bwd(const at::Tensor& weights, const at::Tensor& model_output,
                                 const at::Tensor& sample, const at::Tensor& prev_sample,
                                 const std::optional<at::Tensor>& ref_output,
                                 const at::Tensor& coef) {
  constexpr const char* op = "sde_residual_sums_bwd";
  const SdeInputs in = checked_sde_inputs(op, model_output, sample, prev_sample, ref_output, coef);
  const at::Tensor w = checked_params(op, "weights", weights, {in.m.size(0), 2},
                                      in.coef.scalar_type());
  at::Tensor grad = new_output(in.m.sizes(), in.m.scalar_type());
  if (in.m.numel() == 0) return grad;
  WC_DISPATCH_FLOAT(in.m.scalar_type(), sde_grad_typed, in, w, grad)
  return grad;
}

#undef WC_DISPATCH_FLOAT

}  // namespace
}  // namespace wc_native

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using namespace wc_native;
  m.doc() = "Native CPU kernels of the fused ops nft_loss, flow_noise and grpo_sde_loss "
          "(wc_kernels._native).";
  m.def("nft_loss_fwd", &nft_loss_fwd, py::arg("v_theta"), py::arg("v_old"),
        py::arg("v_target"), py::arg("r"), py::arg("sigma"), py::arg("beta"), py::arg("x0"),
        py::arg("grad_scale") = 1.0, py::call_guard<py::gil_scoped_release>(),
        "Per-sample NFT loss [B] (float32; float64 for float64 inputs) and its gradient with "
        "respect to v_theta [B, D] times grad_scale, in one pass (two for x0=True). Inputs: "
        "contiguous [B, D] tensors of one dtype; r and sigma [B]; sigma is required when "
        "x0=True and ignored otherwise.");
  m.def("flow_noise", &flow_noise, py::arg("x0"), py::arg("sigmas"), py::arg("noise"),
        py::call_guard<py::gil_scoped_release>(),
        "x_t = (1 - sigma) x0 + sigma noise and v_target = noise - x0 for K sigmas per row: "
        "x0 [S, D], sigmas [S, K], noise [S*K, D] -> (x_t, v_target) [S*K, D] in x0's dtype.");
  m.def("sde_residual_sums", &sde_residual_sums, py::arg("model_output"), py::arg("sample"),
        py::arg("prev_sample"), py::arg("ref_output"), py::arg("coef"),
        py::call_guard<py::gil_scoped_release>(),
        "Per-row sums [B, 2] (float32; float64 for float64 inputs) of (prev_sample - a sample - "
        "c model_output)^2 and of (model_output - ref_output)^2 (0 without ref_output), with "
        "coef [B, 2] = (a, c); contiguous [B, D] inputs of one dtype.");
  m.def("sde_residual_sums_bwd", &sde_residual_sums_bwd, py::arg("weights"),
        py::arg("model_output"), py::arg("sample"), py::arg("prev_sample"),
        py::arg("ref_output"), py::arg("coef"), py::call_guard<py::gil_scoped_release>(),
        "w1 * (prev_sample - a sample - c model_output) + w2 * (model_output - ref_output) "
        "[B, D] in model_output's dtype, with weights [B, 2] = (w1, w2) and coef = (a, c).");
  m.def("isa", [] { return std::string(isa_name(g_isa)); },
        "The instruction set the kernels use: 'avx512', 'avx2' or 'generic'.");
  m.def("available_isas", &available_isas, "Instruction sets this CPU can run.");
  m.def("set_isa", &set_isa, py::arg("name"),
        "Use the inner loops built for `name` (tests and benchmarks compare them).");
  m.def("set_stream_min_bytes", &set_stream_min_bytes, py::arg("bytes"),
        "Write a pass's outputs with streaming (non-temporal) stores when they exceed `bytes` "
        "together (default 32 MiB; 0 always streams); returns the previous threshold.");
  m.def("set_output_cache_bytes",
        [](int64_t bytes) {
          TORCH_CHECK(bytes >= 0, "set_output_cache_bytes: bytes must be >= 0, got ", bytes);
          return static_cast<int64_t>(output_cache().set_limit(static_cast<size_t>(bytes)));
        },
        py::arg("bytes"),
        "Keep at most `bytes` of freed outputs (of 4 MiB or more) for reuse (default 1 GiB; 0 "
        "returns every kept block to the system); returns the previous limit.");
  m.def("cached_output_bytes", [] { return static_cast<int64_t>(output_cache().cached()); },
        "Bytes of freed outputs kept for reuse.");
  m.def("set_poison_outputs", [](bool on) { g_poison_outputs = on; }, py::arg("on"),
        "Fill outputs with NaN before computing them, so tests catch unwritten elements.");
}
