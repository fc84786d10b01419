// llama-sparse: ggml-metal glue for GGML_OP_SPARSE_IDX and GGML_OP_MUL_MAT_ZZ (compiled into ggml-metal;
// patch 0010 calls the three entry points of ggml-sparse-metal.h). The kernels are in metal/*.metal,
// built by ggml-metal as the libraries "sparse_idx", "mul_mat_zz" and "sparq_attn".
//
// Environment: LLAMA_SPARSE_METAL_IDX=atomic   LIST by atomic offset reservation (segments unordered)
//              LLAMA_SPARSE_METAL_N1, _NSG     GEMV threadgroups per block-row, simdgroups per threadgroup
//              LLAMA_SPARSE_METAL_STATS=0      LIST kernels do not count for llama_sparse_get_stats
#include "ggml-sparse-metal.h"
#include "ggml-sparse.h"

#include "ggml.h"
#include "ggml-impl.h"
#include "ggml-backend-impl.h"

#include "ggml-metal-impl.h"
#include "ggml-metal-device.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <unistd.h>

static ggml_metal_buffer_id zz_buffer_id(const ggml_tensor * t) {
    ggml_backend_buffer_t buffer = t->view_src ? t->view_src->buffer : t->buffer;
    return ggml_metal_buffer_get_id((ggml_metal_buffer_t) buffer->context, t);
}

// scratch after the op's dst (ggml_metal_sparse_extra_size bytes, allocated by ggml-metal with dst)
static ggml_metal_buffer_id zz_scratch_id(const ggml_tensor * op, size_t offs) {
    ggml_metal_buffer_id id = zz_buffer_id(op);
    id.offs += GGML_PAD(ggml_nbytes(op), 256) + offs;
    return id;
}

static int zz_env_int(const char * name, int def) {
    const char * s = getenv(name);
    return s != nullptr && atoi(s) > 0 ? atoi(s) : def;
}

static bool zz_idx_atomic(void) {
    const char * s = getenv("LLAMA_SPARSE_METAL_IDX");
    return s != nullptr && strcmp(s, "atomic") == 0;
}

static const char * zz_type_tag(ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_K: return "q4_K";
        case GGML_TYPE_Q6_K: return "q6_K";
        case GGML_TYPE_Q8_0: return "q8_0";
        case GGML_TYPE_Q4_0: return "q4_0";
        default:             return nullptr;
    }
}

// pipeline by kernel name; nt >= 0 specializes FC_zz_nt
static ggml_metal_pipeline_with_params zz_pipeline(ggml_metal_library_t lib, const char * base, int nt) {
    char name[128];
    snprintf(name, sizeof(name), "%s_nt=%d", base, nt);
    ggml_metal_pipeline_with_params res = ggml_metal_library_get_pipeline(lib, name);
    if (res.pipeline == nullptr) {
        ggml_metal_cv_t cv = nullptr;
        if (nt >= 0) {
            cv = ggml_metal_cv_init();
            ggml_metal_cv_set_int16(cv, (int16_t) nt, GGML_SPARSE_METAL_FC_ZZ_NT);
        }
        res = ggml_metal_library_compile_pipeline(lib, base, name, cv);
        if (cv) {
            ggml_metal_cv_free(cv);
        }
    }
    GGML_ASSERT(res.pipeline != nullptr && "llama-sparse: Metal kernel missing from the library");
    return res;
}

struct zz_shape {
    ggml_type type;
    int64_t   B, n, nr, m, nt;
    int       n1, nsg;     // GEMV
    int64_t   tile_rows;   // prefill
};

static zz_shape zz_shape_of(const ggml_tensor * op) {
    const ggml_tensor * w = op->src[0];
    zz_shape s = {};
    s.type = w->type;
    s.B    = ggml_blck_size(w->type);
    s.n    = w->ne[0]/s.B;
    s.nr   = w->ne[1];
    s.m    = s.nr*s.B;
    s.nt   = op->src[1]->ne[1];
    ggml_sparse_metal_zz_shape(s.type, s.n, s.nr, &s.n1, &s.nsg);
    s.n1  = zz_env_int("LLAMA_SPARSE_METAL_N1",  s.n1);
    s.nsg = zz_env_int("LLAMA_SPARSE_METAL_NSG", s.nsg);
    // threadgroup memory holds nsg*nt*B floats: at most 32 KiB (4 simdgroups for 8 tokens of a 256-block)
    if (s.nt <= GGML_SPARSE_MAX_BATCH && s.nsg*s.nt*s.B*4 > 32*1024) {
        s.nsg = (int) ((32*1024)/(s.nt*s.B*4));
    }
    s.tile_rows = ggml_sparse_metal_zz_tile_rows(s.type, s.n, s.nr);
    return s;
}

