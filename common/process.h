#ifndef HYBRIDSERVE_COMMON_PROCESS_H_
#define HYBRIDSERVE_COMMON_PROCESS_H_

namespace hybridserve::common {

// Process-wide settings for serving binaries (and benchmarks that stand in
// for them). Call once from main() before starting threads.
//  - glibc malloc: raise the mmap threshold to 64 MiB and the trim threshold
//    to 1 GiB, so 1-4 MiB transfer chunks are recycled from the heap instead
//    of being mmapped and unmapped (page-faulted) for every message.
//  - abseil: turn off Mutex deadlock detection (on by default in Debian's
//    build; it costs a few percent on every lock).
void TuneProcessForServing();

// Termination for serving binaries. Threads that libraries start before
// main() (OpenBLAS starts its pool from a constructor) never see a signal
// mask set in main, so a SIGTERM may land on any thread: this installs
// SIGTERM and SIGINT handlers (replacing glog's failure handler for these
// two) that only post a semaphore, whichever thread runs them. Call once from
// main() before starting threads; later signals are counted and ignored.
void InstallTerminationHandler();
// Blocks until the first SIGTERM or SIGINT since InstallTerminationHandler;
// returns its number.
int WaitForTerminationSignal();

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_PROCESS_H_
