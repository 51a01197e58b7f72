#include "common/proc_status.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"

namespace hybridserve::common {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(ProcStatusTest, ReadsThisProcessesFieldsInTheirUnits) {
  absl::StatusOr<int64_t> threads = ProcStatusField(getpid(), "Threads");
  ASSERT_TRUE(threads.ok()) << threads.status();
  EXPECT_GE(*threads, 1);
  absl::StatusOr<int64_t> rss = ResidentBytes(getpid());
  absl::StatusOr<int64_t> peak = PeakResidentBytes(getpid());
  ASSERT_TRUE(rss.ok()) << rss.status();
  ASSERT_TRUE(peak.ok()) << peak.status();
  EXPECT_GT(*rss, 0);
  EXPECT_EQ(*rss % 1024, 0);  // kB in the file
  EXPECT_GE(*peak, *rss);
}

TEST(ProcStatusTest, AMissingFieldOrProcessIsAnErrorNotAReading) {
  EXPECT_EQ(ProcStatusField(getpid(), "NoSuchField").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ProcStatusField(getpid(), "VmHW").status().code(), absl::StatusCode::kNotFound);  // a prefix of VmHWM
  EXPECT_EQ(ProcStatusField(getpid(), "Name").status().code(), absl::StatusCode::kDataLoss);  // not a number
  // Above the kernel's pid_max (at most 2^22): never a live process.
  EXPECT_EQ(PeakResidentBytes(pid_t{1} << 23).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(ResetPeakResident(pid_t{1} << 23).ok());
}

// A 64 MiB spike, touched and unmapped between two readings, shows in VmHWM
// (never in a later VmRSS), and a reset forgets it. Margins of 8 MiB: the
// rest of the process may free or touch a few pages meanwhile.
TEST(ProcStatusTest, ThePeakKeepsASpikeThatIsGoneAndAResetForgetsIt) {
  const absl::Status reset = ResetPeakResident(getpid());
  ASSERT_TRUE(reset.ok()) << reset;
  absl::StatusOr<int64_t> before = ResidentBytes(getpid());
  ASSERT_TRUE(before.ok()) << before.status();
  const int64_t spike = 64 * kMiB;
  const int64_t margin = 8 * kMiB;
  void* p = mmap(nullptr, static_cast<size_t>(spike), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 1, static_cast<size_t>(spike));
  ASSERT_EQ(munmap(p, static_cast<size_t>(spike)), 0);
  absl::StatusOr<int64_t> after = ResidentBytes(getpid());
  absl::StatusOr<int64_t> peak = PeakResidentBytes(getpid());
  ASSERT_TRUE(after.ok() && peak.ok());
  EXPECT_GE(*peak, *before + spike - margin);
  EXPECT_LE(*after, *before + margin);
  ASSERT_TRUE(ResetPeakResident(getpid()).ok());
  absl::StatusOr<int64_t> reset_peak = PeakResidentBytes(getpid());
  ASSERT_TRUE(reset_peak.ok());
  EXPECT_LE(*reset_peak, *before + margin);
}

}  // namespace
}  // namespace hybridserve::common
