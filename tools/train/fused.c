/* Fused training kernels for tools/train (loaded by fused.py through ctypes; no PyTorch headers).
 *
 * Sinkhorn routing (model-v2.md §2.2): 20 log-domain iterations, rows then columns, on one n x n
 * matrix per token, exponentiated once. In PyTorch that is ~280 tiny kernels forward and as many
 * backward per layer, on matrices of 16 floats: about a fifth of a training step went to their
 * launch overhead. Here tokens go through in blocks of BLOCK, token innermost, so every loop below
 * runs across BLOCK tokens at once (vectorised, expf/logf from glibc's libmvec under -ffast-math).
 *
 * Layout: m, p, grads are [N, n, n] row-major float32 (the trainer's tensors, contiguous). */
#include <math.h>
#include <stdlib.h>

enum { BLOCK = 64, N_MAX = 8 };

/* One half-iteration on x [n][n][BLOCK]: x -= logsumexp over j (rows = 1) or over i (rows = 0).
 * Element (a, b) of the line a sits at (a * sa + b * sb) * BLOCK. */
static void half_step(float *restrict x, int n, int rows) {
    const int sa = rows ? n : 1, sb = rows ? 1 : n;
    for (int a = 0; a < n; a++) {
        float mx[BLOCK], s[BLOCK];
#pragma omp simd
        for (int t = 0; t < BLOCK; t++) mx[t] = -INFINITY, s[t] = 0.0f;
        for (int b = 0; b < n; b++) {
            const float *restrict q = x + (a * sa + b * sb) * BLOCK;
#pragma omp simd
            for (int t = 0; t < BLOCK; t++) mx[t] = fmaxf(mx[t], q[t]);
        }
        for (int b = 0; b < n; b++) {
            const float *restrict q = x + (a * sa + b * sb) * BLOCK;
#pragma omp simd
            for (int t = 0; t < BLOCK; t++) s[t] += expf(q[t] - mx[t]);
        }
#pragma omp simd
        for (int t = 0; t < BLOCK; t++) s[t] = logf(s[t]) + mx[t];
        for (int b = 0; b < n; b++) {
            float *restrict q = x + (a * sa + b * sb) * BLOCK;
#pragma omp simd
            for (int t = 0; t < BLOCK; t++) q[t] -= s[t];
        }
    }
}

/* Tokens t0..t0+cnt-1 of m [N, n, n] into x [n][n][BLOCK]; the tail of a short block is zeros. */
static void gather(const float *m, long t0, int cnt, int n, float *x) {
    for (int e = 0; e < n * n; e++)
        for (int t = 0; t < BLOCK; t++) x[e * BLOCK + t] = t < cnt ? m[(t0 + t) * n * n + e] : 0.0f;
}

static void scatter(const float *x, long t0, int cnt, int n, float *m) {
    for (int e = 0; e < n * n; e++)
        for (int t = 0; t < cnt; t++) m[(t0 + t) * n * n + e] = x[e * BLOCK + t];
}

/* p = Sinkhorn(m), [N, n, n] each. Returns 0, or -1 for n outside 1..N_MAX. */
int needle_train_sinkhorn_forward(const float *m, float *p, long N, int n, int iters) {
    if (n < 1 || n > N_MAX || iters < 0) return -1;
    float x[N_MAX * N_MAX * BLOCK];
    for (long t0 = 0; t0 < N; t0 += BLOCK) {
        int cnt = N - t0 < BLOCK ? (int)(N - t0) : BLOCK;
        gather(m, t0, cnt, n, x);
        for (int k = 0; k < 2 * iters; k++) half_step(x, n, k % 2 == 0);
        for (int e = 0; e < n * n * BLOCK; e++) x[e] = expf(x[e]);
        scatter(x, t0, cnt, n, p);
    }
    return 0;
}

/* gm = dL/dm given gp = dL/dp, the gradient of the unrolled iterations (what autograd would
 * give for the PyTorch loop). The forward states are recomputed per block (2 * iters + 1 of
 * n * n * BLOCK floats). With y = x - logsumexp(x) along a row, dL/dx = g - exp(y) * Σ_row g.
 * Returns 0; -1 for bad n; -2 when the state buffer cannot be allocated. */
