// AVX2 (+FMA, F16C) MatMul kernels (HWY_AVX2). Included by matmul_simd.cc
// inside the Highway per-target namespace; not a standalone header.
// NOLINT(build/header_guard): included once per target pass.
//
// A 16-lane accumulator is two 8-float halves. Integer path: a 64-element
// chunk is two 32-byte halves; pmaddubsw + pmaddwd give the int32 lanes
// (Q8_0 via the sign trick |w| * sign(a, w), which yields the same exact
// integer as the unsigned-offset form and keeps pmaddubsw from saturating).
// Weights are decoded straight into registers for one token, or once per
// token tile into a panel (as the AVX-512 kernels do). Q8_0 matrices the
// loader repacked (kInterleaved16) have their own kernel, at the end.
#define KVX_ATTR HWY_ATTR
#define KVX_INLINE HWY_ATTR inline __attribute__((always_inline))

struct V16 {
  __m256 lo, hi;
};

KVX_INLINE float Reduce(const V16& v) {
  const __m256 s8 = _mm256_add_ps(v.lo, v.hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// ---- activations (bit-identical to QuantizeActsScalar) ----------------------

KVX_ATTR void QuantizeActs(const float* x, int64_t t0, int64_t t1, QuantizedActs* a) {
  const int64_t k = a->k, nb = a->k_pad / kActBlock;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * k;
    int8_t* q = a->q + t * a->k_pad;
    float* d = a->d + t * (a->k_pad / 4);
    int32_t* bias = a->bias + t * (a->k_pad / 4);
    float* sa = a->sa + t * (a->k_pad / 32);
    for (int64_t b = 0; b < nb; ++b) {
      __m256 v[4];
      for (int j = 0; j < 4; ++j) {
        v[j] = b * kActBlock < k ? _mm256_loadu_ps(xt + b * kActBlock + 8 * j) : _mm256_setzero_ps();
      }
      __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                               _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
      const float db = amax / 127.0f;
      const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
      __m256i qi[4];
      for (int j = 0; j < 4; ++j) qi[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id));
      // int32 -> int8 (no saturation: |q| <= 127); packs interleave 128-bit lanes.
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
      const __m256i q8 = _mm256_permutevar8x32_epi32(p, order);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kActBlock), q8);
      const __m256i lane_sum = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q8), ones16);
      if (a->lane_planes) {
        _mm256_storeu_ps(d + 8 * b, _mm256_set1_ps(db));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(bias + 8 * b), _mm256_sub_epi32(_mm256_setzero_si256(), lane_sum));
      }
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(lane_sum), _mm256_extracti128_si256(lane_sum, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
      const int32_t sum = _mm_cvtsi128_si32(s4);
      sa[b] = db * static_cast<float>(sum);
      a->block_bias[t * (a->k_pad / 32) + b] = -128 * sum;
      a->ds[t * (a->k_pad / 32) + b] = db;
    }
  }
}

