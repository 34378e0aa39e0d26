/* Connection storms (workload.mode connect): clients opened on an intended schedule.
 *
 * Every client's connect starts at its intended time (t_start + its start offset), non
 * blocking: many connects are in flight at once, and the loop serves their handshakes
 * (TCP, TLS, WebSocket, CONNECT -> CONNACK) while it opens the next. A connect that fails
 * records why (CONNACK code, refused, reset, closed, timeout, TLS, WebSocket) and the storm
 * goes on: a broker refusing part of a storm is a result. Held connections keep alive
 * (mqe_misc's PINGREQs); one the broker drops while held records when.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client.h"

#define STORM_MISC_NS 250000000LL       /* keep-alive and held-connection checks */
#define STORM_OPEN_BATCH 64             /* connects opened per turn before serving events */
#define STORM_WAIT_MAX_NS 20000000LL    /* a turn's longest wait: timeouts are checked */

struct mqe_storm {
    int32_t *order;                     /* client indexes by intended time */
    size_t n, next;                     /* clients; the next to open, in order */
    int32_t *in_flight;                 /* opened, not yet connected or failed */
    size_t n_in_flight;
    int32_t *outcome;                   /* MQE_STORM_*, per client */
    int32_t *code;                      /* CONNACK code, or errno */
    int64_t *t_ended;                   /* failed, or lost while held */
    uint8_t *tcp_pending;               /* connect() in progress */
    int64_t t_start_ns, timeout_ns, last_misc_ns;
    int keepalive_s;
    size_t unresolved;                  /* not yet opened, or in flight */
    /* the broker's address, resolved once for the clients that share it */
    char *resolved_host;
    int resolved_port;
    struct addrinfo *resolved;
};

static void storm_free_resolved(mqe_storm *s) {
    if (s->resolved)
        freeaddrinfo(s->resolved);
    free(s->resolved_host);
    s->resolved = NULL;
    s->resolved_host = NULL;
}

void mqe_storm_free(mqe_engine *e) {
    mqe_storm *s = e->storm;
    if (s == NULL)
        return;
    storm_free_resolved(s);
    free(s->order);
    free(s->in_flight);
    free(s->outcome);
    free(s->code);
    free(s->t_ended);
    free(s->tcp_pending);
    free(s);
    e->storm = NULL;
}

static const int64_t *g_offsets;  /* qsort's key (the storm is begun on one thread) */

static int by_offset(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (g_offsets[i] != g_offsets[j])
        return g_offsets[i] < g_offsets[j] ? -1 : 1;
    return (i > j) - (i < j);
}

int mqe_storm_begin(mqe_engine *e, int64_t t_start_ns, int keepalive_s, int64_t timeout_ns,
                    int keep_session) {
    mqe_storm_free(e);
    size_t n = e->n_clients;
    mqe_storm *s = calloc(1, sizeof *s);
    int64_t *offsets = malloc((n ? n : 1) * sizeof *offsets);
    if (s == NULL || offsets == NULL) {
        free(s);
        free(offsets);
        snprintf(e->error, sizeof e->error, "out of memory for a storm of %zu clients", n);
        return -1;
    }
    e->storm = s;
    s->n = s->unresolved = n;
    s->order = malloc((n ? n : 1) * sizeof *s->order);
    s->in_flight = malloc((n ? n : 1) * sizeof *s->in_flight);
    s->outcome = calloc(n ? n : 1, sizeof *s->outcome);
    s->code = calloc(n ? n : 1, sizeof *s->code);
    s->t_ended = malloc((n ? n : 1) * sizeof *s->t_ended);
    s->tcp_pending = calloc(n ? n : 1, 1);
    if (!s->order || !s->in_flight || !s->outcome || !s->code || !s->t_ended
        || !s->tcp_pending) {
        free(offsets);
        mqe_storm_free(e);
        snprintf(e->error, sizeof e->error, "out of memory for a storm of %zu clients", n);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        mqe_client *c = &e->clients[i];
        if (c->udp || c->sn) {
            free(offsets);
            mqe_storm_free(e);
            snprintf(e->error, sizeof e->error, "client %s: a storm's clients speak mqtt-tcp "
                     "(and TLS or WebSocket over it), not UDP", c->client_id);
            return -1;
        }
        s->order[i] = (int32_t)i;
        offsets[i] = c->start_offset_ns;
        s->t_ended[i] = MQE_NO_TIME;
        c->keep_session = keep_session;
        /* MQTT 5: a kept session outlives the connection as 3.1.1's does (no expiry) */
        c->session_expiry_s = keep_session ? UINT32_MAX : 0;
    }
    g_offsets = offsets;
    qsort(s->order, n, sizeof *s->order, by_offset);
    g_offsets = NULL;
    free(offsets);
    s->t_start_ns = t_start_ns;
    s->timeout_ns = timeout_ns;
    s->keepalive_s = keepalive_s;
    s->last_misc_ns = mqe_now_ns();
    return 0;
}

