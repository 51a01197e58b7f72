#ifndef HYBRIDSERVE_COMMON_SANITIZERS_H_
#define HYBRIDSERVE_COMMON_SANITIZERS_H_

// Whether this build runs under a sanitizer (ASan, TSan, MSan): tests that
// measure the allocator or the process's memory skip themselves there, since
// a sanitizer's allocator is not malloc's and its shadow memory is resident.

namespace hybridserve::common {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_SANITIZERS_H_
