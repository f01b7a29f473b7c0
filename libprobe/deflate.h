/*
 * deflate.h - private: the writer's chunk encoder (deflate.c): HDF5's
 * shuffle and a fast fixed-Huffman deflate in a zlib stream, for chunks
 * written with H5Dwrite_chunk into datasets whose filters are shuffle +
 * deflate.
 */
#ifndef AMPPROBE_LIBPROBE_DEFLATE_H
#define AMPPROBE_LIBPROBE_DEFLATE_H

#include <stddef.h>
#include <stdint.h>

/* dst[j * n_rows + i] = src[i * elem + j]: what HDF5's shuffle filter
 * stores for n_rows elements of elem bytes (src and dst: n_rows * elem). */
void probe__shuffle(uint8_t *dst, const uint8_t *src, size_t n_rows,
                    size_t elem);

/* Bytes dst must hold for probe__deflate of n bytes. */
size_t probe__deflate_bound(size_t n);

/* Encodes src[0, n) as one zlib stream (RFC 1950/1951) into dst, which
 * holds probe__deflate_bound(n) bytes; returns its length. Any inflate
 * decodes it. Thread-safe. */
size_t probe__deflate(const uint8_t *src, size_t n, uint8_t *dst);

#endif /* AMPPROBE_LIBPROBE_DEFLATE_H */
