// The decoder layers of one exact forward over gguf-format weights, in one C call for all of them instead
// of ~15 Python-level ops a layer (on smollm2-135m those cost ~2 of a decode step's ~6 ms).
//
// It runs what model/layers.decoder_layer runs, in its order, through the same kernels: function pointers
// into the loaded gguf_linear.c, attend.c and rows.c (model/kernels/step_structs.py, step_kernels), so the same code
// computes every value and the bits are the path's through Python. What it adds is copies (contiguous
// operands, as torch's .contiguous() made them) and the residual adds, x + out per float, as torch adds.
// The MLP's activation is rows.c's act_mul_rows, which layers.mlp_act calls on the per-op path; a
// mixture layer's MLP is moe.c's moe_rows, which model/moe.py calls there.
//
// Compiled without -ffast-math and with -ffp-contract=off, as the kernels are.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*rms_norm_fn)(const float *x, const float *w, int64_t M, int64_t n, float eps, float *y);
typedef void (*rope_fn)(const float *x, const float *cos, const float *sin, int64_t N, int64_t heads, int64_t hd,
                        float *y);
typedef int64_t (*store_fn)(const float *src, int64_t T, int64_t nkv, int64_t hd, void *layer, int64_t slot,
                            int64_t max_len, int64_t start, int half);
typedef void (*attend_fn)(const float *q, const void *k, const void *v, const int64_t *slot, const int64_t *off,
                          const int64_t *idx, float *out, int64_t n, int64_t nh, int64_t nkv, int64_t hd,
                          int64_t max_len, float scale, int half, int threads);
typedef void (*act_fn)(const float *gate, const float *up, int64_t M, int64_t I, int64_t gs, int64_t us, int kind,
                       float *out);
typedef void (*linear_fn)(const float *x, int64_t M, int64_t K, int nparts, const int32_t *types,
                          const uint64_t *weights, const int64_t *rows, const int64_t *row_bytes, const float *bias,
                          float *y, int threads);

// moe.c's moe_rows: a mixture layer's router, routing and routed experts (its Kernels, Experts and Route)
typedef int (*moe_fn)(const void *kernels, const void *experts, const void *route, const float *x, int64_t n, int act,
                      int64_t *ids, float *weights, float *out, int threads);

typedef struct {
    rms_norm_fn rms_norm;
    rope_fn rope;
    store_fn store;
    attend_fn attend;
    act_fn act;
    linear_fn linear;
    moe_fn moe;  // NULL where moe.c did not load (no layer is a mixture then)
} Kernels;

typedef struct {  // one gguf-format linear: kernels.GGUFParts' arrays, its input width and its bias (or NULL)
    int64_t nparts, in;
    const int32_t *types;
    const uint64_t *weights;
    const int64_t *rows, *row_bytes;
    const float *bias;
} Linear;

typedef struct {  // one layer; a norm's weight NULL where the family has no such norm
    Linear qkv, o, gate_up, down;
    const float *attn_norm, *mlp_norm, *q_norm, *k_norm, *attn_out_norm, *mlp_out_norm;
    int64_t local;  // a sliding-window layer: the local key lists and RoPE rows
    // a mixture-of-experts layer without a shared expert (gate_up and down unused): moe.c's arguments; else NULL
    const void *moe_kernels, *moe_experts, *moe_route;
} Layer;

typedef struct {  // one forward of M exact rows
    int64_t M, H, nh, nkv, hd, I, act, threads;  // act: act_mul_rows' kind (0 SiLU, 1 GELU tanh)
    float eps, scale;
    const float *cos[2], *sin[2];               // (M, hd) RoPE rows: [0] global layers, [1] local
    const int64_t *slot[2], *off[2], *keys[2];  // attend.c's key lists, the same two ways
    int64_t nseg;
    const int64_t *seg_slot, *seg_start, *seg_row;  // each sequence's slot, cache length, first row (+ M at nseg)
    char *kcache, *vcache;                      // cache.k, cache.v: (layers, slots, nkv, max_len, hd)
    int64_t layer_values, slots, max_len, half;  // half: the cache holds float16, else float32
    float *x;                                   // (M, H) the residual rows, updated in place
    float *gate_up, *act_out;                   // scratch: (M, 2I) a layer's gate_up output, (M, I) act(gate) * up
    float *h, *qkv, *qk, *rot, *part, *attn, *out;  // scratch: (M, H), (M, (nh + 2 nkv) hd), ...
    int64_t overflow;  // out: keys and values a float16 cache could not hold (store_rows), for the caller to refuse
} Forward;

static void linear(const Kernels *k, const Linear *l, const float *x, int64_t M, float *y, int threads) {
    k->linear(x, M, l->in, (int)l->nparts, l->types, l->weights, l->rows, l->row_bytes, l->bias, y, threads);
}

