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
//  - `max_heap_arenas` > 0: at most that many malloc arenas. Each arena keeps
//    the chunks freed into it (the trim threshold above), and glibc gives
//    each busy thread its own, up to 8 per core: a process with many gRPC
//    threads then holds a heap per thread. The cachestore, whose resident
//    memory must follow its budgets, uses 2 (memory_bench, 96 MiB budgets:
//    after every entry expired 525 MiB resident with the default, 82 MiB
//    with 2).
void TuneProcessForServing(int max_heap_arenas = 0);

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
