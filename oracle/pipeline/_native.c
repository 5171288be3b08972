/* The pipeline replay's inner loop and a new plan's compile as a C extension (oracle.pipeline._native), built at
 * install where a C compiler is present (setup.py: an optional extension; without one the package installs and
 * runs in numba, numpy and Python: speed only). oracle/pipeline/_jit.py says when each function runs.
 *
 * chain_prepare(chain, tails, n_keys) -> prepared | None and prepared_span(prepared, cost, lat) -> float are
 * oracle.pipeline.simulator._replay_chain followed by _makespan: for each step (key, prev, fold, dep, boundary,
 * cost index) of the folded chain,
 *     fin[key] = max(fin[prev] + cost[fold], fin[dep] + lat[boundary]) + cost[ci]
 * then the latest fin[key] + cost[fold] over the tails. The same IEEE double additions and comparisons in the
 * same order (no multiplication, so nothing a compiler may contract into an FMA): bit-identical to the Python
 * loop (tests/oracle/test_pipeline_jit.py). A plan's chain is checked once (chain_prepare: keys in [0, n_keys),
 * every other index in [-1, ...), -1 meaning the last element as in Python: fin's sentinel key, cost's and lat's
 * trailing 0.0) and held where Python cannot change it (the immutable bytes object the compiler keeps it in, or a
 * copy), so each replay runs without a check per index, and only verifies that the cost and latency lists are
 * long enough for the indices seen.
 *
 * A new plan's compile (compile_core, tick_order, fold_chain), its memory samples' frontier (frontier) and the
 * orders of two schedules (zbv_order, zb_h1_order) run here too: integer work and comparisons, the same tables as
 * numpy's (tests/oracle/test_pipeline_fast_compile.py, tests/oracle/test_pipeline_frontier.py).
 */
#if defined(__FAST_MATH__)
/* CFLAGS with -ffast-math (or -Ofast) may reorder or fuse the replay's floating-point work: no build then (the
 * extension is optional: the package installs and replays in numba or Python, bit-identical) */
#error "oracle.pipeline._native must not be built with -ffast-math: the replay must add and compare as Python does"
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A C-contiguous buffer of rows of `width` items of `kind` ('q': int64, 'd': float64), writable if asked; 0 on
 * success, -1 with an exception set. */
static int
typed_rows(PyObject *obj, Py_buffer *view, char kind, Py_ssize_t width, const char *name, int writable)
{
    const char *what = kind == 'd' ? "float64" : "int64";
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        if (PyErr_ExceptionMatches(PyExc_MemoryError))
            return -1;
        PyErr_Clear();  /* not a buffer, not C-contiguous or read-only: one message for all */
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s %s array of rows of %zd", name,
                     writable ? " writable" : "", what, width);
        return -1;
    }
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    int ok = view->itemsize == 8 && view->len % (8 * width) == 0
             && (kind == 'd' ? strcmp(f, "d") == 0 : (strcmp(f, "l") == 0 || strcmp(f, "q") == 0));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s %s array of rows of %zd", name,
                     writable ? " writable" : "", what, width);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int
int64_rows(PyObject *obj, Py_buffer *view, Py_ssize_t width, const char *name, int writable)
{
    return typed_rows(obj, view, 'q', width, name, writable);
}

/* A list of floats (or ints) as a malloc'd array of doubles, one slot longer in front: out[0] is the last value
 * (what Python's index -1 reads; 0.0 for an empty list) and out[1 + i] value i. NULL with an exception set. */
static double *
doubles(PyObject *obj, Py_ssize_t *n, const char *name)
{
    if (!PyList_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "prepared_span: %s must be a list of floats", name);
        return NULL;
    }
    *n = PyList_GET_SIZE(obj);
    double *out = (double *)malloc(sizeof(double) * (size_t)(*n + 1));
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    out[0] = 0.0;
    for (Py_ssize_t i = 0; i < *n; i++) {
        PyObject *x = PyList_GET_ITEM(obj, i);
        double d = PyFloat_CheckExact(x) ? PyFloat_AS_DOUBLE(x) : PyFloat_AsDouble(x);
        if (d == -1.0 && PyErr_Occurred()) {
            free(out);
            return NULL;
        }
        out[1 + i] = d;
    }
    if (*n > 0)
        out[0] = out[*n];
    return out;
}

/* The key count argument: 0 with it in *out, -1 with an exception set. */
static int
key_count(PyObject *obj, const char *fn, Py_ssize_t *out)
{
    *out = PyLong_AsSsize_t(obj);
    if (*out == -1 && PyErr_Occurred())
        return -1;
    if (*out < 0) {
        PyErr_Format(PyExc_ValueError, "%s: n_keys must be >= 0", fn);
        return -1;
    }
    return 0;
}

/* The ranks' slot offsets (pp + 1, from 0 to n, never decreasing): 0, or -1 with an exception set. */
static int
check_offsets(const int64_t *off, Py_ssize_t pp, Py_ssize_t n, const char *fn)
{
    if (pp > 0 && (off[0] != 0 || off[pp] != n)) {
        PyErr_Format(PyExc_ValueError, "%s: offsets must run from 0 to the op count", fn);
        return -1;
    }
    for (Py_ssize_t r = 0; r < pp; r++)
        if (off[r + 1] < off[r]) {
            PyErr_Format(PyExc_ValueError, "%s: offsets must not decrease", fn);
            return -1;
        }
    return 0;
}

/* Python's index rule: i in [-n, n) -> [0, n); anything else -> -1. */
static inline Py_ssize_t
wrap(int64_t i, Py_ssize_t n)
{
    if (i < 0)
        i += n;
    return (i >= 0 && i < n) ? (Py_ssize_t)i : -1;
}

/* A chain checked by chain_prepare: its steps' rows (in an immutable bytes object it holds, or copied into data),
 * then its tails' rows (copied into data). */
