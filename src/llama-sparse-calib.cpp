// llama-sparse: activation statistics for TEAL threshold calibration (see include/llama-sparse-calib.h).
//
// The eval callback reads the input x of one zigzag matmul per (layer, group) and adds every |x_j|
// to a log-spaced histogram, together with the error mass x_j^2 * c_j, c_j = ||W[:, j]||^2 summed
// over the group's weights: the squared output change of the group's matmuls if x_j is skipped.
// Optionally it also keeps a bounded sample of whole activation rows (llama_sparse_calib_sample_*):
// the matmul inputs and the residual stream around each block, for greedy allocation (calibrate.py).
#include "llama-sparse-calib.h"
#include "llama-sparse-impl.h"

#include "llama-impl.h"
#include "llama-model.h"

#include "ggml-backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

// |x| histogram range: [2^-20, 2^20) in log-spaced bins, plus one bin below and one above
static const int32_t CALIB_MIN_EXP  = -20;
static const int32_t CALIB_OCTAVES  = 40;

namespace {

struct calib_group {
    int64_t                  n_cols       = 0;       // input width, 0 if the group has no zigzag weight
    uint64_t                 weight_bytes = 0;       // bytes of the group's zigzag weights
    const ggml_tensor *      capture      = nullptr; // the one weight whose matmul input is read
    std::vector<double>      col_norm2;              // c_j, summed over the group's weights
    std::vector<uint64_t>    counts;                 // |x| histogram
    std::vector<double>      mass;                   // sum of x_j^2 c_j per |x| bin
    uint64_t                 n_values     = 0;
    uint64_t                 n_rows       = 0;
};

// sampled rows of one (layer, point): slot s holds rows[s] rows of `width` floats
struct calib_sample {
    int64_t                         width = 0;
    std::vector<std::vector<float>> data;  // [n_slots][max_rows*width], allocated on first store
    std::vector<int64_t>            rows;  // [n_slots]
};

thread_local std::string g_calib_last_error;

void set_error(const std::string & msg) {
    g_calib_last_error = msg;
}

float float_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

} // namespace

struct llama_sparse_calib {
    int32_t  n_layer = 0;
    int32_t  shift   = 0;  // |x| bits >> shift: exponent and the top mantissa bits
    uint32_t lo_bits = 0;  // bits of 2^CALIB_MIN_EXP
    uint32_t base    = 0;  // lo_bits >> shift
    int32_t  n_main  = 0;  // log-spaced bins; bin 0 is below them, bin n_main + 1 above
    std::vector<calib_group> groups; // [n_layer][LLAMA_SPARSE_GROUP_COUNT]

    // row sampling (off until llama_sparse_calib_sample_init)
    int32_t                   sample_slots  = 0;
    int64_t                   sample_rows   = 0;
    uint32_t                  sample_points = 0;  // bit p: keep point p
    int32_t                   sample_slot   = -1; // where the batches being decoded go; -1: nowhere
    std::vector<calib_sample> samples;            // [n_layer][LLAMA_SPARSE_CALIB_POINT_COUNT]
    std::vector<float>       xbuf;   // host copy of x when it lives in device memory
    std::vector<float>       wbuf;   // one dequantized zigzag row
    std::vector<uint8_t>     qbuf;   // one quantized zigzag row, when the weight is in device memory
    std::string              error;

    int32_t n_bins() const { return n_main + 2; }

    int32_t bin(float a) const {
        uint32_t u;
        memcpy(&u, &a, sizeof(u));
        u &= 0x7fffffffu;
        if (u < lo_bits) {
            return 0;
        }
        const int64_t k = (int64_t) (u >> shift) - base + 1;
        return k > n_main ? n_main + 1 : (int32_t) k;
    }

    float lower_edge(int32_t b) const {
        return b <= 0 ? 0.0f : float_from_bits((base + (uint32_t) (b - 1)) << shift);
    }

    float upper_edge(int32_t b) const {
        return b > n_main ? 2.0f * lower_edge(b) : lower_edge(b + 1);
    }

