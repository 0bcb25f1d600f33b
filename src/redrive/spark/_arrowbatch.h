/* Arrow column builders shared by redrive's C range readers (_rangeread over librdkafka, and
 * _fetchread over Kafka's fetch protocol): one batch of the Kafka source's columns, filled a record
 * at a time without the GIL, then handed to Python as one bytes object per Arrow buffer, in the
 * tuple redrive.spark.buffers.batches wraps as arrays.
 *
 * Header-only with static functions: each extension gets its own copy, and neither links the other.
 */
#ifndef REDRIVE_ARROWBATCH_H
#define REDRIVE_ARROWBATCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A growable byte buffer. */
typedef struct {
    char *data;
    size_t len, cap;
} Buf;

static inline int buf_reserve(Buf *b, size_t more) {
    if (b->len + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more)
        cap *= 2;
    char *data = realloc(b->data, cap);
    if (data == NULL)
        return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, size_t n) {
    if (buf_reserve(b, n) < 0)
        return -1;
    if (n)
        memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

/* A nullable Arrow binary/string column: validity bitmap, int32 offsets, data. */
typedef struct {
    Buf validity, offsets, data;
    int64_t rows, nulls;
} BinCol;

/* Clears as well as sets: a row taken back (batch_rewind) may have left its bit set. */
static inline int bit_put(Buf *bitmap, int64_t row, int valid) {
    if (row % 8 == 0) {
        char zero = 0;
        if (buf_put(bitmap, &zero, 1) < 0)
            return -1;
    }
    if (valid)
        bitmap->data[row / 8] |= (char)(1 << (row % 8));
    else
        bitmap->data[row / 8] &= (char)~(1 << (row % 8));
    return 0;
}

/* The most a column's data may hold: Arrow's int32 offsets. A test builds a copy with a small
 * limit, to reach it without gigabytes. */
#ifndef COLUMN_LIMIT
#define COLUMN_LIMIT INT32_MAX
#endif

static inline int bincol_put(BinCol *c, const void *src, size_t n, int valid) {
    if (c->rows == 0) {
        int32_t zero = 0;
        if (buf_put(&c->offsets, &zero, sizeof zero) < 0)
            return -1;
    }
    if (bit_put(&c->validity, c->rows, valid) < 0)
        return -1;
    if (valid && buf_put(&c->data, src, n) < 0)
        return -1;
    if (c->data.len > COLUMN_LIMIT)
        return -1;
    int32_t end = (int32_t)c->data.len;
    if (buf_put(&c->offsets, &end, sizeof end) < 0)
        return -1;
    c->rows++;
    c->nulls += !valid;
    return 0;
}

static inline void buf_clear(Buf *b) { b->len = 0; }

static inline void bincol_clear(BinCol *c) {
    buf_clear(&c->validity);
    buf_clear(&c->offsets);
    buf_clear(&c->data);
    c->rows = c->nulls = 0;
}

static inline void bincol_free(BinCol *c) {
    free(c->validity.data);
    free(c->offsets.data);
    free(c->data.data);
    memset(c, 0, sizeof *c);
}

/* One batch's columns. Headers are list<struct<key: string, value: binary>>: the list's
 * validity and offsets, and the struct's two children. */
typedef struct {
    BinCol keys, values, header_keys, header_values;
    Buf offsets, timestamps_us, timestamp_types, header_validity, header_offsets;
    int64_t rows, header_nulls;
} Batch;

static inline void batch_clear(Batch *b) {
    bincol_clear(&b->keys);
    bincol_clear(&b->values);
    bincol_clear(&b->header_keys);
    bincol_clear(&b->header_values);
    buf_clear(&b->offsets);
    buf_clear(&b->timestamps_us);
    buf_clear(&b->timestamp_types);
    buf_clear(&b->header_validity);
    buf_clear(&b->header_offsets);
    b->rows = b->header_nulls = 0;
}

static inline void batch_free(Batch *b) {
    bincol_free(&b->keys);
    bincol_free(&b->values);
    bincol_free(&b->header_keys);
    bincol_free(&b->header_values);
    free(b->offsets.data);
    free(b->timestamps_us.data);
    free(b->timestamp_types.data);
    free(b->header_validity.data);
    free(b->header_offsets.data);
    memset(b, 0, sizeof *b);
}

/* Where each column of a batch ends: a row that fails part way is taken back to it, so that
 * every column keeps the batch's row count. */
typedef struct {
    size_t len[17];
    int64_t counts[9];
} BatchMark;

#define BATCH_BUFS(b)                                                                             \
    &(b)->keys.validity, &(b)->keys.offsets, &(b)->keys.data, &(b)->values.validity,              \
        &(b)->values.offsets, &(b)->values.data, &(b)->header_keys.validity,                      \
        &(b)->header_keys.offsets, &(b)->header_keys.data, &(b)->header_values.validity,          \
        &(b)->header_values.offsets, &(b)->header_values.data, &(b)->offsets,                     \
        &(b)->timestamps_us, &(b)->timestamp_types, &(b)->header_validity, &(b)->header_offsets
#define BATCH_COUNTS(b)                                                                           \
    &(b)->keys.rows, &(b)->keys.nulls, &(b)->values.rows, &(b)->values.nulls,                     \
        &(b)->header_keys.rows, &(b)->header_keys.nulls, &(b)->header_values.rows,                \
        &(b)->header_values.nulls, &(b)->header_nulls

static inline void batch_mark(Batch *b, BatchMark *m) {
    Buf *bufs[] = {BATCH_BUFS(b)};
    int64_t *counts[] = {BATCH_COUNTS(b)};
    _Static_assert(sizeof bufs / sizeof *bufs == sizeof m->len / sizeof *m->len &&
                       sizeof counts / sizeof *counts == sizeof m->counts / sizeof *m->counts,
                   "a BatchMark holds every column");
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        m->len[i] = bufs[i]->len;
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++)
        m->counts[i] = *counts[i];
}