template <TensorType kType>
KVX_INLINE __m256 LoadFloatW8(const uint8_t* row, int64_t k) {
  if constexpr (kType == TensorType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else if constexpr (kType == TensorType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <TensorType kType, int kR, int kT>
KVX_ATTR void FloatTile(const uint8_t* row, size_t row_bytes, const float* x, int64_t k, float* y, int64_t ldy) {
  V16 acc[kR][kT];
  KVX_UNROLL for (int r = 0; r < kR; ++r) {
    KVX_UNROLL for (int t = 0; t < kT; ++t) acc[r][t] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  }
  auto step = [&](const uint8_t* const* rows, const float* const* xs, int64_t i) HWY_ATTR {
    V16 w[kR];
    KVX_UNROLL for (int r = 0; r < kR; ++r) w[r] = {LoadFloatW8<kType>(rows[r], i), LoadFloatW8<kType>(rows[r], i + 8)};
    KVX_UNROLL for (int t = 0; t < kT; ++t) {
      const __m256 x0 = _mm256_loadu_ps(xs[t] + i), x1 = _mm256_loadu_ps(xs[t] + i + 8);
      KVX_UNROLL for (int r = 0; r < kR; ++r) {
        acc[r][t].lo = _mm256_fmadd_ps(w[r].lo, x0, acc[r][t].lo);
        acc[r][t].hi = _mm256_fmadd_ps(w[r].hi, x1, acc[r][t].hi);
      }
    }
  };
  const uint8_t* rows[kR];
  const float* xs[kT];
  KVX_UNROLL for (int r = 0; r < kR; ++r) rows[r] = row + r * row_bytes;
  KVX_UNROLL for (int t = 0; t < kT; ++t) xs[t] = x + t * k;
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) step(rows, xs, i);
  if (i < k) {  // tail: zero-padded copies
    constexpr int kElem = kType == TensorType::kF32 ? 4 : 2;
    alignas(32) uint8_t wt[kR][16 * kElem] = {};
    alignas(32) float xt[kT][16] = {};
    const uint8_t* trows[kR];
    const float* txs[kT];
    KVX_UNROLL for (int r = 0; r < kR; ++r) {
      std::memcpy(wt[r], rows[r] + i * kElem, (k - i) * kElem);
      trows[r] = wt[r];
    }
    KVX_UNROLL for (int t = 0; t < kT; ++t) {
      std::memcpy(xt[t], xs[t] + i, (k - i) * 4);
      txs[t] = xt[t];
    }
    step(trows, txs, 0);
  }
  KVX_UNROLL for (int t = 0; t < kT; ++t) {
    KVX_UNROLL for (int r = 0; r < kR; ++r) y[t * ldy + r] = Reduce(acc[r][t]);
  }
}

constexpr int kFloatRows = 2, kFloatTokens = 2;

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
      int64_t t = t0;
      for (; t + kFloatTokens <= t1; t += kFloatTokens) {
        FloatTile<kType, kFloatRows, kFloatTokens>(base + r * rb, rb, x + t * k, k, y + t * ldy + r, ldy);
      }
      for (; t < t1; ++t) FloatTile<kType, kFloatRows, 1>(base + r * rb, rb, x + t * k, k, y + t * ldy + r, ldy);
    }
    for (; r < r1; ++r) {
      for (int64_t t = t0; t < t1; ++t) FloatTile<kType, 1, 1>(base + r * rb, rb, x + t * k, k, y + t * ldy + r, ldy);
    }
  }
}

// ---- integer path -------------------------------------------------------------
// A source yields, for row r, superblock sb, chunk g and half h, 32 quant
// bytes (canonical u, or the signed weights w = u - 128 for kSigned) and the
// 8 lane scales; k-quants with a min also the 8 mins of the superblock.

// Q4_K/Q5_K superblock scales: d*sc_0..7 and dmin*m_0..7.
KVX_INLINE void ScalesQxK2(const uint8_t* blk, __m256* sc, __m256* mn) {
  const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4));  // 12 bytes used
  const __m128i a = _mm_shuffle_epi8(s, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i b = _mm_shuffle_epi8(s, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  const __m128i t1 = _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
  const __m128i t2 =
      _mm_and_si128(_mm_srli_epi16(a, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
  const __m128i t3 = _mm_and_si128(
      _mm_srli_epi16(b, 2), _mm_setr_epi8(0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30, 0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30));
  const __m128i v = _mm_or_si128(_mm_or_si128(t1, t2), t3);
  *sc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), _mm256_set1_ps(LoadF16(blk)));
  *mn = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))), _mm256_set1_ps(LoadF16(blk + 2)));
}

KVX_INLINE __m256 Splat8(__m256 v, int j) { return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(j)); }

template <TensorType kType, int kR>
struct DirectSrc2 {
  static constexpr bool kMinType = kType == TensorType::kQ4_K || kType == TensorType::kQ5_K;
  static constexpr bool kSuper = kMinType || kType == TensorType::kQ6_K;
  static constexpr int kChunksPerSuper = kSuper ? 4 : 1;
  const uint8_t* base;
  size_t row_bytes;
  __m256 sc[kR][2], mn[kR];  // per-superblock state (Q6_K: 16 scales in sc[r][0..1])

