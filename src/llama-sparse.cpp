// llama-sparse: zigzag model metadata, per-context sparsity level, graph building and the C API.
#include "llama-sparse-impl.h"

#include "llama-context.h"
#include "llama-graph.h"
#include "llama-impl.h"
#include "llama-model-loader.h"
#include "llama-model.h"

#include "ggml-backend.h"
#include "ggml-sparse-cpu.h"
#include "gguf.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace {

constexpr size_t LLAMA_SPARSE_LEVELS_MAX = 64; // levels a file may hold (calibrate writes a handful)
constexpr float  LLAMA_SPARSE_THRESHOLD_MAX = 1e6f;

struct sparse_level {
    std::string        name;       // as stored, e.g. "0.50" or "greedy-0.50"
    float              target = 0; // average sparsity the level was calibrated for
    std::vector<float> thresholds; // [n_layer][LLAMA_SPARSE_GROUP_COUNT]
};

struct sparse_model_info {
    int32_t                   n_zigzag = 0;
    int32_t                   n_layer  = 0;
    std::vector<sparse_level> levels;
    bool                      layout_done = false;     // weights repacked / offered to their backends (once per model)
    void *                    cpu_arena = nullptr;     // copies of read-only (mapped) weights (repack_cpu_weights)
};

std::mutex                                       g_mutex;
std::map<const llama_model *, sparse_model_info> g_models;
std::map<const llama_context *, llama_sparse_context *> g_contexts;

thread_local std::string g_last_error;

int32_t set_error(const std::string & msg) {
    g_last_error = msg;
    return -1;
}

const sparse_model_info * model_info(const llama_model * model) {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_models.find(model);
    return it == g_models.end() ? nullptr : &it->second;
}

// "blk.12.attn_q.weight" -> layer 12, group qkv; unknown names get group -1 (run dense)
void zigzag_layer_group(const std::string & name, int32_t & layer, int32_t & group) {
    layer = -1;
    group = -1;
    int pos = 0;
    if (sscanf(name.c_str(), "blk.%d.%n", &layer, &pos) != 1 || pos == 0) {
        layer = -1;
        return;
    }
    const std::string rest = name.substr(pos);
    static const std::pair<const char *, int32_t> prefixes[] = {
        { "attn_qkv.",     LLAMA_SPARSE_GROUP_QKV     },
        { "attn_q.",       LLAMA_SPARSE_GROUP_QKV     },
        { "attn_k.",       LLAMA_SPARSE_GROUP_QKV     },
        { "attn_v.",       LLAMA_SPARSE_GROUP_QKV     },
        { "attn_output.",  LLAMA_SPARSE_GROUP_O       },
        { "ffn_gate_up.",  LLAMA_SPARSE_GROUP_GATE_UP },
        { "ffn_gate.",     LLAMA_SPARSE_GROUP_GATE_UP },
        { "ffn_up.",       LLAMA_SPARSE_GROUP_GATE_UP },
        { "ffn_down.",     LLAMA_SPARSE_GROUP_DOWN    },
    };
    for (const auto & p : prefixes) {
        if (rest.rfind(p.first, 0) == 0) {
            group = p.second;
            return;
        }
    }
}

std::vector<std::string> get_str_arr(const gguf_context * meta, const char * key) {
    std::vector<std::string> out;
    const int64_t kid = gguf_find_key(meta, key);
    if (kid < 0) {
        return out;
    }
    if (gguf_get_kv_type(meta, kid) != GGUF_TYPE_ARRAY || gguf_get_arr_type(meta, kid) != GGUF_TYPE_STRING) {
        throw std::runtime_error(format("llama-sparse: metadata key %s must be an array of strings", key));
    }
    const size_t n = gguf_get_arr_n(meta, kid);
    for (size_t i = 0; i < n; ++i) {
        out.emplace_back(gguf_get_arr_str(meta, kid, i));
    }
    return out;
}

template <typename T>
std::vector<T> get_num_arr(const gguf_context * meta, const char * key, gguf_type type) {
    std::vector<T> out;
    const int64_t kid = gguf_find_key(meta, key);
    if (kid < 0) {
        return out;
    }
    if (gguf_get_kv_type(meta, kid) != GGUF_TYPE_ARRAY || gguf_get_arr_type(meta, kid) != type) {
        throw std::runtime_error(format("llama-sparse: metadata key %s must be an array of %s", key, gguf_type_name(type)));
    }
    const size_t n = gguf_get_arr_n(meta, kid);
    const T * data = (const T *) gguf_get_arr_data(meta, kid);
    out.assign(data, data + n);
    return out;
}

// "0.5", "unified-0.50" -> ("", 0.5); "greedy-0.5" -> ("greedy", 0.5); false if not a level spec
bool parse_level(const std::string & s, std::string & mode, float & target) {
    std::string num = s;
    mode.clear();
    const size_t dash = s.find('-');
    if (dash == 0) {
        return false; // "-0.5" is a negative number, not a level with an empty mode
    }
    if (dash != std::string::npos) {
        mode = s.substr(0, dash);
        num  = s.substr(dash + 1);
        if (mode == "unified") {
            mode.clear();
        }
    }
    char * end = nullptr;
    target = strtof(num.c_str(), &end);
    return !num.empty() && end && *end == '\0' && std::isfinite(target) && target > 0.0f && target < 1.0f;
}

