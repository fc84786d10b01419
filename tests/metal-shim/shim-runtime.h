// tests/metal-shim/shim-runtime.h: runs a Metal compute kernel (translated to C++ by msl2cpp.py) on the CPU.
//
// A dispatch runs its threadgroups one after another (in a random order in race mode). The threads of a
// threadgroup are fibers ("lanes") on one OS thread; a lane runs until it blocks in threadgroup_barrier or a
// simd_* function, or, in race mode, until an atomic hands it back at random. When every lane is blocked,
// a simdgroup whose live lanes all wait at the same simd_* call exchanges values; when every live lane waits
// at threadgroup_barrier, all go on. Anything else (a barrier some lanes never reach, lanes of one simdgroup
// at different calls) is reported as an error: Metal leaves it undefined. Threadgroup memory is poisoned at
// the start of every threadgroup.
#pragma once

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace shim {

enum simd_op_kind {
    SIMD_BARRIER, SIMD_SUM, SIMD_MAX, SIMD_MIN, SIMD_PREFIX_EXCL, SIMD_PREFIX_INCL, SIMD_OR, SIMD_AND,
    SIMD_SHUFFLE, SIMD_SHUFFLE_DOWN, SIMD_SHUFFLE_UP, SIMD_SHUFFLE_XOR, SIMD_FIRST,
};

enum builtin_kind {
    B_TGPIG, B_NTGPG, B_TPITG, B_NTG, B_TIITG, B_TIISG, B_SGITG, B_NSG, B_TPIG, B_TPSG, B_NGRID,
};

enum lane_state { RUNNABLE, DELAYED, AT_BARRIER, AT_SIMD, DONE };

constexpr int SIMD_WIDTH  = 32;
constexpr int MAX_LANES   = 1024;
constexpr int MAX_BUFFERS = 32;
constexpr int MAX_TGMEM   = 8;
constexpr size_t STACK_SIZE = 128*1024;

struct lane {
    ucontext_t ctx;              // first entry only
    jmp_buf    jb;               // later switches: _setjmp/_longjmp, no signal-mask system calls
    bool       started = false;
    char *     stack = nullptr;
    lane_state st    = DONE;
    int        op    = 0;
    int        line  = 0;
    uint32_t   gen   = 0;
    uint32_t   tid   = 0;
};

struct simdgroup_state {
    alignas(16) unsigned char val[2][SIMD_WIDTH][32];
    uint32_t active[2];
};

struct kernel_entry { std::string name; void (*fn)(); };
struct fc_entry     { int index; void * ptr; size_t size; };

struct state {
    // dispatch
    void *   buffers[MAX_BUFFERS] = {};
    size_t   tgmem_size[MAX_TGMEM] = {};
    std::vector<unsigned char> tgmem[MAX_TGMEM];
    uint32_t grid[3] = {1, 1, 1};   // threadgroups per grid
    uint32_t ntg[3]  = {1, 1, 1};   // threads per threadgroup
    uint32_t tg[3]   = {0, 0, 0};   // current threadgroup
    uint32_t nthreads = 1;
    uint64_t epoch    = 0;          // threadgroup counter, for poisoning threadgroup variables
    // lanes
    lane            lanes[MAX_LANES];
    simdgroup_state sg[MAX_LANES/SIMD_WIDTH];
    lane *          cur = nullptr;
    ucontext_t      sched;
    jmp_buf         sched_jb;
    void (*entry)() = nullptr;
    // race mode
    bool            random = false;
    std::mt19937_64 rng{1};
    // registry
    std::vector<kernel_entry> kernels;
    std::vector<fc_entry>     fcs;
};

inline state & S() { static state s; return s; }

[[noreturn]] inline void fail(const char * what) {
    std::fprintf(stderr, "metal-shim: %s (threadgroup %u,%u,%u)\n", what, S().tg[0], S().tg[1], S().tg[2]);
    std::abort();
}

inline void to_scheduler() {
    lane * l = S().cur;
    if (!_setjmp(l->jb)) {
        _longjmp(S().sched_jb, 1);
    }
}

inline void resume(lane & l) {
    state & s = S();
    s.cur = &l;
    if (!_setjmp(s.sched_jb)) {
        if (l.started) {
            _longjmp(l.jb, 1);
        }
        l.started = true;
        swapcontext(&s.sched, &l.ctx);
    }
}

inline void maybe_yield() {
    state & s = S();
    if (s.random && s.cur != nullptr && (s.rng() & 1)) {
        s.cur->st = RUNNABLE;
        to_scheduler();
    }
}

inline void tg_barrier() {
    S().cur->st = AT_BARRIER;
    to_scheduler();
}

// deposit v, wait for the simdgroup, return the slot set and the live-lane mask
template <class T> inline std::pair<unsigned char (*)[32], uint32_t> simd_wait(T v, int op, int line) {
    static_assert(sizeof(T) <= 32, "simd value too large");
    state & s = S();
    lane & l = *s.cur;
    simdgroup_state & g = s.sg[l.tid/SIMD_WIDTH];
    const int p = l.gen & 1;
    std::memcpy(g.val[p][l.tid % SIMD_WIDTH], &v, sizeof(T));
    l.op   = op;
    l.line = line;
    l.st   = AT_SIMD;
    to_scheduler();
    l.gen++;
    return { g.val[p], g.active[p] };
}

template <class T> inline T simd_exchange(T v, int op, int line) {
    simd_wait(v, op, line);
    return v;
}

template <class T> inline T simd_reduce(T v, int op, int line) {
    auto [val, act] = simd_wait(v, op, line);
    const int me = S().cur->tid % SIMD_WIDTH;
    T acc = T(0);
    bool first = true;
    for (int i = 0; i < SIMD_WIDTH; ++i) {
        if (!(act >> i & 1)) continue;
        if (op == SIMD_PREFIX_EXCL && i >= me) break;
        if (op == SIMD_PREFIX_INCL && i >  me) break;
        T x; std::memcpy(&x, val[i], sizeof(T));
        if constexpr (std::is_arithmetic_v<T>) {
            if (op == SIMD_MAX) { acc = first ? x : (x > acc ? x : acc); first = false; continue; }
            if (op == SIMD_MIN) { acc = first ? x : (x < acc ? x : acc); first = false; continue; }
            if constexpr (std::is_integral_v<T>) {
                if (op == SIMD_OR)  { acc = acc | x; continue; }
                if (op == SIMD_AND) { acc = first ? x : (acc & x); first = false; continue; }
            }
        }
        acc = acc + x;
    }
    return acc;
}

template <class T> inline T simd_move(T v, int op, int arg, int line) {
    auto [val, act] = simd_wait(v, op, line);
    const int me = S().cur->tid % SIMD_WIDTH;
    int src = me;
    switch (op) {
        case SIMD_SHUFFLE:      src = arg; break;
        case SIMD_SHUFFLE_DOWN: src = me + arg < SIMD_WIDTH ? me + arg : me; break;
        case SIMD_SHUFFLE_UP:   src = me - arg >= 0 ? me - arg : me; break;
        case SIMD_SHUFFLE_XOR:  src = me ^ arg; break;
        case SIMD_FIRST:        src = act ? __builtin_ctz(act) : 0; break;
    }
    T r;
    if (src < 0 || src >= SIMD_WIDTH || !(act >> src & 1)) {
        std::memset(&r, 0xA5, sizeof(r)); // reading an inactive lane: garbage, as on the GPU
    } else {
        std::memcpy(&r, val[src], sizeof(T));
    }
    return r;
}

// kernel arguments

template <class T> inline T buf_arg(int i) {
    void * p = S().buffers[i];
    if (p == nullptr) fail("kernel reads a buffer index that the dispatch did not set");
    if constexpr (std::is_pointer_v<T>) {
        return (T) p;
    } else {
        return *(std::remove_reference_t<T> *) p;
    }
}

template <class T> inline T tg_arg(int i) {
    state & s = S();
    if (s.tgmem_size[i] == 0) fail("kernel uses threadgroup memory that the dispatch did not size");
    return (T) s.tgmem[i].data();
}

inline void builtin_values(int which, uint32_t v[3]) {
    state & s = S();
    const uint32_t tid = s.cur->tid;
    const uint32_t tp[3] = { tid % s.ntg[0], tid/s.ntg[0] % s.ntg[1], tid/(s.ntg[0]*s.ntg[1]) };
    v[0] = v[1] = v[2] = 0;
    switch (which) {
        case B_TGPIG: for (int i = 0; i < 3; ++i) v[i] = s.tg[i]; break;
        case B_NTGPG: for (int i = 0; i < 3; ++i) v[i] = s.grid[i]; break;
        case B_TPITG: for (int i = 0; i < 3; ++i) v[i] = tp[i]; break;
        case B_NTG:   for (int i = 0; i < 3; ++i) v[i] = s.ntg[i]; break;
        case B_TPIG:  for (int i = 0; i < 3; ++i) v[i] = s.tg[i]*s.ntg[i] + tp[i]; break;
        case B_NGRID: for (int i = 0; i < 3; ++i) v[i] = s.grid[i]*s.ntg[i]; break;
        case B_TIITG: v[0] = tid; break;
        case B_TIISG: v[0] = tid % SIMD_WIDTH; break;
        case B_SGITG: v[0] = tid / SIMD_WIDTH; break;
        case B_NSG:   v[0] = (s.nthreads + SIMD_WIDTH - 1)/SIMD_WIDTH; break;
        case B_TPSG:  v[0] = SIMD_WIDTH; break;
    }
}

template <class T> inline T builtin(int which) {
    uint32_t v[3];
    builtin_values(which, v);
    if constexpr (std::is_arithmetic_v<T>) {
        return (T) v[0];
    } else {
        using E = std::remove_reference_t<decltype(std::declval<T &>()[0])>;
        T r = T(0);
        const int n = sizeof(T)/sizeof(E) == 2 ? 2 : 3;
        for (int i = 0; i < n; ++i) r[i] = (E) v[i];
        return r;
    }
}

// threadgroup variables declared in a kernel body: one copy (a function-local static), poisoned once per threadgroup
inline void tg_decl(void * p, size_t n, uint64_t * epoch) {
    if (*epoch != S().epoch) {
        std::memset(p, 0xFF, n);
        *epoch = S().epoch;
    }
}

// registry (filled by the generated code's static initializers)

struct reg_kernel { reg_kernel(const char * name, void (*fn)()) { S().kernels.push_back({name, fn}); } };
struct reg_fc     { reg_fc(int index, void * ptr, size_t size) { S().fcs.push_back({index, ptr, size}); } };

template <class T> inline void set_fc(int index, T value) {
    for (auto & f : S().fcs) {
        if (f.index == index) {
            if (f.size != sizeof(T)) fail("function constant set with the wrong type size");
            std::memcpy(f.ptr, &value, sizeof(T));
        }
    }
}

inline void lane_main() {
    S().entry();
    S().cur->st = DONE;
    _longjmp(S().sched_jb, 1);
}

// race mode: each simdgroup of a released set may start late (DELAYED), as simdgroups do on the GPU
inline void release_all(int n) {
    state & s = S();
    for (int g = 0; g*SIMD_WIDTH < n; ++g) {
        const bool late = s.random && (s.rng() & 1);
        for (int i = g*SIMD_WIDTH; i < std::min(n, (g + 1)*SIMD_WIDTH); ++i) {
            s.lanes[i].st = late ? DELAYED : RUNNABLE;
        }
    }
}

inline void run_threadgroup() {
    state & s = S();
    const int n = (int) s.nthreads;
    s.epoch++;
    for (int i = 0; i < MAX_TGMEM; ++i) {
        if (s.tgmem_size[i]) std::memset(s.tgmem[i].data(), 0xFF, s.tgmem_size[i]);
    }
    static ucontext_t proto;
    static bool have_proto = false;
    if (!have_proto) { getcontext(&proto); have_proto = true; }
    for (int i = 0; i < n; ++i) {
        lane & l = s.lanes[i];
        if (l.stack == nullptr) l.stack = (char *) std::malloc(STACK_SIZE);
        l.ctx = proto;
        l.ctx.uc_stack.ss_sp   = l.stack;
        l.ctx.uc_stack.ss_size = STACK_SIZE;
        l.ctx.uc_link          = nullptr;
        makecontext(&l.ctx, (void (*)()) lane_main, 0);
        l.st = RUNNABLE; l.gen = 0; l.tid = i; l.started = false;
    }
    for (int g = 0; g < (n + SIMD_WIDTH - 1)/SIMD_WIDTH; ++g) s.sg[g].active[0] = s.sg[g].active[1] = 0;
    release_all(n);

    std::vector<int> order(n);
    for (;;) {
        // run every runnable lane until it blocks
        for (;;) {
            order.clear();
            for (int i = 0; i < n; ++i) if (s.lanes[i].st == RUNNABLE) order.push_back(i);
            if (order.empty()) break;
            if (s.random) std::shuffle(order.begin(), order.end(), s.rng);
            for (int i : order) {
                resume(s.lanes[i]);
            }
            s.cur = nullptr;
        }
        int n_done = 0, n_barrier = 0;
        for (int i = 0; i < n; ++i) {
            n_done    += s.lanes[i].st == DONE;
            n_barrier += s.lanes[i].st == AT_BARRIER;
        }
        if (n_done == n) break;
        // simdgroups whose live lanes all wait at one simd call; in race mode a random part of them only, so
        // that simdgroups drift apart between barriers as they do on the GPU
        bool released = false;
        int n_delayed = 0;
        for (int i = 0; i < n; ++i) {
            if (s.lanes[i].st == DELAYED) {
                n_delayed++;
                if (s.rng() & 1) { s.lanes[i].st = RUNNABLE; released = true; }
            }
        }
        std::vector<int> groups;
        for (int g = 0; g*SIMD_WIDTH < n; ++g) groups.push_back(g);
        if (s.random) std::shuffle(groups.begin(), groups.end(), s.rng);
        for (int g : groups) {
            if (released && s.random && (s.rng() & 1)) continue;
            const int i0 = g*SIMD_WIDTH, i1 = std::min(n, i0 + SIMD_WIDTH);
            int live = 0, at = 0, op = -1, line = -1; uint32_t gen = 0; uint32_t mask = 0;
            for (int i = i0; i < i1; ++i) {
                const lane & l = s.lanes[i];
                if (l.st == DONE) continue;
                live++;
                if (l.st != AT_SIMD) continue;
                if (at == 0) { op = l.op; line = l.line; gen = l.gen; }
                else if (l.op != op || l.line != line || l.gen != gen) fail("lanes of one simdgroup wait at different simd_* calls");
                at++;
                mask |= 1u << (i - i0);
            }
            if (live > 0 && at == live) {
                s.sg[g].active[gen & 1] = mask;
                for (int i = i0; i < i1; ++i) if (s.lanes[i].st == AT_SIMD) s.lanes[i].st = RUNNABLE;
                released = true;
            }
        }
        if (released) continue;
        if (n_delayed > 0) {
            for (int i = 0; i < n; ++i) if (s.lanes[i].st == DELAYED) s.lanes[i].st = RUNNABLE;
            continue;
        }
        if (n_barrier == n - n_done) {
            if (n_done > 0) fail("threadgroup_barrier not reached by every thread (some returned early)");
            release_all(n);
            continue;
        }
        fail("deadlock: lanes wait at simd_* calls and threadgroup_barrier at once");
    }
}

// run kernel `name` over grid threadgroups of ntg threads; buffers[i] is [[buffer(i)]], tgmem[i] the byte size of
// [[threadgroup(i)]]
inline void dispatch(const char * name, const uint32_t grid[3], const uint32_t ntg[3],
                     std::vector<void *> buffers, std::vector<size_t> tgmem = {}) {
    state & s = S();
    s.entry = nullptr;
    for (auto & k : s.kernels) if (k.name == name) s.entry = k.fn;
    if (s.entry == nullptr) { std::fprintf(stderr, "metal-shim: no kernel %s\n", name); std::abort(); }
    for (int i = 0; i < MAX_BUFFERS; ++i) s.buffers[i] = i < (int) buffers.size() ? buffers[i] : nullptr;
    for (int i = 0; i < MAX_TGMEM; ++i) {
        s.tgmem_size[i] = i < (int) tgmem.size() ? tgmem[i] : 0;
        s.tgmem[i].resize(s.tgmem_size[i]);
    }
    for (int i = 0; i < 3; ++i) { s.grid[i] = grid[i]; s.ntg[i] = ntg[i]; }
    s.nthreads = ntg[0]*ntg[1]*ntg[2];
    if (s.nthreads == 0 || s.nthreads > MAX_LANES) fail("threads per threadgroup must be 1..1024");
    std::vector<uint32_t> tgs;
    for (uint32_t z = 0; z < grid[2]; ++z) for (uint32_t y = 0; y < grid[1]; ++y) for (uint32_t x = 0; x < grid[0]; ++x) {
        tgs.push_back(x); tgs.push_back(y); tgs.push_back(z);
    }
    std::vector<size_t> order(tgs.size()/3);
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (s.random) std::shuffle(order.begin(), order.end(), s.rng);
    for (size_t i : order) {
        for (int d = 0; d < 3; ++d) s.tg[d] = tgs[3*i + d];
        run_threadgroup();
    }
}

inline void set_random(bool on, uint64_t seed) { S().random = on; S().rng.seed(seed); }

} // namespace shim
