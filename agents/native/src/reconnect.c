/* Persistent sessions and reconnects: a client that goes away on schedule and comes back
 * with the same client id (workload.sessions), or that connects again, with exponential
 * backoff, after its connection was lost (workload.reconnect: the broker restarted).
 *
 * A reconnect is a connect of its own, non-blocking in the loop (the initial connects of
 * mqe_connect_all block, with a timeout, before the run): the socket's connect() under
 * way is watched for EPOLLOUT, then the CONNECT goes out as at the first connect (through
 * TLS and the WebSocket upgrade where the client has them), and the phases are timed on
 * the client's own fields, so flows.c and layers.c time them as they time the first. Each
 * absence is one record: when the connection went and why, every attempt, the phases of
 * the one that made it, the CONNACK's session present flag and the SUBACK of the subscribe
 * again (none when the broker kept the session). */
#include <errno.h>
#include <linux/net_tstamp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "reconnect.h"

#define NEVER INT64_MAX
#define ATTEMPT_TIMEOUT_NS 5000000000LL  /* connect() to CONNACK, at most, per attempt */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* -- going away ------------------------------------------------------------------------ */

static mqe_reconnect_record *open_record(mqe_engine *e, mqe_client *c, int64_t now,
                                         int scheduled, const char *why) {
    struct mqe_reconnect *rc = c->rc;
    if (rc->n_records == rc->cap_records) {
        size_t cap = rc->cap_records ? rc->cap_records * 2 : 4;
        mqe_reconnect_record *records = realloc(rc->records, cap * sizeof *records);
        if (records == NULL)
            return NULL;
        rc->records = records;
        rc->cap_records = cap;
    }
    mqe_reconnect_record *r = &rc->records[rc->n_records++];
    *r = (mqe_reconnect_record){
        .t_lost_ns = now, .t_connect_ns = MQE_NO_TIME, .t_tcp_ns = MQE_NO_TIME,
        .t_tls_ns = MQE_NO_TIME, .t_websocket_ns = MQE_NO_TIME,
        .t_mqtt_sent_ns = MQE_NO_TIME, .t_connack_ns = MQE_NO_TIME,
        .t_subscribed_ns = MQE_NO_TIME, .session_present = -1, .scheduled = scheduled};
    snprintf(r->reason, sizeof r->reason, "%s", why);
    (void)e;
    return r;
}

/* The socket closed and every byte of the connection forgotten; own QoS 1/2 publishes in
 * flight are given up (a clean-session publisher's broker forgets them too). */