static bool zz_sparq_supported(const ggml_tensor * op) {
    const ggml_tensor * q  = op->src[0];
    const ggml_tensor * k  = op->src[1];
    const ggml_tensor * kt = op->src[2];
    const ggml_tensor * v  = op->src[3];
    const ggml_tensor * m  = op->src[4];
    if (q == nullptr || k == nullptr || kt == nullptr || v == nullptr || m == nullptr) {
        return false;
    }
    const int64_t D = q->ne[0], Hkv = k->ne[2];
    const int64_t G = Hkv > 0 ? q->ne[2]/Hkv : 0;
    // one K/V element type per kernel; the group's q, the component keys and list fit in 32 KiB
    // k_t: K's type, or Q8_0 beside f16 K (n_kv % 32 == 0, as the op requires)
    const bool kt_ok = kt->type == k->type || (kt->type == GGML_TYPE_Q8_0 && k->type == GGML_TYPE_F16 && k->ne[1] % 32 == 0);
    return (k->type == GGML_TYPE_F16 || k->type == GGML_TYPE_F32) && kt_ok && v->type == k->type &&
           (m->type == GGML_TYPE_F16 || m->type == GGML_TYPE_F32) &&
           G >= 1 && G <= GGML_SPARSE_METAL_SPARQ_MAX_G && ggml_sparse_metal_sparq_smem(G, D) <= 32*1024 &&
           k->ne[1] <= INT32_MAX/4 && ggml_is_contiguous(op) && op->type == GGML_TYPE_F32;
}

bool ggml_metal_sparse_supports_op(const ggml_tensor * op, bool has_simd_reduction, bool has_simdgroup_mm) {
    if (!has_simd_reduction) {
        return false;
    }
    if (op->op == GGML_OP_SPARQ_ATTN) {
        return zz_sparq_supported(op);
    }
    if (op->op == GGML_OP_SPARSE_IDX) {
        const ggml_tensor * x = op->src[0];
        if (x->type != GGML_TYPE_F32 || !ggml_is_contiguous(x) || x->ne[0] > INT32_MAX - 1) {
            return false;
        }
        if (op->op_params[1] == GGML_SPARSE_IDX_LIST) {
            return op->type == GGML_TYPE_I32 && x->ne[1] <= GGML_SPARSE_MAX_BATCH && x->ne[2] == 1 && x->ne[3] == 1;
        }
        return op->op_params[1] == GGML_SPARSE_IDX_MASK && op->type == GGML_TYPE_F32 && ggml_is_contiguous(op) &&
               ggml_nrows(x) <= 65535;
    }
    if (op->op == GGML_OP_MUL_MAT_ZZ) {
        const ggml_tensor * w   = op->src[0];
        const ggml_tensor * x   = op->src[1];
        const ggml_tensor * idx = op->src[2];
        if (zz_type_tag(w->type) == nullptr || !ggml_is_contiguous(w) || x->type != GGML_TYPE_F32 ||
            x->nb[0] != sizeof(float) || op->type != GGML_TYPE_F32 || op->nb[0] != sizeof(float)) {
            return false;
        }
        if (ggml_sparse_zz_layout(w) != GGML_SPARSE_ZZ_LAYOUT_ROWS) { // a CPU-repacked weight
            return false;
        }
        if (idx != nullptr && (idx->type != GGML_TYPE_I32 || x->ne[1] > GGML_SPARSE_MAX_BATCH)) {
            return false;
        }
        return x->ne[1] <= GGML_SPARSE_MAX_BATCH || has_simdgroup_mm;
    }
    return false;
}

