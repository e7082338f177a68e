/* The hot loops of `_wire.py` in C: the same bytes, without a Python call per value.
 *
 * Each function here has a pure-Python twin in `_wire.py` (or the module that uses it);
 * tests/unit/test_wire.py holds each pair to byte-identical output. Anything the fast
 * paths do not recognise goes to the Python twin (a `fallback` callable), so the C side
 * only ever handles input whose encoding it knows exactly.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <stdint.h>
#include <string.h>

#include "_cbuf.h"

static int varint_len(uint64_t n) {
    int len = 1;
    while (n > 0x7F) { n >>= 7; len++; }
    return len;
}

static char *varint_write(char *out, uint64_t n) {
    while (n > 0x7F) { *out++ = (char)((n & 0x7F) | 0x80); n >>= 7; }
    *out++ = (char)n;
    return out;
}

static int buf_varint(Buf *b, uint64_t n) {
    if (buf_grow(b, 10) < 0) return -1;
    b->size = varint_write(b->data + b->size, n) - b->data;
    return 0;
}

/* a length-delimited field: key (tag, wire type 2), size, data */
static int buf_field(Buf *b, uint32_t tag, const char *data, Py_ssize_t n) {
    if (buf_varint(b, ((uint64_t)tag << 3) | 2) < 0 || buf_varint(b, (uint64_t)n) < 0) return -1;
    return buf_put(b, data, n);
}

/* -- Varints and fields ---------------------------------------------------------------- */

static PyObject *py_varint(PyObject *self, PyObject *arg) {
    uint64_t n = PyLong_AsUnsignedLongLongMask(arg);  /* as `n & (2**64 - 1)` */
    if (n == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    char out[10];
    return PyBytes_FromStringAndSize(out, varint_write(out, n) - out);
}

static PyObject *py_length_prefixed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) { PyErr_SetString(PyExc_TypeError, "length_prefixed(tag, data)"); return NULL; }
    long tag = PyLong_AsLong(args[0]);
    if (tag == -1 && PyErr_Occurred()) return NULL;
    char *data; Py_ssize_t n;
    if (PyBytes_AsStringAndSize(args[1], &data, &n) < 0) return NULL;
    Py_ssize_t head = varint_len(((uint64_t)tag << 3) | 2) + varint_len((uint64_t)n);
    PyObject *out = PyBytes_FromStringAndSize(NULL, head + n);
    if (out == NULL) return NULL;
    char *p = PyBytes_AS_STRING(out);
    p = varint_write(p, ((uint64_t)tag << 3) | 2);
    p = varint_write(p, (uint64_t)n);
    memcpy(p, data, n);
    return out;
}

/* -- Values ---------------------------------------------------------------------------- */

/* Value.sint_value (4, zigzag) below 2**63, Value.uint_value (5) up to 2**64 - 1 */
static int buf_value_int(Buf *b, int64_t n) {
    if (buf_put(b, "\x20", 1) < 0) return -1;
    return buf_varint(b, ((uint64_t)n << 1) ^ (uint64_t)(n >> 63));
}

/* Value.uint_value (5) only past int64, as `value_int` chooses */
static int buf_value_uint(Buf *b, uint64_t u) {
    if (u < ((uint64_t)1 << 63)) return buf_value_int(b, (int64_t)u);
    return buf_put(b, "\x28", 1) < 0 ? -1 : buf_varint(b, u);
}

/* Value.float_value (6): fixed64, little-endian */
static int buf_value_double(Buf *b, double x) {
    char out[9] = {0x31};
    if (PyFloat_Pack8(x, out + 1, 1) < 0) return -1;
    return buf_put(b, out, 9);
}

static int buf_value_pylong(Buf *b, PyObject *obj) {
    int overflow;
    long long n = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (n == -1 && PyErr_Occurred()) return -1;
    if (!overflow) return buf_value_int(b, n);
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(obj);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Format(PyExc_ValueError, "integer %R is out of range for a Value (uint64)", obj);
            return -1;
        }
        return buf_value_uint(b, u);
    }
    PyErr_Format(PyExc_ValueError, "integer %R is out of range for a Value (int64)", obj);
    return -1;
}

static PyObject *py_value_int(PyObject *self, PyObject *arg) {
    if (!PyLong_Check(arg)) { PyErr_SetString(PyExc_TypeError, "value_int(int)"); return NULL; }
    Buf b = {0};
    if (buf_value_pylong(&b, arg) < 0) { buf_free(&b); return NULL; }
    PyObject *out = buf_bytes(&b);
    buf_free(&b);
    return out;
}

static int buf_value_string(Buf *b, uint32_t tag, PyObject *text) {
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &n);
    if (utf8 == NULL) return -1;
    return buf_field(b, tag, utf8, n);
}

/* Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const unsigned yoe = (unsigned)(y - era * 400);
    const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

static int digits(const char *s, int n, int *out) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

static int days_in_month(int y, int m) {
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m == 2 && (y % 4 == 0 && (y % 100 != 0 || y % 400 == 0))) return 29;
    return days[m - 1];
}

/* PostgreSQL's ISO text of a timestamp[tz] ("2026-11-24 10:34:05.123456+05:30") as
 * microseconds since the epoch; 0 when it is anything else (BC, infinity, a 5-digit
 * year...): the caller's Python encoder decides then. */
static int parse_pg_timestamp(const char *s, Py_ssize_t n, int64_t *micros, int *aware) {
    int y, mo, d, h, mi, sec, frac = 0;
    if (n < 19 || s[4] != '-' || s[7] != '-' || s[10] != ' ' || s[13] != ':' || s[16] != ':')
        return 0;
    if (digits(s, 4, &y) || digits(s + 5, 2, &mo) || digits(s + 8, 2, &d) ||
        digits(s + 11, 2, &h) || digits(s + 14, 2, &mi) || digits(s + 17, 2, &sec))
        return 0;
    if (y < 1 || mo < 1 || mo > 12 || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 ||
        sec > 59)
        return 0;
    Py_ssize_t i = 19;
    if (i < n && s[i] == '.') {
        int k = 0;
        i++;
        while (i < n && s[i] >= '0' && s[i] <= '9' && k < 6) { frac = frac * 10 + (s[i] - '0'); i++; k++; }
        if (k == 0 || (i < n && s[i] >= '0' && s[i] <= '9')) return 0;
        for (; k < 6; k++) frac *= 10;
    }
    int64_t offset = 0;
    *aware = 0;
    if (i < n) {
        if (s[i] != '+' && s[i] != '-') return 0;
        int sign = s[i] == '-' ? -1 : 1, oh, om = 0, os = 0;
        i++;
        if (i + 2 > n || digits(s + i, 2, &oh)) return 0;
        i += 2;
        if (i < n) {
            if (s[i] != ':' || i + 3 > n || digits(s + i + 1, 2, &om)) return 0;
            i += 3;
        }
        if (i < n) {
            if (s[i] != ':' || i + 3 > n || digits(s + i + 1, 2, &os)) return 0;
            i += 3;
        }
        if (i != n || oh > 23 || om > 59 || os > 59) return 0;
        offset = sign * (oh * 3600 + om * 60 + os);
        *aware = 1;
    }
    int64_t seconds = days_from_civil(y, (unsigned)mo, (unsigned)d) * 86400 + h * 3600 + mi * 60 + sec
                      - offset;
    *micros = seconds * 1000000 + frac;
    return 1;
}

/* Value.timestamp_value (11): Timestamp{micros (1), with_zone (2)} */
static int buf_value_timestamp(Buf *b, int64_t micros, int aware) {
    char inner[16], *p = inner;
    if (micros) { *p++ = 0x08; p = varint_write(p, (uint64_t)micros); }
    if (aware) { *p++ = 0x10; *p++ = 0x01; }
    if (buf_put(b, "\x5a", 1) < 0 || buf_varint(b, (uint64_t)(p - inner)) < 0) return -1;
    return buf_put(b, inner, p - inner);
}

enum {  /* tailrace.events._wire.Kind names them in Python */
    K_OTHER = 0, K_INT = 1, K_BOOL = 2, K_TEXT = 3, K_JSON = 4, K_UUID = 5, K_TIMESTAMP = 6,
    K_NUMERIC = 7, K_OBJECT = 8
};