static inline void batch_rewind(Batch *b, const BatchMark *m) {
    Buf *bufs[] = {BATCH_BUFS(b)};
    int64_t *counts[] = {BATCH_COUNTS(b)};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        bufs[i]->len = m->len[i];
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++)
        *counts[i] = m->counts[i];
}

/* One record's own columns; its headers, if the batch has them, follow with batch_headers_*. */
static inline int batch_row(Batch *b, const void *key, size_t key_len, int has_key, const void *value,
                     size_t value_len, int has_value, int64_t offset, int64_t timestamp_us,
                     int32_t spark_kind) {
    if (bincol_put(&b->keys, key, key_len, has_key) < 0 ||
        bincol_put(&b->values, value, value_len, has_value) < 0 ||
        buf_put(&b->offsets, &offset, sizeof offset) < 0 ||
        buf_put(&b->timestamps_us, &timestamp_us, sizeof timestamp_us) < 0 ||
        buf_put(&b->timestamp_types, &spark_kind, sizeof spark_kind) < 0)
        return -1;
    return 0;
}

/* Opens the current row's header list; a record without headers has a null list, as
 * confluent-kafka's headers() gives None. */
static inline int batch_headers_begin(Batch *b, size_t count) {
    if (b->rows == 0) {
        int32_t zero = 0;
        if (buf_put(&b->header_offsets, &zero, sizeof zero) < 0)
            return -1;
    }
    if (bit_put(&b->header_validity, b->rows, count > 0) < 0)
        return -1;
    b->header_nulls += count == 0;
    return 0;
}

/* The length of the UTF-8 sequence at `p` if it is a valid one, else 0; `part` gets how many
 * bytes one U+FFFD stands for (the maximal subpart, as the Unicode standard and Python count). */
static inline size_t utf8_sequence(const unsigned char *p, size_t left, size_t *part) {
    unsigned char lead = p[0], lo = 0x80, hi = 0xBF;
    size_t need;
    *part = 1;
    if (lead < 0x80)
        return 1;
    if (lead >= 0xC2 && lead <= 0xDF)
        need = 2;
    else if (lead >= 0xE0 && lead <= 0xEF) {
        need = 3;
        lo = lead == 0xE0 ? 0xA0 : 0x80;
        hi = lead == 0xED ? 0x9F : 0xBF;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        need = 4;
        lo = lead == 0xF0 ? 0x90 : 0x80;
        hi = lead == 0xF4 ? 0x8F : 0xBF;
    } else
        return 0;
    size_t i = 1;
    for (; i < need && i < left && p[i] >= lo && p[i] <= hi; i++)
        lo = 0x80, hi = 0xBF;
    *part = i;
    return i == need ? need : 0;
}

