/* redrive.spark._rangeread: read offsets [start, end) of one Kafka partition straight into Arrow buffers.
 *
 * The Spark source spends most of a read making a Python object per record (a confluent-kafka
 * Message, its key, value, timestamp tuple and headers) only to pour them into Arrow arrays. This
 * reader fills the Arrow columns' buffers from librdkafka's messages in C, with the GIL released,
 * and hands back one bytes object per buffer; redrive.spark.native_read wraps them as arrays.
 *
 * The loop's rules are those of the Python reader in redrive.spark.source: the position moves by
 * records and by end-of-partition events (under read_committed the last offsets of a range may be
 * transaction markers or aborted records, never delivered), offsets at or past `end` are dropped,
 * any other consumer error is fatal, and a read that makes no progress for `poll_timeout_ms` fails.
 */
#include "_arrowbatch.h"

#include <librdkafka/rdkafka.h>
#include <time.h>

#define CONSUME_BATCH 5000
#define POLL_MS 500

static PyObject *ReadError;

static int batch_headers(Batch *b, const rd_kafka_message_t *m) {
    rd_kafka_headers_t *hdrs = NULL;
    size_t count = 0;
    if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR)
        count = rd_kafka_header_cnt(hdrs);
    if (batch_headers_begin(b, count) < 0)
        return -1;
    for (size_t i = 0; i < count; i++) {
        const char *name;
        const void *value;
        size_t size;
        if (rd_kafka_header_get_all(hdrs, i, &name, &value, &size) != RD_KAFKA_RESP_ERR_NO_ERROR ||
            batch_header_put(b, name, strlen(name), value, size, value != NULL) < 0)
            return -1;
    }
    return batch_headers_end(b);
}

static int batch_add(Batch *b, const rd_kafka_message_t *m, int with_headers) {
    rd_kafka_timestamp_type_t kind;
    int64_t ms = rd_kafka_message_timestamp(m, &kind);
    /* Spark's timestampType: -1 none, 0 create time, 1 log append time (librdkafka's minus 1). */
    if (batch_row(b, m->key, m->key_len, m->key != NULL, m->payload, m->len, m->payload != NULL,
                  m->offset, ms * 1000, (int32_t)kind - 1) < 0)
        return -1;
    if (with_headers && batch_headers(b, m) < 0)
        return -1;
    b->rows++;
    return 0;
}

typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
    rd_kafka_queue_t *queue;
    char *topic;
    int32_t partition;
    int64_t start, end, position;
    int with_headers;
    int skip_lost;
    int poll_timeout_ms;
    Batch batch;
    /* The last consumed messages; those from `next` to `count` are not taken yet. */
    rd_kafka_message_t *messages[CONSUME_BATCH];
    ssize_t next, count;
    /* The client's last error report (a broker it cannot reach, say), for the stuck error. */
    char last_error[256];
} RangeReader;

/* Served by the consume calls of fill(), on the reading thread. */
static void on_client_error(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    (void)rk;
    (void)err;
    RangeReader *self = opaque;
    snprintf(self->last_error, sizeof self->last_error, "%s", reason);
}

static double monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void reader_close(RangeReader *self) {
    rd_kafka_t *rk = self->rk;
    rd_kafka_queue_t *queue = self->queue;
    self->rk = NULL;
    self->queue = NULL;
    if (rk == NULL)
        return;
    while (self->next < self->count)
        rd_kafka_message_destroy(self->messages[self->next++]);
    Py_BEGIN_ALLOW_THREADS
    if (queue != NULL)
        rd_kafka_queue_destroy(queue);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    Py_END_ALLOW_THREADS
}