static const struct addrinfo *storm_resolve(mqe_storm *s, const mqe_client *c, int *rc) {
    if (s->resolved && s->resolved_port == c->port && strcmp(s->resolved_host, c->host) == 0)
        return s->resolved;
    storm_free_resolved(s);
    char port[16];
    snprintf(port, sizeof port, "%d", c->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    *rc = getaddrinfo(c->host, port, &hints, &s->resolved);
    if (*rc != 0) {
        s->resolved = NULL;
        return NULL;
    }
    s->resolved_host = strdup(c->host);
    s->resolved_port = c->port;
    if (s->resolved_host == NULL) {
        storm_free_resolved(s);
        *rc = EAI_MEMORY;
        return NULL;
    }
    return s->resolved;
}

/* A client's connect ended without a connection: why, and its socket closed. */
static void storm_failed(mqe_engine *e, mqe_storm *s, int32_t i, int outcome, int code,
                         int64_t now) {
    mqe_client *c = &e->clients[i];
    s->outcome[i] = outcome;
    s->code[i] = code;
    s->t_ended[i] = now;
    s->tcp_pending[i] = 0;
    if (c->fd >= 0) {
        if (!c->dead)
            epoll_ctl(e->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
    }
    c->dead = 1;
    c->connected = 0;
    s->unresolved--;
}

/* The TCP connection is up: the CONNECT queued, behind the TLS and WebSocket handshakes. */
static void storm_established(mqe_engine *e, mqe_storm *s, int32_t i) {
    mqe_client *c = &e->clients[i];
    s->tcp_pending[i] = 0;
    c->t_tcp_ns = mqe_now_ns();
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)i};
    epoll_ctl(e->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev);
    c->watching_out = 0;
    c->keepalive_ns = (int64_t)s->keepalive_s * 1000000000;
    size_t size = mqe_session_connect_size(c);
    if (mqe_out_reserve(e, c, size) != 0)
        return;  /* failed, named: the scan records it */
    size_t n = mqe_session_encode_connect(c, c->out + c->out_len, (uint16_t)s->keepalive_s);
    c->out_len += n;
    c->stream_bytes += n;
    if (c->layered) {
        if (mqe_layers_start(e, c) == 0)
            mqe_flush(e, c);
    } else {
        c->t_mqtt_sent_ns = mqe_flush(e, c);
    }
}

/* To a broker on IPv4 loopback, client i connects from 127.0.0.(2 + i mod 250): with one
 * source address the kernel's search for a free ephemeral port grows with the ports in use
 * (at 20,000 connections a connect() cost milliseconds of system time, and the storm fell
 * seconds behind), while each source address has the whole range to itself (as
 * emqtt-bench's --ifaddr). The port is still picked at connect() (IP_BIND_ADDRESS_NO_PORT);
 * a bind that fails leaves the kernel's choice. */
static void storm_spread_source(int fd, const struct addrinfo *ai, int32_t i) {
    if (ai->ai_family != AF_INET)
        return;
    const struct sockaddr_in *to = (const struct sockaddr_in *)ai->ai_addr;
    if ((ntohl(to->sin_addr.s_addr) >> 24) != 127)
        return;
    const int one = 1;
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    struct sockaddr_in from = {.sin_family = AF_INET,
                               .sin_addr.s_addr = htonl(0x7F000002u + (uint32_t)(i % 250))};
    if (bind(fd, (const struct sockaddr *)&from, sizeof from) != 0)
        return;  /* the kernel's source then */
}

