#include "common/proc_status.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace hybridserve::common {

absl::StatusOr<int64_t> ProcStatusField(pid_t pid, absl::string_view field) {
  const std::string path = absl::StrCat("/proc/", pid, "/status");
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  const std::string prefix = absl::StrCat(field, ":");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, prefix)) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, " kB");
    int64_t value = 0;
    if (!absl::SimpleAtoi(rest, &value)) {
      return absl::DataLossError(absl::StrCat(path, ": field ", field, " holds \"", rest, "\", not a number"));
    }
    return value;
  }
  return absl::NotFoundError(absl::StrCat(path, " has no field ", field));
}

absl::StatusOr<int64_t> ResidentBytes(pid_t pid) {
  absl::StatusOr<int64_t> kb = ProcStatusField(pid, "VmRSS");
  if (!kb.ok()) return kb.status();
  return *kb * 1024;
}

absl::StatusOr<int64_t> PeakResidentBytes(pid_t pid) {
  absl::StatusOr<int64_t> kb = ProcStatusField(pid, "VmHWM");
  if (!kb.ok()) return kb.status();
  return *kb * 1024;
}

absl::Status ResetPeakResident(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/clear_refs");
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    const int open_errno = errno;
    return absl::Status(absl::ErrnoToStatusCode(open_errno),
                        absl::StrCat("open ", path, ": ", std::strerror(open_errno)));
  }
  const ssize_t written = write(fd, "5", 1);
  const int write_errno = errno;
  close(fd);
  if (written != 1) {
    return absl::Status(absl::ErrnoToStatusCode(write_errno),
                        absl::StrCat("write \"5\" to ", path, ": ", std::strerror(write_errno)));
  }
  return absl::OkStatus();
}

}  // namespace hybridserve::common
