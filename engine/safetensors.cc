#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "kernels/bf16.h"

namespace hybridserve::engine {
namespace {

#if !defined(ABSL_IS_LITTLE_ENDIAN)
#error "safetensors data is little-endian; this reader assumes a little-endian host"
#endif

using Json = nlohmann::json;

// The reference implementation's limit on the header.
constexpr uint64_t kMaxHeaderBytes = 100 << 20;
constexpr size_t kMaxIndexBytes = 64 << 20;
constexpr size_t kMaxRank = 16;

absl::StatusOr<DType> ParseDType(absl::string_view name, absl::string_view tensor) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  static constexpr absl::string_view kKnown[] = {"F64", "F8_E4M3", "F8_E5M2", "I8",  "U8",
                                                 "I16", "U16",     "U32",     "U64", "BOOL"};
  for (absl::string_view known : kKnown) {
    if (name == known) {
      return absl::UnimplementedError(
          absl::StrCat("tensor ", tensor, ": dtype ", name, " is not supported (F32, BF16, F16, I32, I64)"));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor, ": unknown dtype \"", name, "\""));
}

std::string Excerpt(const Json& value) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > 40) text = absl::StrCat(text.substr(0, 37), "...");
  return text;
}

absl::StatusOr<uint64_t> JsonUnsigned(const Json& v, absl::string_view what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return absl::InvalidArgumentError(absl::StrCat(what, " must be a non-negative integer, got ", Excerpt(v)));
}

absl::StatusOr<TensorInfo> ParseEntry(const std::string& name, const Json& entry) {
  if (name.empty()) return absl::InvalidArgumentError("a tensor has an empty name");
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": entry must be an object, got ", Excerpt(entry)));
  }
  for (auto it = entry.begin(); it != entry.end(); ++it) {
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets") {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": unexpected field \"", it.key(), "\""));
    }
  }
  if (!entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": needs dtype, shape and data_offsets"));
  }
  TensorInfo info;
  info.name = name;
  const Json& dtype = entry.at("dtype");
  if (!dtype.is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": dtype must be a string"));
  }
  ASSIGN_OR_RETURN(info.dtype, ParseDType(dtype.get<std::string>(), name));

  const Json& shape = entry.at("shape");
  if (!shape.is_array() || shape.size() > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, ": shape must be a list of at most ", kMaxRank, " sizes, got ", Excerpt(shape)));
  }
  uint64_t elements = 1;
  for (const Json& dim : shape) {
    ASSIGN_OR_RETURN(uint64_t d, JsonUnsigned(dim, absl::StrCat("tensor ", name, ": a shape entry")));
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (d != 0 && elements > std::numeric_limits<uint64_t>::max() / d)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": shape ", Excerpt(shape), " overflows"));
    }
    elements *= d;
    info.shape.push_back(static_cast<int64_t>(d));
  }
  const Json& offsets = entry.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, ": data_offsets must be [begin, end], got ", Excerpt(offsets)));
  }
  ASSIGN_OR_RETURN(info.data_begin, JsonUnsigned(offsets[0], absl::StrCat("tensor ", name, ": data_offsets[0]")));
  ASSIGN_OR_RETURN(info.data_end, JsonUnsigned(offsets[1], absl::StrCat("tensor ", name, ": data_offsets[1]")));
  if (info.data_begin > info.data_end) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, ": data_offsets [", info.data_begin, ", ", info.data_end, "] are reversed"));
  }
  const uint64_t width = DTypeSize(info.dtype);
  if (elements > std::numeric_limits<uint64_t>::max() / width || elements * width != info.num_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": ", DTypeName(info.dtype), " shape ",
                                                   Excerpt(shape), " needs ", elements, " * ", width,
                                                   " bytes but data_offsets span ", info.num_bytes()));
  }
  return info;
}