/* Puts text into a string column. Kafka's header names are UTF-8 by contract but nothing checks
 * the bytes; Arrow and Spark require valid UTF-8, so each invalid sequence becomes U+FFFD, as
 * Java's consumer (and Python's errors="replace") decodes it. */
static inline int textcol_put(BinCol *c, const unsigned char *text, size_t len) {
    size_t at = 0, part;
    while (at < len && utf8_sequence(text + at, len - at, &part))
        at += part;
    if (at == len)
        return bincol_put(c, text, len, 1);
    Buf fixed = {0};
    int rc = buf_put(&fixed, text, at);
    while (rc == 0 && at < len) {
        size_t n = utf8_sequence(text + at, len - at, &part);
        rc = n ? buf_put(&fixed, text + at, n) : buf_put(&fixed, "\xEF\xBF\xBD", 3);
        at += part;
    }
    if (rc == 0)
        rc = bincol_put(c, fixed.data, fixed.len, 1);
    free(fixed.data);
    return rc;
}

static inline int batch_header_put(Batch *b, const char *name, size_t name_len, const void *value,
                            size_t value_len, int has_value) {
    if (textcol_put(&b->header_keys, (const unsigned char *)name, name_len) < 0 ||
        bincol_put(&b->header_values, value, value_len, has_value) < 0)
        return -1;
    return 0;
}

static inline int batch_headers_end(Batch *b) {
    int32_t end = (int32_t)b->header_keys.rows;
    return buf_put(&b->header_offsets, &end, sizeof end);
}

static inline PyObject *bytes_of(const Buf *b) { return PyBytes_FromStringAndSize(b->data, (Py_ssize_t)b->len); }

/* (validity or None, offsets, data, null count) of a binary column. */
static inline PyObject *bincol_tuple(const BinCol *c) {
    if (c->rows == 0)
        return Py_BuildValue("(Oy#y#L)", Py_None, "\0\0\0\0", (Py_ssize_t)4, "", (Py_ssize_t)0,
                             0LL);
    PyObject *validity = c->nulls ? bytes_of(&c->validity) : Py_NewRef(Py_None);
    if (validity == NULL)
        return NULL;
    return Py_BuildValue("(NNNL)", validity, bytes_of(&c->offsets), bytes_of(&c->data),
                         (long long)c->nulls);
}

/* The batch as (rows, keys, values, offsets, timestamps, kinds, headers or None). */
static inline PyObject *batch_tuple(const Batch *b, int with_headers) {
    PyObject *headers;
    if (with_headers) {
        PyObject *list_validity = b->header_nulls ? bytes_of(&b->header_validity)
                                                  : Py_NewRef(Py_None);
        if (list_validity == NULL)
            return NULL;
        headers = Py_BuildValue("(NLNLNN)", list_validity, (long long)b->header_nulls,
                                bytes_of(&b->header_offsets), (long long)b->header_keys.rows,
                                bincol_tuple(&b->header_keys), bincol_tuple(&b->header_values));
    } else {
        headers = Py_NewRef(Py_None);
    }
    if (headers == NULL)
        return NULL;
    return Py_BuildValue("(LNNNNNN)", (long long)b->rows, bincol_tuple(&b->keys),
                         bincol_tuple(&b->values), bytes_of(&b->offsets),
                         bytes_of(&b->timestamps_us), bytes_of(&b->timestamp_types), headers);
}

/* A reader's fill: adds records to its batch until max_rows, max_bytes or the range's end; runs
 * without the GIL and returns -1 with `why` for a read that must fail. */
typedef int (*FillBatch)(void *reader, int64_t max_rows, int64_t max_bytes, char *why,
                         size_t why_len);

/* The body of a reader's read(max_rows, max_bytes): the next batch's buffers, None when the
 * batch came out empty, or `error` raised with fill's reason. */
static inline PyObject *read_batch(void *reader, Batch *b, int with_headers, FillBatch fill,
                            PyObject *error, PyObject *args) {
    long long max_rows, max_bytes;
    if (!PyArg_ParseTuple(args, "LL", &max_rows, &max_bytes))
        return NULL;
    batch_clear(b);
    char why[512] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fill(reader, max_rows, max_bytes, why, sizeof why);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_SetString(error, why);
        return NULL;
    }
    if (b->rows == 0)
        Py_RETURN_NONE;
    return batch_tuple(b, with_headers);
}

#endif
