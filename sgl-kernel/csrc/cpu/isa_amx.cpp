// The kernels compiled for AVX-512 with AVX512-BF16 and AMX (AMX-TILE, AMX-BF16): the avx512bf16
// set, whose bf16 panel linear and bf16 extend attention run on tiles (panels_amx_impl.h,
// attention_amx_impl.h). ops.cpp calls them only on CPUs
// that have AMX and once Linux has granted the process the tile state.
#include "kernels.h"
#include <immintrin.h>  // before the pragma: the intrinsics carry their own target attributes
#include <memory>
#include <vector>
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c,bmi2,amx-tile,amx-bf16,prefer-vector-width=512")

namespace sglk {
namespace amx {
#define SGLK_VEC_BYTES 64  // the vector width the kernels are written for
#define SGLK_BF16_DOT 1    // the linear's vdpbf16ps path (g++ defines no ISA macros for a target pragma)
#define SGLK_AMX 1         // bf16 panels and extend attention on tiles
constexpr int kVecBytes = SGLK_VEC_BYTES;
#include "kernels_impl.h"
#include "amx_tiles.h"
#include "attention_impl.h"
#include "panels_impl.h"
#include "gguf_impl.h"
}  // namespace amx
}  // namespace sglk
