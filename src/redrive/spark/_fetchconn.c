/* redrive.spark._fetchread's connection: the partition leader found through Metadata and
 * connected to, requests framed and sent, and answers received into the reader's one buffer (or
 * taken from fed bytes, see feed). Every failure is recorded as the reader's handoff reason. */
#include "_fetchread.h"

#include <errno.h>
#include <stdarg.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* Under AddressSanitizer the bytes of `in` past what was received are off limits, so that a read
 * past an answer's or a batch's end is reported even where it stays inside the buffer. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define HIDE_UNRECEIVED(self) \
    ASAN_POISON_MEMORY_REGION((self)->in + (self)->in_end, (self)->in_cap - (self)->in_end)
#define SHOW_ALL(self) ASAN_UNPOISON_MEMORY_REGION((self)->in, (self)->in_cap)
#else
#define HIDE_UNRECEIVED(self) ((void)0)
#define SHOW_ALL(self) ((void)0)
#endif

/* Records why the rest of the range is for another reader; the first reason stands. */
void stop_with(FetchReader *self, const char *fmt, ...) {
    if (self->handoff[0])
        return;
    va_list args;
    va_start(args, fmt);
    vsnprintf(self->handoff, sizeof self->handoff, fmt, args);
    va_end(args);
}

void disconnect(FetchReader *self) {
    if (self->fd >= 0)
        close(self->fd);
    self->fd = -1;
    self->in_start = self->in_end = 0;
    self->answer_left = self->records_left = 0;
    self->in_batch = 0;
}

