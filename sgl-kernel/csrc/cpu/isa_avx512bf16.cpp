// The kernels compiled for AVX-512 with AVX512-BF16 (vdpbf16ps: the linear's bf16/int8 weights
// multiplied as bf16 pairs); ops.cpp calls them only on CPUs that have it.
#include "kernels.h"
#include <immintrin.h>  // before the pragma: the intrinsics carry their own target attributes
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c,bmi2,prefer-vector-width=512")

namespace sglk {
namespace avx512bf16 {
#define SGLK_VEC_BYTES 64  // the vector width the kernels are written for
#define SGLK_BF16_DOT 1    // the linear's vdpbf16ps path (g++ defines no ISA macros for a target pragma)
constexpr int kVecBytes = SGLK_VEC_BYTES;
#include "kernels_impl.h"
#include "attention_impl.h"
#include "panels_impl.h"
#include "gguf_impl.h"
}  // namespace avx512bf16
}  // namespace sglk