int needle_train_sinkhorn_backward(const float *m, const float *gp, float *gm, long N, int n,
                                   int iters) {
    if (n < 1 || n > N_MAX || iters < 0) return -1;
    const int sz = n * n * BLOCK, steps = 2 * iters;
    float *st = malloc(sizeof(float) * (size_t)sz * (size_t)(steps + 1));
    if (!st) return -2;
    float g[N_MAX * N_MAX * BLOCK];
    for (long t0 = 0; t0 < N; t0 += BLOCK) {
        int cnt = N - t0 < BLOCK ? (int)(N - t0) : BLOCK;
        gather(m, t0, cnt, n, st);
        for (int k = 0; k < steps; k++) {
            float *next = st + (size_t)(k + 1) * sz;
            for (int e = 0; e < sz; e++) next[e] = st[(size_t)k * sz + e];
            half_step(next, n, k % 2 == 0);
        }
        gather(gp, t0, cnt, n, g);
        const float *last = st + (size_t)steps * sz;
        for (int e = 0; e < sz; e++) g[e] *= expf(last[e]);  /* d exp(y) = exp(y) dy */
        for (int k = steps - 1; k >= 0; k--) {
            const float *y = st + (size_t)(k + 1) * sz;
            const int sa = k % 2 == 0 ? n : 1, sb = k % 2 == 0 ? 1 : n;
            for (int a = 0; a < n; a++) {
                float s[BLOCK];
#pragma omp simd
                for (int t = 0; t < BLOCK; t++) s[t] = 0.0f;
                for (int b = 0; b < n; b++) {
                    const float *restrict q = g + (a * sa + b * sb) * BLOCK;
#pragma omp simd
                    for (int t = 0; t < BLOCK; t++) s[t] += q[t];
                }
                for (int b = 0; b < n; b++) {
                    float *restrict q = g + (a * sa + b * sb) * BLOCK;
                    const float *restrict w = y + (a * sa + b * sb) * BLOCK;
#pragma omp simd
                    for (int t = 0; t < BLOCK; t++) q[t] -= expf(w[t]) * s[t];
                }
            }
        }
        scatter(g, t0, cnt, n, gm);
    }
    free(st);
    return 0;
}

/* dst[a] = Σ_b w[a * sa + b * sb] src[b] for rows of D floats, a, b < n: P @ X (sa = n, sb = 1)
 * or P^T @ G (sa = 1, sb = n) for one token. */
static void mix_rows(const float *w, int sa, int sb, const float *restrict src,
                     float *restrict dst, int n, int D) {
    for (int a = 0; a < n; a++) {
        float *restrict da = dst + a * D;
#pragma omp simd
        for (int d = 0; d < D; d++) da[d] = 0.0f;
        for (int b = 0; b < n; b++) {
            const float wab = w[a * sa + b * sb], *restrict sr = src + b * D;
#pragma omp simd
            for (int d = 0; d < D; d++) da[d] += wab * sr[d];
        }
    }
}

/* Lane mix of the mHC residual (model-v2.md §5.9): out[t] = P[t] @ X[t], P [N, n, n], X and out
 * [N, n, D]. PyTorch's CPU bmm runs one tiny GEMM call per token. Returns 0. */
int needle_train_lane_mix_forward(const float *restrict P, const float *restrict X,
                                  float *restrict out, long N, int n, int D) {
    for (long t = 0; t < N; t++) mix_rows(P + t * n * n, n, 1, X + t * n * D, out + t * n * D, n, D);
    return 0;
}

/* Its gradients given G = dL/dout [N, n, D]: gP[t] = G[t] @ X[t]^T, gX[t] = P[t]^T @ G[t].
 * Returns 0. */
int needle_train_lane_mix_backward(const float *restrict P, const float *restrict X,
                                   const float *restrict G, float *restrict gP,
                                   float *restrict gX, long N, int n, int D) {
    for (long t = 0; t < N; t++) {
        const float *x = X + t * n * D, *g = G + t * n * D;
        float *gp = gP + t * n * n;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                const float *restrict gi = g + i * D, *restrict xj = x + j * D;
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int d = 0; d < D; d++) s += gi[d] * xj[d];
                gp[i * n + j] = s;
            }
        mix_rows(P + t * n * n, 1, n, g, gX + t * n * D, n, D);
    }
    return 0;
}
