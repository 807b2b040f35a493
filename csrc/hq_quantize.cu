// HQ's g_x operand in one pass: 16-block Walsh-Hadamard along O, per-row (or given) scale,
// rounding, INT4-grid codes written as float8_e4m3fn (or int8) for the GEMM.
//
// Why CUDA and not Triton: each thread owns whole 16-blocks (two 16-byte loads of bf16), so
// the butterfly runs in registers and the codes leave as one 16-byte store per block. Triton
// spreads a 16-block over two threads and its reshape/permute butterfly becomes layout
// conversions through shared memory (the Triton kernel ran at ~1/3 of the HBM roofline).
//
// Bit-exactness with hotcompile.quant.quantize(block_hadamard(g_y, 1, 16)): the butterfly
// stages run in float32 in the order of hadamard.fwht_last (h = 1, 2, 4, 8; (a, b) -> (a+b,
// a-b)); the row max-abs is a max over the float bits of |x| (NaN propagates); the scale is
// normal_scale(max-abs * float(1/qmax)); v = x * (1/s) with the correctly rounded reciprocal
// (__frcp_rn, as torch.reciprocal; one per row, quant.inverse);
// nearest = round-half-even (rintf), pseudo-stochastic = NITI's rule of quant.round_magnitude.
//
// This file needs only the CUDA toolkit (no torch headers), so CI compile-checks it for sm_90a
// on a CPU machine; hq_quantize_bindings.cpp is the torch glue.
//
// Layout: one CTA per row; blockDim.x = threads per row (a multiple of 32), each thread holds
// NB blocks of the row in registers (blocks t, t + T, ...). Rows past L (padding of the GEMM's
// M) get zero codes and a zero scale.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "hq_quantize.h"

namespace {

template <typename T>
__device__ __forceinline__ float to_f(T v);
template <>
__device__ __forceinline__ float to_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }

