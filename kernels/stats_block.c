/*
 * stats_block.c - the block driver of the vectorised statistics paths, shared
 * by the AVX2 path (block functions in stats_avx2.c) and the AVX-512 path
 * (stats_avx512.c); stats_dispatch.c chooses which runs. Compiled with -mavx2
 * -mf16c -mfma: it is only ever called on a CPU that has them.
 *
 * The driver cuts the input into blocks of up to 4096 elements (16384 in
 * window mode), calls the path's block function on each (a table,
 * probe__blk_ops), checks the block for inf/NaN and redoes such a block with
 * the path's short-tensor routine (ops->redo), and owns the histogram: the
 * 66x66 pair table of pair mode (pair indices lo + 66*hi written by the
 * block functions, counted by scalar increments interleaved with the next
 * block's vector loop, folded into the 66 bins before a 16-bit counter can
 * wrap and at the end), or in window mode the window itself: it picks and
 * moves the window, counts the elements outside it (outb), owns the
 * window's carry-save counters (probe__hs, read with the path's hs_count)
 * and makes the corrections fp16 window blocks' sums need (the elements
 * outside the window added, what zeros and subnormals put into the squares
 * taken out).
 *
 * Pair indices are made of exact bins (fp16 ones from the binary32
 * exponent of the F16C conversion, so subnormals land in their bins: a
 * scalar fix-up per subnormal cost ~12 ns an element on tensors of
 * underflowing FP16 values); zeros land in bin 0 and are subtracted there.
 * The FP16-subnormal count of every dtype is read off the histogram (bins
 * below exponent -14) instead of being counted per element. In window mode
 * zeros never enter the histogram and fp16 subnormals reach outb with their
 * patterns.
 *
 * Data may be unaligned; the last n % group elements (group: 32 for AVX2, 64
 * for AVX-512) go through the portable routine.
 */
#include "stats_impl.h"

size_t probe__stream_bytes = PROBE__STREAM_BYTES;

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

enum {
  BLOCK = PROBE__BLOCK,                        /* elements per checked block */
  WIN = PROBE__WIN,                            /* window-mode window width */
  SMALL = 65536,                               /* see pair_hist.small */
  /* Window mode is given up for pair mode when more than 1/WIN_OUT_MAX of
   * the values counted since the last choice lie outside the best window:
   * an element outside costs some 40 times one inside, and pair mode about
   * 2-3 times (bench_stats --dist, bench/results/stats.md). */
  WIN_OUT_MAX = 64,
  NB = PROBE_HIST_BINS,                        /* 66 */
  TABLE = PROBE_HIST_BINS * PROBE_HIST_BINS,   /* pair table entries */
};

/* fp16 raw exponent field e (1..30) has floor(log2|x|) = e - 15, bin
 * e - 15 - MIN_EXP + 1 = e + 18. */
#define F16_BIAS (-15 - PROBE_HIST_MIN_EXP + 1)
/* binary32 raw exponent e8: bin e8 - 127 - MIN_EXP + 1 = e8 - 94, clamped. */
#define F32_BIAS (127 + PROBE_HIST_MIN_EXP - 1)

/* Per-call histogram state: the pair table, direct bin counts, and the
 * corrections to apply at the fold. */
typedef struct pair_hist {
  /* table[k][lo + 66*hi]: pairs with bins lo, hi. Four copies, taken in
   * turn, so that runs of equal indices do not chain through one counter;
   * 16-bit counters keep all four in L1 and are folded before they wrap.
   * Zeroed only when first used (table_ready). */
  uint16_t table[4][TABLE];
  int table_ready;
  /* Calls on fewer than SMALL elements do not use the table in pair mode
   * (zeroing and folding it would cost more than their data): they count
   * both bins of each pair straight into direct[][], as window mode counts
   * its bins (two copies, taken in turn). */
  int small;
  uint64_t direct[2][NB];
  int64_t corr[NB];          /* added to the folded bins */
  uint64_t in_hist;          /* elements counted since the last fold */
  uint32_t per_copy;         /* pairs per table copy since the last fold */
  uint32_t idx[2][BLOCK / 2]; /* pair indices: this block, the pending one */
  uint16_t outb[PROBE__WBLOCK + 32]; /* window mode: the elements outside the window */
  probe__hs hs; /* window mode: counts of the elements inside the window */
  uint64_t win_elems, win_out; /* window mode: elements, and those outside */
  uint64_t outcnt[256];        /* window mode: those outside, by window value */
  unsigned since, backoff;     /* window mode: blocks since the last choice */
} pair_hist;