    calib_group * group(int32_t layer, int32_t g) {
        if (layer < 0 || layer >= n_layer || g < 0 || g >= LLAMA_SPARSE_GROUP_COUNT) {
            return nullptr;
        }
        return &groups[(size_t) layer*LLAMA_SPARSE_GROUP_COUNT + g];
    }

    const calib_group * group(int32_t layer, int32_t g) const {
        return const_cast<llama_sparse_calib *>(this)->group(layer, g);
    }

    calib_sample * sample(int32_t layer, int32_t point) {
        if (samples.empty() || layer < 0 || layer >= n_layer || point < 0 || point >= LLAMA_SPARSE_CALIB_POINT_COUNT) {
            return nullptr;
        }
        return &samples[(size_t) layer*LLAMA_SPARSE_CALIB_POINT_COUNT + point];
    }
};

// c_j += ||W[:, j]||^2 over the rows of one zigzag weight: stored block j of stored row r holds W[rB .. rB+B-1, j]
// (read as runs of n blocks; in the CPU's column-major layout block b of the tensor belongs to column b/nr)
static bool add_col_norms(llama_sparse_calib * calib, const ggml_tensor * w, std::vector<double> & col_norm2) {
    const ggml_type_traits * traits = ggml_get_type_traits(w->type);
    if (traits->to_float == nullptr || w->buffer == nullptr) {
        return false;
    }
    const int64_t B      = ggml_blck_size(w->type);
    const int64_t n      = ggml_sparse_zz_n(w);
    const int64_t values = B*n;
    const size_t  bytes  = ggml_row_size(w->type, values);
    const bool    host   = ggml_backend_buffer_is_host(w->buffer);
    const bool    cm     = ggml_sparse_zz_layout(w) == GGML_SPARSE_ZZ_LAYOUT_COLS;

    calib->wbuf.resize(values);
    if (!host) {
        calib->qbuf.resize(bytes);
    }
    for (int64_t r = 0; r < w->ne[1]; ++r) {
        const void * row;
        if (host) {
            row = (const char *) w->data + r*w->nb[1];
        } else {
            ggml_backend_tensor_get(w, calib->qbuf.data(), r*w->nb[1], bytes);
            row = calib->qbuf.data();
        }
        traits->to_float(row, calib->wbuf.data(), values);
        const float * v = calib->wbuf.data();
        for (int64_t j = 0; j < n; ++j) {
            double s = 0.0;
            for (int64_t i = 0; i < B; ++i) {
                s += (double) v[j*B + i] * v[j*B + i];
            }
            col_norm2[cm ? (r*n + j)/w->ne[1] : j] += s;
        }
    }
    return true;
}

struct llama_sparse_calib * llama_sparse_calib_new(const struct llama_model * model, int32_t bins_per_octave) {
    if (model == nullptr) {
        set_error("llama_sparse_calib_new: model is NULL");
        return nullptr;
    }
    if (bins_per_octave <= 0) {
        bins_per_octave = 64;
    }
    int32_t q = 0;
    while (q < 10 && (2 << q) <= bins_per_octave) {
        q++;
    }

    auto * calib = new llama_sparse_calib();
    calib->n_layer = (int32_t) model->hparams.n_layer_all;
    calib->shift   = 23 - q;
    calib->lo_bits = (uint32_t) (127 + CALIB_MIN_EXP) << 23;
    calib->base    = calib->lo_bits >> calib->shift;
    calib->n_main  = CALIB_OCTAVES << q;
    calib->groups.resize((size_t) calib->n_layer*LLAMA_SPARSE_GROUP_COUNT);

