/* The sinks' JSON in C, written straight from an event's protobuf bytes.
 *
 * Twins: `event_json` is `json.dumps(_codec.event_to_json_dict(event))` (compact, UTF-8);
 * `key_json` is `_codec.key_bytes(event)` (sorted keys, ASCII). tests/unit/test_cjson.py
 * holds each pair to byte-identical output. A value whose JSON this file does not spell
 * exactly as Python does (a JSON document, an array, a date out of range, a numeric in
 * E-notation) goes to the caller's `fallback(value_bytes)`, which answers the value's JSON
 * text; an event it cannot read at all, or whose fallback raised, answers None, and the
 * caller's Python encodes it (or raises its own error, in its own order).
 */
#include "_cbuf.h"

#define MAX_KEYS 64
#define MAX_COLUMNS 1024

typedef struct { const char *p; Py_ssize_t n; } Span;

static const Span EMPTY = {"", 0};

/* -- JSON text ------------------------------------------------------------------------- */

static const char HEX[] = "0123456789abcdef";

static int put(Buf *b, const char *s) { return buf_put(b, s, (Py_ssize_t)strlen(s)); }

/* A JSON string as json.dumps writes it: `ascii` is ensure_ascii=True (\uXXXX for every
 * code point past 0x7e, surrogate pairs past 0xffff); -2 for text that is not strict UTF-8
 * (overlong forms, surrogates: Python's parser would have refused the event). */
static int put_string(Buf *b, Span s, int ascii) {
    if (buf_grow(b, s.n * 6 + 2) < 0) return -1;  /* worst case: \u00XX per byte */
    char *o = b->data + b->size;
    *o++ = '"';
    const unsigned char *p = (const unsigned char *)s.p, *end = p + s.n;
    while (p < end) {
        unsigned char c = *p;
        if (c >= 0x20 && c != '"' && c != '\\' && (c < 0x7f || (c == 0x7f && !ascii))) {
            *o++ = (char)c;
            p++;
            continue;
        }
        if (c < 0x80) {
            p++;
            *o++ = '\\';
            switch (c) {
            case '"': *o++ = '"'; break;
            case '\\': *o++ = '\\'; break;
            case '\b': *o++ = 'b'; break;
            case '\f': *o++ = 'f'; break;
            case '\n': *o++ = 'n'; break;
            case '\r': *o++ = 'r'; break;
            case '\t': *o++ = 't'; break;
            default:
                *o++ = 'u'; *o++ = '0'; *o++ = '0'; *o++ = HEX[c >> 4]; *o++ = HEX[c & 15];
            }
            continue;
        }
        if (!ascii) { *o++ = (char)c; p++; continue; }  /* valid UTF-8: the event parsed */
        uint32_t cp;
        int len = c >= 0xf5 ? 0 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
        if (len == 0 || end - p < len) return -2;
        cp = c & (0x7f >> len);
        for (int i = 1; i < len; i++) {
            if ((p[i] & 0xc0) != 0x80) return -2;
            cp = (cp << 6) | (p[i] & 0x3f);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff)))
            || (len == 4 && (cp < 0x10000 || cp > 0x10ffff))) return -2;  /* overlong, surrogate */
        p += len;
        uint32_t units[2] = {cp, 0};
        int count = 1;
        if (cp > 0xffff) {
            cp -= 0x10000;
            units[0] = 0xd800 | (cp >> 10);
            units[1] = 0xdc00 | (cp & 0x3ff);
            count = 2;
        }
        for (int i = 0; i < count; i++) {
            *o++ = '\\'; *o++ = 'u';
            for (int shift = 12; shift >= 0; shift -= 4) *o++ = HEX[(units[i] >> shift) & 15];
        }
    }
    *o++ = '"';
    b->size = o - b->data;
    return 0;
}

/* Decimal digits without printf, which took ~40 % of this file's time (perf, 2026-11-30). */
static int put_uint(Buf *b, uint64_t v) {
    char text[24], *o = text + sizeof text;
    do { *--o = (char)('0' + v % 10); v /= 10; } while (v);
    return buf_put(b, o, text + sizeof text - o);
}

static int put_int(Buf *b, int64_t v) {
    if (v >= 0) return put_uint(b, (uint64_t)v);
    return buf_put(b, "-", 1) < 0 ? -1 : put_uint(b, (uint64_t)0 - (uint64_t)v);
}

/* `v` in exactly `width` digits, zero-padded (v < 10^width): what %0<width>u writes. */
static int put_padded(char *o, unsigned v, int width) {
    for (int i = width - 1; i >= 0; i--, v /= 10) o[i] = (char)('0' + v % 10);
    return width;
}

static int put_bool(Buf *b, uint64_t v) { return put(b, v ? "true" : "false"); }

/* A string field, or null when empty (`event.schema or None`). */
static int put_string_or_null(Buf *b, Span s) { return s.n ? put_string(b, s, 0) : put(b, "null"); }