typedef struct {
    Py_ssize_t n_steps, n_tails, n_keys;
    int64_t need_cost, need_lat; /* the shortest cost and latency lists its indices allow */
    PyObject *owner;             /* the bytes object the steps are read from (NULL: they were copied) */
    const int64_t *steps;
    int64_t data[];
} Prepared;

#define PREPARED "oracle.pipeline._native.prepared_chain"

static void
prepared_free(PyObject *capsule)
{
    Prepared *p = (Prepared *)PyCapsule_GetPointer(capsule, PREPARED);
    if (p != NULL) {
        Py_XDECREF(p->owner);
        free(p);
    }
}

/* The least length a list indexed by `i` needs (index -1: the last element, so one). */
static inline int64_t
need(int64_t i)
{
    return i >= 0 ? i + 1 : 1;
}

/* chain_prepare(chain, tails, n_keys) -> prepared | None. `chain`: the steps' (n, 6) int64 rows as an array, or
 * as a bytes object of them (immutable: read in place, not copied). None when an index is outside the form the
 * compilers make (the Python loop then replays the chain, with Python's index rule). */
static PyObject *
chain_prepare(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "chain_prepare(chain, tails, n_keys) takes 3 arguments");
        return NULL;
    }
    Py_ssize_t n_keys;
    if (key_count(args[2], "chain_prepare", &n_keys) < 0)
        return NULL;
    int in_bytes = PyBytes_Check(args[0]);
    Py_buffer ch, tl;
    if (in_bytes) {
        if (PyBytes_GET_SIZE(args[0]) % (8 * 6) != 0) {
            PyErr_SetString(PyExc_TypeError, "chain_prepare: chain bytes must hold whole rows of 6 int64");
            return NULL;
        }
    } else if (int64_rows(args[0], &ch, 6, "chain_prepare: chain", 0) < 0)
        return NULL;
    if (int64_rows(args[1], &tl, 2, "chain_prepare: tails", 0) < 0) {
        if (!in_bytes)
            PyBuffer_Release(&ch);
        return NULL;
    }
    PyObject *result = NULL;
    const int64_t *steps = in_bytes ? (const int64_t *)PyBytes_AS_STRING(args[0]) : (const int64_t *)ch.buf;
    Py_ssize_t n_steps = (in_bytes ? PyBytes_GET_SIZE(args[0]) : ch.len) / (8 * 6), n_tails = tl.len / (8 * 2);
    const int64_t *c = steps, *t = (const int64_t *)tl.buf;
    int64_t need_cost = 0, need_lat = 0;
    int plain = n_tails > 0;  /* an order with no tails has no makespan: the Python loop says so */
    for (Py_ssize_t i = 0; i < n_steps && plain; i++, c += 6) {
        plain = c[0] >= 0 && c[0] < n_keys && c[1] >= -1 && c[1] < n_keys && c[3] >= -1 && c[3] < n_keys
                && c[2] >= -1 && c[5] >= -1 && c[4] >= -1;
        int64_t nc = need(c[2]) > need(c[5]) ? need(c[2]) : need(c[5]);
        need_cost = nc > need_cost ? nc : need_cost;
        need_lat = need(c[4]) > need_lat ? need(c[4]) : need_lat;
    }
    for (Py_ssize_t j = 0; j < n_tails && plain; j++, t += 2) {
        plain = t[0] >= -1 && t[0] < n_keys && t[1] >= -1;
        need_cost = need(t[1]) > need_cost ? need(t[1]) : need_cost;
    }
    if (!plain) {  /* any other index (Python's wrap rule): the Python loop replays this chain */
        result = Py_NewRef(Py_None);
        goto done;
    }
    size_t words = (size_t)(2 * n_tails + (in_bytes ? 0 : 6 * n_steps));
    Prepared *p = (Prepared *)malloc(sizeof(Prepared) + sizeof(int64_t) * (words ? words : 1));
    if (p == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    p->n_steps = n_steps;
    p->n_tails = n_tails;
    p->n_keys = n_keys;
    p->need_cost = need_cost;
    p->need_lat = need_lat;
    memcpy(p->data, tl.buf, sizeof(int64_t) * (size_t)(2 * n_tails));
    if (in_bytes) {
        p->owner = Py_NewRef(args[0]);
        p->steps = steps;
    } else {
        p->owner = NULL;
        memcpy(p->data + 2 * n_tails, steps, sizeof(int64_t) * (size_t)(6 * n_steps));
        p->steps = p->data + 2 * n_tails;
    }
    result = PyCapsule_New(p, PREPARED, prepared_free);
    if (result == NULL) {
        Py_XDECREF(p->owner);
        free(p);
    }
done:
    if (!in_bytes)
        PyBuffer_Release(&ch);
    PyBuffer_Release(&tl);
    return result;
}

static PyObject *
prepared_span(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "prepared_span(prepared, cost, lat) takes 3 arguments");
        return NULL;
    }
    Prepared *p = (Prepared *)PyCapsule_GetPointer(args[0], PREPARED);
    if (p == NULL) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "prepared_span: the first argument must come from chain_prepare");
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n_cost = 0, n_lat = 0;
    double *cost = NULL, *lat = NULL, *fin = NULL;
    if ((cost = doubles(args[1], &n_cost, "cost")) == NULL || (lat = doubles(args[2], &n_lat, "lat")) == NULL)
        goto done;
    if (n_cost < p->need_cost || n_lat < p->need_lat) {
        PyErr_Format(PyExc_IndexError, "prepared_span: the chain indexes %lld costs and %lld latencies, got %zd and %zd",
                     (long long)p->need_cost, (long long)p->need_lat, n_cost, n_lat);
        goto done;
    }
    /* fin[0] is key -1 (no dependency, finished at 0): never written, as every key is in [0, n_keys) */
    if ((fin = (double *)calloc((size_t)p->n_keys + 1, sizeof(double))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const double *C = cost + 1, *L = lat + 1;  /* C[-1], L[-1]: the last value, as Python reads index -1 */
    double *F = fin + 1, span = 0.0;
    const int64_t *c = p->steps, *t = p->data;
    Py_ssize_t n_steps = p->n_steps, n_tails = p->n_tails;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n_steps; i++, c += 6) {
        double s = F[c[1]] + C[c[2]];
        double f = F[c[3]] + L[c[4]];
        F[c[0]] = (f > s ? f : s) + C[c[5]];
    }
    for (Py_ssize_t j = 0; j < n_tails; j++, t += 2) {
        double v = F[t[0]] + C[t[1]];
        if (j == 0 || v > span)
            span = v;
    }
    Py_END_ALLOW_THREADS
    result = PyFloat_FromDouble(span);
done:
    free(cost);
    free(lat);
    free(fin);
    return result;
}

