/*
 * deflate.c - the writer's own encoder for the chunks of the trace tables:
 * HDF5's shuffle filter and a fast deflate (RFC 1951) in a zlib wrapper
 * (RFC 1950), so that chunks written with H5Dwrite_chunk decode through
 * the dataset's ordinary shuffle + deflate filters (HDF5, h5py, any zlib).
 *
 * Why: zlib's deflate, even at level 1, spends about 1 us per 648-byte
 * record, most of it matching the long zero runs that shuffled counters
 * and histogram bins are made of. This encoder only finds runs of one
 * repeated byte (matches at distance 1) and writes them and the remaining
 * literals with the fixed Huffman codes: about a tenth of the time, for
 * chunks some 20% larger than zlib level 1 (bench/results/probe.md). Data
 * it cannot shrink (random floats) goes into stored blocks.
 */
#include "deflate.h"

#include <pthread.h>
#include <string.h>

/* ---- HDF5's shuffle ------------------------------------------------------- */

void probe__shuffle(uint8_t *dst, const uint8_t *src, size_t n_rows,
                    size_t elem) {
  /* Planes that are zero in every row (high bytes of counters, empty
   * histogram bins) are most of a record: find them with one OR pass that
   * vectorises, and gather only the others. */
  uint8_t any[1024];
  if (elem > sizeof any) {
    for (size_t j = 0; j < elem; j++)
      for (size_t i = 0; i < n_rows; i++) dst[j * n_rows + i] = src[i * elem + j];
    return;
  }
  /* OR of all rows, 8 bytes at a time */
  uint64_t acc[sizeof any / 8] = {0};
  size_t words = elem / 8;
  for (size_t i = 0; i < n_rows; i++) {
    const uint8_t *row = src + i * elem;
    for (size_t k = 0; k < words; k++) {
      uint64_t v;
      memcpy(&v, row + 8 * k, 8);
      acc[k] |= v;
    }
  }
  memcpy(any, acc, words * 8);
  for (size_t j = words * 8; j < elem; j++) {
    any[j] = 0;
    for (size_t i = 0; i < n_rows; i++) any[j] |= src[i * elem + j];
  }
  uint16_t nz[1024];
  size_t n_nz = 0;
  for (size_t j = 0; j < elem; j++) {
    if (any[j]) nz[n_nz++] = (uint16_t)j;
    else memset(dst + j * n_rows, 0, n_rows);
  }
  /* rows read in order, planes written at stride n_rows: the lines being
   * written (one per non-zero plane) stay in L1 */
  for (size_t i = 0; i < n_rows; i++) {
    const uint8_t *row = src + i * elem;
    uint8_t *col = dst + i;
    for (size_t k = 0; k < n_nz; k++) col[(size_t)nz[k] * n_rows] = row[nz[k]];
  }
}

/* ---- fixed-Huffman deflate with runs ------------------------------------- */

#define ADLER_MOD 65521u

/* Codes of the fixed Huffman code (RFC 1951 3.2.6), bit-reversed for
 * LSB-first output: literals 0..255, and each match length 3..258 with its
 * extra bits and the distance-1 code (5 zero bits) appended. */
static uint16_t lit_bits[256];
static uint8_t lit_n[256];
static uint32_t len_bits[259];
static uint8_t len_n[259];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static uint32_t bit_reverse(uint32_t code, unsigned n) {
  uint32_t r = 0;
  for (unsigned i = 0; i < n; i++) r |= ((code >> i) & 1u) << (n - 1 - i);
  return r;
}

/* The fixed code of symbol 0..287 and its length. */
static void fixed_code(unsigned sym, uint32_t *code, unsigned *n) {
  if (sym < 144) *code = 0x30 + sym, *n = 8;
  else if (sym < 256) *code = 0x190 + (sym - 144), *n = 9;
  else if (sym < 280) *code = sym - 256, *n = 7;
  else *code = 0xC0 + (sym - 280), *n = 8;
}

static void tables_init(void) {
  static const uint16_t base[29] = {3,  4,  5,  6,  7,  8,  9,   10,  11, 13,
                                    15, 17, 19, 23, 27, 31, 35,  43,  51, 59,
                                    67, 83, 99, 115, 131, 163, 195, 227, 258};
  static const uint8_t extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1,
                                    1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                                    4, 4, 4, 4, 5, 5, 5, 5, 0};
  for (unsigned b = 0; b < 256; b++) {
    uint32_t c;
    unsigned n;
    fixed_code(b, &c, &n);
    lit_bits[b] = (uint16_t)bit_reverse(c, n);
    lit_n[b] = (uint8_t)n;
  }
  for (unsigned len = 3; len <= 258; len++) {
    int k = 28;
    while (base[k] > len) k--;
    if (len == 258) k = 28;
    uint32_t c;
    unsigned n;
    fixed_code(257 + (unsigned)k, &c, &n);
    uint32_t bits = bit_reverse(c, n) | ((uint32_t)(len - base[k]) << n);
    n += extra[k];
    /* distance code 0 (distance 1): 5 zero bits, nothing to OR in */
    len_bits[len] = bits;
    len_n[len] = (uint8_t)(n + 5);
  }
}

typedef struct bitw {
  uint8_t *p, *end;
  uint64_t acc;
  unsigned n;
  int full; /* ran out of room */
} bitw;

