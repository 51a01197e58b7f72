// LD_PRELOAD shim for TSan runs against Debian's uninstrumented abseil:
// interposes absl::Mutex / CondVar / Notification and tells TSan about the
// happens-before edges they create (__tsan_acquire / __tsan_release on the
// mutex's address), then calls the real function (dlsym RTLD_NEXT).
// Loaded into -fsanitize=thread test binaries, which export the __tsan_*
// entry points (tools/run_tests.sh, the tsan stage). Without it TSan cannot
// see the happens-before edges of absl::Mutex, CondVar and Notification
// (Debian's abseil is not instrumented) and reports every access guarded by
// them as a race; with it, those reports vanish and a real race still shows
// (an unsynchronized poll of a slot written by another thread was reported,
// in the channel plane's tests, then transport/nccl_transport_test, before
// its fix). The symbol names are those of Debian 12's abseil 20220623 (inline namespace "debian3"): a shim that
// cannot find one aborts at once, naming it.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

// Weak: the preload reaches every process of a test run (bash, the test
// wrapper), and only TSan binaries define them; elsewhere the annotations are
// skipped.
extern "C" void __tsan_acquire(void* addr) __attribute__((weak));
extern "C" void __tsan_release(void* addr) __attribute__((weak));

namespace {
void TsanAcquire(void* addr) {
  if (__tsan_acquire != nullptr) __tsan_acquire(addr);
}
void TsanRelease(void* addr) {
  if (__tsan_release != nullptr) __tsan_release(addr);
}
template <typename F>
F Real(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan shim: no %s\n", name);
    std::abort();
  }
  return reinterpret_cast<F>(f);
}
void* Addr(const void* p) { return const_cast<void*>(p); }
// Notification::notified_yet_ follows its Mutex (notification.h).
void* NotifiedYet(const absl::Notification* n) {
  return const_cast<char*>(reinterpret_cast<const char*>(n) + sizeof(absl::Mutex));
}
// A waiter's Condition is evaluated inside the real call with the mutex held
// (by the waiter or by the unlocking thread), where the annotations above
// cannot see it: wrap it so each evaluation acquires and releases the mutex.
struct Wrapped {
  const absl::Condition* cond;
  absl::Mutex* mu;
};
bool EvalWrapped(Wrapped* w) {
  TsanAcquire(w->mu);
  const bool r = w->cond->Eval();
  TsanRelease(w->mu);
  return r;
}
}  // namespace