  KVX_INLINE const uint8_t* Row(int r) const { return base + r * row_bytes; }
  KVX_INLINE const uint8_t* Super(int r, int64_t sb) const {
    constexpr int kBytes = kType == TensorType::kQ4_K ? kQ4_KBytes : kType == TensorType::kQ5_K ? kQ5_KBytes : kQ6_KBytes;
    return Row(r) + sb * kBytes;
  }
  KVX_INLINE void Begin(int r, int64_t sb) {
    if constexpr (kMinType) ScalesQxK2(Super(r, sb), &sc[r][0], &mn[r]);
    if constexpr (kType == TensorType::kQ6_K) {
      const uint8_t* blk = Super(r, sb);
      const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
      const __m256 d = _mm256_set1_ps(LoadF16(blk + 208));
      sc[r][0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s)), d);
      sc[r][1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s, 8))), d);
    }
  }
  KVX_INLINE void Load(int r, int64_t sb, int g, int h, __m256i* q, __m256* s) const {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if constexpr (kType == TensorType::kQ8_0) {  // signed w
      const uint8_t* p = Row(r) + (2 * sb + h) * kQ8_0Bytes;
      *q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
      *s = _mm256_set1_ps(LoadF16(p));
    } else if constexpr (kType == TensorType::kQ4_0) {
      const uint8_t* p = Row(r) + (2 * sb + h) * kQ4_0Bytes;
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
      const __m256i vv = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
      *q = _mm256_and_si256(vv, m4);
      *s = _mm256_set1_ps(LoadF16(p));
    } else if constexpr (kMinType) {
      const bool q5 = kType == TensorType::kQ5_K;
      const uint8_t* blk = Super(r, sb);
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + (q5 ? 32 : 0) + 32 * g));
      __m256i u = _mm256_and_si256(h == 0 ? v : _mm256_srli_epi16(v, 4), m4);
      if (q5) {
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
        const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g + h)), _mm256_set1_epi8(1));
        u = _mm256_or_si256(u, _mm256_slli_epi16(bit, 4));
      }
      *q = u;
      *s = Splat8(sc[r][0], 2 * g + h);
    } else {  // Q6_K
      const uint8_t* blk = Super(r, sb);
      const int hh = g / 2, k4 = 2 * (g % 2) + h;
      const __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * hh + 32 * (k4 & 1)));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * hh));
      const __m256i low = _mm256_and_si256(k4 < 2 ? l : _mm256_srli_epi16(l, 4), m4);
      const __m256i high =
          _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k4)), _mm256_set1_epi8(3));
      *q = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
      const int j = 4 * g + 2 * h;  // 16-element groups j, j+1 (lanes 0-3, 4-7)
      const __m256 half = sc[r][j / 8];
      *s = _mm256_permutevar8x32_ps(half, _mm256_setr_epi32(j % 8, j % 8, j % 8, j % 8, j % 8 + 1, j % 8 + 1,
                                                             j % 8 + 1, j % 8 + 1));
    }
  }
  KVX_INLINE __m256 Min(int r, int64_t) const { return mn[r]; }
};

// Canonical chunks from a decoded panel.
template <int kR, bool kSigned>
struct PanelSrc2 {
  const uint8_t* u;
  const float* s;
  const float* m;
  int64_t n_chunks, n_super;
  int cps;
  KVX_INLINE void Begin(int, int64_t) {}
  KVX_INLINE void Load(int r, int64_t sb, int g, int h, __m256i* q, __m256* sv) const {
    const int64_t c = sb * cps + g;
    *q = _mm256_load_si256(reinterpret_cast<const __m256i*>(u + (r * n_chunks + c) * kChunk + 32 * h));
    if (kSigned) *q = _mm256_xor_si256(*q, _mm256_set1_epi8(static_cast<char>(0x80)));  // back to w
    *sv = _mm256_load_ps(s + (r * n_chunks + c) * kChunkLanes + 8 * h);
  }
  KVX_INLINE __m256 Min(int r, int64_t sb) const { return _mm256_load_ps(m + (r * n_super + sb) * kChunkLanes); }
};

