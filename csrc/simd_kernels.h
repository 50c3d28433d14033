// Inner loops of the native CPU kernels, compiled once per instruction set.
//
// native.cpp includes this file several times, each time with WC_ISA naming a different
// namespace and, on x86-64, under a different `#pragma GCC target`. Keeping every function
// in its own namespace means no inline function is shared between instruction sets, so code
// built for AVX2 can never be linked into the baseline path (which must run on any x86-64).
// Everything has internal linkage; there is deliberately no include guard. The file uses only
// the C++ standard library, the storage types c10::Half / c10::BFloat16 (their raw 16-bit
// words, none of their functions) and, where WC_ISA_F16C is defined, the F16C intrinsics.
//
// Each kernel is a plain `#pragma omp simd` loop in the accumulation type A (float, or double
// for double inputs) that the compiler vectorizes for the target at hand; 16-bit inputs are
// converted with branch-free bit arithmetic (or F16C instructions, see In / Out).

namespace wc_native {
namespace {
namespace WC_ISA {

constexpr int64_t kBlock = 512;

inline float float_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// All ones when `condition` holds, else zero: selects written as masks, which GCC vectorizes
// where it would not if-convert a conditional expression.
inline uint32_t select_mask(bool condition) { return 0u - static_cast<uint32_t>(condition); }

// IEEE half -> float, branch-free so that the loop over a block vectorizes (same algorithm
// and results as c10::detail::fp16_ieee_to_fp32_value).
inline float half_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = float_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = float_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t denormal = select_mask(two_w < (1u << 27));
  return float_from_bits(sign | (float_bits(denormalized) & denormal) |
                         (float_bits(normalized) & ~denormal));
}

// float -> IEEE half, round to nearest even (same as c10::detail::fp16_ieee_from_fp32_value).
inline uint16_t float_to_half(float f) {
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = float_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t bias = std::max(shl1_w & 0xFF000000u, 0x71000000u);
  base = float_from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = float_bits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  const uint32_t nan = select_mask(shl1_w > 0xFF000000u);
  return static_cast<uint16_t>((sign >> 16) | (0x7E00u & nan) | (nonsign & ~nan));
}

inline float bfloat16_to_float(uint16_t h) {
  return float_from_bits(static_cast<uint32_t>(h) << 16);
}

// float -> bfloat16, round to nearest even, NaN stays NaN (as c10::BFloat16).
inline uint16_t float_to_bfloat16(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(f != f ? 0x7FC0u : rounded);
}

// ---- Block access in the accumulation type. A kernel walks a row in blocks of at most kBlock
// elements; In reads a block of inputs and Out writes a block of results, both as
// accumulation-type values indexed from the block start. Most types convert element by element
// inside the kernel's SIMD loop. fp16 on F16C targets instead converts whole blocks with the
// hardware instruction through a stack buffer: GCC does not vectorize scalar fp16 conversions,
// and the bit-twiddling fallback is about twice as slow there (measured).

inline float to_acc(float x) { return x; }
inline double to_acc(double x) { return x; }
inline float to_acc(c10::BFloat16 x) { return bfloat16_to_float(x.x); }
inline float to_acc(c10::Half x) { return half_to_float(x.x); }

inline void from_acc(float* out, float v) { *out = v; }
inline void from_acc(double* out, double v) { *out = v; }
inline void from_acc(c10::BFloat16* out, float v) { out->x = float_to_bfloat16(v); }
inline void from_acc(c10::Half* out, float v) { out->x = float_to_half(v); }

template <class T>
struct In {
  const T* p;
  In(const T* data, int64_t) : p(data) {}
  auto operator[](int64_t i) const { return to_acc(p[i]); }
};

template <class T>
struct Out {
  T* p;
  explicit Out(T* data) : p(data) {}
  template <class A>
  void set(int64_t i, A v) { from_acc(p + i, v); }
  void flush(int64_t) {}
};

#ifdef WC_ISA_F16C
template <>
struct In<c10::Half> {
  float buf[kBlock];
  In(const c10::Half* data, int64_t n) {
    const auto* h = reinterpret_cast<const uint16_t*>(data);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
      _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(packed));
    }
    for (; i < n; ++i) buf[i] = half_to_float(h[i]);
  }
  float operator[](int64_t i) const { return buf[i]; }
};