// the elements of one 32-bit word as floats (bit operations only: no local-memory round trip)
template <typename T>
struct Word;
template <>
struct Word<float> {
  static constexpr int kN = 1;
  __device__ static __forceinline__ void unpack(uint32_t w, float* o) { o[0] = __uint_as_float(w); }
};
template <>
struct Word<__nv_bfloat16> {
  static constexpr int kN = 2;
  __device__ static __forceinline__ void unpack(uint32_t w, float* o) {
    o[0] = __uint_as_float(w << 16);
    o[1] = __uint_as_float(w & 0xffff0000u);
  }
};
template <>
struct Word<__half> {
  static constexpr int kN = 2;
  __device__ static __forceinline__ void unpack(uint32_t w, float* o) {
    o[0] = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
    o[1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
};

// 16 consecutive elements of a row from column c0 (zeros past O); 16-byte loads when aligned
template <typename T>
__device__ __forceinline__ void load16(const T* __restrict__ row, int64_t c0, int64_t O,
                                       bool vec_ok, float (&v)[16]) {
  constexpr int kPerVec = 4 * Word<T>::kN;  // elements per 16-byte vector
  if (vec_ok && c0 + 16 <= O) {
    const uint4* p = reinterpret_cast<const uint4*>(row + c0);
#pragma unroll
    for (int q = 0; q < 16 / kPerVec; ++q) {
      const uint4 u = __ldg(p + q);
      Word<T>::unpack(u.x, &v[q * kPerVec + 0 * Word<T>::kN]);
      Word<T>::unpack(u.y, &v[q * kPerVec + 1 * Word<T>::kN]);
      Word<T>::unpack(u.z, &v[q * kPerVec + 2 * Word<T>::kN]);
      Word<T>::unpack(u.w, &v[q * kPerVec + 3 * Word<T>::kN]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) v[j] = (c0 + j < O) ? to_f<T>(row[c0 + j]) : 0.0f;
  }
}

// one stage of hadamard.fwht_last: pairs (j, j + H) of each 2H-run -> (a + b, a - b)
template <int H>
__device__ __forceinline__ void stage(float (&v)[16]) {
#pragma unroll
  for (int i = 0; i < 16; i += 2 * H) {
#pragma unroll
    for (int j = 0; j < H; ++j) {
      const float a = v[i + j], b = v[i + j + H];
      v[i + j] = a + b;
      v[i + j + H] = a - b;
    }
  }
}

// the stages of hadamard.fwht_last, in its order (fully unrolled: v stays in registers)
__device__ __forceinline__ void fwht16(float (&v)[16]) {
  stage<1>(v);
  stage<2>(v);
  stage<4>(v);
  stage<8>(v);
}

// quant.normal_scale: a positive scale raised to the smallest normal float (a finite
// reciprocal); 0, NaN and Inf unchanged
__device__ __forceinline__ float normal_scale(float s) {
  return s > 0.0f ? fmaxf(s, FLT_MIN) : s;
}

// quant.inverse: 1/s, or 1 where there is no usable scale (0, NaN, Inf)
__device__ __forceinline__ float inverse(float s) {
  const bool ok = (s > 0.0f) && (s <= FLT_MAX);
  return __frcp_rn(ok ? s : 1.0f);
}

// the code of x * inv, inv = inverse(s) (rounding.codes / quant.quantize), as a float integer
// in [-qmax, qmax]
__device__ __forceinline__ float code(float x, float inv, float qmax, int rounding, int pm) {
  float v = x * inv;
  if (v != v) v = 0.0f;
  if (v > FLT_MAX) v = qmax;
  if (v < -FLT_MAX) v = -qmax;
  const float a = fabsf(v);
  float r;
  if (rounding == 0) {
    r = rintf(a);  // round half to even
  } else {
    const float fl = floorf(a);
    const float frac = a - fl;
    const int f = static_cast<int>(floorf(frac * static_cast<float>(1 << (2 * pm))));
    r = fl + (((f >> pm) > (f & ((1 << pm) - 1))) ? 1.0f : 0.0f);
  }
  const float mag = fminf(r, qmax);
  return v < 0.0f ? -mag : mag;
}

// the byte of a code: e4m3 (integers |c| <= 16 are exact there) or int8
template <typename OutT>
__device__ __forceinline__ uint8_t encode(float c);
template <>
__device__ __forceinline__ uint8_t encode<__nv_fp8_e4m3>(float c) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(c, __NV_SATFINITE, __NV_E4M3));
}
template <>
__device__ __forceinline__ uint8_t encode<int8_t>(float c) {
  return static_cast<uint8_t>(static_cast<int8_t>(c));
}

template <typename T, typename OutT, int NB>
__global__ void hq_quantize_rows_kernel(const T* __restrict__ gy, OutT* __restrict__ codes,
                                        float* __restrict__ scales,
                                        const float* __restrict__ given_scale, int64_t L,
                                        int64_t O, int64_t nblk, int64_t stride_g,
                                        int64_t stride_c, float qmax, float inv_q, int rounding,
                                        int pm, bool vec_ok) {
  const int64_t r = blockIdx.x;
  const int t = threadIdx.x;
  const int T_ = blockDim.x;
  OutT* crow = codes + r * stride_c;
  if (r >= L) {  // padding row of the GEMM: zero codes, zero scale
    for (int64_t b = t; b < nblk; b += T_) {
      *reinterpret_cast<uint4*>(crow + 16 * b) = make_uint4(0, 0, 0, 0);
    }
    if (t == 0 && given_scale == nullptr) scales[r] = 0.0f;
    return;
  }
  const T* row = gy + r * stride_g;
  float v[NB][16];
  int bits = 0;  // max over |x| as int bits (non-negative floats order like their bits)
#pragma unroll
  for (int k = 0; k < NB; ++k) {
    const int64_t b = t + static_cast<int64_t>(k) * T_;
    if (b < nblk) {
      load16<T>(row, 16 * b, O, vec_ok, v[k]);
      fwht16(v[k]);
#pragma unroll
      for (int j = 0; j < 16; ++j) bits = max(bits, __float_as_int(fabsf(v[k][j])));
    }
  }
  float s;
  if (given_scale != nullptr) {
    s = *given_scale;
  } else {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, off));
    __shared__ int warp_bits[32];
    const int warp = t >> 5, lane = t & 31;
    if (T_ > 32) {
      if (lane == 0) warp_bits[warp] = bits;
      __syncthreads();
      if (warp == 0) {
        int w = lane < (T_ >> 5) ? warp_bits[lane] : 0;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) w = max(w, __shfl_xor_sync(0xffffffffu, w, off));
        if (lane == 0) warp_bits[0] = w;
      }
      __syncthreads();
      bits = warp_bits[0];
    }
    s = normal_scale(__int_as_float(bits) * inv_q);
    if (t == 0) scales[r] = s;
  }
  const float inv = inverse(s);