#define NS "_ZN4absl7debian3"

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>(NS "5Mutex4LockEv");
  real(this);
  TsanAcquire(this);
}
void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>(NS "5Mutex10ReaderLockEv");
  real(this);
  TsanAcquire(this);
}
bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>(NS "5Mutex7TryLockEv");
  const bool r = real(this);
  if (r) TsanAcquire(this);
  return r;
}
bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>(NS "5Mutex13ReaderTryLockEv");
  const bool r = real(this);
  if (r) TsanAcquire(this);
  return r;
}
void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>(NS "5Mutex6UnlockEv");
  TsanRelease(this);
  real(this);
}
void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>(NS "5Mutex12ReaderUnlockEv");
  TsanRelease(this);
  real(this);
}
void Mutex::Await(const Condition& c) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(NS "5Mutex5AwaitERKNS0_9ConditionE");
  TsanRelease(this);
  Wrapped w{&c, this};
  real(this, absl::Condition(&EvalWrapped, &w));
  TsanAcquire(this);
}
bool Mutex::AwaitWithTimeout(const Condition& c, absl::Duration t) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      NS "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  TsanRelease(this);
  Wrapped w{&c, this};
  const bool r = real(this, absl::Condition(&EvalWrapped, &w), t);
  TsanAcquire(this);
  return r;
}
bool Mutex::AwaitWithDeadline(const Condition& c, absl::Time t) {
  static auto real =
      Real<bool (*)(Mutex*, const Condition&, absl::Time)>(NS "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  TsanRelease(this);
  Wrapped w{&c, this};
  const bool r = real(this, absl::Condition(&EvalWrapped, &w), t);
  TsanAcquire(this);
  return r;
}
void Mutex::LockWhen(const Condition& c) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(NS "5Mutex8LockWhenERKNS0_9ConditionE");
  Wrapped w{&c, this};
  real(this, absl::Condition(&EvalWrapped, &w));
  TsanAcquire(this);
}
void Mutex::ReaderLockWhen(const Condition& c) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(NS "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Wrapped w{&c, this};
  real(this, absl::Condition(&EvalWrapped, &w));
  TsanAcquire(this);
}
bool Mutex::LockWhenWithTimeout(const Condition& c, absl::Duration t) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      NS "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Wrapped w{&c, this};
  const bool r = real(this, absl::Condition(&EvalWrapped, &w), t);
  TsanAcquire(this);
  return r;
}
bool Mutex::LockWhenWithDeadline(const Condition& c, absl::Time t) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      NS "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Wrapped w{&c, this};
  const bool r = real(this, absl::Condition(&EvalWrapped, &w), t);
  TsanAcquire(this);
  return r;
}
bool Mutex::ReaderLockWhenWithTimeout(const Condition& c, absl::Duration t) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      NS "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Wrapped w{&c, this};
  const bool r = real(this, absl::Condition(&EvalWrapped, &w), t);
  TsanAcquire(this);
  return r;
}
bool Mutex::ReaderLockWhenWithDeadline(const Condition& c, absl::Time t) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      NS "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Wrapped w{&c, this};
  const bool r = real(this, absl::Condition(&EvalWrapped, &w), t);
  TsanAcquire(this);
  return r;
}

void CondVar::Wait(Mutex* mu) {
  static auto real = Real<void (*)(CondVar*, Mutex*)>(NS "7CondVar4WaitEPNS0_5MutexE");
  TsanRelease(mu);
  real(this, mu);
  TsanAcquire(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration t) {
  static auto real =
      Real<bool (*)(CondVar*, Mutex*, absl::Duration)>(NS "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  TsanRelease(mu);
  const bool r = real(this, mu, t);
  TsanAcquire(mu);
  return r;
}
bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time t) {
  static auto real =
      Real<bool (*)(CondVar*, Mutex*, absl::Time)>(NS "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  TsanRelease(mu);
  const bool r = real(this, mu, t);
  TsanAcquire(mu);
  return r;
}

void Notification::Notify() {
  static auto real = Real<void (*)(Notification*)>(NS "12Notification6NotifyEv");
  TsanRelease(this);
  TsanRelease(NotifiedYet(this));
  real(this);
}
void Notification::WaitForNotification() const {
  static auto real = Real<void (*)(const Notification*)>("_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  TsanAcquire(Addr(this));
}
bool Notification::WaitForNotificationWithTimeout(absl::Duration t) const {
  static auto real = Real<bool (*)(const Notification*, absl::Duration)>(
      "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool r = real(this, t);
  if (r) TsanAcquire(Addr(this));
  return r;
}
bool Notification::WaitForNotificationWithDeadline(absl::Time t) const {
  static auto real = Real<bool (*)(const Notification*, absl::Time)>(
      "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool r = real(this, t);
  if (r) TsanAcquire(Addr(this));
  return r;
}

// A Status's heap rep is reference counted with an atomic decrement inside
// libabsl_status: every unref releases, and acquires what earlier unrefs
// released, so the last one (which frees the rep) comes after every use.
void Status::UnrefNonInlined(uintptr_t rep) {
  static auto real = Real<void (*)(uintptr_t)>(NS "6Status15UnrefNonInlinedEm");
  TsanRelease(reinterpret_cast<void*>(rep));
  TsanAcquire(reinterpret_cast<void*>(rep));
  real(rep);
}

ABSL_NAMESPACE_END
}  // namespace absl