    int32_t n_zigzag = 0;
    for (const auto & it : model->tensors_by_name) {
        const ggml_tensor * w = it.second;
        if (!ggml_sparse_is_zigzag(w)) {
            continue;
        }
        calib_group * g = calib->group(ggml_sparse_zigzag_layer(w), ggml_sparse_zigzag_group(w));
        if (g == nullptr) {
            continue; // not in a threshold group: it always runs dense
        }
        const int64_t n = ggml_sparse_zz_n(w);
        if (g->n_cols == 0) {
            g->n_cols  = n;
            g->capture = w;
            g->col_norm2.assign(n, 0.0);
            g->counts.assign(calib->n_bins(), 0);
            g->mass.assign(calib->n_bins(), 0.0);
        } else if (g->n_cols != n) {
            set_error(format("llama_sparse_calib_new: %s has %lld input columns, but its group has %lld",
                    w->name, (long long) n, (long long) g->n_cols));
            delete calib;
            return nullptr;
        }
        if (!add_col_norms(calib, w, g->col_norm2)) {
            set_error(format("llama_sparse_calib_new: cannot read the weights of %s", w->name));
            delete calib;
            return nullptr;
        }
        g->weight_bytes += ggml_nbytes(w);
        n_zigzag++;
    }
    calib->wbuf.clear();
    calib->wbuf.shrink_to_fit();
    calib->qbuf.clear();
    calib->qbuf.shrink_to_fit();

    if (n_zigzag == 0) {
        set_error("llama_sparse_calib_new: the model has no zigzag weights (convert it with `llama-sparse convert`)");
        delete calib;
        return nullptr;
    }
    return calib;
}

void llama_sparse_calib_free(struct llama_sparse_calib * calib) {
    delete calib;
}

// the capture weight of t's (layer, group) if t is the matmul to read, else nullptr
static calib_group * capture_group(llama_sparse_calib * calib, const ggml_tensor * t) {
    if (t->op != GGML_OP_MUL_MAT_ZZ) {
        return nullptr;
    }
    const ggml_tensor * w = t->src[0];
    if (!ggml_sparse_is_zigzag(w)) {
        return nullptr;
    }
    calib_group * g = calib->group(ggml_sparse_zigzag_layer(w), ggml_sparse_zigzag_group(w));
    // one matmul per group: the others read the same input
    return g != nullptr && g->capture == w ? g : nullptr;
}

static void fold_rows(llama_sparse_calib * calib, calib_group * g, const float * x, int64_t n_rows) {
    const int64_t  n      = g->n_cols;
    const double * c      = g->col_norm2.data();
    uint64_t     * counts = g->counts.data();
    double       * mass   = g->mass.data();
    for (int64_t r = 0; r < n_rows; ++r) {
        const float * xr = x + r*n;
        for (int64_t j = 0; j < n; ++j) {
            const float   v = xr[j];
            const int32_t b = calib->bin(v);
            counts[b]++;
            mass[b] += (double) (v*v) * c[j];
        }
    }
    g->n_values += (uint64_t) (n*n_rows);
    g->n_rows   += (uint64_t) n_rows;
}

// copy the first rows of x (host or device) into the current slot of (layer, point)
static void sample_store(llama_sparse_calib * calib, int32_t layer, int32_t point, const ggml_tensor * x) {
    if (calib->sample_slot < 0 || !(calib->sample_points & (1u << point))) {
        return;
    }
    calib_sample * smp = calib->sample(layer, point);
    if (smp == nullptr || x->type != GGML_TYPE_F32 || !ggml_is_contiguous(x)) {
        return;
    }
    const int64_t width = x->ne[0];
    if (smp->width != 0 && smp->width != width) {
        if (calib->error.empty()) {
            calib->error = format("llama_sparse_calib: sampled point %d of layer %d changed width (%lld, then %lld)",
                    point, layer, (long long) smp->width, (long long) width);
        }
        return;
    }
    smp->width = width;
    const int64_t rows = std::min<int64_t>(ggml_nrows(x), calib->sample_rows);
    auto & buf = smp->data[calib->sample_slot];
    buf.resize((size_t) (calib->sample_rows*width));
    const size_t bytes = (size_t) (rows*width)*sizeof(float);
    if (x->buffer == nullptr || ggml_backend_buffer_is_host(x->buffer)) {
        memcpy(buf.data(), x->data, bytes);
    } else {
        ggml_backend_tensor_get(x, buf.data(), 0, bytes);
    }
    smp->rows[calib->sample_slot] = rows;
}