/* A Python value as `_wire.value_bytes` encodes it, for the exact types it dispatches on
 * directly; 0: not one of them (the caller's fallback decides). */
static int buf_object_value(Buf *b, PyObject *obj) {
    if (PyLong_CheckExact(obj)) return buf_value_pylong(b, obj) < 0 ? -1 : 1;
    if (PyBool_Check(obj)) return buf_put(b, obj == Py_True ? "\x18\x01" : "\x18\x00", 2) < 0 ? -1 : 1;
    if (PyUnicode_CheckExact(obj)) return buf_value_string(b, 8, obj) < 0 ? -1 : 1;
    if (PyBytes_CheckExact(obj))
        return buf_field(b, 9, PyBytes_AS_STRING(obj), PyBytes_GET_SIZE(obj)) < 0 ? -1 : 1;
    if (PyFloat_CheckExact(obj)) return buf_value_double(b, PyFloat_AS_DOUBLE(obj)) < 0 ? -1 : 1;
    if (PyDateTime_CheckExact(obj)) {
        int64_t offset = 0, aware = 0;
        PyObject *tz = PyDateTime_DATE_GET_TZINFO(obj);
        if (tz != Py_None) {
            PyObject *delta = PyObject_CallMethod(obj, "utcoffset", NULL);
            if (delta == NULL) return -1;
            if (!PyDelta_Check(delta)) { Py_DECREF(delta); return 0; }
            offset = ((int64_t)PyDateTime_DELTA_GET_DAYS(delta) * 86400 +
                      PyDateTime_DELTA_GET_SECONDS(delta)) * 1000000 +
                     PyDateTime_DELTA_GET_MICROSECONDS(delta);
            Py_DECREF(delta);
            aware = 1;
        }
        int64_t seconds = days_from_civil(PyDateTime_GET_YEAR(obj), (unsigned)PyDateTime_GET_MONTH(obj),
                                          (unsigned)PyDateTime_GET_DAY(obj)) * 86400 +
                          PyDateTime_DATE_GET_HOUR(obj) * 3600 + PyDateTime_DATE_GET_MINUTE(obj) * 60 +
                          PyDateTime_DATE_GET_SECOND(obj);
        int64_t micros = seconds * 1000000 + PyDateTime_DATE_GET_MICROSECOND(obj) - offset;
        return buf_value_timestamp(b, micros, (int)aware) < 0 ? -1 : 1;
    }
    return 0;
}

/* One column's value: from the server's text (PostgreSQL's kinds) or from a Python value
 * (K_OBJECT); `fallback` for what the fast paths skip. */
static int buf_value(Buf *b, char kind, PyObject *text, PyObject *fallback) {
    if (text == Py_None) return buf_put(b, "\x08\x01", 2);
    Py_ssize_t n;
    const char *s;
    switch (kind) {
    case K_INT: {
        s = PyUnicode_AsUTF8AndSize(text, &n);
        if (s == NULL) return -1;
        if (n > 0 && n < 19) {  /* fits an int64 without overflow checks */
            Py_ssize_t i = s[0] == '-' ? 1 : 0;
            int64_t v = 0;
            if (i < n) {
                for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) v = v * 10 + (s[i] - '0');
                if (i == n) return buf_value_int(b, s[0] == '-' ? -v : v);
            }
        }
        break;
    }
    case K_BOOL:
        s = PyUnicode_AsUTF8AndSize(text, &n);
        if (s == NULL) return -1;
        return buf_put(b, n == 1 && s[0] == 't' ? "\x18\x01" : "\x18\x00", 2);
    case K_TEXT: return buf_value_string(b, 8, text);
    case K_JSON: return buf_value_string(b, 10, text);
    case K_UUID: return buf_value_string(b, 15, text);
    case K_TIMESTAMP: {
        int64_t micros; int aware;
        s = PyUnicode_AsUTF8AndSize(text, &n);
        if (s == NULL) return -1;
        if (parse_pg_timestamp(s, n, &micros, &aware)) return buf_value_timestamp(b, micros, aware);
        break;
    }
    case K_NUMERIC:
        s = PyUnicode_AsUTF8AndSize(text, &n);
        if (s == NULL) return -1;
        if (pg_numeric_plain(s, n)) return buf_field(b, 7, s, n);
        break;
    case K_OBJECT: {
        int done = buf_object_value(b, text);
        if (done != 0) return done < 0 ? -1 : 0;
        break;
    }
    }
    PyObject *encoded = PyObject_CallOneArg(fallback, text);
    if (encoded == NULL) return -1;
    char *data; Py_ssize_t size;
    int rc = PyBytes_AsStringAndSize(encoded, &data, &size);
    if (rc == 0) rc = buf_put(b, data, size);
    Py_DECREF(encoded);
    return rc;
}

/* values(kinds, fallbacks, texts) -> [Value bytes] */
static PyObject *py_values(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "values(kinds: bytes, fallbacks: tuple, texts)");
        return NULL;
    }
    const char *kinds = PyBytes_AS_STRING(args[0]);
    Py_ssize_t columns = PyBytes_GET_SIZE(args[0]);
    PyObject *texts = PySequence_Fast(args[2], "texts must be a sequence");
    if (texts == NULL) return NULL;
    if (PySequence_Fast_GET_SIZE(texts) != columns || PyTuple_GET_SIZE(args[1]) != columns) {
        Py_DECREF(texts);
        PyErr_SetString(PyExc_ValueError, "kinds, fallbacks and texts differ in length");
        return NULL;
    }
    PyObject *out = PyList_New(columns);
    Buf b = {0};
    for (Py_ssize_t c = 0; out != NULL && c < columns; c++) {
        PyObject *item = PySequence_Fast_GET_ITEM(texts, c);
        Py_INCREF(item);  /* held while a Python fallback runs */
        int rc = buf_value(&b, kinds[c], item, PyTuple_GET_ITEM(args[1], c));
        Py_DECREF(item);
        if (rc < 0) {
            Py_CLEAR(out);
            break;
        }
        PyObject *value = buf_bytes(&b);
        if (value == NULL) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, c, value);
    }
    buf_free(&b);
    Py_DECREF(texts);
    return out;
}

/* pg_tuple(payload, pos, kinds, fallbacks, toast) -> ([Value bytes], end): a pgoutput
 * TupleData at `pos` (proto_version 1: text, NULL or unchanged TOAST per column), each
 * text value as `buf_value` encodes it; `toast` is the unchanged-TOAST Value. The Python
 * twin and the error messages naming the column: capture_postgres/reader.py. */
static PyObject *py_pg_tuple(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[2]) || !PyTuple_Check(args[3]) ||
        !PyBytes_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "pg_tuple(payload: bytes, pos: int, kinds: bytes, fallbacks: tuple, toast: bytes)");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred()) return NULL;
    const char *kinds = PyBytes_AS_STRING(args[2]);
    Py_ssize_t columns = PyBytes_GET_SIZE(args[2]);
    if (PyTuple_GET_SIZE(args[3]) != columns) {
        PyErr_SetString(PyExc_ValueError, "pg_tuple: kinds and fallbacks differ in length");
        return NULL;
    }
    if (pos < 0 || pos + 2 > size) {
        PyErr_SetString(PyExc_ValueError, "pg_tuple: the tuple is cut short");
        return NULL;
    }
    Py_ssize_t count = ((Py_ssize_t)data[pos] << 8) | data[pos + 1];
    pos += 2;
    if (count != columns) {
        PyErr_Format(PyExc_ValueError, "pg_tuple: %zd columns, %zd expected", count, columns);
        return NULL;
    }
    PyObject *out = PyList_New(columns);
    if (out == NULL) return NULL;
    Buf b = {0};
    for (Py_ssize_t c = 0; c < columns; c++) {
        PyObject *value = NULL;
        if (pos >= size) {
            PyErr_SetString(PyExc_ValueError, "pg_tuple: the tuple is cut short");
            goto fail;
        }
        unsigned char kind = data[pos];
        if (kind == 't') {
            if (pos + 5 > size) {
                PyErr_SetString(PyExc_ValueError, "pg_tuple: the tuple is cut short");
                goto fail;
            }
            uint32_t length = ((uint32_t)data[pos + 1] << 24) | ((uint32_t)data[pos + 2] << 16) |
                              ((uint32_t)data[pos + 3] << 8) | data[pos + 4];
            pos += 5;
            if ((uint64_t)length > (uint64_t)(size - pos)) {
                PyErr_SetString(PyExc_ValueError, "pg_tuple: the tuple is cut short");
                goto fail;
            }
            Py_ssize_t n = (Py_ssize_t)length;
            PyObject *text = PyUnicode_DecodeUTF8((const char *)data + pos, n, NULL);
            if (text == NULL) goto fail;
            pos += n;
            b.size = 0;
            int rc = buf_value(&b, kinds[c], text, PyTuple_GET_ITEM(args[3], c));
            Py_DECREF(text);
            if (rc < 0) goto fail;
            value = buf_bytes(&b);
        } else if (kind == 'n') {
            pos += 1;
            value = PyBytes_FromStringAndSize("\x08\x01", 2);
        } else if (kind == 'u') {
            pos += 1;
            value = Py_NewRef(args[4]);
        } else {
            PyErr_Format(PyExc_ValueError, "pg_tuple: unsupported tuple value kind %c", kind);
            goto fail;
        }
        if (value == NULL) goto fail;
        PyList_SET_ITEM(out, c, value);
    }
    buf_free(&b);
    PyObject *result = Py_BuildValue("(Nn)", out, pos);
    return result;