static void storm_open(mqe_engine *e, mqe_storm *s, int32_t i) {
    mqe_client *c = &e->clients[i];
    int rc = 0;
    const struct addrinfo *ai = storm_resolve(s, c, &rc);
    int64_t now = mqe_now_ns();
    c->t_connect_ns = now;
    if (ai == NULL) {
        snprintf(c->failure, sizeof c->failure, "cannot resolve %s: %s", c->host,
                 gai_strerror(rc));
        storm_failed(e, s, i, MQE_STORM_OTHER, 0, now);
        return;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {  /* EMFILE: more connections than the file limit */
        int error = errno;
        snprintf(c->failure, sizeof c->failure, "socket(): [Errno %d] %s", error,
                 strerror(error));
        storm_failed(e, s, i, MQE_STORM_OTHER, error, now);
        return;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    storm_spread_source(fd, ai, i);
    int connected = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    if (!connected && errno != EINPROGRESS) {
        int error = errno;
        close(fd);
        snprintf(c->failure, sizeof c->failure, "[Errno %d] %s (%s:%d)", error,
                 strerror(error), c->host, c->port);
        storm_failed(e, s, i, error == ECONNREFUSED ? MQE_STORM_REFUSED : MQE_STORM_OTHER,
                     error, now);
        return;
    }
    c->fd = fd;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u64 = (uint64_t)i};
    if (epoll_ctl(e->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        int error = errno;
        snprintf(c->failure, sizeof c->failure, "epoll_ctl: [Errno %d] %s", error,
                 strerror(error));
        storm_failed(e, s, i, MQE_STORM_OTHER, error, now);
        return;
    }
    c->watching_out = 1;
    s->outcome[i] = MQE_STORM_OPENING;
    s->in_flight[s->n_in_flight++] = i;
    s->tcp_pending[i] = 1;
    if (connected)
        storm_established(e, s, i);
}

int mqe_storm_event(mqe_engine *e, mqe_client *c, uint32_t events) {
    mqe_storm *s = e->storm;
    int32_t i = (int32_t)(c - e->clients);
    if (s == NULL || (size_t)i >= s->n || !s->tcp_pending[i])
        return 0;
    if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
        return 1;
    int error = 0;
    socklen_t len = sizeof error;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0)
        error = errno;
    if (error) {
        snprintf(c->failure, sizeof c->failure, "[Errno %d] %s (%s:%d)", error,
                 strerror(error), c->host, c->port);
        storm_failed(e, s, i, error == ECONNREFUSED ? MQE_STORM_REFUSED
                              : error == ECONNRESET ? MQE_STORM_RESET
                              : error == ETIMEDOUT ? MQE_STORM_TIMEOUT : MQE_STORM_OTHER,
                     error, mqe_now_ns());
        return 1;
    }
    storm_established(e, s, i);
    return 1;
}

/* Why a client that failed after its TCP connect did, from the phase it had reached. */
static int storm_reason(const mqe_client *c, int32_t *code) {
    char errno_text[32];
    if (c->connack_seen && c->t_connack_ns == MQE_NO_TIME) {
        *code = c->connack_code;
        return MQE_STORM_CONNACK;
    }
    if (c->t_connack_ns != MQE_NO_TIME)
        return MQE_STORM_LOST;
    if (c->tls && c->t_tls_ns == MQE_NO_TIME)
        return MQE_STORM_TLS;
    if (c->ws && c->t_ws_ns == MQE_NO_TIME)
        return MQE_STORM_WEBSOCKET;
    static const int resets[] = {ECONNRESET, EPIPE};
    for (size_t k = 0; k < sizeof resets / sizeof *resets; k++) {
        snprintf(errno_text, sizeof errno_text, "[Errno %d]", resets[k]);
        if (strstr(c->failure, errno_text)) {
            *code = resets[k];
            return MQE_STORM_RESET;
        }
    }
    if (strstr(c->failure, "closed the connection"))
        return MQE_STORM_CLOSED;
    return MQE_STORM_OTHER;
}

/* In-flight connects: made, failed, or past their timeout. */
static void storm_scan(mqe_engine *e, mqe_storm *s, int64_t now) {
    size_t kept = 0;
    for (size_t k = 0; k < s->n_in_flight; k++) {
        int32_t i = s->in_flight[k];
        mqe_client *c = &e->clients[i];
        if (s->outcome[i] != MQE_STORM_OPENING)
            continue;  /* its connect() failed as it was made (mqe_storm_event) */
        if (c->dead || c->failure[0]) {
            int32_t code = 0;
            int outcome = storm_reason(c, &code);
            storm_failed(e, s, i, outcome == MQE_STORM_LOST ? MQE_STORM_OTHER : outcome, code,
                         now);
            continue;
        }
        if (c->connected && c->t_connack_ns != MQE_NO_TIME) {
            s->outcome[i] = MQE_STORM_CONNECTED;
            s->unresolved--;
            continue;
        }
        if (now - c->t_connect_ns > s->timeout_ns) {
            const char *phase = s->tcp_pending[i] ? "TCP connect"
                                : c->tls && c->t_tls_ns == MQE_NO_TIME ? "TLS handshake"
                                : c->ws && c->t_ws_ns == MQE_NO_TIME ? "WebSocket upgrade"
                                : "CONNACK";
            snprintf(c->failure, sizeof c->failure, "%s not done within %.3g s", phase,
                     (double)s->timeout_ns / 1e9);
            storm_failed(e, s, i, MQE_STORM_TIMEOUT, 0, now);
            continue;
        }
        s->in_flight[kept++] = i;
    }
    s->n_in_flight = kept;
}

/* Held connections the broker dropped (or whose keep-alive went unanswered). */
static void storm_check_held(mqe_engine *e, mqe_storm *s, int64_t now) {
    for (size_t i = 0; i < s->n; i++) {
        mqe_client *c = &e->clients[i];
        if (s->outcome[i] != MQE_STORM_CONNECTED || s->t_ended[i] != MQE_NO_TIME
            || !(c->dead || c->failure[0]))
            continue;
        s->t_ended[i] = now;
        if (c->fd >= 0) {
            close(c->fd);
            c->fd = -1;
        }
    }
}

int64_t mqe_storm_step(mqe_engine *e, int64_t until_ns) {
    mqe_storm *s = e->storm;
    if (s == NULL) {
        snprintf(e->error, sizeof e->error, "no storm begun (mqe_storm_begin first)");
        return -1;
    }
    e->woken = 0;
    for (;;) {
        int64_t now = mqe_now_ns();
        int opened = 0;
        while (s->next < s->n && opened < STORM_OPEN_BATCH) {
            int32_t i = s->order[s->next];
            if (s->t_start_ns + e->clients[i].start_offset_ns > now)
                break;
            storm_open(e, s, i);
            s->next++;
            opened++;
        }
        storm_scan(e, s, now);
        if (now - s->last_misc_ns >= STORM_MISC_NS) {
            mqe_misc(e, now);
            storm_check_held(e, s, now);
            s->last_misc_ns = now;
        }
        if (e->woken || now >= until_ns)
            break;
        int64_t wake = until_ns;
        if (s->next < s->n) {
            int64_t due = s->t_start_ns + e->clients[s->order[s->next]].start_offset_ns;
            wake = due < wake ? due : wake;
        }
        if (now + STORM_WAIT_MAX_NS < wake)
            wake = now + STORM_WAIT_MAX_NS;
        mqe_handle_events(e, opened == STORM_OPEN_BATCH || wake <= now ? 0 : wake - now);
    }
    return (int64_t)s->unresolved;
}

int mqe_storm_outcome_of(const mqe_engine *e, int client, mqe_storm_outcome *out) {
    const mqe_storm *s = e->storm;
    if (s == NULL || client < 0 || (size_t)client >= s->n)
        return -1;
    const mqe_client *c = &e->clients[client];
    *out = (mqe_storm_outcome){
        .t_intended_ns = s->t_start_ns + c->start_offset_ns, .t_connect_ns = c->t_connect_ns,
        .t_tcp_ns = c->t_tcp_ns, .t_tls_ns = c->t_tls_ns, .t_websocket_ns = c->t_ws_ns,
        .t_mqtt_sent_ns = c->t_mqtt_sent_ns, .t_connack_ns = c->t_connack_ns,
        .t_ended_ns = s->t_ended[client], .outcome = s->outcome[client],
        .code = s->code[client]};
    snprintf(out->detail, sizeof out->detail, "%s", c->failure);
    return 0;
}