// the residual stream r of a pre-norm block: the matmul input x = MUL(RMS_NORM(r), norm weight).
// r is still allocated when the matmul runs: the residual add after the block reads it later.
static const ggml_tensor * residual_of(const ggml_tensor * x) {
    if (x->op != GGML_OP_MUL || x->src[0] == nullptr || x->src[0]->op != GGML_OP_RMS_NORM) {
        return nullptr;
    }
    const ggml_tensor * r = x->src[0]->src[0];
    return r != nullptr && r->ne[0] == x->ne[0] && ggml_nrows(r) == ggml_nrows(x) ? r : nullptr;
}

bool llama_sparse_calib_eval_cb(struct ggml_tensor * t, bool ask, void * user_data) {
    auto * calib = (llama_sparse_calib *) user_data;
    calib_group * g = capture_group(calib, t);
    if (ask || g == nullptr) {
        return g != nullptr;
    }
    const ggml_tensor * x = t->src[1];
    if (x->type != GGML_TYPE_F32 || !ggml_is_contiguous(x) || x->ne[0] != g->n_cols) {
        if (calib->error.empty()) {
            calib->error = format("llama_sparse_calib: input of %s is %s [%lld, %lld] (%s); expected contiguous f32 with %lld columns",
                    g->capture->name, ggml_type_name(x->type), (long long) x->ne[0], (long long) x->ne[1],
                    ggml_is_contiguous(x) ? "contiguous" : "not contiguous", (long long) g->n_cols);
        }
        return true;
    }
    const int64_t n_rows = ggml_nrows(x);
    const float * data;
    if (x->buffer == nullptr || ggml_backend_buffer_is_host(x->buffer)) {
        data = (const float *) x->data;
    } else {
        calib->xbuf.resize((size_t) ggml_nelements(x));
        ggml_backend_tensor_get(x, calib->xbuf.data(), 0, ggml_nbytes(x));
        data = calib->xbuf.data();
    }
    fold_rows(calib, g, data, n_rows);

    if (calib->sample_slot >= 0) {
        const int32_t layer = ggml_sparse_zigzag_layer(g->capture);
        const int32_t group = ggml_sparse_zigzag_group(g->capture);
        sample_store(calib, layer, group, x);
        const ggml_tensor * r = residual_of(x);
        if (r != nullptr && group == LLAMA_SPARSE_GROUP_QKV) {
            sample_store(calib, layer, LLAMA_SPARSE_CALIB_ATTN_RESIDUAL, r);
        } else if (r != nullptr && group == LLAMA_SPARSE_GROUP_GATE_UP) {
            sample_store(calib, layer, LLAMA_SPARSE_CALIB_FFN_RESIDUAL, r);
        }
    }
    return true;
}

const char * llama_sparse_calib_last_error(void) {
    return g_calib_last_error.c_str();
}

const char * llama_sparse_calib_error(const struct llama_sparse_calib * calib) {
    return calib ? calib->error.c_str() : "llama_sparse_calib: NULL object";
}

void llama_sparse_calib_reset(struct llama_sparse_calib * calib) {
    for (auto & g : calib->groups) {
        std::fill(g.counts.begin(), g.counts.end(), 0);
        std::fill(g.mass.begin(),   g.mass.end(),   0.0);
        g.n_values = 0;
        g.n_rows   = 0;
    }
    for (auto & smp : calib->samples) {
        std::fill(smp.rows.begin(), smp.rows.end(), 0);
    }
    calib->error.clear();
}

int32_t llama_sparse_calib_n_layer(const struct llama_sparse_calib * calib) {
    return calib->n_layer;
}

uint64_t llama_sparse_calib_n_tokens(const struct llama_sparse_calib * calib) {
    uint64_t n = 0;
    for (const auto & g : calib->groups) {
        n = g.n_rows > n ? g.n_rows : n;
    }
    return n;
}

