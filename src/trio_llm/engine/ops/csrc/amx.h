// AMX tiles as the kernels of csrc/ use them: the process's permission to use them, a tile
// configuration, and the thread's configuration saved and put back around a call. Defines
// TRIO_AMX where the build targets AMX's bf16 tiles (-march=native on such a CPU).
#pragma once

#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#define TRIO_AMX 1

namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The tile configuration found on this thread, put back when the call ends: torch's own AMX
// kernels (oneDNN's brgemm under SDPA's flash kernel) may keep theirs configured between
// calls and skip configuring it again.
class SavedTiles {
 public:
  SavedTiles() { _tile_storeconfig(&saved_); }
  ~SavedTiles() {
    if (saved_.palette == 0) _tile_release();
    else _tile_loadconfig(&saved_);
  }

 private:
  TileConfig saved_;
};

// Linux lends a process the tiles' state only when asked (once).
inline bool amx_permitted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
  return ok;
}

}  // namespace
#endif