template <int kR, int kT, int kCps, bool kSigned, bool kBias, bool kMin, class Src>
KVX_ATTR void IntTile(Src src, const QuantizedActs& a, int64_t t0, int shift, float* y, int64_t ldy) {
  V16 acc[kR][kT];
  KVX_UNROLL for (int r = 0; r < kR; ++r) {
    KVX_UNROLL for (int t = 0; t < kT; ++t) acc[r][t] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  }
  const __m128i cnt = _mm_cvtsi32_si128(shift);
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t n_super = a.k_pad / kChunk / kCps;
  for (int64_t sb = 0; sb < n_super; ++sb) {
    KVX_UNROLL for (int r = 0; r < kR; ++r) src.Begin(r, sb);
    KVX_UNROLL for (int g = 0; g < kCps; ++g) {
      const int64_t c = sb * kCps + g;
      KVX_UNROLL for (int h = 0; h < 2; ++h) {
        __m256i w[kR];
        __m256 s[kR];
        KVX_UNROLL for (int r = 0; r < kR; ++r) src.Load(r, sb, g, h, &w[r], &s[r]);
        KVX_UNROLL for (int t = 0; t < kT; ++t) {
          const __m256i av =
              _mm256_load_si256(reinterpret_cast<const __m256i*>(a.QRow(t0 + t) + c * kChunk + 32 * h));
          const __m256 dv = _mm256_load_ps(a.DRow(t0 + t) + c * kChunkLanes + 8 * h);
          __m256i bv = _mm256_setzero_si256();
          if (kBias && !kSigned) {
            bv = _mm256_sll_epi32(
                _mm256_load_si256(reinterpret_cast<const __m256i*>(a.BiasRow(t0 + t) + c * kChunkLanes + 8 * h)),
                cnt);
          }
          KVX_UNROLL for (int r = 0; r < kR; ++r) {
            __m256i p;
            if (kSigned) {
              p = _mm256_maddubs_epi16(_mm256_abs_epi8(w[r]), _mm256_sign_epi8(av, w[r]));
            } else {
              p = _mm256_maddubs_epi16(w[r], av);
            }
            __m256i i = _mm256_madd_epi16(p, ones);
            if (kBias && !kSigned) i = _mm256_add_epi32(i, bv);
            __m256& ah = h == 0 ? acc[r][t].lo : acc[r][t].hi;
            ah = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(s[r], dv), ah);
          }
        }
      }
    }
    if constexpr (kMin) {
      KVX_UNROLL for (int r = 0; r < kR; ++r) {
        const __m256 mv = src.Min(r, sb);
        KVX_UNROLL for (int t = 0; t < kT; ++t) {
          acc[r][t].lo = _mm256_fnmadd_ps(mv, _mm256_loadu_ps(a.SaRow(t0 + t) + 8 * sb), acc[r][t].lo);
        }
      }
    }
  }
  KVX_UNROLL for (int t = 0; t < kT; ++t) {
    KVX_UNROLL for (int r = 0; r < kR; ++r) y[t * ldy + r] = Reduce(acc[r][t]);
  }
}

constexpr int kIntRows = 2, kIntTokens = 2, kDecodeRows = 4;

