#include "cachestore/index/shm_slab_allocator.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace hybridserve::cachestore {
namespace {

constexpr int kSlabSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

std::string ProcFdPath(int fd) { return absl::StrCat("/proc/self/fd/", fd); }

// A read-only descriptor of the file `fd` is open on; -1 and errno on failure.
int ReopenReadOnly(int fd) { return open(ProcFdPath(fd).c_str(), O_RDONLY | O_CLOEXEC); }

}  // namespace

struct ShmSlabAllocator::Slab {
  int rw_fd = -1;
  int ro_fd = -1;
  uint8_t* base = nullptr;
  size_t bytes = 0;
  size_t stride = 0;
  std::vector<uint32_t> free_slots;  // the next slot handed out is the last
  size_t room_index = 0;             // position in with_room_[stride] while a slot is free

  ~Slab() {
    if (base != nullptr) munmap(base, bytes);
    if (ro_fd >= 0) close(ro_fd);
    if (rw_fd >= 0) close(rw_fd);
  }
};

// Owned by a blob (Blob::shm_slot): releases the slot's memory and gives the
// slot back when the blob goes.
class ShmSlabAllocator::SlotRelease {
 public:
  SlotRelease(std::shared_ptr<ShmSlabAllocator> allocator, Slab* slab, uint32_t slot)
      : allocator_(std::move(allocator)), slab_(slab), slot_(slot) {}
  ~SlotRelease() {
    // The slot is still ours: nobody can be handed it while its memory goes.
    // A failure (none is expected of a tmpfs file opened for writing) leaves
    // the memory resident until the slab is closed.
    (void)fallocate(slab_->rw_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(slot_ * slab_->stride),
                    static_cast<off_t>(slab_->stride));
    allocator_->Free(slab_, slot_);
  }
  SlotRelease(const SlotRelease&) = delete;
  SlotRelease& operator=(const SlotRelease&) = delete;

 private:
  const std::shared_ptr<ShmSlabAllocator> allocator_;
  Slab* const slab_;
  const uint32_t slot_;
};

absl::Status ShmSlabAllocator::PrepareProcess() {
  const int fd = memfd_create("hybridserve-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory entries need memfd_create with sealing (Linux >= 3.17): ", std::strerror(errno)));
  }
  const int ro = ReopenReadOnly(fd);
  const int reopen_errno = errno;
  close(fd);
  if (ro < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory entries need to reopen a memfd read-only through /proc/self/fd (is /proc "
                     "mounted?): ",
                     std::strerror(reopen_errno)));
  }
  close(ro);
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    const rlim_t before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    const bool raised = before < limit.rlim_max && setrlimit(RLIMIT_NOFILE, &limit) == 0;
    LOG(INFO) << "shared-memory entries: two descriptors per slab of " << (kShmSlabTargetBytes >> 20)
              << " MiB (or per entry of more); RLIMIT_NOFILE soft limit "
              << (raised ? absl::StrCat("raised from ", before, " to ", limit.rlim_max)
                         : absl::StrCat(before, " (hard ", limit.rlim_max, ")"));
  }
  return absl::OkStatus();
}

std::shared_ptr<ShmSlabAllocator> ShmSlabAllocator::Create() {
  return std::shared_ptr<ShmSlabAllocator>(new ShmSlabAllocator());
}

ShmSlabAllocator::~ShmSlabAllocator() = default;

size_t ShmSlabAllocator::StrideOf(size_t size) {
  return std::max<size_t>(1, (size + kShmSlotAlignment - 1) / kShmSlotAlignment) * kShmSlotAlignment;
}

size_t ShmSlabAllocator::SlotsPerSlab(size_t stride) { return std::max<size_t>(1, kShmSlabTargetBytes / stride); }