int64_t llama_sparse_calib_n_cols(const struct llama_sparse_calib * calib, int32_t layer, int32_t group) {
    const calib_group * g = calib->group(layer, group);
    return g ? g->n_cols : 0;
}

uint64_t llama_sparse_calib_weight_bytes(const struct llama_sparse_calib * calib, int32_t layer, int32_t group) {
    const calib_group * g = calib->group(layer, group);
    return g ? g->weight_bytes : 0;
}

uint64_t llama_sparse_calib_n_values(const struct llama_sparse_calib * calib, int32_t layer, int32_t group) {
    const calib_group * g = calib->group(layer, group);
    return g ? g->n_values : 0;
}

static const calib_group * group_with_data(const llama_sparse_calib * calib, int32_t layer, int32_t group, const char * fn) {
    const calib_group * g = calib ? calib->group(layer, group) : nullptr;
    if (g == nullptr) {
        set_error(format("%s: no layer %d, group %d", fn, layer, group));
        return nullptr;
    }
    if (g->n_values == 0) {
        set_error(format("%s: layer %d, group %d has no activations recorded", fn, layer, group));
        return nullptr;
    }
    return g;
}

int32_t llama_sparse_calib_threshold(const struct llama_sparse_calib * calib, int32_t layer, int32_t group,
                                     float sparsity, float * threshold, float * rel_error) {
    const calib_group * g = group_with_data(calib, layer, group, __func__);
    if (g == nullptr || !std::isfinite(sparsity)) {
        return -1;
    }
    double total_mass = 0.0;
    for (double m : g->mass) {
        total_mass += m;
    }
    float  t   = 0.0f;
    double err = 0.0;
    if (sparsity > 0.0f) {
        const double target = std::min(1.0, (double) sparsity) * (double) g->n_values;
        double cum = 0.0, cum_mass = 0.0;
        int32_t b = 0;
        for (; b < calib->n_bins(); ++b) {
            const double c = (double) g->counts[b];
            if (c > 0 && cum + c >= target) {
                break;
            }
            cum      += c;
            cum_mass += g->mass[b];
        }
        if (b == calib->n_bins()) { // everything below: skip all columns
            t   = calib->upper_edge(calib->n_bins() - 1);
            err = 1.0;
        } else {
            const double frac = (target - cum) / (double) g->counts[b];
            const double lo   = calib->lower_edge(b);
            const double hi   = calib->upper_edge(b);
            t   = (float) (lo + frac*(hi - lo));
            err = total_mass > 0 ? (cum_mass + frac*g->mass[b]) / total_mass : 0.0;
        }
    }
    if (threshold) {
        *threshold = t;
    }
    if (rel_error) {
        *rel_error = (float) err;
    }
    return 0;
}

int32_t llama_sparse_calib_sparsity_at(const struct llama_sparse_calib * calib, int32_t layer, int32_t group,
                                       float threshold, float * sparsity, float * rel_error) {
    const calib_group * g = group_with_data(calib, layer, group, __func__);
    if (g == nullptr || !std::isfinite(threshold)) {
        return -1;
    }
    double total_mass = 0.0;
    for (double m : g->mass) {
        total_mass += m;
    }
    double below = 0.0, below_mass = 0.0;
    if (threshold > 0.0f) {
        const int32_t bt = calib->bin(threshold);
        for (int32_t b = 0; b < bt; ++b) {
            below      += (double) g->counts[b];
            below_mass += g->mass[b];
        }
        const double lo   = calib->lower_edge(bt);
        const double hi   = calib->upper_edge(bt);
        const double frac = hi > lo ? std::min(1.0, std::max(0.0, (threshold - lo) / (hi - lo))) : 0.0;
        below      += frac*(double) g->counts[bt];
        below_mass += frac*g->mass[bt];
    }
    if (sparsity) {
        *sparsity = (float) (below / (double) g->n_values);
    }
    if (rel_error) {
        *rel_error = total_mass > 0 ? (float) (below_mass / total_mass) : 0.0f;
    }
    return 0;
}