/* tick_order(own, d1, d2, offsets, n_keys, perm) -> bool: oracle.pipeline.fast_compile._tick_order's result
 * written into `perm` (int64, one per op slot): the op slots sorted stably by their longest-path level with unit
 * op lengths, tick[i] = max(tick[rank predecessor] + 1, tick[slot of d1[i]] + 1, tick[slot of d2[i]] + 1) (a
 * key no op owns, -1 included, counts as level -1). The levels are the graph's unique least fixed point, so
 * this gives the very permutation of the numpy relaxation; here each rank advances while its next op's inputs
 * have levels (Kahn's order, rank by rank), a counting sort orders the slots. False (perm untouched) when no
 * rank can advance: the order deadlocks (a cycle). Every index is checked. */
static PyObject *
tick_order(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "tick_order(own, d1, d2, offsets, n_keys, perm) takes 6 arguments");
        return NULL;
    }
    Py_ssize_t n_keys;
    if (key_count(args[4], "tick_order", &n_keys) < 0)
        return NULL;
    Py_buffer bo, b1, b2, bf, bp;
    int got = 0;
    const char *names[5] = {"tick_order: own", "tick_order: d1", "tick_order: d2", "tick_order: offsets",
                            "tick_order: perm"};
    Py_buffer *views[5] = {&bo, &b1, &b2, &bf, &bp};
    PyObject *result = NULL;
    int64_t *slot_of = NULL, *tick = NULL, *at = NULL, *count = NULL;
    for (; got < 5; got++)
        if (int64_rows(args[got == 4 ? 5 : got], views[got], 1, names[got], got == 4) < 0)
            goto done;
    Py_ssize_t n = bo.len / 8, pp = bf.len / 8 - 1;
    if (b1.len != bo.len || b2.len != bo.len || bp.len != bo.len || pp < 0) {
        PyErr_SetString(PyExc_ValueError, "tick_order: own, d1, d2 and perm need one entry per op, offsets pp + 1");
        goto done;
    }
    const int64_t *own = (const int64_t *)bo.buf, *d1 = (const int64_t *)b1.buf, *d2 = (const int64_t *)b2.buf;
    const int64_t *off = (const int64_t *)bf.buf;
    int64_t *perm = (int64_t *)bp.buf;
    if (check_offsets(off, pp, n, "tick_order") < 0)
        goto done;
    slot_of = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n_keys + 1));
    tick = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n + 1));
    at = (int64_t *)malloc(sizeof(int64_t) * (size_t)(pp > 0 ? pp : 1));
    count = (int64_t *)calloc((size_t)(n + 1), sizeof(int64_t));
    if (!slot_of || !tick || !at || !count) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k <= n_keys; k++)
        slot_of[k] = n;  /* no op owns it: the sentinel slot n, level -1 */
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t k = wrap(own[i], n_keys + 1);
        if (k < 0) {
            PyErr_Format(PyExc_IndexError, "tick_order: op %zd owns key %lld, out of range", i, (long long)own[i]);
            goto done;
        }
        slot_of[k] = i;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (wrap(d1[i], n_keys + 1) < 0 || wrap(d2[i], n_keys + 1) < 0) {
            PyErr_Format(PyExc_IndexError, "tick_order: op %zd depends on a key out of range", i);
            goto done;
        }
        tick[i] = -2;  /* not placed yet */
    }
    tick[n] = -1;
    for (Py_ssize_t r = 0; r < pp; r++)
        at[r] = off[r];
    Py_ssize_t placed = 0;
    int stuck = 0;
    while (placed < n) {
        Py_ssize_t before = placed;
        for (Py_ssize_t r = 0; r < pp; r++) {
            int64_t i = at[r], end = off[r + 1];
            for (; i < end; i++) {
                int64_t t1 = tick[slot_of[wrap(d1[i], n_keys + 1)]], t2 = tick[slot_of[wrap(d2[i], n_keys + 1)]];
                if (t1 == -2 || t2 == -2)
                    break;  /* an input not placed yet: another rank first */
                int64_t t = (i > off[r] ? tick[i - 1] : -1);
                if (t1 > t)
                    t = t1;
                if (t2 > t)
                    t = t2;
                tick[i] = t + 1;
                count[t + 1]++;
                placed++;
            }
            at[r] = i;
        }
        if (placed == before) {
            stuck = 1;
            break;
        }
    }
    if (!stuck) {
        int64_t total = 0;  /* count[t] -> the first position of level t */
        for (Py_ssize_t t = 0; t <= n; t++) {
            int64_t c = count[t];
            count[t] = total;
            total += c;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            perm[count[tick[i]]++] = i;
    }
    result = PyBool_FromLong(!stuck);
done:
    free(slot_of);
    free(tick);
    free(at);
    free(count);
    for (int j = 0; j < got; j++)
        PyBuffer_Release(views[j]);
    return result;
}