size_t ggml_metal_sparse_extra_size(const ggml_tensor * op) {
    size_t res = 0;
    if (op->op == GGML_OP_SPARSE_IDX) {
        if (op->op_params[1] == GGML_SPARSE_IDX_LIST) {
            int ntg, seg, nseg;
            ggml_sparse_metal_idx_shape(op->src[0]->ne[0], (int) op->src[0]->ne[1], 1024, &ntg, &seg, &nseg);
            res = nseg*sizeof(int32_t);
        }
    } else if (op->op == GGML_OP_SPARQ_ATTN) {
        const ggml_tensor * q = op->src[0], * k = op->src[1];
        const int64_t units = k->ne[2]*q->ne[1]*q->ne[3];
        res = units*ggml_sparse_metal_sparq_scratch_unit(q->ne[2]/k->ne[2], k->ne[1]);
    } else if (op->op == GGML_OP_MUL_MAT_ZZ) {
        const zz_shape s = zz_shape_of(op);
        if (s.nt <= GGML_SPARSE_MAX_BATCH) {
            res = s.n1 > 1 ? (size_t) s.n1*s.nt*s.m*sizeof(float) : 0;
        } else {
            res = GGML_PAD((size_t) s.tile_rows*s.B*s.n*sizeof(ggml_fp16_t), 256) + (size_t) s.tile_rows*s.B*s.nt*sizeof(float);
        }
    }
    return res ? GGML_PAD(ggml_nbytes(op), 256) - ggml_nbytes(op) + GGML_PAD(res, 256) : 0;
}

//
// counters of llama_sparse_get_stats: a slot of GGML_SPARSE_METAL_STATS_WORDS u32 per ggml_sparse_stats, in page-
// aligned host memory that each device maps as a shared buffer. The LIST kernels add to it; the collector reads it
// once the context has synchronized (llama_sparse_get_stats synchronizes first) and folds the growth into the
// host struct, as the CUDA counters do.
//

#define ZZ_STATS_SLOTS   1024
#define ZZ_STATS_MAX_DEV 8

struct zz_stats_dev {
    ggml_metal_device_t  dev   = nullptr;
    uint32_t *           words = nullptr;
    ggml_metal_buffer_id base  = { nullptr, 0 }; // the words as the kernels bind them
};

struct zz_stats_rec {
    int      slot;
    uint32_t devices = 0;                     // bit d: zz_stats_devs[d] may have counted
    uint64_t seen[ZZ_STATS_MAX_DEV][3] = {};  // what was folded into the host struct so far
};

static std::mutex                                               zz_stats_mutex;
static zz_stats_dev                                             zz_stats_devs[ZZ_STATS_MAX_DEV];
static std::unordered_map<const ggml_sparse_stats *, zz_stats_rec> zz_stats_recs;
static std::vector<int>                                         zz_stats_free_slots;
static int                                                      zz_stats_next_slot = 0;

static uint64_t zz_stats_word64(const uint32_t * w) {
    return (uint64_t) __atomic_load_n(w, __ATOMIC_RELAXED) | (uint64_t) __atomic_load_n(w + 1, __ATOMIC_RELAXED) << 32;
}

static void zz_stats_collect_metal(ggml_sparse_stats * stats, bool release) {
    std::lock_guard<std::mutex> lock(zz_stats_mutex);
    auto it = zz_stats_recs.find(stats);
    if (it == zz_stats_recs.end()) {
        return;
    }
    zz_stats_rec & rec = it->second;
    for (int d = 0; d < ZZ_STATS_MAX_DEV; ++d) {
        if (!(rec.devices >> d & 1)) {
            continue;
        }
        uint32_t * w = zz_stats_devs[d].words + (size_t) rec.slot*GGML_SPARSE_METAL_STATS_WORDS;
        const uint64_t v[3] = { zz_stats_word64(w), zz_stats_word64(w + 2), zz_stats_word64(w + 4) };
        __atomic_fetch_add(&stats->n_lists,  v[0] - rec.seen[d][0], __ATOMIC_RELAXED);
        __atomic_fetch_add(&stats->n_cols,   v[1] - rec.seen[d][1], __ATOMIC_RELAXED);
        __atomic_fetch_add(&stats->n_active, v[2] - rec.seen[d][2], __ATOMIC_RELAXED);
        memcpy(rec.seen[d], v, sizeof(v));
        if (release) {
            for (int i = 0; i < GGML_SPARSE_METAL_STATS_WORDS; ++i) {
                __atomic_store_n(w + i, 0u, __ATOMIC_RELAXED);
            }
        }
    }
    if (release) {
        zz_stats_free_slots.push_back(rec.slot);
        zz_stats_recs.erase(it);
    }
}

