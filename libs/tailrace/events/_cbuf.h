/* What the C extensions (`_cwire.c`, `_cjson.c`) share: a growable byte buffer, reading
 * protobuf fields, and the test that PostgreSQL's numeric text is already what
 * str(Decimal(text)) spells. Static functions: each extension gets its own copy. */
#ifndef TAILRACE_CBUF_H
#define TAILRACE_CBUF_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* -- A growable byte buffer ------------------------------------------------------------ */

typedef struct {
    char *data;
    Py_ssize_t size;
    Py_ssize_t cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t more) {
    if (b->size + more <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->size + more) cap *= 2;
    char *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) { PyErr_NoMemory(); return -1; }
    b->data = data;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const char *src, Py_ssize_t n) {
    if (n == 0) return 0;  /* b->data may still be NULL: memcpy(NULL, .., 0) is UB */
    if (buf_grow(b, n) < 0) return -1;
    memcpy(b->data + b->size, src, n);
    b->size += n;
    return 0;
}

static PyObject *buf_bytes(Buf *b) {
    PyObject *out = PyBytes_FromStringAndSize(b->data ? b->data : "", b->size);
    b->size = 0;
    return out;
}

static void buf_free(Buf *b) { PyMem_Free(b->data); b->data = NULL; b->size = b->cap = 0; }

/* -- Reading protobuf ------------------------------------------------------------------ */

static const char *read_varint(const char *p, const char *end, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
        unsigned char c = (unsigned char)*p++;
        v |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) { *out = v; return p; }
    }
    return NULL;
}

typedef struct {
    uint64_t number;
    int wire;            /* 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
    uint64_t value;      /* wire types 0, 1 and 5 */
    const char *data;    /* wire type 2: the field's bytes (NULL otherwise) */
    uint64_t size;
} PbField;

/* The field at p, read into f; the position after it, or NULL when malformed (or a group,
 * which no message of ours holds). */
static const char *pb_field(const char *p, const char *end, PbField *f) {
    uint64_t key;
    if ((p = read_varint(p, end, &key)) == NULL) return NULL;
    f->number = key >> 3;
    f->wire = (int)(key & 7);
    f->value = f->size = 0;
    f->data = NULL;
    switch (f->wire) {
    case 0: return read_varint(p, end, &f->value);
    case 1:
    case 5: {
        int width = f->wire == 1 ? 8 : 4;
        if (end - p < width) return NULL;
        for (int i = width - 1; i >= 0; i--) f->value = (f->value << 8) | (unsigned char)p[i];
        return p + width;
    }
    case 2:
        if ((p = read_varint(p, end, &f->size)) == NULL || (uint64_t)(end - p) < f->size) return NULL;
        f->data = p;
        return p + f->size;
    }
    return NULL;
}

/* -- Numerics -------------------------------------------------------------------------- */

/* PostgreSQL's numeric text, passed through when str(Decimal(text)) spells it the same:
 * plain digits whose adjusted exponent is at least -6 (below it Decimal switches to
 * E-notation). */
static int pg_numeric_plain(const char *s, Py_ssize_t n) {
    Py_ssize_t i = 0, first = -1, point = -1, count = 0;
    if (i < n && s[i] == '-') i++;
    if (i == n) return 0;
    for (; i < n; i++) {
        if (s[i] == '.') { if (point >= 0) return 0; point = i; continue; }
        if (s[i] < '0' || s[i] > '9') return 0;
        if (first < 0 && s[i] != '0') first = i;
        count++;
    }
    if (count == 0 || s[n - 1] == '.' || s[s[0] == '-'] == '.') return 0;
    Py_ssize_t frac = point >= 0 ? n - point - 1 : 0;
    Py_ssize_t lead = s[0] == '-' ? 1 : 0;
    if (lead < n - 1 && s[lead] == '0' && s[lead + 1] != '.') return 0;  /* "007" */
    Py_ssize_t significant;
    if (first < 0) significant = 1;  /* zero: one digit */
    else {
        significant = 0;
        for (Py_ssize_t j = first; j < n; j++) if (s[j] != '.') significant++;
    }
    return -frac + significant - 1 >= -6;
}

#endif