/* fold_chain(rank, own, d1, b1, gci, perm, offsets, n_keys, chain, tails) -> int: oracle.pipeline.fast_compile.
 * fold_columns computed op by op: the folded chain's steps written into the first rows of `chain` ((ops, 6)
 * int64, key, prev, fold, dep, boundary, cost index) in evaluation order, each rank's tail into `tails`
 * ((pp, 2) int64); returns the step count. An op no other rank waits for and with no cross-rank input folds
 * into its rank's next op (a run of such ops: each but the last is a step of its own, emitted where the next
 * one is met). Every index is checked. */
static PyObject *
fold_chain(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "fold_chain(rank, own, d1, b1, gci, perm, offsets, n_keys, chain, tails) takes 10 arguments");
        return NULL;
    }
    Py_ssize_t n_keys;
    if (key_count(args[7], "fold_chain", &n_keys) < 0)
        return NULL;
    enum { RANK, OWN, D1, B1, GCI, PERM, OFF, CHAIN, TAILS, N_BUF };
    static const char *names[N_BUF] = {"fold_chain: rank", "fold_chain: own", "fold_chain: d1", "fold_chain: b1",
                                       "fold_chain: gci", "fold_chain: perm", "fold_chain: offsets",
                                       "fold_chain: chain", "fold_chain: tails"};
    static const int arg_of[N_BUF] = {0, 1, 2, 3, 4, 5, 6, 8, 9};
    Py_buffer v[N_BUF];
    int got = 0;
    PyObject *result = NULL;
    char *awaited = NULL, *foldable = NULL, *emitted = NULL;
    int64_t *pos = NULL, *at_slot = NULL, *latest = NULL;
    for (; got < N_BUF; got++)
        if (int64_rows(args[arg_of[got]], &v[got], got == CHAIN ? 6 : got == TAILS ? 2 : 1, names[got],
                       got >= CHAIN) < 0)
            goto done;
    Py_ssize_t n = v[OWN].len / 8, pp = v[OFF].len / 8 - 1;
    if (v[RANK].len != v[OWN].len || v[D1].len != v[OWN].len || v[B1].len != v[OWN].len
        || v[GCI].len != v[OWN].len || v[PERM].len != v[OWN].len || v[CHAIN].len != 6 * v[OWN].len || pp < 0
        || v[TAILS].len != 2 * 8 * pp) {
        PyErr_SetString(PyExc_ValueError, "fold_chain: rank, own, d1, b1, gci and perm need one entry per op, "
                                          "chain one row of 6 per op, offsets pp + 1 entries, tails pp rows of 2");
        goto done;
    }
    const int64_t *rank = (const int64_t *)v[RANK].buf, *own = (const int64_t *)v[OWN].buf;
    const int64_t *d1 = (const int64_t *)v[D1].buf, *b1 = (const int64_t *)v[B1].buf;
    const int64_t *gci = (const int64_t *)v[GCI].buf, *perm = (const int64_t *)v[PERM].buf;
    const int64_t *off = (const int64_t *)v[OFF].buf;
    int64_t *chain = (int64_t *)v[CHAIN].buf, *tails = (int64_t *)v[TAILS].buf;
    if (check_offsets(off, pp, n, "fold_chain") < 0)
        goto done;
    awaited = (char *)calloc((size_t)(n_keys + 1), 1);
    foldable = (char *)calloc((size_t)(n + 1), 1);
    emitted = (char *)calloc((size_t)(n + 1), 1);
    pos = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n + 1));
    at_slot = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n + 1));
    latest = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!awaited || !foldable || !emitted || !pos || !at_slot || !latest) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (wrap(own[i], n_keys + 1) < 0 || wrap(d1[i], n_keys + 1) < 0 || rank[i] < 0 || rank[i] >= pp
            || i < off[rank[i]] || i >= off[rank[i] + 1]) {
            PyErr_Format(PyExc_IndexError, "fold_chain: op %zd has a key or rank out of range", i);
            goto done;
        }
        if (b1[i] >= 0)
            awaited[wrap(d1[i], n_keys + 1)] = 1;
        pos[i] = -1;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        if (perm[j] < 0 || perm[j] >= n || pos[perm[j]] >= 0) {
            PyErr_SetString(PyExc_ValueError, "fold_chain: perm must be a permutation of the op slots");
            goto done;
        }
        pos[perm[j]] = j;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        foldable[i] = b1[i] < 0 && !awaited[wrap(own[i], n_keys + 1)];
    for (Py_ssize_t j = 0; j < n; j++)
        at_slot[j] = -1;
    int64_t run = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int last = i == off[rank[i] + 1] - 1;
        int next_foldable = i + 1 < n && foldable[i + 1] && !last;
        emitted[i] = !foldable[i] || next_foldable;
        if (emitted[i]) {  /* emitted at its own position, a standalone foldable op at its successor's */
            int64_t at = (foldable[i] && next_foldable) ? pos[i + 1] : pos[i];
            if (at_slot[at] >= 0) {  /* cannot happen for a permutation: one step per evaluation position */
                PyErr_SetString(PyExc_ValueError, "fold_chain: two steps at one evaluation position");
                goto done;
            }
            at_slot[at] = i;
            run = i;
        }
        latest[i] = run;  /* the latest emitted slot so far (over all ranks: clamped to the rank below) */
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t i = at_slot[j];
        if (i < 0)
            continue;
        int64_t start = off[rank[i]];
        int64_t before = i > 0 ? latest[i - 1] : -1;
        int64_t *row = chain + 6 * k++;
        row[0] = own[i];
        row[1] = before >= start ? own[before] : -1;
        row[2] = (!foldable[i] && i > start && foldable[i - 1]) ? gci[i - 1] : -1;
        row[3] = (foldable[i] || b1[i] < 0) ? -1 : d1[i];
        row[4] = foldable[i] ? -1 : b1[i];
        row[5] = gci[i];
    }
    for (Py_ssize_t r = 0; r < pp; r++) {
        int64_t lo = off[r], hi = off[r + 1];
        if (lo == hi) {
            tails[2 * r] = tails[2 * r + 1] = -1;
            continue;
        }
        int64_t e = latest[hi - 1];
        tails[2 * r] = e >= lo ? own[e] : -1;
        tails[2 * r + 1] = foldable[hi - 1] ? gci[hi - 1] : -1;
    }
    result = PyLong_FromSsize_t(k);