fail:
    buf_free(&b);
    Py_DECREF(out);
    return NULL;
}

/* -- Rows ------------------------------------------------------------------------------ */

/* Row.columns (1): Column{prefix (name, type, value tag), size, value} */
static int buf_column(Buf *b, PyObject *prefix, const char *value, Py_ssize_t n) {
    Py_ssize_t p = PyBytes_GET_SIZE(prefix);
    Py_ssize_t column = p + varint_len((uint64_t)n) + n;
    if (buf_put(b, "\x0a", 1) < 0 || buf_varint(b, (uint64_t)column) < 0 ||
        buf_put(b, PyBytes_AS_STRING(prefix), p) < 0 || buf_varint(b, (uint64_t)n) < 0)
        return -1;
    return buf_put(b, value, n);
}

static PyObject *py_row_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) { PyErr_SetString(PyExc_TypeError, "row_bytes(prefixes, values)"); return NULL; }
    PyObject *prefixes = PySequence_Fast(args[0], "prefixes must be a sequence");
    if (prefixes == NULL) return NULL;
    PyObject *values = PySequence_Fast(args[1], "values must be a sequence");
    if (values == NULL) { Py_DECREF(prefixes); return NULL; }
    PyObject *out = NULL;
    Buf b = {0};
    Py_ssize_t n = PySequence_Fast_GET_SIZE(prefixes);
    if (PySequence_Fast_GET_SIZE(values) != n) {
        PyErr_SetString(PyExc_ValueError, "row_bytes: prefixes and values differ in length");
        goto done;
    }
    for (Py_ssize_t c = 0; c < n; c++) {
        PyObject *prefix = PySequence_Fast_GET_ITEM(prefixes, c);
        PyObject *value = PySequence_Fast_GET_ITEM(values, c);
        if (!PyBytes_Check(prefix) || !PyBytes_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "row_bytes: prefixes and values must be bytes");
            goto done;
        }
        if (buf_column(&b, prefix, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value)) < 0)
            goto done;
    }
    out = buf_bytes(&b);
done:
    buf_free(&b);
    Py_DECREF(prefixes);
    Py_DECREF(values);
    return out;
}

/* One row's values (`values`, split at `starts`) and its serialized Row (`row`). */
static int chunk_row(Buf *values, Buf *row, PyObject *raw, const char *kinds, PyObject *fallbacks,
                     PyObject *prefixes, Py_ssize_t *starts, Py_ssize_t columns) {
    values->size = 0;
    for (Py_ssize_t c = 0; c < columns; c++) {
        starts[c] = values->size;
        if (buf_value(values, kinds[c], PyTuple_GET_ITEM(raw, c), PyTuple_GET_ITEM(fallbacks, c)) < 0)
            return -1;
    }
    starts[columns] = values->size;
    row->size = 0;
    for (Py_ssize_t c = 0; c < columns; c++)
        if (buf_column(row, PyTuple_GET_ITEM(prefixes, c), values->data + starts[c],
                       starts[c + 1] - starts[c]) < 0)
            return -1;
    return 0;
}

/* chunk_rows(raw_rows, kinds, fallbacks, prefixes, key_index, bus_index, head)
 *   -> {key: (bus_key, row)}: a snapshot chunk's rows (each connector's snapshot.py). */
static PyObject *py_chunk_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyList_Check(args[0]) || !PyBytes_Check(args[1]) || !PyTuple_Check(args[2]) ||
        !PyTuple_Check(args[3]) || !PyTuple_Check(args[4]) || !PyTuple_Check(args[5]) ||
        !PyBytes_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "chunk_rows(list, bytes, tuple, tuple, tuple, tuple, bytes)");
        return NULL;
    }
    PyObject *raw_rows = args[0], *fallbacks = args[2], *prefixes = args[3];
    PyObject *key_index = args[4], *bus_index = args[5], *head = args[6];
    const char *kinds = PyBytes_AS_STRING(args[1]);
    Py_ssize_t columns = PyBytes_GET_SIZE(args[1]);
    Py_ssize_t nkeys = PyTuple_GET_SIZE(key_index), nbus = PyTuple_GET_SIZE(bus_index);
    if (PyTuple_GET_SIZE(fallbacks) != columns || PyTuple_GET_SIZE(prefixes) != columns) {
        PyErr_SetString(PyExc_ValueError, "chunk_rows: kinds, fallbacks, prefixes differ in length");
        return NULL;
    }
    Py_ssize_t *keys = PyMem_Calloc((size_t)(nkeys + nbus + 1), sizeof(Py_ssize_t));
    Py_ssize_t *starts = PyMem_Calloc((size_t)columns + 1, sizeof(Py_ssize_t));
    PyObject *out = PyDict_New();
    Buf values = {0}, row = {0};
    if (keys == NULL || starts == NULL) { PyErr_NoMemory(); goto fail; }
    if (out == NULL) goto fail;
    for (Py_ssize_t c = 0; c < columns; c++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(prefixes, c))) {
            PyErr_SetString(PyExc_TypeError, "chunk_rows: prefixes must be bytes");
            goto fail;
        }
    for (Py_ssize_t k = 0; k < nkeys + nbus; k++) {
        PyObject *index = PyTuple_GET_ITEM(k < nkeys ? key_index : bus_index, k < nkeys ? k : k - nkeys);
        keys[k] = PyLong_AsSsize_t(index);
        if (keys[k] < 0 || keys[k] >= columns) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "chunk_rows: key index");
            goto fail;
        }
    }
    for (Py_ssize_t r = 0; r < PyList_GET_SIZE(raw_rows); r++) {
        PyObject *raw = PyList_GET_ITEM(raw_rows, r);
        if (!PyTuple_Check(raw) || PyTuple_GET_SIZE(raw) != columns) {
            PyErr_SetString(PyExc_ValueError, "chunk_rows: a row is not a tuple of the columns");
            goto fail;
        }
        Py_INCREF(raw);  /* held while Python fallbacks run: they could change the list */
        int rc = chunk_row(&values, &row, raw, kinds, fallbacks, prefixes, starts, columns);
        Py_DECREF(raw);
        if (rc < 0) goto fail;
        PyObject *key = PyTuple_New(nkeys);
        if (key == NULL) goto fail;
        for (Py_ssize_t k = 0; k < nkeys; k++) {
            Py_ssize_t c = keys[k];
            PyObject *part = PyBytes_FromStringAndSize(values.data + starts[c], starts[c + 1] - starts[c]);
            if (part == NULL) { Py_DECREF(key); goto fail; }
            PyTuple_SET_ITEM(key, k, part);
        }
        Py_ssize_t bus_size = PyBytes_GET_SIZE(head) + nbus;  /* head, then "\0" + each value */
        for (Py_ssize_t k = nkeys; k < nkeys + nbus; k++) bus_size += starts[keys[k] + 1] - starts[keys[k]];
        PyObject *bus = PyBytes_FromStringAndSize(NULL, bus_size);
        PyObject *encoded = bus ? PyBytes_FromStringAndSize(row.data, row.size) : NULL;
        if (encoded == NULL) { Py_XDECREF(bus); Py_DECREF(key); goto fail; }
        char *p = PyBytes_AS_STRING(bus);
        memcpy(p, PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head));
        p += PyBytes_GET_SIZE(head);
        for (Py_ssize_t k = nkeys; k < nkeys + nbus; k++) {
            Py_ssize_t c = keys[k];
            *p++ = '\0';
            memcpy(p, values.data + starts[c], starts[c + 1] - starts[c]);
            p += starts[c + 1] - starts[c];
        }
        PyObject *pair = PyTuple_Pack(2, bus, encoded);
        Py_DECREF(bus);
        Py_DECREF(encoded);
        if (pair == NULL) { Py_DECREF(key); goto fail; }
        rc = PyDict_SetItem(out, key, pair);
        Py_DECREF(key);
        Py_DECREF(pair);
        if (rc < 0) goto fail;
    }
    buf_free(&values);
    buf_free(&row);
    PyMem_Free(keys);
    PyMem_Free(starts);
    return out;
