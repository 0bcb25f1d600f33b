/* redrive.spark._fetchread: read offsets [start, end) of one Kafka partition by speaking Kafka's own
 * Metadata and Fetch requests, straight into Arrow buffers.
 *
 * A client library turns every fetched record into a message of its own (an allocation, a queue
 * hand-off between threads, a free) before a reader sees it; on a Spark executor that costs more
 * CPU than Spark's own work on the row. This reader asks the partition's leader for the range and
 * parses the record batches of the answer in place, in one buffer it keeps, writing each record's
 * fields into the Arrow columns: no object and no allocation per record.
 *
 * It handles what a healthy plaintext cluster sends: uncompressed record batches (format v2),
 * transaction markers, and aborted transactions under read_committed. Anything else - a
 * compressed or old-format batch, a partition error (offset out of range, a moved leader), a
 * broker that refuses, drops or garbles the connection - stops it at the position reached with a
 * reason (`handoff`), and redrive.spark.source reads the rest of the range with the librdkafka
 * reader, which knows every case. The one error it raises itself is a read that makes no progress
 * while the broker answers: the range goes past what the partition holds.
 *
 * The request versions (Metadata v4, Fetch v4) are those every broker from Kafka 1.0 to 4.x serves.
 *
 * `feed(answers)` gives a reader the bytes a broker would send instead of a connection: its fetch
 * answers, each with its size and correlation id. The fuzz harness (tests/fuzz) drives the parser
 * that way, millions of times faster than a socket would.
 */
#include "_fetchread.h"

#include <time.h>

static PyObject *ReadError;

static double monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int by_first_offset(const void *a, const void *b) {
    int64_t x = ((const Aborted *)a)->first_offset, y = ((const Aborted *)b)->first_offset;
    return (x > y) - (x < y);
}

/* Sends a fetch at the position and reads its answer up to the partition's records. */
static int fetch(FetchReader *self) {
    if (self->fd < 0 && self->fed == NULL && connect_leader(self) < 0)
        return -1;
    Buf body = {0};
    int32_t wait_ms = self->poll_timeout_ms < MAX_WAIT_MS ? self->poll_timeout_ms : MAX_WAIT_MS;
    int rc = put_int(&body, -1, 4) < 0 || put_int(&body, wait_ms, 4) < 0 ||
             put_int(&body, 1, 4) < 0 || put_int(&body, self->fetch_bytes, 4) < 0 ||
             put_int(&body, self->read_committed, 1) < 0 || put_int(&body, 1, 4) < 0 ||
             put_string(&body, self->topic) < 0 || put_int(&body, 1, 4) < 0 ||
             put_int(&body, self->partition, 4) < 0 || put_int(&body, self->position, 8) < 0 ||
             put_int(&body, self->fetch_bytes, 4) < 0;
    if (rc || ask(self, API_FETCH, FETCH_VERSION, &body) < 0) {
        free(body.data);
        stop_with(self, "the fetch request failed");
        return -1;
    }
    free(body.data);
    /* throttle_time_ms, one topic (name), one partition: index, error, high watermark, last
     * stable offset. */
    size_t topic_len = strlen(self->topic);
    const unsigned char *p = take(self, 4 + 4 + 2 + topic_len + 4 + 4 + 2 + 8 + 8 + 4);
    if (p == NULL)
        return -1;
    Cur c = {p, p + 40 + topic_len, 0};
    cur_int(&c, 4);
    int64_t topics = cur_int(&c, 4), name_len;
    const unsigned char *name = cur_string(&c, &name_len);
    int64_t parts = cur_int(&c, 4), index = cur_int(&c, 4), error = cur_int(&c, 2);
    cur_int(&c, 8);
    cur_int(&c, 8);
    int64_t aborted = cur_int(&c, 4);
    if (c.bad || topics != 1 || parts != 1 || index != self->partition || name == NULL ||
        (size_t)name_len != topic_len || memcmp(name, self->topic, topic_len) != 0) {
        stop_with(self, "a fetch answer for another partition");
        return -1;
    }
    if (error != 0) {
        stop_with(self, "the broker answered the fetch with error %d", (int)error);
        return -1;
    }
    self->aborted_count = self->aborted_next = self->open_count = 0;
    if (aborted > self->answer_left / 16) {
        /* Each takes 16 bytes: a count past what the answer holds is not allocated for. */
        stop_with(self, "an answer shorter than its aborted transactions");
        return -1;
    }
    if (aborted > 0) {
        if ((size_t)aborted > self->aborted_cap) {
            Aborted *grown = realloc(self->aborted, (size_t)aborted * sizeof *grown);
            int64_t *open = realloc(self->open_aborts, (size_t)aborted * sizeof *open);
            if (open != NULL)
                self->open_aborts = open;
            if (grown != NULL)
                self->aborted = grown;
            if (grown == NULL || open == NULL) {
                stop_with(self, "out of memory for aborted transactions");
                return -1;
            }
            self->aborted_cap = (size_t)aborted;
        }
        for (int64_t i = 0; i < aborted; i++) {
            if ((p = take(self, 16)) == NULL)
                return -1;
            self->aborted[i].producer_id = be(p, 8);
            self->aborted[i].first_offset = be(p + 8, 8);
        }
        self->aborted_count = (size_t)aborted;
        qsort(self->aborted, self->aborted_count, sizeof *self->aborted, by_first_offset);
    }
    if ((p = take(self, 4)) == NULL)
        return -1;
    int64_t records = (int32_t)be(p, 4);
    self->records_left = records > 0 ? records : 0;
    self->answer_had_records = records > 0;
    return 0;
}

