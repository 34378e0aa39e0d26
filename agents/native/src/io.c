/* The engine's socket work: reads framed in place, acknowledgement flows, kernel stamps,
 * batched writes, keep-alive, and the virtual GPIO lines' edges. */
#include <errno.h>
#include <time.h>
#include <linux/errqueue.h>
#include <linux/net_tstamp.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "client.h"

#define WAKE_TAG UINT64_MAX
#define TIMER_TAG (UINT64_MAX - 1)
#define MIN_DELIVERY_BYTES (2 + 2 + MQE_PAYLOAD_MIN)  /* the shortest PUBLISH we record */
#define CONTROL_BYTES 512

int64_t mqe_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void mqe_client_fail(mqe_engine *e, mqe_client *c, const char *fmt, ...) {
    if (c->dead)
        return;
    if (c->rc && !c->closing) {  /* reconnect.c: a client that reconnects does not fail */
        char why[MQE_FAILURE_CHARS];
        va_list lost;
        va_start(lost, fmt);
        vsnprintf(why, sizeof why, fmt, lost);
        va_end(lost);
        if (mqe_reconnect_lost(e, c, why))
            return;
    }
    c->dead = 1;
    c->connected = 0;
    c->out_head = c->out_len = 0;
    c->wire_head = c->wire_len = 0;
    if (c->fd >= 0)
        epoll_ctl(e->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);  /* a closed socket stays readable */
    if (c->closing)
        return;  /* it was disconnecting: not a failure */
    va_list args;
    va_start(args, fmt);
    vsnprintf(c->failure, sizeof c->failure, fmt, args);
    va_end(args);
    if (c->rc)
        mqe_reconnect_named(c);
}

/* -- GPIO (virtual lines: levels in memory, every edge recorded; a chip's too) -------- */

static void record_edge(mqe_engine *e, int pin, int level, int64_t t, int64_t t_syscall,
                        int64_t write_ns) {
    mqe_table *edges = &e->tables[MQE_T_EDGE];
    if (edges->rows == edges->capacity) {
        e->need_drain = 1;
        return;
    }
    uint32_t row = edges->rows++;
    MQE_I32(edges, EDGE_PIN)[row] = pin;
    MQE_I64(edges, EDGE_T)[row] = t;
    MQE_U8(edges, EDGE_LEVEL)[row] = (uint8_t)level;
    MQE_I64(edges, EDGE_LAG)[row] = t_syscall == MQE_NO_TIME ? 0 : t - t_syscall;
    MQE_I64(edges, EDGE_WRITE)[row] = write_ns;
}

/* The edge's time is read before the line is driven: a chip's line moves inside the
 * SET_VALUES ioctl that follows, at most EDGE_WRITE later. */
static void drive(mqe_engine *e, int pin, int level, int64_t t_syscall_ns) {
    e->levels[pin] = (uint8_t)level;
    int64_t t = mqe_now_ns();
    int64_t write_ns = mqe_gpio_write(e, pin, level, t);
    record_edge(e, pin, level, t, t_syscall_ns, write_ns);
}

void mqe_gpio_mark(mqe_engine *e, int pin, int64_t t_syscall_ns) {
    int level;
    if (e->pulse_mode) {
        if (e->levels[pin])
            return;
        e->raised[e->n_raised++] = pin;
        level = 1;
    } else {
        level = e->levels[pin] ^ 1;
    }
    drive(e, pin, level, t_syscall_ns);
}

void mqe_gpio_settle(mqe_engine *e) {
    for (size_t i = 0; i < e->n_raised; i++)
        drive(e, e->raised[i], 0, MQE_NO_TIME);
    e->n_raised = 0;
}

/* -- writing --------------------------------------------------------------------------- */

int mqe_out_reserve(mqe_engine *e, mqe_client *c, size_t bytes) {
    if (c->out_len + bytes <= c->out_cap)
        return 0;
    if (c->out_head) {  /* what was sent leaves room at the front: move the rest there */
        memmove(c->out, c->out + c->out_head, c->out_len - c->out_head);
        c->out_len -= c->out_head;
        c->out_head = 0;
        if (c->out_len + bytes <= c->out_cap)
            return 0;
    }
    size_t cap = c->out_cap ? c->out_cap : 4096;
    while (cap < c->out_len + bytes)
        cap *= 2;
    uint8_t *out = realloc(c->out, cap);
    if (out == NULL) {
        mqe_client_fail(e, c, "out of memory for %zu queued bytes", c->out_len + bytes);
        return -1;
    }
    c->out = out;
    c->out_cap = cap;
    return 0;
}

