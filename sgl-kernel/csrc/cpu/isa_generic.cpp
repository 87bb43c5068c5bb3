// The kernels compiled for the generic instruction set; ops.cpp calls them only on CPUs that have it.
#include "kernels.h"
#include <immintrin.h>  // before the pragma: the intrinsics carry their own target attributes


namespace sglk {
namespace generic {
#define SGLK_VEC_BYTES 16  // the vector width the kernels are written for
constexpr int kVecBytes = SGLK_VEC_BYTES;
#include "kernels_impl.h"
#include "attention_impl.h"
#include "panels_impl.h"
#include "gguf_impl.h"
}  // namespace generic
}  // namespace sglk