template <>
struct Out<c10::Half> {
  c10::Half* p;
  float buf[kBlock];
  explicit Out(c10::Half* data) : p(data) {}
  void set(int64_t i, float v) { buf[i] = v; }
  void flush(int64_t n) {
    auto* h = reinterpret_cast<uint16_t*>(p);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_loadu_ps(buf + i);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i),
                       _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; ++i) h[i] = float_to_half(buf[i]);
  }
};
#endif

// ---- NFT loss. With a = v_old - v*, u = v_theta - v_old the two residuals are
// d+ = v+ - v* = a + beta*u and d- = v- - v* = a - beta*u. Sums run in the accumulation type
// within a block and join a double total per block: long rows stay accurate without slowing
// the SIMD loop.

// Pass 1 of the x0 space: sums of |d+| and |d-| over n elements of one row.
template <class T, class A>
void nft_abs_sums(const T* vt, const T* vo, const T* vs, int64_t n, A beta, double sums[2]) {
  double pos = 0.0, neg = 0.0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    const In<T> t(vt + start, m), o(vo + start, m), s(vs + start, m);
    A p = 0, q = 0;
#pragma omp simd reduction(+ : p, q)
    for (int64_t i = 0; i < m; ++i) {
      const A a = o[i] - s[i];
      const A u = t[i] - o[i];
      p += std::abs(a + beta * u);
      q += std::abs(a - beta * u);
    }
    pos += p;
    neg += q;
  }
  sums[0] = pos;
  sums[1] = neg;
}

// The fused pass: sums of d+^2 and d-^2, and the gradient grad = c_pos*d+ - c_neg*d- with
// per-row constants from the caller. Written from d+- directly (not regrouped by a and u),
// which keeps it exact when the two terms nearly cancel.
template <class T, class A>
void nft_square_sums_grad(const T* vt, const T* vo, const T* vs, T* grad, int64_t n, A beta,
                          A c_pos, A c_neg, double sums[2]) {
  double pos = 0.0, neg = 0.0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    const In<T> t(vt + start, m), o(vo + start, m), s(vs + start, m);
    Out<T> g(grad + start);
    A p = 0, q = 0;
#pragma omp simd reduction(+ : p, q)
    for (int64_t i = 0; i < m; ++i) {
      const A a = o[i] - s[i];
      const A u = t[i] - o[i];
      const A dp = a + beta * u;
      const A dn = a - beta * u;
      p += dp * dp;
      q += dn * dn;
      g.set(i, c_pos * dp - c_neg * dn);
    }
    g.flush(m);
    pos += p;
    neg += q;
  }
  sums[0] = pos;
  sums[1] = neg;
}

// ---- GRPO SDE loss. The step's residual is res = p - a*x - c*m (p: prev_sample, x: sample,
// m: model_output, a and c per row); the KL's is m - r (r: ref_output, null when absent).

// Sums of res^2 and (m - r)^2 (0 without r) over n elements of one row.
template <class T, class A>
void sde_sums(const T* m, const T* x, const T* p, const T* r, int64_t n, A a, A c,
              double sums[2]) {
  double res_total = 0.0, ref_total = 0.0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t len = std::min(kBlock, n - start);
    const In<T> mo(m + start, len), xs(x + start, len), ps(p + start, len);
    A s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < len; ++i) {
      const A res = ps[i] - a * xs[i] - c * mo[i];
      s += res * res;
    }
    res_total += s;
    if (r == nullptr) continue;
    const In<T> rs(r + start, len);
    A q = 0;
#pragma omp simd reduction(+ : q)
    for (int64_t i = 0; i < len; ++i) {
      const A delta = mo[i] - rs[i];
      q += delta * delta;
    }
    ref_total += q;
  }
  sums[0] = res_total;
  sums[1] = ref_total;
}