absl::StatusOr<ShmSlabAllocator::Slab*> ShmSlabAllocator::NewSlab(size_t stride) {
  auto slab = std::make_unique<Slab>();
  slab->stride = stride;
  const size_t slots = SlotsPerSlab(stride);
  slab->bytes = slots * stride;
  auto fail = [&](absl::string_view what) {
    return absl::ResourceExhaustedError(
        absl::StrCat("shared-memory slab of ", slab->bytes, " bytes: ", what, ": ", std::strerror(errno)));
  };
  slab->rw_fd = memfd_create("hybridserve-cache-slab", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (slab->rw_fd < 0) return fail("memfd_create");
  if (ftruncate(slab->rw_fd, static_cast<off_t>(slab->bytes)) != 0) return fail("ftruncate");
  if (fcntl(slab->rw_fd, F_ADD_SEALS, kSlabSeals) != 0) return fail("sealing its size");
  slab->ro_fd = ReopenReadOnly(slab->rw_fd);
  if (slab->ro_fd < 0) return fail("reopening it read-only");
  // Nobody but root reopens it for writing through a descriptor of it now.
  if (fchmod(slab->rw_fd, S_IRUSR) != 0) return fail("fchmod 0400");
  void* p = mmap(nullptr, slab->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, slab->rw_fd, 0);
  if (p == MAP_FAILED) return fail("mmap");
  slab->base = static_cast<uint8_t*>(p);
  slab->free_slots.reserve(slots);
  for (size_t i = slots; i > 0; --i) slab->free_slots.push_back(static_cast<uint32_t>(i - 1));
  Slab* raw = slab.get();
  std::vector<Slab*>& room = with_room_[stride];
  raw->room_index = room.size();
  room.push_back(raw);
  mapped_bytes_ += static_cast<int64_t>(raw->bytes);
  slabs_.emplace(raw, std::move(slab));
  return raw;
}

absl::StatusOr<std::unique_ptr<Blob>> ShmSlabAllocator::Allocate(size_t size) {
  const size_t stride = StrideOf(size);
  if (stride < size) return absl::ResourceExhaustedError(absl::StrCat("no slot holds ", size, " bytes"));
  Slab* slab = nullptr;
  uint32_t slot = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = with_room_.find(stride);
    if (it != with_room_.end() && !it->second.empty()) {
      slab = it->second.back();
    } else {
      absl::StatusOr<Slab*> made = NewSlab(stride);
      if (!made.ok()) return made.status();
      slab = *made;
    }
    slot = slab->free_slots.back();
    slab->free_slots.pop_back();
    if (slab->free_slots.empty()) {
      // Full: off the list of slabs with room (swap with the last).
      std::vector<Slab*>& room = with_room_[stride];
      room[slab->room_index] = room.back();
      room[slab->room_index]->room_index = slab->room_index;
      room.pop_back();
    }
    ++slots_in_use_;
  }
  auto blob = std::make_unique<Blob>();
  uint8_t* bytes = slab->base + static_cast<size_t>(slot) * stride;
  blob->data = std::unique_ptr<uint8_t[], BlobBytesDeleter>(bytes, BlobBytesDeleter{size, /*in_slab=*/true});
  blob->size = size;
  blob->shm_fd = slab->ro_fd;
  blob->shm_write_fd = slab->rw_fd;
  blob->shm_offset = static_cast<uint64_t>(slot) * stride;
  blob->shm_slot = std::make_shared<SlotRelease>(shared_from_this(), slab, slot);
  return blob;
}

void ShmSlabAllocator::Free(Slab* slab, uint32_t slot) {
  std::unique_ptr<Slab> empty;  // closed after the lock
  absl::MutexLock lock(&mu_);
  --slots_in_use_;
  std::vector<Slab*>& room = with_room_[slab->stride];
  if (slab->free_slots.empty()) {
    slab->room_index = room.size();
    room.push_back(slab);
  }
  slab->free_slots.push_back(slot);
  if (slab->free_slots.size() < SlotsPerSlab(slab->stride)) return;
  // Its last slot: the slab goes.
  room[slab->room_index] = room.back();
  room[slab->room_index]->room_index = slab->room_index;
  room.pop_back();
  if (room.empty()) with_room_.erase(slab->stride);
  auto it = slabs_.find(slab);
  mapped_bytes_ -= static_cast<int64_t>(slab->bytes);
  empty = std::move(it->second);
  slabs_.erase(it);
}

ShmSlabAllocator::Counts ShmSlabAllocator::counts() const {
  absl::MutexLock lock(&mu_);
  return Counts{static_cast<int64_t>(slabs_.size()), slots_in_use_, mapped_bytes_};
}

}  // namespace hybridserve::cachestore