static inline void put(bitw *w, uint32_t bits, unsigned n) {
  w->acc |= (uint64_t)bits << w->n;
  w->n += n;
  if (w->n >= 32) {
    if (w->end - w->p < 4) {
      w->full = 1;
      w->p = w->end - 4; /* keep writing in place; the result is discarded */
    }
    uint32_t lo = (uint32_t)w->acc;
    w->p[0] = (uint8_t)lo;
    w->p[1] = (uint8_t)(lo >> 8);
    w->p[2] = (uint8_t)(lo >> 16);
    w->p[3] = (uint8_t)(lo >> 24);
    w->p += 4;
    w->acc >>= 32;
    w->n -= 32;
  }
}

static uint32_t adler32_plain(const uint8_t *p, size_t n) {
  uint64_t s1 = 1, s2 = 0;
  while (n) {
    size_t k = n < 5552 ? n : 5552;
    n -= k;
    while (k--) {
      s1 += *p++;
      s2 += s1;
    }
    s1 %= ADLER_MOD;
    s2 %= ADLER_MOD;
  }
  return (uint32_t)(s2 << 16 | s1);
}

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

size_t probe__deflate_bound(size_t n) {
  /* stored blocks: 5 bytes per 65535, plus the 2-byte header and adler */
  return n + 5 * (n / 65535 + 1) + 6 + 8;
}

/* Stored blocks: the fallback for data that does not shrink. */
static size_t encode_stored(const uint8_t *src, size_t n, uint8_t *dst) {
  uint8_t *p = dst;
  *p++ = 0x78;
  *p++ = 0x01;
  size_t off = 0;
  do {
    size_t k = n - off < 65535 ? n - off : 65535;
    *p++ = off + k == n ? 1 : 0; /* BFINAL, BTYPE 00 */
    p[0] = (uint8_t)k;
    p[1] = (uint8_t)(k >> 8);
    p[2] = (uint8_t)~k;
    p[3] = (uint8_t)(~k >> 8);
    p += 4;
    memcpy(p, src + off, k);
    p += k;
    off += k;
  } while (off < n);
  put_be32(p, adler32_plain(src, n));
  return (size_t)(p + 4 - dst);
}

/* Length of the run of src[i] starting at i (at least 1). */
static inline size_t run_length(const uint8_t *src, size_t i, size_t n) {
  const uint8_t b = src[i];
  const uint64_t pat = 0x0101010101010101ull * b;
  size_t j = i + 1;
  while (j + 8 <= n) {
    uint64_t w;
    memcpy(&w, src + j, 8);
    uint64_t x = w ^ pat;
    if (x) return j + (size_t)(__builtin_ctzll(x) >> 3) - i; /* little-endian */
    j += 8;
  }
  while (j < n && src[j] == b) j++;
  return j - i;
}

size_t probe__deflate(const uint8_t *src, size_t n, uint8_t *dst) {
  if (n >= ((size_t)1 << 24)) return encode_stored(src, n, dst); /* adler */
  pthread_once(&tables_once, tables_init);
  size_t stored = probe__deflate_bound(n) - 8;
  bitw w = {dst + 2, dst + stored - 4, 0, 0, 0};
  dst[0] = 0x78; /* deflate, 32 KiB window */
  dst[1] = 0x01; /* no dictionary, fastest; 0x7801 % 31 == 0 */
  put(&w, 1 | (1u << 1), 3); /* BFINAL 1, BTYPE 01 (fixed codes) */
  uint64_t s1 = 1, s2 = 0;   /* adler32, reduced lazily */
  size_t i = 0;
  while (i < n && !w.full) {
    const uint32_t b = src[i];
    if (i + 1 < n && src[i + 1] != b) { /* a lone literal: most bytes */
      s1 += b;
      s2 += s1; /* no overflow: s2 < 2^56 for chunks below 16 MiB (n is
                   checked on entry) */
      put(&w, lit_bits[b], lit_n[b]);
      i++;
      continue;
    }
    size_t r = run_length(src, i, n);
    /* adler32 of r copies of b */
    s2 += (uint64_t)r * s1 + (uint64_t)b * r * (r + 1) / 2;
    s1 += (uint64_t)b * r;
    put(&w, lit_bits[b], lit_n[b]);
    size_t rem = r - 1;
    while (rem >= 3) {
      size_t len = rem > 258 ? 258 : rem;
      if (rem > 258 && rem - 258 < 3) len = rem - 3; /* leave a match */
      put(&w, len_bits[len], len_n[len]);
      rem -= len;
    }
    while (rem--) put(&w, lit_bits[b], lit_n[b]);
    i += r;
  }
  put(&w, 0, 7); /* end of block (256): 7 zero bits */
  /* the bits left, to the byte boundary: the zlib trailer follows */
  while (w.n > 0 && !w.full) {
    if (w.p >= w.end) w.full = 1;
    else *w.p++ = (uint8_t)w.acc;
    w.acc >>= 8;
    w.n = w.n > 8 ? w.n - 8 : 0;
  }
  size_t len = (size_t)(w.p - dst);
  if (w.full || len + 4 >= stored) return encode_stored(src, n, dst);
  s1 %= ADLER_MOD;
  s2 %= ADLER_MOD;
  put_be32(w.p, (uint32_t)(s2 << 16 | s1));
  return len + 4;
}