static void advance_to(FetchReader *self, int64_t offset) {
    if (offset > self->position)
        self->position = offset < self->end ? offset : self->end;
}

static int aborted_open(FetchReader *self, int64_t producer) {
    for (size_t i = 0; i < self->open_count; i++)
        if (self->open_aborts[i] == producer)
            return 1;
    return 0;
}

/* Takes the next record batch of the answer: either opens it for its records, or steps over it
 * (already read, a transaction marker, an aborted transaction). A batch the answer cut short ends
 * the answer. */
static int open_batch(FetchReader *self) {
    if (self->records_left < BATCH_HEADER) {
        int64_t rest = self->records_left;
        self->records_left = 0;
        return skip(self, rest);
    }
    if (need(self, 12) < 0)
        return -1;
    const unsigned char *p = self->in + self->in_start;
    int64_t size = 12 + (int64_t)(int32_t)be(p + 8, 4);
    if (size < BATCH_HEADER) {
        /* Garbled, not cut: skipped, it would come back in every answer until the read fails
         * as stuck, where another reader may well read on. */
        stop_with(self, "a malformed record batch");
        return -1;
    }
    if (size > self->records_left) {
        /* The answer's byte limit cut this batch; the next fetch starts at it. If not even one
         * batch fitted, ask for more next time. */
        int64_t rest = self->records_left;
        self->records_left = 0;
        if (size > self->fetch_bytes && self->fetch_bytes < FETCH_BYTES_LIMIT)
            self->fetch_bytes = size < FETCH_BYTES_LIMIT ? (int32_t)size : FETCH_BYTES_LIMIT;
        return skip(self, rest);
    }
    if (self->answer_left < size) {
        stop_with(self, "an answer shorter than its records");
        return -1;
    }
    if (need(self, (size_t)size) < 0)
        return -1;
    p = self->in + self->in_start;
    int magic = p[16];
    int attributes = (int)be(p + 21, 2);
    int64_t base = be(p, 8), last;
    if (magic != 2) {
        stop_with(self, "a record batch of message format v%d", magic);
        return -1;
    }
    if (base < 0 || __builtin_add_overflow(base, (int32_t)be(p + 23, 4), &last) ||
        last == INT64_MAX) {
        stop_with(self, "a record batch with offsets out of range");
        return -1;
    }
    /* Taken whole from the answer now; its bytes stay in `in` until the next need(). */
    self->in_start += (size_t)size;
    self->answer_left -= size;
    self->records_left -= size;
    int64_t producer = be(p + 43, 8);
    if (self->read_committed) {
        while (self->aborted_next < self->aborted_count &&
               self->aborted[self->aborted_next].first_offset <= last)
            self->open_aborts[self->open_count++] = self->aborted[self->aborted_next++].producer_id;
    }
    if (attributes & 0x20) {
        /* A transaction marker: its one record's key is (version, type), type 0 an abort. */
        Cur c = {p + BATCH_HEADER, p + size, 0};
        cur_varint(&c);
        cur_int(&c, 1);
        cur_varint(&c);
        cur_varint(&c);
        int64_t key_len = cur_varint(&c);
        if (!c.bad && key_len >= 4 && cur_has(&c, 4) && be(c.p + 2, 2) == 0) {
            /* Backwards, so that the entry swapped into a freed slot was already looked at. */
            for (size_t i = self->open_count; i-- > 0;)
                if (self->open_aborts[i] == producer)
                    self->open_aborts[i] = self->open_aborts[--self->open_count];
        }
        advance_to(self, last + 1);
        return 0;
    }
    if (last < self->position)
        return 0;
    if (self->read_committed && (attributes & 0x10) && aborted_open(self, producer)) {
        advance_to(self, last + 1);
        return 0;
    }
    if (attributes & 0x07) {
        /* Given back: the next reader starts at this batch. */
        stop_with(self, "a compressed record batch (codec %d)", attributes & 0x07);
        return -1;
    }
    self->in_batch = 1;
    self->records = (Cur){p + BATCH_HEADER, p + size, 0};
    self->batch_base = base;
    self->batch_last = last;
    self->batch_base_ts = be(p + 27, 8);
    self->batch_max_ts = be(p + 35, 8);
    self->batch_log_append = (attributes & 0x08) != 0;
    self->batch_left = (int32_t)be(p + 57, 4);
    return 0;
}