void mqe_watch_out(mqe_engine *e, mqe_client *c, int on) {
    if (c->watching_out == on)
        return;
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0),
                             .data.u64 = (uint64_t)(c - e->clients)};
    epoll_ctl(e->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev);
    c->watching_out = on;
}

/* mqtt-udp: every queued packet is a datagram of its own; one the socket refuses is lost,
 * as on a congested or lossy line. */
static int64_t flush_datagrams(mqe_engine *e, mqe_client *c) {
    size_t at = c->out_head;
    while (at + 2 <= c->out_len) {
        size_t length;
        if (c->sn) {  /* MQTT-SN: the length field counts the whole message */
            length = mqe_sn_length(c->out + at, c->out_len - at);
            if (length == 0 || length > c->out_len - at)
                break;  /* never queued: the engine encodes whole messages */
        } else {
            size_t remaining = 0, header = 1;
            unsigned shift = 0;
            uint8_t byte;
            do {
                byte = c->out[at + header++];
                remaining |= (size_t)(byte & 0x7F) << shift;
                shift += 7;
            } while (byte & 0x80);
            length = header + remaining;
        }
        if (send(c->fd, c->out + at, length, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
            if (errno == ECONNREFUSED) {
                mqe_client_fail(e, c, "broker %s:%d unreachable (ICMP port unreachable)",
                                c->host, c->port);
                return mqe_now_ns();
            }
            c->send_errors++;
        }
        at += length;
    }
    c->out_head = c->out_len = 0;
    c->last_sent_ns = mqe_now_ns();
    return c->last_sent_ns;
}

void mqe_udp_control(mqe_engine *e, mqe_client *c, const uint8_t *packet, size_t len) {
    uint8_t *copy = realloc(c->resend, len);
    if (copy == NULL) {
        mqe_client_fail(e, c, "out of memory for a control packet");
        return;
    }
    c->resend = copy;
    memmove(c->resend, packet, len);  /* packet may lie in c->out: copied before it moves */
    c->resend_len = len;
    if (mqe_out_reserve(e, c, len) != 0)
        return;
    memcpy(c->out + c->out_len, c->resend, len);
    c->out_len += len;
    c->resend_at_ns = mqe_now_ns() + 500000000;
    mqe_flush(e, c);
}

void mqe_udp_resend(mqe_engine *e, int64_t now) {
    for (size_t i = 0; i < e->n_clients; i++) {
        mqe_client *c = &e->clients[i];
        if (!c->udp || !c->resend_len || c->dead || c->fd < 0 || now < c->resend_at_ns)
            continue;
        if (mqe_out_reserve(e, c, c->resend_len) != 0)
            continue;
        memcpy(c->out + c->out_len, c->resend, c->resend_len);
        c->out_len += c->resend_len;
        c->resend_at_ns = now + 500000000;
        mqe_flush(e, c);
    }
}

int64_t mqe_flush(mqe_engine *e, mqe_client *c) {
    if (c->layered)
        return mqe_layers_flush(e, c);
    if (c->out_len == 0 || c->fd < 0 || c->dead)
        return MQE_NO_TIME;
    if (c->udp)
        return flush_datagrams(e, c);
    size_t waiting = c->out_len - c->out_head;
    ssize_t sent = send(c->fd, c->out + c->out_head, waiting, MSG_NOSIGNAL | MSG_DONTWAIT);
    int64_t t_returned = mqe_now_ns();
    if (sent < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            mqe_client_fail(e, c, "send failed: [Errno %d] %s", errno, strerror(errno));
            return t_returned;
        }
        sent = 0;
    }
    c->last_sent_ns = t_returned;
    if ((size_t)sent == waiting) {
        c->out_head = c->out_len = 0;
        mqe_watch_out(e, c, 0);
    } else {
        /* The rest stays where it is: moving it to the front after every partial send
         * cost a copy of the whole queue per send once the broker fell behind (memmove
         * was the engine's top symbol in P3); mqe_out_reserve moves it when it needs room. */
        c->out_head += (size_t)sent;
        mqe_watch_out(e, c, 1);
    }
    return t_returned;
}