/* -- Values as `_values.json_of` gives them ------------------------------------------------ */

static void civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d) {
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int64_t)yoe + era * 400 + (*m <= 2);
}

/* Days since 1970-01-01 as date.isoformat(); 0: outside the years 1..9999 (Python raises). */
static int put_date_text(char *o, int64_t days) {
    int64_t y;
    unsigned m, d;
    if (days < -719162 || days > 2932896) return 0;  /* 0001-01-01 .. 9999-12-31 */
    civil_from_days(days, &y, &m, &d);
    put_padded(o, (unsigned)y, 4);
    o[4] = '-';
    put_padded(o + 5, m, 2);
    o[7] = '-';
    put_padded(o + 8, d, 2);
    return 10;
}

static int put_time_text(char *o, int64_t micros) {  /* 0 <= micros < one day */
    int64_t secs = micros / 1000000, us = micros % 1000000;
    put_padded(o, (unsigned)(secs / 3600), 2);
    o[2] = ':';
    put_padded(o + 3, (unsigned)(secs / 60 % 60), 2);
    o[5] = ':';
    put_padded(o + 6, (unsigned)(secs % 60), 2);
    if (!us) return 8;
    o[8] = '.';
    return 9 + put_padded(o + 9, (unsigned)us, 6);
}

/* datetime.isoformat() of the epoch plus `micros` (UTC): 0 outside the datetime range. */
static int put_timestamp_text(char *o, int64_t micros, int aware) {
    const int64_t day = 86400000000LL;
    int64_t days = micros / day, rest = micros % day;
    if (rest < 0) { rest += day; days--; }
    int n = put_date_text(o, days);
    if (n == 0) return 0;
    o[n++] = 'T';
    n += put_time_text(o + n, rest);
    if (aware) { memcpy(o + n, "+00:00", 6); n += 6; }
    return n;
}

static int put_base64(Buf *b, Span s) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (buf_grow(b, (s.n + 2) / 3 * 4 + 2) < 0) return -1;
    char *o = b->data + b->size;
    const unsigned char *p = (const unsigned char *)s.p;
    Py_ssize_t i = 0;
    *o++ = '"';
    for (; i + 2 < s.n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *o++ = A[v >> 18]; *o++ = A[(v >> 12) & 63]; *o++ = A[(v >> 6) & 63]; *o++ = A[v & 63];
    }
    if (i < s.n) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < s.n ? (uint32_t)p[i + 1] << 8 : 0);
        *o++ = A[v >> 18]; *o++ = A[(v >> 12) & 63];
        *o++ = i + 1 < s.n ? A[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    *o++ = '"';
    b->size = o - b->data;
    return 0;
}

static int canonical_uuid(Span s) {  /* what str(uuid.UUID(text)) gives back unchanged */
    if (s.n != 36) return 0;
    for (int i = 0; i < 36; i++) {
        char c = s.p[i];
        if (i == 8 || i == 13 || i == 18 || i == 23) { if (c != '-') return 0; }
        else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return 0;
    }
    return 1;
}

static int put_float(Buf *b, double v) {
    if (v != v) return put(b, "NaN");
    if (v > 1.7976931348623157e308) return put(b, "Infinity");
    if (v < -1.7976931348623157e308) return put(b, "-Infinity");
    char *text = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL) return -1;
    int rc = put(b, text);
    PyMem_Free(text);
    return rc;
}

/* The fallback raised: which error the Python twin raises first depends on its own order of
 * evaluation (row order for keys, encoding only after the whole dict), and Value.FromString
 * has a nesting limit the twin does not: -2, so the caller's Python answers (or raises). */
static int python_raised(void) {
    if (PyErr_ExceptionMatches(PyExc_MemoryError) || !PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyErr_Clear();
    return -2;
}

/* The value's JSON text from the caller's Python (`fallback(value_bytes) -> str`). */
static int put_fallback(Buf *b, Span value, PyObject *fallback) {
    PyObject *raw = PyBytes_FromStringAndSize(value.p, value.n);
    if (raw == NULL) return -1;
    PyObject *text = PyObject_CallOneArg(fallback, raw);
    Py_DECREF(raw);
    if (text == NULL) return python_raised();
    Py_ssize_t n;
    const char *utf8 = PyUnicode_Check(text) ? PyUnicode_AsUTF8AndSize(text, &n) : NULL;
    if (utf8 == NULL) {
        Py_DECREF(text);
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "fallback must return str");
            return -1;
        }
        return python_raised();  /* e.g. a lone surrogate from a JSON document */
    }
    int rc = buf_put(b, utf8, n);
    Py_DECREF(text);
    return rc;
}

