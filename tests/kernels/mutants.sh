#!/bin/sh
# tests/kernels/mutants.sh - deliberately broken variants of the statistics
# kernels, each of which test_stats must fail: a suite that passes one of
# them does not test what it claims to. Not part of ctest (each variant is a
# rebuild); run by hand after changing kernels/stats*.c or the suite:
#
#   sh tests/kernels/mutants.sh [build-dir-for-copies [name-regex]]
#
# Each variant is one sed expression on one file of one copy of the source
# tree, built once (CUDA off); per variant the file is edited, test_stats
# rebuilt (only that file recompiles) and run on the test case the variant
# names, and the file restored. It prints one line per variant, "caught" or
# "NOT CAUGHT", and exits 1 if any was not caught. Variants of paths this CPU
# cannot run are reported as skipped; name-regex runs only the matching ones.
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-/tmp/ampprobe-mutants}
only=${2:-.}
mkdir -p "$work"
avx2=$(grep -c -w avx2 /proc/cpuinfo 2>/dev/null || echo 0)
avx512=$(grep -c -w avx512vbmi2 /proc/cpuinfo 2>/dev/null || echo 0)
missed=0

# name|file|sed expression|needs (avx2, avx512 or any)|test case (default reference)
cat > "$work/list" <<'LIST'
small2-bins-packus|kernels/stats_small2.c|s/_mm256_packs_epi16(_mm256_packs_epi32(b0, b1)/_mm256_packus_epi16(_mm256_packs_epi32(b0, b1)/|avx2
small2-max-unmasked|kernels/stats_small2.c|s/smax = _mm256_max_epi32(smax, _mm256_blendv_epi8(_mm256_set1_epi32(INT32_MIN), u, f));/smax = _mm256_max_epi32(smax, u);/|avx2
small2-sub-bin-off|kernels/stats_small2.c|s/if (key + k < PROBE__SUB_BINS) \*sub += cnt\[k\];/if (key + k <= PROBE__SUB_BINS) *sub += cnt[k];/|avx2
small2-flush-scan-skipped|kernels/stats_small2.c|s/(am1 < 0x33000000u /(am1 < 0x32ffffffu /|avx2
small2-ovf-scan-skipped|kernels/stats_small2.c|s/sx > 0x477fefff /sx > 0x477fffff /|avx2
small16-nonfinite-kept|kernels/stats_small2.c|s/if (ax >= (f16 ? 0x7c00u : 0x7f80u)) return 0;/if (ax > (f16 ? 0x7c00u : 0x7f80u)) return 0;/|avx2
small16-f16-subnormals-unmoved|kernels/stats_small2.c|s/if (f16 \&\& amin < 0x0200u)/if (f16 \&\& amin < 0x0100u)/|avx2
small16-bf16-flush-scan-skipped|kernels/stats_small2.c|s/amin <= 0x3300u/amin < 0x3300u/|avx2
small16-bf16-ovf-scan-skipped|kernels/stats_small2.c|s/ax >= 0x4780u/ax > 0x4780u/|avx2
small16-pad-with-zeros|kernels/stats_small2.c|s/td\[k\] = (size_t)k < n - i ? tz\[k\] : tz\[0\];/td[k] = tz[k];/|avx2
small16-bf16-bin-unclamped|kernels/stats_small2.c|s/(aA_, 7), cb), clast)/(aA_, 7), cb), _mm256_set1_epi16(255))/|avx2
small2-window-bin-wrong|kernels/stats_small2.c|s/_mm256_cmpeq_epi8(t, _mm256_set1_epi8(3))/_mm256_cmpeq_epi8(t, _mm256_set1_epi8(2))/|avx2
small2-window-top-low|kernels/stats_small2.c|s/const int key = top >= 7 ? top - 7 : 0;/const int key = top >= 8 ? top - 8 : 0;/|avx2
small2-below-lost|kernels/stats_small2.c|s/a->hist\[bv\]++;/(void)bv;/|avx2
small2-next-pass-skips-a-bin|kernels/stats_small2.c|s/    top = key - 1;/    top = key - 2;/|avx2
small2-f32-sums-from-memory-short|kernels/stats_small2.c|s/SUMS4X2((const float \*)(const void \*)(q + 96));/(void)0;/|avx2
avx2-f32-sums-from-memory-dup|kernels/stats_avx2.c|s/_mm256_cvtps_pd(_mm_loadu_ps(f + 12))/_mm256_cvtps_pd(_mm_loadu_ps(f + 8))/|avx2
avx2-f32-stream-sums-dup|kernels/stats_avx2.c|s/e7_ = F32_D(q_, 7)/e7_ = F32_D(q_, 6)/|avx2
avx2-f32-window-subnormals-half|kernels/stats_avx2.c|s/if (a != 0 \&\& a < 0x00800000u) \*outp++ = 0;/if (a != 0 \&\& a < 0x00400000u) *outp++ = 0;/|avx2|window
avx2-f32-window-subnormal-scan-skipped|kernels/stats_avx2.c|s/if (am1 < 0x007fffffu) {/if (am1 < 0x007ffffeu) {/|avx2|window
small2-pass-counts-past-top|kernels/stats_small2.c|s/for (int k = 0; k <= top - key; k++) {/for (int k = 0; k < 8; k++) {/|avx2
small16-amax-positive-only|kernels/stats_small2.c|s/if (ux >= 0x8000u \&\& (uint16_t)(ux \& 0x7fffu) > ax) ax = ux \& 0x7fffu;//|avx2
small16-zero-always|kernels/stats_small2.c|s/nonzero < (uint64_t)n, \&sn/nonzero <= (uint64_t)n, \&sn/|avx2
small2-bins16-packus|kernels/stats_small2.c|s/_mm256_packs_epi16(BINS16(a0, a1), BINS16(a2, a3))/_mm256_packus_epi16(BINS16(a0, a1), BINS16(a2, a3))/|avx2
small2-bins16-zeros-binned|kernels/stats_small2.c|s/_mm256_packs_epi32(_mm256_cmpeq_epi32(a_, z), _mm256_cmpeq_epi32(b_, z))/z/|avx2
small2-bins16-unclamped|kernels/stats_small2.c|s/clast16),/_mm256_set1_epi16(255)),/|avx2
small2-bins16-second-half-lost|kernels/stats_small2.c|s/_mm256_srli_epi32(a_, 23), _mm256_srli_epi32(b_, 23)/_mm256_srli_epi32(a_, 23), _mm256_srli_epi32(a_, 23)/|avx2
small2-umax-half|kernels/stats_small2.c|s/umax = _mm256_max_epu32(umax, _mm256_max_epu32(_mm256_max_epu32(u0, u1), _mm256_max_epu32(u2, u3)));/umax = _mm256_max_epu32(umax, _mm256_max_epu32(u0, u1));/|avx2
small2-smax-half|kernels/stats_small2.c|s/smax = _mm256_max_epi32(smax, _mm256_max_epi32(_mm256_max_epi32(u0, u1), _mm256_max_epi32(u2, u3)));/smax = _mm256_max_epi32(smax, _mm256_max_epi32(u2, u3));/|avx2
small2-amin-half|kernels/stats_small2.c|s/_mm256_min_epi32(_mm256_add_epi32(a2, c7f), _mm256_add_epi32(a3, c7f))/_mm256_add_epi32(a2, c7f)/|avx2
small2-minima32-zero-always|kernels/stats_small2.c|s/nonzero < finite, \&sn/nonzero <= finite, \&sn/|avx2
minima32-sign-lost|kernels/stats_impl.h|s/(amin . 0x80000000u)/(amin)/|avx2
minima32-umin-zero-missed|kernels/stats_impl.h|/0x80000000u;/,/^}/s/if (!neg) \*umin = has_zero ? 0 : amin;/if (!neg) *umin = amin;/|avx2
red16-smax-unsigned|kernels/stats_avx2.c|s/_mm256_xor_si256(smax, _mm256_xor_si256(sflip, ones))/_mm256_xor_si256(smax, ones)/|avx2
red16-amin-off-by-one|kernels/stats_avx2.c|s/(uint16_t)(m + 1u);/m;/|avx2
minima16-zero-ignored|kernels/stats_impl.h|s/\*umin = has_zero ? 0 : amin;/*umin = amin;/|avx2
minima16-neg-zero-sign|kernels/stats_impl.h|s/has_zero ? 0x8000u :/has_zero ? 0u :/|avx2
pair2-f16-bias-off|kernels/stats_avx2.c|/^static void pair_f16/,/^}/s/cbias = _mm256_set1_epi16(F32_BIAS)/cbias = _mm256_set1_epi16(F32_BIAS + 1)/|avx2
pair2-f16-raw-exponent|kernels/stats_avx2.c|/^static void pair_f16/,/^}/s/_mm256_madd_epi16(bin, pairc)/_mm256_madd_epi16(_mm256_add_epi16(_mm256_srli_epi16(a, 10), _mm256_set1_epi16(18)), pairc)/|avx2
pair512-f16-sign-kept|kernels/stats_avx512.c|s/_mm512_srli_epi32(_mm512_slli_epi32(_mm512_castps_si512(f0), 1), 24)/_mm512_srli_epi32(_mm512_castps_si512(f0), 23)/|avx512
pair512-f16-bias-off|kernels/stats_avx512.c|s/cbias = _mm512_set1_epi16(F32_BIAS), clast/cbias = _mm512_set1_epi16(F32_BIAS - 1), clast/|avx512
pair512-f32-sums-one-step|kernels/stats_avx512.c|s/SUM32M(p + 128 \* (v_)); \/\* from memory/SUM32M(p); \/* from memory/|avx512
drive-pair-zeros-kept|kernels/stats_block.c|s/ph.corr\[0\] -= (int64_t)b.zero;/;/|avx2
flush-ovf2-f32-zeros-counted|kernels/stats_avx2.c|s/nf = _mm256_sub_epi32(nf, _mm256_andnot_si256(_mm256_cmpeq_epi32(a, z), _mm256_cmpgt_epi32(cfl, a)));/nf = _mm256_sub_epi32(nf, _mm256_cmpgt_epi32(cfl, a));/|avx2
flush-ovf2-f32-ovf-edge|kernels/stats_avx2.c|s/cov = _mm256_set1_epi32(0x477fefff)/cov = _mm256_set1_epi32(0x477ff000)/|avx2
flush-ovf2-f32-tail-lost|kernels/stats_avx2.c|s/\*flush += w != 0 \&\& w <= 0x33000000u;/;/|avx2
flush-ovf2-bf16-flush-edge|kernels/stats_avx2.c|s/cfl = _mm256_set1_epi16(0x3301)/cfl = _mm256_set1_epi16(0x3300)/|avx2
flush-ovf2-bf16-ovf-edge|kernels/stats_avx2.c|s/cov = _mm256_set1_epi16(0x477f)/cov = _mm256_set1_epi16(0x4780)/|avx2
flush-ovf2-bf16-tail-lost|kernels/stats_avx2.c|s/\*flush += h != 0 \&\& h <= 0x3300u;/;/|avx2
small2-ovf-nonfinite-kept|kernels/stats_small2.c|s/a->ovf += big - nan - posinf - neginf;/a->ovf += big;/|avx2
exact16-zeros-binned|kernels/stats_small2.c|s/out_ = _mm256_or_si256(_mm256_subs_epu16(e_, cb), _mm256_cmpeq_epi16(e_, z));/out_ = _mm256_subs_epu16(e_, cb);/|avx2
exact16-tail-lost|kernels/stats_small2.c|s/if (32 \* v < n) {/if (0) {/|avx2
exact16-bias-off|kernels/stats_small2.c|s/cb = _mm256_set1_epi16(F32_BIAS16);/cb = _mm256_set1_epi16(F32_BIAS16 + 1);/|avx2
out16-sub-edge|kernels/stats_block.c|s/q\[i \& 1\] += u < 0x0400u ?/q[i \& 1] += u < 0x0200u ?/|avx2
fold-sub-bins-off|kernels/stats_block.c|s/for (int i = 0; i < PROBE__SUB_BINS; i++) sub += bins\[i\];/for (int i = 0; i < PROBE__SUB_BINS - 1; i++) sub += bins[i];/|avx2
out16-sum-lost|kernels/stats_block.c|s/s\[i \& 1\] += x;/;/|avx2
drive-redo-last-piece-lost|kernels/stats_block.c|s/for (size_t k = 0; k < m; k += PROBE__SMALL_MAX_N)/for (size_t k = 0; k + PROBE__SMALL_MAX_N < m; k += PROBE__SMALL_MAX_N)/|avx2
drive-window-from-field-0|kernels/stats_block.c|s/const int wlo = 1;/const int wlo = dt != PROBE_DTYPE_F32;/|avx2|window
nonfinite-scan32-inf-missed|kernels/stats_block.c|s/big = _mm256_set1_epi32(0x7f7fffff)/big = _mm256_set1_epi32(0x7f800000)/|avx2
nonfinite-scan16-inf-missed|kernels/stats_block.c|s/big = _mm256_set1_epi16((short)(lim - 1u))/big = _mm256_set1_epi16((short)lim)/|avx2
big32-512-edge|kernels/stats_avx512.c|s/mabs = _mm512_set1_epi32(0x7fffffff), covf = _mm512_set1_epi32(0x477fefff)/mabs = _mm512_set1_epi32(0x7fffffff), covf = _mm512_set1_epi32(0x477ff000)/|avx512
big16-512-edge|kernels/stats_avx512.c|s/mabs = _mm512_set1_epi16(0x7fff), covf = _mm512_set1_epi16(0x477f)/mabs = _mm512_set1_epi16(0x7fff), covf = _mm512_set1_epi16(0x4780)/|avx512
win2-half-no-sign|kernels/stats_avx2.c|s/__m256i mA = _mm256_sign_epi16(_mm256_or_si256(_mm256_and_si256(hA, mman), cimp), hA);/__m256i mA = _mm256_or_si256(_mm256_and_si256(hA, mman), cimp);/|avx2
win2-half-width16|kernels/stats_avx2.c|s/WIN_DECL2(pd, PROBE__WIN16);/WIN_DECL2(pd, PROBE__WIN);/|avx2
win2-bf16-sum-scale|kernels/stats_avx2.c|s/sum_exp = bf16 ? 134 : 25;/sum_exp = bf16 ? 133 : 25;/|avx2
win2-f16-sum-scale|kernels/stats_avx2.c|s/sum_exp = bf16 ? 134 : 25;/sum_exp = bf16 ? 134 : 24;/|avx2
win2-bf16-sq-shift|kernels/stats_avx2.c|s/sq_lo = bf16 ? 13 : 10;/sq_lo = bf16 ? 12 : 10;/|avx2
win2-f16-sq-shift|kernels/stats_avx2.c|s/sq_hi = bf16 ? 3 : 6,/sq_hi = bf16 ? 3 : 5,/|avx2
win2-f16-mantissa-mask|kernels/stats_avx2.c|s/bf16 ? 0x007f : 0x03ff/bf16 ? 0x007f : 0x01ff/|avx2
win2-bf16-flush-scan-skipped|kernels/stats_avx2.c|s/any_flush = b->amin_m1 < 0x33000000u;/any_flush = b->amin_m1 < 0x32ffffffu;/|avx2
drive-bf16-no-outside-sum|kernels/stats_block.c|s/b.sum += x; \/\* (bf16, as for fp16) \*\//;/|avx2
drive-bf16-no-subnormal-swap|kernels/stats_block.c|s/b.sumsq += (double)x \* x - wrong \* wrong \* 0x1p-256;/(void)wrong;/|avx2|window
drive-bf16-zero-square|kernels/stats_block.c|s/bf16p ? 0x1p-254 : 0.0/bf16p ? 0x1p-256 : 0.0/|avx2|window
drive-bf16-window-at-0|kernels/stats_block.c|s/const int wlo = 1;/const int wlo = dt != PROBE_DTYPE_BF16;/|avx2|window
hs2-fold-no-carry|kernels/stats_avx2.c|s/        x \&= hk;/        x = 0 \& hk;/|avx2
win2-zeros-outside|kernels/stats_avx2.c|s/~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8((nzb), z))/~0u/|avx2
win2-outside-mask-dropped|kernels/stats_avx2.c|s/om = (uint32_t)_mm256_movemask_epi8(ix_);/om = 0xffffffffu;/|avx2
win2-f16-nz-zeros-kept|kernels/stats_avx2.c|s/if ((zmask) .. (h_ \& 0x7fffu)) \*outp++ = h_;/*outp++ = h_;/|avx2|window
win2-f32-field0-kept|kernels/stats_avx2.c|s/if (zmask .. f_) \*outp++ = f_;/*outp++ = f_;/|avx2|window
win2-index-top-inside|kernels/stats_avx2.c|s/_mm256_set1_epi8((char)(0x80 - (width)))/_mm256_set1_epi8(0x70)/;s/int r = (j - (16 - width)) \& 15;/int r = j \& 15;/|avx2
win2-f32-flush-scan-skipped|kernels/stats_avx2.c|s/if (am1 < 0x33000000u /if (am1 < 0x32ffffffu /|avx2
win2-f32-stream-half-sum|kernels/stats_avx2.c|s/fsB = _mm256_add_pd(fsB, _mm256_add_pd(_mm256_add_pd(e4_, e5_), _mm256_add_pd(e6_, e7_)));/(void)0;/|avx2
win2-f32-stream-half-sq|kernels/stats_avx2.c|s/fqB = _mm256_fmadd_pd(e4_, e4_, _mm256_fmadd_pd(e5_, e5_, _mm256_fmadd_pd(e6_, e6_, _mm256_fmadd_pd(e7_, e7_, fqB))));/fqB = _mm256_fmadd_pd(e4_, e4_, fqB);/|avx2
win2-f32-stream-sum-lost|kernels/stats_avx2.c|s/b->sum = hsum_pd(fsA, fsB, /b->sum = hsum_pd(fsA, fsA, /|avx2
hs2-count-low-byte-only|kernels/stats_avx2.c|s/wc\[i + 8\] += weight/wc[i + 8] += 0 * weight/|avx2
dispatch-env-ignored|kernels/stats_dispatch.c|s/f = probe__stats_family_from_env(getenv("AMPPROBE_STATS_PATH"));/f = probe__stats_family_from_env(NULL);/|any
port-flush-edge-lost|kernels/stats.c|s/r->flush_edge += ab == 0x33000000u;/(void)0;/|any
port-ovf-edge-lost|kernels/stats.c|s/r->ovf_edge += ab >= 0x477ff000u \&\& ab < 0x47800000u;/(void)0;/|any
port-edge-rescan-never|kernels/stats.c|s/run_bin(r, OVF_EDGE_BIN) != ovf_edge)/run_bin(r, OVF_EDGE_BIN) != ovf_edge \&\& 0)/|any
port-ovf-bins-off|kernels/stats.c|s/a->ovf += b > OVF_EDGE_BIN ? h : 0;/a->ovf += b >= OVF_EDGE_BIN ? h : 0;/|any
port-sub-bins-off|kernels/stats.c|s/a->sub += b < PROBE__SUB_BINS ? h : 0;/a->sub += b <= PROBE__SUB_BINS ? h : 0;/|any
port-zeros-left-in-bin0|kernels/stats.c|s/      if (b == 0) h -= r.zeros;//|any
port-minima-zero-ignored|kernels/stats.c|s/r.amin_m1 + 1u, r.zeros > 0, /r.amin_m1 + 1u, 0, /|any
port-f16-subnormal-as-normal|kernels/stats.c|s/(sub \& ~normal)/(o \& ~normal)/|any
port-f16-sign-lost|kernels/stats.c|s/(uint32_t)(h \& 0x8000u) << 16;/0u;/|any
port-nonfinite-chunk-as-finite|kernels/stats.c|s/  return m < inf;/  return m <= inf;/|any
port-second-sums-lost|kernels/stats.c|s/a->sumsq += (q\[0\] + q\[1\]) + (q\[2\] + q\[3\]);/a->sumsq += (q[0] + q[1]) + q[2];/|any
port-last-chunk-short|kernels/stats.c|s/size_t k = n - i < PCHUNK ? n - i : PCHUNK;/size_t k = n - i < PCHUNK ? n - i - (n - i > 1) : PCHUNK;/|any
port-fold-range-low|kernels/stats.c|s/for (int b = lo; b <= hi; b++) {/for (int b = lo + 1; b <= hi; b++) {/|any
port-fold-range-high|kernels/stats.c|s/for (int b = lo; b <= hi; b++) {/for (int b = lo; b < hi; b++) {/|any
headroom-named-constant-off|kernels/stats.c|s/return log2((double)PROBE_F16_MAX \/ absmax);/return log2(65520.0 \/ absmax);/|any
LIST

# One copy of the tree, built once; orig/ keeps its files as they were.
rm -rf "$work/src" "$work/orig" && mkdir -p "$work/src" "$work/orig"
# (extracted with new mtimes, -m: the build folder is kept between runs, and
# an object left from the last run's last variant would be newer than the
# source's own mtime, not rebuilt, and tested as the unmodified code)
(cd "$src" && tar cf - --exclude='./build*' --exclude=./.git .) | (cd "$work/src" && tar xmf -)
(cd "$work/src" && tar cf - kernels) | (cd "$work/orig" && tar xf -)
cmake -S "$work/src" -B "$work/b" -DAMPPROBE_CUDA=OFF > "$work/cmake.log" 2>&1 &&
  cmake --build "$work/b" --target test_stats -j2 > "$work/build.log" 2>&1 ||
  { echo "the unmodified copy does not build (see $work/build.log)"; exit 1; }

while IFS='|' read -r name file expr needs tcase; do
  [ -n "$name" ] || continue
  echo "$name" | grep -Eq -- "$only" || continue
  if [ "$needs" = avx2 ] && [ "$avx2" = 0 ]; then echo "$name: skipped (no AVX2)"; continue; fi
  if [ "$needs" = avx512 ] && [ "$avx512" = 0 ]; then echo "$name: skipped (no AVX-512)"; continue; fi
  f="$work/src/$file"
  cp "$work/orig/$file" "$f"
  sed -i "$expr" "$f"
  if cmp -s "$work/orig/$file" "$f"; then
    echo "$name: the expression changed nothing (stale variant)"; missed=1; continue
  fi
  if ! cmake --build "$work/b" --target test_stats -j2 > "$work/$name.build.log" 2>&1; then
    echo "$name: does not build (see $work/$name.build.log)"; missed=1
    cp "$work/orig/$file" "$f"; continue
  fi
  # the "reference" test case (every path, every length class, the special
  # buffers and the 70001-element window-mode blocks) catches most; a
  # variant may name another case ("window")
  if [ "$name" = dispatch-env-ignored ]; then
    AMPPROBE_STATS_PATH=portable CK_RUN_CASE=reference "$work/b/tests/kernels/test_stats" > "$work/$name.log" 2>&1
  else
    CK_RUN_CASE=${tcase:-reference} "$work/b/tests/kernels/test_stats" > "$work/$name.log" 2>&1
  fi
  if [ $? -ne 0 ]; then
    echo "$name: caught ($(grep -m1 -o '[a-z_]*: .* vs .*\|Assertion.*' "$work/$name.log" | cut -c1-100))"
  else
    echo "$name: NOT CAUGHT"; missed=1
  fi
  cp "$work/orig/$file" "$f" # (cp gives it a new mtime: the next build recompiles it)
done < "$work/list"
exit $missed