// the counters' slot of a LIST op on lib's device: {nullptr, 0} when it has none (no stats attached, counting
// off, or no slot or mapping to be had)
static ggml_metal_buffer_id zz_stats_slot(ggml_metal_library_t lib, const ggml_tensor * idx) {
    static const bool off = [] {
        const char * e = getenv("LLAMA_SPARSE_METAL_STATS");
        return e != nullptr && atoi(e) == 0;
    }();
    const ggml_sparse_stats * stats = off ? nullptr : ggml_sparse_idx_get_stats(idx);
    if (stats == nullptr) {
        return { nullptr, 0 };
    }
    ggml_metal_device_t dev = ggml_metal_library_get_device(lib);

    std::lock_guard<std::mutex> lock(zz_stats_mutex);
    int d = 0;
    while (d < ZZ_STATS_MAX_DEV && zz_stats_devs[d].dev != nullptr && zz_stats_devs[d].dev != dev) {
        ++d;
    }
    if (d == ZZ_STATS_MAX_DEV) {
        return { nullptr, 0 };
    }
    zz_stats_dev & sd = zz_stats_devs[d];
    if (sd.dev == nullptr) {
        const size_t page  = (size_t) sysconf(_SC_PAGESIZE);
        const size_t bytes = GGML_PAD((size_t) ZZ_STATS_SLOTS*GGML_SPARSE_METAL_STATS_WORDS*sizeof(uint32_t), page);
        void * mem = nullptr;
        if (posix_memalign(&mem, page, bytes) != 0) {
            return { nullptr, 0 };
        }
        memset(mem, 0, bytes);
        ggml_metal_buffer_t buf = ggml_metal_buffer_map(dev, mem, bytes, bytes);
        if (buf == nullptr) {
            free(mem);
            GGML_LOG_WARN("llama-sparse: could not map the sparse stats counters; Metal does not count them\n");
            return { nullptr, 0 };
        }
        // (buf is kept for the process's life, as the device is)
        ggml_tensor whole = {};
        whole.type  = GGML_TYPE_I32;
        whole.ne[0] = (int64_t) (bytes/sizeof(int32_t));
        whole.ne[1] = whole.ne[2] = whole.ne[3] = 1;
        whole.nb[0] = sizeof(int32_t);
        whole.nb[1] = whole.nb[2] = whole.nb[3] = bytes;
        whole.data  = mem;
        sd.dev   = dev;
        sd.words = (uint32_t *) mem;
        sd.base  = ggml_metal_buffer_get_id(buf, &whole);
    }
    auto it = zz_stats_recs.find(stats);
    if (it == zz_stats_recs.end()) {
        int slot = -1;
        if (!zz_stats_free_slots.empty()) {
            slot = zz_stats_free_slots.back();
            zz_stats_free_slots.pop_back();
        } else if (zz_stats_next_slot < ZZ_STATS_SLOTS) {
            slot = zz_stats_next_slot++;
        } else {
            static bool warned = false;
            if (!warned) {
                warned = true;
                GGML_LOG_WARN("llama-sparse: more than %d contexts count on Metal: sparse stats of the newer ones are "
                              "not counted there\n", ZZ_STATS_SLOTS);
            }
            return { nullptr, 0 };
        }
        static bool registered = false;
        if (!registered) {
            registered = true;
            ggml_sparse_stats_add_collector(zz_stats_collect_metal);
        }
        it = zz_stats_recs.emplace(stats, zz_stats_rec{ slot }).first;
    }
    it->second.devices |= 1u << d;

    ggml_metal_buffer_id id = sd.base;
    id.offs += (size_t) it->second.slot*GGML_SPARSE_METAL_STATS_WORDS*sizeof(uint32_t);
    return id;
}

