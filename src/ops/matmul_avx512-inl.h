// AVX-512 + VNNI MatMul kernels (HWY_AVX3_DL). Included by matmul_simd.cc
// inside the Highway per-target namespace; not a standalone header.
// NOLINT(build/header_guard): included once per target pass.
// ===========================================================================
// AVX-512 + VNNI
// ===========================================================================
// The target's own string (ops/hwy_fix: AVX-512 F/VL/DQ/BW + AVX512-VNNI and
// the rest that simd_target.cc verifies; never AVX-VNNI, so 256-bit dot
// products use the EVEX vpdpbusd of AVX512-VNNI + VL); clang needs it on each
// function.
#define KVX_ATTR HWY_ATTR
#define KVX_INLINE KVX_ATTR inline __attribute__((always_inline))

KVX_INLINE float Reduce(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

KVX_INLINE __m128i Broadcast16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return _mm_set1_epi16(static_cast<short>(v));
}

// ---- activations ----------------------------------------------------------

// Reduces each of 16 vectors to one lane: lane j of the result is the
// reduction of v[j]'s 16 lanes under op (exact for max and integer add, in
// any order). Four levels of pairwise shuffles, 45 operations for the 16
// reductions instead of 8 each.
template <class Op>
KVX_INLINE __m512 ReduceEach16(const __m512* v, Op op) {
  __m512 c[8], e[4], g[2];
  // Level 1: c[i]'s 128-bit lanes hold 2 x 4 partials of v[2i], then of v[2i+1].
  KVX_UNROLL for (int i = 0; i < 8; ++i) {
    c[i] = op(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  }
  // Level 2: lane L of e[i] holds 4 partials of v[4i + L].
  KVX_UNROLL for (int i = 0; i < 4; ++i) {
    e[i] = op(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88), _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
  }
  // Level 3: lane L of g[i] holds 2 partials of v[8i + L], then 2 of v[8i + 4 + L].
  KVX_UNROLL for (int i = 0; i < 2; ++i) {
    g[i] = op(_mm512_shuffle_ps(e[2 * i], e[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
              _mm512_shuffle_ps(e[2 * i], e[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // Level 4: element m of lane L is v[4m + L]; the permutation restores order.
  const __m512 h = op(_mm512_shuffle_ps(g[0], g[1], _MM_SHUFFLE(2, 0, 2, 0)),
                      _mm512_shuffle_ps(g[0], g[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), h);
}

// 16 whole blocks of token row xt starting at block b: the per-block code
// below, with the maxima, scales and sums of the 16 blocks computed in
// vectors (the per-block horizontal reductions and scalar divisions were
// most of the quantizer's time).
KVX_INLINE void QuantizeGroup16(const float* xt, int64_t b, int8_t* q, float* d, int32_t* bias, float* sa,
                                int32_t* block_bias, float* ds, bool lane_planes) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const float* xb = xt + b * kActBlock;
  __m512 m[16];
  KVX_UNROLL for (int j = 0; j < 16; ++j) {
    m[j] = _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(xb + 32 * j)),
                         _mm512_andnot_ps(sign, _mm512_loadu_ps(xb + 32 * j + 16)));
  }
  const __m512 amax = ReduceEach16(m, [](__m512 u, __m512 v) { return _mm512_max_ps(u, v); });
  const __m512 k127 = _mm512_set1_ps(127.0f);
  const __m512 db = _mm512_div_ps(amax, k127);
  const __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ), k127, amax);
  alignas(64) float dbs[16], ids[16];
  _mm512_store_ps(dbs, db);
  _mm512_store_ps(ids, id);
  // Two blocks' int32 quants pack to 64 bytes with two saturating packs
  // (|q| <= 127, so nothing saturates) and one dword permutation.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  __m512 sums[16];
  KVX_UNROLL for (int j = 0; j < 16; j += 2) {
    __m512i p[2];
    KVX_UNROLL for (int u = 0; u < 2; ++u) {
      const __m512 idv = _mm512_set1_ps(ids[j + u]);
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * (j + u)), idv));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * (j + u) + 16), idv));
      sums[j + u] = _mm512_castsi512_ps(_mm512_add_epi32(q0, q1));
      p[u] = _mm512_packs_epi32(q0, q1);
    }
    const __m512i q8 = _mm512_permutexvar_epi32(order, _mm512_packs_epi16(p[0], p[1]));
    _mm512_storeu_si512(q + (b + j) * kActBlock, q8);
    if (lane_planes) {  // lane sums of 4 quants: 1 * q summed by vpdpbusd
      const __m512i lane_sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), q8);
      _mm512_storeu_si512(bias + 8 * (b + j), _mm512_sub_epi32(_mm512_setzero_si512(), lane_sum));
      _mm512_storeu_ps(d + 8 * (b + j), _mm512_insertf32x8(_mm512_set1_ps(dbs[j]), _mm256_set1_ps(dbs[j + 1]), 1));
    }
  }
  const __m512i sum = _mm512_castps_si512(ReduceEach16(sums, [](__m512 u, __m512 v) {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(u), _mm512_castps_si512(v)));
  }));
  _mm512_storeu_ps(sa + b, _mm512_mul_ps(db, _mm512_cvtepi32_ps(sum)));
  _mm512_storeu_si512(block_bias + b, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
  _mm512_storeu_ps(ds + b, db);
}