static void RangeReader_dealloc(RangeReader *self) {
    reader_close(self);
    batch_free(&self->batch);
    PyMem_Free(self->topic);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int assign_at(RangeReader *self, int64_t offset) {
    rd_kafka_topic_partition_list_t *assignment = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(assignment, self->topic, self->partition)->offset = offset;
    rd_kafka_resp_err_t err = rd_kafka_assign(self->rk, assignment);
    rd_kafka_topic_partition_list_destroy(assignment);
    return err == RD_KAFKA_RESP_ERR_NO_ERROR ? 0 : -1;
}

static int RangeReader_init(RangeReader *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"config", "topic", "partition", "start", "end", "include_headers",
                            "poll_timeout_ms", "skip_lost", NULL};
    PyObject *config;
    const char *topic;
    int partition, with_headers, poll_timeout_ms, skip_lost;
    long long start, end;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OsiLLpip", names, &config, &topic, &partition,
                                     &start, &end, &with_headers, &poll_timeout_ms, &skip_lost))
        return -1;
    if (self->rk != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "RangeReader is already initialised");
        return -1;
    }
    if (start < 0 || end < start) {
        PyErr_Format(PyExc_ValueError, "bad range [%lld, %lld)", start, end);
        return -1;
    }
    PyObject *items = PySequence_Fast(config, "config must be a sequence of (name, value)");
    if (items == NULL)
        return -1;
    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items); i++) {
        const char *name, *value;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(items, i), "ss", &name, &value)) {
            rd_kafka_conf_destroy(conf);
            Py_DECREF(items);
            return -1;
        }
        if (rd_kafka_conf_set(conf, name, value, errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
            PyErr_Format(PyExc_ValueError, "client setting %s=%s: %s", name, value, errstr);
            rd_kafka_conf_destroy(conf);
            Py_DECREF(items);
            return -1;
        }
    }
    Py_DECREF(items);
    rd_kafka_conf_set_error_cb(conf, on_client_error);
    rd_kafka_conf_set_opaque(conf, self);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
    if (rk == NULL) {
        rd_kafka_conf_destroy(conf);
        PyErr_Format(ReadError, "cannot create a consumer: %s", errstr);
        return -1;
    }
    self->rk = rk;
    rd_kafka_poll_set_consumer(rk);
    self->queue = rd_kafka_queue_get_consumer(rk);
    size_t topic_len = strlen(topic) + 1;
    self->topic = PyMem_Malloc(topic_len);
    if (self->topic == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(self->topic, topic, topic_len);
    self->partition = partition;
    self->start = self->position = start;
    self->end = end;
    self->with_headers = with_headers;
    self->skip_lost = skip_lost;
    self->poll_timeout_ms = poll_timeout_ms;
    if (assign_at(self, start) < 0) {
        PyErr_Format(ReadError, "cannot assign %s[%d]", topic, partition);
        return -1;
    }
    return 0;
}

/* Put one consumed message into the batch, or account for it. Returns -1 on a fatal error and
 * 1 when the broker answered the fetch with "offset out of range" (see resume_after_reset). */
static int take(RangeReader *self, const rd_kafka_message_t *m, char *why, size_t why_len) {
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        if (m->offset > self->position)
            self->position = m->offset < self->end ? m->offset : self->end;
    } else if (m->err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET) {
        return 1;
    } else if (m->err) {
        snprintf(why, why_len, "%s", rd_kafka_message_errstr(m));
        return -1;
    } else if (m->offset >= self->end) {
        self->position = self->end;
    } else if (m->offset >= self->position) {
        if (batch_add(&self->batch, m, self->with_headers) < 0) {
            snprintf(why, why_len, "out of memory, or a batch over 2 GiB");
            return -1;
        }
        self->position = m->offset + 1;
    }
    return 0;
}

/* auto.offset.reset is "error", so an out-of-range fetch stops the partition instead of jumping.
 * If the broker still holds the position (some brokers say otherwise for a moment), read on from
 * it; if the records are gone (deleted, or past retention), fail naming them, or with
 * skip_lost (failOnDataLoss=false) read on from the first offset left. The same rule as
 * redrive.spark.source's _resume_after_reset. */
static int resume_after_reset(RangeReader *self, char *why, size_t why_len) {
    int64_t low, high;
    rd_kafka_resp_err_t err = rd_kafka_query_watermark_offsets(
        self->rk, self->topic, self->partition, &low, &high, 10000);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        snprintf(why, why_len, "offset %lld is out of range, and the partition's offsets are "
                 "unknown: %s", (long long)self->position, rd_kafka_err2str(err));
        return -1;
    }
    if (self->position < low && self->skip_lost) {
        self->position = low < self->end ? low : self->end;
    } else if (self->position < low) {
        snprintf(why, why_len, "offsets %lld to %lld are gone from the broker (deleted or past "
                 "retention)", (long long)self->position, (long long)(low - 1));
        return -1;
    }
    while (self->next < self->count)
        rd_kafka_message_destroy(self->messages[self->next++]);
    if (assign_at(self, self->position) < 0) {
        snprintf(why, why_len, "cannot resume at offset %lld", (long long)self->position);
        return -1;
    }
    return 0;
}

