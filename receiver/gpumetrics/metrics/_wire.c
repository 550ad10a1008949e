/*
 * gpumetrics.metrics._wire: the optional compiled kernels of gpumetrics.metrics.bulk.
 *
 * Two functions with the exact results of their pure-Python twins in bulk.py (the tests
 * compare the two on random input and on every simulated scenario):
 *
 *   pack_points(heads, head_index, times, values, starts, as_int, order) -> bytes
 *       Serialized OTLP NumberDataPoint entries (field 1 of Gauge/Sum, wire type LEN), one per
 *       row: heads[head_index[row]] (0x0a, the point's length, its attribute entries), then
 *       start_time_unix_nano (0x11, fixed64) when starts is given, time_unix_nano (0x19,
 *       fixed64) and as_int (0x31, sfixed64) or as_double (0x21, double). Rows in `order`
 *       when given, else 0..n-1. head_index None: heads holds one head per row.
 *   order_runs(keys) -> (order, runs)
 *       order: the row indexes (native int64 bytes) that sort `keys` ascending, rows with equal
 *       keys in their original order (a merge sort); runs: (key, start, end) per distinct key,
 *       positions in that order.
 *   frame_resources(first, first_points, pids, resources, scope_head, scope_tail, metrics,
 *                   budget) -> ([(bytes, points)], [(pid, points)])
 *       One part per resource: `first` (the host's resource_metrics entry, given as the list
 *       of its pieces: written once, never joined first), then one ResourceMetrics entry per
 *       pid (its resource, one ScopeMetrics holding one Metric per metric that has a run for
 *       it), each a serialized ExportMetricsServiceRequest of its own. With budget > 0 a
 *       pid's part is written only when it fits what is left of budget bytes after the parts
 *       before it (first fit, in pid order; `first` is always kept); the others are returned
 *       as (pid, points), never written.
 *
 * Columns are any C-contiguous buffer with the item size and format named below (array('q'),
 * array('d'), array('I')); every 64-bit field is written little-endian, as the protobuf wire
 * format requires ("Encoding", https://protobuf.dev/programming-guides/encoding/), whatever
 * the host's byte order. No allocation per row: one bytes object per call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    Py_buffer view;
    int held;
} Column;

static int column(PyObject *obj, Column *c, Py_ssize_t itemsize, const char *formats,
                  const char *name) {
    c->held = 0;
    if (obj == Py_None) {
        return 0;
    }
    if (PyObject_GetBuffer(obj, &c->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    c->held = 1;
    const char *fmt = c->view.format ? c->view.format : "B";
    if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@') {
        fmt++;
    }
    if (c->view.itemsize != itemsize || c->view.ndim != 1 || fmt[1] != '\0' ||
        strchr(formats, fmt[0]) == NULL) {
        PyErr_Format(PyExc_TypeError, "%s: a column of %zd-byte '%s' items is needed", name,
                     itemsize, formats);
        return -1;
    }
    return 0;
}

static void release(Column *c) {
    if (c->held) {
        PyBuffer_Release(&c->view);
        c->held = 0;
    }
}

static inline Py_ssize_t length(const Column *c) { return c->view.len / c->view.itemsize; }

static inline char *put64(char *out, uint8_t tag, uint64_t v) {
    *out++ = (char)tag;
    for (int k = 0; k < 8; k++) {
        out[k] = (char)(v >> (8 * k));
    }
    return out + 8;
}

static PyObject *pack_points(PyObject *self, PyObject *args) {
    PyObject *heads, *head_index, *times, *values, *starts, *order;
    int as_int;
    if (!PyArg_ParseTuple(args, "OOOOOpO:pack_points", &heads, &head_index, &times, &values,
                          &starts, &as_int, &order)) {
        return NULL;
    }
    if (!PyList_Check(heads)) {
        PyErr_SetString(PyExc_TypeError, "heads: a list of bytes is needed");
        return NULL;
    }
    Column hi, t, v, s, o;
    PyObject *result = NULL;
    hi.held = t.held = v.held = s.held = o.held = 0;
    if (column(head_index, &hi, 4, "I", "head_index") < 0 || column(times, &t, 8, "qlL", "times") < 0 ||
        column(values, &v, 8, as_int ? "qlL" : "d", "values") < 0 ||
        column(starts, &s, 8, "qlL", "starts") < 0 || column(order, &o, 8, "qlL", "order") < 0) {
        goto done;
    }
    if (!t.held || !v.held) {
        PyErr_SetString(PyExc_TypeError, "times and values are needed");
        goto done;
    }
    Py_ssize_t n = length(&t);
    Py_ssize_t nheads = PyList_GET_SIZE(heads);
    if (length(&v) != n || (s.held && length(&s) != n) || (hi.held && length(&hi) != n) ||
        (!hi.held && nheads != n)) {
        PyErr_SetString(PyExc_ValueError, "columns of different lengths");
        goto done;
    }
    Py_ssize_t rows = o.held ? length(&o) : n;
    const int64_t *ord = o.held ? (const int64_t *)o.view.buf : NULL;
    const uint32_t *hix = hi.held ? (const uint32_t *)hi.view.buf : NULL;
    const uint64_t *tv = (const uint64_t *)t.view.buf;
    const uint64_t *vv = (const uint64_t *)v.view.buf;
    const uint64_t *sv = s.held ? (const uint64_t *)s.view.buf : NULL;
    for (Py_ssize_t h = 0; h < nheads; h++) {
        if (!PyBytes_Check(PyList_GET_ITEM(heads, h))) {
            PyErr_SetString(PyExc_TypeError, "heads: a list of bytes is needed");
            goto done;
        }
    }
    Py_ssize_t body = s.held ? 27 : 18;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < rows; i++) {  /* first pass: validate indexes, size the result */
        Py_ssize_t r = ord ? (Py_ssize_t)ord[i] : i;
        if (r < 0 || r >= n) {
            PyErr_SetString(PyExc_IndexError, "order: row index out of range");
            goto done;
        }
        Py_ssize_t h = hix ? (Py_ssize_t)hix[r] : r;
        if (h >= nheads) {
            PyErr_SetString(PyExc_IndexError, "head_index: head out of range");
            goto done;
        }
        total += PyBytes_GET_SIZE(PyList_GET_ITEM(heads, h)) + body;
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) {
        goto done;
    }
    char *out = PyBytes_AS_STRING(result);
    uint8_t value_tag = as_int ? 0x31 : 0x21;
    for (Py_ssize_t i = 0; i < rows; i++) {
        Py_ssize_t r = ord ? (Py_ssize_t)ord[i] : i;
        PyObject *head = PyList_GET_ITEM(heads, hix ? (Py_ssize_t)hix[r] : r);
        Py_ssize_t hl = PyBytes_GET_SIZE(head);
        memcpy(out, PyBytes_AS_STRING(head), (size_t)hl);
        out += hl;
        if (sv) {
            out = put64(out, 0x11, sv[r]);
        }
        out = put64(out, 0x19, tv[r]);
        out = put64(out, value_tag, vv[r]);  /* the same 8 bytes for int64 and IEEE double */
    }