KVX_ATTR void QuantizeActs(const float* x, int64_t t0, int64_t t1, QuantizedActs* a) {
  const int64_t k = a->k, nb = a->k_pad / kActBlock;
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * k;
    int8_t* q = a->q + t * a->k_pad;
    float* d = a->d + t * (a->k_pad / 4);
    int32_t* bias = a->bias + t * (a->k_pad / 4);
    float* sa = a->sa + t * (a->k_pad / 32);
    int64_t b = 0;
    for (; b + 16 <= k / kActBlock; b += 16) {
      QuantizeGroup16(xt, b, q, d, bias, sa, a->block_bias + t * (a->k_pad / 32), a->ds + t * (a->k_pad / 32),
                      a->lane_planes);
    }
    for (; b < nb; ++b) {
      __m512 x0 = _mm512_setzero_ps(), x1 = _mm512_setzero_ps();
      if (b * kActBlock < k) {  // k is a multiple of 32: a block is all in or all out
        x0 = _mm512_loadu_ps(xt + b * kActBlock);
        x1 = _mm512_loadu_ps(xt + b * kActBlock + 16);
      }
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, x0), _mm512_andnot_ps(sign, x1)));
      const float db = amax / 127.0f;
      const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
      const __m512 idv = _mm512_set1_ps(id);
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, idv));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, idv));
      const __m256i q8 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(q0)),
                                                 _mm512_cvtepi32_epi8(q1), 1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kActBlock), q8);
      if (a->lane_planes) {
        // Lane sums of 4 quants: 1 * q summed by vpdpbusd.
        const __m256i lane_sum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), q8);
        _mm256_storeu_ps(d + 8 * b, _mm256_set1_ps(db));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(bias + 8 * b), _mm256_sub_epi32(_mm256_setzero_si256(), lane_sum));
      }
      const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      sa[b] = db * static_cast<float>(sum);
      a->block_bias[t * (a->k_pad / 32) + b] = -128 * sum;
      a->ds[t * (a->k_pad / 32) + b] = db;
    }
  }
}

// ---- float path -------------------------------------------------------------

template <TensorType kType>
KVX_INLINE __m512 LoadFloatW(const uint8_t* row, int64_t k) {
  if constexpr (kType == TensorType::kF32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else if constexpr (kType == TensorType::kF16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k)));
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}
template <TensorType kType>
KVX_INLINE __m512 LoadFloatWMasked(const uint8_t* row, int64_t k, __mmask16 m) {
  if constexpr (kType == TensorType::kF32) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + k);
  } else if constexpr (kType == TensorType::kF16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * k));
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * k);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// y[t*ldy + r] = row r . x_t for kR rows starting at `row` and kT tokens.
template <TensorType kType, int kR, int kT>
KVX_ATTR void FloatTile(const uint8_t* row, size_t row_bytes, const float* x, int64_t k, float* y, int64_t ldy) {
  __m512 acc[kR][kT];
  KVX_UNROLL for (int r = 0; r < kR; ++r) {
    KVX_UNROLL for (int t = 0; t < kT; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  constexpr int kElem = kType == TensorType::kF32 ? 4 : 2;
  for (; i + 16 <= k; i += 16) {
    __m512 w[kR];
    KVX_UNROLL for (int r = 0; r < kR; ++r) {
      if constexpr (kT == 1) {  // decode: prefetch the next row group (see DirectSrc)
        _mm_prefetch(reinterpret_cast<const char*>(row + (r + kR) * row_bytes + i * kElem), _MM_HINT_T0);
      }
      w[r] = LoadFloatW<kType>(row + r * row_bytes, i);
    }
    KVX_UNROLL for (int t = 0; t < kT; ++t) {
      const __m512 xv = _mm512_loadu_ps(x + t * k + i);
      KVX_UNROLL for (int r = 0; r < kR; ++r) acc[r][t] = _mm512_fmadd_ps(w[r], xv, acc[r][t]);
    }
  }
  if (i < k) {
    const __mmask16 m = static_cast<__mmask16>((1u << (k - i)) - 1);
    __m512 w[kR];
    KVX_UNROLL for (int r = 0; r < kR; ++r) w[r] = LoadFloatWMasked<kType>(row + r * row_bytes, i, m);
    KVX_UNROLL for (int t = 0; t < kT; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * k + i);
      KVX_UNROLL for (int r = 0; r < kR; ++r) acc[r][t] = _mm512_fmadd_ps(w[r], xv, acc[r][t]);
    }
  }
  KVX_UNROLL for (int t = 0; t < kT; ++t) {
    KVX_UNROLL for (int r = 0; r < kR; ++r) y[t * ldy + r] = Reduce(acc[r][t]);
  }
}

// 6 rows x 4 tokens: 24 accumulators + 6 weight vectors + 1 activation
// vector of the 32 zmm registers; 10 loads per 24 FMAs.
constexpr int kFloatRows = 6, kFloatTokens = 4;

template <TensorType kType>
KVX_ATTR void FloatRows(const WeightView& w, const float* x, int64_t n_tokens, float* y, int64_t r0, int64_t r1) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t k = w.n_in, ldy = w.n_out;
  const size_t rb = w.row_bytes;
  const int64_t tt = TokenTile(4 * k);
  for (int64_t t0 = 0; t0 < n_tokens; t0 += tt) {
    const int64_t t1 = std::min(n_tokens, t0 + tt);
    int64_t r = r0;
    for (; r + kFloatRows <= r1; r += kFloatRows) {
      const uint8_t* row = base + r * rb;
      int64_t t = t0;
      for (; t + kFloatTokens <= t1; t += kFloatTokens) {
        FloatTile<kType, kFloatRows, kFloatTokens>(row, rb, x + t * k, k, y + t * ldy + r, ldy);
      }
      for (; t < t1; ++t) FloatTile<kType, kFloatRows, 1>(row, rb, x + t * k, k, y + t * ldy + r, ldy);
    }
    for (; r < r1; ++r) {
      const uint8_t* row = base + r * rb;
      int64_t t = t0;
      for (; t + kFloatTokens <= t1; t += kFloatTokens) {
        FloatTile<kType, 1, kFloatTokens>(row, rb, x + t * k, k, y + t * ldy + r, ldy);
      }
      for (; t < t1; ++t) FloatTile<kType, 1, 1>(row, rb, x + t * k, k, y + t * ldy + r, ldy);
    }
  }
}

