/*
 * trainer/rng.c - the trainer's own PRNG, so that a config and a seed give
 * the same numbers on every machine and C library: splitmix64 expands the
 * seed into the state of a xoshiro256** generator; normals by Box-Muller.
 */
#include <math.h>

#include "trainer-impl.h"

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t pt_seed_mix(uint64_t seed, uint64_t stream) {
  uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ULL);
  splitmix64(&x);
  return splitmix64(&x);
}

void pt_rng_seed(pt_rng *r, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
  r->have_spare = 0;
  r->spare = 0.0;
}

static inline uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

uint64_t pt_rng_u64(pt_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double pt_rng_uniform(pt_rng *r) {
  return (double)(pt_rng_u64(r) >> 11) * 0x1.0p-53;
}

double pt_rng_normal(pt_rng *r) {
  if (r->have_spare) {
    r->have_spare = 0;
    return r->spare;
  }
  double u1 = pt_rng_uniform(r), u2 = pt_rng_uniform(r);
  if (u1 < 0x1.0p-60) u1 = 0x1.0p-60; /* log(0) guard */
  double rad = sqrt(-2.0 * log(u1));
  double th = 6.283185307179586 * u2;
  r->spare = rad * sin(th);
  r->have_spare = 1;
  return rad * cos(th);
}
