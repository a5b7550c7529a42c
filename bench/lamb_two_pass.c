/* The hardware bound of a two-pass LAMB on this machine, written by hand.

   Not part of optgen: a yardstick for docs/performance.md ("What limits the missed
   goals"). Three loops over 10M float32 elements, OpenMP over all cores:

     pass 1   read w, g, m, v; write m, v; sum ||w||^2 and ||r||^2 in double   (24 B)
     pass 2   read w, m, v; write w with the trust ratio                        (16 B)
     adam     read w, g, m, v; write w, m, v: the one-pass memory limit          (28 B)

   Build and run:
     gcc -O3 -march=native -ffast-math -fopenmp bench/lamb_two_pass.c -o /tmp/lamb2 -lm
     OMP_NUM_THREADS=2 /tmp/lamb2
   and compare "total" (pass 1 + pass 2) with "adam": the ratio is what any two-pass
   LAMB can reach here, whatever the compiler. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#define N 10000000L

int main(void) {
    float *a = aligned_alloc(64, 4 * N * sizeof(float));
    if (!a) return 1;
    for (long i = 0; i < 4 * N; i++) a[i] = 0.5f;
    float *w = a, *g = a + N, *m = a + 2 * N, *v = a + 3 * N;
    for (int rep = 0; rep < 7; rep++) {
        double t0 = omp_get_wtime(), sr = 0, sw = 0;
#pragma omp parallel for reduction(+ : sr, sw) schedule(static)
        for (long i = 0; i < N; i++) {
            float mm = 0.9f * m[i] + 0.1f * g[i];
            float vv = 0.999f * v[i] + 0.001f * g[i] * g[i];
            m[i] = mm;
            v[i] = vv;
            float r = mm / (sqrtf(vv) + 1e-6f) + 0.01f * w[i];
            sr += (double)(r * r);
            sw += (double)(w[i] * w[i]);
        }
        double t1 = omp_get_wtime();
        float ratio = (float)(sqrt(sw) / sqrt(sr)) * 1e-9f;
#pragma omp parallel for schedule(static)
        for (long i = 0; i < N; i++) {
            float r = m[i] / (sqrtf(v[i]) + 1e-6f) + 0.01f * w[i];
            w[i] -= ratio * r;
        }
        double t2 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < N; i++) {
            float gg = g[i], mm = 0.9f * m[i] + 0.1f * gg, vv = 0.999f * v[i] + 0.001f * gg * gg;
            m[i] = mm;
            v[i] = vv;
            w[i] -= 1e-9f * mm / (sqrtf(vv) + 1e-6f);
        }
        double t3 = omp_get_wtime();
        printf("pass1 %.3f ms (%.1f GB/s)  pass2 %.3f ms (%.1f GB/s)  total %.3f ms  "
               "adam %.3f ms (%.1f GB/s)  total/adam %.2f\n",
               (t1 - t0) * 1e3, 24.0 * N / (t1 - t0) / 1e9, (t2 - t1) * 1e3,
               16.0 * N / (t2 - t1) / 1e9, (t2 - t0) * 1e3, (t3 - t2) * 1e3,
               28.0 * N / (t3 - t2) / 1e9, (t2 - t0) / (t3 - t2));
    }
    free(a);
    return 0;
}