// ---- integer path: weight decoders ---------------------------------------
// Each decoder yields canonical chunks (matmul_internal.h) in registers:
// u (64 x u8) and s (16 x f32); k-quants also a per-superblock state.

struct NoState {};

// Q8_0 / Q4_0: chunk c = blocks 2c, 2c+1; `half` = block 2c+1 is past the end.
KVX_INLINE void ChunkQ8_0(const uint8_t* row, int64_t c, bool half, __m512i* u, __m512* s) {
  const uint8_t* p = row + 2 * c * kQ8_0Bytes;
  const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
  __m256i q1 = _mm256_set1_epi8(static_cast<char>(0x80));  // zero weights after the xor
  __m128i h1 = _mm_setzero_si128();
  if (!half) {
    q1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kQ8_0Bytes + 2));
    h1 = Broadcast16(p + kQ8_0Bytes);
  }
  *u = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1),
                        _mm512_set1_epi8(static_cast<char>(0x80)));
  *s = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(Broadcast16(p)), h1, 1));
}

// Per-16-bit shift counts: 0 in 128-bit lanes 0 and 2, 4 in lanes 1 and 3
// (with a mask of 15: low nibbles, then high nibbles, for each Q4_0 block).
KVX_INLINE __m512i NibbleShifts128() {
  constexpr long long k4 = 0x0004000400040004LL;
  return _mm512_setr_epi64(0, 0, k4, k4, 0, 0, k4, k4);
}

KVX_INLINE void ChunkQ4_0(const uint8_t* row, int64_t c, bool half, __m512i* u, __m512* s) {
  const uint8_t* p = row + 2 * c * kQ4_0Bytes;
  // [qs0 qs0 qs1 qs1] (16 bytes each), then low nibbles of the even lanes and
  // high nibbles of the odd ones: lo0 hi0 lo1 hi1.
  __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2)));
  __m128i h1 = _mm_setzero_si128();
  if (!half) {
    v = _mm512_mask_broadcast_i32x4(v, 0xFF00, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kQ4_0Bytes + 2)));
    h1 = Broadcast16(p + kQ4_0Bytes);
  } else {
    v = _mm512_maskz_mov_epi32(0x00FF, v);
  }
  *u = _mm512_and_si512(_mm512_srlv_epi16(v, NibbleShifts128()), _mm512_set1_epi8(0x0F));
  *s = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(Broadcast16(p)), h1, 1));
}

// Q4_K/Q5_K superblock scales: [d*sc_0..7, dmin*m_0..7].
KVX_INLINE __m512 ScalesQxK(const uint8_t* blk) {
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4));  // 12 bytes used
  const __m128i a = _mm_shuffle_epi8(sc, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i b = _mm_shuffle_epi8(sc, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  const __m128i t1 = _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
  const __m128i t2 =
      _mm_and_si128(_mm_srli_epi16(a, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
  const __m128i t3 = _mm_and_si128(
      _mm_srli_epi16(b, 2), _mm_setr_epi8(0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30, 0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30));
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_or_si128(_mm_or_si128(t1, t2), t3)));
  uint32_t dd;
  std::memcpy(&dd, blk, 4);
  const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dd)));  // d, dmin
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  return _mm512_mul_ps(f, _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(dm)));
}