/* One `Value`'s JSON: -1 error, -2 unreadable (the event goes to Python). */
static int put_value(Buf *b, Span value, int ascii, PyObject *fallback) {
    const char *p = value.p, *end = value.p + value.n;
    PbField f, kind = {0};
    int kinds = 0;
    while (p < end) {
        if ((p = pb_field(p, end, &f)) == NULL) return -2;
        if (f.number >= 1 && f.number <= 15) { kind = f; kinds++; }
    }
    if (kinds == 0) return put(b, "null");
    if (kinds > 1) return put_fallback(b, value, fallback);  /* oneof rules: Python's */
    static const int WIRE[16] = {-1, 0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 0, 0, 2, 2};
    if (kind.wire != WIRE[kind.number]) return -2;
    Span text = {kind.data, (Py_ssize_t)kind.size};
    char out[48];
    int n;
    switch (kind.number) {
    case 1: return put(b, "null");
    case 2: return put(b, "{\"__unchanged_toast\":true}");
    case 3: return put_bool(b, kind.value);
    case 4: return put_int(b, (int64_t)(kind.value >> 1) ^ -(int64_t)(kind.value & 1));
    case 5: return put_uint(b, kind.value);
    case 6: {
        double d;
        memcpy(&d, &kind.value, sizeof d);
        return put_float(b, d);
    }
    case 7:
        if (pg_numeric_plain(text.p, text.n)) return put_string(b, text, ascii);
        break;
    case 8: return put_string(b, text, ascii);
    case 9: return put_base64(b, text);
    case 11: {
        int64_t micros = 0;
        uint64_t zone = 0;
        const char *q = text.p, *qend = text.p + text.n;
        while (q < qend) {
            if ((q = pb_field(q, qend, &f)) == NULL) return -2;
            if (f.number == 1 && f.wire == 0) micros = (int64_t)f.value;
            else if (f.number == 2 && f.wire == 0) zone = f.value;
            else if (f.number == 1 || f.number == 2) return -2;
        }
        if ((n = put_timestamp_text(out + 1, micros, zone != 0)) == 0) break;
        out[0] = '"'; out[n + 1] = '"';
        return buf_put(b, out, n + 2);
    }
    case 12:
        if ((n = put_date_text(out + 1, (int32_t)kind.value)) == 0) break;
        out[0] = '"'; out[n + 1] = '"';
        return buf_put(b, out, n + 2);
    case 13: {
        int64_t micros = (int64_t)kind.value;
        if (micros < 0 || micros >= 86400000000LL) break;  /* a timedelta: Python spells it */
        n = put_time_text(out + 1, micros);
        out[0] = '"'; out[n + 1] = '"';
        return buf_put(b, out, n + 2);
    }
    case 15:
        if (canonical_uuid(text)) return put_string(b, text, ascii);
        break;
    }
    return put_fallback(b, value, fallback);  /* json (10), arrays (14), the rest above */
}

/* -- Rows -------------------------------------------------------------------------------- */

typedef struct { Span name; Span value; } ColumnSpan;

/* A Row's columns (name and value bytes); -2 when unreadable or a name repeats (the dict
 * of the Python twin would keep one). */
static int read_row(Span row, ColumnSpan *columns, int *count) {
    const char *p = row.p, *end = row.p + row.n;
    PbField f, g;
    *count = 0;
    while (p < end) {
        if ((p = pb_field(p, end, &f)) == NULL) return -2;
        if (f.number != 1) continue;
        if (f.wire != 2 || *count == MAX_COLUMNS) return -2;
        ColumnSpan c = {EMPTY, EMPTY};
        int values = 0;
        const char *q = f.data, *qend = f.data + f.size;
        while (q < qend) {
            if ((q = pb_field(q, qend, &g)) == NULL) return -2;
            if (g.number == 1 || g.number == 3) {
                if (g.wire != 2) return -2;
                Span s = {g.data, (Py_ssize_t)g.size};
                if (g.number == 1) c.name = s;
                else { c.value = s; values++; }
            }
        }
        if (values > 1) return -2;  /* a value in two parts: Python merges it */
        for (int i = 0; i < *count; i++)
            if (columns[i].name.n == c.name.n && memcmp(columns[i].name.p, c.name.p, c.name.n) == 0)
                return -2;
        columns[(*count)++] = c;
    }
    return 0;
}

/* {"name":value,...} or null for a row without columns (`_codec.row_to_dict`). */
static int put_row(Buf *b, Span row, ColumnSpan *columns, PyObject *fallback) {
    int count, rc;
    if ((rc = read_row(row, columns, &count)) < 0) return rc;
    if (count == 0) return put(b, "null");
    if (buf_put(b, "{", 1) < 0) return -1;
    for (int i = 0; i < count; i++) {
        if (i && buf_put(b, ",", 1) < 0) return -1;
        if (put_string(b, columns[i].name, 0) < 0 || buf_put(b, ":", 1) < 0) return -1;
        if ((rc = put_value(b, columns[i].value, 0, fallback)) < 0) return rc;
    }
    return buf_put(b, "}", 1);
}