// a level name stored in a file: a level spec whose mode (if any) is plain ASCII, so it prints and can be typed
bool level_name_ok(const std::string & s, std::string & mode, float & target) {
    if (!parse_level(s, mode, target)) {
        return false;
    }
    const size_t dash = s.find('-');
    for (size_t i = 0; i < s.size(); ++i) {
        const unsigned char c = (unsigned char) s[i];
        const bool ok = dash != std::string::npos && i < dash ? (c < 0x80 && (isalnum(c) || c == '_')) :
                        i != dash ? (isdigit(c) || c == '.') : true;
        if (!ok) {
            return false;
        }
    }
    return true;
}

// "", "dense", "off", "none", or a number equal to 0 ("0", "0.0")
bool is_dense_spec(const char * level) {
    if (level == nullptr || level[0] == '\0' || strcmp(level, "off") == 0 || strcmp(level, "dense") == 0 ||
            strcmp(level, "none") == 0) {
        return true;
    }
    char * end = nullptr;
    const float v = strtof(level, &end);
    return end != level && *end == '\0' && v == 0.0f;
}

} // namespace

struct llama_sparse_context {
    const llama_model * model = nullptr;
    int32_t   level   = -1; // index into the model's levels, -1 = dense
    bool      emulate = false;
    uint64_t  version = 0;  // bumped on every change, so graphs built for older settings are not reused
    bool      env_level  = false; // the level came from LLAMA_SPARSE (the C tools), not the API
    bool      told_dense = false; // the note that a large batch ran dense was logged
    std::vector<float> thresholds; // copy of the active level's thresholds
    ggml_sparse_stats  stats = {};
};

// per-graph state: index lists shared by weights that read the same input
class llm_graph_input_sparse : public llm_graph_input_i {
public:
    llm_graph_input_sparse(llama_sparse_context * sctx) : sctx(sctx), version(sctx ? sctx->version : 0) {}

    void set_input(const llama_ubatch * ubatch) override {
        // once per context, where a batch really runs (not at the graph reserve): a level from LLAMA_SPARSE and a
        // batch too large for it, e.g. llama-perplexity without LLAMA_SPARSE_EMULATE (API users set levels knowingly)
        if (dense_batch && sctx != nullptr && sctx->env_level && !sctx->told_dense) {
            sctx->told_dense = true;
            LLAMA_LOG_WARN("llama-sparse: sparsity acts on batches of up to %d tokens (decode); this batch of %u "
                           "runs dense, as prompts do (LLAMA_SPARSE_EMULATE=1 applies the thresholds per token)\n",
                           GGML_SPARSE_MAX_BATCH, ubatch->n_tokens);
        }
    }

    bool can_reuse(const llm_graph_params & params) override {
        return params.cparams.sparse == sctx && (sctx == nullptr || sctx->version == version);
    }

    llama_sparse_context * sctx;
    const uint64_t         version;
    bool                   dense_batch = false; // a weight with thresholds ran dense: the batch is too large

    std::map<std::pair<const ggml_tensor *, int32_t>, ggml_tensor *> idx_cache; // (input, mode) -> op
};

//
// model load hooks
//

void llama_sparse_quantize_check(const llama_model_loader & ml) {
    if (gguf_find_key(ml.metadata, "llama_sparse.format_version") >= 0) {
        throw std::runtime_error("llama-sparse: the input is a zigzag GGUF, which cannot be requantized; quantize "
                                 "the original model, or convert it again with `llama-sparse convert --type TYPE`");
    }
}