template <TensorType kType>
KVX_ATTR void IntRowsTyped(const WeightView& w, const QuantizedActs& a, float* y, int64_t r0, int64_t r1) {
  constexpr IntTypeInfo kInfo = GetIntTypeInfo(kType);
  constexpr bool kSigned = kType == TensorType::kQ8_0;
  constexpr bool kBias = kInfo.bias_shift >= 0, kMin = kInfo.has_min;
  constexpr int kCps = kInfo.chunks_per_super;
  const int shift = kBias ? kInfo.bias_shift : 0;
  const int64_t ldy = w.n_out, n_tok = a.n_tokens;
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  if (n_tok == 1 && w.n_in % kChunk == 0) {  // decode: weights straight into registers
    int64_t r = r0;
    for (; r + kDecodeRows <= r1; r += kDecodeRows) {
      DirectSrc2<kType, kDecodeRows> src;
      src.base = base + r * w.row_bytes;
      src.row_bytes = w.row_bytes;
      IntTile<kDecodeRows, 1, kCps, kSigned, kBias, kMin>(src, a, 0, shift, y + r, ldy);
    }
    for (; r < r1; ++r) {
      DirectSrc2<kType, 1> src;
      src.base = base + r * w.row_bytes;
      src.row_bytes = w.row_bytes;
      IntTile<1, 1, kCps, kSigned, kBias, kMin>(src, a, 0, shift, y + r, ldy);
    }
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
  // The panel holds canonical chunks from the scalar decoder (decoding is
  // amortized over the token tile).
  auto decode = [&](int64_t r, int rows) {
    for (int rr = 0; rr < rows; ++rr) {
      const uint8_t* row = base + (r + rr) * w.row_bytes;
      for (int64_t c = 0; c < n_chunks; ++c) {
        float* m = kMin && c % kCps == 0 ? pm + (rr * n_super + c / kCps) * kChunkLanes : nullptr;
        DecodeChunkScalar(w.type, row, w.n_in, c, pu + (rr * n_chunks + c) * kChunk,
                          ps + (rr * n_chunks + c) * kChunkLanes, m);
      }
    }
  };
  const int64_t tt = TokenTile(3 * a.k_pad + a.k_pad / 8);
  for (int64_t t0 = 0; t0 < n_tok; t0 += tt) {
    const int64_t t1 = std::min(n_tok, t0 + tt);
    int64_t r = r0;
    for (; r + kIntRows <= r1; r += kIntRows) {
      decode(r, kIntRows);
      const PanelSrc2<kIntRows, kSigned> src{pu, ps, pm, n_chunks, n_super, kCps};
      int64_t t = t0;
      for (; t + kIntTokens <= t1; t += kIntTokens) {
        IntTile<kIntRows, kIntTokens, kCps, kSigned, kBias, kMin>(src, a, t, shift, y + t * ldy + r, ldy);
      }
      for (; t < t1; ++t) IntTile<kIntRows, 1, kCps, kSigned, kBias, kMin>(src, a, t, shift, y + t * ldy + r, ldy);
    }
    for (; r < r1; ++r) {
      decode(r, 1);
      const PanelSrc2<1, kSigned> src{pu, ps, pm, n_chunks, n_super, kCps};
      for (int64_t t = t0; t < t1; ++t) {
        IntTile<1, 1, kCps, kSigned, kBias, kMin>(src, a, t, shift, y + t * ldy + r, ldy);
      }
    }
  }
}

// ---- integer path: Q8_0 repacked as kInterleaved16 ------------------------
// The 16 rows of a group are two 8-lane halves. The layout stores w + 128 for
// vpdpbusd; without VNNI each step takes the signed weights back (one xor
// per half, shared by the tile's tokens) and sums 4 products per lane with
// the sign trick (pmaddubsw(|w|, sign(a, w)), pairs <= 2 * 128 * 127, so no
// saturation, then pmaddwd). The exact int32 block sums then get the same
// conversion, multiply and fma as on AVX3_DL (matmul_internal.h), so the
// outputs are bit-identical. kT tokens share each weight vector; 1 group x 2
// tokens fits its sums, accumulators, weights and constants in the 16 ymm
// registers.
// What both 16-row tiles below share (KVX_INLINE, so that they inline into
// the AVX-VNNI tile too, whose target is a superset): block b's exact int32
// sums of kT tokens (isum[t][half of 8 rows]) times weight scale x activation
// scale, added to the accumulators; the stores. Both tiles request pf's
// lines at each chunk (Prefetch in matmul_simd.cc).
template <int kT>
KVX_INLINE void ScaleBlockInto(const uint8_t* unit, int h, const float* const* ds, int64_t b,
                               const __m256i (*isum)[2], V16* acc) {
  const uint16_t* scales = Interleaved16::Scales(unit) + Interleaved16::kRows * h;
  const __m256 dw[2] = {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales))),
                        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 8)))};
  KVX_UNROLL for (int t = 0; t < kT; ++t) {
    const __m256 dt = _mm256_set1_ps(ds[t][b]);
    acc[t].lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t][0]), _mm256_mul_ps(dw[0], dt), acc[t].lo);
    acc[t].hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t][1]), _mm256_mul_ps(dw[1], dt), acc[t].hi);
  }
}

template <int kT>
KVX_INLINE void StoreTile(const V16* acc, float* y, int64_t ldy) {
  KVX_UNROLL for (int t = 0; t < kT; ++t) {
    _mm256_storeu_ps(y + t * ldy, acc[t].lo);
    _mm256_storeu_ps(y + t * ldy + 8, acc[t].hi);
  }
}

