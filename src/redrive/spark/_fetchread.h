/* The fetch reader's shared parts: its request constants, the cursor over received bytes, the
 * reader's state, and what _fetchconn.c (the connection, and requests and answers framed on it)
 * gives _fetchread.c (the fetch answers parsed into Arrow batches, and the Python type). */
#ifndef REDRIVE_FETCHREAD_H
#define REDRIVE_FETCHREAD_H

#include "_arrowbatch.h"

#define API_FETCH 1
#define API_METADATA 3
#define FETCH_VERSION 4
#define METADATA_VERSION 4
#define MAX_WAIT_MS 500
#define FIRST_FETCH_BYTES (1 << 20)
#define FETCH_BYTES (16 << 20)
#define FETCH_BYTES_LIMIT (1 << 30)
#define INITIAL_INPUT (4 << 20)
#define FED_INPUT 64
#define BATCH_HEADER 61
#define CONNECT_TIMEOUT_MS 10000
#define ANSWER_TIMEOUT_MS 30000
/* Far above what one topic's metadata takes, even with thousands of brokers and partitions. */
#define METADATA_ANSWER_LIMIT (64 << 20)

/* Functions shared between the reader's two files, not exported from the module. */
#define INTERNAL __attribute__((visibility("hidden")))

/* A cursor over bytes already received; every read is bounds-checked and a short read marks the
 * cursor bad rather than reading past the end. */
typedef struct {
    const unsigned char *p, *end;
    int bad;
} Cur;

static inline int cur_has(Cur *c, size_t n) {
    if (c->bad || (size_t)(c->end - c->p) < n) {
        c->bad = 1;
        return 0;
    }
    return 1;
}

static inline int64_t be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return (int64_t)v;
}

static inline int64_t cur_int(Cur *c, int n) {
    if (!cur_has(c, (size_t)n))
        return 0;
    int64_t v = be(c->p, n);
    c->p += n;
    /* Sign-extend the narrower widths. */
    if (n < 8 && (v & ((int64_t)1 << (8 * n - 1))))
        v -= (int64_t)1 << (8 * n);
    return v;
}

static inline void cur_skip(Cur *c, int64_t n) {
    if (n < 0 || !cur_has(c, (size_t)n))
        c->bad = 1;
    else
        c->p += n;
}

/* A zigzag varint (records and their fields). */
static inline int64_t cur_varint(Cur *c) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (!cur_has(c, 1))
            return 0;
        unsigned char byte = *c->p++;
        v |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80))
            return (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
    }
    c->bad = 1;
    return 0;
}

/* A length-prefixed string (int16 length, -1 null). */
static inline const unsigned char *cur_string(Cur *c, int64_t *len) {
    *len = cur_int(c, 2);
    if (*len < 0)
        return NULL;
    const unsigned char *s = c->p;
    cur_skip(c, *len);
    return s;
}

typedef struct {
    int64_t producer_id, first_offset;
} Aborted;

typedef struct {
    PyObject_HEAD
    char *bootstrap, *topic, *client_id;
    int32_t partition;
    int64_t end, position;
    int with_headers, read_committed, poll_timeout_ms;
    int fd;
    /* Set while read() runs without the GIL: another thread's call must not free what it uses. */
    int busy;
    int32_t correlation;
    char peer[300];
    Batch batch;
    /* Received bytes: [in_start, in_end) of `in` are not taken yet. */
    unsigned char *in;
    size_t in_cap, in_start, in_end;
    /* The fetch answer being read: bytes of it not yet received or taken, and of its records. */
    int64_t answer_left, records_left;
    int32_t fetch_bytes;
    int answer_had_records;
    /* Aborted transactions of that answer, by first offset; `aborted_next` is the next to open. */
    Aborted *aborted;
    size_t aborted_count, aborted_cap, aborted_next;
    int64_t *open_aborts;
    size_t open_count;
    /* The record batch being taken, which stays in `in` until its last record is taken. */
    int in_batch;
    Cur records;
    int64_t batch_base, batch_last, batch_base_ts, batch_max_ts;
    int batch_log_append;
    int32_t batch_left;
    /* Why the rest of the range is for another reader; the last connection error. */
    char handoff[300];
    char last_error[300];
    /* Fed answers (see feed): read in place of the connection; [fed_at, fed_len) not yet. */
    unsigned char *fed;
    size_t fed_len, fed_at;
} FetchReader;

/* _fetchconn.c */
INTERNAL __attribute__((format(printf, 2, 3))) void stop_with(FetchReader *self, const char *fmt,
                                                             ...);
INTERNAL void disconnect(FetchReader *self);
INTERNAL int need(FetchReader *self, size_t n);
INTERNAL const unsigned char *take(FetchReader *self, size_t n);
INTERNAL int skip(FetchReader *self, int64_t n);
INTERNAL int put_int(Buf *b, int64_t v, int n);
INTERNAL int put_string(Buf *b, const char *s);
INTERNAL int ask(FetchReader *self, int16_t api, int16_t version, const Buf *body);
INTERNAL int connect_leader(FetchReader *self);

#endif