typedef probe__blk blk;

/* Folds the pair table and the direct counts into a->hist, and the
 * FP16-subnormal count, which is the number of non-zero values in bins
 * below exponent -14 (every bin is exact, fp16 subnormals' too). */
static void fold(probe__acc *a, pair_hist *ph) {
  if (ph->in_hist == 0) return;
  uint64_t lo[NB], hi[NB] = {0};
  for (int i = 0; i < NB; i++) lo[i] = ph->direct[0][i] + ph->direct[1][i];
  memset(ph->direct, 0, sizeof ph->direct);
  for (int j = 0; j < NB && ph->table_ready; j++) {
    uint32_t row[NB];
    for (int i = 0; i < NB; i++)
      row[i] = (uint32_t)ph->table[0][NB * j + i] + ph->table[1][NB * j + i] +
               ph->table[2][NB * j + i] + ph->table[3][NB * j + i];
    uint64_t r = 0;
    for (int i = 0; i < NB; i++) {
      lo[i] += row[i];
      r += row[i];
    }
    hi[j] = r;
  }
  int64_t bins[NB];
  for (int i = 0; i < NB; i++) bins[i] = (int64_t)(lo[i] + hi[i]) + ph->corr[i];
  int64_t sub = 0;
  for (int i = 0; i < PROBE__SUB_BINS; i++) sub += bins[i];
  a->sub += (uint64_t)sub; /* corr[0] already removed the zeros */
  for (int i = 0; i < NB; i++) a->hist[i] += (uint64_t)bins[i];
  if (ph->table_ready) memset(ph->table, 0, sizeof ph->table);
  memset(ph->corr, 0, sizeof ph->corr);
  ph->in_hist = 0;
  ph->per_copy = 0;
}

/* The window value the AVX-512 block functions use for one element (the raw
 * exponent field: fp16 0..31, fp32/bf16 the binary32 one, 0..255). */
static int win_value(probe_dtype dt, const unsigned char *p, size_t i, int *nonzero) {
  if (dt == PROBE_DTYPE_F32) {
    uint32_t u;
    memcpy(&u, p + 4 * i, 4);
    *nonzero = (u & 0x7fffffffu) != 0;
    return (int)((u >> 23) & 0xffu);
  }
  uint16_t h;
  memcpy(&h, p + 2 * i, 2);
  *nonzero = (h & 0x7fffu) != 0;
  return dt == PROBE_DTYPE_F16 ? (h >> 10) & 31 : (h >> 7) & 0xff;
}

/* The start (>= lo) of the width-value window holding most of
 * cnt[lo..nvals), and how many it holds. Of a run of equally good starts
 * (nothing seen past either end) it takes the middle one, leaving a margin
 * on both sides. */
static int best_window(const uint64_t *cnt, int lo, int nvals, int width, uint64_t *held) {
  int first = lo, last = lo;
  uint64_t c = 0;
  for (int k = 0; k < width; k++) c += cnt[lo + k];
  uint64_t bestc = c;
  for (int w = lo + 1; w + width <= nvals; w++) {
    c += cnt[w + width - 1] - cnt[w - 1];
    if (c > bestc) {
      bestc = c;
      first = last = w;
    } else if (c == bestc && last == w - 1) {
      last = w;
    }
  }
  *held = bestc;
  return (first + last) / 2;
}