/* Takes the open batch's next record into the Arrow batch (or steps over it). */
static int take_record(FetchReader *self) {
    Batch *b = &self->batch;
    Cur *c = &self->records;
    if (self->batch_left <= 0 || c->p >= c->end) {
        self->in_batch = 0;
        advance_to(self, self->batch_last + 1);
        return 0;
    }
    self->batch_left--;
    int64_t length = cur_varint(c);
    if (c->bad || length < 0 || length > c->end - c->p) {
        stop_with(self, "a malformed record");
        return -1;
    }
    Cur r = {c->p, c->p + length, 0};
    c->p += length;
    cur_int(&r, 1);
    int64_t ts_delta = cur_varint(&r), offset;
    if (__builtin_add_overflow(self->batch_base, cur_varint(&r), &offset)) {
        stop_with(self, "a malformed record");
        return -1;
    }
    int64_t key_len = cur_varint(&r);
    const unsigned char *key = r.p;
    cur_skip(&r, key_len > 0 ? key_len : 0);
    int64_t value_len = cur_varint(&r);
    const unsigned char *value = r.p;
    cur_skip(&r, value_len > 0 ? value_len : 0);
    int64_t header_count = cur_varint(&r);
    if (r.bad || header_count < 0) {
        stop_with(self, "a malformed record");
        return -1;
    }
    /* The headers are checked before any field of the record is written, so that a malformed
     * one leaves no half-written row in the batch. */
    Cur check = r;
    for (int64_t i = 0; i < header_count && !check.bad; i++) {
        int64_t name_len = cur_varint(&check);
        cur_skip(&check, name_len);
        int64_t hv_len = cur_varint(&check);
        cur_skip(&check, hv_len > 0 ? hv_len : 0);
    }
    if (check.bad) {
        stop_with(self, "a malformed record header");
        return -1;
    }
    if (offset < self->position)
        return 0;
    if (offset >= self->end) {
        self->position = self->end;
        self->in_batch = 0;
        return 0;
    }
    int64_t ms = self->batch_max_ts, us;
    if (!self->batch_log_append && __builtin_add_overflow(self->batch_base_ts, ts_delta, &ms))
        ms = ts_delta < 0 ? INT64_MIN : INT64_MAX;
    /* A time past what Spark's microseconds hold is garbage in any case: it stays at the edge. */
    if (__builtin_mul_overflow(ms, 1000, &us))
        us = ms < 0 ? INT64_MIN : INT64_MAX;
    BatchMark mark;
    batch_mark(b, &mark);
    /* Spark's timestampType: 0 create time, 1 log append time. */
    if (batch_row(b, key, key_len > 0 ? (size_t)key_len : 0, key_len >= 0, value,
                  value_len > 0 ? (size_t)value_len : 0, value_len >= 0, offset, us,
                  self->batch_log_append) < 0)
        goto no_memory;
    if (self->with_headers) {
        if (batch_headers_begin(b, (size_t)header_count) < 0)
            goto no_memory;
        for (int64_t i = 0; i < header_count; i++) {
            int64_t name_len = cur_varint(&r);
            const unsigned char *name = r.p;
            cur_skip(&r, name_len);
            int64_t hv_len = cur_varint(&r);
            const unsigned char *hv = r.p;
            cur_skip(&r, hv_len > 0 ? hv_len : 0);
            if (batch_header_put(b, (const char *)name, (size_t)name_len, hv,
                                 hv_len > 0 ? (size_t)hv_len : 0, hv_len >= 0) < 0)
                goto no_memory;
        }
        if (batch_headers_end(b) < 0)
            goto no_memory;
    }
    b->rows++;
    self->position = offset + 1;
    return 0;
no_memory:
    batch_rewind(b, &mark);
    stop_with(self, "out of memory, or a batch over 2 GiB");
    return -1;
}