done:
    free(awaited);
    free(foldable);
    free(emitted);
    free(pos);
    free(at_slot);
    free(latest);
    for (int j = 0; j < got; j++)
        PyBuffer_Release(&v[j]);
    return result;
}


/* compile_core(ops, offsets, m, vpp, rank_of_stage, vs, kinds, rank, own, d1, b1, d2, gci, mem_alive, mem_b,
 * mem_w, f_rank, op_counts, peak) -> int: oracle.pipeline.fast_compile.compile_arrays's per-op tables computed op
 * by op (its numpy passes, the same values). `ops` (n, 3) int64 rows (kind code, mb, chunk) rank after rank as
 * `offsets` (pp + 1) say; `rank_of_stage` (pp * vpp) and `vs` (rank * vpp + chunk -> virtual stage) the
 * layout's maps; `kinds` (4, 4) int64: per kind code its dependency class, memory count row, count step and
 * live-chunk step (fast_compile's tables, passed in: one source). Writes, per op, its rank, key, first
 * dependency and the boundary it crosses, second dependency and cost index; per forward op (pp * vpp * m of
 * them, in slot order) the per-chunk counts alive / released by B / released by W on its rank after it, and its
 * rank; the op count per (rank, kind, chunk); per rank the most chunks alive after a forward. Returns -1 (nothing
 * to use: the caller takes the reference path, which names the problem) when a kind, micro-batch or chunk is out
 * of range or a (rank, chunk, micro-batch) cell does not hold exactly one F and either one BW or one B and one W;
 * else 1 if any op is a split B, 0 if not. */