void llama_sparse_model_init(const llama_model & model, llama_model_loader & ml) {
    const gguf_context * meta = ml.metadata;

    const int64_t kid_ver = gguf_find_key(meta, "llama_sparse.format_version");
    const auto names = get_str_arr(meta, "llama_sparse.zigzag.tensors");
    if (kid_ver < 0) {
        if (!names.empty()) {
            throw std::runtime_error("llama-sparse: the file lists zigzag tensors but has no llama_sparse.format_version");
        }
        return;
    }
    if (gguf_get_kv_type(meta, kid_ver) != GGUF_TYPE_UINT32) {
        throw std::runtime_error("llama-sparse: llama_sparse.format_version must be a uint32");
    }
    const uint32_t version = gguf_get_val_u32(meta, kid_ver);
    if (version != LLAMA_SPARSE_FORMAT_VERSION) {
        throw std::runtime_error(format("llama-sparse: zigzag format version %u is not supported (this build reads version %d)",
                version, LLAMA_SPARSE_FORMAT_VERSION));
    }

    const auto block_sizes = get_num_arr<uint32_t>(meta, "llama_sparse.zigzag.block_sizes", GGUF_TYPE_UINT32);
    if (block_sizes.size() != names.size()) {
        throw std::runtime_error(format("llama-sparse: llama_sparse.zigzag.block_sizes has %zu entries for %zu zigzag tensors",
                block_sizes.size(), names.size()));
    }

    sparse_model_info info;
    info.n_layer = (int32_t) model.hparams.n_layer_all;

    for (size_t i = 0; i < names.size(); ++i) {
        auto it = ml.weights_map.find(names[i]);
        if (it == ml.weights_map.end()) {
            throw std::runtime_error(format("llama-sparse: zigzag tensor '%s' is not in the file", names[i].c_str()));
        }
        ggml_tensor * t = it->second.tensor;
        if (!ggml_sparse_zz_type_ok(t->type)) {
            throw std::runtime_error(format("llama-sparse: zigzag tensor '%s' has type %s, which has no zigzag kernels",
                    t->name, ggml_type_name(t->type)));
        }
        const int64_t B = ggml_blck_size(t->type);
        if ((int64_t) block_sizes[i] != B || t->ne[0] % B != 0 || t->ne[2] != 1 || t->ne[3] != 1) {
            throw std::runtime_error(format("llama-sparse: zigzag tensor '%s' (%s, ne = [%lld, %lld, %lld, %lld]) does not match block size %u",
                    t->name, ggml_type_name(t->type), (long long) t->ne[0], (long long) t->ne[1],
                    (long long) t->ne[2], (long long) t->ne[3], block_sizes[i]));
        }
        int32_t layer, group;
        zigzag_layer_group(names[i], layer, group);
        // only weights read through a matmul may be zigzag: an embedding is read by rows (get_rows)
        if (group < 0 && names[i] != "output.weight") {
            throw std::runtime_error(format("llama-sparse: tensor '%s' is listed as zigzag, but only the projection weights "
                    "blk.N.{attn_q,attn_k,attn_v,attn_qkv,attn_output,ffn_gate,ffn_up,ffn_gate_up,ffn_down}.weight "
                    "can be (docs/format.md)", t->name));
        }
        if (layer >= info.n_layer) {
            throw std::runtime_error(format("llama-sparse: zigzag tensor '%s' names layer %d of %d", t->name, layer, info.n_layer));
        }
        ggml_sparse_set_zigzag(t, layer, group);
        info.n_zigzag++;
    }

    // upstream's tensor parallelism (a meta device) aborts on any op it cannot split, MUL_MAT_ZZ among them
    if (info.n_zigzag > 0 && model.split_mode() == LLAMA_SPLIT_MODE_TENSOR) {
        throw std::runtime_error("llama-sparse: zigzag weights cannot be split by tensor across GPUs (-sm tensor, "
                                 "LLAMA_SPLIT_MODE_TENSOR); use -sm layer (the default) or none");
    }

    // calibrate rewrites every level: an old, broken calibration must not stop it (LLAMA_SPARSE_IGNORE_LEVELS=1)
    const char * env_ignore    = getenv("LLAMA_SPARSE_IGNORE_LEVELS");
    const bool   ignore_levels = env_ignore && atoi(env_ignore) != 0;
    const auto level_names   = ignore_levels ? std::vector<std::string>() : get_str_arr(meta, "llama_sparse.levels");
    const auto level_targets = ignore_levels ? std::vector<float>() :
                               get_num_arr<float>(meta, "llama_sparse.level_targets", GGUF_TYPE_FLOAT32);
    if (level_targets.size() != level_names.size()) {
        throw std::runtime_error(format("llama-sparse: %zu level names but %zu level targets", level_names.size(), level_targets.size()));
    }
    if (level_names.size() > LLAMA_SPARSE_LEVELS_MAX) {
        throw std::runtime_error(format("llama-sparse: llama_sparse.levels lists %zu levels; at most %zu are allowed",
                level_names.size(), LLAMA_SPARSE_LEVELS_MAX));
    }
    for (size_t i = 0; i < level_names.size(); ++i) {
        sparse_level lv;
        lv.name   = level_names[i];
        lv.target = level_targets[i];
        // a name must be what a user can ask for: "<target>" or "<mode>-<target>", one level per (mode, target)
        std::string mode;
        float parsed;
        if (!level_name_ok(lv.name, mode, parsed)) {
            std::string shown; // bytes outside printable ASCII as \xNN
            for (const unsigned char c : lv.name.substr(0, 64)) {
                shown += c >= 0x20 && c < 0x7f ? std::string(1, (char) c) : format("\\x%02x", c);
            }
            throw std::runtime_error(format("llama-sparse: llama_sparse.levels entry %zu, '%s', is not a level name "
                    "(\"<target>\" or \"<mode>-<target>\", target in (0, 1), mode of letters, digits or '_')", i, shown.c_str()));
        }
        for (size_t j = 0; j < i; ++j) {
            std::string mode_j;
            float parsed_j;
            if (parse_level(level_names[j], mode_j, parsed_j) && mode_j == mode && std::fabs(parsed_j - parsed) < 5e-4f) {
                throw std::runtime_error(format("llama-sparse: levels '%s' and '%s' name the same level",
                        level_names[j].c_str(), lv.name.c_str()));
            }
        }
        const std::string key = "llama_sparse.thresholds." + lv.name;
        lv.thresholds = get_num_arr<float>(meta, key.c_str(), GGUF_TYPE_FLOAT32);
        if (lv.thresholds.size() != (size_t) info.n_layer * LLAMA_SPARSE_GROUP_COUNT) {
            throw std::runtime_error(format("llama-sparse: %s has %zu thresholds; %d layers need %d",
                    key.c_str(), lv.thresholds.size(), info.n_layer, info.n_layer * LLAMA_SPARSE_GROUP_COUNT));
        }
        for (float t : lv.thresholds) {
            // calibrated thresholds are quantiles of |x| (well under 1e3 in practice); 1e6 would drop every column
            if (!std::isfinite(t) || t < 0.0f || t > LLAMA_SPARSE_THRESHOLD_MAX) {
                throw std::runtime_error(format("llama-sparse: %s holds a threshold of %g (thresholds lie in [0, %g])",
                        key.c_str(), (double) t, (double) LLAMA_SPARSE_THRESHOLD_MAX));
            }
        }
        if (!(lv.target >= 0.0f && lv.target < 1.0f)) {
            throw std::runtime_error(format("llama-sparse: level %s has target %g outside [0, 1)", lv.name.c_str(), (double) lv.target));
        }
        info.levels.push_back(std::move(lv));
    }

    LLAMA_LOG_INFO("%s: zigzag format v%u: %d zigzag weights, %zu sparsity levels\n",
            __func__, version, info.n_zigzag, info.levels.size());

    std::lock_guard<std::mutex> lock(g_mutex);
    g_models[&model] = std::move(info);
}

