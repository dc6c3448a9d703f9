// The routed experts of one mixture-of-experts layer over gguf-format weights, in one C call for all of a
// forward's rows instead of a Python loop over experts (model/moe.py, MoE._rows: on a synthetic Qwen3-MoE of
// 16 layers, 4 of 32 experts a token, that loop's ~8 Python-level ops per expert cost ~1/4 of a decode step).
//
// It computes what the per-expert path computes, through the same kernels: function pointers into the loaded
// gguf_linear.c and rows.c (model/kernels/moe_experts.py), as step.c does, so the same code computes every
// value and the bits are that path's:
//
//     for each expert e chosen by any row, the rows that chose it (in row order), gathered:
//         gu (m, 2I) = gguf_linear(x rows, [e's gate rows, e's up rows])   one pass, x quantized once
//         a  (m, I)  = act_mul_rows(gu[:, :I], gu[:, I:])                  rows.c's activation, MoE's act
//         y  (m, H)  = gguf_linear(a, e's down rows)
//         part[row, rank] = weight[row, rank] * y[row]                    rank: e's place in the row's ids
//     out[row] = part[row, 0] + part[row, 1] + ... + part[row, k - 1]     one add at a time, in rank order
//
// so an expert's weights are read once per call whatever number of rows chose it. A single row (a decode
// step) takes its k experts' gate and up rows in one gguf_linear call (2k parts, one parallel pass) and its
// k down products one call each: gguf_linear computes each output element from its weight row and activation
// row alone, in one fixed order (row-invariant, whatever the other rows, parts or threads), and act_mul_rows
// each element alone, so grouping changes no bit. A row computed alone or among others gets the same bits.
// Threads: each gguf_linear call splits its output columns among them, except where a step's k down
// products, or a verify's experts (SPLIT_PAIRS), are split among them whole (one parallel region instead
// of one or two per expert), each call then single-threaded: the same bits either way.
//
// step.c calls moe_rows for a mixture layer without a shared expert, so such a model's decode or verify
// forward is one C call for all its layers.
//
// The routing (moe_route) is computed here too, row by row, for the gguf format wherever this kernel runs
// (MoE.route calls it): scores, choice, top k and weights as model/moe_config.py writes them, with libm's
// expf (torch's softmax and sigmoid take a vectorized exp whose bits depend on where a row's tail falls). A
// row's experts and weights are a function of its router logits alone.
//
// Compiled without -ffast-math and with -ffp-contract=off, as the kernels are: each product and add rounds
// as torch's float32 ops do.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*act_fn)(const float *gate, const float *up, int64_t M, int64_t I, int64_t gs, int64_t us, int kind,
                       float *out);
typedef void (*linear_fn)(const float *x, int64_t M, int64_t K, int nparts, const int32_t *types,
                          const uint64_t *weights, const int64_t *rows, const int64_t *row_bytes, const float *bias,
                          float *y, int threads);

typedef struct {  // the entry points called: rows.c's act_mul_rows, gguf_linear.c's gguf_linear
    act_fn act;
    linear_fn linear;
} Kernels;

// E experts' stacked weights as the file stacks them (llama.cpp's ffn_{gate,up,down}_exps, repacked for
// gguf_linear): tensor t (0 gate, 1 up, 2 down) holds expert e's rows at base[t] + e * rows_t * row_bytes[t],
// rows_t = I for gate and up, H for down; types[t] its ggml type id (0: float32 values)
typedef struct {
    int64_t experts, hidden, inter;
    int32_t types[3];
    int32_t pad;
    uint64_t base[3];
    int64_t row_bytes[3];
} Experts;

typedef struct {  // a mixture's routing (MoEConfig's fields) and its router, a gguf_linear's parts (E rows)
    int64_t experts, k, groups, groups_used;
    int32_t sigmoid, norm_topk;  // scoring: sigmoid, else softmax; the k weights divided by their sum
    float norm_floor, routed_scale;
    const float *bias;  // (E,) added to the scores for the choice only, or NULL
    int64_t nparts;
    const int32_t *types;
    const uint64_t *weights;
    const int64_t *rows, *row_bytes;
} Route;

