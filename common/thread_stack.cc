// Every explicit thread stack at least 1 MiB.
//
// Why: civetweb (Debian's build, used by prometheus-cpp's Exposer) starts its
// threads with 100 KiB stacks, and glibc carves each thread's static TLS out
// of its stack. In a process that also loads OpenBLAS (60 KiB of TLS) and glog
// (30 KiB), civetweb's threads are left ~10 KiB and crash in their first
// snprintf. No civetweb option sets the size, so the services interpose
// pthread_attr_setstacksize: a larger request is passed through unchanged, a
// smaller one is raised to 1 MiB (virtual memory, touched only as used).
// Linked into every binary that serves metrics (//common:metrics, alwayslink)
// and exported to shared libraries (-Wl,--export-dynamic-symbol).

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstddef>

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using SetStackSize = int (*)(pthread_attr_t*, size_t);
  static const SetStackSize real = reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  constexpr size_t kMinStack = size_t{1} << 20;
  return real(attr, std::max(size, kMinStack));
}