void llama_sparse_model_free(const llama_model * model) {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_models.find(model);
    if (it != g_models.end()) {
        free(it->second.cpu_arena);
        g_models.erase(it);
    }
}

//
// CPU runtime layout
//

#if defined(__linux__)
// writable mappings of this process ([start, end) pairs): a weight inside one is repacked in place
static std::vector<std::pair<uintptr_t, uintptr_t>> writable_ranges() {
    std::vector<std::pair<uintptr_t, uintptr_t>> res;
    FILE * f = fopen("/proc/self/maps", "r");
    if (f == nullptr) {
        return res;
    }
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        unsigned long a, b;
        char perms[8] = {};
        if (sscanf(line, "%lx-%lx %7s", &a, &b, perms) == 3 && perms[1] == 'w') {
            res.emplace_back((uintptr_t) a, (uintptr_t) b);
        }
    }
    fclose(f);
    return res;
}
#endif

// memory for the copies of mapped weights, in transparent huge pages where the kernel gives them (Linux, THP
// "madvise" or "always"): the GEMV reads up to 16 column runs at once per thread, scattered over GiBs, and with
// 4 KiB pages most of its L2 prefetches and loads wait on page walks. free() releases it
static void * alloc_huge(size_t size) {
#if defined(__linux__)
    const size_t huge = 2u << 20;
    void * p = nullptr;
    if (posix_memalign(&p, huge, GGML_PAD(size, huge)) != 0) {
        return nullptr;
    }
    const char * env = getenv("LLAMA_SPARSE_CPU_HUGEPAGES"); // "0": no advice (benchmarks)
    if (env == nullptr || strcmp(env, "0") != 0) {
        madvise(p, GGML_PAD(size, huge), MADV_HUGEPAGE); // advice only: 4 KiB pages where it fails
    }
    return p;
#else
    return malloc(size);
#endif
}

// Zigzag weights in device memory get the layout their backend reads fastest: CUDA regroups Q4_0 and Q8_0
// (GGML_SPARSE_ZZ_LAYOUT_G256, cuda/mul-mat-zz.cu).
static void relayout_device_weights(const llama_model & model) {
    int    n_done = 0;
    size_t bytes  = 0;
    for (const auto & nt : model.tensors_by_name) {
        ggml_tensor * t = nt.second;
        if (!ggml_sparse_is_zigzag(t) || t->buffer == nullptr || ggml_backend_buffer_is_host(t->buffer)) {
            continue;
        }
        if (ggml_sparse_zz_relayout(t)) {
            n_done++;
            bytes += ggml_nbytes(t);
        }
    }
    if (n_done > 0) {
        LLAMA_LOG_INFO("%s: %d zigzag weights (%.1f MiB) in a device layout of their backend\n", __func__, n_done,
                bytes/1048576.0);
    }
}