// x += out (or += rms_norm(out, norm) for Gemma's sandwich norms)
static void residual(const Kernels *k, const Forward *f, const float *norm, float *out) {
    const int64_t n = f->M * f->H;
    if (norm) {
        k->rms_norm(out, norm, f->M, f->H, f->eps, f->h);
        out = f->h;
    }
    for (int64_t i = 0; i < n; i++) f->x[i] = f->x[i] + out[i];
}

// rows [r0, r1) of heads [h0, h0 + nh) of src (M, heads, hd) -> dst (r1 - r0, nh, hd), contiguous
static void take_heads(const float *src, int64_t heads, int64_t hd, int64_t r0, int64_t r1, int64_t h0, int64_t nh,
                       float *dst) {
    for (int64_t r = r0; r < r1; r++)
        memcpy(dst + (r - r0) * nh * hd, src + (r * heads + h0) * hd, sizeof(float) * (size_t)(nh * hd));
}

static void run_layer(const Kernels *k, const Layer *l, int64_t li, Forward *f) {
    const int64_t M = f->M, nh = f->nh, nkv = f->nkv, hd = f->hd, width = nh + 2 * nkv, t = f->threads;
    const int w = l->local ? 1 : 0;
    k->rms_norm(f->x, l->attn_norm, M, f->H, f->eps, f->h);
    linear(k, &l->qkv, f->h, M, f->qkv, (int)t);  // (M, nh + 2 nkv, hd)
    if (l->q_norm) {  // per head, each (hd) row normed alone, as rms_norm over the (M, heads, hd) slices
        take_heads(f->qkv, width, hd, 0, M, 0, nh, f->part);
        k->rms_norm(f->part, l->q_norm, M * nh, hd, f->eps, f->attn);
        take_heads(f->qkv, width, hd, 0, M, nh, nkv, f->part);
        k->rms_norm(f->part, l->k_norm, M * nkv, hd, f->eps, f->out);
        for (int64_t r = 0; r < M; r++) {  // torch.cat([q, k], dim=1)
            memcpy(f->qk + r * (nh + nkv) * hd, f->attn + r * nh * hd, sizeof(float) * (size_t)(nh * hd));
            memcpy(f->qk + (r * (nh + nkv) + nh) * hd, f->out + r * nkv * hd, sizeof(float) * (size_t)(nkv * hd));
        }
    } else {
        take_heads(f->qkv, width, hd, 0, M, 0, nh + nkv, f->qk);
    }
    k->rope(f->qk, f->cos[w], f->sin[w], M, nh + nkv, hd, f->rot);  // q and k heads rotated together
    const int64_t layer_bytes = f->layer_values * (f->half ? 2 : 4);
    char *kc = f->kcache + li * layer_bytes, *vc = f->vcache + li * layer_bytes;
    for (int64_t s = 0; s < f->nseg; s++) {
        const int64_t r0 = f->seg_row[s], r1 = f->seg_row[s + 1];
        take_heads(f->rot, nh + nkv, hd, r0, r1, nh, nkv, f->part);
        f->overflow += k->store(f->part, r1 - r0, nkv, hd, kc, f->seg_slot[s], f->max_len, f->seg_start[s],
                                (int)f->half);
        take_heads(f->qkv, width, hd, r0, r1, nh + nkv, nkv, f->part);
        f->overflow += k->store(f->part, r1 - r0, nkv, hd, vc, f->seg_slot[s], f->max_len, f->seg_start[s],
                                (int)f->half);
    }
    take_heads(f->rot, nh + nkv, hd, 0, M, 0, nh, f->part);
    k->attend(f->part, kc, vc, f->slot[w], f->off[w], f->keys[w], f->attn, M, nh, nkv, hd, f->max_len, f->scale,
              (int)f->half, (int)t);
    linear(k, &l->o, f->attn, M, f->out, (int)t);
    residual(k, f, l->attn_out_norm, f->out);
    k->rms_norm(f->x, l->mlp_norm, M, f->H, f->eps, f->h);
    if (l->moe_route) {  // MoE._rows' one moe.c call; its scratch is a few KB (a failed malloc: out not written)
        k->moe(l->moe_kernels, l->moe_experts, l->moe_route, f->h, M, (int)f->act, NULL, NULL, f->out, (int)t);
    } else {
        linear(k, &l->gate_up, f->h, M, f->gate_up, (int)t);  // (M, 2I): gate, then up
        k->act(f->gate_up, f->gate_up + f->I, M, f->I, 2 * f->I, 2 * f->I, (int)f->act, f->act_out);
        linear(k, &l->down, f->act_out, M, f->out, (int)t);
    }
    residual(k, f, l->mlp_out_norm, f->out);
}

// Layers l0 .. l1 - 1 (indices into layers, as in the model) of the forward, each whole; f->x holds the
// residual rows before and after. The caller stops at a layer whose output it keeps (hidden states).
void step_layers(const Kernels *k, const Layer *layers, int64_t l0, int64_t l1, Forward *f) {
    for (int64_t li = l0; li < l1; li++) run_layer(k, &layers[li], li, f);
}