// the index of the largest of v[0..n-1] not yet taken (ties: the lowest index; -inf is taken last)
static int64_t best_of(const float *v, const char *taken, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

// One row: logits (E) -> ids (k), increasing, and their weights (k). scratch: 2E + G floats, E + G chars.
static void route_row(const Route *c, const float *logits, int64_t *ids, float *weights, float *scratch,
                      char *taken) {
    const int64_t E = c->experts, G = c->groups, per = E / G;
    float *scores = scratch, *choice = scratch + E, *group = scratch + 2 * E;
    if (c->sigmoid) {
        for (int64_t i = 0; i < E; i++) scores[i] = 1.0f / (1.0f + expf(-logits[i]));
    } else {  // softmax: exp(x - max) / their sum, added in index order
        float top = logits[0], sum = 0.0f;
        for (int64_t i = 1; i < E; i++) top = logits[i] > top ? logits[i] : top;
        for (int64_t i = 0; i < E; i++) sum += scores[i] = expf(logits[i] - top);
        for (int64_t i = 0; i < E; i++) scores[i] = scores[i] / sum;
    }
    for (int64_t i = 0; i < E; i++) choice[i] = c->bias ? scores[i] + c->bias[i] : scores[i];
    if (G > 1) {  // keep the best groups_used groups, a group scored by the sum of its two best choices
        memset(taken, 0, (size_t)E);
        for (int64_t g = 0; g < G; g++) {
            const int64_t a = best_of(choice + g * per, taken + g * per, per);
            taken[g * per + a] = 1;
            const int64_t b = best_of(choice + g * per, taken + g * per, per);
            group[g] = choice[g * per + a] + choice[g * per + b];
        }
        memset(taken, 0, (size_t)(E + G));
        for (int64_t u = 0; u < c->groups_used; u++) taken[E + best_of(group, taken + E, G)] = 1;
        for (int64_t g = 0; g < G; g++)
            if (!taken[E + g])
                for (int64_t i = 0; i < per; i++) choice[g * per + i] = -INFINITY;
    }
    memset(taken, 0, (size_t)E);
    for (int64_t j = 0; j < c->k; j++) taken[best_of(choice, taken, E)] = 1;
    int64_t j = 0;
    for (int64_t i = 0; i < E; i++)  // the k chosen, in increasing id
        if (taken[i]) ids[j++] = i;
    float total = 0.0f;
    for (j = 0; j < c->k; j++) {
        weights[j] = scores[ids[j]];
        total = j ? total + weights[j] : weights[j];
    }
    if (c->norm_topk) {
        const float by = c->norm_floor != 0.0f ? total + c->norm_floor : total;
        for (j = 0; j < c->k; j++) weights[j] = weights[j] / by;
    }
    if (c->routed_scale != 1.0f)
        for (j = 0; j < c->k; j++) weights[j] = weights[j] * c->routed_scale;
}

// ids (n, k) int64 and weights (n, k) float32 of n rows from their router logits (n, E). Returns 0, or -1
// where scratch memory could not be had.
int moe_route(const Route *c, const float *logits, int64_t n, int64_t *ids, float *weights) {
    float *scratch = malloc(sizeof(float) * (size_t)(2 * c->experts + c->groups));
    char *taken = malloc((size_t)(c->experts + c->groups));
    if (!scratch || !taken) {
        free(scratch), free(taken);
        return -1;
    }
    for (int64_t r = 0; r < n; r++)
        route_row(c, logits + r * c->experts, ids + r * c->k, weights + r * c->k, scratch, taken);
    free(scratch), free(taken);
    return 0;
}

static uint64_t expert_rows(const Experts *w, int t, int64_t e) {
    const int64_t rows = t == 2 ? w->hidden : w->inter;
    return w->base[t] + (uint64_t)(e * rows * w->row_bytes[t]);
}

// y (m, 2I) = x (m, H) @ [gate_e; up_e].T for the n_e experts es[0..n_e-1], their gate and up rows side by side
// per expert: y's columns are gate_es[0], up_es[0], gate_es[1], ... (n_e * 2I of them)
static void gate_up(const Kernels *k, const Experts *w, const int64_t *es, int64_t n_e, const float *x, int64_t m,
                    float *y, int threads) {
    int32_t *types = malloc(sizeof(int32_t) * (size_t)(2 * n_e));
    uint64_t *at = malloc(sizeof(uint64_t) * (size_t)(2 * n_e));
    int64_t *rows = malloc(sizeof(int64_t) * (size_t)(2 * n_e)), *bytes = malloc(sizeof(int64_t) * (size_t)(2 * n_e));
    for (int64_t j = 0; j < n_e; j++)
        for (int t = 0; t < 2; t++) {
            types[2 * j + t] = w->types[t];
            at[2 * j + t] = expert_rows(w, t, es[j]);
            rows[2 * j + t] = w->inter;
            bytes[2 * j + t] = w->row_bytes[t];
        }
    k->linear(x, m, w->hidden, (int)(2 * n_e), types, at, rows, bytes, NULL, y, threads);
    free(types);
    free(at);
    free(rows);
    free(bytes);
}

// y (m, H) = a (m, I) @ down_e.T
static void down(const Kernels *k, const Experts *w, int64_t e, const float *a, int64_t m, float *y, int threads) {
    const int32_t type = w->types[2];
    const uint64_t at = expert_rows(w, 2, e);
    const int64_t rows = w->hidden, bytes = w->row_bytes[2];
    k->linear(a, m, w->inter, 1, &type, &at, &rows, &bytes, NULL, y, threads);
}

// part[i] = wt * y[i] for i < H
static void weigh(float *part, const float *y, float wt, int64_t H) {
    for (int64_t i = 0; i < H; i++) part[i] = wt * y[i];
}

#define SPLIT_PAIRS 64  // (row, expert) pairs up to which a call's experts are split among the threads

// Expert e over the m rows row[0..m-1] of x (n, H) that chose it, at ranks rank[0..m-1] of their ids:
// part[row, rank] = weight[row, rank] * down(act(gate, up)), through scratch xe (m, H), gu (m, 2I), a (m, I),
// y (m, H)
static void expert(const Kernels *k, const Experts *w, int64_t e, const int64_t *row, const int64_t *rank, int64_t m,
                   const float *x, int64_t kk, const float *weights, int act, float *xe, float *gu, float *a, float *y,
                   float *parts, int threads) {
    const int64_t H = w->hidden, I = w->inter;
    for (int64_t i = 0; i < m; i++) memcpy(xe + i * H, x + row[i] * H, sizeof(float) * (size_t)H);
    gate_up(k, w, &e, 1, xe, m, gu, threads);
    k->act(gu, gu + I, m, I, 2 * I, 2 * I, act, a);
    down(k, w, e, a, m, y, threads);
    for (int64_t i = 0; i < m; i++)
        weigh(parts + (row[i] * kk + rank[i]) * H, y + i * H, weights[row[i] * kk + rank[i]], H);
}

// out (n, H) = the routed experts' weighted sum for the n rows x (n, H): ids (n, kk) int64, each row's experts
// in increasing id order (distinct, each < E), weights (n, kk) float32 their weights; act: act_mul_rows' kind.
// Returns 0, or -1 where scratch memory could not be had (out untouched).
int moe_experts(const Kernels *k, const Experts *w, const float *x, int64_t n, int64_t kk, const int64_t *ids,
                const float *weights, int act, float *out, int threads) {
    const int64_t H = w->hidden, I = w->inter, E = w->experts;
    if (n <= 0) return 0;
    float *parts = malloc(sizeof(float) * (size_t)(n * kk * H));  // (n, kk, H) weight * expert output
    if (n == 1) {  // a decode step: every expert's rows are row 0
        float *gu = malloc(sizeof(float) * (size_t)(kk * 2 * I)), *a = malloc(sizeof(float) * (size_t)(kk * I));
        float *y = malloc(sizeof(float) * (size_t)(kk * H));
        if (!parts || !gu || !a || !y) {
            free(parts), free(gu), free(a), free(y);
            return -1;
        }
        gate_up(k, w, ids, kk, x, 1, gu, threads);
        k->act(gu, gu + I, kk, I, 2 * I, 2 * I, act, a);  // expert j's gate and up as row j
        // the k down products: where the threads divide them, each thread whole experts (one parallel region
        // where there were k; a call's bits do not depend on its threads), else each call over all threads
        const int split = threads > 1 && kk % threads == 0;
        #pragma omp parallel for schedule(static) num_threads(threads) if (split)
        for (int64_t j = 0; j < kk; j++) {
            down(k, w, ids[j], a + j * I, 1, y + j * H, split ? 1 : threads);
            weigh(parts + j * H, y + j * H, weights[j], H);
        }
        free(gu), free(a), free(y);
    } else {
        // each expert's (row, rank) pairs, rows in increasing order: expert e's at [first[e], first[e + 1]);
        // used: the experts chosen, in increasing id
        int64_t *first = calloc((size_t)(E + 1), sizeof(int64_t)), *next = malloc(sizeof(int64_t) * (size_t)E);
        int64_t *row = malloc(sizeof(int64_t) * (size_t)(n * kk)), *rank = malloc(sizeof(int64_t) * (size_t)(n * kk));
        int64_t *used = malloc(sizeof(int64_t) * (size_t)E), nused = 0, most = 0;
        if (first)
            for (int64_t i = 0; i < n * kk; i++) first[ids[i] + 1]++;
        for (int64_t e = 0; first && e < E; e++) {
            most = first[e + 1] > most ? first[e + 1] : most;
            if (first[e + 1] && used) used[nused++] = e;
            first[e + 1] += first[e];
        }
        // a verify's few rows: each thread whole experts (scratch for every pair); else each expert in turn
        // over all threads (scratch for one). A call's bits do not depend on its threads, so neither do these.
        const int split = threads > 1 && nused >= threads && n * kk <= SPLIT_PAIRS;
        const int64_t span = split ? n * kk : most;
        float *xe = malloc(sizeof(float) * (size_t)(span * H)), *gu = malloc(sizeof(float) * (size_t)(span * 2 * I));
        float *a = malloc(sizeof(float) * (size_t)(span * I)), *y = malloc(sizeof(float) * (size_t)(span * H));
        if (!parts || !first || !next || !row || !rank || !used || !xe || !gu || !a || !y) {
            free(parts), free(first), free(next), free(row), free(rank), free(used);
            free(xe), free(gu), free(a), free(y);
            return -1;
        }
        memcpy(next, first, sizeof(int64_t) * (size_t)E);
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < kk; j++) {
                const int64_t p = next[ids[r * kk + j]]++;
                row[p] = r, rank[p] = j;
            }
        #pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (split)
        for (int64_t u = 0; u < nused; u++) {
            const int64_t e = used[u], p = first[e], m = first[e + 1] - p, at = split ? p : 0;
            expert(k, w, e, row + p, rank + p, m, x, kk, weights, act, xe + at * H, gu + at * 2 * I, a + at * I,
                   y + at * H, parts, split ? 1 : threads);
        }
        free(first), free(next), free(row), free(rank), free(used);
        free(xe), free(gu), free(a), free(y);
    }
    for (int64_t r = 0; r < n; r++) {  // out = part 0 + part 1 + ..., one add at a time as torch adds them
        const float *p = parts + r * kk * H;
        float *o = out + r * H;
        memcpy(o, p, sizeof(float) * (size_t)H);
        for (int64_t j = 1; j < kk; j++)
            for (int64_t i = 0; i < H; i++) o[i] = o[i] + p[j * H + i];
    }
    free(parts);
    return 0;
}