/* Whether data[0..n) holds inf or NaN: a vector compare of |x| with the
 * smallest non-finite pattern (run for blocks whose count of |x| >= 65520 is
 * not 0; the scalar loop it replaced cost ~0.5 ns an element). */
static int has_nonfinite(probe_dtype dt, const void *data, size_t n) {
  const unsigned char *p = data;
  __m256i any = _mm256_setzero_si256();
  size_t i = 0;
  if (dt == PROBE_DTYPE_F32) {
    const __m256i mabs = _mm256_set1_epi32(0x7fffffff), big = _mm256_set1_epi32(0x7f7fffff);
    for (; i + 8 <= n; i += 8)
      any = _mm256_or_si256(any, _mm256_cmpgt_epi32(_mm256_and_si256(
          _mm256_loadu_si256((const __m256i *)(const void *)(p + 4 * i)), mabs), big));
    for (; i < n; i++) {
      uint32_t u;
      memcpy(&u, p + 4 * i, 4);
      if ((u & 0x7fffffffu) >= 0x7f800000u) return 1;
    }
  } else {
    const uint16_t lim = dt == PROBE_DTYPE_F16 ? 0x7c00u : 0x7f80u;
    const __m256i mabs = _mm256_set1_epi16(0x7fff), big = _mm256_set1_epi16((short)(lim - 1u));
    for (; i + 16 <= n; i += 16)
      any = _mm256_or_si256(any, _mm256_cmpgt_epi16(_mm256_and_si256(
          _mm256_loadu_si256((const __m256i *)(const void *)(p + 2 * i)), mabs), big));
    for (; i < n; i++) {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      if ((h & 0x7fffu) >= lim) return 1;
    }
  }
  return !_mm256_testz_si256(any, any);
}

/* The elements of an fp16 window block outside the window (ph->outb, their
 * patterns: subnormals always, and the tails): their bins, their window
 * values (outcnt, for the next choice), what the block's sums left out (the
 * sum holds only the elements inside; for a subnormal the squares hold
 * (2 + u/512)^2 * 2^-32 instead of x^2). Elements alternate between two
 * sets of accumulators, without branches, converted by F16C: a
 * data-dependent branch, one chain of additions and a software conversion
 * made each element cost several ns on tensors with many subnormals. */
static void out_f16(pair_hist *ph, blk *b) {
  double s[2] = {0, 0}, q[2] = {0, 0};
  for (size_t i = 0; i < b->nout; i++) {
    uint16_t h = ph->outb[i], u = h & 0x7fffu;
    float x = _cvtsh_ss(h);
    ph->direct[i & 1][probe__hist_bin(probe_f32_bits(x) & 0x7fffffffu)]++;
    ph->outcnt[u >> 10]++;
    s[i & 1] += x;
    double wrong = 2.0 + (double)u * 0x1p-9;
    q[i & 1] += u < 0x0400u ? (double)x * x - wrong * wrong * 0x1p-32 : 0.0;
  }
  b->sum += s[0] + s[1];
  b->sumsq += q[0] + q[1];
}

/* Window mode: counts the window counters into the direct bins (window
 * value win + k is bin wbin[win + k]; wc[k] receives the count), and the
 * zeros of the window blocks into a, and clears them and outcnt. zero_sq is
 * what each of those zeros put into the blocks' sums of squares (fp16:
 * 2^-30, stats_avx512.c), taken back out here. */
static void win_flush(probe__acc *a, pair_hist *ph, const probe__blk_ops *ops, int win,
                      const uint8_t *wbin, double zero_sq, uint64_t wc[WIN]) {
  uint64_t in = 0;
  ops->hs_count(&ph->hs, wc);
  for (int k = 0; k < WIN; k++) {
    ph->direct[0][wbin[win + k]] += wc[k];
    in += wc[k];
  }
  /* Every non-zero element of a window block is inside or outside. */
  uint64_t zeros = ph->win_elems - in - ph->win_out;
  a->zero += zeros;
  a->sumsq -= zero_sq * (double)zeros;
  ph->win_elems = ph->win_out = 0;
  memset(ph->outcnt, 0, sizeof ph->outcnt);
  memset(ph->hs.lo[ph->hs.cur], 0, sizeof ph->hs.lo[0]);
  memset(ph->hs.hi, 0, sizeof ph->hs.hi);
  ph->hs.n16 = 0;
  ph->hs.nbig = 0;
}