static void zz_encode_idx(ggml_metal_library_t lib, ggml_metal_encoder_t enc, const ggml_tensor * op) {
    const ggml_tensor * x = op->src[0];

    float thr;
    memcpy(&thr, &op->op_params[0], sizeof(float));

    if (op->op_params[1] == GGML_SPARSE_IDX_MASK) {
        auto pipeline = zz_pipeline(lib, "kernel_sparse_idx_mask", -1);
        ggml_sparse_metal_kargs_mask args = { (int32_t) x->ne[0], 0, x->nb[1], op->nb[1], thr, 0 };
        ggml_metal_encoder_set_pipeline(enc, pipeline);
        ggml_metal_encoder_set_bytes   (enc, &args, sizeof(args), 0);
        ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(x),  1);
        ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(op), 2);
        ggml_metal_encoder_dispatch_threadgroups(enc, (int) ((x->ne[0] + 255)/256), (int) ggml_nrows(x), 1, 256, 1, 1);
        return;
    }

    const int64_t n  = x->ne[0];
    const int     nt = (int) x->ne[1];
    const bool atomic = zz_idx_atomic();

    auto pipeline = zz_pipeline(lib, atomic ? "kernel_sparse_idx_list_atomic" : "kernel_sparse_idx_list", -1);
    int ntg, seg, nseg;
    ggml_sparse_metal_idx_shape(n, nt, ggml_metal_pipeline_max_theads_per_threadgroup(pipeline), &ntg, &seg, &nseg);
    if (atomic && seg > GGML_SPARSE_METAL_IDX_SEG) {
        seg  = GGML_SPARSE_METAL_IDX_SEG;
        nseg = (int) ((n + seg - 1)/seg);
    }
    const ggml_metal_buffer_id stats = zz_stats_slot(lib, op);
    ggml_sparse_metal_kargs_idx args = { (int32_t) n, nt, x->nb[1], thr, seg, nseg, stats.metal != nullptr };
    // (with no counters the kernel never touches its stats binding)
    const ggml_metal_buffer_id stats_arg = stats.metal != nullptr ? stats : zz_buffer_id(op);

    if (atomic) {
        auto clear = zz_pipeline(lib, "kernel_sparse_idx_clear", -1);
        ggml_metal_encoder_set_pipeline(enc, clear);
        ggml_metal_encoder_set_bytes   (enc, &args, sizeof(args), 0);
        ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(op), 1);
        ggml_metal_encoder_dispatch_threadgroups(enc, 1, 1, 1, 32, 1, 1);
        ggml_metal_encoder_memory_barrier(enc);

        ggml_metal_encoder_set_pipeline(enc, pipeline);
        ggml_metal_encoder_set_bytes   (enc, &args, sizeof(args), 0);
        ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(x),  1);
        ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(op), 2);
        ggml_metal_encoder_set_buffer  (enc, stats_arg,        3);
        ggml_metal_encoder_set_threadgroup_memory_size(enc, GGML_PAD(seg*sizeof(int32_t), 16), 0);
        ggml_metal_encoder_dispatch_threadgroups(enc, nseg, 1, 1, ntg, 1, 1);
        return;
    }

    const ggml_metal_buffer_id counts = nseg > 1 ? zz_scratch_id(op, 0) : zz_buffer_id(op);
    if (nseg > 1) {
        auto count = zz_pipeline(lib, "kernel_sparse_idx_count", -1);
        ggml_metal_encoder_set_pipeline(enc, count);
        ggml_metal_encoder_set_bytes   (enc, &args, sizeof(args), 0);
        ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(x), 1);
        ggml_metal_encoder_set_buffer  (enc, counts,          2);
        ggml_metal_encoder_dispatch_threadgroups(enc, nseg, 1, 1, ntg, 1, 1);
        ggml_metal_encoder_memory_barrier(enc);
    }
    ggml_metal_encoder_set_pipeline(enc, pipeline);
    ggml_metal_encoder_set_bytes   (enc, &args, sizeof(args), 0);
    ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(x),  1);
    ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(op), 2);
    ggml_metal_encoder_set_buffer  (enc, counts,           3);
    ggml_metal_encoder_set_buffer  (enc, stats_arg,        4);
    ggml_metal_encoder_dispatch_threadgroups(enc, nseg, 1, 1, ntg, 1, 1);
}