// CPU decode reads zigzag weights column-major (GGML_SPARSE_ZZ_LAYOUT_COLS, ggml-sparse.h: Q4_K, and the 32-blocks
// of Q8_0/Q4_0, whose 34/18-byte blocks in the row layout leave skipped columns in the same cache lines as kept
// ones) where the build has a kernel for it, unless LLAMA_SPARSE_CPU_LAYOUT=rows ("cols", "auto" or unset: column-
// major). Column-major is the faster layout at every sparse level (1.07-1.13x the row layout from 25 % on an AMD
// EPYC, bench/results/cpu_e2e-r7b-2026-11-23-pfhint.md) and dense it was 0.97x the row layout there but 1.37x on an
// Intel Xeon (6.27 against 4.6 t/s, 1.17x stock; bench/results/cpu_e2e-r7b-2026-11-26-intel.md), so it no longer
// depends on the starting level. Done when the first context is created (every weight is loaded by then):
// in place through one tensor-sized temporary where the weight is writable, else (mmap) into one arena for all such
// weights (alloc_huge), giving the mapped pages back. Weights that keep the row layout are copied out of a read-only
// mapping into the arena as they are (LLAMA_SPARSE_CPU_COPY=0: not): reading the file mapping, dense decode ran at
// 0.88-0.90x the speed of the copies (paired rounds; bench/results/cpu_e2e-r7b-2026-11-24-vnni-32l.md).
// LLAMA_SPARSE_CPU_LAYOUT=rows32 keeps only the 32-blocks in the row layout: on SmolLM2 (Intel Xeon, 2 threads, q8_0
// dense) 1.27/1.57/1.56/1.46x stock at batches of 1/2/4/8 against the default's 1.53/1.75/1.85/1.70x
// (bench/results/cpu_q8_colsplit_2026-12-05.md).
static void repack_cpu_weights(const llama_model & model, sparse_model_info & info) {
    // rows32: Q4_K column-major, the 32-blocks (Q8_0/Q4_0) in the row layout
    const char * env     = getenv("LLAMA_SPARSE_CPU_LAYOUT");
    const bool   to_cols = env == nullptr || strcmp(env, "rows") != 0;
    const bool   rows32  = env != nullptr && strcmp(env, "rows32") == 0;
#if defined(__linux__)
    const char * ce        = getenv("LLAMA_SPARSE_CPU_COPY");
    const bool   copy_rows = ce == nullptr || strcmp(ce, "0") != 0;
#else
    const bool   copy_rows = false; // mapped weights are told apart from writable ones through /proc/self/maps only
#endif
    if (!to_cols && !copy_rows) {
        return;
    }
#if defined(__linux__)
    const auto   rw   = writable_ranges();
    const size_t page = (size_t) sysconf(_SC_PAGESIZE);
#endif
    // first pass: the weights to repack, and whether each is writable (repacked in place) or mapped from the
    // file (copied out into one arena)
    struct todo_t {
        ggml_tensor * t;
        size_t        size;
        bool          writable;
        bool          cols;     // repacked column-major, else copied as it is
    };
    std::vector<todo_t> todo;
    size_t arena_size = 0;
    for (const auto & nt : model.tensors_by_name) {
        ggml_tensor * t = nt.second;
        if (!ggml_sparse_is_zigzag(t) || ggml_sparse_zz_layout(t) != GGML_SPARSE_ZZ_LAYOUT_ROWS ||
            !ggml_sparse_zz_cpu_colmajor_fast(t->type) || t->buffer == nullptr ||
            !ggml_backend_buffer_is_host(t->buffer) || !ggml_is_contiguous(t) || t->ne[2] != 1 || t->ne[3] != 1) {
            continue;
        }
        const size_t size = ggml_nbytes(t);
        bool writable = false;
#if defined(__linux__)
        const uintptr_t a = (uintptr_t) t->data;
        for (const auto & r : rw) {
            writable = writable || (a >= r.first && a + size <= r.second);
        }
#endif
        const bool cols = to_cols && !(rows32 && (t->type == GGML_TYPE_Q8_0 || t->type == GGML_TYPE_Q4_0));
        if (!cols && (writable || !copy_rows)) {
            continue; // already in memory (or to be read from the mapping), and stays as it is
        }
        todo.push_back({ t, size, writable, cols });
        arena_size += writable ? 0 : GGML_PAD(size, 64);
    }
    char * arena = nullptr;
    if (arena_size > 0) {
        arena = (char *) alloc_huge(arena_size);
        if (arena == nullptr) {
            LLAMA_LOG_WARN("%s: out of memory (%.1f MiB) for the copies of mapped weights, keeping them %s\n",
                    __func__, arena_size/1048576.0, to_cols ? "in the row layout or mapped" : "mapped");
        } else {
            info.cpu_arena = arena;
        }
    }

    int    n_done[2] = { 0, 0 }; // [cols]
    size_t bytes[2]  = { 0, 0 };
    size_t n_copied  = 0;       // of the column-major ones
    size_t arena_off = 0;
    for (const auto & td : todo) {
        ggml_tensor * t = td.t;
        if (td.writable) {
            void * tmp = malloc(td.size);
            if (tmp == nullptr) {
                LLAMA_LOG_WARN("%s: out of memory repacking %s, keeping the row layout\n", __func__, t->name);
                continue;
            }
            ggml_sparse_zz_to_colmajor(t->type, ggml_sparse_zz_n(t), t->ne[1], t->data, tmp);
            memcpy(t->data, tmp, td.size);
            free(tmp);
        } else {
            if (arena == nullptr) {
                continue;
            }
            void * packed = arena + arena_off;
            arena_off += GGML_PAD(td.size, 64);
            if (td.cols) {
                ggml_sparse_zz_to_colmajor(t->type, ggml_sparse_zz_n(t), t->ne[1], t->data, packed);
            } else {
                memcpy(packed, t->data, td.size);
            }
#if defined(__linux__)
            // the file pages of the old layout are not read again: drop them from this process
            const uintptr_t a  = (uintptr_t) t->data;
            const uintptr_t p0 = (a + page - 1) & ~(uintptr_t) (page - 1);
            const uintptr_t p1 = (a + td.size) & ~(uintptr_t) (page - 1);
            if (p1 > p0) {
                madvise((void *) p0, p1 - p0, MADV_DONTNEED);
            }
#endif
            t->data = packed;
            n_copied += td.cols;
        }
        if (td.cols) {
            ggml_sparse_zz_set_layout(t, GGML_SPARSE_ZZ_LAYOUT_COLS);
        }
        n_done[td.cols]++;
        bytes[td.cols] += td.size;
    }
    if (n_done[1] > 0) {
        LLAMA_LOG_INFO("%s: %d zigzag weights (%.1f MiB) in the column-major CPU layout (%zu copied out of read-only mappings)\n",
                __func__, n_done[1], bytes[1]/1048576.0, n_copied);
    }
    if (n_done[0] > 0) {
        LLAMA_LOG_INFO("%s: %d zigzag weights (%.1f MiB) copied out of read-only mappings into memory (row layout)\n",
                __func__, n_done[0], bytes[0]/1048576.0);
    }
}