static PyObject *
compile_core(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 19) {
        PyErr_SetString(PyExc_TypeError, "compile_core takes 19 arguments (see its source)");
        return NULL;
    }
    Py_ssize_t m = PyLong_AsSsize_t(args[2]), vpp = PyLong_AsSsize_t(args[3]);
    if ((m == -1 || vpp == -1) && PyErr_Occurred())
        return NULL;
    if (m < 1 || vpp < 1) {
        PyErr_SetString(PyExc_ValueError, "compile_core: m and vpp must be >= 1");
        return NULL;
    }
    enum { OPS, OFF, ROS, VS, KINDS, RANK, OWN, D1, B1, D2, GCI, MA, MB, MW, FR, OC, PEAK, N_BUF };
    static const int arg_of[N_BUF] = {0, 1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18};
    static const char *names[N_BUF] = {
        "compile_core: ops", "compile_core: offsets", "compile_core: rank_of_stage", "compile_core: vs",
        "compile_core: kinds", "compile_core: rank", "compile_core: own", "compile_core: d1", "compile_core: b1",
        "compile_core: d2", "compile_core: gci", "compile_core: mem_alive", "compile_core: mem_b",
        "compile_core: mem_w", "compile_core: f_rank", "compile_core: op_counts", "compile_core: peak"};
    Py_buffer v[N_BUF];
    int got = 0;
    PyObject *result = NULL;
    int64_t *count = NULL, *cnt = NULL;
    for (; got < N_BUF; got++) {
        int width = got == OPS ? 3 : got == KINDS ? 16 : 1;
        char kind = (got == MA || got == MB || got == MW) ? 'd' : 'q';
        if (typed_rows(args[arg_of[got]], &v[got], kind, width, names[got], got >= RANK) < 0)
            goto done;
    }
    Py_ssize_t n = v[OPS].len / (8 * 3), pp = v[OFF].len / 8 - 1, n_stages, n_cells;
    if (pp < 1) {
        PyErr_SetString(PyExc_ValueError, "compile_core: offsets needs pp + 1 >= 2 entries");
        goto done;
    }
    /* the sizes below (cells x vpp x 8 bytes, 4 x cells counters) must not overflow */
    if (vpp > PY_SSIZE_T_MAX / 64 / pp || m > PY_SSIZE_T_MAX / 64 / (pp * vpp)
        || vpp > PY_SSIZE_T_MAX / 64 / (pp * vpp * m)) {
        PyErr_SetString(PyExc_ValueError, "compile_core: pp x vpp x m x vpp is too large");
        goto done;
    }
    n_stages = pp * vpp;
    n_cells = n_stages * m;
    if (v[ROS].len != 8 * n_stages || v[VS].len != 8 * n_stages || v[KINDS].len != 8 * 16
        || v[RANK].len != 8 * n || v[OWN].len != 8 * n || v[D1].len != 8 * n || v[B1].len != 8 * n
        || v[D2].len != 8 * n || v[GCI].len != 8 * n || v[MA].len != 8 * n_cells * vpp
        || v[MB].len != 8 * n_cells * vpp || v[MW].len != 8 * n_cells * vpp || v[FR].len != 8 * n_cells
        || v[OC].len != 8 * pp * 4 * vpp || v[PEAK].len != 8 * pp) {
        PyErr_SetString(PyExc_ValueError, "compile_core: an output or map has the wrong size (see the source)");
        goto done;
    }
    const int64_t *ops = (const int64_t *)v[OPS].buf, *off = (const int64_t *)v[OFF].buf;
    const int64_t *ros = (const int64_t *)v[ROS].buf, *vs = (const int64_t *)v[VS].buf;
    const int64_t *kt = (const int64_t *)v[KINDS].buf;  /* rows: dep class, count row, count step, live step */
    int64_t *rank = (int64_t *)v[RANK].buf, *own = (int64_t *)v[OWN].buf, *d1 = (int64_t *)v[D1].buf;
    int64_t *b1 = (int64_t *)v[B1].buf, *d2 = (int64_t *)v[D2].buf, *gci = (int64_t *)v[GCI].buf;
    double *ma = (double *)v[MA].buf, *mb_ = (double *)v[MB].buf, *mw = (double *)v[MW].buf;
    int64_t *f_rank = (int64_t *)v[FR].buf, *oc = (int64_t *)v[OC].buf, *peak = (int64_t *)v[PEAK].buf;
    if (check_offsets(off, pp, n, "compile_core") < 0)
        goto done;
    for (Py_ssize_t s_ = 0; s_ < n_stages; s_++)
        if (ros[s_] < 0 || ros[s_] >= pp || vs[s_] < 0 || vs[s_] >= n_stages) {
            PyErr_SetString(PyExc_ValueError, "compile_core: a stage map entry is out of range");
            goto done;
        }
    for (int k = 0; k < 4; k++)
        if (kt[k] < 0 || kt[k] > 2 || kt[4 + k] < 0 || kt[4 + k] > 2) {
            PyErr_SetString(PyExc_ValueError, "compile_core: kinds' dependency class and count row must be 0-2");
            goto done;
        }
    /* the ops' ranges, then one F and (one BW, or one B and one W) per cell */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t k = ops[3 * i], mbi = ops[3 * i + 1], c = ops[3 * i + 2];
        if (k < 0 || k > 3 || mbi < 0 || mbi >= m || c < 0 || c >= vpp) {
            result = PyLong_FromLong(-1);
            goto done;
        }
    }
    cnt = (int64_t *)calloc((size_t)(4 * n_cells), sizeof(int64_t));
    count = (int64_t *)malloc(sizeof(int64_t) * (size_t)(3 * vpp));
    if (!cnt || !count) {
        PyErr_NoMemory();
        goto done;
    }
    int any_b = 0;
    for (Py_ssize_t r = 0; r < pp; r++)
        for (int64_t i = off[r]; i < off[r + 1]; i++) {
            int64_t k = ops[3 * i];
            cnt[k * n_cells + (r * vpp + ops[3 * i + 2]) * m + ops[3 * i + 1]]++;
            any_b |= k == 1;
        }
    for (Py_ssize_t c = 0; c < n_cells; c++) {
        int64_t f = cnt[c], b = cnt[n_cells + c], w = cnt[2 * n_cells + c], bw = cnt[3 * n_cells + c];
        if (f != 1 || !((bw == 1 && b == 0 && w == 0) || (bw == 0 && b == 1 && w == 1))) {
            result = PyLong_FromLong(-1);
            goto done;
        }
    }
    memset(oc, 0, sizeof(int64_t) * (size_t)(pp * 4 * vpp));
    Py_ssize_t j = 0;  /* the forward ops' rows, in slot order */
    for (Py_ssize_t r = 0; r < pp; r++) {
        int64_t live = 0, top = 0;  /* after a forward at least that one chunk is alive: top >= 1 */
        memset(count, 0, sizeof(int64_t) * (size_t)(3 * vpp));
        for (int64_t i = off[r]; i < off[r + 1]; i++) {
            int64_t k = ops[3 * i], mbi = ops[3 * i + 1], c = ops[3 * i + 2];
            int64_t vst = vs[r * vpp + c];
            int64_t f_key = mbi * n_stages + vst, b_key = f_key + m * n_stages;
            int is_f = k == 0, is_w = k == 2;
            int b_mid = !(is_f || is_w) && vst < n_stages - 1;
            rank[i] = r;
            own[i] = (kt[k] * m + mbi) * n_stages + vst;
            d1[i] = is_f ? (vst > 0 ? f_key - 1 : -1) : ((is_w || b_mid) ? b_key + b_mid : f_key);
            int cross_f = is_f && vst > 0 && ros[vst - 1] != r;
            int cross_b = b_mid && ros[vst + 1] != r;
            b1[i] = cross_f ? vst - 1 : (cross_b ? vst : -1);
            d2[i] = b_mid ? f_key : -1;
            gci[i] = r * (4 * vpp) + k * vpp + c;
            oc[gci[i]]++;
            count[kt[4 + k] * vpp + c] += kt[8 + k];
            live += kt[12 + k];
            if (is_f) {
                for (Py_ssize_t q = 0; q < vpp; q++) {
                    ma[j * vpp + q] = (double)count[q];
                    mb_[j * vpp + q] = (double)count[vpp + q];
                    mw[j * vpp + q] = (double)count[2 * vpp + q];
                }
                f_rank[j++] = r;
                if (live > top)
                    top = live;
            }
        }
        peak[r] = top;
    }
    result = PyLong_FromLong(any_b);
done:
    free(cnt);
    free(count);
    for (int q = 0; q < got; q++)
        PyBuffer_Release(&v[q]);
    return result;
}

/* frontier(live, width, segments, keep) -> kept. `live`: rows of `width` float64 (a plan's memory samples, one column
 * per chunk), in segments (one per rank) starting at the int64 row offsets `segments` (the first 0, increasing, each
 * below the row count: no segment is empty). `keep` (uint8, one per row, writable) gets 1 for each row no other row
 * of its segment is >= in every column (of equal rows, the first) and 0 for the others; returns how many are kept.
 * Comparisons only, with numpy's rule for a NaN (never >=): the rows kept are the exact frontier that
 * oracle.pipeline.simulator._non_dominated keeps or contains (tests/oracle/test_pipeline_frontier.py). Each row is
 * held against the frontier so far: dropped if a kept row covers it, else it drops the kept rows it covers. */
static int
covers(const double *y, const double *x, Py_ssize_t width)
{
    for (Py_ssize_t c = 0; c < width; c++)
        if (!(y[c] >= x[c]))
            return 0;
    return 1;
}

