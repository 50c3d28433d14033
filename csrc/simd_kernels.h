// Inner loops of the native CPU kernels, compiled once per instruction set.
//
// native.cpp includes this file several times, each time with WC_ISA naming a different
// namespace and, on x86-64, under a different `#pragma GCC target`. Keeping every function
// in its own namespace means no inline function is shared between instruction sets, so code
// built for AVX2 can never be linked into the baseline path (which must run on any x86-64).
// Everything has internal linkage; there is deliberately no include guard. The file uses only
// the C++ standard library, the storage types c10::Half / c10::BFloat16 (as raw 16-bit words,
// none of their functions) and, under WC_ISA_F16C, the F16C intrinsics.
//
// All loops work on blocks of kBlock elements in the accumulation type A (float, or double for
// double inputs): 16-bit inputs are widened into stack buffers first, so the arithmetic loops
// are plain `#pragma omp simd` loops that the compiler vectorizes for the target at hand.

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

// ---- Widening loads: a block of n inputs as a pointer to accumulation-type values. Inputs
// that already have the accumulation type are used in place; the buffer is then unused.

inline const float* widen(const float* p, float*, int64_t) { return p; }
inline const double* widen(const double* p, double*, int64_t) { return p; }

inline const float* widen(const c10::BFloat16* p, float* buf, int64_t n) {
  const auto* h = reinterpret_cast<const uint16_t*>(p);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) buf[i] = bfloat16_to_float(h[i]);
  return buf;
}

inline const float* widen(const c10::Half* p, float* buf, int64_t n) {
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  int64_t i = 0;
#ifdef WC_ISA_F16C
  for (; i + 8 <= n; i += 8) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
    _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(packed));
  }
#endif
#pragma omp simd
  for (int64_t j = i; j < n; ++j) buf[j] = half_to_float(h[j]);
  return buf;
}

// ---- Narrowing stores: where a block of results in the accumulation type is computed
// (`target`), and how it reaches the output (`narrow`, a no-op when written in place).

inline float* target(float* out, float*) { return out; }
inline double* target(double* out, double*) { return out; }
inline float* target(c10::Half*, float* buf) { return buf; }
inline float* target(c10::BFloat16*, float* buf) { return buf; }

inline void narrow(float*, const float*, int64_t) {}
inline void narrow(double*, const double*, int64_t) {}

inline void narrow(c10::BFloat16* out, const float* buf, int64_t n) {
  auto* h = reinterpret_cast<uint16_t*>(out);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) h[i] = float_to_bfloat16(buf[i]);
}

inline void narrow(c10::Half* out, const float* buf, int64_t n) {
  auto* h = reinterpret_cast<uint16_t*>(out);
  int64_t i = 0;
#ifdef WC_ISA_F16C
  for (; i + 8 <= n; i += 8) {
    const __m128i packed = _mm256_cvtps_ph(_mm256_loadu_ps(buf + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i), packed);
  }
#endif
#pragma omp simd
  for (int64_t j = i; j < n; ++j) h[j] = float_to_half(buf[j]);
}

// ---- NFT loss. With a = v_old - v*, u = v_theta - v_old the two residuals are
// d+ = v+ - v* = a + beta*u and d- = v- - v* = a - beta*u.

// Pass 1 of the x0 space: sums of |d+| and |d-| over n elements of one row.
template <class T, class A>
void nft_abs_sums(const T* vt, const T* vo, const T* vs, int64_t n, A beta, double sums[2]) {
  A bt[kBlock], bo[kBlock], bs[kBlock];
  double pos = 0.0, neg = 0.0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    const A* t = widen(vt + start, bt, m);
    const A* o = widen(vo + start, bo, m);
    const A* s = widen(vs + start, bs, m);
    A p = 0, q = 0;
#pragma omp simd reduction(+ : p, q)
    for (int64_t i = 0; i < m; ++i) {
      const A a = o[i] - s[i];
      const A u = t[i] - o[i];
      p += std::abs(a + beta * u);
      q += std::abs(a - beta * u);
    }
    // Block sums join a double total: long rows stay accurate without slowing the SIMD loop.
    pos += p;
    neg += q;
  }
  sums[0] = pos;
  sums[1] = neg;
}

// The fused pass: sums of d+^2 and d-^2, and the gradient
// grad = c_pos*d+ - c_neg*d- = (c_pos - c_neg)*a + (c_pos + c_neg)*beta*u, written as
// grad = ga*a + gu*u with the per-row constants computed by the caller.
template <class T, class A>
void nft_square_sums_grad(const T* vt, const T* vo, const T* vs, T* grad, int64_t n, A beta,
                          A ga, A gu, double sums[2]) {
  A bt[kBlock], bo[kBlock], bs[kBlock], bg[kBlock];
  double pos = 0.0, neg = 0.0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    const A* t = widen(vt + start, bt, m);
    const A* o = widen(vo + start, bo, m);
    const A* s = widen(vs + start, bs, m);
    A* g = target(grad + start, bg);
    A p = 0, q = 0;
#pragma omp simd reduction(+ : p, q)
    for (int64_t i = 0; i < m; ++i) {
      const A a = o[i] - s[i];
      const A u = t[i] - o[i];
      const A dp = a + beta * u;
      const A dn = a - beta * u;
      p += dp * dp;
      q += dn * dn;
      g[i] = ga * a + gu * u;
    }
    narrow(grad + start, g, m);
    pos += p;
    neg += q;
  }
  sums[0] = pos;
  sums[1] = neg;
}

// ---- Flow noise for one x0 row segment of n elements and its k noisy copies, which lie
// `stride` elements apart in noise / x_t / v_target. Each x0 block is read once and reused
// for all k copies while it sits in L1.
template <class T, class A>
void flow_noise_segment(const T* x0, const A* sigmas, int64_t k, const T* noise, T* x_t,
                        T* v_target, int64_t n, int64_t stride) {
  A bx[kBlock], bn[kBlock], bxt[kBlock], bv[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    const A* x = widen(x0 + start, bx, m);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t offset = j * stride + start;
      const A* e = widen(noise + offset, bn, m);
      A* xt = target(x_t + offset, bxt);
      A* v = target(v_target + offset, bv);
      const A sig = sigmas[j];
      const A keep = A(1) - sig;
#pragma omp simd
      for (int64_t i = 0; i < m; ++i) {
        xt[i] = keep * x[i] + sig * e[i];
        v[i] = e[i] - x[i];
      }
      narrow(x_t + offset, xt, m);
      narrow(v_target + offset, v, m);
    }
  }
}

}  // namespace WC_ISA
}  // namespace
}  // namespace wc_native