void mqe_frame(mqe_engine *e, mqe_client *c, int64_t t_user, int64_t t_kernel) {
    size_t pos = c->in_start;
    char error[MQE_ERROR_CHARS];
    while (pos < c->in_end && !c->dead) {
        mqe_packet packet;
        long n = mqe_parse(c->in + pos, c->in_end - pos, &packet, error);
        if (n == 0)
            break;
        if (n < 0) {
            mqe_client_fail(e, c, "malformed packet from the broker: %s", error);
            return;
        }
        if (packet.type == MQE_CONNACK && packet.body_len >= 2) {  /* storm.c names refusals */
            c->connack_seen = 1;
            c->connack_code = packet.body[1];
        }
        mqe_handle_packet(e, c, &packet, t_user, t_kernel);
        if (packet.type == MQE_CONNACK && c->connected && c->t_connack_ns == MQE_NO_TIME)
            c->t_connack_ns = t_user;
        pos += (size_t)n;
    }
    if (pos == c->in_end)
        c->in_start = c->in_end = 0;
    else
        c->in_start = pos;
}

int mqe_make_room(mqe_engine *e, mqe_client *c) {
    if (c->in_start) {
        memmove(c->in, c->in + c->in_start, c->in_end - c->in_start);
        c->in_end -= c->in_start;
        c->in_start = 0;
    }
    if (c->in_cap - c->in_end >= MQE_COMPACT_BELOW)
        return 0;
    uint8_t *in = realloc(c->in, c->in_cap * 2);  /* a large packet must fit whole */
    if (in == NULL) {
        mqe_client_fail(e, c, "out of memory for a %zu-byte packet", c->in_cap * 2);
        return -1;
    }
    c->in = in;
    c->in_cap *= 2;
    return 0;
}

size_t mqe_table_room_bytes(const mqe_engine *e) {
    const mqe_table *dlv = &e->tables[MQE_T_DELIVERY], *edges = &e->tables[MQE_T_EDGE];
    uint32_t rows = dlv->capacity - dlv->rows, edge_rows = (edges->capacity - edges->rows) / 2;
    uint32_t free_rows = rows < edge_rows ? rows : edge_rows;
    /* as client_read: every MIN_DELIVERY_BYTES may complete a delivery, plus one packet
     * begun before */
    return free_rows <= 1 ? 0 : (size_t)(free_rows - 1) * MIN_DELIVERY_BYTES;
}

static int64_t kernel_stamp(const mqe_engine *e, struct msghdr *msg) {
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_TIMESTAMPING) {
            struct scm_timestamping stamps;
            memcpy(&stamps, CMSG_DATA(cm), sizeof stamps);
            if (stamps.ts[0].tv_sec == 0 && stamps.ts[0].tv_nsec == 0)
                return MQE_NO_TIME;
            return (int64_t)stamps.ts[0].tv_sec * 1000000000 + stamps.ts[0].tv_nsec
                   - e->realtime_offset_ns;
        }
    }
    return MQE_NO_TIME;
}

int mqe_feed(mqe_engine *e, int client, const uint8_t *data, size_t len) {
    mqe_client *c = &e->clients[client];
    if (c->sn) {  /* MQTT-SN: what is fed is one datagram */
        if (!c->dead)
            mqe_sn_handle(e, c, data, len, mqe_now_ns(), MQE_NO_TIME);
        mqe_gpio_settle(e);
        return c->failure[0] ? -1 : 0;
    }
    if (c->layered) {  /* what the socket would have read: TLS records, WebSocket frames */
        mqe_layers_receive(e, c, data, len, mqe_now_ns(), MQE_NO_TIME, 0);
        len = 0;
    }
    while (len && !c->dead) {
        if (c->in_cap - c->in_end < MQE_COMPACT_BELOW && mqe_make_room(e, c) != 0)
            break;
        size_t room = c->in_cap - c->in_end, take = len < room ? len : room;
        memcpy(c->in + c->in_end, data, take);
        c->in_end += take;
        data += take;
        len -= take;
        mqe_frame(e, c, mqe_now_ns(), MQE_NO_TIME);
    }
    mqe_gpio_settle(e);
    return c->failure[0] ? -1 : 0;
}

