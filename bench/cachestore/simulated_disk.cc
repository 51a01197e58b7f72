#include "bench/cachestore/simulated_disk.h"

#include <iterator>

namespace hybridserve::bench {

using cachestore::EntryClass;
using cachestore::Hash128;

void SimulatedDisk::Spill(const Hash128& key, const File& file) {
  if (files_.contains(key)) {
    ++stats_.spills_present;
    return;
  }
  if (file.bytes > budget_bytes_) {
    ++stats_.spills_refused;
    return;
  }
  while (bytes_ + file.bytes > budget_bytes_) {
    Remove(lru_.front());
    ++stats_.evictions;
  }
  lru_.push_back(key);
  files_.emplace(key, Slot{file, std::prev(lru_.end())});
  bytes_ += file.bytes;
  if (file.entry_class == EntryClass::kState) ++tail_lengths_[file.node][TailLength(file)];
  ++stats_.files_written;
  stats_.bytes_written += file.bytes;
}

const SimulatedDisk::File* SimulatedDisk::Find(const Hash128& key) const {
  auto it = files_.find(key);
  return it == files_.end() ? nullptr : &it->second.file;
}

SimulatedDisk::File SimulatedDisk::Read(const Hash128& key) {
  Slot& slot = files_.at(key);
  lru_.splice(lru_.end(), lru_, slot.lru);

  ++stats_.files_read;
  stats_.bytes_read += slot.file.bytes;
  return slot.file;
}

const std::map<int64_t, int>* SimulatedDisk::TailLengths(const Hash128& node) const {
  auto it = tail_lengths_.find(node);
  return it == tail_lengths_.end() ? nullptr : &it->second;
}

void SimulatedDisk::Remove(const Hash128& key) {
  auto it = files_.find(key);
  const File& f = it->second.file;
  if (f.entry_class == EntryClass::kState) {
    auto lengths = tail_lengths_.find(f.node);
    auto length = lengths->second.find(TailLength(f));
    if (--length->second == 0) lengths->second.erase(length);
    if (lengths->second.empty()) tail_lengths_.erase(lengths);
  }
  bytes_ -= f.bytes;
  lru_.erase(it->second.lru);
  files_.erase(it);
}

}  // namespace hybridserve::bench