bool llama_sparse_check_dims(const ggml_tensor * cur, const std::vector<int64_t> & ne) {
    if (!ggml_sparse_is_zigzag(cur)) {
        return false;
    }
    const int64_t n = ggml_sparse_zz_n(cur);
    const int64_t m = ggml_sparse_zz_m(cur);
    bool ok = ne.size() >= 2 && ne[0] == n && ne[1] == m;
    for (size_t i = 2; i < ne.size(); ++i) {
        ok = ok && ne[i] == 1;
    }
    if (!ok) {
        std::string exp;
        for (size_t i = 0; i < ne.size(); ++i) {
            exp += (i ? ", " : "") + std::to_string(ne[i]);
        }
        throw std::runtime_error(format("llama-sparse: zigzag tensor '%s' holds a %lld x %lld weight (n x m); the model expects [%s]",
                cur->name, (long long) n, (long long) m, exp.c_str()));
    }
    return true;
}

ggml_tensor * llama_sparse_weight_test_op(ggml_context * ctx, ggml_tensor * w) {
    if (!ggml_sparse_is_zigzag(w)) {
        return nullptr;
    }
    // the sparse decode form: a backend that takes the weight must run both ops
    ggml_tensor * x   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ggml_sparse_zz_n(w), 1);
    ggml_tensor * idx = ggml_sparse_idx(ctx, x, 1.0f, GGML_SPARSE_IDX_LIST);
    return ggml_mul_mat_zz(ctx, w, x, idx);
}

void llama_sparse_copy_tag(ggml_tensor * dst, const ggml_tensor * src) {
    if (ggml_sparse_is_zigzag(src)) {
        ggml_sparse_set_zigzag(dst, ggml_sparse_zigzag_layer(src), ggml_sparse_zigzag_group(src));
    }
}

//
// context
//

static int32_t find_level(const sparse_model_info & info, const char * spec) {
    std::string mode;
    float target;
    // a plain number first, as Python's level_name reads it ("5e-1" is 0.5, not mode "5e" at 1)
    char * end = nullptr;
    const float v = strtof(spec, &end);
    if (end != spec && *end == '\0' && std::isfinite(v) && v > 0.0f && v < 1.0f) {
        target = v;
    } else if (!parse_level(spec, mode, target)) {
        return -1;
    }
    for (size_t i = 0; i < info.levels.size(); ++i) {
        std::string lmode;
        float ltarget;
        if (info.levels[i].name == spec ||
            (parse_level(info.levels[i].name, lmode, ltarget) && lmode == mode && std::fabs(ltarget - target) < 5e-4f)) {
            return (int32_t) i;
        }
    }
    return -1;
}

static std::string level_list(const sparse_model_info & info) {
    std::string s;
    for (const auto & lv : info.levels) {
        s += (s.empty() ? "" : ", ") + lv.name;
    }
    return s.empty() ? "none (calibrate the model with `llama-sparse calibrate`)" : s;
}

static int32_t set_level(llama_sparse_context * sctx, const char * spec) {
    const sparse_model_info * info = model_info(sctx->model);
    if (is_dense_spec(spec)) {
        sctx->level = -1;
        sctx->thresholds.clear();
        sctx->version++;
        return 0;
    }
    if (info == nullptr || info->n_zigzag == 0) {
        return set_error(format("sparsity level '%s' asked for, but the model is not a zigzag GGUF (convert it with `llama-sparse convert`)", spec));
    }
    if (info->levels.empty()) {
        return set_error(format("sparsity level '%s' asked for, but the model has no calibrated thresholds "
                                "(run `llama-sparse calibrate` on it, or decode dense)", spec));
    }
    const int32_t i = find_level(*info, spec);
    if (i < 0) {
        return set_error(format("sparsity level '%s' is not in the model; it has: %s (or dense)", spec,
                                level_list(*info).c_str()));
    }
    sctx->level      = i;
    sctx->thresholds = info->levels[i].thresholds;
    sctx->version++;
    return 0;
}

// a bad environment variable stops context creation; also on stderr: tools such as llama-bench mute the log, and
// would only say the context failed
[[noreturn]] static void env_error(const std::string & msg) {
    fprintf(stderr, "llama-sparse: %s\n", msg.c_str());
    throw std::runtime_error(msg);
}