/* mqtt-udp: each datagram holds one whole packet. */
static void client_read_datagrams(mqe_engine *e, mqe_client *c) {
    const mqe_table *dlv = &e->tables[MQE_T_DELIVERY], *edges = &e->tables[MQE_T_EDGE];
    char error[MQE_ERROR_CHARS];
    while (!c->dead) {
        if (dlv->rows + 1 > dlv->capacity || edges->rows + 2 > edges->capacity) {
            e->need_drain = 1;
            return;
        }
        char control[CONTROL_BYTES];
        struct iovec iov = {.iov_base = c->in, .iov_len = c->in_cap};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                             .msg_controllen = sizeof control};
        ssize_t n = recvmsg(c->fd, &msg, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == ECONNREFUSED)
                mqe_client_fail(e, c, "broker %s:%d unreachable (ICMP port unreachable)",
                                c->host, c->port);
            return;  /* EAGAIN: drained */
        }
        int64_t t_user = mqe_now_ns();
        int64_t t_kernel = msg.msg_controllen ? kernel_stamp(e, &msg) : MQE_NO_TIME;
        if (c->sn) {
            mqe_sn_handle(e, c, c->in, (size_t)n, t_user, t_kernel);
            continue;
        }
        mqe_packet packet;
        long used = mqe_parse(c->in, (size_t)n, &packet, error);
        if (used != n) {
            if (used >= 0)
                snprintf(error, sizeof error, "a %zd-byte datagram holds %s", n,
                         used ? "more than one packet" : "a partial packet");
            mqe_client_fail(e, c, "malformed datagram from broker %s:%d: %s", c->host, c->port,
                            error);
            return;
        }
        mqe_handle_packet(e, c, &packet, t_user, t_kernel);
    }
}

/* TLS or WebSocket: each read decoded at once (layers.c), held while the tables are full. */
static void client_read_layered(mqe_engine *e, mqe_client *c) {
    if (c->held && mqe_layers_resume(e, c) != 0)
        return;
    while (!c->held && !c->dead) {
        char control[CONTROL_BYTES];
        struct iovec iov = {.iov_base = e->scratch, .iov_len = MQE_RECEIVE_BUFFER};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                             .msg_controllen = sizeof control};
        ssize_t n = recvmsg(c->fd, &msg, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            if (errno == EINTR)
                continue;
            char how[96];
            snprintf(how, sizeof how, "lost the connection: [Errno %d] %s", errno,
                     strerror(errno));
            mqe_layers_closed(e, c, how);
            return;
        }
        int64_t t_user = mqe_now_ns();
        if (n == 0) {
            mqe_layers_closed(e, c, "closed the connection");
            return;
        }
        int64_t t_kernel = msg.msg_controllen ? kernel_stamp(e, &msg) : MQE_NO_TIME;
        if (mqe_layers_receive(e, c, e->scratch, (size_t)n, t_user, t_kernel, 1) != 0)
            return;
        if ((size_t)n < MQE_RECEIVE_BUFFER)
            break;
    }
    mqe_flush(e, c);
}

