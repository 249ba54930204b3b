// A batch of queries over the paged KV cache, as the attention kernels of csrc/ read it: its
// shape, and its runs of queries of one sequence.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace {

// q [B, Hq, D]; caches [blocks, block_size, Hkv, D]; block tables [B, W].
struct Shape {
  int64_t batch, heads, dim, block_size, kv_heads, group, table_width;
  int64_t token_stride, block_stride;  // one slot and one block of a layer's cache

  Shape(const at::Tensor& q, const at::Tensor& cache, const at::Tensor& block_tables)
      : batch(q.size(0)), heads(q.size(1)), dim(q.size(2)), block_size(cache.size(1)),
        kv_heads(cache.size(2)), group(heads / kv_heads), table_width(block_tables.size(1)),
        token_stride(kv_heads * dim), block_stride(block_size * token_stride) {}

  // Where position `pos` of the sequence with block table `table` lies in a layer's cache
  // (elements from its start; add a KV head's offset for its part of the row).
  int64_t slot(const int64_t* table, int64_t pos) const {
    return table[pos / block_size] * block_stride + (pos % block_size) * token_stride;
  }
};

// Consecutive rows with the same block table (one sequence's queries, as batch invariance lays
// a prefill out as decodes), cut at `most` rows, so that a run reads its sequence's keys once
// for all of its queries.
inline std::vector<std::pair<int64_t, int64_t>> runs_of(const int64_t* tables, int64_t batch,
                                                        int64_t width, int64_t most) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t b = 0; b < batch;) {
    int64_t e = b + 1;
    while (e < batch && e - b < most &&
           std::memcmp(tables + e * width, tables + b * width, width * sizeof(int64_t)) == 0)
      ++e;
    out.emplace_back(b, e);
    b = e;
  }
  return out;
}

}  // namespace