llama_sparse_context * llama_sparse_context_attach(llama_context * lctx, const llama_model & model) {
    auto * sctx = new llama_sparse_context();
    sctx->model = &model;

    const char * env_emulate = getenv("LLAMA_SPARSE_EMULATE");
    if (env_emulate != nullptr) {
        std::string v = env_emulate;
        std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return (char) std::tolower(c); });
        const bool on  = v == "1" || v == "true" || v == "on" || v == "yes";
        const bool off = v.empty() || v == "0" || v == "false" || v == "off" || v == "no";
        if (!on && !off) {
            delete sctx;
            env_error(std::string("LLAMA_SPARSE_EMULATE='") + env_emulate + "': use 1 (on) or 0 (off)");
        }
        sctx->emulate = on;
    }

    const char * env_level = getenv("LLAMA_SPARSE");
    sctx->env_level = env_level != nullptr;
    if (env_level && set_level(sctx, env_level) != 0) {
        delete sctx;
        env_error("LLAMA_SPARSE: " + g_last_error);
    }
    {
        // the weights' layouts (CPU, then device), once per model, when its first context is made (not for the
        // tools' memory-fit pass: weights without data, in a dummy buffer)
        std::lock_guard<std::mutex> lock(g_mutex);
        auto it = g_models.find(&model);
        if (it != g_models.end() && !it->second.layout_done && !model.hparams.no_alloc) {
            it->second.layout_done = true;
            repack_cpu_weights(model, it->second);
            relayout_device_weights(model);
        }
    }
    if (env_level && sctx->level >= 0) {
        LLAMA_LOG_INFO("%s: sparsity level %s (from LLAMA_SPARSE)%s\n", __func__,
                model_info(&model)->levels[sctx->level].name.c_str(), sctx->emulate ? ", emulated in large batches" : "");
    }

    std::lock_guard<std::mutex> lock(g_mutex);
    g_contexts[lctx] = sctx;
    return sctx;
}

void llama_sparse_context_detach(llama_context * lctx) {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_contexts.find(lctx);
    if (it != g_contexts.end()) {
        ggml_sparse_stats_release(&it->second->stats); // device counters (CUDA) stop pointing at it
        delete it->second;
        g_contexts.erase(it);
    }
}

static llama_sparse_context * context_state(const llama_context * lctx) {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_contexts.find(lctx);
    return it == g_contexts.end() ? nullptr : it->second;
}

//
// graph
//

ggml_tensor * llama_sparse_build_mm(const llm_graph_context & g, ggml_tensor * w, ggml_tensor * cur) {
    ggml_context * ctx0 = g.ctx0;
    llama_sparse_context * sctx = g.cparams.sparse;

    if (g.inp_sparse == nullptr) {
        auto inp = std::make_unique<llm_graph_input_sparse>(sctx);
        g.inp_sparse = inp.get();
        g.res->add_input(std::move(inp));
    }

    const int64_t n = ggml_sparse_zz_n(w);
    const int64_t m = ggml_sparse_zz_m(w);
    GGML_ASSERT(cur->ne[0] == n);

    const int64_t n_rows = ggml_nrows(cur);

    ggml_tensor * x = cur;
    if (x->type != GGML_TYPE_F32) {
        x = ggml_cast(ctx0, x, GGML_TYPE_F32);
    }
    if (!ggml_is_contiguous(x)) {
        x = ggml_cont(ctx0, x);
    }
    if (x->ne[2] != 1 || x->ne[3] != 1) {
        x = ggml_reshape_2d(ctx0, x, n, n_rows);
    }

    float threshold = 0.0f;
    const int32_t layer = ggml_sparse_zigzag_layer(w);
    const int32_t group = ggml_sparse_zigzag_group(w);
    if (sctx && !sctx->thresholds.empty() && layer >= 0 && group >= 0) {
        threshold = sctx->thresholds[(size_t) layer*LLAMA_SPARSE_GROUP_COUNT + group];
    }

    ggml_tensor * idx = nullptr;
    if (threshold > 0.0f) {
        // by the batch, not the rows: the last layer of a prefill sees only its outputs' rows, and the graph's
        // shape must not depend on how many outputs a batch asks for (ggml-alloc reuses plans by node count)
        const bool decode = g.n_tokens <= GGML_SPARSE_MAX_BATCH && n_rows <= GGML_SPARSE_MAX_BATCH;
        g.inp_sparse->dense_batch = !decode && !sctx->emulate;
        if (decode || sctx->emulate) {
            const auto mode = decode ? GGML_SPARSE_IDX_LIST : GGML_SPARSE_IDX_MASK;
            auto & cache = g.inp_sparse->idx_cache;
            const auto key = std::make_pair((const ggml_tensor *) cur, (int32_t) mode);
            auto it = cache.find(key);
            ggml_tensor * op = it != cache.end() ? it->second : nullptr;
            if (op == nullptr) {
                op = ggml_sparse_idx(ctx0, x, threshold, mode);
                if (mode == GGML_SPARSE_IDX_LIST) {
                    ggml_sparse_idx_set_stats(op, &sctx->stats);
                    // weights in device memory: the GPU matmuls may find the columns themselves
                    if (w->buffer != nullptr && !ggml_backend_buffer_is_host(w->buffer)) {
                        op->op_params[GGML_SPARSE_IDX_PARAM_LAZY] = 1;
                    }
                }
                ggml_format_name(op, "sparse_%s-%d-%d", decode ? "idx" : "mask", layer, group);
                cache[key] = op;
            }
            if (decode) {
                idx = op;
            } else {
                x = op;
            }
        }
    }

    ggml_tensor * y = ggml_mul_mat_zz(ctx0, w, x, idx);
    // the matmul joins the graph now, so matmuls that share an input (q/k/v, gate/up) are adjacent nodes
    // with live outputs side by side, which a backend may run as one launch (CUDA sibling groups); left to
    // the final expand, q's output buffer is reused for k after q's rope, and k cannot join q's group.
    // Every batch size, not only decode: ggml-alloc keeps a graph's buffer plan for the next graph of equal
    // node count, so a decode graph after a prefill graph must list its nodes in the same order.
    if (g.gf != nullptr) {
        ggml_build_forward_expand(g.gf, y);
    }
    if (cur->ne[2] != 1 || cur->ne[3] != 1) {
        y = ggml_reshape_4d(ctx0, y, m, cur->ne[1], cur->ne[2], cur->ne[3]);
    }
    return y;
}