int32_t llama_sparse_calib_histogram(const struct llama_sparse_calib * calib, int32_t layer, int32_t group,
                                     double * counts, double * mass, float * lower_edges, int32_t n) {
    const calib_group * g = calib ? calib->group(layer, group) : nullptr;
    if (g == nullptr || n < 0) {
        set_error(format("%s: no layer %d, group %d", __func__, layer, group));
        return -1;
    }
    const int32_t n_bins = calib->n_bins();
    for (int32_t b = 0; b < std::min(n, n_bins); ++b) {
        if (counts) {
            counts[b] = g->counts.empty() ? 0.0 : (double) g->counts[b];
        }
        if (mass) {
            mass[b] = g->mass.empty() ? 0.0 : g->mass[b];
        }
        if (lower_edges) {
            lower_edges[b] = calib->lower_edge(b);
        }
    }
    return n_bins;
}

int32_t llama_sparse_calib_sample_init(struct llama_sparse_calib * calib, int32_t n_slots, int64_t n_rows, uint32_t points) {
    if (calib == nullptr || n_slots < 0 || n_rows < 0 || (points >> LLAMA_SPARSE_CALIB_POINT_COUNT) != 0) {
        set_error(format("%s: bad arguments (slots %d, rows %lld, points 0x%x)", __func__, n_slots, (long long) n_rows, points));
        return -1;
    }
    calib->samples.clear();
    calib->sample_slots  = n_slots;
    calib->sample_rows   = n_rows;
    calib->sample_points = points;
    calib->sample_slot   = -1;
    if (n_slots > 0 && n_rows > 0 && points != 0) {
        calib->samples.resize((size_t) calib->n_layer*LLAMA_SPARSE_CALIB_POINT_COUNT);
        for (auto & smp : calib->samples) {
            smp.data.resize(n_slots);
            smp.rows.assign(n_slots, 0);
        }
    }
    return 0;
}

int32_t llama_sparse_calib_sample_slot(struct llama_sparse_calib * calib, int32_t slot) {
    if (calib == nullptr || slot < -1 || slot >= calib->sample_slots) {
        set_error(format("%s: slot %d is outside [-1, %d)", __func__, slot, calib ? calib->sample_slots : 0));
        return -1;
    }
    calib->sample_slot = slot;
    if (slot >= 0) { // the slot is overwritten: forget what it held
        for (auto & smp : calib->samples) {
            smp.rows[slot] = 0;
        }
    }
    return 0;
}

int64_t llama_sparse_calib_sample_width(const struct llama_sparse_calib * calib, int32_t layer, int32_t point) {
    const calib_sample * smp = calib ? const_cast<llama_sparse_calib *>(calib)->sample(layer, point) : nullptr;
    return smp ? smp->width : 0;
}

int64_t llama_sparse_calib_sample_rows(const struct llama_sparse_calib * calib, int32_t layer, int32_t point, int32_t slot) {
    const calib_sample * smp = calib ? const_cast<llama_sparse_calib *>(calib)->sample(layer, point) : nullptr;
    if (smp == nullptr || slot < 0 || slot >= calib->sample_slots) {
        return 0;
    }
    return smp->rows[slot];
}

int64_t llama_sparse_calib_sample_get(const struct llama_sparse_calib * calib, int32_t layer, int32_t point, int32_t slot,
                                      float * dst, int64_t max_rows) {
    const calib_sample * smp = calib ? const_cast<llama_sparse_calib *>(calib)->sample(layer, point) : nullptr;
    if (smp == nullptr || slot < 0 || slot >= calib->sample_slots || dst == nullptr || max_rows < 0) {
        set_error(format("%s: no sample for layer %d, point %d, slot %d", __func__, layer, point, slot));
        return -1;
    }
    const int64_t rows = std::min(max_rows, smp->rows[slot]);
    if (rows > 0) {
        memcpy(dst, smp->data[slot].data(), (size_t) (rows*smp->width)*sizeof(float));
    }
    return rows;
}