absl::Status WithPrefix(const absl::Status& s, absl::string_view prefix) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  std::string out = text.str();
  if (out.size() > limit) return absl::InvalidArgumentError(absl::StrCat(path, " is over ", limit, " bytes"));
  return out;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kI64:
      return 8;
  }
  return 1;
}

int64_t TensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------- SafetensorsFile

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ > 0) {
    void* mapping = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot map ", path, ": ", std::strerror(err)));
    }
    file->mapping_ = mapping;
    file->base_ = static_cast<const uint8_t*>(mapping);
  }
  ::close(fd);
  RETURN_IF_ERROR(WithPrefix(file->Parse(), absl::StrCat(path, ": ")));
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(std::string bytes,
                                                                            std::string display_name) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = std::move(display_name);
  file->owned_bytes_ = std::move(bytes);
  file->base_ = reinterpret_cast<const uint8_t*>(file->owned_bytes_.data());
  file->size_ = file->owned_bytes_.size();
  RETURN_IF_ERROR(WithPrefix(file->Parse(), absl::StrCat(file->path_, ": ")));
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

absl::Status SafetensorsFile::Parse() {
  if (size_ < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("file is ", size_, " bytes, too short for the 8-byte header length"));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, base_, 8);
  if (header_len == 0) return absl::InvalidArgumentError("header length is 0");
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header length ", header_len, " is over the limit of ", kMaxHeaderBytes));
  }
  if (header_len > size_ - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("header length ", header_len, " runs past the end of the ", size_, "-byte file"));
  }
  data_start_ = 8 + header_len;
  const uint64_t data_size = size_ - data_start_;
  const absl::string_view header(reinterpret_cast<const char*>(base_ + 8), header_len);
  if (header[0] != '{') return absl::InvalidArgumentError("header does not start with '{'");

  Json root;
  // nlohmann reports malformed input by exception; this is the boundary that
  // turns it into a Status.
  try {
    root = Json::parse(header.begin(), header.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) return absl::InvalidArgumentError("header is not a JSON object");

  std::vector<TensorInfo> tensors;
  try {
    for (auto it = root.begin(); it != root.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (!it.value().is_object()) return absl::InvalidArgumentError("__metadata__ must be an object");
        for (auto m = it.value().begin(); m != it.value().end(); ++m) {
          if (!m.value().is_string()) {
            return absl::InvalidArgumentError(absl::StrCat("__metadata__ value of \"", m.key(), "\" is not a string"));
          }
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      ASSIGN_OR_RETURN(TensorInfo info, ParseEntry(it.key(), it.value()));
      tensors.push_back(std::move(info));
    }
  } catch (const Json::exception& e) {
    // Every access above is type-checked first; this only guards the boundary.
    return absl::InvalidArgumentError(absl::StrCat("header: ", e.what()));
  }

  // The tensors must tile [0, data_size) exactly.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors.size());
  for (const TensorInfo& t : tensors) {
    if (t.data_end > data_size) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": data_offsets [", t.data_begin, ", ",
                                                     t.data_end, "] run past the ", data_size, "-byte data section"));
    }
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->data_begin != b->data_begin ? a->data_begin < b->data_begin : a->data_end < b->data_end;
  });
  uint64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (t->data_begin < covered) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t->name, ": data_offsets [", t->data_begin, ", ",
                                                     t->data_end, "] overlap tensor ", previous->name));
    }
    if (t->data_begin > covered) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t->name, ": data starts at ", t->data_begin,
                                                     ", leaving a hole after byte ", covered));
    }
    covered = t->data_end;
    previous = t;
  }
  if (covered != data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tensors cover ", covered, " of the ", data_size, " bytes of the data section"));
  }

  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  tensors_ = std::move(tensors);
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  return absl::OkStatus();
}

const TensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

TensorView SafetensorsFile::View(const TensorInfo& info) const {
  assert(!tensors_.empty() && &info >= tensors_.data() && &info < tensors_.data() + tensors_.size());
  TensorView view;
  view.name = info.name;
  view.dtype = info.dtype;
  view.shape = absl::MakeConstSpan(info.shape);
  view.bytes = absl::MakeConstSpan(base_ + data_start_ + info.data_begin, info.num_bytes());
  return view;
}