template <bool kQ5>
KVX_INLINE void ChunkQxK(const uint8_t* blk, const __m512& scales, int g, __m512i* u, __m512* s) {
  const uint8_t* qs = blk + 4 + kKScaleBytes + (kQ5 ? 32 : 0);
  // [q | q] >> [0 | 4] & 15: low nibbles, then high nibbles.
  const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * g)));
  const __m512i shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  __m512i v = _mm512_and_si512(_mm512_srlv_epi16(q, shifts), _mm512_set1_epi8(0x0F));
  if constexpr (kQ5) {
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)));
    const __m512i bits = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi8(static_cast<char>(1 << (2 * g)))),
                                            _mm256_set1_epi8(static_cast<char>(1 << (2 * g + 1))), 1);
    v = _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(h, bits), v, _mm512_set1_epi8(16));  // 5th bit
  }
  *u = v;
  const __m512i idx = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(2 * g)), _mm256_set1_epi32(2 * g + 1), 1);
  *s = _mm512_permutexvar_ps(idx, scales);
}

KVX_INLINE __m512 MinsQxK(const __m512& scales) {
  const __m512i idx = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
  return _mm512_maskz_permutexvar_ps(0x00FF, idx, scales);
}

// Q6_K superblock scales: d * sc_0..15.
KVX_INLINE __m512 ScalesQ6K(const uint8_t* blk) {
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
  uint16_t dh;
  std::memcpy(&dh, blk + 208, 2);
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)), _mm512_set1_ps(HalfToFloat(dh)));
}

KVX_INLINE void ChunkQ6K(const uint8_t* blk, const __m512& scales, int g, __m512i* u, __m512* s) {
  const int h = g / 2;
  const __m512i l = _mm512_loadu_si512(blk + 64 * h);
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
  const __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  if (g % 2 == 0) {
    *u = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_slli_epi16(qq, 4), m30));
  } else {
    *u = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), _mm512_and_si512(qq, m30));
  }
  const __m512i idx = _mm512_setr_epi32(4 * g, 4 * g, 4 * g, 4 * g, 4 * g + 1, 4 * g + 1, 4 * g + 1, 4 * g + 1,
                                        4 * g + 2, 4 * g + 2, 4 * g + 2, 4 * g + 2, 4 * g + 3, 4 * g + 3, 4 * g + 3,
                                        4 * g + 3);
  *s = _mm512_permutexvar_ps(idx, scales);
}

// Reads canonical chunks straight from kR weight rows of type kType.
// kMayHalf: the row may have an odd number of 32-blocks (Q8_0/Q4_0), so the
// last chunk may be half empty; the decode path only takes rows without.
// kPrefetch (decode): weights stream from DRAM, and prefetching the same
// position kR rows ahead (the next row group: rows are contiguous) keeps
// more lines in flight than the hardware prefetcher alone (+20% single-thread
// bandwidth on Zen 5).
template <TensorType kType, int kR, bool kMayHalf = true, bool kPrefetch = false>
struct DirectSrc {
  static constexpr int kSuperBytes = kType == TensorType::kQ8_0   ? 2 * kQ8_0Bytes
                                     : kType == TensorType::kQ4_0 ? 2 * kQ4_0Bytes
                                     : kType == TensorType::kQ4_K ? kQ4_KBytes
                                     : kType == TensorType::kQ5_K ? kQ5_KBytes
                                                                  : kQ6_KBytes;
  static constexpr bool kSuper = kType == TensorType::kQ4_K || kType == TensorType::kQ5_K || kType == TensorType::kQ6_K;
  static constexpr int kChunksPerSuper = kSuper ? 4 : 1;
  const uint8_t* base;
  size_t row_bytes;
  int64_t last_chunk;
  bool last_half;
  __m512 scales[kR];