#pragma unroll
  for (int k = 0; k < NB; ++k) {
    const int64_t b = t + static_cast<int64_t>(k) * T_;
    if (b < nblk) {
      uint32_t w0 = 0u, w1 = 0u, w2 = 0u, w3 = 0u;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w0 |= uint32_t(encode<OutT>(code(v[k][j], inv, qmax, rounding, pm))) << (8 * j);
        w1 |= uint32_t(encode<OutT>(code(v[k][4 + j], inv, qmax, rounding, pm))) << (8 * j);
        w2 |= uint32_t(encode<OutT>(code(v[k][8 + j], inv, qmax, rounding, pm))) << (8 * j);
        w3 |= uint32_t(encode<OutT>(code(v[k][12 + j], inv, qmax, rounding, pm))) << (8 * j);
      }
      *reinterpret_cast<uint4*>(crow + 16 * b) = make_uint4(w0, w1, w2, w3);
    }
  }
}

// per-tensor: the max-abs of the transformed g_y over all rows, into one int (atomicMax)
template <typename T>
__global__ void hq_amax_kernel(const T* __restrict__ gy, int* __restrict__ amax, int64_t L,
                               int64_t O, int64_t nblk, int64_t stride_g, bool vec_ok) {
  const int64_t total = L * nblk;
  int bits = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / nblk, b = i % nblk;
    float v[16];
    load16<T>(gy + r * stride_g, 16 * b, O, vec_ok, v);
    fwht16(v);
#pragma unroll
    for (int j = 0; j < 16; ++j) bits = max(bits, __float_as_int(fabsf(v[j])));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, off));
  if ((threadIdx.x & 31) == 0) atomicMax(amax, bits);
}

__global__ void amax_to_scale_kernel(const int* __restrict__ amax, float* __restrict__ scale,
                                     float inv_q) {
  scale[0] = normal_scale(__int_as_float(amax[0]) * inv_q);
}

constexpr int kMaxThreads = 256;  // per row; rows longer than 256·4·16 = 16384 are refused

template <typename T, typename OutT>
int launch_rows(const T* gy, OutT* codes, float* scales, const float* given, int64_t L,
                int64_t O, int64_t rows, int64_t nblk, int64_t stride_g, int64_t stride_c,
                float qmax, int rounding, int pm, bool vec_ok, cudaStream_t stream) {
  // threads per row: a multiple of 32 with at most 4 blocks per thread (registers: 64
  // floats), at most 256 threads (so up to ~64 registers per thread always fit the SM's
  // register file: a 1024-thread launch of the NB = 4 kernel is refused by the driver)
  int64_t per = (nblk + 31) / 32;  // blocks per thread with one warp
  int threads = 32;
  while (per > 4 && threads < kMaxThreads) {
    threads *= 2;
    per = (nblk + threads - 1) / threads;
  }
  if (per > 4) return HQ_ERR_ROW_TOO_LONG;
  if (rows == 0 || nblk == 0) return HQ_OK;
  const float inv_q = 1.0f / qmax;
  const dim3 grid(static_cast<unsigned>(rows)), block(threads);
#define HQ_LAUNCH(NB)                                                                       \
  hq_quantize_rows_kernel<T, OutT, NB><<<grid, block, 0, stream>>>(                         \
      gy, codes, scales, given, L, O, nblk, stride_g, stride_c, qmax, inv_q, rounding, pm, \
      vec_ok)
  if (per <= 1) {
    HQ_LAUNCH(1);
  } else if (per <= 2) {
    HQ_LAUNCH(2);
  } else if (per <= 3) {
    HQ_LAUNCH(3);
  } else {
    HQ_LAUNCH(4);
  }
#undef HQ_LAUNCH
  return cudaGetLastError() == cudaSuccess ? HQ_OK : HQ_ERR_LAUNCH;
}

