#include "common/process.h"

#include <malloc.h>
#include <semaphore.h>
#include <signal.h>

#include <atomic>
#include <cerrno>

#include "absl/synchronization/mutex.h"

namespace hybridserve::common {
namespace {

sem_t g_termination;
std::atomic<int> g_signal{0};

void OnTermination(int sig) {
  int none = 0;
  // The first signal is the one reported; sem_post is async-signal-safe.
  if (g_signal.compare_exchange_strong(none, sig)) sem_post(&g_termination);
}

}  // namespace

void TuneProcessForServing(int max_heap_arenas) {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  if (max_heap_arenas > 0) mallopt(M_ARENA_MAX, max_heap_arenas);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

void InstallTerminationHandler() {
  sem_init(&g_termination, 0, 0);
  struct sigaction action {};
  action.sa_handler = OnTermination;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

int WaitForTerminationSignal() {
  while (sem_wait(&g_termination) != 0 && errno == EINTR) {
  }
  return g_signal.load();
}

}  // namespace hybridserve::common