/* -- Events ------------------------------------------------------------------------------ */

typedef struct {
    Span strings[23];          /* string fields by number: 1-6, 11, 12, 17, 21 */
    uint64_t scalars[23];      /* varint fields by number: 7, 13-15, 19, 20 */
    Span before, after, position, snapshot;
    Span keys[MAX_KEYS];
    int nkeys;
    int outbox;                /* field 24 set: the sinks write an outbox message instead */
} Event;

enum { F_ID = 1, F_SOURCE = 2, F_TENANT = 3, F_DATABASE = 4, F_SCHEMA = 5, F_TABLE = 6, F_OP = 7,
       F_BEFORE = 8, F_AFTER = 9, F_KEYS = 10, F_DDL = 11, F_TX_ID = 12, F_TX_INDEX = 13,
       F_TX_SIZE = 14, F_TX_END = 15, F_POSITION = 16, F_SCHEMA_VERSION = 17,
       F_TS_SOURCE = 19, F_TS_CAPTURED = 20, F_IDEMPOTENCY = 21, F_SNAPSHOT = 23 };

/* The fields of a ChangeEvent: wire type 2 strings and messages, 0 varints; a message
 * field sent twice (merged by protobuf) or a wrong wire type makes it unreadable (-2). */
static int read_event(const char *p, const char *end, Event *e) {
    static const signed char WIRE[24] = {-1, 2, 2, 2, 2, 2, 2, 0, 2, 2, 2, 2, 2, 0, 0, 0, 2, 2, 0,
                                         0, 0, 2, 2, 2};
    PbField f;
    memset(e, 0, sizeof *e);
    for (int i = 0; i < 23; i++) e->strings[i] = EMPTY;
    e->before = e->after = e->position = e->snapshot = EMPTY;
    int seen_messages = 0;
    while (p < end) {
        if ((p = pb_field(p, end, &f)) == NULL) return -2;
        if (f.number == 24) e->outbox = 1;
        if (f.number == 0 || f.number > 23) continue;
        if (f.wire != WIRE[f.number]) return -2;
        Span s = {f.data, (Py_ssize_t)f.size};
        switch (f.number) {
        case F_BEFORE: case F_AFTER: case F_POSITION: case F_SNAPSHOT: {
            int bit = 1 << (f.number - F_BEFORE);
            if (seen_messages & bit) return -2;
            seen_messages |= bit;
            if (f.number == F_BEFORE) e->before = s;
            else if (f.number == F_AFTER) e->after = s;
            else if (f.number == F_POSITION) e->position = s;
            else e->snapshot = s;
            break;
        }
        case F_KEYS:
            if (e->nkeys == MAX_KEYS) return -2;
            e->keys[e->nkeys++] = s;
            break;
        default:
            if (f.wire == 2) e->strings[f.number - 1] = s;
            else e->scalars[f.number - 1] = f.value;
        }
    }
    return 0;
}

#define STR(e, n) ((e)->strings[(n) - 1])
#define NUM(e, n) ((e)->scalars[(n) - 1])

static const char *op_name(uint64_t op) {
    static const char *NAMES[] = {NULL, "insert", "update", "delete", "ddl", "truncate", "read"};
    int32_t v = (int32_t)op;
    return v >= 1 && v <= 6 ? NAMES[v] : "unknown";
}

/* {"tx_seq":..,"event_index":..[, the native coordinates]} */
static int put_position(Buf *b, Span position) {
    const char *p = position.p, *end = position.p + position.n;
    PbField f, native = {0};
    uint64_t tx_seq = 0, event_index = 0;
    int natives = 0;
    while (p < end) {
        if ((p = pb_field(p, end, &f)) == NULL) return -2;
        if ((f.number == 1 || f.number == 2) && f.wire != 0) return -2;
        if (f.number == 1) tx_seq = f.value;
        else if (f.number == 2) event_index = (uint32_t)f.value;
        else if (f.number == 3 || f.number == 4) {
            if (f.wire != 2) return -2;
            native = f;
            natives++;
        }
    }
    if (natives > 1) return -2;
    if (put(b, "{\"tx_seq\":") < 0 || put_uint(b, tx_seq) < 0
        || put(b, ",\"event_index\":") < 0 || put_uint(b, event_index) < 0) return -1;
    if (natives) {
        Span strings[4] = {EMPTY, EMPTY, EMPTY, EMPTY};  /* mysql 1-3 */
        uint64_t numbers[6] = {0};
        const char *q = native.data, *qend = native.data + native.size;
        while (q < qend) {
            if ((q = pb_field(q, qend, &f)) == NULL) return -2;
            if (f.number == 0 || f.number > 5) continue;
            int string = native.number == 4 && f.number <= 3;
            if (f.wire != (string ? 2 : 0)) return -2;
            if (string) strings[f.number] = (Span){f.data, (Py_ssize_t)f.size};
            else numbers[f.number] = f.value;
        }
        int rc;
        if (native.number == 3) {
            rc = put(b, ",\"commit_lsn\":") < 0 || put_uint(b, numbers[1]) < 0
                 || put(b, ",\"event_lsn\":") < 0 || put_uint(b, numbers[2]) < 0
                 || put(b, ",\"timeline\":") < 0 || put_uint(b, (uint32_t)numbers[3]) < 0;
        } else {
            rc = put(b, ",\"gtid\":") < 0 || put_string(b, strings[2], 0) < 0
                 || put(b, ",\"gtid_set\":") < 0 || put_string(b, strings[1], 0) < 0
                 || put(b, ",\"file\":") < 0 || put_string(b, strings[3], 0) < 0
                 || put(b, ",\"offset\":") < 0 || put_uint(b, numbers[4]) < 0
                 || put(b, ",\"server_id\":") < 0 || put_uint(b, (uint32_t)numbers[5]) < 0;
        }
        if (rc) return -1;
    }
    return put(b, "}");
}