/* Fills the batch until it holds max_rows records or max_bytes of keys, values and headers, the
 * range is done, or the rest is handed off. Runs without the GIL. Returns -1 (with `why`) only
 * for a read that makes no progress while the broker answers. */
static int fill_batch(void *reader, int64_t max_rows, int64_t max_bytes, char *why,
                      size_t why_len) {
    FetchReader *self = reader;
    Batch *b = &self->batch;
    int64_t seen = self->position;
    double idle_until = monotonic_ms() + self->poll_timeout_ms;
    while (self->position < self->end && !self->handoff[0] && b->rows < max_rows &&
           (int64_t)(b->keys.data.len + b->values.data.len + b->header_keys.data.len +
                     b->header_values.data.len) < max_bytes) {
        if (self->in_batch) {
            if (take_record(self) < 0)
                return 0;
            continue;
        }
        if (self->records_left > 0) {
            if (open_batch(self) < 0)
                return 0;
            continue;
        }
        if (self->answer_left > 0 && skip(self, self->answer_left) < 0)
            return 0;
        double now = monotonic_ms();
        if (self->position > seen) {
            seen = self->position;
            idle_until = now + self->poll_timeout_ms;
        } else if (now > idle_until) {
            snprintf(why, why_len, "stuck at offset %lld for %.1fs (kafkaConsumer.pollTimeoutMs)",
                     (long long)self->position, self->poll_timeout_ms / 1000.0);
            return -1;
        }
        if (fetch(self) < 0)
            return 0;
        if (!self->answer_had_records && self->fed == NULL) {
            /* Nothing yet: brokers that answer at once instead of waiting get a pause. */
            struct timespec pause = {0, 20 * 1000 * 1000};
            nanosleep(&pause, NULL);
        } else if (self->fetch_bytes < FETCH_BYTES) {
            self->fetch_bytes = FETCH_BYTES;
        }
    }
    return 0;
}

static void reader_close(FetchReader *self) {
    disconnect(self);
    free(self->in);
    free(self->aborted);
    free(self->open_aborts);
    free(self->fed);
    self->fed = NULL;
    self->fed_len = self->fed_at = 0;
    self->in = NULL;
    self->aborted = NULL;
    self->open_aborts = NULL;
    self->in_cap = self->aborted_cap = 0;
}

static void FetchReader_dealloc(FetchReader *self) {
    reader_close(self);
    batch_free(&self->batch);
    PyMem_Free(self->bootstrap);
    PyMem_Free(self->topic);
    PyMem_Free(self->client_id);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static char *copy_text(const char *s) {
    size_t n = strlen(s) + 1;
    char *copy = PyMem_Malloc(n);
    if (copy == NULL)
        PyErr_NoMemory();
    else
        memcpy(copy, s, n);
    return copy;
}

/* A zero-filled reader would take fd 0 for its connection and close it on dealloc or close(),
 * whether __init__ failed or never ran: -1 says it has none. */
static PyObject *FetchReader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    FetchReader *self = (FetchReader *)PyType_GenericNew(type, args, kwargs);
    if (self != NULL)
        self->fd = -1;
    return (PyObject *)self;
}

static int FetchReader_init(FetchReader *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"bootstrap", "topic", "partition", "start", "end", "include_headers",
                            "read_committed", "poll_timeout_ms", "client_id", NULL};
    const char *bootstrap, *topic, *client_id = "redrive";
    int partition, with_headers, read_committed, poll_timeout_ms;
    long long start, end;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ssiLLppi|s", names, &bootstrap, &topic,
                                     &partition, &start, &end, &with_headers, &read_committed,
                                     &poll_timeout_ms, &client_id))
        return -1;
    if (self->topic != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "FetchReader is already initialised");
        return -1;
    }
    if (start < 0 || end < start || poll_timeout_ms < 1) {
        PyErr_Format(PyExc_ValueError, "bad range [%lld, %lld) or poll timeout %d", start, end,
                     poll_timeout_ms);
        return -1;
    }
    /* All three or none: a failed copy left in place would leak on the next __init__. */
    char *bootstrap_copy = copy_text(bootstrap), *topic_copy = copy_text(topic),
         *client_id_copy = copy_text(client_id);
    if (bootstrap_copy == NULL || topic_copy == NULL || client_id_copy == NULL) {
        PyMem_Free(bootstrap_copy);
        PyMem_Free(topic_copy);
        PyMem_Free(client_id_copy);
        return -1;
    }
    self->bootstrap = bootstrap_copy;
    self->topic = topic_copy;
    self->client_id = client_id_copy;
    self->partition = partition;
    self->position = start;
    self->end = end;
    self->with_headers = with_headers;
    self->read_committed = read_committed;
    self->poll_timeout_ms = poll_timeout_ms;
    self->fetch_bytes = FIRST_FETCH_BYTES;
    return 0;
}