template <int kT>
KVX_ATTR void InterleavedTile2(const Interleaved16& g, int64_t group, const QuantizedActs& a, int64_t t0, float* y,
                               int64_t ldy, Prefetch pf) {
  V16 acc[kT];
  KVX_UNROLL for (int t = 0; t < kT; ++t) acc[t] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  const int8_t* q[kT];
  const float* ds[kT];
  KVX_UNROLL for (int t = 0; t < kT; ++t) {
    q[t] = a.QRow(t0 + t);
    ds[t] = a.DsRow(t0 + t);
  }
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  for (int64_t c = 0; c < g.n_chunks; ++c) {
    const uint8_t* unit = g.Unit(group, c);
    pf.Chunk(c);
    KVX_UNROLL for (int h = 0; h < 2; ++h) {
      const int64_t b = 2 * c + h;
      __m256i isum[kT][2];
      KVX_UNROLL for (int t = 0; t < kT; ++t) isum[t][0] = isum[t][1] = _mm256_setzero_si256();
      KVX_UNROLL for (int s = 0; s < Interleaved16::kSteps; ++s) {
        const uint8_t* p = unit + (h * Interleaved16::kSteps + s) * 64;
        __m256i w[2], u[2];
        KVX_UNROLL for (int j = 0; j < 2; ++j) {
          w[j] = _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32 * j)), flip);
          u[j] = _mm256_abs_epi8(w[j]);
        }
        KVX_UNROLL for (int t = 0; t < kT; ++t) {
          int32_t a4;
          std::memcpy(&a4, q[t] + kActBlock * b + 4 * s, 4);
          const __m256i av = _mm256_set1_epi32(a4);
          KVX_UNROLL for (int j = 0; j < 2; ++j) {
            const __m256i pairs = _mm256_maddubs_epi16(u[j], _mm256_sign_epi8(av, w[j]));
            isum[t][j] = _mm256_add_epi32(isum[t][j], _mm256_madd_epi16(pairs, ones));
          }
        }
      }
      ScaleBlockInto<kT>(unit, h, ds, b, isum, acc);
    }
  }
  StoreTile<kT>(acc, y, ldy);
}

// With AVX-VNNI (not a Highway target; simd_target.cc's AVX2_VNNI): the
// AVX3_DL kernel's arithmetic on 8 lanes. Each block's int32 sums start at
// the activations' block bias and take one vpdpbusd per half and step on the
// stored w + 128, which gives the same exact sums as the sign trick, so the
// outputs stay bit-identical. Sums, accumulators, the weight halves and the
// broadcast activation of 3 tokens fit the 16 ymm registers.
// One target attribute naming both: clang does not merge two of them.
#define KVX_ATTR_VNNI __attribute__((target(HWY_TARGET_STR "," KVX_AVX2_VNNI_FEATURES)))
template <int kT>
KVX_ATTR_VNNI void InterleavedTileVnni(const Interleaved16& g, int64_t group, const QuantizedActs& a, int64_t t0,
                                       float* y, int64_t ldy, Prefetch pf) {
  V16 acc[kT];
  KVX_UNROLL for (int t = 0; t < kT; ++t) acc[t] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  const int8_t* q[kT];
  const float* ds[kT];
  const int32_t* bias[kT];
  KVX_UNROLL for (int t = 0; t < kT; ++t) {
    q[t] = a.QRow(t0 + t);
    ds[t] = a.DsRow(t0 + t);
    bias[t] = a.BlockBiasRow(t0 + t);
  }
  for (int64_t c = 0; c < g.n_chunks; ++c) {
    const uint8_t* unit = g.Unit(group, c);
    pf.Chunk(c);
    KVX_UNROLL for (int h = 0; h < 2; ++h) {
      const int64_t b = 2 * c + h;
      __m256i isum[kT][2];
      KVX_UNROLL for (int t = 0; t < kT; ++t) isum[t][0] = isum[t][1] = _mm256_set1_epi32(bias[t][b]);
      KVX_UNROLL for (int s = 0; s < Interleaved16::kSteps; ++s) {
        const uint8_t* p = unit + (h * Interleaved16::kSteps + s) * 64;
        const __m256i w[2] = {_mm256_load_si256(reinterpret_cast<const __m256i*>(p)),
                              _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32))};
        KVX_UNROLL for (int t = 0; t < kT; ++t) {
          int32_t a4;
          std::memcpy(&a4, q[t] + kActBlock * b + 4 * s, 4);
          const __m256i av = _mm256_set1_epi32(a4);
          KVX_UNROLL for (int j = 0; j < 2; ++j) isum[t][j] = _mm256_dpbusd_avx_epi32(isum[t][j], w[j], av);
        }
      }
      ScaleBlockInto<kT>(unit, h, ds, b, isum, acc);
    }
  }
  StoreTile<kT>(acc, y, ldy);
}