fail:
    buf_free(&values);
    buf_free(&row);
    PyMem_Free(keys);
    PyMem_Free(starts);
    Py_XDECREF(out);
    return NULL;
}

/* -- A snapshot chunk's read transaction (capture/snapshot/records.py) ------------------ */

/* bytes or str (as UTF-8) -> its data; TypeError otherwise (read_records, change_records) */
static int bytes_of(PyObject *obj, const char **data, Py_ssize_t *n) {
    if (PyBytes_Check(obj)) { *data = PyBytes_AS_STRING(obj); *n = PyBytes_GET_SIZE(obj); return 0; }
    if (PyUnicode_Check(obj)) { *data = PyUnicode_AsUTF8AndSize(obj, n); return *data ? 0 : -1; }
    PyErr_Format(PyExc_TypeError, "expected bytes or str, not %.100s", Py_TYPE(obj)->tp_name);
    return -1;
}

/* read_records(common, where, mark, last, idempotency, eids, rows) -> [(key, record)] */
static PyObject *py_read_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1]) || !PyBytes_Check(args[2]) ||
        !PyBytes_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "read_records(bytes, bytes, bytes, bool, bytes, eids, rows)");
        return NULL;
    }
    PyObject *common = args[0], *where = args[1], *mark = args[2], *idempotency = args[4];
    int last = PyObject_IsTrue(args[3]);
    if (last < 0) return NULL;
    PyObject *eids = PySequence_Fast(args[5], "eids must be a sequence");
    if (eids == NULL) return NULL;
    PyObject *rows = PySequence_Fast(args[6], "rows must be a sequence");
    if (rows == NULL) { Py_DECREF(eids); return NULL; }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(rows);
    PyObject *out = NULL;
    Buf body = {0}, inner = {0}, record = {0};
    if (PySequence_Fast_GET_SIZE(eids) != size) {
        PyErr_SetString(PyExc_ValueError, "read_records: eids and rows differ in length");
        goto done;
    }
    out = PyList_New(size);
    if (out == NULL) goto done;
    for (Py_ssize_t index = 0; index < size; index++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(rows, index);
        const char *eid, *row;
        Py_ssize_t eid_n, row_n;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            bytes_of(PySequence_Fast_GET_ITEM(eids, index), &eid, &eid_n) < 0 ||
            bytes_of(PyTuple_GET_ITEM(pair, 1), &row, &row_n) < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "read_records: rows are (key, row)");
            goto fail;
        }
        int ending = index == size - 1;
        body.size = 0;
        if (buf_put(&body, PyBytes_AS_STRING(common), PyBytes_GET_SIZE(common)) < 0 ||
            buf_field(&body, 1, eid, eid_n) < 0)  /* id */
            goto fail;
        if (index && (buf_put(&body, "\x68", 1) < 0 || buf_varint(&body, (uint64_t)index) < 0))
            goto fail;  /* tx_index (13) */
        if (ending && buf_put(&body, "\x78\x01", 2) < 0) goto fail;  /* tx_end (15) */
        inner.size = 0;  /* position (16): the watermark's, event_index (2) = index */
        if (buf_put(&inner, PyBytes_AS_STRING(where), PyBytes_GET_SIZE(where)) < 0) goto fail;
        if (index && (buf_put(&inner, "\x10", 1) < 0 || buf_varint(&inner, (uint64_t)index) < 0))
            goto fail;
        if (buf_field(&body, 16, inner.data, inner.size) < 0) goto fail;
        inner.size = 0;  /* idempotency_key (21) */
        if (buf_put(&inner, PyBytes_AS_STRING(idempotency), PyBytes_GET_SIZE(idempotency)) < 0 ||
            buf_put(&inner, eid, eid_n) < 0 || buf_field(&body, 21, inner.data, inner.size) < 0 ||
            buf_field(&body, 9, row, row_n) < 0)  /* after (9) */
            goto fail;
        inner.size = 0;  /* snapshot (23): the mark, `last` (3) on the table's last event */
        if (buf_put(&inner, PyBytes_AS_STRING(mark), PyBytes_GET_SIZE(mark)) < 0) goto fail;
        if (ending && last && buf_put(&inner, "\x18\x01", 2) < 0) goto fail;
        if (buf_field(&body, 23, inner.data, inner.size) < 0) goto fail;
        record.size = 0;  /* BusRecord.event (1) */
        if (buf_field(&record, 1, body.data, body.size) < 0) goto fail;
        PyObject *encoded = buf_bytes(&record);
        if (encoded == NULL) goto fail;
        PyObject *item = PyTuple_Pack(2, PyTuple_GET_ITEM(pair, 0), encoded);
        Py_DECREF(encoded);
        if (item == NULL) goto fail;
        PyList_SET_ITEM(out, index, item);
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    buf_free(&body);
    buf_free(&inner);
    buf_free(&record);
    Py_DECREF(eids);
    Py_DECREF(rows);
    return out;
}

/* -- A streamed transaction's changes at its commit (capture/changes.py) ---------------- */

/* change_records(head, position, source_field, source_tx, idem_tx, eids, first, size,
 * changes) -> [(key, record)]: each `Change` (template, ident, source_field, at, rows,
 * key) stamped as event `first + i` of a transaction of `size` events. `head`: the
 * transaction's own event fields; `position`: the Position's fields but event_index and
 * the source's (`source_field`: its field number, `source_tx` its transaction-wide part,
 * the change's `at` the rest). The reference is changes.py `_py_change_records`. */