static void close_connection(mqe_engine *e, mqe_client *c) {
    if (c->fd >= 0) {
        epoll_ctl(e->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
    }
    c->connected = 0;
    c->watching_out = 0;
    c->in_start = c->in_end = 0;
    c->out_head = c->out_len = 0;
    c->wire_head = c->wire_len = 0;
    c->stream_bytes = c->wire_bytes = 0;
    c->tx_head = c->tx_count = c->tx_mapped = 0;  /* the next socket's stamps count anew */
    c->ping_sent_ns = 0;
    if (c->held) {
        c->held = 0;
        e->n_held--;
    }
    if (c->layered) {
        mqe_tls_free(c);
        c->stage = MQE_STAGE_READY;
        c->ws_in_len = 0;
        c->ws_payload_left = 0;
        c->ws_in_message = 0;
    }
    if (c->inflight) {
        int64_t given_up = 0;
        for (size_t id = 1; id < 65536; id++)
            given_up += c->inflight[id] != 0;
        memset(c->inflight, 0, 65536);
        c->rc->abandoned += given_up;
        if (c->rc->n_records)
            c->rc->records[c->rc->n_records - 1].abandoned += (int32_t)given_up;
    }
}

static void schedule_attempt(mqe_engine *e, mqe_client *c, int64_t at_ns) {
    c->rc->state = RC_AWAY;
    c->rc->due_ns = at_ns;
    if (at_ns < e->rc_due_ns)
        e->rc_due_ns = at_ns;
}

/* A failed attempt (or a loss): the next after the backoff, which doubles up to its max. */
static void back_off(mqe_engine *e, mqe_client *c, int64_t now) {
    struct mqe_reconnect *rc = c->rc;
    if (rc->backoff_ns == 0)
        rc->backoff_ns = rc->on_loss ? rc->backoff_initial_ns : 100000000LL;
    schedule_attempt(e, c, now + rc->backoff_ns);
    int64_t most = rc->on_loss ? rc->backoff_max_ns : 2000000000LL;
    rc->backoff_ns = min64(rc->backoff_ns * 2, most);
}

int mqe_reconnect_lost(mqe_engine *e, mqe_client *c, const char *why) {
    struct mqe_reconnect *rc = c->rc;
    if (!e->running)
        return 0;  /* before the run (or after it), a lost connection fails as ever */
    int64_t now = mqe_now_ns();
    if (rc->state == RC_AWAY)
        return 1;  /* its socket is gone already: what is left of it says nothing */
    if (rc->state == RC_LIVE) {
        if (!rc->on_loss)
            return 0;
        rc->backoff_ns = 0;
        if (open_record(e, c, now, 0, why) == NULL)
            return 0;
    }  /* else an attempt failed (the broker not back yet): the record counts it */
    close_connection(e, c);
    back_off(e, c, now);
    return 1;
}

void mqe_reconnect_named(mqe_client *c) {
    if (!c->keep_session || strstr(c->failure, "collision"))
        return;
    size_t len = strlen(c->failure);
    snprintf(c->failure + len, sizeof c->failure - len, " (client id %s holds a persistent "
             "session: if another client connected with this id, the broker handed it the "
             "session and ended this connection: a client id collision)", c->client_id);
}

/* Leave on schedule: DISCONNECT first (MQTT 5 keeps the session for the expiry interval
 * its CONNECT set), or the socket closed under the broker. */
static void leave(mqe_engine *e, mqe_client *c, int64_t now) {
    static const uint8_t disconnect[2] = {MQE_DISCONNECT << 4, 0};
    struct mqe_reconnect *rc = c->rc;
    rc->absence_taken = 1;
    if (open_record(e, c, now, 1, rc->drop ? "left: the socket closed (drop)"
                                           : "left: DISCONNECT (disconnect)") == NULL) {
        mqe_client_fail(e, c, "out of memory for its reconnect records");
        return;
    }
    if (!rc->drop && c->connected && mqe_out_reserve(e, c, 2) == 0) {
        memcpy(c->out + c->out_len, disconnect, 2);
        c->out_len += 2;
        c->stream_bytes += 2;
        c->closing = 1;  /* what the socket says while it closes is no failure */
        mqe_flush(e, c);
        if (c->layered)
            mqe_layers_close(e, c);
        c->closing = 0;
    }
    close_connection(e, c);
    rc->backoff_ns = 0;
    schedule_attempt(e, c, e->t_start_ns + rc->absent_at_ns + rc->absent_for_ns);
}

/* -- coming back ----------------------------------------------------------------------- */

/* The CONNECT queued and on its way (through TLS and the upgrade first where layered). */
static void send_connect(mqe_engine *e, mqe_client *c, int64_t now) {
    static const int one = 1;
    const int stamping = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_TX_SOFTWARE
                         | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_ID
                         | SOF_TIMESTAMPING_OPT_TSONLY;
    c->t_tcp_ns = now;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (e->kernel_stamps_ok)
        setsockopt(c->fd, SOL_SOCKET, SO_TIMESTAMPING, &stamping, sizeof stamping);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)(c - e->clients)};
    epoll_ctl(e->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev);
    c->watching_out = 0;
    c->rc->state = RC_HANDSHAKE;
    size_t size = mqe_session_connect_size(c);
    if (mqe_out_reserve(e, c, size) != 0)
        return;
    uint16_t keepalive_s = (uint16_t)(c->keepalive_ns / 1000000000);
    size_t n = mqe_session_encode_connect(c, c->out + c->out_len, keepalive_s);
    c->out_len += n;
    c->stream_bytes += n;
    c->last_sent_ns = now;
    if (c->layered) {
        if (mqe_layers_start(e, c) == 0)
            mqe_flush(e, c);
    } else {
        c->t_mqtt_sent_ns = mqe_flush(e, c);
    }
}