/* Runs the block functions blk[dt] over data(n); group = elements per
 * vector step (32 for AVX2, 64 for AVX-512), block sizes are multiples of
 * it; the rest goes through the portable loop. `window` allows window mode
 * (probe__pending.win; both tables set it): it starts when a sample of 64
 * elements has >= 1/2 of its window values in some window; the window is
 * chosen again when a quarter of a block lay outside it (or, with a
 * backoff, more than 1/1024), and pair mode takes over when more than
 * 1/WIN_OUT_MAX of the values since the last choice lie outside the best
 * window (docs/statistics.md). */
static void drive(probe__acc *a, probe_dtype dt, const void *data, size_t n,
                  const probe__blk_ops *ops) {
  const size_t group = ops->group;
  pair_hist ph;
  ph.small = n < SMALL;
  ph.table_ready = 0;
  memset(ph.direct, 0, sizeof ph.direct);
  memset(ph.corr, 0, sizeof ph.corr);
  ph.in_hist = 0;
  ph.per_copy = 0;
  /* Window values (raw exponent fields) and their bins. */
  const int nvals = dt == PROBE_DTYPE_F16 ? 32 : 256;
  /* No window holds raw exponent field 0 (zeros and subnormals): zeros stay
   * outside, which the AVX2 one-hot words need (they are not masked by
   * non-zero: an fp32 window from field 0 counted every zero in its bin 0,
   * until 2026-12-02), and every subnormal reaches outb (fp16 and AVX2 bf16:
   * with its pattern, into its exact bin; fp32 and AVX-512 bf16: field 0,
   * bin 0). An fp16 window holds 15 values, not 16 (PROBE__WIN16), and what
   * its blocks' sums of squares count for a zero is taken back out at every
   * flush. */
  const int bf16p = dt == PROBE_DTYPE_BF16 && ops->bf16_patterns; /* likewise */
  const int wlo = 1;
  const int width = dt == PROBE_DTYPE_F16 || bf16p ? PROBE__WIN16 : WIN;
  const double zero_sq = dt == PROBE_DTYPE_F16 ? 0x1p-30 : bf16p ? 0x1p-254 : 0.0;
  uint8_t wbin[256 + WIN] = {0}; /* (values >= nvals never occur) */
  for (int v = 0; v < nvals; v++) {
    int bin = dt == PROBE_DTYPE_F16 ? v + F16_BIAS : v - F32_BIAS;
    wbin[v] = (uint8_t)(bin < 0 ? 0 : bin > NB - 1 ? NB - 1 : bin);
  }
  probe__pending pd = {.idx = NULL, .n = 0, .win = -1, .outb = ph.outb, .hs = &ph.hs,
                       .stream = n * probe_dtype_size(dt) >= probe__stream_bytes};
  ph.hs.cur = 0;
  memset(ph.hs.lo, 0, sizeof ph.hs.lo); /* both: a path may leave lanes unwritten */
  memset(ph.hs.hi, 0, sizeof ph.hs.hi);
  ph.hs.n16 = 0;
  ph.hs.nbig = 0;
  ph.win_elems = ph.win_out = 0;
  memset(ph.outcnt, 0, sizeof ph.outcnt);
  ph.since = 0;
  ph.backoff = 1;
  uint64_t wc[WIN];
  for (int k = 0; k < 4; k++) pd.t[k] = ph.table[k];
  int cur = 0; /* ph.idx[cur] receives this block's indices */
  const size_t es = probe_dtype_size(dt);
  const unsigned char *p = data;

  if (ops->window && n >= group) {
    uint64_t cnt[256] = {0}, held;
    size_t ns = n < 64 ? n : 64, stride = n / ns; /* cheap: ~1 ns each */
    size_t nnz = 0;
    for (size_t i = 0; i < ns; i++) {
      int nonzero, v = win_value(dt, p, i * stride, &nonzero);
      cnt[v] += (uint64_t)nonzero; /* zeros never enter the window */
      nnz += (size_t)nonzero;
    }
    int w = best_window(cnt, wlo, nvals, width, &held);
    if (2 * held >= nnz) pd.win = w;
  }

  size_t done = 0;
  while (n - done >= group) {
    size_t bmax = pd.win >= 0 ? PROBE__WBLOCK : BLOCK;
    size_t m = n - done < bmax ? n - done : bmax;
    m -= m % group;
    size_t nv = m / 16; /* 16-element groups */
    const unsigned char *q = p + done * es;
    if (pd.win < 0 && !ph.small && !ph.table_ready) {
      memset(ph.table, 0, sizeof ph.table);
      ph.table_ready = 1;
    }
    if (pd.win >= 0 && pd.n) { /* window blocks do not count pending pairs */
      probe__pending_count(&pd, 0, pd.n);
      pd.n = 0;
    }
    blk b;
    ops->blk[dt](&b, ph.idx[cur], q, nv, &pd); /* also counts the pending pairs */
    pd.n = 0;
    if (b.nonfinite || (b.ovf && has_nonfinite(dt, q, m))) {
      for (size_t k = 0; k < m; k += PROBE__SMALL_MAX_N) /* inf or NaN in the block */
        ops->redo(a, dt, q + k * es, m - k < PROBE__SMALL_MAX_N ? m - k : PROBE__SMALL_MAX_N);
      done += m;
      continue;
    }
    const int window_block = pd.win >= 0;
    if (window_block) {
      ph.hs.cur ^= 1; /* accept the block's counters */
      ph.hs.n16 = b.n16;
      if (ph.hs.n16 >= 16) ops->hs_fold16(&ph.hs);
      if (dt == PROBE_DTYPE_F16) /* outb: the patterns */
        out_f16(&ph, &b);
      else if (bf16p) { /* outb: the patterns */
        for (size_t i = 0; i < b.nout; i++) {
          uint16_t h = ph.outb[i], u = h & 0x7fffu;
          float x = probe_bf16_to_f32(h);
          ph.direct[i & 1][probe__hist_bin((uint32_t)u << 16)]++;
          ph.outcnt[u >> 7]++;
          b.sum += x; /* (bf16, as for fp16) */
          if (u < 0x0080u) { /* the block squared 2 + u/64 for it, not x */
            double wrong = 2.0 + (double)u * 0x1p-6;
            b.sumsq += (double)x * x - wrong * wrong * 0x1p-256;
          }
        }
      } else { /* outb: window values */
        for (size_t i = 0; i < b.nout; i++) {
          ph.direct[i & 1][wbin[ph.outb[i]]]++;
          ph.outcnt[ph.outb[i]]++;
        }
      }
      ph.win_elems += m;
      ph.win_out += b.nout;
      /* (after the two lines above, so that a flush's zero count, and the
       * squares it takes out for them, cover the same blocks) */
      if (ph.hs.nbig + 3 > PROBE__BIG) win_flush(a, &ph, ops, pd.win, wbin, zero_sq, wc);
      /* Choose the window again when a quarter of the block was outside
       * (zeros count as inside: they cost nothing here), or, with a backoff
       * while that keeps the same window, when more than 1/1024 was: an
       * element outside costs some 40 times what one inside does (on Zen 5,
       * a window leaving out the 0.6% lower tail of N(0,1) fp16 data, which
       * the old threshold of 1/64 kept, cost a fifth of the throughput).
       * The choice sees every value since the last flush: the window
       * counters and outcnt. */
      ph.since++;
      if (n - done - m >= group && /* (not after the last block) */
          (4 * b.nout > m || (1024 * b.nout > m && ph.since >= ph.backoff))) {
        uint64_t cnt[256 + WIN] = {0}, best = 0, tot = 0;
        for (int v = 0; v < nvals; v++) cnt[v] = ph.outcnt[v];
        win_flush(a, &ph, ops, pd.win, wbin, zero_sq, wc);
        for (int k = 0; k < WIN; k++) cnt[pd.win + k] += wc[k];
        for (int v = 0; v < nvals; v++) tot += cnt[v];
        int w = best_window(cnt, wlo, nvals, width, &best), old = pd.win;
        pd.win = WIN_OUT_MAX * (tot - best) <= tot ? w : -1; /* or pair mode */
        ph.backoff = pd.win == old && ph.backoff < 256 ? 2 * ph.backoff : 1;
        ph.since = 0;
      }
    } else {
      const uint32_t *ix = ph.idx[cur];
      if (ph.small) {
        for (size_t i = 0; i < m / 2; i += 2) {
          uint32_t p0 = ix[i], p1 = ix[i + 1];
          ph.direct[0][p0 % NB]++;
          ph.direct[0][p0 / NB]++;
          ph.direct[1][p1 % NB]++;
          ph.direct[1][p1 / NB]++;
        }
      } else {
        pd.idx = ix; /* counted while the next block runs */
        pd.n = m / 2;
        cur ^= 1;
        ph.per_copy += (uint32_t)(m / 8);
      }
    }
    ph.in_hist += m;
    if (!window_block) /* window mode leaves zeros out of the histogram */
      ph.corr[0] -= (int64_t)b.zero; /* zeros: raw exponent 0 -> bin 0 */
    a->count += m;
    a->zero += b.zero;
    a->flush += b.flush;
    a->ovf += b.ovf;
    a->sum += b.sum;
    a->sumsq += b.sumsq;
    probe__acc_extremes(a, b.smax, b.smin, b.umax, b.umin, b.amin_m1);
    if (ph.per_copy > UINT16_MAX - BLOCK / 8) { /* before a 16-bit counter wraps */
      probe__pending_count(&pd, 0, pd.n);
      pd.n = 0;
      fold(a, &ph);
    }
    done += m;
  }
  probe__pending_count(&pd, 0, pd.n);
  if (pd.win >= 0) win_flush(a, &ph, ops, pd.win, wbin, zero_sq, wc);
  fold(a, &ph);
  probe__acc_portable(a, dt, p + done * es, n - done);
}