template <typename T, typename OutT>
int run(const void* gy_, void* codes_, float* scales, int* amax_tmp, int64_t L, int64_t O,
        int64_t rows, int64_t o_pad, int64_t stride_g, int64_t stride_c, bool per_token,
        float qmax, int rounding, int pm, cudaStream_t stream) {
  const T* gy = static_cast<const T*>(gy_);
  OutT* codes = static_cast<OutT*>(codes_);
  const int64_t nblk = o_pad / 16;
  const bool vec_ok = (reinterpret_cast<uintptr_t>(gy) % 16 == 0) &&
                      ((stride_g * static_cast<int64_t>(sizeof(T))) % 16 == 0);
  if (per_token) {
    return launch_rows<T, OutT>(gy, codes, scales, nullptr, L, O, rows, nblk, stride_g,
                                stride_c, qmax, rounding, pm, vec_ok, stream);
  }
  // per tensor: max-abs of all rows into amax_tmp (zeroed by the caller), then the scale
  if (L > 0 && nblk > 0) {
    const int threads = 256;
    const int64_t work = (L * nblk + threads - 1) / threads;
    const int blocks = static_cast<int>(std::min<int64_t>(work, 132 * 16));
    hq_amax_kernel<T><<<blocks, threads, 0, stream>>>(gy, amax_tmp, L, O, nblk, stride_g,
                                                      vec_ok);
  }
  amax_to_scale_kernel<<<1, 1, 0, stream>>>(amax_tmp, scales, 1.0f / qmax);
  if (cudaGetLastError() != cudaSuccess) return HQ_ERR_LAUNCH;
  return launch_rows<T, OutT>(gy, codes, scales, scales, L, O, rows, nblk, stride_g, stride_c,
                              qmax, rounding, pm, vec_ok, stream);
}

}  // namespace

int hq_quantize_launch(const void* gy, int in_dtype, void* codes, int out_int8, float* scales,
                       int* amax_tmp, int64_t L, int64_t O, int64_t rows, int64_t o_pad,
                       int64_t stride_g, int64_t stride_c, int per_token, float qmax,
                       int rounding, int pm, cudaStream_t stream) {
  if (o_pad % 16 != 0 || o_pad < O || stride_c % 16 != 0 || rows < L) return HQ_ERR_ARGS;
  if (rounding != 0 && rounding != 1) return HQ_ERR_ARGS;
#define HQ_RUN(T)                                                                           \
  return out_int8 ? run<T, int8_t>(gy, codes, scales, amax_tmp, L, O, rows, o_pad, stride_g, \
                                   stride_c, per_token, qmax, rounding, pm, stream)          \
                  : run<T, __nv_fp8_e4m3>(gy, codes, scales, amax_tmp, L, O, rows, o_pad,    \
                                          stride_g, stride_c, per_token, qmax, rounding, pm, \
                                          stream)
  switch (in_dtype) {
    case HQ_F32:
      HQ_RUN(float);
    case HQ_BF16:
      HQ_RUN(__nv_bfloat16);
    case HQ_F16:
      HQ_RUN(__half);
    default:
      return HQ_ERR_ARGS;
  }
#undef HQ_RUN
}