// The gradient w1*res + w2*(m - r) (w1*res without r) over n elements of one row.
template <class T, class A>
void sde_grad(const T* m, const T* x, const T* p, const T* r, T* grad, int64_t n, A a, A c,
              A w1, A w2) {
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t len = std::min(kBlock, n - start);
    const In<T> mo(m + start, len), xs(x + start, len), ps(p + start, len);
    Out<T> g(grad + start);
    if (r == nullptr) {
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) g.set(i, w1 * (ps[i] - a * xs[i] - c * mo[i]));
    } else {
      const In<T> rs(r + start, len);
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) {
        g.set(i, w1 * (ps[i] - a * xs[i] - c * mo[i]) + w2 * (mo[i] - rs[i]));
      }
    }
    g.flush(len);
  }
}

// ---- Streaming stores. A plain store first reads the cache line it writes (read for
// ownership), so a pass that reads one array and writes two moves five arrays' worth of bytes
// through memory where non-temporal stores move three; they bypass the cache, which only pays
// when the outputs would not stay in it anyway (native.cpp decides). stream_bytes copies a
// block staged in L1 to its destination that way: plain copies for the unaligned head and the
// tail, aligned streaming stores between. The caller issues an sfence before its results are
// read by another thread.
#if WC_HAVE_X86_VARIANTS
#ifdef WC_ISA_F16C
using StreamUnit = __m256i;
inline void stream_unit(char* d, const char* s) {
  _mm256_stream_si256(reinterpret_cast<__m256i*>(d),
                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
}
#else
using StreamUnit = __m128i;
inline void stream_unit(char* d, const char* s) {
  _mm_stream_si128(reinterpret_cast<__m128i*>(d),
                   _mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
}
#endif

inline void stream_bytes(void* dst, const void* src, int64_t n) {
  constexpr int64_t unit = sizeof(StreamUnit);
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  const int64_t head =
      std::min<int64_t>(n, static_cast<int64_t>((0 - reinterpret_cast<uintptr_t>(d)) & (unit - 1)));
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  for (; n >= unit; n -= unit, d += unit, s += unit) stream_unit(d, s);
  std::memcpy(d, s, n);
}
#else
inline void stream_bytes(void* dst, const void* src, int64_t n) { std::memcpy(dst, src, n); }
#endif

// ---- Flow noise for one x0 row segment of n elements and its k noisy copies, which lie
// `stride` elements apart in noise / x_t / v_target. The copies are written one after another,
// so each loop streams through three rows only (a handful of prefetch streams, not 3k); the
// x0 segment is read from memory once and then re-read from cache for every copy. With
// `stream` each block is computed into L1 buffers and streamed out (see stream_bytes).
template <class T, class A>
void flow_noise_segment(const T* x0, const A* sigmas, int64_t k, const T* noise, T* x_t,
                        T* v_target, int64_t n, int64_t stride, bool stream) {
  T xt_block[kBlock];
  T v_block[kBlock];
  for (int64_t j = 0; j < k; ++j) {
    const A sig = sigmas[j];
    const A keep = A(1) - sig;
    for (int64_t start = 0; start < n; start += kBlock) {
      const int64_t m = std::min(kBlock, n - start);
      const int64_t offset = j * stride + start;
      const In<T> x(x0 + start, m), e(noise + offset, m);
      Out<T> xt(stream ? xt_block : x_t + offset), v(stream ? v_block : v_target + offset);
#pragma omp simd
      for (int64_t i = 0; i < m; ++i) {
        xt.set(i, keep * x[i] + sig * e[i]);
        v.set(i, e[i] - x[i]);
      }
      xt.flush(m);
      v.flush(m);
      if (stream) {
        stream_bytes(x_t + offset, xt_block, m * static_cast<int64_t>(sizeof(T)));
        stream_bytes(v_target + offset, v_block, m * static_cast<int64_t>(sizeof(T)));
      }
    }
  }
}

}  // namespace WC_ISA
}  // namespace
}  // namespace wc_native