  KVX_INLINE const uint8_t* Row(int r) const { return base + r * row_bytes; }
  KVX_INLINE const uint8_t* Super(int r, int64_t sb) const { return Row(r) + sb * kSuperBytes; }
  KVX_INLINE void Begin(int r, int64_t sb) {
    if constexpr (kType == TensorType::kQ4_K || kType == TensorType::kQ5_K) scales[r] = ScalesQxK(Super(r, sb));
    if constexpr (kType == TensorType::kQ6_K) scales[r] = ScalesQ6K(Super(r, sb));
  }
  KVX_INLINE bool Half(int64_t sb) const { return kMayHalf && sb == last_chunk && last_half; }
  // Chunk g of superblock sb (for 32-block types, sb is the chunk index).
  KVX_INLINE void Load(int r, int64_t sb, int g, __m512i* u, __m512* s) const {
    if constexpr (kPrefetch) {
      // One line per chunk (chunks are <= 68 bytes; the hardware prefetcher
      // covers the rest).
      _mm_prefetch(reinterpret_cast<const char*>(Row(r) + kR * row_bytes + sb * kSuperBytes +
                                                 g * (kSuperBytes / kChunksPerSuper)),
                   _MM_HINT_T0);
    }
    if constexpr (kType == TensorType::kQ8_0) {
      ChunkQ8_0(Row(r), sb, Half(sb), u, s);
    } else if constexpr (kType == TensorType::kQ4_0) {
      ChunkQ4_0(Row(r), sb, Half(sb), u, s);
    } else if constexpr (kType == TensorType::kQ4_K) {
      ChunkQxK<false>(Super(r, sb), scales[r], g, u, s);
    } else if constexpr (kType == TensorType::kQ5_K) {
      ChunkQxK<true>(Super(r, sb), scales[r], g, u, s);
    } else {
      ChunkQ6K(Super(r, sb), scales[r], g, u, s);
    }
  }
  KVX_INLINE __m512 Min(int r, int64_t /*sb*/) const { return MinsQxK(scales[r]); }
};

// Reads canonical chunks from a decoded panel (kR rows).
template <int kR, int kCps>
struct PanelSrc {
  static constexpr int kChunksPerSuper = kCps;
  const uint8_t* u;  // [kR][n_chunks][64]
  const float* s;    // [kR][n_chunks][16]
  const float* m;    // [kR][n_super][16]
  int64_t n_chunks, n_super;
  KVX_INLINE void Begin(int, int64_t) {}
  KVX_INLINE void Load(int r, int64_t sb, int g, __m512i* uv, __m512* sv) const {
    const int64_t c = sb * kCps + g;
    *uv = _mm512_load_si512(u + (r * n_chunks + c) * kChunk);
    *sv = _mm512_load_ps(s + (r * n_chunks + c) * kChunkLanes);
  }
  KVX_INLINE __m512 Min(int r, int64_t sb) const { return _mm512_load_ps(m + (r * n_super + sb) * kChunkLanes); }
};