static void attempt(mqe_engine *e, mqe_client *c, int64_t now) {
    struct mqe_reconnect *rc = c->rc;
    mqe_reconnect_record *r = &rc->records[rc->n_records - 1];
    r->attempts++;
    c->dead = 0;
    c->t_connect_ns = c->t_tcp_ns = c->t_tls_ns = c->t_ws_ns = c->t_mqtt_sent_ns
        = c->t_connack_ns = MQE_NO_TIME;
    char port[16];
    snprintf(port, sizeof port, "%d", c->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *found;
    int rc_gai = getaddrinfo(c->host, port, &hints, &found);
    if (rc_gai != 0) {
        snprintf(r->reason, sizeof r->reason, "cannot resolve %s: %s", c->host,
                 gai_strerror(rc_gai));
        back_off(e, c, now);
        return;
    }
    int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    c->t_connect_ns = mqe_now_ns();
    int made = fd >= 0 ? connect(fd, found->ai_addr, found->ai_addrlen) : -1;
    int error = made == 0 || errno == EINPROGRESS ? 0 : errno;
    freeaddrinfo(found);
    if (fd < 0 || error) {
        if (fd >= 0)
            close(fd);
        back_off(e, c, mqe_now_ns());
        return;
    }
    c->fd = fd;
    struct epoll_event ev = {.events = EPOLLOUT, .data.u64 = (uint64_t)(c - e->clients)};
    epoll_ctl(e->epoll_fd, EPOLL_CTL_ADD, fd, &ev);
    rc->state = RC_CONNECTING;
    if (made == 0)
        send_connect(e, c, mqe_now_ns());
}

int mqe_reconnect_event(mqe_engine *e, mqe_client *c, uint32_t events) {
    struct mqe_reconnect *rc = c->rc;
    if (rc->state == RC_AWAY)
        return 1;
    if (rc->state != RC_CONNECTING)
        return 0;
    int soerr = 0;
    socklen_t len = sizeof soerr;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
    int64_t now = mqe_now_ns();
    if (soerr || (events & (EPOLLERR | EPOLLHUP))) {  /* refused: the broker is not back */
        close_connection(e, c);
        back_off(e, c, now);
        return 1;
    }
    if (events & EPOLLOUT)
        send_connect(e, c, now);
    return 1;
}

/* Subscribe again to what it subscribed to (the broker forgot the session). */
static void subscribe_again(mqe_engine *e, mqe_client *c) {
    struct mqe_reconnect *rc = c->rc;
    for (size_t i = 0; i < rc->n_subs; i++) {
        const char *topic = mqe_topic(e, (uint32_t)rc->subs[i].topic);
        size_t len = strlen(topic), size = mqe_subscribe_size(len, mqe_level(c));
        if (mqe_out_reserve(e, c, size) != 0)
            return;
        uint16_t packet_id = (uint16_t)(c->next_packet_id % 0xFFFF + 1);
        c->next_packet_id = packet_id;
        c->subscribing_topic = rc->subs[i].topic;
        c->subscribing_qos = rc->subs[i].qos;
        size_t n = mqe_encode_subscribe(c->out + c->out_len, packet_id, topic, len,
                                        rc->subs[i].qos, mqe_level(c));
        c->out_len += n;
        c->stream_bytes += n;
    }
    c->subscribed = 0;
    mqe_flush(e, c);
}

void mqe_reconnect_connack(mqe_engine *e, mqe_client *c, int64_t t_read_ns) {
    struct mqe_reconnect *rc = c->rc;
    if (!c->connected)
        return;  /* refused: mqe_client_fail took it (a failed attempt) */
    if (rc->first_present < 0 && rc->n_records == 0)
        rc->first_present = c->session_present;
    if (rc->state != RC_HANDSHAKE)
        return;
    mqe_reconnect_record *r = &rc->records[rc->n_records - 1];
    r->t_connect_ns = c->t_connect_ns;
    r->t_tcp_ns = c->t_tcp_ns;
    r->t_tls_ns = c->t_tls_ns;
    r->t_websocket_ns = c->t_ws_ns;
    r->t_mqtt_sent_ns = c->t_mqtt_sent_ns;
    r->t_connack_ns = t_read_ns;  /* the read that brought it, as mqe_frame times it */
    r->session_present = c->session_present;
    rc->state = RC_LIVE;
    rc->backoff_ns = 0;
    /* the subscriptions live on in a session the broker kept; else subscribe again */
    if (rc->n_subs && !(c->keep_session && c->session_present))
        subscribe_again(e, c);
}

int mqe_reconnect_suback(mqe_engine *e, mqe_client *c) {
    struct mqe_reconnect *rc = c->rc;
    (void)e;
    if (rc->n_records == 0)
        return 0;  /* the first subscribe: recorded as every subscribe is */
    mqe_reconnect_record *r = &rc->records[rc->n_records - 1];
    r->t_subscribed_ns = mqe_now_ns();
    return 1;
}

int64_t mqe_reconnect_tick(mqe_engine *e, int64_t now, int64_t wait_ns) {
    if (now < e->rc_due_ns && e->rc_due_ns != 0)
        return min64(wait_ns, e->rc_due_ns - now);
    int64_t next = NEVER;
    for (size_t i = 0; i < e->n_clients; i++) {
        mqe_client *c = &e->clients[i];
        struct mqe_reconnect *rc = c->rc;
        if (rc == NULL || (c->dead && rc->state == RC_LIVE))
            continue;
        if (rc->state == RC_LIVE && rc->absent_at_ns >= 0 && !rc->absence_taken) {
            int64_t at = e->t_start_ns + rc->absent_at_ns;
            if (now >= at && c->connected)
                leave(e, c, now);
            else
                next = min64(next, now >= at ? now + 1000000 : at);
        }
        if (rc->state == RC_CONNECTING || rc->state == RC_HANDSHAKE) {
            /* an attempt the broker leaves unanswered fails after ATTEMPT_TIMEOUT_NS */
            if (now - c->t_connect_ns >= ATTEMPT_TIMEOUT_NS) {
                close_connection(e, c);
                back_off(e, c, now);
            } else {
                next = min64(next, c->t_connect_ns + ATTEMPT_TIMEOUT_NS);
            }
        }
        if (rc->state == RC_AWAY) {
            if (now >= rc->due_ns)
                attempt(e, c, now);
            if (rc->state == RC_AWAY)
                next = min64(next, rc->due_ns);
            else  /* under way: looked at again when it would time out */
                next = min64(next, c->t_connect_ns + ATTEMPT_TIMEOUT_NS);
        }
    }
    e->rc_due_ns = next;
    return next == NEVER ? wait_ns : min64(wait_ns, next > now ? next - now : 0);
}