// The whole routed part of a mixture for n rows x (n, H): the router's logits (gguf_linear), each row's
// routing (moe_route) into ids (n, k) and weights (n, k) (NULL, NULL: kept in scratch; step.c's call), and
// out (n, H) as moe_experts. Returns 0 or -1.
int moe_rows(const Kernels *k, const Experts *w, const Route *c, const float *x, int64_t n, int act, int64_t *ids,
             float *weights, float *out, int threads) {
    float *logits = malloc(sizeof(float) * (size_t)(n * c->experts + 1));
    int64_t *own_ids = ids ? NULL : malloc(sizeof(int64_t) * (size_t)(n * c->k + 1));
    float *own_weights = weights ? NULL : malloc(sizeof(float) * (size_t)(n * c->k + 1));
    int bad = !logits || (!ids && !own_ids) || (!weights && !own_weights);
    if (!bad) {
        ids = ids ? ids : own_ids, weights = weights ? weights : own_weights;
        k->linear(x, n, w->hidden, (int)c->nparts, c->types, c->weights, c->rows, c->row_bytes, NULL, logits,
                  threads);
        bad = moe_route(c, logits, n, ids, weights) || moe_experts(k, w, x, n, c->k, ids, weights, act, out, threads);
    }
    free(logits), free(own_ids), free(own_weights);
    return bad ? -1 : 0;
}