// The integer micro-kernel: kR rows x kT tokens (tokens t0.. of a).
template <int kR, int kT, bool kBias, bool kMin, class Src>
KVX_ATTR void IntTile(Src src, const QuantizedActs& a, int64_t t0, int shift, float* y, int64_t ldy) {
  constexpr int kCps = Src::kChunksPerSuper;
  __m512 acc[kR][kT];
  KVX_UNROLL for (int r = 0; r < kR; ++r) {
    KVX_UNROLL for (int t = 0; t < kT; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const __m128i cnt = _mm_cvtsi32_si128(shift);
  const int64_t n_super = a.k_pad / kChunk / kCps;
  const int8_t* q[kT];
  const float* d[kT];
  const int32_t* bias[kT];
  KVX_UNROLL for (int t = 0; t < kT; ++t) {
    q[t] = a.QRow(t0 + t);
    d[t] = a.DRow(t0 + t);
    bias[t] = a.BiasRow(t0 + t);
  }
  for (int64_t sb = 0; sb < n_super; ++sb) {
    KVX_UNROLL for (int r = 0; r < kR; ++r) src.Begin(r, sb);
    KVX_UNROLL for (int g = 0; g < kCps; ++g) {
      const int64_t c = sb * kCps + g;
      __m512i w[kR];
      __m512 s[kR];
      KVX_UNROLL for (int r = 0; r < kR; ++r) src.Load(r, sb, g, &w[r], &s[r]);
      KVX_UNROLL for (int t = 0; t < kT; ++t) {
        const __m512i av = _mm512_load_si512(q[t] + c * kChunk);
        const __m512 dv = _mm512_load_ps(d[t] + c * kChunkLanes);
        const __m512i bv = kBias ? _mm512_sll_epi32(_mm512_load_si512(bias[t] + c * kChunkLanes), cnt)
                                 : _mm512_setzero_si512();
        KVX_UNROLL for (int r = 0; r < kR; ++r) {
          const __m512i i = _mm512_dpbusd_epi32(bv, w[r], av);
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(s[r], dv), acc[r][t]);
        }
      }
    }
    if constexpr (kMin) {
      KVX_UNROLL for (int r = 0; r < kR; ++r) {
        const __m512 mv = src.Min(r, sb);
        KVX_UNROLL for (int t = 0; t < kT; ++t) {
          const __m512 sav = _mm512_zextps256_ps512(_mm256_loadu_ps(a.SaRow(t0 + t) + 8 * sb));
          acc[r][t] = _mm512_fnmadd_ps(mv, sav, acc[r][t]);
        }
      }
    }
  }
  KVX_UNROLL for (int t = 0; t < kT; ++t) {
    KVX_UNROLL for (int r = 0; r < kR; ++r) y[t * ldy + r] = Reduce(acc[r][t]);
  }
}

// 4 rows x 4 tokens: 16 accumulators + 4 weight + 4 scale vectors + the
// token's activations, bias and scales (27 of the 32 zmm registers).
constexpr int kIntRows = 4, kIntTokens = 4;

template <TensorType kType, int kR, bool kMayHalf = true, bool kPrefetch = false>
KVX_INLINE DirectSrc<kType, kR, kMayHalf, kPrefetch> MakeDirect(const WeightView& w, int64_t r) {
  DirectSrc<kType, kR, kMayHalf, kPrefetch> src;
  src.base = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
  src.row_bytes = w.row_bytes;
  src.last_chunk = (w.n_in - 1) / kChunk;
  src.last_half = (w.n_in / 32) % 2 == 1;
  return src;
}

// Decodes kR rows of src into the panel (canonical chunks).
template <TensorType kType, int kR, class Src>
KVX_ATTR void DecodePanelFrom(Src src, int64_t n_chunks, uint8_t* pu, float* ps, float* pm) {
  constexpr int kCps = Src::kChunksPerSuper;
  const int64_t n_super = n_chunks / kCps;
  for (int64_t sb = 0; sb < n_super; ++sb) {
    KVX_UNROLL for (int rr = 0; rr < kR; ++rr) {
      src.Begin(rr, sb);
      KVX_UNROLL for (int g = 0; g < kCps; ++g) {
        const int64_t c = sb * kCps + g;
        __m512i u;
        __m512 s;
        src.Load(rr, sb, g, &u, &s);
        _mm512_store_si512(pu + (rr * n_chunks + c) * kChunk, u);
        _mm512_store_ps(ps + (rr * n_chunks + c) * kChunkLanes, s);
      }
      if constexpr (kType == TensorType::kQ4_K || kType == TensorType::kQ5_K) {
        _mm512_store_ps(pm + (rr * n_super + sb) * kChunkLanes, src.Min(rr, sb));
      }
    }
  }
}

// Decodes rows [r, r+kR) into the panel (canonical chunks).
template <TensorType kType, int kR>
KVX_ATTR void DecodePanel(const WeightView& w, int64_t r, int64_t n_chunks, uint8_t* pu, float* ps, float* pm) {
  DecodePanelFrom<kType, kR>(MakeDirect<kType, kR>(w, r), n_chunks, pu, ps, pm);
}

template <TensorType kType>
KVX_ATTR void IntRowsTyped(const WeightView& w, const QuantizedActs& a, float* y, int64_t r0, int64_t r1) {
  constexpr IntTypeInfo kInfo = GetIntTypeInfo(kType);
  constexpr bool kBias = kInfo.bias_shift >= 0, kMin = kInfo.has_min;
  constexpr int kCps = kInfo.chunks_per_super;
  const int shift = kBias ? kInfo.bias_shift : 0;
  const int64_t ldy = w.n_out, n_tok = a.n_tokens;
  if (n_tok == 1 && w.n_in % kChunk == 0) {  // decode: weights straight into registers
    int64_t r = r0;
    for (; r + kIntRows <= r1; r += kIntRows) {
      IntTile<kIntRows, 1, kBias, kMin>(MakeDirect<kType, kIntRows, false, true>(w, r), a, 0, shift, y + r, ldy);
    }
    for (; r < r1; ++r) IntTile<1, 1, kBias, kMin>(MakeDirect<kType, 1, false>(w, r), a, 0, shift, y + r, ldy);
    return;
  }
  const int64_t n_chunks = a.k_pad / kChunk, n_super = n_chunks / kCps;
  const size_t u_bytes = kIntRows * n_chunks * kChunk;
  const size_t s_bytes = kIntRows * n_chunks * kChunkLanes * 4;
  const size_t m_bytes = kIntRows * n_super * kChunkLanes * 4;
  uint8_t* panel = static_cast<uint8_t*>(tls_panel.Get(u_bytes + s_bytes + m_bytes));
  uint8_t* pu = panel;
  float* ps = reinterpret_cast<float*>(panel + u_bytes);
  float* pm = reinterpret_cast<float*>(panel + u_bytes + s_bytes);
  const int64_t tt = TokenTile(3 * a.k_pad + a.k_pad / 8);
  for (int64_t t0 = 0; t0 < n_tok; t0 += tt) {
    const int64_t t1 = std::min(n_tok, t0 + tt);
    int64_t r = r0;
    for (; r + kIntRows <= r1; r += kIntRows) {
      DecodePanel<kType, kIntRows>(w, r, n_chunks, pu, ps, pm);
      const PanelSrc<kIntRows, kCps> src{pu, ps, pm, n_chunks, n_super};
      int64_t t = t0;
      for (; t + kIntTokens <= t1; t += kIntTokens) {
        IntTile<kIntRows, kIntTokens, kBias, kMin>(src, a, t, shift, y + t * ldy + r, ldy);
      }
      for (; t < t1; ++t) IntTile<kIntRows, 1, kBias, kMin>(src, a, t, shift, y + t * ldy + r, ldy);
    }
    for (; r < r1; ++r) {
      DecodePanel<kType, 1>(w, r, n_chunks, pu, ps, pm);
      const PanelSrc<1, kCps> src{pu, ps, pm, n_chunks, n_super};
      int64_t t = t0;
      for (; t + kIntTokens <= t1; t += kIntTokens) {
        IntTile<1, kIntTokens, kBias, kMin>(src, a, t, shift, y + t * ldy + r, ldy);
      }
      for (; t < t1; ++t) IntTile<1, 1, kBias, kMin>(src, a, t, shift, y + t * ldy + r, ldy);
    }
  }
}

// ---- integer path: Q8_0 repacked as kInterleaved16 ------------------------
// The 16 rows of a group sit in the 16 lanes (matmul_internal.h): per
// 32-block, int32 sums seeded with the activations' block bias take 8
// vpdpbusd (weights from the unit, 4 activation quants broadcast), then one
// conversion, multiply and fma per (group, token). No lane reductions, and a
// group's 16 outputs are one store.
// pf: the lines requested ahead at each chunk (Prefetch in matmul_simd.cc);
// kStream: decode's plan (StreamAhead) with the addresses known at compile
// time, which steps of 2-4 rows ran ~6% faster with than with the same plan in
// pf (ops_bench StepGemm, 1 thread).
template <int kR, int kT, bool kStream = false>
KVX_ATTR void InterleavedTile(const Interleaved16& g, int64_t group, const QuantizedActs& a, int64_t t0, float* y,
                              int64_t ldy, Prefetch pf = {}) {
  __m512 acc[kR][kT];
  KVX_UNROLL for (int r = 0; r < kR; ++r) {
    KVX_UNROLL for (int t = 0; t < kT; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const int8_t* q[kT];
  const float* ds[kT];  // per-block activation scales
  const int32_t* bias[kT];
  KVX_UNROLL for (int t = 0; t < kT; ++t) {
    q[t] = a.QRow(t0 + t);
    ds[t] = a.DsRow(t0 + t);
    bias[t] = a.BlockBiasRow(t0 + t);
  }
  for (int64_t c = 0; c < g.n_chunks; ++c) {
    const uint8_t* unit[kR];
    KVX_UNROLL for (int r = 0; r < kR; ++r) unit[r] = g.Unit(group + r, c);
    if constexpr (kStream) {
      static_assert(kR == 1);
      StreamAhead(g, group).Chunk(c);
    } else {
      pf.Chunk(c);
    }
    KVX_UNROLL for (int h = 0; h < 2; ++h) {
      const int64_t b = 2 * c + h;
      __m512i isum[kR][kT];
      KVX_UNROLL for (int t = 0; t < kT; ++t) {
        const __m512i seed = _mm512_set1_epi32(bias[t][b]);
        KVX_UNROLL for (int r = 0; r < kR; ++r) isum[r][t] = seed;
      }
      KVX_UNROLL for (int s = 0; s < Interleaved16::kSteps; ++s) {
        __m512i wv[kR];
        const int64_t step_offset = (h * Interleaved16::kSteps + s) * 64;
        KVX_UNROLL for (int r = 0; r < kR; ++r) wv[r] = _mm512_load_si512(unit[r] + step_offset);
        KVX_UNROLL for (int t = 0; t < kT; ++t) {
          int32_t a4;
          std::memcpy(&a4, q[t] + kActBlock * b + 4 * s, 4);
          const __m512i av = _mm512_set1_epi32(a4);
          KVX_UNROLL for (int r = 0; r < kR; ++r) isum[r][t] = _mm512_dpbusd_epi32(isum[r][t], wv[r], av);
        }
      }
      KVX_UNROLL for (int r = 0; r < kR; ++r) {
        const uint16_t* scales = Interleaved16::Scales(unit[r]) + Interleaved16::kRows * h;
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales)));
        KVX_UNROLL for (int t = 0; t < kT; ++t) {
          const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(ds[t][b]));
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][t]), scale, acc[r][t]);
        }
      }
    }
  }
  KVX_UNROLL for (int t = 0; t < kT; ++t) {
    KVX_UNROLL for (int r = 0; r < kR; ++r) _mm512_storeu_ps(y + t * ldy + Interleaved16::kRows * r, acc[r][t]);
  }
}