static PyObject *py_change_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1]) ||
        !PyLong_Check(args[2]) || !PyBytes_Check(args[3]) || !PyBytes_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "change_records(head: bytes, position: bytes, "
                        "source_field: int, source_tx: bytes, idem_tx: bytes, eids, first, size, changes)");
        return NULL;
    }
    PyObject *head = args[0], *position = args[1], *source_tx = args[3], *idem_tx = args[4];
    long source_field = PyLong_AsLong(args[2]);
    if (source_field == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t first = PyLong_AsSsize_t(args[6]);
    if (first == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t size = PyLong_AsSsize_t(args[7]);
    if (size == -1 && PyErr_Occurred()) return NULL;
    if (source_field < 1 || source_field > 15 || first < 0) {
        PyErr_SetString(PyExc_ValueError, "change_records: source_field is 1..15, first >= 0");
        return NULL;
    }
    PyObject *eids = PySequence_Fast(args[5], "eids must be a sequence");
    if (eids == NULL) return NULL;
    PyObject *changes = PySequence_Fast(args[8], "changes must be a sequence");
    if (changes == NULL) { Py_DECREF(eids); return NULL; }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(changes);
    PyObject *out = NULL;
    Buf body = {0}, where = {0}, inner = {0}, record = {0};
    if (PySequence_Fast_GET_SIZE(eids) != n || first + n > size) {
        PyErr_SetString(PyExc_ValueError, "change_records: eids and changes differ in length, "
                        "or the changes go past the transaction's size");
        goto done;
    }
    out = PyList_New(n);
    if (out == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *change = PySequence_Fast_GET_ITEM(changes, i);
        if (!PyTuple_Check(change) || PyTuple_GET_SIZE(change) != 6) {
            PyErr_SetString(PyExc_TypeError, "change_records: changes are Change tuples");
            goto fail;
        }
        const char *template, *ident, *at, *rows, *eid;
        Py_ssize_t template_n, ident_n, at_n, rows_n, eid_n;
        PyObject *key = PyTuple_GET_ITEM(change, 5);
        if (bytes_of(PyTuple_GET_ITEM(change, 0), &template, &template_n) < 0 ||
            bytes_of(PyTuple_GET_ITEM(change, 1), &ident, &ident_n) < 0 ||
            bytes_of(PyTuple_GET_ITEM(change, 3), &at, &at_n) < 0 ||
            bytes_of(PyTuple_GET_ITEM(change, 4), &rows, &rows_n) < 0 ||
            bytes_of(PySequence_Fast_GET_ITEM(eids, i), &eid, &eid_n) < 0 || !PyBytes_Check(key))
            goto fail;
        uint64_t index = (uint64_t)(first + i);
        int ending = first + i == size - 1;
        body.size = 0;
        if (buf_put(&body, template, template_n) < 0 ||
            buf_put(&body, PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head)) < 0 ||
            buf_field(&body, 1, eid, eid_n) < 0)  /* id */
            goto fail;
        if (index && (buf_put(&body, "\x68", 1) < 0 || buf_varint(&body, index) < 0))
            goto fail;  /* tx_index (13) */
        if (ending && buf_put(&body, "\x78\x01", 2) < 0) goto fail;  /* tx_end (15) */
        where.size = 0;  /* position (16) */
        if (buf_put(&where, PyBytes_AS_STRING(position), PyBytes_GET_SIZE(position)) < 0) goto fail;
        if (index && (buf_put(&where, "\x10", 1) < 0 || buf_varint(&where, index) < 0))
            goto fail;  /* event_index (2) */
        inner.size = 0;
        if (buf_put(&inner, PyBytes_AS_STRING(source_tx), PyBytes_GET_SIZE(source_tx)) < 0 ||
            buf_put(&inner, at, at_n) < 0 ||
            buf_field(&where, (uint32_t)source_field, inner.data ? inner.data : "", inner.size) < 0 ||
            buf_field(&body, 16, where.data, where.size) < 0)
            goto fail;
        inner.size = 0;  /* idempotency_key (21) */
        if (buf_put(&inner, ident, ident_n) < 0 ||
            buf_put(&inner, PyBytes_AS_STRING(idem_tx), PyBytes_GET_SIZE(idem_tx)) < 0 ||
            buf_put(&inner, eid, eid_n) < 0 || buf_field(&body, 21, inner.data, inner.size) < 0 ||
            buf_put(&body, rows, rows_n) < 0)  /* before (8), after (9) */
            goto fail;
        record.size = 0;  /* BusRecord.event (1) */
        if (buf_field(&record, 1, body.data, body.size) < 0) goto fail;
        PyObject *encoded = buf_bytes(&record);
        if (encoded == NULL) goto fail;
        PyObject *item = PyTuple_Pack(2, key, encoded);
        Py_DECREF(encoded);
        if (item == NULL) goto fail;
        PyList_SET_ITEM(out, i, item);
    }
    goto done;
fail:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "change_records: a Change holds bytes");
    Py_CLEAR(out);
done:
    buf_free(&body);
    buf_free(&where);
    buf_free(&inner);
    buf_free(&record);
    Py_DECREF(eids);
    Py_DECREF(changes);
    return out;
}

/* -- Event ids (tailrace/events/_ids.py `event_id`) ------------------------------------ */

/* SHA-256 (FIPS 180-4), for the few dozen bytes an event id hashes. */
static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(uint32_t h[8], const unsigned char *p) {
    uint32_t w[64], a, b, c, d, e, f, g, k;
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROTR(w[i - 15], 7) ^ ROTR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROTR(w[i - 2], 17) ^ ROTR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = h[0]; b = h[1]; c = h[2]; d = h[3]; e = h[4]; f = h[5]; g = h[6]; k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

/* the first 10 bytes of SHA-256(data): all an event id takes */
static void sha256_head(const unsigned char *data, size_t n, unsigned char out[10]) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    unsigned char block[64];
    size_t done = 0;
    for (; n - done >= 64; done += 64) sha256_block(h, data + done);
    size_t rest = n - done;
    memcpy(block, data + done, rest);
    block[rest++] = 0x80;
    if (rest > 56) {
        memset(block + rest, 0, 64 - rest);
        sha256_block(h, block);
        rest = 0;
    }
    memset(block + rest, 0, 56 - rest);
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++) block[63 - i] = (unsigned char)(bits >> (8 * i));
    sha256_block(h, block);
    for (int i = 0; i < 10; i++) out[i] = (unsigned char)(h[i / 4] >> (24 - 8 * (i % 4)));
}

/* event_ids(prefix, start, count, ts_ms) -> [event_id(...) for index in range(start,
 * start + count)], `prefix` being f"{source_id}|{native_tx}|" encoded */
static PyObject *py_event_ids(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "event_ids(prefix: bytes, start, count, ts_ms)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    if (count == -1 && PyErr_Occurred()) return NULL;
    uint64_t ts = PyLong_AsUnsignedLongLongMask(args[3]) & ((1ULL << 48) - 1);
    if (PyErr_Occurred()) return NULL;
    if (start < 0 || count < 0) { PyErr_SetString(PyExc_ValueError, "event_ids: negative index"); return NULL; }
    if (start > PY_SSIZE_T_MAX - count) { PyErr_SetString(PyExc_OverflowError, "event_ids: index"); return NULL; }
    Py_ssize_t plen = PyBytes_GET_SIZE(args[0]);
    unsigned char *message = PyMem_Malloc((size_t)plen + 24);
    PyObject *out = message ? PyList_New(count) : NULL;
    if (out == NULL) { PyMem_Free(message); return message ? NULL : PyErr_NoMemory(); }
    memcpy(message, PyBytes_AS_STRING(args[0]), (size_t)plen);
    static const char hex[] = "0123456789abcdef";
    for (Py_ssize_t i = 0; i < count; i++) {
        int len = snprintf((char *)message + plen, 24, "%zd", start + i);
        unsigned char d[10];
        sha256_head(message, (size_t)plen + (size_t)len, d);
        uint64_t rand_a = ((uint64_t)d[0] << 8 | d[1]) & 0x0FFF, rand_b = 0;
        for (int j = 2; j < 10; j++) rand_b = rand_b << 8 | d[j];
        uint64_t hi = ts << 16 | 0x7ULL << 12 | rand_a;
        uint64_t lo = 0x2ULL << 62 | (rand_b & ((1ULL << 62) - 1));
        char text[36], *p = text;
        for (int j = 0; j < 32; j++) {
            uint64_t word = j < 16 ? hi : lo;
            *p++ = hex[(word >> (60 - 4 * (j % 16))) & 0xF];
            if (j == 7 || j == 11 || j == 15 || j == 19) *p++ = '-';
        }
        PyObject *id = PyUnicode_FromStringAndSize(text, 36);
        if (id == NULL) { Py_DECREF(out); PyMem_Free(message); return NULL; }
        PyList_SET_ITEM(out, i, id);
    }
    PyMem_Free(message);
    return out;
}

/* -- Bus keys (tailrace/events/_codec.py `bus_key`) ------------------------------------ */

/* row_key(head, row, key_columns) -> head + ("\0" + serialized Value) per key column, in
 * the row's column order; None for a row it cannot read (the caller's Python decides). */