static void set_timeouts(int fd, int ms) {
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* Connects to host:port; on failure records why in last_error and returns -1. */
static int connect_to(FetchReader *self, const char *host, size_t host_len, int port) {
    char name[256], service[16];
    if (host_len >= sizeof name)
        host_len = sizeof name - 1;
    memcpy(name, host, host_len);
    name[host_len] = 0;
    snprintf(service, sizeof service, "%d", port);
    snprintf(self->peer, sizeof self->peer, "%s:%d", name, port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *found = NULL;
    int rc = getaddrinfo(name, service, &hints, &found);
    if (rc != 0) {
        snprintf(self->last_error, sizeof self->last_error, "%s: %s", self->peer,
                 gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = found; a != NULL && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0)
            continue;
        /* connect() gives up after SO_SNDTIMEO on Linux. */
        set_timeouts(fd, CONNECT_TIMEOUT_MS);
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            snprintf(self->last_error, sizeof self->last_error, "%s: connect: %s", self->peer,
                     strerror(errno));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(found);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_timeouts(fd, ANSWER_TIMEOUT_MS + self->poll_timeout_ms);
    self->fd = fd;
    self->in_start = self->in_end = 0;
    return 0;
}

/* bootstrap.servers: host:port[,host:port...], an optional scheme://, IPv6 in brackets. */
static int connect_bootstrap(FetchReader *self) {
    const char *s = self->bootstrap;
    while (*s) {
        while (*s == ',' || *s == ' ')
            s++;
        const char *item = s;
        while (*s && *s != ',')
            s++;
        const char *item_end = s;
        while (item_end > item && item_end[-1] == ' ')
            item_end--;
        const char *scheme = strstr(item, "://");
        if (scheme != NULL && scheme < item_end)
            item = scheme + 3;
        const char *colon = item_end;
        while (colon > item && colon[-1] != ':' && colon[-1] != ']')
            colon--;
        if (colon <= item || colon[-1] != ':')
            continue;
        const char *host = item, *host_end = colon - 1;
        if (*host == '[' && host_end > host && host_end[-1] == ']') {
            host++;
            host_end--;
        }
        int port = atoi(colon);
        if (connect_to(self, host, (size_t)(host_end - host), port) == 0)
            return 0;
    }
    return -1;
}

/* Receives from the connection, or from the fed answers; 0 when either is closed or used up. */
static ssize_t receive(FetchReader *self, unsigned char *into, size_t room) {
    if (self->fed == NULL)
        return recv(self->fd, into, room, 0);
    size_t n = self->fed_len - self->fed_at < room ? self->fed_len - self->fed_at : room;
    memcpy(into, self->fed + self->fed_at, n);
    self->fed_at += n;
    return (ssize_t)n;
}

static int receive_into(FetchReader *self, size_t n);

/* Makes room for and receives until `n` bytes are waiting in `in`, moving what is waiting to the
 * front first. Returns -1 (with a handoff reason) when the connection fails. */
int need(FetchReader *self, size_t n) {
    if (self->in_end - self->in_start >= n)
        return 0;
    if (self->in != NULL)
        SHOW_ALL(self);
    int got_all = receive_into(self, n);
    if (self->in != NULL)
        HIDE_UNRECEIVED(self);
    return got_all;
}

static int receive_into(FetchReader *self, size_t n) {
    if (self->in_start > 0) {
        memmove(self->in, self->in + self->in_start, self->in_end - self->in_start);
        self->in_end -= self->in_start;
        self->in_start = 0;
    }
    if (n > self->in_cap) {
        /* Fed answers start small, so that the buffer grows often. */
        size_t cap = self->in_cap ? self->in_cap : self->fed ? FED_INPUT : INITIAL_INPUT;
        while (cap < n)
            cap *= 2;
        unsigned char *grown = realloc(self->in, cap);
        if (grown == NULL) {
            stop_with(self, "out of memory for a record batch");
            return -1;
        }
        self->in = grown;
        self->in_cap = cap;
    }
    while (self->in_end < n) {
        /* Fed answers are received as needed, not ahead: the bytes past a batch are not yet
         * there to be read by mistake. */
        size_t room = self->fed ? n - self->in_end : self->in_cap - self->in_end;
        ssize_t got = receive(self, self->in + self->in_end, room);
        if (got > 0) {
            self->in_end += (size_t)got;
            continue;
        }
        if (got == 0)
            snprintf(self->last_error, sizeof self->last_error, "%s: the broker closed the "
                     "connection", self->peer);
        else
            snprintf(self->last_error, sizeof self->last_error, "%s: %s", self->peer,
                     errno == EAGAIN || errno == EWOULDBLOCK ? "no answer in time"
                                                             : strerror(errno));
        stop_with(self, "%s", self->last_error);
        return -1;
    }
    return 0;
}

/* Takes `n` waiting bytes of the current answer; the pointer is valid until the next need(). */
const unsigned char *take(FetchReader *self, size_t n) {
    if (self->answer_left < (int64_t)n) {
        stop_with(self, "an answer shorter than its fields");
        return NULL;
    }
    if (need(self, n) < 0)
        return NULL;
    const unsigned char *p = self->in + self->in_start;
    self->in_start += n;
    self->answer_left -= (int64_t)n;
    return p;
}

/* Skips `n` bytes of the current answer without keeping them. */
int skip(FetchReader *self, int64_t n) {
    while (n > 0) {
        size_t room = self->in_cap ? self->in_cap : INITIAL_INPUT;
        size_t chunk = n < (int64_t)room ? (size_t)n : room;
        if (take(self, chunk) == NULL)
            return -1;
        n -= (int64_t)chunk;
    }
    return 0;
}

static int send_all(FetchReader *self, const Buf *out) {
    if (self->fed != NULL)
        return 0;
    size_t sent = 0;
    while (sent < out->len) {
        ssize_t n = send(self->fd, out->data + sent, out->len - sent, MSG_NOSIGNAL);
        if (n <= 0) {
            snprintf(self->last_error, sizeof self->last_error, "%s: send: %s", self->peer,
                     n < 0 ? strerror(errno) : "connection closed");
            stop_with(self, "%s", self->last_error);
            return -1;
        }
        sent += (size_t)n;
    }
    return 0;
}

int put_int(Buf *b, int64_t v, int n) {
    unsigned char bytes[8];
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        bytes[i] = (unsigned char)(v & 0xff);
    return buf_put(b, bytes, (size_t)n);
}

int put_string(Buf *b, const char *s) {
    size_t n = strlen(s);
    return put_int(b, (int64_t)n, 2) < 0 || buf_put(b, s, n) < 0 ? -1 : 0;
}

/* Sends one request (header v1: api key, version, correlation id, client id) and reads the size
 * and correlation id of its answer. Returns -1 with a handoff reason on failure. */
int ask(FetchReader *self, int16_t api, int16_t version, const Buf *body) {
    Buf out = {0};
    int32_t correlation = ++self->correlation;
    int rc = put_int(&out, 0, 4) < 0 || put_int(&out, api, 2) < 0 ||
             put_int(&out, version, 2) < 0 || put_int(&out, correlation, 4) < 0 ||
             put_string(&out, self->client_id) < 0 || buf_put(&out, body->data, body->len) < 0;
    if (rc) {
        free(out.data);
        stop_with(self, "out of memory for a request");
        return -1;
    }
    int64_t size = (int64_t)out.len - 4;
    for (int i = 3; i >= 0; i--, size >>= 8)
        out.data[i] = (char)(size & 0xff);
    rc = send_all(self, &out);
    free(out.data);
    if (rc < 0)
        return -1;
    self->answer_left = 4;
    const unsigned char *p = take(self, 4);
    if (p == NULL)
        return -1;
    self->answer_left = (int32_t)be(p, 4);
    if (self->answer_left < 4 || (p = take(self, 4)) == NULL) {
        stop_with(self, "an answer too short for its header");
        return -1;
    }
    if ((int32_t)be(p, 4) != correlation) {
        stop_with(self, "an answer to another request");
        return -1;
    }
    return 0;
}

/* Connects to the partition's leader: Metadata from a bootstrap server, then the leader's
 * address if it is another broker. */
int connect_leader(FetchReader *self) {
    if (connect_bootstrap(self) < 0) {
        stop_with(self, "%s", self->last_error[0] ? self->last_error : "no bootstrap server");
        return -1;
    }
    Buf body = {0};
    int rc = put_int(&body, 1, 4) < 0 || put_string(&body, self->topic) < 0 ||
             put_int(&body, 0, 1) < 0;  /* allow_auto_topic_creation: no */
    if (rc || ask(self, API_METADATA, METADATA_VERSION, &body) < 0) {
        free(body.data);
        stop_with(self, "the metadata request failed");
        return -1;
    }
    free(body.data);
    /* Taken whole: a garbled size would be allocated and waited for. */
    if (self->answer_left > METADATA_ANSWER_LIMIT) {
        /* With its correlation id, as the size field gave it. */
        stop_with(self, "a metadata answer of %lld bytes", (long long)self->answer_left + 4);
        return -1;
    }
    const unsigned char *p = take(self, (size_t)self->answer_left);
    if (p == NULL)
        return -1;
    Cur c = {p, self->in + self->in_start, 0};
    cur_int(&c, 4); /* throttle_time_ms */
    int64_t brokers = cur_int(&c, 4);
    int64_t leader = -1, node_ids[256];
    const unsigned char *hosts[256];
    int64_t host_lens[256], ports[256];
    int64_t known = 0;
    for (int64_t i = 0; i < brokers && !c.bad; i++) {
        int64_t node = cur_int(&c, 4), host_len, rack_len;
        const unsigned char *host = cur_string(&c, &host_len);
        int64_t port = cur_int(&c, 4);
        cur_string(&c, &rack_len);
        if (known < 256 && host != NULL) {
            node_ids[known] = node;
            hosts[known] = host;
            host_lens[known] = host_len;
            ports[known++] = port;
        }
    }
    int64_t skipped;
    cur_string(&c, &skipped); /* cluster_id */
    cur_int(&c, 4);           /* controller_id */
    int64_t topics = cur_int(&c, 4);
    for (int64_t t = 0; t < topics && !c.bad; t++) {
        int64_t topic_error = cur_int(&c, 2), name_len;
        const unsigned char *name = cur_string(&c, &name_len);
        cur_int(&c, 1); /* is_internal */
        int64_t parts = cur_int(&c, 4);
        int ours = name != NULL && (size_t)name_len == strlen(self->topic) &&
                   memcmp(name, self->topic, (size_t)name_len) == 0;
        if (ours && topic_error != 0) {
            stop_with(self, "metadata error %d for the topic", (int)topic_error);
            return -1;
        }
        for (int64_t i = 0; i < parts && !c.bad; i++) {
            cur_int(&c, 2);
            int64_t index = cur_int(&c, 4), node = cur_int(&c, 4);
            cur_skip(&c, cur_int(&c, 4) * 4); /* replicas */
            cur_skip(&c, cur_int(&c, 4) * 4); /* in-sync replicas */
            if (ours && index == self->partition)
                leader = node;
        }
    }
    if (c.bad) {
        stop_with(self, "a malformed metadata answer");
        return -1;
    }
    for (int64_t i = 0; i < known; i++) {
        if (node_ids[i] != leader)
            continue;
        char address[300];
        snprintf(address, sizeof address, "%.*s:%d", (int)host_lens[i], hosts[i], (int)ports[i]);
        if (strcmp(address, self->peer) == 0)
            return 0;
        char host[256];
        size_t host_len = (size_t)host_lens[i] < sizeof host ? (size_t)host_lens[i] : sizeof host - 1;
        memcpy(host, hosts[i], host_len);
        int port = (int)ports[i];
        disconnect(self);
        if (connect_to(self, host, host_len, port) < 0) {
            stop_with(self, "%s", self->last_error);
            return -1;
        }
        return 0;
    }
    stop_with(self, "no leader known for the partition");
    return -1;
}
