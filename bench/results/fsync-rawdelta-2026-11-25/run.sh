#!/bin/bash
# Alternating before/after pairs of the fsync experiment (bench/run), each binary through DENSEFS_BIN.
set -u
cd /work/main
out=/work/main/bench/results/fsync-rawdelta-2026-11-25
mkdir -p $out
for i in 1 2 3 4; do
  for which in before after; do
    DENSEFS_BIN=/var/tmp/ab2/densefs.$which bench/run --experiments fsync --no-1core \
      --systems densefs-lz4,densefs-gzip-6,densefs-zstd-3,btrfs-lzo,btrfs-zlib6,btrfs-zstd3 \
      --out $out/$which-$i > /var/tmp/ab2/$which-$i.log 2>&1
    echo "$which-$i rc=$?"
  done
done
