#!/bin/sh
# A small CPU-bound task for demos: counts the primes in the block of 2,000 numbers that
# starts at (task id) x 2,000 and prints one line. Usage: primes.sh TASK_ID
set -eu
block=${1:?usage: primes.sh TASK_ID}
awk -v b="$block" 'BEGIN {
  lo = b * 2000; hi = lo + 2000; n = 0
  for (i = (lo < 2 ? 2 : lo); i < hi; i++) {
    p = 1
    for (d = 2; d * d <= i; d++) if (i % d == 0) { p = 0; break }
    n += p
  }
  printf "block %d: %d primes in [%d, %d)\n", b, n, lo, hi
}'