static void client_read(mqe_engine *e, mqe_client *c) {
    if (c->udp) {
        client_read_datagrams(e, c);
        return;
    }
    if (c->layered) {
        client_read_layered(e, c);
        return;
    }
    for (;;) {
        if (c->in_cap - c->in_end < MQE_COMPACT_BELOW && mqe_make_room(e, c) != 0)
            return;
        size_t room = c->in_cap - c->in_end;
        /* every packet a read completes may be a delivery and an edge or two */
        uint32_t most = (uint32_t)(room / MIN_DELIVERY_BYTES + 1);
        const mqe_table *dlv = &e->tables[MQE_T_DELIVERY], *edges = &e->tables[MQE_T_EDGE];
        if (dlv->rows + most > dlv->capacity || edges->rows + 2 * most > edges->capacity) {
            e->need_drain = 1;  /* level-triggered: the socket is read after the drain */
            return;
        }
        char control[CONTROL_BYTES];
        struct iovec iov = {.iov_base = c->in + c->in_end, .iov_len = room};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                             .msg_controllen = sizeof control};
        ssize_t n = recvmsg(c->fd, &msg, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            if (errno == EINTR)
                continue;
            if (c->t_connack_ns == MQE_NO_TIME)  /* e.g. a TLS listener reset it */
                mqe_client_fail(e, c, "connection lost before its CONNACK (%s:%d: does the "
                                "port speak plain MQTT?): [Errno %d] %s", c->host, c->port,
                                errno, strerror(errno));
            else
                mqe_client_fail(e, c, "connection lost: [Errno %d] %s", errno,
                                strerror(errno));
            return;
        }
        int64_t t_user = mqe_now_ns();
        if (n == 0) {
            if (c->t_connack_ns == MQE_NO_TIME)  /* e.g. a TLS listener given plain MQTT */
                mqe_client_fail(e, c, "broker closed the connection before its CONNACK "
                                "(%s:%d: does the port speak plain MQTT?)", c->host, c->port);
            else
                mqe_client_fail(e, c, "broker closed the connection");
            return;
        }
        int64_t t_kernel = msg.msg_controllen ? kernel_stamp(e, &msg) : MQE_NO_TIME;
        c->in_end += (size_t)n;
        mqe_frame(e, c, t_user, t_kernel);
        if (c->dead || (size_t)n < room)
            break;
    }
    mqe_flush(e, c);
}

/* TX stamps from the error queue: each names (OPT_ID) the last byte of the send it stamps,
 * so every publish that ended at or before that byte left the kernel then. */
static void client_read_errqueue(mqe_engine *e, mqe_client *c) {
    mqe_table *tx = &e->tables[MQE_T_TX];
    for (;;) {
        char control[CONTROL_BYTES];
        struct msghdr msg = {.msg_control = control, .msg_controllen = sizeof control};
        if (recvmsg(c->fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
            return;
        int64_t t_kernel = MQE_NO_TIME;
        int have_key = 0;
        uint32_t key = 0;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_TIMESTAMPING) {
                t_kernel = kernel_stamp(e, &msg);
            } else if ((cm->cmsg_level == SOL_IP && cm->cmsg_type == IP_RECVERR)
                       || (cm->cmsg_level == SOL_IPV6 && cm->cmsg_type == IPV6_RECVERR)) {
                struct sock_extended_err err;
                memcpy(&err, CMSG_DATA(cm), sizeof err);
                if (err.ee_errno == ENOMSG && err.ee_origin == SO_EE_ORIGIN_TIMESTAMPING
                    && err.ee_info == SCM_TSTAMP_SND) {
                    have_key = 1;
                    key = err.ee_data;
                }
            }
        }
        if (!have_key || t_kernel == MQE_NO_TIME)
            continue;
        /* a TLS or WebSocket client's publishes are keyed once they are in records */
        while (c->tx_count && (!c->layered || c->tx_mapped)
               && (int32_t)((uint32_t)(c->tx_end[c->tx_head] - 1) - key) <= 0) {
            if (tx->rows == tx->capacity) {
                e->need_drain = 1;
                break;
            }
            uint32_t row = tx->rows++;
            MQE_I32(tx, TX_CLIENT)[row] = (int32_t)(c - e->clients);
            MQE_I64(tx, TX_SEQ)[row] = c->tx_seq[c->tx_head];
            MQE_I64(tx, TX_T_PUB)[row] = c->tx_t_pub[c->tx_head];
            MQE_I64(tx, TX_T_KERNEL)[row] = t_kernel;
            MQE_I64(tx, TX_LAG)[row] = t_kernel - c->tx_t_pub[c->tx_head];
            c->tx_head = (c->tx_head + 1) % c->tx_cap;
            c->tx_count--;
            if (c->layered)
                c->tx_mapped--;
        }
    }
}

static void arm_timer(mqe_engine *e, int64_t at_ns);

