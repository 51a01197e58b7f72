#ifndef HYBRIDSERVE_ENGINE_SAFETENSORS_H_
#define HYBRIDSERVE_ENGINE_SAFETENSORS_H_

// Reader of the safetensors format (https://github.com/huggingface/safetensors):
//
//   [u64 little-endian N][N bytes of JSON header, may end in spaces][data]
//   header = {"__metadata__": {str: str}?, name: {"dtype": "F32", "shape": [..],
//             "data_offsets": [begin, end]}, ...}, offsets relative to data.
//
// The file is mapped read-only and never trusted: Open checks the header length
// against the file, the JSON and its types, dtype * shape against each offset
// pair, and that the tensors tile the data section exactly (no overlap, no
// hole, no trailing bytes, as the reference implementation requires). Any
// violation is INVALID_ARGUMENT naming the tensor; a dtype this reader does not
// convert is UNIMPLEMENTED. Nothing a file contains can crash the reader.
//
// Sharded checkpoints (`model.safetensors.index.json` with a `weight_map` from
// tensor name to shard file) are read by SafetensorsCheckpoint.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace hybridserve::engine {

enum class DType {
  kF32,   // "F32"
  kBF16,  // "BF16"
  kF16,   // "F16"
  kI32,   // "I32"
  kI64,   // "I64"
};

absl::string_view DTypeName(DType dtype);  // the header spelling, e.g. "BF16"
size_t DTypeSize(DType dtype);             // bytes per element

// Where a tensor lies in its file.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // empty for a scalar
  uint64_t data_begin = 0;     // byte offsets into the data section, begin <= end
  uint64_t data_end = 0;

  int64_t num_elements() const;  // product of shape (1 for a scalar)
  uint64_t num_bytes() const { return data_end - data_begin; }
};

// A tensor's bytes inside a mapped file. Valid while the file that returned it
// lives. The bytes are little-endian and may be unaligned: read them with
// memcpy or through ConvertToFloat32.
struct TensorView {
  absl::string_view name;
  DType dtype = DType::kF32;
  absl::Span<const int64_t> shape;
  absl::Span<const uint8_t> bytes;

  int64_t num_elements() const;
};

// One safetensors file. Immutable after Open; thread-safe for concurrent reads.
// The mapping is private and read-only; as with any mmap, the file must not be
// truncated while it is open (reads past the new end fault).
class SafetensorsFile {
 public:
  // Maps `path` read-only and validates it. NOT_FOUND if it cannot be opened.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Validates `bytes` held in memory (a whole file); `display_name` is used in errors.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::string bytes, std::string display_name);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Every tensor, sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // The optional `__metadata__` map (string to string).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  uint64_t size_bytes() const { return size_; }
  // The whole file (length prefix, header and data) as mapped or held: every
  // view's bytes lie inside it, at data_start() + data_begin.
  absl::Span<const uint8_t> file_bytes() const { return absl::MakeConstSpan(base_, size_); }
  uint64_t data_start() const { return data_start_; }  // 8 + header length

  bool Contains(absl::string_view name) const { return index_.contains(name); }
  const TensorInfo* Find(absl::string_view name) const;
  // NOT_FOUND if the file has no tensor `name`.
  absl::StatusOr<TensorView> Tensor(absl::string_view name) const;
  // Precondition: `info` is an element of this file's tensors().
  TensorView View(const TensorInfo& info) const;

 private:
  SafetensorsFile() = default;
  absl::Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;  // the whole file: mmap'ed or owned_bytes_
  uint64_t size_ = 0;
  void* mapping_ = nullptr;  // munmap'ed in the destructor, null for FromBytes
  std::string owned_bytes_;
  uint64_t data_start_ = 0;  // 8 + header length
  std::vector<TensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;  // name -> tensors_ index
  std::map<std::string, std::string> metadata_;
};

// The tensors of a model directory: `model.safetensors`, or the shards listed by
// `model.safetensors.index.json`. The index must name plain files of the
// directory, every mapped tensor must be in its shard, and every tensor of a
// shard must be mapped to that shard. Immutable; thread-safe for reads.
class SafetensorsCheckpoint {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> OpenDirectory(const std::string& dir);
  // A single-file checkpoint.
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> OpenFile(const std::string& path);

  // Every tensor name, sorted.
  const std::vector<std::string>& names() const { return names_; }
  bool Contains(absl::string_view name) const { return where_.contains(name); }
  const TensorInfo* Find(absl::string_view name) const;
  // NOT_FOUND if no shard has `name`.
  absl::StatusOr<TensorView> Tensor(absl::string_view name) const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  SafetensorsCheckpoint() = default;
  absl::Status Add(std::unique_ptr<SafetensorsFile> file);

  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  absl::flat_hash_map<std::string, const SafetensorsFile*> where_;
  std::vector<std::string> names_;
};

// A safetensors file holding `tensors` (in name order, data 8-byte aligned after
// the header, as save_file writes it) and `metadata`. INVALID_ARGUMENT if a
// view's bytes disagree with its dtype and shape or two names repeat. For tests,
// fixtures and tools; the views' bytes are copied.
absl::StatusOr<std::string> SerializeSafetensors(absl::Span<const TensorView> tensors,
                                                 const std::map<std::string, std::string>& metadata = {});

// Exact conversion of one fp16 element to fp32 (fp16 is a subset of fp32):
// subnormals, signed zeros, infinities and NaNs (payload kept) included. bf16
// elements convert with kernels::Bf16ToFloat (kernels/bf16.h).
float Fp16ToFloat(uint16_t bits);

// Writes the tensor's elements as fp32 into `out` (num_elements() floats).
// F32, BF16 and F16 convert exactly; I32 and I64 are UNIMPLEMENTED;
// INVALID_ARGUMENT if `out` has the wrong size or the bytes disagree with the shape.
absl::Status ConvertToFloat32(const TensorView& tensor, absl::Span<float> out);
absl::StatusOr<std::vector<float>> ToFloat32(const TensorView& tensor);

// The elements of an I32 or I64 tensor (token ids of fixtures) as int64;
// UNIMPLEMENTED for floating-point dtypes.
absl::StatusOr<std::vector<int64_t>> ToInt64(const TensorView& tensor);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_SAFETENSORS_H_