static PyObject *
frontier(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "frontier(live, width, segments, keep) takes 4 arguments");
        return NULL;
    }
    Py_ssize_t width = PyLong_AsSsize_t(args[1]);
    if (width == -1 && PyErr_Occurred())
        return NULL;
    if (width < 1 || width > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "frontier: width must be in [1, 2**20]");
        return NULL;
    }
    Py_buffer lv, sv, kv;
    if (typed_rows(args[0], &lv, 'd', width, "frontier: live", 0) < 0)
        return NULL;
    if (int64_rows(args[2], &sv, 1, "frontier: segments", 0) < 0) {
        PyBuffer_Release(&lv);
        return NULL;
    }
    if (PyObject_GetBuffer(args[3], &kv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&lv);
        PyBuffer_Release(&sv);
        if (!PyErr_ExceptionMatches(PyExc_MemoryError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "frontier: keep must be a C-contiguous writable uint8 array");
        }
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t *front = NULL;
    const double *live = (const double *)lv.buf;
    const int64_t *seg = (const int64_t *)sv.buf;
    unsigned char *keep = (unsigned char *)kv.buf;
    Py_ssize_t rows = lv.len / (8 * width), nseg = sv.len / 8;
    if (kv.itemsize != 1 || kv.len != rows) {
        PyErr_SetString(PyExc_ValueError, "frontier: keep must hold one uint8 per row of live");
        goto done;
    }
    if ((nseg == 0) != (rows == 0) || (nseg > 0 && seg[0] != 0)) {
        PyErr_SetString(PyExc_ValueError, "frontier: segments must start at row 0 (and be empty only with no rows)");
        goto done;
    }
    for (Py_ssize_t s = 0; s < nseg; s++) {
        int64_t end = s + 1 < nseg ? seg[s + 1] : (int64_t)rows;
        if (!(seg[s] < end)) {
            PyErr_SetString(PyExc_ValueError, "frontier: segments must increase, each below the row count");
            goto done;
        }
    }
    if (rows > 0) {
        front = (Py_ssize_t *)malloc(sizeof(Py_ssize_t) * (size_t)rows);
        if (front == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    memset(keep, 0, (size_t)rows);
    Py_ssize_t kept = 0;
    for (Py_ssize_t s = 0; s < nseg; s++) {
        Py_ssize_t a = (Py_ssize_t)seg[s], b = s + 1 < nseg ? (Py_ssize_t)seg[s + 1] : rows, nf = 0;
        for (Py_ssize_t i = a; i < b; i++) {
            const double *x = live + i * width;
            int covered = 0;
            for (Py_ssize_t f = 0; f < nf && !covered; f++)
                covered = covers(live + front[f] * width, x, width);
            if (covered)
                continue;
            Py_ssize_t k = 0;
            for (Py_ssize_t f = 0; f < nf; f++)
                if (!covers(x, live + front[f] * width, width))
                    front[k++] = front[f];
            front[k] = i;
            nf = k + 1;
        }
        for (Py_ssize_t f = 0; f < nf; f++)
            keep[front[f]] = 1;
        kept += nf;
    }
    result = PyLong_FromSsize_t(kept);
done:
    free(front);
    PyBuffer_Release(&lv);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&kv);
    return result;
}

/* The order builders of two fixed schedules, op for op as their Python op-list builders
 * (oracle/pipeline/schedules/zbv.py rank_order, zero_bubble.py zb_h1_rank): rows (kind code F 0, B 1, W 2;
 * micro-batch; chunk) of every rank one after another, each rank's 6 m (ZB-V) or 3 m (ZB-H1) rows. */
typedef struct {
    int64_t *out;
    Py_ssize_t at, end;
    int64_t m;
} Rows;

static inline int
emit(Rows *w, int64_t kind, int64_t mb, int64_t chunk)
{
    if (mb >= w->m)  /* the pattern's ops of micro-batches past m are dropped (zbv.py) */
        return 0;
    if (w->at >= w->end)
        return -1;
    int64_t *row = w->out + 3 * w->at++;
    row[0] = kind;
    row[1] = mb;
    row[2] = chunk;
    return 0;
}

/* Parse (pp, m, out): 0 with the sizes set and `out` held, -1 with an exception set. */
static int
order_args(PyObject *const *args, Py_ssize_t nargs, const char *fn, Py_ssize_t per_mb, int64_t *pp, int64_t *m,
           Py_buffer *view)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s(pp, m, out) takes 3 arguments", fn);
        return -1;
    }
    *pp = PyLong_AsLongLong(args[0]);
    if (*pp == -1 && PyErr_Occurred())
        return -1;
    *m = PyLong_AsLongLong(args[1]);
    if (*m == -1 && PyErr_Occurred())
        return -1;
    if (*pp < 1 || *m < 1 || *pp > (1 << 20) || *m > (1 << 24)) {
        PyErr_Format(PyExc_ValueError, "%s: pp and m must be in [1, 2**20] and [1, 2**24]", fn);
        return -1;
    }
    if (int64_rows(args[2], view, 3, fn, 1) < 0)
        return -1;
    if (view->len != (Py_ssize_t)(*pp * *m * per_mb * 3 * 8)) {
        PyErr_Format(PyExc_ValueError, "%s: out must hold pp x %zd m rows of 3", fn, per_mb);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The end of an order builder: `out` released; None, or a RuntimeError `why` where a rank's count was off. */
static PyObject *
order_done(Py_buffer *view, int bad, const char *why)
{
    PyBuffer_Release(view);
    if (bad) {
        PyErr_SetString(PyExc_RuntimeError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
zbv_order(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    int64_t pp, m;
    Py_buffer view;
    if (order_args(args, nargs, "zbv_order", 6, &pp, &m, &view) < 0)
        return NULL;
    int64_t n = m > 2 * pp - 1 ? m : 2 * pp - 1;
    Rows w = {(int64_t *)view.buf, 0, 0, m};
    int bad = 0;
    for (int64_t r = 0; r < pp && !bad; r++) {
        w.end = (r + 1) * 6 * m;
        int64_t f0 = 0, f1 = 0, b0 = 0, b1 = 0;
        for (int64_t i = 0; i < 2 * (pp - r) - 1; i++)
            bad |= emit(&w, 0, f0++, 0);
        for (int64_t i = 0; i < r; i++) {
            bad |= emit(&w, 0, f1++, 1);
            bad |= emit(&w, 0, f0++, 0);
        }
        for (int64_t i = 0; i < pp - r; i++) {
            bad |= emit(&w, 0, f1++, 1);
            bad |= emit(&w, 1, b1, 1);
            bad |= emit(&w, 2, b1++, 1);
        }
        while ((f1 < f0 || f0 < n) && !bad) {
            if (f0 < n)
                bad |= emit(&w, 0, f0++, 0);
            bad |= emit(&w, 1, b0, 0);
            bad |= emit(&w, 2, b0++, 0);
            bad |= emit(&w, 0, f1++, 1);
            bad |= emit(&w, 1, b1, 1);
            bad |= emit(&w, 2, b1++, 1);
        }
        int64_t w0 = b0, w1 = b1;
        for (int64_t i = 0; i < r; i++) {
            bad |= emit(&w, 1, b0++, 0);
            bad |= emit(&w, 1, b1++, 1);
        }
        for (int64_t i = 0; i < pp - r; i++) {
            bad |= emit(&w, 1, b0++, 0);
            bad |= emit(&w, 2, w0++, 0);
        }
        for (int64_t j = w1; j < b1; j++)
            bad |= emit(&w, 2, j, 1);
        for (int64_t j = w0; j < b0; j++)
            bad |= emit(&w, 2, j, 0);
        bad |= w.at != w.end;
    }
    return order_done(&view, bad, "zbv_order: a rank's op count is not 6 m (a bug)");
}

static PyObject *
zb_h1_order(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    int64_t pp, m;
    Py_buffer view;
    if (order_args(args, nargs, "zb_h1_order", 3, &pp, &m, &view) < 0)
        return NULL;
    Rows w = {(int64_t *)view.buf, 0, 0, m};
    int bad = 0;
    for (int64_t r = 0; r < pp && !bad; r++) {
        w.end = (r + 1) * 3 * m;
        int64_t warmup = pp - r - 1 < m ? pp - r - 1 : m;
        int64_t head = 0, tail = 0;  /* pending W's: micro-batches [head, tail), in the order of their B's */
        /* 1F1B's F/B sequence (fb_sequence, backward B), W(j) right after the B that makes r + 1 pending */
        for (int64_t k = 0; k < 2 * m; k++) {
            int64_t kind, mb;
            if (k < warmup) {
                kind = 0, mb = k;
            } else if (k < 2 * m - warmup) {
                int64_t i = (k - warmup) / 2;
                if ((k - warmup) % 2 == 0)
                    kind = 0, mb = warmup + i;
                else
                    kind = 1, mb = i;
            } else {
                kind = 1, mb = k - m;
            }
            bad |= emit(&w, kind, mb, 0);
            if (kind == 1) {
                tail = mb + 1;
                if (tail - head > r)
                    bad |= emit(&w, 2, head++, 0);
            }
        }
        while (head < tail)
            bad |= emit(&w, 2, head++, 0);
        bad |= w.at != w.end;
    }
    return order_done(&view, bad, "zb_h1_order: a rank's op count is not 3 m (a bug)");
}

static PyMethodDef methods[] = {
    {"chain_prepare", (PyCFunction)(void (*)(void))chain_prepare, METH_FASTCALL,
     "chain_prepare(chain, tails, n_keys) -> prepared | None: a folded chain checked and copied (see the module)."},
    {"prepared_span", (PyCFunction)(void (*)(void))prepared_span, METH_FASTCALL,
     "prepared_span(prepared, cost, lat) -> float: the prepared chain's makespan (see the module)."},
    {"tick_order", (PyCFunction)(void (*)(void))tick_order, METH_FASTCALL,
     "tick_order(own, d1, d2, offsets, n_keys, perm) -> bool: the op slots by longest-path level (see the source)."},
    {"fold_chain", (PyCFunction)(void (*)(void))fold_chain, METH_FASTCALL,
     "fold_chain(rank, own, d1, b1, gci, perm, offsets, n_keys, chain, tails) -> int: the folded chain (see the "
     "source)."},
    {"compile_core", (PyCFunction)(void (*)(void))compile_core, METH_FASTCALL,
     "compile_core(ops, offsets, m, vpp, rank_of_stage, vs, kinds, ...outputs) -> int: a plan's per-op tables "
     "(see the source)."},
    {"frontier", (PyCFunction)(void (*)(void))frontier, METH_FASTCALL,
     "frontier(live, width, segments, keep) -> int: each segment's non-dominated rows (see the source)."},
    {"zbv_order", (PyCFunction)(void (*)(void))zbv_order, METH_FASTCALL,
     "zbv_order(pp, m, out): ZB-V's order, every rank's 6 m rows (see the source)."},
    {"zb_h1_order", (PyCFunction)(void (*)(void))zb_h1_order, METH_FASTCALL,
     "zb_h1_order(pp, m, out): ZB-H1's order, every rank's 3 m rows (see the source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The pipeline replay's inner loop in C (see _native.c).", -1, methods, NULL, NULL, NULL, NULL,
};

#ifndef NATIVE_SOURCE_SHA256
#define NATIVE_SOURCE_SHA256 "" /* built by hand, not by setup.py: oracle/pipeline/_jit.py will not use it */
#endif

PyMODINIT_FUNC
PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module);
    /* the SHA-256 of the source this was built from (setup.py): oracle/pipeline/_jit.py uses the module only while
     * it is the _native.c beside it, so a build from another version is never run */
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_SHA256", NATIVE_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