static int put_snapshot(Buf *b, Span snapshot) {
    const char *p = snapshot.p, *end = snapshot.p + snapshot.n;
    PbField f;
    uint64_t numbers[4] = {0};
    while (p < end) {
        if ((p = pb_field(p, end, &f)) == NULL) return -2;
        if (f.number == 0 || f.number > 3) continue;
        if (f.wire != 0) return -2;
        numbers[f.number] = f.value;
    }
    if (put(b, "{\"request_id\":") < 0 || put_uint(b, numbers[1]) < 0
        || put(b, ",\"chunk\":") < 0 || put_uint(b, (uint32_t)numbers[2]) < 0
        || put(b, ",\"last\":") < 0 || put_bool(b, numbers[3]) < 0) return -1;
    return put(b, "}");
}

/* `literal` (a key, with the comma before it) and a string field's JSON */
static int put_named(Buf *b, const char *literal, Span s) {
    return put(b, literal) < 0 || put_string(b, s, 0) < 0 ? -1 : 0;
}

static int write_event(Buf *b, Event *e, ColumnSpan *columns, PyObject *fallback) {
    int rc;
    if (put_named(b, "{\"id\":", STR(e, F_ID)) < 0
        || put_named(b, ",\"source_id\":", STR(e, F_SOURCE)) < 0
        || put_named(b, ",\"tenant\":", STR(e, F_TENANT)) < 0
        || put_named(b, ",\"database\":", STR(e, F_DATABASE)) < 0
        || put(b, ",\"schema\":") < 0 || put_string_or_null(b, STR(e, F_SCHEMA)) < 0
        || put_named(b, ",\"table\":", STR(e, F_TABLE)) < 0
        || put(b, ",\"op\":\"") < 0 || put(b, op_name(NUM(e, F_OP))) < 0
        || put(b, "\",\"before\":") < 0) return -1;
    if ((rc = put_row(b, e->before, columns, fallback)) < 0) return rc;
    if (put(b, ",\"after\":") < 0) return -1;
    if ((rc = put_row(b, e->after, columns, fallback)) < 0) return rc;
    if (put(b, ",\"key_columns\":[") < 0) return -1;
    for (int i = 0; i < e->nkeys; i++)
        if ((i && put(b, ",") < 0) || put_string(b, e->keys[i], 0) < 0) return -1;
    if (put(b, "],\"ddl\":") < 0 || put_string_or_null(b, STR(e, F_DDL)) < 0
        || put_named(b, ",\"tx\":{\"id\":", STR(e, F_TX_ID)) < 0
        || put(b, ",\"index\":") < 0 || put_uint(b, (uint32_t)NUM(e, F_TX_INDEX)) < 0
        || put(b, ",\"size\":") < 0 || put_uint(b, (uint32_t)NUM(e, F_TX_SIZE)) < 0
        || put(b, ",\"end\":") < 0 || put_bool(b, NUM(e, F_TX_END)) < 0
        || put(b, "},\"position\":") < 0) return -1;
    if ((rc = put_position(b, e->position)) < 0) return rc;
    if (put_named(b, ",\"schema_version\":", STR(e, F_SCHEMA_VERSION)) < 0
        || put(b, ",\"ts_source_us\":") < 0 || put_int(b, (int64_t)NUM(e, F_TS_SOURCE)) < 0
        || put(b, ",\"ts_captured_us\":") < 0 || put_int(b, (int64_t)NUM(e, F_TS_CAPTURED)) < 0
        || put_named(b, ",\"idempotency_key\":", STR(e, F_IDEMPOTENCY)) < 0
        || put(b, ",\"snapshot\":") < 0) return -1;
    if ((int32_t)NUM(e, F_OP) == 6) {
        if ((rc = put_snapshot(b, e->snapshot)) < 0) return rc;
    } else if (put(b, "null") < 0) return -1;
    return put(b, "}");
}