// Prefill tile: kInterleavedGroups groups x kInterleavedTokens tokens.
// Each vpdpbusd needs a weight vector and a broadcast activation; a tile of
// R groups x T tokens loads R + T of them per R*T vpdpbusd, and holds R*T
// int32 sums and R*T float accumulators: 3 x 4 = 24 of the 32 zmm
// registers, 7 loads per 12 vpdpbusd. (ops_bench PrefillGemm/q8_0_repacked,
// 1 thread, alternated: 3x4 ~2.9k tok/s, 2x6 ~2.9k, 4x3 ~2.9k, 1x12 ~2.3k.)
// The same tile serves a batched step of 9..64 rows, now that it prefetches
// the next groups while it computes (StepGemm, 1 thread, CPU time, against
// 1 x 8 and 1 x 12 tiles with the same prefetch: 3 x 4 fastest at 16-64
// rows and for prompts; 2 x 6 within 2%).
constexpr int kInterleavedGroups = 3, kInterleavedTokens = 4;

// Tokens [t0, t1) of kR groups: tiles of kT tokens, the 1..kT-1 left in one
// more tile (one pass over the groups' weights, not one per token), all
// prefetching the next kR groups (SpreadOverTiles).
template <int kR, int kT, int kLeft = kT - 1>
KVX_INLINE void InterleavedLeftover(const Interleaved16& g, int64_t gr, const QuantizedActs& a, int64_t t, int64_t n,
                                    float* yg, int64_t ldy, Prefetch pf) {
  if constexpr (kLeft >= 1) {
    if (n != kLeft) return InterleavedLeftover<kR, kT, kLeft - 1>(g, gr, a, t, n, yg, ldy, pf);
    InterleavedTile<kR, kLeft>(g, gr, a, t, yg + t * ldy, ldy, pf);
  }
}

