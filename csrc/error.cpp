// Errors: the thread-local message slot, the mapping from C++ exception types to statuses, and
// fault injection for tests of failure paths.
#include "shim.h"

#include <cstdlib>
#include <cstring>

namespace {

thread_local std::string last_error;
thread_local bool has_error = false;
// Set when storing a message failed (no memory): take_last_error reports that instead.
thread_local bool message_lost = false;
thread_local std::string armed_failpoint;

// CUDA runtime codes (driver_types.h) that libtorch reports through c10::AcceleratorError.
// Spelled as numbers so this file builds without CUDA headers; cuda/graph.cpp static_asserts
// them against the headers.
constexpr int32_t kCudaErrorMemoryAllocation = 2;
constexpr int32_t kCudaErrorStreamCaptureFirst = 900;  // cudaErrorStreamCaptureUnsupported
constexpr int32_t kCudaErrorStreamCaptureLast = 908;   // cudaErrorStreamCaptureWrongThread

tcg_status status_of_accelerator_code(int32_t code) {
  if (code == kCudaErrorMemoryAllocation) return TCG_OUT_OF_MEMORY;
  if (code >= kCudaErrorStreamCaptureFirst && code <= kCudaErrorStreamCaptureLast) {
    return TCG_CAPTURE_INVALIDATED;  // an operation illegal during capture: CUDA invalidated it
  }
  return TCG_ERROR;
}

}  // namespace

namespace tcg {

static_assert(kCudaErrorStreamCaptureLast - kCudaErrorStreamCaptureFirst == 8,
              "the stream-capture error codes form one range");

tcg_status fail(tcg_status status, const char* msg) noexcept {
  try {
    last_error.assign(msg == nullptr ? "" : msg);
    message_lost = false;
  } catch (...) {
    message_lost = true;
  }
  has_error = true;
  return status;
}

tcg_status fail_current_exception() noexcept {
  try {
    throw;
  } catch (const exception& e) {
    return fail(e.status, e.msg.c_str());
  } catch (const c10::DistError& e) {
    return fail(TCG_DIST, e.what_without_backtrace());
  } catch (const c10::OutOfMemoryError& e) {
    return fail(TCG_OUT_OF_MEMORY, e.what_without_backtrace());
  } catch (const c10::AcceleratorError& e) {
    return fail(status_of_accelerator_code(e.get_error_code()), e.what_without_backtrace());
  } catch (const c10::Error& e) {
    return fail(TCG_ERROR, e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    return fail(TCG_OUT_OF_MEMORY, "host out of memory (std::bad_alloc)");
  } catch (const std::exception& e) {
    return fail(TCG_ERROR, e.what());
  } catch (...) {
    return fail(TCG_ERROR, "unknown C++ exception in tch-cuda-graphs shim");
  }
}

bool failpoint(const char* point) noexcept {
  if (armed_failpoint.empty() || armed_failpoint != point) return false;
  armed_failpoint.clear();
  return true;
}

}  // namespace tcg

extern "C" {

char* tcg_error_take_last(void) {
  if (!has_error) return nullptr;
  const char* src = message_lost ? "(the error message could not be stored: out of memory)"
                                 : last_error.c_str();
  size_t len = std::strlen(src);
  char* s = static_cast<char*>(std::malloc(len + 1));
  if (s != nullptr) std::memcpy(s, src, len + 1);
  has_error = false;
  message_lost = false;
  last_error.clear();
  return s;
}

void tcg_string_free(char* s) { std::free(s); }

tcg_status tcg_testing_fail_next(const char* point) {
  return tcg::guard([&] { armed_failpoint = point == nullptr ? "" : point; });
}

}  // extern "C"