/* The shared shape of both entry points: parse, write, and hand back bytes or None. */
typedef int (*Writer)(Buf *, Event *, ColumnSpan *, PyObject *);

static PyObject *run(PyObject *const *args, Py_ssize_t nargs, const char *usage, Writer write) {
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(args[0]);
    Event *event = PyMem_Malloc(sizeof(Event));
    ColumnSpan *columns = PyMem_Malloc(sizeof(ColumnSpan) * MAX_COLUMNS);
    Buf b = {0};
    int rc = -1;
    if (event == NULL || columns == NULL) PyErr_NoMemory();
    else if ((rc = read_event(p, p + PyBytes_GET_SIZE(args[0]), event)) == 0)
        rc = write(&b, event, columns, args[1]);
    PyMem_Free(event);
    PyMem_Free(columns);
    PyObject *out = NULL;
    if (rc == 0) out = buf_bytes(&b);
    else if (rc == -2 && !PyErr_Occurred()) out = Py_NewRef(Py_None);
    buf_free(&b);
    return out;
}

/* event_json(event_bytes, fallback) -> the native JSON document, or None */
static PyObject *py_event_json(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return run(args, nargs, "event_json(event: bytes, fallback)", write_event);
}

/* -- Message keys (`_codec.key_bytes`) ------------------------------------------------------ */

static int span_cmp(Span a, Span b) {
    int c = memcmp(a.p, b.p, (size_t)(a.n < b.n ? a.n : b.n));
    return c ? c : (a.n > b.n) - (a.n < b.n);
}

static int column_cmp(const void *a, const void *b) {
    return span_cmp(((const ColumnSpan *)a)->name, ((const ColumnSpan *)b)->name);
}

/* {"pk":{key columns, sorted},"table":"db[.schema].table"}: the key row is the old row for
 * updates and deletes, the new one for inserts and reads (`_codec.key_values`). */
static int write_key(Buf *b, Event *e, ColumnSpan *columns, PyObject *fallback) {
    int32_t op = (int32_t)NUM(e, F_OP);
    Span row = op == 1 || op == 6 ? e->after : e->before;
    int count = 0, keys = 0, rc;
    if ((rc = read_row(row, columns, &count)) < 0) return rc;
    if (e->nkeys == 0 || count == 0) {
        if ((rc = read_row(e->after, columns, &count)) < 0) return rc;
        if (count == 0 && (rc = read_row(e->before, columns, &count)) < 0) return rc;
    }
    for (int i = 0; i < count; i++)  /* keep the key columns, in place */
        for (int k = 0; k < e->nkeys; k++)
            if (span_cmp(columns[i].name, e->keys[k]) == 0) { columns[keys++] = columns[i]; break; }
    qsort(columns, (size_t)keys, sizeof *columns, column_cmp);
    if (put(b, "{\"pk\":{") < 0) return -1;
    for (int i = 0; i < keys; i++) {
        if (i && put(b, ",") < 0) return -1;
        if ((rc = put_string(b, columns[i].name, 1)) < 0) return rc;
        if (put(b, ":") < 0) return -1;
        if ((rc = put_value(b, columns[i].value, 1, fallback)) < 0) return rc;
    }
    /* the table, as one string: database, schema when set, table */
    Span db = STR(e, F_DATABASE), schema = STR(e, F_SCHEMA), table = STR(e, F_TABLE);
    Buf name = {0};
    rc = buf_put(&name, db.p, db.n) < 0 || buf_put(&name, ".", 1) < 0
         || (schema.n && (buf_put(&name, schema.p, schema.n) < 0 || buf_put(&name, ".", 1) < 0))
         || buf_put(&name, table.p, table.n) < 0 ? -1 : 0;
    if (rc == 0 && put(b, "},\"table\":") < 0) rc = -1;
    if (rc == 0) rc = put_string(b, (Span){name.data ? name.data : "", name.size}, 1);
    buf_free(&name);
    if (rc < 0) return rc;
    return put(b, "}");
}

/* key_json(event_bytes, fallback) -> the sinks' message key, or None */
static PyObject *py_key_json(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return run(args, nargs, "key_json(event: bytes, fallback)", write_key);
}

/* -- Redis XADD commands (`RedisSink.xadds`) -------------------------------------------- */

/* One RESP bulk string: $<size>\r\n<data>\r\n (what hiredis.pack_command writes per argument). */
static int put_bulk(Buf *b, const char *data, Py_ssize_t n) {
    if (buf_put(b, "$", 1) < 0 || put_uint(b, (uint64_t)n) < 0 || buf_put(b, "\r\n", 2) < 0
        || buf_put(b, data, n) < 0) return -1;
    return buf_put(b, "\r\n", 2);
}

static int put_bulk_text(Buf *b, const char *s) { return put_bulk(b, s, (Py_ssize_t)strlen(s)); }

