// Four-value loads and stores of float, bfloat16 and half shared by the crate's kernels (norm,
// loss, rotary, gelu, embedding): fp32 in registers, the tensor's type in memory.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tcg::cuda {

// Four values of T at p (16 bytes for float, 8 for the 16-bit types), as floats.
template <typename T>
__device__ __forceinline__ float4 load4(const T* p);
template <>
__device__ __forceinline__ float4 load4<float>(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
template <>
__device__ __forceinline__ float4 load4<__nv_bfloat16>(const __nv_bfloat16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
template <>
__device__ __forceinline__ float4 load4<__half>(const __half* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}

// Four values of T as loaded, not yet widened to floats (8 bytes for the 16-bit types): half the
// registers of four floats while a kernel's loads are in flight (widen() once they are needed).
template <typename T>
struct Raw4 {
  uint2 u;
};
template <>
struct Raw4<float> {
  float4 f;
};
template <typename T>
__device__ __forceinline__ Raw4<T> load_raw4(const T* p) {
  return {*reinterpret_cast<const uint2*>(p)};
}
template <>
__device__ __forceinline__ Raw4<float> load_raw4<float>(const float* p) {
  return {load4<float>(p)};
}
template <typename T>
__device__ __forceinline__ float4 widen(const Raw4<T>& r) {
  return load4<T>(reinterpret_cast<const T*>(&r.u));
}
template <>
__device__ __forceinline__ float4 widen<float>(const Raw4<float>& r) {
  return r.f;
}

// a + b, value by value.
__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// Stores four floats at p as T (round to nearest even).
template <typename T>
__device__ __forceinline__ void store4(T* p, float4 v);
template <>
__device__ __forceinline__ void store4<float>(float* p, float4 v) {
  *reinterpret_cast<float4*>(p) = v;
}
template <>
__device__ __forceinline__ void store4<__nv_bfloat16>(__nv_bfloat16* p, float4 v) {
  __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<unsigned*>(&a);
  u.y = *reinterpret_cast<unsigned*>(&b);
  *reinterpret_cast<uint2*>(p) = u;
}
template <>
__device__ __forceinline__ void store4<__half>(__half* p, float4 v) {
  __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<unsigned*>(&a);
  u.y = *reinterpret_cast<unsigned*>(&b);
  *reinterpret_cast<uint2*>(p) = u;
}

// Cache-hinted twins, for a kernel that reads its data twice and must keep it in L2 between the
// reads: load4_last reads for the last time (ld.global.lu), store4_streaming writes what is not
// read again soon (st.global.cs), so neither evicts the data still to be re-read.
template <typename T>
__device__ __forceinline__ float4 load4_last(const T* p);
template <>
__device__ __forceinline__ float4 load4_last<float>(const float* p) {
  return __ldlu(reinterpret_cast<const float4*>(p));
}
template <>
__device__ __forceinline__ float4 load4_last<__nv_bfloat16>(const __nv_bfloat16* p) {
  const uint2 u = __ldlu(reinterpret_cast<const uint2*>(p));
  return load4(reinterpret_cast<const __nv_bfloat16*>(&u));
}
template <>
__device__ __forceinline__ float4 load4_last<__half>(const __half* p) {
  const uint2 u = __ldlu(reinterpret_cast<const uint2*>(p));
  return load4(reinterpret_cast<const __half*>(&u));
}

template <typename T>
__device__ __forceinline__ void store4_streaming(T* p, float4 v);
template <>
__device__ __forceinline__ void store4_streaming<float>(float* p, float4 v) {
  __stcs(reinterpret_cast<float4*>(p), v);
}
template <typename T>
__device__ __forceinline__ void store4_streaming(T* p, float4 v) {  // the 16-bit types: 8 bytes
  uint2 u;
  store4(reinterpret_cast<T*>(&u), v);
  __stcs(reinterpret_cast<uint2*>(p), u);
}

// One value of T at p, as a float; and one float stored as T.
__device__ __forceinline__ float load1(const float* p) { return *p; }
__device__ __forceinline__ float load1(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float load1(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ void store1(float* p, float v) { *p = v; }
__device__ __forceinline__ void store1(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store1(__half* p, float v) { *p = __float2half_rn(v); }

}  // namespace tcg::cuda