/* Raises for a call from another thread while read() runs: it would free the buffers that the
 * read, without the GIL, is receiving into. */
static int refuse_if_busy(FetchReader *self) {
    if (!self->busy)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "FetchReader is reading in another thread");
    return -1;
}

static PyObject *FetchReader_read(FetchReader *self, PyObject *args) {
    if (self->topic == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "FetchReader is not initialised");
        return NULL;
    }
    if (refuse_if_busy(self) < 0)
        return NULL;
    self->busy = 1;
    PyObject *batch = read_batch(self, &self->batch, self->with_headers, fill_batch, ReadError,
                                 args);
    self->busy = 0;
    return batch;
}

static PyObject *FetchReader_feed(FetchReader *self, PyObject *args) {
    if (refuse_if_busy(self) < 0)
        return NULL;
    Py_buffer answers;
    if (!PyArg_ParseTuple(args, "y*", &answers))
        return NULL;
    unsigned char *copy = malloc(answers.len ? (size_t)answers.len : 1);
    if (copy == NULL) {
        PyBuffer_Release(&answers);
        return PyErr_NoMemory();
    }
    memcpy(copy, answers.buf, (size_t)answers.len);
    free(self->fed);
    self->fed = copy;
    self->fed_len = (size_t)answers.len;
    self->fed_at = 0;
    PyBuffer_Release(&answers);
    Py_RETURN_NONE;
}

static PyObject *FetchReader_close(FetchReader *self, PyObject *Py_UNUSED(ignored)) {
    if (refuse_if_busy(self) < 0)
        return NULL;
    reader_close(self);
    Py_RETURN_NONE;
}

static PyObject *FetchReader_position(FetchReader *self, void *Py_UNUSED(closure)) {
    return PyLong_FromLongLong(self->position);
}

static PyObject *FetchReader_handoff(FetchReader *self, void *Py_UNUSED(closure)) {
    if (!self->handoff[0])
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(self->handoff, (Py_ssize_t)strlen(self->handoff), "replace");
}

static PyMethodDef FetchReader_methods[] = {
    {"read", (PyCFunction)FetchReader_read, METH_VARARGS,
     "read(max_rows, max_bytes) -> the next batch's buffers, or None when the range is done or "
     "handed off"},
    {"close", (PyCFunction)FetchReader_close, METH_NOARGS, "close the connection"},
    {"feed", (PyCFunction)FetchReader_feed, METH_VARARGS,
     "feed(answers) -> read these bytes (fetch answers as a broker sends them, each with its size "
     "and correlation id) instead of connecting; for the fuzz harness"},
    {NULL},
};

static PyGetSetDef FetchReader_getset[] = {
    {"position", (getter)FetchReader_position, NULL, "the next offset to read", NULL},
    {"handoff", (getter)FetchReader_handoff, NULL,
     "why the rest of the range is for another reader, or None", NULL},
    {NULL},
};

static PyTypeObject FetchReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "redrive.spark._fetchread.FetchReader",
    .tp_doc = "Reads offsets [start, end) of one partition with Kafka's fetch protocol.",
    .tp_basicsize = sizeof(FetchReader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = FetchReader_new,
    .tp_init = (initproc)FetchReader_init,
    .tp_dealloc = (destructor)FetchReader_dealloc,
    .tp_methods = FetchReader_methods,
    .tp_getset = FetchReader_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "redrive.spark._fetchread",
    .m_doc = "Reads a Kafka partition range into Arrow buffers with Kafka's fetch protocol.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__fetchread(void) {
    if (PyType_Ready(&FetchReaderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    ReadError = PyErr_NewException("redrive.spark._fetchread.ReadError", PyExc_RuntimeError, NULL);
    if (ReadError == NULL || PyModule_AddObjectRef(m, "ReadError", ReadError) < 0 ||
        PyModule_AddObjectRef(m, "FetchReader", (PyObject *)&FetchReaderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