// dst[t, i] (row stride nb1) = sum of n1 partials at part (stride nbp, token stride nbpt), i < m
static void zz_encode_reduce(ggml_metal_library_t lib, ggml_metal_encoder_t enc, ggml_metal_buffer_id part, ggml_metal_buffer_id dst,
                             int64_t m, int64_t nt, int n1, uint64_t nb1, uint64_t nbp, uint64_t nbpt) {
    auto pipeline = zz_pipeline(lib, "kernel_mul_mv_zz_reduce", -1);
    ggml_sparse_metal_kargs_zz_reduce args = { (int32_t) m, (int32_t) nt, n1, 0, nb1, nbp, nbpt };
    ggml_metal_encoder_set_pipeline(enc, pipeline);
    ggml_metal_encoder_set_bytes   (enc, &args, sizeof(args), 0);
    ggml_metal_encoder_set_buffer  (enc, part, 1);
    ggml_metal_encoder_set_buffer  (enc, dst,  2);
    ggml_metal_encoder_dispatch_threadgroups(enc, (int) ((m + 255)/256), (int) nt, 1, 256, 1, 1);
}

static void zz_encode_gemv(ggml_metal_library_t lib, ggml_metal_encoder_t enc, const ggml_tensor * op, const zz_shape & s) {
    const ggml_tensor * w   = op->src[0];
    const ggml_tensor * x   = op->src[1];
    const ggml_tensor * idx = op->src[2];

    char base[64];
    snprintf(base, sizeof(base), "kernel_mul_mv_zz_%s_f32", zz_type_tag(s.type));
    auto pipeline = zz_pipeline(lib, base, (int) s.nt);

    const size_t part_bytes = (size_t) s.nt*s.m*sizeof(float);
    ggml_sparse_metal_kargs_zz args = {
        /*.n       =*/ (int32_t) s.n,
        /*.nr      =*/ (int32_t) s.nr,
        /*.nb01    =*/ w->nb[1],
        /*.nb11    =*/ x->nb[1],
        /*.nb1     =*/ s.n1 > 1 ? (uint64_t) (s.m*sizeof(float)) : op->nb[1],
        /*.nbp     =*/ s.n1 > 1 ? (uint64_t) part_bytes : 0,
        /*.has_idx =*/ idx != nullptr,
        /*.pad     =*/ 0,
    };
    const ggml_metal_buffer_id out = s.n1 > 1 ? zz_scratch_id(op, 0) : zz_buffer_id(op);

    ggml_metal_encoder_set_pipeline(enc, pipeline);
    ggml_metal_encoder_set_bytes   (enc, &args, sizeof(args), 0);
    ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(w), 1);
    ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(x), 2);
    ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(idx ? idx : w), 3);
    ggml_metal_encoder_set_buffer  (enc, out, 4);
    GGML_ASSERT(32*s.nsg <= ggml_metal_pipeline_max_theads_per_threadgroup(pipeline) && "llama-sparse: LLAMA_SPARSE_METAL_NSG too large for this GPU");
    ggml_metal_encoder_set_threadgroup_memory_size(enc, GGML_PAD(s.nsg*s.nt*s.B*sizeof(float), 16), 0);
    ggml_metal_encoder_dispatch_threadgroups(enc, s.n1, (int) s.nr, 1, 32*s.nsg, 1, 1);

    if (s.n1 > 1) {
        ggml_metal_encoder_memory_barrier(enc);
        zz_encode_reduce(lib, enc, out, zz_buffer_id(op), s.m, s.nt, s.n1, op->nb[1], part_bytes, s.m*sizeof(float));
    }
}

