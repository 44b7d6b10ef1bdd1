# median(a, k, c): the median of a[k, 1..c], for the bench scripts' summaries
# (bench/sync_bench.sh, bench/inproc_bench.sh): awk -f bench/median.awk -f PROGRAM.
function median(a, k, c,   i, j, t, v) {
  for (i = 1; i <= c; i++) v[i] = a[k, i]
  for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
  return c % 2 ? v[(c + 1) / 2] : (v[c / 2] + v[c / 2 + 1]) / 2
}