void probe__acc_avx2(probe__acc *a, probe_dtype dt, const void *data, size_t n) {
  static const probe__blk_ops ops = {
      .blk = {probe__blk_f32_avx2, probe__blk_f16_avx2, probe__blk_bf16_avx2}, /* by dtype */
      .hs_fold16 = probe__hs_fold16_avx2,
      .hs_count = probe__hs_count_avx2,
      .group = 32,
      .window = 1,
      .bf16_patterns = 1,
      .redo = probe__acc_small_avx2};
  drive(a, dt, data, n, &ops);
}

void probe__acc_avx512(probe__acc *a, probe_dtype dt, const void *data, size_t n) {
  static const probe__blk_ops ops = {
      .blk = {probe__blk_f32_avx512, probe__blk_f16_avx512, probe__blk_bf16_avx512},
      .hs_fold16 = probe__hs_fold16_avx512,
      .hs_count = probe__hs_count_avx512,
      .group = 64,
      .window = 1,
      .redo = probe__acc_small_avx512};
  drive(a, dt, data, n, &ops);
}

#else /* no AVX2 at compile time: stats_dispatch.c never calls these */

void probe__acc_avx2(probe__acc *a, probe_dtype dt, const void *data, size_t n) {
  probe__acc_portable(a, dt, data, n);
}

void probe__acc_avx512(probe__acc *a, probe_dtype dt, const void *data, size_t n) {
  probe__acc_portable(a, dt, data, n);
}

#endif