template <int kR>
KVX_ATTR void InterleavedTokens(const Interleaved16& g, int64_t gr, const QuantizedActs& a, int64_t t0, int64_t t1,
                                float* y, int64_t ldy) {
  constexpr int kT = kInterleavedTokens;
  float* yg = y + Interleaved16::kRows * gr;
  Prefetch pf = SpreadOverTiles(g, gr, kR, (t1 - t0 + kT - 1) / kT);
  int64_t t = t0;
  for (; t + kT <= t1; t += kT, pf = pf.NextTile(g.n_chunks)) {
    InterleavedTile<kR, kT>(g, gr, a, t, yg + t * ldy, ldy, pf);
  }
  InterleavedLeftover<kR, kT>(g, gr, a, t, t1 - t, yg, ldy, pf);
}

// A step of at most 8 rows (decode, a batched step of few sequences): the
// weights stream from DRAM once, group after group with decode's prefetch,
// every row using each weight vector while it is in a register (8 rows: 8
// float and 8 int32 accumulators). Memory-bound there, so one pass beats the
// 3 x 4 tiles' reuse from cache (ops_bench StepGemm, CPU time, 1 thread:
// 4 rows cost what 1 row does).
template <int kT>
KVX_ATTR void InterleavedStream(const Interleaved16& g, int64_t g0, int64_t g1, const QuantizedActs& a, float* y,
                                int64_t ldy) {
  for (int64_t gr = g0; gr < g1; ++gr) {
    InterleavedTile<1, kT, true>(g, gr, a, 0, y + Interleaved16::kRows * gr, ldy);
  }
}

KVX_ATTR void InterleavedRows(const WeightView& w, const QuantizedActs& a, float* y, int64_t r0, int64_t r1) {
  constexpr int kRows = Interleaved16::kRows;
  KVX_CHECK(r0 % kRows == 0 && r1 % kRows == 0);
  const Interleaved16 g = Interleaved16Of(w);
  const int64_t ldy = w.n_out, n_tok = a.n_tokens, g0 = r0 / kRows, g1 = r1 / kRows;
  switch (n_tok) {
    case 1: return InterleavedStream<1>(g, g0, g1, a, y, ldy);
    case 2: return InterleavedStream<2>(g, g0, g1, a, y, ldy);
    case 3: return InterleavedStream<3>(g, g0, g1, a, y, ldy);
    case 4: return InterleavedStream<4>(g, g0, g1, a, y, ldy);
    case 5: return InterleavedStream<5>(g, g0, g1, a, y, ldy);
    case 6: return InterleavedStream<6>(g, g0, g1, a, y, ldy);
    case 7: return InterleavedStream<7>(g, g0, g1, a, y, ldy);
    case 8: return InterleavedStream<8>(g, g0, g1, a, y, ldy);
    default: break;
  }
  const int64_t tt = TokenTile(a.k_pad + a.k_pad / 4);  // quants, block scales (ds), block biases
  for (int64_t t0 = 0; t0 < n_tok; t0 += tt) {
    const int64_t t1 = std::min(n_tok, t0 + tt);
    int64_t gr = g0;
    for (; gr + kInterleavedGroups <= g1; gr += kInterleavedGroups) {
      InterleavedTokens<kInterleavedGroups>(g, gr, a, t0, t1, y, ldy);
    }
    for (; gr < g1; ++gr) InterleavedTokens<1>(g, gr, a, t0, t1, y, ldy);
  }
}

#undef KVX_ATTR
#undef KVX_INLINE

