// A cubin's ELF header checked before the CUDA driver loads it (cuda_launch.cpp), and
// exposed to Python on every build (_ext.check_cubin) so CI tests it without a GPU.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace metile::cuda {

template <typename T>
T read_field(const std::string& image, std::size_t at) {
  T value;
  std::memcpy(&value, image.data() + at, sizeof(T));
  return value;
}

// The driver's loader reads an ELF image's tables where its header points, unchecked (a
// truncated cubin crashed the process on the H200), so the header must hold together
// before cuModuleLoadData sees the bytes.  What the driver then refuses (another GPU's
// cubin) comes back as its error.
inline void check_image(const std::string& name, const std::string& image) {
  auto refuse = [&](const std::string& why) {
    throw std::invalid_argument("[metile] the image of kernel '" + name +
                                "' is not a loadable 64-bit cubin: " + why);
  };
  if (image.size() < 64 || image.compare(0, 4, "\x7f" "ELF") != 0) refuse("no ELF header");
  if (image[4] != 2) refuse("not a 64-bit ELF file");
  auto phoff = read_field<std::uint64_t>(image, 32), shoff = read_field<std::uint64_t>(image, 40);
  auto phentsize = read_field<std::uint16_t>(image, 54), phnum = read_field<std::uint16_t>(image, 56);
  auto shentsize = read_field<std::uint16_t>(image, 58), shnum = read_field<std::uint16_t>(image, 60);
  auto size = static_cast<std::uint64_t>(image.size());
  if (shentsize < 64) refuse("its section headers are not 64-bit ones");
  if (shnum == 0 || shoff > size || std::uint64_t(shnum) * shentsize > size - shoff) {
    refuse("its section headers lie outside the image");
  }
  if (phoff > size || std::uint64_t(phnum) * phentsize > size - phoff) {
    refuse("its program headers lie outside the image");
  }
  for (std::uint16_t i = 0; i < shnum; ++i) {
    auto at = shoff + std::uint64_t(i) * shentsize;
    auto type = read_field<std::uint32_t>(image, at + 4);
    auto offset = read_field<std::uint64_t>(image, at + 24), bytes = read_field<std::uint64_t>(image, at + 32);
    if (type != 8 /* SHT_NOBITS */ && (offset > size || bytes > size - offset)) {
      refuse("section " + std::to_string(i) + " lies outside the image");
    }
  }
}

}  // namespace metile::cuda