/* Fill the batch until it holds max_rows records or max_bytes of keys and values, or the range
 * is done. Messages consumed beyond a full batch wait in `messages` for the next call. Runs
 * without the GIL; on failure writes why into `why` and returns -1. */
static int fill_batch(void *reader, int64_t max_rows, int64_t max_bytes, char *why,
                      size_t why_len) {
    RangeReader *self = reader;
    Batch *b = &self->batch;
    int64_t seen = self->position;
    double idle_until = monotonic_ms() + self->poll_timeout_ms;
    while (self->position < self->end && b->rows < max_rows &&
           (int64_t)(b->keys.data.len + b->values.data.len) < max_bytes) {
        if (self->next < self->count) {
            rd_kafka_message_t *m = self->messages[self->next++];
            int rc = take(self, m, why, why_len);
            rd_kafka_message_destroy(m);
            if (rc < 0 || (rc > 0 && resume_after_reset(self, why, why_len) < 0))
                return -1;
            continue;
        }
        double now = monotonic_ms();
        if (self->position > seen) {
            seen = self->position;
            idle_until = now + self->poll_timeout_ms;
        } else if (now > idle_until) {
            snprintf(why, why_len, "stuck at offset %lld for %.1fs (kafkaConsumer.pollTimeoutMs)%s%s",
                     (long long)self->position, self->poll_timeout_ms / 1000.0,
                     self->last_error[0] ? "; the client's last error: " : "", self->last_error);
            return -1;
        }
        /* The batch call waits for all it asks for or the timeout: never ask for more than the
         * range can still hold. */
        int64_t wanted = self->end - self->position;
        if (wanted > CONSUME_BATCH)
            wanted = CONSUME_BATCH;
        ssize_t n = rd_kafka_consume_batch_queue(self->queue, POLL_MS, self->messages,
                                                 (size_t)wanted);
        if (n < 0) {
            snprintf(why, why_len, "%s", rd_kafka_err2str(rd_kafka_last_error()));
            return -1;
        }
        self->next = 0;
        self->count = n;
        if (n == 0) {
            /* Nothing delivered, yet the position may have passed markers or aborted records. */
            rd_kafka_topic_partition_list_t *tp = rd_kafka_topic_partition_list_new(1);
            rd_kafka_topic_partition_list_add(tp, self->topic, self->partition);
            if (rd_kafka_position(self->rk, tp) == RD_KAFKA_RESP_ERR_NO_ERROR &&
                tp->elems[0].offset > self->position)
                self->position = tp->elems[0].offset < self->end ? tp->elems[0].offset : self->end;
            rd_kafka_topic_partition_list_destroy(tp);
        }
    }
    return 0;
}

static PyObject *RangeReader_read(RangeReader *self, PyObject *args) {
    if (self->rk == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "RangeReader is closed");
        return NULL;
    }
    return read_batch(self, &self->batch, self->with_headers, fill_batch, ReadError, args);
}

static PyObject *RangeReader_close(RangeReader *self, PyObject *Py_UNUSED(ignored)) {
    reader_close(self);
    Py_RETURN_NONE;
}

static PyMethodDef RangeReader_methods[] = {
    {"read", (PyCFunction)RangeReader_read, METH_VARARGS,
     "read(max_rows, max_bytes) -> the next batch's buffers, or None when the range is done"},
    {"close", (PyCFunction)RangeReader_close, METH_NOARGS, "close the consumer"},
    {NULL},
};

static PyTypeObject RangeReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "redrive.spark._rangeread.RangeReader",
    .tp_doc = "Reads offsets [start, end) of one partition into Arrow buffers.",
    .tp_basicsize = sizeof(RangeReader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RangeReader_init,
    .tp_dealloc = (destructor)RangeReader_dealloc,
    .tp_methods = RangeReader_methods,
};

static PyObject *librdkafka_version(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
    return PyUnicode_FromString(rd_kafka_version_str());
}

static PyMethodDef module_methods[] = {
    {"librdkafka_version", librdkafka_version, METH_NOARGS, "the linked librdkafka's version"},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "redrive.spark._rangeread",
    .m_doc = "Reads a Kafka partition range into Arrow buffers, in C.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__rangeread(void) {
    if (PyType_Ready(&RangeReaderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    ReadError = PyErr_NewException("redrive.spark._rangeread.ReadError", PyExc_RuntimeError, NULL);
    if (ReadError == NULL || PyModule_AddObjectRef(m, "ReadError", ReadError) < 0 ||
        PyModule_AddObjectRef(m, "RangeReader", (PyObject *)&RangeReaderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
