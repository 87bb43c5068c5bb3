// The kernels compiled for the avx2 instruction set; ops.cpp calls them only on CPUs that have it.
#include "kernels.h"
#include <immintrin.h>  // before the pragma: the intrinsics carry their own target attributes
#pragma GCC target("avx2,fma,f16c,bmi2")

namespace sglk {
namespace avx2 {
#define SGLK_VEC_BYTES 32  // the vector width the kernels are written for
constexpr int kVecBytes = SGLK_VEC_BYTES;
#include "kernels_impl.h"
#include "attention_impl.h"
#include "panels_impl.h"
#include "gguf_impl.h"
}  // namespace avx2
}  // namespace sglk