absl::StatusOr<TensorView> SafetensorsFile::Tensor(absl::string_view name) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) return absl::NotFoundError(absl::StrCat(path_, ": no tensor ", name));
  return View(*info);
}

// ---------------------------------------------------------------- SafetensorsCheckpoint

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::OpenFile(const std::string& path) {
  std::unique_ptr<SafetensorsCheckpoint> checkpoint(new SafetensorsCheckpoint());
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  RETURN_IF_ERROR(checkpoint->Add(std::move(file)));
  std::sort(checkpoint->names_.begin(), checkpoint->names_.end());
  return checkpoint;
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::OpenDirectory(const std::string& dir) {
  const std::string single = absl::StrCat(dir, "/model.safetensors");
  const std::string index_path = absl::StrCat(dir, "/model.safetensors.index.json");
  if (FileExists(single)) return OpenFile(single);
  if (!FileExists(index_path)) {
    return absl::NotFoundError(absl::StrCat(dir, " has neither model.safetensors nor model.safetensors.index.json"));
  }
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile(index_path, kMaxIndexBytes));
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, " is not valid JSON: ", e.what()));
  }
  if (!root.is_object() || !root.contains("weight_map") || !root.at("weight_map").is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map must be an object"));
  }
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::set<std::string> shards;
  for (auto it = root.at("weight_map").begin(); it != root.at("weight_map").end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map[\"", it.key(), "\"] is not a string"));
    }
    std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map[\"", it.key(), "\"] names \"", shard,
                                                     "\", not a file of the model directory"));
    }
    shards.insert(shard);
    weight_map.emplace(it.key(), std::move(shard));
  }
  if (weight_map.empty()) return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map is empty"));

  std::unique_ptr<SafetensorsCheckpoint> checkpoint(new SafetensorsCheckpoint());
  for (const std::string& shard : shards) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(absl::StrCat(dir, "/", shard)));
    for (const TensorInfo& t : file->tensors()) {
      auto it = weight_map.find(t.name);
      if (it == weight_map.end() || it->second != shard) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": tensor ", t.name, " of shard ", shard,
                         it == weight_map.end() ? " is not in weight_map" : " is mapped to shard " + it->second));
      }
    }
    RETURN_IF_ERROR(checkpoint->Add(std::move(file)));
  }
  for (const auto& [name, shard] : weight_map) {
    if (!checkpoint->Contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map puts tensor ", name, " in shard ", shard, ", which lacks it"));
    }
  }
  std::sort(checkpoint->names_.begin(), checkpoint->names_.end());
  return checkpoint;
}

absl::Status SafetensorsCheckpoint::Add(std::unique_ptr<SafetensorsFile> file) {
  for (const TensorInfo& t : file->tensors()) {
    auto [it, inserted] = where_.emplace(t.name, file.get());
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, " is in both ", it->second->path(), " and ", file->path()));
    }
    names_.push_back(t.name);
  }
  files_.push_back(std::move(file));
  return absl::OkStatus();
}

const TensorInfo* SafetensorsCheckpoint::Find(absl::string_view name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : it->second->Find(name);
}

absl::StatusOr<TensorView> SafetensorsCheckpoint::Tensor(absl::string_view name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return absl::NotFoundError(absl::StrCat("no tensor ", name, " in the checkpoint"));
  return it->second->Tensor(name);
}