static PyObject *py_row_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "row_key(head: bytes, row: bytes, key_columns)");
        return NULL;
    }
    PyObject *names = PySequence_Fast(args[2], "key_columns must be a sequence");
    if (names == NULL) return NULL;
    Py_ssize_t nkeys = PySequence_Fast_GET_SIZE(names);
    const char *keys[16];
    Py_ssize_t key_sizes[16];
    if (nkeys > 16) { Py_DECREF(names); Py_RETURN_NONE; }
    for (Py_ssize_t k = 0; k < nkeys; k++) {
        keys[k] = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(names, k), &key_sizes[k]);
        if (keys[k] == NULL) { Py_DECREF(names); return NULL; }
    }
    Buf b = {0};
    const char *p = PyBytes_AS_STRING(args[1]), *end = p + PyBytes_GET_SIZE(args[1]);
    int ok = buf_put(&b, PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0])) == 0;
    while (ok && p < end) {
        PbField column, field;
        if ((p = pb_field(p, end, &column)) == NULL) { ok = 0; break; }
        if (column.number != 1 || column.data == NULL) continue;  /* Row.columns (1) only */
        /* Column: name (1), value (3); absent, they are "" and an empty Value */
        const char *q = column.data, *cend = column.data + column.size, *name = "", *value = "";
        uint64_t name_size = 0, value_size = 0;
        int values = 0;
        while (q < cend) {
            if ((q = pb_field(q, cend, &field)) == NULL) { ok = 0; break; }
            if (field.number == 1 && field.data != NULL) { name = field.data; name_size = field.size; }
            else if (field.number == 3 && field.data != NULL) {
                value = field.data; value_size = field.size; values++;
            }
        }
        if (!ok || values > 1) { ok = 0; break; }  /* a value in two parts: Python merges it */
        for (Py_ssize_t k = 0; k < nkeys; k++) {
            if ((uint64_t)key_sizes[k] == name_size && memcmp(keys[k], name, name_size) == 0) {
                ok = buf_put(&b, "\0", 1) == 0 && buf_put(&b, value, (Py_ssize_t)value_size) == 0;
                break;
            }
        }
    }
    Py_DECREF(names);
    if (!ok) {
        buf_free(&b);
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *out = buf_bytes(&b);
    buf_free(&b);
    return out;
}

/* -- MySQL/MariaDB binlog rows ---------------------------------------------------------- */

/* What `binlog_rows` reads a column as (`capture_mysql.values.BinlogKind` names them). */
enum {
    B_INT = 1, B_FLOAT = 2, B_DOUBLE = 3, B_DECIMAL = 4, B_DATE = 5, B_DATETIME2 = 6,
    B_TIMESTAMP2 = 7, B_TIME2 = 8, B_YEAR = 9, B_TEXT = 10, B_BYTES = 11, B_UUID = 12,
    B_ENUM = 13, B_SET = 14, B_BIT = 15
};

typedef struct {
    int kind;
    int a, b;             /* per kind: width/length size/fsp/precision, unsigned/tag/scale/pad */
    PyObject *extra;      /* B_TEXT: the codec's name (None: UTF-8); B_ENUM, B_SET: labels */
    PyObject *prefix;     /* the column's `column_prefix` */
} BinCol;

/* The outcome of reading one value: done, or not exact here (the library decodes the event). */
enum { BIN_OK = 0, BIN_ERROR = -1, BIN_UNREAD = -2 };

static uint64_t le_uint(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static uint64_t be_uint(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* A strict UTF-8 check, as Python's decoder does it (no overlongs, surrogates or > U+10FFFF). */
static int utf8_valid(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        int more; uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) { more = 1; cp = c & 0x1F; min = 0x80; }
        else if ((c & 0xF0) == 0xE0) { more = 2; cp = c & 0x0F; min = 0x800; }
        else if ((c & 0xF8) == 0xF0) { more = 3; cp = c & 0x07; min = 0x10000; }
        else return 0;
        if (n - i <= more) return 0;
        for (int k = 1; k <= more; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += more + 1;
    }
    return 1;
}

/* The fractional seconds of a DATETIME2/TIME2/TIMESTAMP2 value, as the library reads them;
 * -1 for bytes past the digits they hold (never written by a server: the library reads them
 * as negative or out of range, so they are its to decode). */
static int64_t binlog_fsp(const unsigned char *p, int fsp) {
    int size = (fsp + 1) / 2;
    if (size == 0) return 0;
    int64_t v = (int64_t)be_uint(p, size);
    static const int64_t limit[] = {1, 100, 10000, 1000000};
    if (v >= limit[size]) return -1;
    if (fsp % 2) v /= 10;
    static const int64_t scale[] = {1000000, 100000, 10000, 1000, 100, 10, 1};
    return v * scale[fsp];
}

/* str(Decimal(text)) of the digits `digits` (no sign, no point) with `scale` of them after the
 * point: Python's rule, E-notation when the adjusted exponent is below -6. */
static int buf_decimal_text(Buf *b, int negative, const char *digits, int count, int scale) {
    int first = 0;
    while (first < count - 1 && digits[first] == '0') first++;
    const char *coeff = digits + first;
    int len = count - first;
    int exp = -scale, leftdigits = exp + len, dotplace;
    char out[200], *o = out;
    if (negative) *o++ = '-';
    dotplace = leftdigits > -6 ? leftdigits : 1;   /* exp <= 0 always here */
    if (dotplace <= 0) {
        *o++ = '0'; *o++ = '.';
        for (int i = 0; i < -dotplace; i++) *o++ = '0';
        memcpy(o, coeff, len); o += len;
    } else if (dotplace >= len) {
        memcpy(o, coeff, len); o += len;
        for (int i = 0; i < dotplace - len; i++) *o++ = '0';
    } else {
        memcpy(o, coeff, dotplace); o += dotplace;
        *o++ = '.';
        memcpy(o, coeff + dotplace, len - dotplace); o += len - dotplace;
    }
    if (leftdigits != dotplace) o += sprintf(o, "E%+d", leftdigits - dotplace);
    return buf_field(b, 7, out, o - out);
}

/* DECIMAL's binary form (MySQL's decimal2bin): groups of 9 digits in 4 bytes, big-endian,
 * the sign in the first bit and a negative number's bytes inverted. */
static int binlog_decimal(Buf *b, const unsigned char **pp, const unsigned char *end, int precision,
                          int scale) {
    static const int dig2bytes[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};
    int intg = precision - scale, intg0 = intg / 9, frac0 = scale / 9;
    int intg0x = intg - intg0 * 9, frac0x = scale - frac0 * 9;
    int size = dig2bytes[intg0x] + intg0 * 4 + frac0 * 4 + dig2bytes[frac0x];
    unsigned char raw[64];
    if (size <= 0 || size > (int)sizeof raw || end - *pp < size) return BIN_UNREAD;
    memcpy(raw, *pp, size);
    *pp += size;
    int negative = !(raw[0] & 0x80);
    raw[0] ^= 0x80;
    if (negative) for (int i = 0; i < size; i++) raw[i] ^= 0xFF;
    static const uint64_t pow10[10] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000,
                                        100000000, 1000000000};
    char digits[160];
    int n = 0, at = 0, before;
    uint64_t group;
    /* a group past its digits is never written by a server: the library's signed reads
     * make something else of it, so it is the library's to decode */
    if (dig2bytes[intg0x]) {
        if ((group = be_uint(raw, dig2bytes[intg0x])) >= pow10[intg0x]) return BIN_UNREAD;
        n += sprintf(digits + n, "%llu", (unsigned long long)group);
        at += dig2bytes[intg0x];
    }
    for (int i = 0; i < intg0; i++, at += 4) {
        if ((group = be_uint(raw + at, 4)) >= pow10[9]) return BIN_UNREAD;
        n += sprintf(digits + n, "%09llu", (unsigned long long)group);
    }
    before = n;
    for (int i = 0; i < frac0; i++, at += 4) {
        if ((group = be_uint(raw + at, 4)) >= pow10[9]) return BIN_UNREAD;
        n += sprintf(digits + n, "%09llu", (unsigned long long)group);
    }
    if (dig2bytes[frac0x]) {
        if ((group = be_uint(raw + at, dig2bytes[frac0x])) >= pow10[frac0x]) return BIN_UNREAD;
        n += sprintf(digits + n, "%0*llu", frac0x, (unsigned long long)group);
    }
    if (n - before != scale || n > 100) return BIN_UNREAD;
    if (n == 0) { digits[0] = '0'; n = 1; }
    return buf_decimal_text(b, negative, digits, n, scale) < 0 ? BIN_ERROR : BIN_OK;
}

