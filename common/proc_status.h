#ifndef HYBRIDSERVE_COMMON_PROC_STATUS_H_
#define HYBRIDSERVE_COMMON_PROC_STATUS_H_

// Readings of a process's /proc/<pid>/status (Linux), for the tests and
// benchmarks that bound a process's memory or threads: our own process or a
// child we started. Thread-safe (each call opens the file anew).
//
// Resident memory is judged by its peak, VmHWM, which the kernel keeps for
// the process: a spike between two samples of VmRSS is still counted.
// ResetPeakResident starts a new peak, so each phase of a workload can be
// judged by its own.

#include <sys/types.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hybridserve::common {

// The number in field `field` of /proc/<pid>/status, in the field's unit
// (kB for the Vm* fields, a count for "Threads"). NOT_FOUND when the file
// cannot be read (no such process) or has no such field; DATA_LOSS when the
// field holds no number.
absl::StatusOr<int64_t> ProcStatusField(pid_t pid, absl::string_view field);

// VmRSS and VmHWM in bytes: the process's resident set now, and the most it
// has been since the process started or since ResetPeakResident.
absl::StatusOr<int64_t> ResidentBytes(pid_t pid);
absl::StatusOr<int64_t> PeakResidentBytes(pid_t pid);

// Resets the process's VmHWM to its current VmRSS by writing "5" to
// /proc/<pid>/clear_refs (Linux >= 4.0; the caller must be allowed to ptrace
// the process: itself, or a child of the same user). The error of the open
// or the write when the kernel refuses; the peak then still counts from
// the process's start.
absl::Status ResetPeakResident(pid_t pid);

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_PROC_STATUS_H_
