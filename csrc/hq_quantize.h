// hotcompile: the C interface of the fused Hadamard + quantize kernel of HQ's g_x path
// (hq_quantize.cu), so the kernel builds with the CUDA toolkit alone and the torch glue
// (hq_quantize_bindings.cpp) stays separate.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

enum HqDtype { HQ_F32 = 0, HQ_BF16 = 1, HQ_F16 = 2 };
enum HqStatus { HQ_OK = 0, HQ_ERR_ARGS = 1, HQ_ERR_ROW_TOO_LONG = 2, HQ_ERR_LAUNCH = 3 };

// g_y [L, O] (row stride stride_g elements, unit column stride) -> codes [rows >= L, o_pad]
// (float8_e4m3fn, or int8 when out_int8; row stride stride_c bytes, a multiple of 16) and
// float32 scales ([rows] per token; [1] per tensor, which needs a zeroed int amax_tmp[1]).
// rounding: 0 nearest (half to even), 1 NITI pseudo-stochastic with pm bits.
int hq_quantize_launch(const void* gy, int in_dtype, void* codes, int out_int8, float* scales,
                       int* amax_tmp, int64_t L, int64_t O, int64_t rows, int64_t o_pad,
                       int64_t stride_g, int64_t stride_c, int per_token, float qmax,
                       int rounding, int pm, cudaStream_t stream);