/* FLOAT: the shortest decimal that is the same float32 (`values._float32`), as a double. */
static double float32_shortest(float f) {
    double v = (double)f;
    char text[40];
    for (int d = 6; d <= 9; d++) {
        snprintf(text, sizeof text, "%.*g", d, v);
        double candidate = strtod(text, NULL);
        float back = (float)candidate;
        if (memcmp(&back, &f, sizeof f) == 0) return candidate;
    }
    return v;
}

/* One non-NULL value of column `c` at *pp into `b` (a serialized Value). */
static int binlog_value(Buf *b, const BinCol *c, const unsigned char **pp, const unsigned char *end) {
    const unsigned char *p = *pp;
    Py_ssize_t left = end - p;
#define NEED(n) do { if (left < (Py_ssize_t)(n)) return BIN_UNREAD; } while (0)
    switch (c->kind) {
    case B_INT: {
        NEED(c->a);
        uint64_t u = le_uint(p, c->a);
        *pp = p + c->a;
        if (c->b) return buf_value_uint(b, u) < 0 ? BIN_ERROR : BIN_OK;
        int shift = 64 - 8 * c->a;
        int64_t v = (int64_t)(u << shift) >> shift;
        return buf_value_int(b, v) < 0 ? BIN_ERROR : BIN_OK;
    }
    case B_FLOAT: {
        NEED(4);
        float f;
        memcpy(&f, p, 4);
        *pp = p + 4;
        return buf_value_double(b, float32_shortest(f)) < 0 ? BIN_ERROR : BIN_OK;
    }
    case B_DOUBLE: {
        NEED(8);
        double x;
        memcpy(&x, p, 8);
        *pp = p + 8;
        return buf_value_double(b, x) < 0 ? BIN_ERROR : BIN_OK;
    }
    case B_DECIMAL:
        return binlog_decimal(b, pp, end, c->a, c->b);
    case B_DATE: {
        NEED(3);
        uint32_t t = (uint32_t)le_uint(p, 3);
        *pp = p + 3;
        int y = (t >> 9) & 0x7FFF, m = (t >> 5) & 0xF, d = t & 0x1F;
        if (t == 0 || y == 0 || m == 0 || d == 0) return buf_put(b, "\x08\x01", 2) < 0 ? BIN_ERROR : BIN_OK;
        if (m > 12 || y > 9999 || d > days_in_month(y, m)) return BIN_UNREAD;  /* the library raises */
        return buf_put(b, "\x60", 1) < 0 || buf_varint(b, (uint64_t)days_from_civil(y, m, d)) < 0
            ? BIN_ERROR : BIN_OK;
    }
    case B_DATETIME2: {
        int size = 5 + (c->a + 1) / 2;
        NEED(size);
        uint64_t v = be_uint(p, 5);
        int64_t us = binlog_fsp(p + 5, c->a);
        if (us < 0) return BIN_UNREAD;
        *pp = p + size;
        int ym = (int)((v >> 22) & 0x1FFFF), y = ym / 13, m = ym % 13;
        int d = (v >> 17) & 0x1F, hh = (v >> 12) & 0x1F, mi = (v >> 6) & 0x3F, ss = v & 0x3F;
        if (y < 1 || y > 9999 || m < 1 || d < 1 || d > days_in_month(y, m) || hh > 23 || mi > 59
            || ss > 59)
            return buf_put(b, "\x08\x01", 2) < 0 ? BIN_ERROR : BIN_OK;  /* no such moment: NULL */
        int64_t micros = (days_from_civil(y, m, d) * 86400 + hh * 3600 + mi * 60 + ss) * 1000000 + us;
        return buf_value_timestamp(b, micros, 0) < 0 ? BIN_ERROR : BIN_OK;
    }
    case B_TIMESTAMP2: {
        int size = 4 + (c->a + 1) / 2;
        NEED(size);
        int64_t seconds = (int32_t)(uint32_t)be_uint(p, 4);
        int64_t us = binlog_fsp(p + 4, c->a);
        if (us < 0) return BIN_UNREAD;
        *pp = p + size;
        return buf_value_timestamp(b, seconds * 1000000 + us, 1) < 0 ? BIN_ERROR : BIN_OK;
    }
    case B_TIME2: {
        int size = 3 + (c->a + 1) / 2;
        NEED(size);
        uint32_t v = (uint32_t)be_uint(p, 3);
        if (!(v & 0x800000)) return BIN_UNREAD;  /* negative: the library's own arithmetic */
        int64_t us = binlog_fsp(p + 3, c->a);
        if (us < 0) return BIN_UNREAD;
        *pp = p + size;
        int64_t hh = (v >> 12) & 0x3FF, mi = (v >> 6) & 0x3F, ss = v & 0x3F;
        int64_t total = ((hh * 60 + mi) * 60 + ss) * 1000000 + us;
        return buf_put(b, "\x68", 1) < 0 || buf_varint(b, (uint64_t)total) < 0 ? BIN_ERROR : BIN_OK;
    }
    case B_YEAR: {
        NEED(1);
        int y = p[0];
        *pp = p + 1;
        return buf_value_int(b, y ? y + 1900 : 0) < 0 ? BIN_ERROR : BIN_OK;
    }
    case B_TEXT:
    case B_BYTES:
    case B_UUID: {
        NEED(c->a);
        uint64_t n = le_uint(p, c->a);
        if ((uint64_t)(left - c->a) < n) return BIN_UNREAD;
        const unsigned char *s = p + c->a;
        *pp = s + n;
        if (c->kind == B_BYTES) {
            Py_ssize_t pad = c->b > (Py_ssize_t)n ? c->b - (Py_ssize_t)n : 0;
            if (buf_put(b, "\x4a", 1) < 0 || buf_varint(b, n + pad) < 0 ||
                buf_put(b, (const char *)s, (Py_ssize_t)n) < 0 || buf_grow(b, pad) < 0)
                return BIN_ERROR;
            memset(b->data + b->size, 0, pad);
            b->size += pad;
            return BIN_OK;
        }
        if (c->kind == B_UUID) {
            unsigned char raw[16] = {0};
            if (n > 16) return BIN_UNREAD;
            memcpy(raw, s, n);
            char text[36], *o = text;
            static const char hex[] = "0123456789abcdef";
            for (int i = 0; i < 16; i++) {
                if (i == 4 || i == 6 || i == 8 || i == 10) *o++ = '-';
                *o++ = hex[raw[i] >> 4];
                *o++ = hex[raw[i] & 15];
            }
            return buf_field(b, 15, text, 36) < 0 ? BIN_ERROR : BIN_OK;
        }
        if (c->extra == Py_None) {
            if (!utf8_valid(s, (Py_ssize_t)n)) return BIN_UNREAD;  /* the library raises */
            return buf_field(b, (uint32_t)c->b, (const char *)s, (Py_ssize_t)n) < 0 ? BIN_ERROR : BIN_OK;
        }
        PyObject *text = PyUnicode_Decode((const char *)s, (Py_ssize_t)n,
                                          PyUnicode_AsUTF8(c->extra), "strict");
        if (text == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return BIN_ERROR;
            PyErr_Clear();
            return BIN_UNREAD;
        }
        int rc = buf_value_string(b, (uint32_t)c->b, text);
        Py_DECREF(text);
        return rc < 0 ? BIN_ERROR : BIN_OK;
    }
    case B_ENUM: {
        NEED(c->a);
        uint64_t index = le_uint(p, c->a);
        *pp = p + c->a;
        Py_ssize_t count = PyTuple_GET_SIZE(c->extra);
        if (count == 0) return buf_put(b, "\x08\x01", 2) < 0 ? BIN_ERROR : BIN_OK;
        if (index >= (uint64_t)count) return BIN_UNREAD;  /* the library raises */
        PyObject *label = PyTuple_GET_ITEM(c->extra, (Py_ssize_t)index);
        return buf_field(b, 8, PyBytes_AS_STRING(label), PyBytes_GET_SIZE(label)) < 0
            ? BIN_ERROR : BIN_OK;
    }
    case B_SET: {
        NEED(c->a);
        uint64_t mask = le_uint(p, c->a);
        *pp = p + c->a;
        char text[4096];
        Py_ssize_t n = 0, count = PyTuple_GET_SIZE(c->extra);
        int members = 0;  /* a member may be '' (the library's name for a label it cannot read) */
        for (Py_ssize_t i = 0; i < count && i < 64; i++) {
            if (!(mask & ((uint64_t)1 << i))) continue;
            PyObject *label = PyTuple_GET_ITEM(c->extra, i);
            Py_ssize_t size = PyBytes_GET_SIZE(label);
            if (n + size + 1 > (Py_ssize_t)sizeof text) return BIN_UNREAD;
            if (members++) text[n++] = ',';
            memcpy(text + n, PyBytes_AS_STRING(label), size);
            n += size;
        }
        return buf_field(b, 8, text, n) < 0 ? BIN_ERROR : BIN_OK;
    }
    case B_BIT: {
        NEED(c->a);
        uint64_t v = 0;
        for (int i = 0; i < c->a; i++) {
            int bits = 8;
            if (i == 0) bits = c->a == 1 ? c->b : (c->b % 8 ? c->b % 8 : 8);
            v = (v << bits) | (p[i] & ((1u << bits) - 1));
        }
        *pp = p + c->a;
        if (c->b == 1) return buf_put(b, v ? "\x18\x01" : "\x18\x00", 2) < 0 ? BIN_ERROR : BIN_OK;
        return buf_value_uint(b, v) < 0 ? BIN_ERROR : BIN_OK;
    }
    }
#undef NEED
    return BIN_UNREAD;
}