// prefill: per tile of block-rows, dequantize to f16 (row-major [rows*B, n]), ggml's kernel_mul_mm_f16_f32 into a
// contiguous [nt, rows*B] buffer, then copy that into dst's rows (mul_mm writes with row stride ne0)
static void zz_encode_prefill(ggml_metal_library_t lib, ggml_metal_encoder_t enc, const ggml_tensor * op, const zz_shape & s) {
    const ggml_tensor * w = op->src[0];
    const ggml_tensor * x = op->src[1];

    char base[64];
    snprintf(base, sizeof(base), "kernel_zz_dequant_%s_f16", zz_type_tag(s.type));
    auto dequant = zz_pipeline(lib, base, -1);
    const int lpc = ggml_sparse_metal_zz_lanes_per_col(s.type);

    const size_t tile_bytes = GGML_PAD((size_t) s.tile_rows*s.B*s.n*sizeof(ggml_fp16_t), 256);
    const ggml_metal_buffer_id tile = zz_scratch_id(op, 0);
    const ggml_metal_buffer_id ytmp = zz_scratch_id(op, tile_bytes);

    for (int64_t r0 = 0; r0 < s.nr; r0 += s.tile_rows) {
        const int64_t rows = s.nr - r0 < s.tile_rows ? s.nr - r0 : s.tile_rows;
        const int64_t mt   = rows*s.B;

        ggml_sparse_metal_kargs_zz_dequant dargs = { (int32_t) s.n, (int32_t) r0, (int32_t) rows, 0, w->nb[1] };
        ggml_metal_encoder_set_pipeline(enc, dequant);
        ggml_metal_encoder_set_bytes   (enc, &dargs, sizeof(dargs), 0);
        ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(w), 1);
        ggml_metal_encoder_set_buffer  (enc, tile, 2);
        ggml_metal_encoder_dispatch_threadgroups(enc, (int) ((s.n*lpc + 255)/256), (int) rows, 1, 256, 1, 1);
        ggml_metal_encoder_memory_barrier(enc);

        // a stand-in MUL_MAT node for ggml's pipeline choice: f16 tile x f32 activations
        ggml_tensor a = {};
        a.type  = GGML_TYPE_F16;
        a.ne[0] = s.n; a.ne[1] = mt; a.ne[2] = 1; a.ne[3] = 1;
        a.nb[0] = sizeof(ggml_fp16_t); a.nb[1] = s.n*sizeof(ggml_fp16_t); a.nb[2] = a.nb[1]*mt; a.nb[3] = a.nb[2];
        ggml_tensor c = {};
        c.type   = GGML_TYPE_F32;
        c.op     = GGML_OP_MUL_MAT;
        c.ne[0]  = mt; c.ne[1] = s.nt; c.ne[2] = 1; c.ne[3] = 1;
        c.nb[0]  = sizeof(float); c.nb[1] = mt*sizeof(float); c.nb[2] = c.nb[1]*s.nt; c.nb[3] = c.nb[2];
        c.src[0] = &a;
        c.src[1] = (ggml_tensor *) x;

        auto mm = ggml_metal_library_get_pipeline_mul_mm(lib, &c);
        ggml_metal_kargs_mul_mm margs = {
            /*.ne00 =*/ (int32_t) s.n,
            /*.ne02 =*/ 1,
            /*.nb01 =*/ a.nb[1],
            /*.nb02 =*/ a.nb[2],
            /*.nb03 =*/ a.nb[3],
            /*.ne12 =*/ 1,
            /*.nb10 =*/ x->nb[0],
            /*.nb11 =*/ x->nb[1],
            /*.nb12 =*/ x->nb[2],
            /*.nb13 =*/ x->nb[3],
            /*.ne0  =*/ (int32_t) mt,
            /*.ne1  =*/ (int32_t) s.nt,
            /*.r2   =*/ 1,
            /*.r3   =*/ 1,
        };
        ggml_metal_encoder_set_pipeline(enc, mm);
        ggml_metal_encoder_set_bytes   (enc, &margs, sizeof(margs), 0);
        ggml_metal_encoder_set_buffer  (enc, tile, 1);
        ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(x), 2);
        ggml_metal_encoder_set_buffer  (enc, ytmp, 3);
        ggml_metal_encoder_set_threadgroup_memory_size(enc, mm.smem, 0);
        ggml_metal_encoder_dispatch_threadgroups(enc, (int) ((s.nt + mm.nr1 - 1)/mm.nr1), (int) ((mt + mm.nr0 - 1)/mm.nr0), 1, 32, mm.nsg, 1);
        ggml_metal_encoder_memory_barrier(enc);

        ggml_metal_buffer_id dst = zz_buffer_id(op);
        dst.offs += r0*s.B*sizeof(float);
        zz_encode_reduce(lib, enc, ytmp, dst, mt, s.nt, 1, op->nb[1], 0, mt*sizeof(float));
        // the next tile reuses tile and ytmp
        ggml_metal_encoder_memory_barrier(enc);
    }
}