// Rows [r0, r1) of a repacked matrix with either tile (Tile::Run<kT>):
// decode and steps of up to kT rows one group at a time, each streaming its
// own weights (StreamAhead); longer steps and prompts in token tiles that stay
// in L2 (quants and block scales), kT tokens per call, prefetching the next
// group while they compute (SpreadOverTiles).
template <class Tile, int kT>
KVX_INLINE void InterleavedRowsWith(const WeightView& w, const QuantizedActs& a, float* y, int64_t r0, int64_t r1) {
  constexpr int kRows = Interleaved16::kRows;
  KVX_CHECK(r0 % kRows == 0 && r1 % kRows == 0);
  const Interleaved16 g = Interleaved16Of(w);
  const int64_t ldy = w.n_out, n_tok = a.n_tokens, g0 = r0 / kRows, g1 = r1 / kRows;
  if (n_tok <= kT) {  // decode, a batched step of few sequences: every row per weight load, one prefetched stream
    static_assert(kT <= 3);
    for (int64_t gr = g0; gr < g1; ++gr) {
      float* yg = y + kRows * gr;
      const Prefetch pf = StreamAhead(g, gr);
      if (n_tok == 1) Tile::template Run<1>(g, gr, a, 0, yg, ldy, pf);
      if constexpr (kT >= 2) {
        if (n_tok == 2) Tile::template Run<2>(g, gr, a, 0, yg, ldy, pf);
      }
      if constexpr (kT >= 3) {
        if (n_tok == 3) Tile::template Run<3>(g, gr, a, 0, yg, ldy, pf);
      }
    }
    return;
  }
  const int64_t tt = TokenTile(a.k_pad + a.k_pad / 8);
  for (int64_t t0 = 0; t0 < n_tok; t0 += tt) {
    const int64_t t1 = std::min(n_tok, t0 + tt);
    for (int64_t gr = g0; gr < g1; ++gr) {
      float* yg = y + kRows * gr;
      Prefetch pf = SpreadOverTiles(g, gr, 1, (t1 - t0) / kT + (t1 - t0) % kT);
      int64_t t = t0;
      for (; t + kT <= t1; t += kT, pf = pf.NextTile(g.n_chunks)) {
        Tile::template Run<kT>(g, gr, a, t, yg + t * ldy, ldy, pf);
      }
      for (; t < t1; ++t, pf = pf.NextTile(g.n_chunks)) Tile::template Run<1>(g, gr, a, t, yg + t * ldy, ldy, pf);
    }
  }
}

struct SignTrickTile {
  template <int kT>
  static KVX_INLINE void Run(const Interleaved16& g, int64_t gr, const QuantizedActs& a, int64_t t0, float* y,
                             int64_t ldy, Prefetch pf) {
    InterleavedTile2<kT>(g, gr, a, t0, y, ldy, pf);
  }
};
struct VnniTile {
  template <int kT>
  static KVX_INLINE void Run(const Interleaved16& g, int64_t gr, const QuantizedActs& a, int64_t t0, float* y,
                             int64_t ldy, Prefetch pf) {
    InterleavedTileVnni<kT>(g, gr, a, t0, y, ldy, pf);
  }
};

// Tokens per tile (ops_bench PrefillGemm/q8_0_repacked/thr1 forced to AVX2:
// 2 tokens 132 GFLOP/s, 4 tokens 125, whose accumulators spill).
constexpr int kInterleavedTokens2 = 2, kInterleavedTokensVnni = 3;

KVX_ATTR_VNNI void InterleavedRowsVnni(const WeightView& w, const QuantizedActs& a, float* y, int64_t r0,
                                       int64_t r1) {
  InterleavedRowsWith<VnniTile, kInterleavedTokensVnni>(w, a, y, r0, r1);
}

KVX_ATTR void InterleavedRows(const WeightView& w, const QuantizedActs& a, float* y, int64_t r0, int64_t r1) {
  if (AvxVnniEnabled()) return InterleavedRowsVnni(w, a, y, r0, r1);
  InterleavedRowsWith<SignTrickTile, kInterleavedTokens2>(w, a, y, r0, r1);
}
#undef KVX_ATTR_VNNI

#undef KVX_ATTR
#undef KVX_INLINE
