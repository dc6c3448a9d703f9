// Gated DeltaNet (Qwen3.5's linear attention), one row at a time: the causal convolution, the gates, the
// delta-rule update of the recurrent state and the gated RMS norm of its output, for the rows of a forward in
// one call. Every value is a function of its own row's inputs and the state it reads, computed in a fixed
// order (no reduction is split by the row count or the thread count), so a verify of k rows gives bitwise
// the values and states of k one-row steps. Compiled without -ffast-math and with -ffp-contract=off.
//
// Shapes (float32, rows contiguous): conv_dim = 2 * nk * dk + nv * dv.
//   mixed (n, conv_dim) = in_proj_qkv(h);  z (n, nv * dv);  ba (n, 2 * nv) = [in_proj_b(h), in_proj_a(h)]
//   conv_w (conv_dim, K);  dt_bias (nv);  A (nv) = -exp(A_log);  norm_w (dv)
//   conv_in[r], conv_out[r]: (K - 1, conv_dim) the rows before row r / through row r (oldest first)
//   state_in[r], state_out[r]: (nv, dk, dv); out (n, nv * dv)
// conv_out[r] may be conv_in[r]; state_out[r] may be state_in[r]. Row r + 1 may read row r's outputs.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float silu(float x) { return x / (1.0f + expf(-x)); }
static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }  // torch's threshold

// x (n) divided by its L2 norm: x / sqrt(sum(x^2) + eps), then times `scale`
static void l2norm(float *x, int64_t n, float eps, float scale) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss + eps);
    for (int64_t i = 0; i < n; i++) x[i] = (x[i] * inv) * scale;
}

// One value head: S_out = decay * S_in; kv = k S_out; delta = beta * (v - kv); S_out += k^T delta; o = q S_out
// (transformers' recurrent order). S (dk, dv), q, k (dk), v, o (dv), delta: dv floats of scratch.
static void delta_head(const float *S_in, float *S_out, const float *q, const float *k, const float *v, float decay,
                       float beta, float *o, float *delta, int64_t dk, int64_t dv) {
    for (int64_t j = 0; j < dv; j++) delta[j] = 0.0f;
    for (int64_t i = 0; i < dk; i++) {
        const float *s = S_in + i * dv;
        float *d = S_out + i * dv;
        const float ki = k[i];
        for (int64_t j = 0; j < dv; j++) {
            const float x = s[j] * decay;
            d[j] = x;
            delta[j] += x * ki;  // kv, summed over i in order
        }
    }
    for (int64_t j = 0; j < dv; j++) {
        delta[j] = (v[j] - delta[j]) * beta;
        o[j] = 0.0f;
    }
    for (int64_t i = 0; i < dk; i++) {
        float *d = S_out + i * dv;
        const float ki = k[i], qi = q[i];
        for (int64_t j = 0; j < dv; j++) {
            const float x = d[j] + ki * delta[j];
            d[j] = x;
            o[j] += x * qi;
        }
    }
}

void deltanet_rows(int64_t n, int64_t nk, int64_t nv, int64_t dk, int64_t dv, int64_t K, int tiled, float eps,
                   int threads,
                   const float *mixed, const float *z, const float *ba, const float *conv_w, const float *dt_bias,
                   const float *A, const float *norm_w, const int64_t *conv_in, const int64_t *conv_out,
                   const int64_t *state_in, const int64_t *state_out, float *out) {
    const int64_t conv_dim = 2 * nk * dk + nv * dv, group = nv / nk;
    float *y = malloc(sizeof(float) * (size_t)conv_dim);  // the row's q, k, v after the convolution
    float *gates = malloc(sizeof(float) * (size_t)(2 * nv));  // decay, beta per value head
    float *delta = malloc(sizeof(float) * (size_t)(nv * dv));
    const float q_scale = 1.0f / sqrtf((float)dk);
    for (int64_t r = 0; r < n; r++) {
        const float *mx = mixed + r * conv_dim;
        const float *win = (const float *)(intptr_t)conv_in[r];
        float *wout = (float *)(intptr_t)conv_out[r];
        for (int64_t c = 0; c < conv_dim; c++) {
            const float *w = conv_w + c * K;
            float acc = 0.0f;
            for (int64_t t = 0; t < K - 1; t++) acc += w[t] * win[t * conv_dim + c];
            acc += w[K - 1] * mx[c];
            y[c] = silu(acc);
        }
        for (int64_t t = 0; t + 1 < K - 1; t++)  // shift the window by one row (in place when they alias)
            memmove(wout + t * conv_dim, win + (t + 1) * conv_dim, sizeof(float) * (size_t)conv_dim);
        memcpy(wout + (K - 2) * conv_dim, mx, sizeof(float) * (size_t)conv_dim);
        float *q = y, *k = y + nk * dk, *v = y + 2 * nk * dk;
        for (int64_t h = 0; h < nk; h++) {
            l2norm(q + h * dk, dk, 1e-6f, 1.0f);
            l2norm(k + h * dk, dk, 1e-6f, 1.0f);
            for (int64_t i = 0; i < dk; i++) q[h * dk + i] *= q_scale;
        }
        const float *b = ba + r * 2 * nv, *a = b + nv;
        for (int64_t h = 0; h < nv; h++) {
            gates[h] = expf(A[h] * softplus(a[h] + dt_bias[h]));
            gates[nv + h] = sigmoid(b[h]);
        }
        const float *S_in = (const float *)(intptr_t)state_in[r];
        float *S_out = (float *)(intptr_t)state_out[r];
        float *o = out + r * nv * dv;
        const float *zr = z + r * nv * dv;
#pragma omp parallel for schedule(static) num_threads(threads) if (nv * dk * dv >= 65536)
        for (int64_t h = 0; h < nv; h++) {
            const int64_t kh = tiled ? h % nk : h / group;
            float *oh = o + h * dv;
            delta_head(S_in + h * dk * dv, S_out + h * dk * dv, q + kh * dk, k + kh * dk, v + h * dv, gates[h],
                       gates[nv + h], oh, delta + h * dv, dk, dv);
            float ss = 0.0f;
            for (int64_t j = 0; j < dv; j++) ss += oh[j] * oh[j];
            const float inv = 1.0f / sqrtf(ss / (float)dv + eps);
            for (int64_t j = 0; j < dv; j++) oh[j] = ((oh[j] * inv) * norm_w[j]) * silu(zr[h * dv + j]);
        }
    }
    free(y);
    free(gates);
    free(delta);
}

// x (n) times sigmoid(gate) (n), in place: the gated attention's output gate
void sigmoid_mul(float *x, const float *gate, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * sigmoid(gate[i]);
}