absl::StatusOr<std::string> SerializeSafetensors(absl::Span<const TensorView> tensors,
                                                 const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorView*> sorted;
  for (const TensorView& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](const TensorView* a, const TensorView* b) { return a->name < b->name; });
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const TensorView& t = *sorted[i];
    if (t.name.empty() || t.name == "__metadata__" || (i > 0 && sorted[i - 1]->name == t.name)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor name \"", t.name, "\" is empty, reserved or repeated"));
    }
    uint64_t elements = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": negative dimension"));
      elements *= static_cast<uint64_t>(d);
    }
    if (elements * DTypeSize(t.dtype) != t.bytes.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, ": ", t.bytes.size(), " bytes do not match its shape and dtype"));
    }
    Json entry = Json::object();
    entry["dtype"] = std::string(DTypeName(t.dtype));
    entry["shape"] = std::vector<int64_t>(t.shape.begin(), t.shape.end());
    entry["data_offsets"] = {offset, offset + t.bytes.size()};
    header[std::string(t.name)] = std::move(entry);
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t header_len = text.size();
  std::memcpy(out.data(), &header_len, 8);
  out += text;
  out.reserve(out.size() + offset);
  for (const TensorView* t : sorted) out.append(reinterpret_cast<const char*>(t->bytes.data()), t->bytes.size());
  return out;
}

// ---------------------------------------------------------------- conversions

float Fp16ToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t f;
  if (exponent == 0x1f) {  // inf or NaN; the payload moves up unchanged
    f = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal: rebias 15 -> 127
    f = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // signed zero
    f = sign;
  } else {  // subnormal: mantissa * 2^-24, normal in fp32
    int top = 9;
    while ((mantissa & (1u << top)) == 0) --top;
    f = sign | (static_cast<uint32_t>(top + 103) << 23) | ((mantissa << (23 - top)) & 0x7fffffu);
  }
  float out;
  std::memcpy(&out, &f, 4);
  return out;
}

absl::Status ConvertToFloat32(const TensorView& tensor, absl::Span<float> out) {
  const int64_t n = tensor.num_elements();
  if (static_cast<int64_t>(out.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", tensor.name, ": output holds ", out.size(), " floats, the tensor ", n));
  }
  if (tensor.bytes.size() != static_cast<uint64_t>(n) * DTypeSize(tensor.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", tensor.name, ": ", tensor.bytes.size(), " bytes do not match its shape and dtype"));
  }
  const uint8_t* src = tensor.bytes.data();
  switch (tensor.dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(out.data(), src, static_cast<size_t>(n) * 4);
      return absl::OkStatus();
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        out[i] = kernels::Bf16ToFloat(bits);
      }
      return absl::OkStatus();
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        out[i] = Fp16ToFloat(bits);
      }
      return absl::OkStatus();
    case DType::kI32:
    case DType::kI64:
      break;
  }
  return absl::UnimplementedError(
      absl::StrCat("tensor ", tensor.name, ": dtype ", DTypeName(tensor.dtype), " does not convert to fp32 weights"));
}

absl::StatusOr<std::vector<float>> ToFloat32(const TensorView& tensor) {
  std::vector<float> out(static_cast<size_t>(tensor.num_elements()));
  RETURN_IF_ERROR(ConvertToFloat32(tensor, absl::MakeSpan(out)));
  return out;
}

absl::StatusOr<std::vector<int64_t>> ToInt64(const TensorView& tensor) {
  const int64_t n = tensor.num_elements();
  if (tensor.dtype != DType::kI32 && tensor.dtype != DType::kI64) {
    return absl::UnimplementedError(
        absl::StrCat("tensor ", tensor.name, ": dtype ", DTypeName(tensor.dtype), " is not an integer dtype"));
  }
  if (tensor.bytes.size() != static_cast<uint64_t>(n) * DTypeSize(tensor.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", tensor.name, ": ", tensor.bytes.size(), " bytes do not match its shape and dtype"));
  }
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (tensor.dtype == DType::kI32) {
      int32_t v;
      std::memcpy(&v, tensor.bytes.data() + 4 * i, 4);
      out[i] = v;
    } else {
      std::memcpy(&out[i], tensor.bytes.data() + 8 * i, 8);
    }
  }
  return out;
}

}  // namespace hybridserve::engine