done:
    release(&hi);
    release(&t);
    release(&v);
    release(&s);
    release(&o);
    return result;
}

static void merge_sort(int64_t *idx, int64_t *tmp, const int64_t *keys, Py_ssize_t n) {
    /* bottom-up, stable: equal keys keep their order */
    for (Py_ssize_t width = 1; width < n; width *= 2) {
        for (Py_ssize_t lo = 0; lo < n; lo += 2 * width) {
            Py_ssize_t mid = lo + width < n ? lo + width : n;
            Py_ssize_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            Py_ssize_t a = lo, b = mid, k = lo;
            if (mid >= hi || keys[idx[mid - 1]] <= keys[idx[mid]]) {
                memcpy(tmp + lo, idx + lo, (size_t)(hi - lo) * sizeof(int64_t));
                continue;  /* already in order: the common case of sorted runs */
            }
            while (a < mid && b < hi) {
                tmp[k++] = keys[idx[b]] < keys[idx[a]] ? idx[b++] : idx[a++];
            }
            while (a < mid) tmp[k++] = idx[a++];
            while (b < hi) tmp[k++] = idx[b++];
        }
        memcpy(idx, tmp, (size_t)n * sizeof(int64_t));
    }
}

static PyObject *order_runs(PyObject *self, PyObject *arg) {
    Column k;
    if (column(arg, &k, 8, "qlL", "keys") < 0) {
        release(&k);
        return NULL;
    }
    if (!k.held) {
        PyErr_SetString(PyExc_TypeError, "keys: a column of int64 is needed");
        return NULL;
    }
    Py_ssize_t n = length(&k);
    const int64_t *keys = (const int64_t *)k.view.buf;
    PyObject *order = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    PyObject *runs = PyList_New(0);
    int64_t *tmp = n ? PyMem_Malloc((size_t)n * sizeof(int64_t)) : NULL;
    PyObject *result = NULL;
    if (order == NULL || runs == NULL || (n && tmp == NULL)) {
        if (n && tmp == NULL) PyErr_NoMemory();
        goto done;
    }
    int64_t *idx = (int64_t *)PyBytes_AS_STRING(order);
    for (Py_ssize_t i = 0; i < n; i++) {
        idx[i] = i;
    }
    merge_sort(idx, tmp, keys, n);
    for (Py_ssize_t i = 0; i < n;) {
        Py_ssize_t j = i + 1;
        while (j < n && keys[idx[j]] == keys[idx[i]]) j++;
        PyObject *run = Py_BuildValue("(Lnn)", (long long)keys[idx[i]], i, j);
        if (run == NULL || PyList_Append(runs, run) < 0) {
            Py_XDECREF(run);
            goto done;
        }
        Py_DECREF(run);
        i = j;
    }
    result = PyTuple_Pack(2, order, runs);
done:
    Py_XDECREF(order);
    Py_XDECREF(runs);
    PyMem_Free(tmp);
    release(&k);
    return result;
}