/* redis_xadds(events, streams, trim, value_fallback, key_fallback) -> bytes or None.
 *
 * The RESP of `XADD stream [trim...] * id <id> op <op> key <key json> idempotency_key <key>
 * event <event json>` for each serialized event, byte for byte what `RedisSink.xadd_args`
 * packed by hiredis gives (tests/unit/test_cjson.py). None when an event is one `event_json`
 * or `key_json` leaves to Python: the caller's Python writes the batch then. */
static PyObject *py_redis_xadds(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyTuple_Check(args[2])
        || !PyCallable_Check(args[3]) || !PyCallable_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "redis_xadds(events: list[bytes], streams: list[bytes], "
                        "trim: tuple[bytes, ...], value_fallback, key_fallback)");
        return NULL;
    }
    PyObject *events = args[0], *streams = args[1], *trim = args[2];
    Py_ssize_t count = PyList_GET_SIZE(events), ntrim = PyTuple_GET_SIZE(trim);
    if (PyList_GET_SIZE(streams) != count) {
        PyErr_SetString(PyExc_ValueError, "redis_xadds: events and streams differ in length");
        return NULL;
    }
    for (Py_ssize_t t = 0; t < ntrim; t++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(trim, t))) {
            PyErr_SetString(PyExc_TypeError, "redis_xadds: trim must be bytes");
            return NULL;
        }
    Event *event = PyMem_Malloc(sizeof(Event));
    ColumnSpan *columns = PyMem_Malloc(sizeof(ColumnSpan) * MAX_COLUMNS);
    Buf out = {0}, key = {0}, doc = {0};
    PyObject *result = NULL;
    int rc = 0;
    char head[32];
    if (event == NULL || columns == NULL) { PyErr_NoMemory(); goto done; }
    int argc = 2 + (int)ntrim + 11;
    int head_n = snprintf(head, sizeof head, "*%d\r\n$4\r\nXADD\r\n", argc);
    for (Py_ssize_t i = 0; i < count && rc == 0; i++) {
        PyObject *data = PyList_GET_ITEM(events, i), *stream = PyList_GET_ITEM(streams, i);
        if (!PyBytes_Check(data) || !PyBytes_Check(stream)) {
            PyErr_SetString(PyExc_TypeError, "redis_xadds: events and streams must be bytes");
            goto done;
        }
        const char *p = PyBytes_AS_STRING(data);
        if ((rc = read_event(p, p + PyBytes_GET_SIZE(data), event)) < 0) break;
        key.size = doc.size = 0;
        if ((rc = write_key(&key, event, columns, args[4])) < 0) break;
        if ((rc = write_event(&doc, event, columns, args[3])) < 0) break;
        Span id = STR(event, F_ID), idem = STR(event, F_IDEMPOTENCY);
        if (buf_put(&out, head, head_n) < 0 ||
            put_bulk(&out, PyBytes_AS_STRING(stream), PyBytes_GET_SIZE(stream)) < 0) { rc = -1; break; }
        for (Py_ssize_t t = 0; t < ntrim && rc == 0; t++) {
            PyObject *arg = PyTuple_GET_ITEM(trim, t);
            rc = put_bulk(&out, PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg));
        }
        if (rc < 0 || put_bulk_text(&out, "*") < 0 ||
            put_bulk_text(&out, "id") < 0 || put_bulk(&out, id.p, id.n) < 0 ||
            put_bulk_text(&out, "op") < 0 || put_bulk_text(&out, op_name(NUM(event, F_OP))) < 0 ||
            put_bulk_text(&out, "key") < 0 || put_bulk(&out, key.data ? key.data : "", key.size) < 0 ||
            put_bulk_text(&out, "idempotency_key") < 0 || put_bulk(&out, idem.p, idem.n) < 0 ||
            put_bulk_text(&out, "event") < 0 || put_bulk(&out, doc.data ? doc.data : "", doc.size) < 0)
            rc = -1;
    }
    if (rc == 0) result = buf_bytes(&out);
    else if (rc == -2 && !PyErr_Occurred()) result = Py_NewRef(Py_None);
done:
    PyMem_Free(event);
    PyMem_Free(columns);
    buf_free(&out);
    buf_free(&key);
    buf_free(&doc);
    return result;
}

/* -- Kafka messages (`KafkaSink.encoded`, native envelope) -------------------------------- */

/* The header names, in the order `kafka.record_headers` writes them (made once). */
static const char *HEADER_NAMES[] = {"tailrace-event-id", "tailrace-idempotency-key",
                                     "tailrace-schema-version", "tailrace-tx-id", "content-type"};
#define HEADERS 5
static PyObject *header_names[HEADERS];

static PyObject *span_bytes(Span s) { return PyBytes_FromStringAndSize(s.p, s.n); }