/* One row image (null bitmap, then each non-NULL value) at *pp as a serialized Row. */
static int binlog_image(Buf *row, Buf *value, const BinCol *cols, Py_ssize_t n,
                        const unsigned char **pp, const unsigned char *end) {
    Py_ssize_t nulls = (n + 7) / 8;
    if (end - *pp < nulls) return BIN_UNREAD;
    const unsigned char *bitmap = *pp;
    *pp += nulls;
    for (Py_ssize_t i = 0; i < n; i++) {
        value->size = 0;
        int rc;
        if (bitmap[i / 8] & (1 << (i % 8))) rc = buf_put(value, "\x08\x01", 2) < 0 ? BIN_ERROR : BIN_OK;
        else rc = binlog_value(value, &cols[i], pp, end);
        if (rc != BIN_OK) return rc;
        if (buf_column(row, cols[i].prefix, value->data, value->size) < 0) return BIN_ERROR;
    }
    return BIN_OK;
}

/* binlog_rows(data, start, end, images, plan, prefixes) -> [Row bytes] or None.
 *
 * The row images of a rows event whose columns are all present (binlog_row_image=FULL):
 * `data[start:end]` after the columns-present bitmaps, `images` per row (2 for an update:
 * before, after). `plan`: per column (kind, a, b, extra), `capture_mysql.values.binlog_plan`.
 * None when a value is not one this reads exactly (a negative TIME, a date the library
 * refuses, text that is not its charset...): the caller lets the library decode the event. */
static PyObject *py_binlog_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyBytes_Check(args[0]) || !PyTuple_Check(args[4]) || !PyTuple_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "binlog_rows(data: bytes, start, end, images, plan: tuple, "
                        "prefixes: tuple)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), stop = PyLong_AsSsize_t(args[2]);
    long images = PyLong_AsLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]), n = PyTuple_GET_SIZE(args[4]);
    if (start < 0 || stop > size || start > stop || images < 1 || images > 2 ||
        PyTuple_GET_SIZE(args[5]) != n || n == 0) {
        PyErr_SetString(PyExc_ValueError, "binlog_rows: bounds, images or plan out of range");
        return NULL;
    }
    BinCol *cols = PyMem_Calloc((size_t)n, sizeof *cols);
    if (cols == NULL) return PyErr_NoMemory();
    PyObject *out = NULL, *rows = NULL;
    Buf row = {0}, value = {0};
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *spec = PyTuple_GET_ITEM(args[4], i), *prefix = PyTuple_GET_ITEM(args[5], i);
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 4 || !PyBytes_Check(prefix)) {
            PyErr_SetString(PyExc_TypeError, "binlog_rows: a plan entry is (kind, a, b, extra), a prefix bytes");
            goto done;
        }
        cols[i].kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
        cols[i].a = (int)PyLong_AsLong(PyTuple_GET_ITEM(spec, 1));
        cols[i].b = (int)PyLong_AsLong(PyTuple_GET_ITEM(spec, 2));
        cols[i].extra = PyTuple_GET_ITEM(spec, 3);
        cols[i].prefix = prefix;
        if (PyErr_Occurred()) goto done;
        int k = cols[i].kind;
        int bad = k < B_INT || k > B_BIT;
        if ((k == B_INT && (cols[i].a < 1 || cols[i].a > 8)) ||
            ((k == B_TEXT || k == B_BYTES || k == B_UUID) && (cols[i].a < 1 || cols[i].a > 4)) ||
            ((k == B_ENUM || k == B_SET) && (!PyTuple_Check(cols[i].extra) || cols[i].a < 1 || cols[i].a > 8)) ||
            (k == B_TEXT && cols[i].extra != Py_None && !PyUnicode_Check(cols[i].extra)) ||
            ((k == B_DATETIME2 || k == B_TIMESTAMP2 || k == B_TIME2) && (cols[i].a < 0 || cols[i].a > 6)) ||
            (k == B_BIT && (cols[i].a < 1 || cols[i].a > 8)) ||
            (k == B_DECIMAL && (cols[i].a < 1 || cols[i].a > 65 || cols[i].b < 0 || cols[i].b > cols[i].a)))
            bad = 1;
        if (k == B_ENUM || k == B_SET)
            for (Py_ssize_t j = 0; !bad && j < PyTuple_GET_SIZE(cols[i].extra); j++)
                bad = !PyBytes_Check(PyTuple_GET_ITEM(cols[i].extra, j));
        if (bad) {
            PyErr_Format(PyExc_ValueError, "binlog_rows: plan entry %zd is not one it reads", i);
            goto done;
        }
    }
    rows = PyList_New(0);
    if (rows == NULL) goto done;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[0]) + start;
    const unsigned char *end = (const unsigned char *)PyBytes_AS_STRING(args[0]) + stop;
    while (p < end) {
        for (long image = 0; image < images; image++) {
            row.size = 0;
            int rc = binlog_image(&row, &value, cols, n, &p, end);
            if (rc == BIN_ERROR) goto done;
            if (rc == BIN_UNREAD) { out = Py_None; Py_INCREF(out); goto done; }
            PyObject *bytes = PyBytes_FromStringAndSize(row.data ? row.data : "", row.size);
            if (bytes == NULL) goto done;
            int added = PyList_Append(rows, bytes);
            Py_DECREF(bytes);
            if (added < 0) goto done;
        }
    }
    out = rows;
    rows = NULL;
done:
    Py_XDECREF(rows);
    buf_free(&row);
    buf_free(&value);
    PyMem_Free(cols);
    return out;
}

static PyMethodDef methods[] = {
    {"varint", (PyCFunction)py_varint, METH_O, NULL},
    {"length_prefixed", (PyCFunction)(void (*)(void))py_length_prefixed, METH_FASTCALL, NULL},
    {"value_int", (PyCFunction)py_value_int, METH_O, NULL},
    {"row_bytes", (PyCFunction)(void (*)(void))py_row_bytes, METH_FASTCALL, NULL},
    {"values", (PyCFunction)(void (*)(void))py_values, METH_FASTCALL, NULL},
    {"chunk_rows", (PyCFunction)(void (*)(void))py_chunk_rows, METH_FASTCALL, NULL},
    {"pg_tuple", (PyCFunction)(void (*)(void))py_pg_tuple, METH_FASTCALL, NULL},
    {"read_records", (PyCFunction)(void (*)(void))py_read_records, METH_FASTCALL, NULL},
    {"change_records", (PyCFunction)(void (*)(void))py_change_records, METH_FASTCALL, NULL},
    {"event_ids", (PyCFunction)(void (*)(void))py_event_ids, METH_FASTCALL, NULL},
    {"row_key", (PyCFunction)(void (*)(void))py_row_key, METH_FASTCALL, NULL},
    {"binlog_rows", (PyCFunction)(void (*)(void))py_binlog_rows, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tailrace.events._cwire",
    "The hot loops of tailrace.events._wire in C (byte-identical; tests/unit/test_wire.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cwire(void) {
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL) return NULL;
    return PyModule_Create(&module);
}