static void zz_encode_sparq(ggml_metal_library_t lib, ggml_metal_encoder_t enc, const ggml_tensor * op) {
    const ggml_tensor * q  = op->src[0];
    const ggml_tensor * k  = op->src[1];
    const ggml_tensor * kt = op->src[2];
    const ggml_tensor * v  = op->src[3];
    const ggml_tensor * m  = op->src[4];
    const ggml_tensor * vm = op->src[5];

    const int64_t D = q->ne[0], n_kv = k->ne[1], n_tok = q->ne[1], H = q->ne[2], Hkv = k->ne[2], ns = q->ne[3];
    const int64_t G = H/Hkv;

    float scale;
    memcpy(&scale, &op->op_params[0], sizeof(float));
    const int32_t flags = op->op_params[3];

    char base[64];
    snprintf(base, sizeof(base), "kernel_sparq_attn_%s_%s", ggml_type_name(k->type), ggml_type_name(m->type));
    auto pipeline = zz_pipeline(lib, base, -1);

    ggml_sparse_metal_kargs_sparq args = {
        /*.D        =*/ (int32_t) D,
        /*.Dv       =*/ (int32_t) v->ne[0],
        /*.n_kv     =*/ (int32_t) n_kv,
        /*.n_tok    =*/ (int32_t) n_tok,
        /*.H        =*/ (int32_t) H,
        /*.Hkv      =*/ (int32_t) Hkv,
        /*.G        =*/ (int32_t) G,
        /*.ns       =*/ (int32_t) ns,
        /*.r        =*/ (int32_t) (op->op_params[1] < D ? op->op_params[1] : D),
        /*.k_top    =*/ op->op_params[2],
        /*.mean_v   =*/ (flags & GGML_SPARQ_MEAN_V) != 0,
        /*.mask_ne3 =*/ (int32_t) m->ne[3],
        /*.vm_ne2   =*/ vm ? (int32_t) vm->ne[2] : 1,
        /*.vm_ne3   =*/ vm ? (int32_t) vm->ne[3] : 1,
        /*.scale    =*/ scale,
        /*.kt_q8    =*/ kt->type == GGML_TYPE_Q8_0,
        q->nb[1],  q->nb[2],  q->nb[3],
        k->nb[1],  k->nb[2],  k->nb[3],
        kt->nb[1], kt->nb[2], kt->nb[3],
        v->nb[0],  v->nb[1],  v->nb[2], v->nb[3],
        m->nb[1],  m->nb[3],
        vm ? vm->nb[1] : 0, vm ? vm->nb[2] : 0, vm ? vm->nb[3] : 0,
        /*.scratch_unit =*/ ggml_sparse_metal_sparq_scratch_unit(G, n_kv),
    };

    ggml_metal_encoder_set_pipeline(enc, pipeline);
    ggml_metal_encoder_set_bytes   (enc, &args, sizeof(args), 0);
    ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(q),  1);
    ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(k),  2);
    ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(kt), 3);
    ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(v),  4);
    ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(m),  5);
    ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(vm ? vm : q), 6);
    ggml_metal_encoder_set_buffer  (enc, zz_buffer_id(op), 7);
    ggml_metal_encoder_set_buffer  (enc, zz_scratch_id(op, 0), 8);
    ggml_metal_encoder_set_threadgroup_memory_size(enc, ggml_sparse_metal_sparq_smem(G, D), 0);
    // heavy register use can lower a pipeline's thread limit below 256
    int ntg = ggml_metal_pipeline_max_theads_per_threadgroup(pipeline);
    ntg = ntg < GGML_SPARSE_METAL_SPARQ_NTG ? ntg & ~31 : GGML_SPARSE_METAL_SPARQ_NTG;
    ggml_metal_encoder_dispatch_threadgroups(enc, (int) Hkv, (int) n_tok, (int) ns, ntg, 1, 1);
}

int ggml_metal_sparse_encode(ggml_metal_library * lib, ggml_metal_encoder * enc, ggml_tensor * op) {
    if (op->op == GGML_OP_SPARQ_ATTN) {
        zz_encode_sparq(lib, enc, op);
    } else if (op->op == GGML_OP_SPARSE_IDX) {
        zz_encode_idx(lib, enc, op);
    } else {
        GGML_ASSERT(op->op == GGML_OP_MUL_MAT_ZZ);
        const zz_shape s = zz_shape_of(op);
        if (s.nt <= GGML_SPARSE_MAX_BATCH) {
            zz_encode_gemv(lib, enc, op, s);
        } else {
            GGML_ASSERT(op->src[2] == nullptr && "llama-sparse: the active-column list is for at most 8 tokens");
            zz_encode_prefill(lib, enc, op, s);
        }
    }
    return 1;
}