void mqe_handle_events(mqe_engine *e, int64_t timeout_ns) {
    struct epoll_event events[256];
    int timeout_ms = 0;
    if (timeout_ns > 0) {
        /* the timer fd wakes at the exact time; the ms timeout only backs it up */
        arm_timer(e, mqe_now_ns() + timeout_ns);
        timeout_ms = (int)(timeout_ns / 1000000) + 2;
    }
    if (e->n_held)
        timeout_ms = 0;  /* decoded bytes wait for this turn (layers.c) */
    int n = epoll_wait(e->epoll_fd, events, 256, timeout_ms);
    for (int i = 0; i < n; i++) {
        uint64_t tag = events[i].data.u64;
        if (tag == WAKE_TAG || tag == TIMER_TAG) {
            uint64_t count;
            ssize_t got = read(tag == WAKE_TAG ? e->wake_fd : e->timer_fd, &count, sizeof count);
            (void)got;
            if (tag == TIMER_TAG)
                e->timer_armed_ns = 0;
            else
                e->woken = 1;
            continue;
        }
        mqe_client *c = &e->clients[tag];
        if (c->rc && mqe_reconnect_event(e, c, events[i].events))
            continue;  /* a reconnect's connect under way, or a socket already closed */
        if (c->dead)
            continue;
        if (e->storm && mqe_storm_event(e, c, events[i].events))
            continue;  /* storm.c: a storm client's connect under way */
        if ((events[i].events & EPOLLERR) && c->udp)
            client_read(e, c);  /* a pending ICMP error: the read reports it */
        else if (events[i].events & EPOLLERR)
            client_read_errqueue(e, c);
        if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) {
            client_read(e, c);
            e->last_read_ns = mqe_now_ns();
        }
        if ((events[i].events & EPOLLOUT) && !c->dead)
            mqe_flush(e, c);
    }
    for (size_t i = 0; e->n_held && i < e->n_clients; i++) {
        mqe_client *c = &e->clients[i];
        if (c->held) {
            mqe_layers_resume(e, c);
            mqe_flush(e, c);
        }
    }
    mqe_gpio_settle(e);  /* pulses end once what arrived together is handled */
}

static void arm_timer(mqe_engine *e, int64_t at_ns) {
    if (e->timer_armed_ns && e->timer_armed_ns <= at_ns)
        return;  /* an earlier wake-up is set already */
    struct itimerspec spec = {.it_value = {.tv_sec = at_ns / 1000000000,
                                           .tv_nsec = at_ns % 1000000000}};
    timerfd_settime(e->timer_fd, TFD_TIMER_ABSTIME, &spec, NULL);
    e->timer_armed_ns = at_ns;
}

void mqe_misc(mqe_engine *e, int64_t now) {
    static const uint8_t pingreq[2] = {MQE_PINGREQ << 4, 0};
    static const uint8_t sn_pingreq[2] = {2, MQE_SN_PINGREQ};
    for (size_t i = 0; i < e->n_clients; i++) {
        mqe_client *c = &e->clients[i];
        if (c->fd < 0 || c->dead || !c->keepalive_ns)
            continue;
        if (c->udp) {  /* no connection to lose: a PINGREQ when quiet, no deadline */
            if (now - c->last_sent_ns >= c->keepalive_ns && mqe_out_reserve(e, c, 2) == 0) {
                memcpy(c->out + c->out_len, c->sn ? sn_pingreq : pingreq, 2);
                c->out_len += 2;
                mqe_flush(e, c);
            }
            continue;
        }
        if (c->ping_sent_ns && now - c->ping_sent_ns > c->keepalive_ns) {
            mqe_client_fail(e, c, "no PINGRESP within the keep-alive interval");
            continue;
        }
        if (!c->ping_sent_ns && now - c->last_sent_ns >= c->keepalive_ns / 2) {
            if (mqe_out_reserve(e, c, 2) != 0)
                continue;
            memcpy(c->out + c->out_len, pingreq, 2);
            c->out_len += 2;
            c->stream_bytes += 2;
            c->ping_sent_ns = now;
            mqe_flush(e, c);
        }
    }
    mqe_udp_resend(e, now);
    e->last_misc_ns = now;
}