//
// C API
//

int32_t llama_sparse_model_n_zigzag(const llama_model * model) {
    const sparse_model_info * info = model_info(model);
    return info ? info->n_zigzag : 0;
}

int32_t llama_sparse_model_n_levels(const llama_model * model) {
    const sparse_model_info * info = model_info(model);
    return info ? (int32_t) info->levels.size() : 0;
}

const char * llama_sparse_model_level_name(const llama_model * model, int32_t i) {
    const sparse_model_info * info = model_info(model);
    if (!info || i < 0 || i >= (int32_t) info->levels.size()) {
        return nullptr;
    }
    return info->levels[i].name.c_str();
}

float llama_sparse_model_level_target(const llama_model * model, int32_t i) {
    const sparse_model_info * info = model_info(model);
    if (!info || i < 0 || i >= (int32_t) info->levels.size()) {
        return NAN;
    }
    return info->levels[i].target;
}

float llama_sparse_model_threshold(const llama_model * model, int32_t i, int32_t il, enum llama_sparse_group group) {
    const sparse_model_info * info = model_info(model);
    if (!info || i < 0 || i >= (int32_t) info->levels.size() || il < 0 || il >= info->n_layer ||
        group < 0 || group >= LLAMA_SPARSE_GROUP_COUNT) {
        return NAN;
    }
    return info->levels[i].thresholds[(size_t) il*LLAMA_SPARSE_GROUP_COUNT + group];
}

int32_t llama_sparse_set_level(llama_context * ctx, const char * level) {
    llama_sparse_context * sctx = context_state(ctx);
    if (sctx == nullptr) {
        return set_error("llama_sparse_set_level: unknown context");
    }
    const int32_t rc = set_level(sctx, level);
    if (rc == 0) {
        sctx->env_level = false;
    }
    return rc;
}

const char * llama_sparse_get_level(const llama_context * ctx) {
    llama_sparse_context * sctx = context_state(ctx);
    if (sctx == nullptr || sctx->level < 0) {
        return "dense";
    }
    return model_info(sctx->model)->levels[sctx->level].name.c_str();
}

void llama_sparse_set_emulate(llama_context * ctx, bool emulate) {
    llama_sparse_context * sctx = context_state(ctx);
    if (sctx && sctx->emulate != emulate) {
        sctx->emulate = emulate;
        sctx->version++;
    }
}

llama_sparse_stats llama_sparse_get_stats(const llama_context * ctx) {
    llama_sparse_stats out = {};
    llama_sparse_context * sctx = context_state(ctx);
    if (sctx) {
        // the context's queued work first: Metal's counters are host memory the GPU writes as it runs
        llama_synchronize(const_cast<llama_context *>(ctx));
        ggml_sparse_stats_collect(&sctx->stats); // what GPU kernels counted since the last call
        out.n_lists  = __atomic_load_n(&sctx->stats.n_lists,  __ATOMIC_RELAXED);
        out.n_cols   = __atomic_load_n(&sctx->stats.n_cols,   __ATOMIC_RELAXED);
        out.n_active = __atomic_load_n(&sctx->stats.n_active, __ATOMIC_RELAXED);
    }
    return out;
}

void llama_sparse_reset_stats(llama_context * ctx) {
    llama_sparse_context * sctx = context_state(ctx);
    if (sctx) {
        llama_synchronize(ctx);
        ggml_sparse_stats_collect(&sctx->stats); // (drops what GPU kernels counted so far)
        __atomic_store_n(&sctx->stats.n_lists,  0, __ATOMIC_RELAXED);
        __atomic_store_n(&sctx->stats.n_cols,   0, __ATOMIC_RELAXED);
        __atomic_store_n(&sctx->stats.n_active, 0, __ATOMIC_RELAXED);
    }
}

const char * llama_sparse_last_error(void) {
    return g_last_error.c_str();
}

int32_t llama_sparse_tokenize(const llama_vocab * vocab, const char * text, int32_t text_len, llama_token * tokens,
                              int32_t n_tokens_max, bool add_special, bool parse_special) {
    if (vocab == nullptr || (text == nullptr && text_len != 0) || text_len < 0 || n_tokens_max < 0 ||
            (tokens == nullptr && n_tokens_max > 0)) {
        set_error(format("llama_sparse_tokenize: bad arguments (vocab %s, text %s, text_len %d, n_tokens_max %d)",
                         vocab ? "set" : "NULL", text ? "set" : "NULL", text_len, n_tokens_max));
        return INT32_MIN;
    }
    try {
        const int32_t n = llama_tokenize(vocab, text, text_len, tokens, n_tokens_max, add_special, parse_special);
        if (n == INT32_MIN) {
            set_error("the tokenization result exceeds INT32_MAX tokens");
        }
        return n;
    } catch (const std::exception & e) {
        set_error(format("the vocabulary cannot tokenize the text (llama.cpp threw: %s)", e.what()));
    } catch (...) {
        set_error("the vocabulary cannot tokenize the text (llama.cpp threw an unknown exception)");
    }
    return INT32_MIN;
}