/* (key, value, headers, size) of one read event, or NULL with an exception set. */
static PyObject *kafka_record(Event *e, Buf *key, Buf *doc, PyObject *content_type) {
    Span values[HEADERS - 1] = {STR(e, F_ID), STR(e, F_IDEMPOTENCY), STR(e, F_SCHEMA_VERSION),
                                STR(e, F_TX_ID)};
    Py_ssize_t size = key->size + doc->size + PyBytes_GET_SIZE(content_type)
                      + PyUnicode_GET_LENGTH(header_names[HEADERS - 1]);
    PyObject *headers = PyList_New(HEADERS);
    if (headers == NULL) return NULL;
    for (int h = 0; h < HEADERS; h++) {
        PyObject *value = h < HEADERS - 1 ? span_bytes(values[h]) : Py_NewRef(content_type);
        PyObject *pair = value ? PyTuple_Pack(2, header_names[h], value) : NULL;
        Py_XDECREF(value);
        if (pair == NULL) { Py_DECREF(headers); return NULL; }
        PyList_SET_ITEM(headers, h, pair);
        if (h < HEADERS - 1) size += values[h].n + PyUnicode_GET_LENGTH(header_names[h]);
    }
    PyObject *k = PyBytes_FromStringAndSize(key->data ? key->data : "", key->size);
    PyObject *v = PyBytes_FromStringAndSize(doc->data ? doc->data : "", doc->size);
    PyObject *n = PyLong_FromSsize_t(size);
    PyObject *out = k && v && n ? PyTuple_Pack(4, k, v, headers, n) : NULL;
    Py_XDECREF(k);
    Py_XDECREF(v);
    Py_XDECREF(n);
    Py_DECREF(headers);
    return out;
}

/* kafka_records(events, content_type, value_fallback, key_fallback) -> list.
 *
 * For each serialized event, its one Kafka message with the native envelope, as
 * `KafkaSink.encoded` makes it in Python: (key json, event json, headers, size), size being
 * what `Message.size` counts. None for an event Python must make: an outbox message, or one
 * `event_json` or `key_json` leaves to Python (tests/unit/test_cjson.py). The list is the
 * caller's own (`_codec.kafka_records`): a fallback cannot change it while it is read. */
static PyObject *py_kafka_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_Check(args[0]) || !PyBytes_Check(args[1])
        || !PyCallable_Check(args[2]) || !PyCallable_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "kafka_records(events: list[bytes], content_type: bytes, "
                        "value_fallback, key_fallback)");
        return NULL;
    }
    PyObject *events = args[0];
    Py_ssize_t count = PyList_GET_SIZE(events);
    Event *event = PyMem_Malloc(sizeof(Event));
    ColumnSpan *columns = PyMem_Malloc(sizeof(ColumnSpan) * MAX_COLUMNS);
    Buf key = {0}, doc = {0};
    PyObject *result = PyList_New(count);
    if (result == NULL || event == NULL || columns == NULL) {
        if (result != NULL) PyErr_NoMemory();
        Py_CLEAR(result);
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *data = PyList_GET_ITEM(events, i), *item = NULL;
        if (!PyBytes_Check(data)) {
            PyErr_SetString(PyExc_TypeError, "kafka_records: events must be bytes");
            Py_CLEAR(result);
            goto done;
        }
        const char *p = PyBytes_AS_STRING(data);
        key.size = doc.size = 0;
        int rc = read_event(p, p + PyBytes_GET_SIZE(data), event);
        if (rc == 0 && event->outbox) rc = -2;
        if (rc == 0) rc = write_key(&key, event, columns, args[3]);
        if (rc == 0) rc = write_event(&doc, event, columns, args[2]);
        if (rc == 0) item = kafka_record(event, &key, &doc, args[1]);
        else if (rc == -2 && !PyErr_Occurred()) item = Py_NewRef(Py_None);
        if (item == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, item);
    }
done:
    PyMem_Free(event);
    PyMem_Free(columns);
    buf_free(&key);
    buf_free(&doc);
    return result;
}

static PyMethodDef methods[] = {
    {"event_json", (PyCFunction)(void (*)(void))py_event_json, METH_FASTCALL, NULL},
    {"key_json", (PyCFunction)(void (*)(void))py_key_json, METH_FASTCALL, NULL},
    {"redis_xadds", (PyCFunction)(void (*)(void))py_redis_xadds, METH_FASTCALL, NULL},
    {"kafka_records", (PyCFunction)(void (*)(void))py_kafka_records, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tailrace.events._cjson",
    "The sinks' JSON (native envelope, message key) in C, from an event's bytes "
    "(byte-identical to the Python; tests/unit/test_cjson.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cjson(void) {
    for (int h = 0; h < HEADERS; h++)
        if (header_names[h] == NULL && (header_names[h] = PyUnicode_InternFromString(HEADER_NAMES[h])) == NULL)
            return NULL;
    return PyModule_Create(&module);
}