static inline Py_ssize_t vlen(uint64_t v) {
    Py_ssize_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline char *put_varint(char *out, uint64_t v) {
    while (v >= 0x80) {
        *out++ = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *out++ = (char)v;
    return out;
}

static inline char *put_bytes(char *out, const char *src, Py_ssize_t n) {
    memcpy(out, src, (size_t)n);
    return out + n;
}

typedef struct {
    const char *header, *trailer, *blob;
    Py_ssize_t header_len, trailer_len, blob_len;
    PyObject *runs; /* list of (pid, start, end, count) by pid */
    Py_ssize_t nruns, at;
} Metric;

typedef struct {
    Py_ssize_t start, end; /* in the metric's blob; start < 0: the pid has no run */
} Match;

static int run_at(Metric *m, Py_ssize_t i, long long *pid, Py_ssize_t *start, Py_ssize_t *end,
                  long long *count) {
    PyObject *run = PyList_GET_ITEM(m->runs, i);
    if (!PyTuple_Check(run) || PyTuple_GET_SIZE(run) != 4) {
        PyErr_SetString(PyExc_TypeError, "runs: (pid, start, end, count) tuples are needed");
        return -1;
    }
    *pid = PyLong_AsLongLong(PyTuple_GET_ITEM(run, 0));
    *start = PyLong_AsSsize_t(PyTuple_GET_ITEM(run, 1));
    *end = PyLong_AsSsize_t(PyTuple_GET_ITEM(run, 2));
    *count = PyLong_AsLongLong(PyTuple_GET_ITEM(run, 3));
    if (PyErr_Occurred()) {
        return -1;
    }
    if (*start < 0 || *end < *start || *end > m->blob_len) {
        PyErr_SetString(PyExc_ValueError, "runs: a byte range outside its blob");
        return -1;
    }
    return 0;
}

static PyObject *frame_resources(PyObject *self, PyObject *args) {
    PyObject *first, *pids, *resources, *scope_head, *scope_tail, *metrics;
    Py_ssize_t first_points, budget;
    if (!PyArg_ParseTuple(args, "OnO!O!SSO!n:frame_resources", &first, &first_points,
                          &PyList_Type, &pids, &PyList_Type, &resources, &scope_head, &scope_tail,
                          &PyList_Type, &metrics, &budget)) {
        return NULL;
    }
    Py_ssize_t first_len = 0;
    if (first != Py_None) {
        if (!PyList_Check(first)) {
            PyErr_SetString(PyExc_TypeError, "first: a list of bytes or None is needed");
            return NULL;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(first); i++) {
            if (!PyBytes_Check(PyList_GET_ITEM(first, i))) {
                PyErr_SetString(PyExc_TypeError, "first: a list of bytes or None is needed");
                return NULL;
            }
            first_len += PyBytes_GET_SIZE(PyList_GET_ITEM(first, i));
        }
    }
    Py_ssize_t np = PyList_GET_SIZE(pids), nm = PyList_GET_SIZE(metrics);
    if (PyList_GET_SIZE(resources) != np) {
        PyErr_SetString(PyExc_ValueError, "pids and resources of different lengths");
        return NULL;
    }
    PyObject *out = PyList_New(0), *dropped = PyList_New(0);
    Metric *ms = PyMem_Calloc(nm ? (size_t)nm : 1, sizeof(Metric));
    Match *match = PyMem_Calloc(np * nm > 0 ? (size_t)(np * nm) : 1, sizeof(Match));
    Py_ssize_t *sizes = PyMem_Calloc(np ? (size_t)np : 1, sizeof(Py_ssize_t));
    long long *points = PyMem_Calloc(np ? (size_t)np : 1, sizeof(long long));
    Py_ssize_t *smsizes = PyMem_Calloc(np ? (size_t)np : 1, sizeof(Py_ssize_t));
    if (out == NULL || dropped == NULL || ms == NULL || match == NULL || sizes == NULL ||
        points == NULL || smsizes == NULL) {
        if (out != NULL && dropped != NULL) PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t k = 0; k < nm; k++) {
        PyObject *t = PyList_GET_ITEM(metrics, k);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4 || !PyBytes_Check(PyTuple_GET_ITEM(t, 0)) ||
            !PyBytes_Check(PyTuple_GET_ITEM(t, 1)) || !PyBytes_Check(PyTuple_GET_ITEM(t, 2)) ||
            !PyList_Check(PyTuple_GET_ITEM(t, 3))) {
            PyErr_SetString(PyExc_TypeError, "metrics: (header, trailer, blob, runs) is needed");
            goto fail;
        }
        Metric *m = &ms[k];
        m->header = PyBytes_AS_STRING(PyTuple_GET_ITEM(t, 0));
        m->header_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, 0));
        m->trailer = PyBytes_AS_STRING(PyTuple_GET_ITEM(t, 1));
        m->trailer_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, 1));
        m->blob = PyBytes_AS_STRING(PyTuple_GET_ITEM(t, 2));
        m->blob_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, 2));
        m->runs = PyTuple_GET_ITEM(t, 3);
        m->nruns = PyList_GET_SIZE(m->runs);
        m->at = 0;
    }
    Py_ssize_t head_len = PyBytes_GET_SIZE(scope_head), tail_len = PyBytes_GET_SIZE(scope_tail);
    for (Py_ssize_t p = 0; p < np; p++) {  /* pass 1: each resource's size and points */
        PyObject *res = PyList_GET_ITEM(resources, p);
        if (!PyBytes_Check(res)) {
            PyErr_SetString(PyExc_TypeError, "resources: a list of bytes is needed");
            goto fail;
        }
        long long pid = PyLong_AsLongLong(PyList_GET_ITEM(pids, p));
        if (pid == -1 && PyErr_Occurred()) goto fail;
        Py_ssize_t sm = head_len + tail_len;
        for (Py_ssize_t k = 0; k < nm; k++) {
            Metric *m = &ms[k];
            Match *mt = &match[p * nm + k];
            mt->start = -1;
            long long rpid, count;
            Py_ssize_t start, end;
            while (m->at < m->nruns) {
                if (run_at(m, m->at, &rpid, &start, &end, &count) < 0) goto fail;
                if (rpid >= pid) break;
                m->at++;  /* a pid without a resource (dropped by relabeling) */
            }
            if (m->at >= m->nruns || rpid != pid) continue;
            m->at++;
            mt->start = start;
            mt->end = end;
            Py_ssize_t data = end - start;
            Py_ssize_t msize = m->header_len + vlen((uint64_t)(data + m->trailer_len)) + data +
                               m->trailer_len;
            sm += 1 + vlen((uint64_t)msize) + msize;
            points[p] += count;
        }
        smsizes[p] = sm;
        Py_ssize_t rm = PyBytes_GET_SIZE(res) + 1 + vlen((uint64_t)sm) + sm;
        sizes[p] = 1 + vlen((uint64_t)rm) + rm;
    }
    Py_ssize_t used = 0;
    if (first_len > 0) {  /* the first part: its pieces written once, never joined first */
        PyObject *data = PyBytes_FromStringAndSize(NULL, first_len);
        if (data == NULL) goto fail;
        char *o = PyBytes_AS_STRING(data);
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(first); i++) {
            PyObject *piece = PyList_GET_ITEM(first, i);
            o = put_bytes(o, PyBytes_AS_STRING(piece), PyBytes_GET_SIZE(piece));
        }
        PyObject *item = Py_BuildValue("(Nn)", data, first_points);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        used = first_len;
    }
    for (Py_ssize_t p = 0; p < np; p++) {  /* pass 2: each resource that fits, written */
        if (budget > 0 && used + sizes[p] > budget) {
            PyObject *item = Py_BuildValue("(OL)", PyList_GET_ITEM(pids, p), points[p]);
            if (item == NULL || PyList_Append(dropped, item) < 0) {
                Py_XDECREF(item);
                goto fail;
            }
            Py_DECREF(item);
            continue;
        }
        PyObject *data = PyBytes_FromStringAndSize(NULL, sizes[p]);
        if (data == NULL) goto fail;
        char *o = PyBytes_AS_STRING(data);
        PyObject *res = PyList_GET_ITEM(resources, p);
        Py_ssize_t sm = smsizes[p];
        Py_ssize_t rm = PyBytes_GET_SIZE(res) + 1 + vlen((uint64_t)sm) + sm;
        *o++ = 0x0a;
        o = put_varint(o, (uint64_t)rm);
        o = put_bytes(o, PyBytes_AS_STRING(res), PyBytes_GET_SIZE(res));
        *o++ = 0x12;
        o = put_varint(o, (uint64_t)sm);
        o = put_bytes(o, PyBytes_AS_STRING(scope_head), head_len);
        for (Py_ssize_t k = 0; k < nm; k++) {
            Match *mt = &match[p * nm + k];
            if (mt->start < 0) continue;
            Metric *m = &ms[k];
            Py_ssize_t d = mt->end - mt->start;
            Py_ssize_t msize =
                m->header_len + vlen((uint64_t)(d + m->trailer_len)) + d + m->trailer_len;
            *o++ = 0x12;
            o = put_varint(o, (uint64_t)msize);
            o = put_bytes(o, m->header, m->header_len);
            o = put_varint(o, (uint64_t)(d + m->trailer_len));
            o = put_bytes(o, m->blob + mt->start, d);
            o = put_bytes(o, m->trailer, m->trailer_len);
        }
        o = put_bytes(o, PyBytes_AS_STRING(scope_tail), tail_len);
        PyObject *item = Py_BuildValue("(NL)", data, points[p]);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        used += sizes[p];
    }
    PyMem_Free(ms);
    PyMem_Free(match);
    PyMem_Free(sizes);
    PyMem_Free(points);
    PyMem_Free(smsizes);
    return Py_BuildValue("(NN)", out, dropped);
fail:
    Py_XDECREF(out);
    Py_XDECREF(dropped);
    PyMem_Free(ms);
    PyMem_Free(match);
    PyMem_Free(sizes);
    PyMem_Free(points);
    PyMem_Free(smsizes);
    return NULL;
}

static PyMethodDef methods[] = {
    {"pack_points", pack_points, METH_VARARGS, "Serialize data points from columns (see bulk.py)."},
    {"order_runs", order_runs, METH_O, "Stable order of int64 keys and their runs (see kernels.py)."},
    {"frame_resources", frame_resources, METH_VARARGS,
     "Per-process ResourceMetrics framed into requests (see kernels.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_wire", "Compiled kernels of gpumetrics.metrics.bulk.", -1, methods,
};

PyMODINIT_FUNC PyInit__wire(void) { return PyModule_Create(&module); }
