// What every AMX kernel of ours needs around its tiles (int4_rows.cpp, int_rows.cpp): the
// tile configuration's layout, the kernel's permission to use the tile state, and the
// configuration torch's own AMX kernels left on the thread, put back when a call ends.
#pragma once

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace trio_amx {

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Torch's AMX kernels (oneDNN's brgemm under SDPA's flash kernel) may keep their configuration
// between calls and skip configuring it again, so a call of ours puts back what it found.
class SavedTiles {
 public:
  SavedTiles() { _tile_storeconfig(&saved_); }
  ~SavedTiles() {
    if (saved_.palette == 0) _tile_release();
    else _tile_loadconfig(&saved_);
  }
  SavedTiles(const SavedTiles&) = delete;
  SavedTiles& operator=(const SavedTiles&) = delete;

 private:
  TileConfig saved_;
};

// Linux hands a process the tile state only when asked (ARCH_REQ_XCOMP_PERM, XTILEDATA).
inline bool permitted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}

}  // namespace trio_amx
