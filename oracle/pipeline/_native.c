/* The pipeline replay's inner loop as a C extension (oracle.pipeline._native), built at install where a C
 * compiler is present (setup.py: an optional extension; without one the package installs and replays with
 * numba or in Python: speed only).
 *
 * chain_span(chain, tails, cost, lat, n_keys) -> float is oracle.pipeline.simulator._replay_chain followed by
 * _makespan: for each step (key, prev, fold, dep, boundary, cost index) of the folded chain,
 *     fin[key] = max(fin[prev] + cost[fold], fin[dep] + lat[boundary]) + cost[ci]
 * then the latest fin[key] + cost[fold] over the tails. The same IEEE double additions and comparisons in the
 * same order (no multiplication, so nothing a compiler may contract into an FMA): bit-identical to the Python
 * loop (tests/oracle/test_pipeline_jit.py). Index -1 means the last element, as in Python (fin's sentinel key,
 * cost's and lat's trailing 0.0); any index out of range raises IndexError instead of reading past an array.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* An int64 C-contiguous buffer of rows of `width`; 0 on success, -1 with an exception set. */
static int
int64_rows(PyObject *obj, Py_buffer *view, Py_ssize_t width, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        if (PyErr_ExceptionMatches(PyExc_MemoryError))
            return -1;
        PyErr_Clear();  /* not a buffer, or not C-contiguous: one message for both */
        PyErr_Format(PyExc_TypeError, "chain_span: %s must be a C-contiguous int64 array of rows of %zd",
                     name, width);
        return -1;
    }
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    if (view->itemsize != 8 || (strcmp(f, "l") != 0 && strcmp(f, "q") != 0) || view->len % (8 * width) != 0) {
        PyErr_Format(PyExc_TypeError, "chain_span: %s must be a C-contiguous int64 array of rows of %zd",
                     name, width);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* A list of floats (or ints) as a malloc'd array of doubles; NULL with an exception set. */
static double *
doubles(PyObject *obj, Py_ssize_t *n, const char *name)
{
    if (!PyList_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "chain_span: %s must be a list of floats", name);
        return NULL;
    }
    *n = PyList_GET_SIZE(obj);
    double *out = (double *)malloc(sizeof(double) * (size_t)(*n > 0 ? *n : 1));
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        PyObject *x = PyList_GET_ITEM(obj, i);
        out[i] = PyFloat_CheckExact(x) ? PyFloat_AS_DOUBLE(x) : PyFloat_AsDouble(x);
        if (out[i] == -1.0 && PyErr_Occurred()) {
            free(out);
            return NULL;
        }
    }
    return out;
}

/* Python's index rule: i in [-n, n) -> [0, n); anything else -> -1. */
static inline Py_ssize_t
wrap(int64_t i, Py_ssize_t n)
{
    if (i < 0)
        i += n;
    return (i >= 0 && i < n) ? (Py_ssize_t)i : -1;
}

static PyObject *
chain_span(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "chain_span(chain, tails, cost, lat, n_keys) takes 5 arguments");
        return NULL;
    }
    Py_ssize_t n_keys = PyLong_AsSsize_t(args[4]);
    if (n_keys == -1 && PyErr_Occurred())
        return NULL;
    if (n_keys < 0) {
        PyErr_SetString(PyExc_ValueError, "chain_span: n_keys must be >= 0");
        return NULL;
    }
    Py_buffer ch, tl;
    if (int64_rows(args[0], &ch, 6, "chain") < 0)
        return NULL;
    if (int64_rows(args[1], &tl, 2, "tails") < 0) {
        PyBuffer_Release(&ch);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n_cost = 0, n_lat = 0, n_fin = n_keys + 1;
    double *cost = NULL, *lat = NULL, *fin = NULL;
    if ((cost = doubles(args[2], &n_cost, "cost")) == NULL || (lat = doubles(args[3], &n_lat, "lat")) == NULL)
        goto done;
    if ((fin = (double *)calloc((size_t)n_fin, sizeof(double))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *c = (const int64_t *)ch.buf, *t = (const int64_t *)tl.buf;
    Py_ssize_t n_steps = ch.len / (8 * 6), n_tails = tl.len / (8 * 2), bad = -1;
    double span = 0.0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n_steps; i++, c += 6) {
        Py_ssize_t key = wrap(c[0], n_fin), prev = wrap(c[1], n_fin), fold = wrap(c[2], n_cost);
        Py_ssize_t dep = wrap(c[3], n_fin), b = wrap(c[4], n_lat), ci = wrap(c[5], n_cost);
        if ((key | prev | fold | dep | b | ci) < 0) {
            bad = i;
            break;
        }
        double s = fin[prev] + cost[fold];
        double f = fin[dep] + lat[b];
        fin[key] = (f > s ? f : s) + cost[ci];
    }
    if (bad < 0) {
        for (Py_ssize_t j = 0; j < n_tails; j++, t += 2) {
            Py_ssize_t k = wrap(t[0], n_fin), fold = wrap(t[1], n_cost);
            if ((k | fold) < 0) {
                bad = n_steps + j;
                break;
            }
            double v = fin[k] + cost[fold];
            if (j == 0 || v > span)
                span = v;
        }
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0)
        PyErr_Format(PyExc_IndexError, "chain_span: %s %zd has an index out of range",
                     bad < n_steps ? "step" : "tail", bad < n_steps ? bad : bad - n_steps);
    else if (n_tails == 0)
        PyErr_SetString(PyExc_ValueError, "chain_span: no tails (an empty order has no makespan)");
    else
        result = PyFloat_FromDouble(span);
done:
    free(cost);
    free(lat);
    free(fin);
    PyBuffer_Release(&ch);
    PyBuffer_Release(&tl);
    return result;
}

static PyMethodDef methods[] = {
    {"chain_span", (PyCFunction)(void (*)(void))chain_span, METH_FASTCALL,
     "chain_span(chain, tails, cost, lat, n_keys) -> float: the folded chain's makespan (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The pipeline replay's inner loop in C (see _native.c).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module);
    /* the interface version oracle/pipeline/_jit.py expects (NATIVE_VERSION): a stale build is not used */
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
