#!/bin/sh
# tests/kernels/mutants.sh - deliberately broken variants of the statistics
# kernels, each of which test_stats must fail: a suite that passes one of
# them does not test what it claims to. Not part of ctest (each variant is a
# rebuild); run by hand after changing kernels/stats*.c or the suite:
#
#   sh tests/kernels/mutants.sh [build-dir-for-copies]
#
# Each variant is one sed expression on one file of a copy of the source
# tree; the script builds test_stats there (CUDA off) and runs it. It prints
# one line per variant, "caught" or "NOT CAUGHT", and exits 1 if any was not
# caught. Variants of paths this CPU cannot run are reported as skipped.
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-/tmp/ampprobe-mutants}
mkdir -p "$work"
avx2=$(grep -c -w avx2 /proc/cpuinfo 2>/dev/null || echo 0)
missed=0

# name|file|sed expression|needs (avx2 or any)
cat > "$work/list" <<'LIST'
small2-bins-packus|kernels/stats_small2.c|s/_mm256_packs_epi16(_mm256_packs_epi32(b0, b1)/_mm256_packus_epi16(_mm256_packs_epi32(b0, b1)/|avx2
small2-max-unmasked|kernels/stats_small2.c|s/smax = _mm256_max_epi32(smax, _mm256_blendv_epi8(_mm256_set1_epi32(INT32_MIN), u, f));/smax = _mm256_max_epi32(smax, u);/|avx2
small2-flush-with-zeros|kernels/stats_small2.c|s/cfl = _mm256_sub_epi32(cfl, _mm256_cmpgt_epi32(kfl, y_));/cfl = _mm256_sub_epi32(cfl, _mm256_cmpgt_epi32(kfl, _mm256_xor_si256(ab_, _mm256_set1_epi32((int)0x80000000u))));/|avx2
hs2-fold-no-carry|kernels/stats_avx2.c|s/        x \&= hk;/        x = 0 \& hk;/|avx2
win2-f16-no-sign|kernels/stats_avx2.c|s/__m256i mA = _mm256_sign_epi16(_mm256_or_si256(_mm256_and_si256(hA, m3ff), c400), hA);/__m256i mA = _mm256_or_si256(_mm256_and_si256(hA, m3ff), c400);/|avx2
win2-zeros-outside|kernels/stats_avx2.c|s/_mm256_cmpeq_epi8((nzb), z), _mm256_cmpeq_epi8(_mm256_or_si256(l_, h_), z)/z, _mm256_cmpeq_epi8(_mm256_or_si256(l_, h_), z)/|avx2
win2-f16-width16|kernels/stats_avx2.c|s/WIN_DECL2(pd, PROBE__WIN16);/WIN_DECL2(pd, PROBE__WIN);/|avx2
win2-f32-flush-with-zeros|kernels/stats_avx2.c|s/_mm256_add_epi32(_mm256_cmpgt_epi32(kfl, y0), _mm256_cmpgt_epi32(kfl, y1))/_mm256_add_epi32(_mm256_cmpgt_epi32(_mm256_set1_epi32(0x33000001), a0), _mm256_cmpgt_epi32(kfl, y1))/|avx2
hs2-count-low-byte-only|kernels/stats_avx2.c|s/wc\[i + 8\] += weight/wc[i + 8] += 0 * weight/|avx2
dispatch-env-ignored|kernels/stats_dispatch.c|s/f = probe__stats_family_from_env(getenv("AMPPROBE_STATS_PATH"));/f = probe__stats_family_from_env(NULL);/|any
headroom-named-constant-off|kernels/stats.c|s/return log2((double)PROBE_F16_MAX \/ absmax);/return log2(65520.0 \/ absmax);/|any
LIST

while IFS='|' read -r name file expr needs; do
  [ -n "$name" ] || continue
  if [ "$needs" = avx2 ] && [ "$avx2" = 0 ]; then echo "$name: skipped (no AVX2)"; continue; fi
  d="$work/$name"
  rm -rf "$d" && mkdir -p "$d/src"
  (cd "$src" && tar cf - --exclude='./build*' --exclude=./.git .) | (cd "$d/src" && tar xf -)
  sed -i "$expr" "$d/src/$file"
  if cmp -s "$src/$file" "$d/src/$file"; then
    echo "$name: the expression changed nothing (stale variant)"; missed=1; continue
  fi
  cmake -S "$d/src" -B "$d/b" -DAMPPROBE_CUDA=OFF > "$d/cmake.log" 2>&1 &&
    cmake --build "$d/b" --target test_stats -j2 > "$d/build.log" 2>&1 ||
    { echo "$name: does not build (see $d/build.log)"; missed=1; continue; }
  # the "reference" test case alone (every path, every length class, the
  # special buffers and the 70001-element window-mode blocks) catches each
  if [ "$name" = dispatch-env-ignored ]; then
    AMPPROBE_STATS_PATH=portable CK_RUN_CASE=reference "$d/b/tests/kernels/test_stats" > "$d/test.log" 2>&1
  else
    CK_RUN_CASE=reference "$d/b/tests/kernels/test_stats" > "$d/test.log" 2>&1
  fi
  if [ $? -ne 0 ]; then
    echo "$name: caught ($(grep -m1 -o '[a-z_]*: .* vs .*\|Assertion.*' "$d/test.log" | cut -c1-100))"
  else
    echo "$name: NOT CAUGHT"; missed=1
  fi
done < "$work/list"
exit $missed
