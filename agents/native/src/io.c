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
    c->dead = 1;
    c->connected = 0;
    c->out_len = 0;
    if (c->fd >= 0)
        epoll_ctl(e->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);  /* a closed socket stays readable */
    if (c->closing)
        return;  /* it was disconnecting: not a failure */
    va_list args;
    va_start(args, fmt);
    vsnprintf(c->failure, sizeof c->failure, fmt, args);
    va_end(args);
}

/* -- GPIO (virtual lines: levels in memory, every edge recorded) ----------------------- */

static void record_edge(mqe_engine *e, int pin, int level, int64_t t, int64_t t_syscall) {
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
    e->levels[pin] = (uint8_t)level;
    mqe_gpio_write(e, pin, level);
    record_edge(e, pin, level, mqe_now_ns(), t_syscall_ns);
}

void mqe_gpio_settle(mqe_engine *e) {
    for (size_t i = 0; i < e->n_raised; i++) {
        e->levels[e->raised[i]] = 0;
        mqe_gpio_write(e, e->raised[i], 0);
        record_edge(e, e->raised[i], 0, mqe_now_ns(), MQE_NO_TIME);
    }
    e->n_raised = 0;
}

/* -- writing --------------------------------------------------------------------------- */

int mqe_out_reserve(mqe_engine *e, mqe_client *c, size_t bytes) {
    if (c->out_len + bytes <= c->out_cap)
        return 0;
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

static void queue_ack(mqe_engine *e, mqe_client *c, int type, uint16_t packet_id) {
    if (mqe_out_reserve(e, c, 4) != 0)
        return;
    c->out_len += mqe_encode_ack(c->out + c->out_len, type, packet_id);
    c->stream_bytes += 4;
}

static void watch_out(mqe_engine *e, mqe_client *c, int on) {
    if (c->watching_out == on)
        return;
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0),
                             .data.u64 = (uint64_t)(c - e->clients)};
    epoll_ctl(e->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev);
    c->watching_out = on;
}

int64_t mqe_flush(mqe_engine *e, mqe_client *c) {
    if (c->out_len == 0 || c->fd < 0 || c->dead)
        return MQE_NO_TIME;
    ssize_t sent = send(c->fd, c->out, c->out_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    int64_t t_returned = mqe_now_ns();
    if (sent < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            mqe_client_fail(e, c, "send failed: [Errno %d] %s", errno, strerror(errno));
            return t_returned;
        }
        sent = 0;
    }
    c->last_sent_ns = t_returned;
    if ((size_t)sent == c->out_len) {
        c->out_len = 0;
        watch_out(e, c, 0);
    } else {
        memmove(c->out, c->out + sent, c->out_len - (size_t)sent);
        c->out_len -= (size_t)sent;
        watch_out(e, c, 1);
    }
    return t_returned;
}

/* -- packets from the broker ----------------------------------------------------------- */

static void record_subscribed(mqe_engine *e, mqe_client *c) {
    mqe_table *subs = &e->tables[MQE_T_SUBSCRIBE];
    if (subs->rows == subs->capacity) {
        mqe_client_fail(e, c, "event buffer full (%u subscriptions not drained)", subs->rows);
        return;
    }
    uint32_t row = subs->rows++;
    MQE_I32(subs, SUB_CLIENT)[row] = (int32_t)(c - e->clients);
    MQE_I32(subs, SUB_TOPIC)[row] = c->subscribing_topic;
    MQE_U8(subs, SUB_QOS)[row] = (uint8_t)c->subscribing_qos;
    MQE_I64(subs, SUB_T_SUBACK)[row] = mqe_now_ns();
}

static int64_t warmup_of(const mqe_client *c, uint32_t publisher) {
    for (size_t i = 0; i < c->n_ranges; i++)
        if (c->ranges[i].first <= publisher && publisher < c->ranges[i].end)
            return c->ranges[i].warmup;
    return c->warmup;
}

static int32_t topic_index(mqe_engine *e, mqe_client *c, const mqe_packet *p) {
    for (size_t i = 0; i < c->n_subs; i++)
        if (c->subs[i].len == p->topic_len && memcmp(c->subs[i].name, p->topic, p->topic_len) == 0)
            return c->subs[i].index;
    return (int32_t)mqe_intern(&e->topics, (const char *)p->topic, p->topic_len);
}

static void delivered(mqe_engine *e, mqe_client *c, const mqe_packet *p, int64_t t_user,
                      int64_t t_kernel) {
    mqe_gpio_mark(e, c->gpio_pin, t_user);
    uint64_t seq;
    uint32_t publisher;
    int64_t t_pub, t_intended;
    if (mqe_decode_payload(p->payload, p->payload_len, &seq, &publisher, &t_pub, &t_intended))
        return;  /* not one of ours (e.g. a stray retained message) */
    int fresh = mqe_set_add(&c->received, ((uint64_t)publisher << 40) ^ seq);
    if (fresh < 0) {
        mqe_client_fail(e, c, "out of memory for the messages received");
        return;
    }
    c->last_delivery_ns = t_user;
    c->deliveries++;
    int32_t topic = topic_index(e, c, p);
    mqe_table *dlv = &e->tables[MQE_T_DELIVERY];
    if (topic < 0 || dlv->rows == dlv->capacity) {
        mqe_client_fail(e, c, "event buffer full (%u deliveries not drained)", dlv->rows);
        return;
    }
    uint32_t row = dlv->rows++;
    MQE_I32(dlv, DLV_CLIENT)[row] = (int32_t)(c - e->clients);
    MQE_I32(dlv, DLV_PUBLISHER)[row] = (int32_t)publisher;
    MQE_I64(dlv, DLV_SEQ)[row] = (int64_t)seq;
    MQE_I32(dlv, DLV_TOPIC)[row] = topic;
    MQE_I32(dlv, DLV_PAYLOAD_BYTES)[row] = (int32_t)p->payload_len;
    MQE_U8(dlv, DLV_QOS)[row] = (uint8_t)p->qos;
    MQE_U8(dlv, DLV_WARMUP)[row] = (int64_t)seq < warmup_of(c, publisher);
    MQE_I64(dlv, DLV_T_INTENDED)[row] = t_intended;
    MQE_I64(dlv, DLV_T_PUB)[row] = t_pub;
    MQE_I64(dlv, DLV_T_RECV)[row] = t_kernel == MQE_NO_TIME ? t_user : t_kernel;
    MQE_U8(dlv, DLV_KERNEL)[row] = t_kernel != MQE_NO_TIME;
    MQE_I64(dlv, DLV_T_RECV_USER)[row] = t_user;
}

static int bit(const uint8_t *bits, uint16_t i) { return (bits[i >> 3] >> (i & 7)) & 1; }

static void publish_received(mqe_engine *e, mqe_client *c, const mqe_packet *p,
                             int64_t t_user, int64_t t_kernel) {
    if (p->qos == 1) {
        queue_ack(e, c, MQE_PUBACK, p->packet_id);
    } else if (p->qos == 2) {
        queue_ack(e, c, MQE_PUBREC, p->packet_id);
        if (c->awaiting_pubrel == NULL && (c->awaiting_pubrel = calloc(8192, 1)) == NULL) {
            mqe_client_fail(e, c, "out of memory for QoS 2 deliveries");
            return;
        }
        if (bit(c->awaiting_pubrel, p->packet_id))
            return;  /* a DUP of a message already delivered */
        c->awaiting_pubrel[p->packet_id >> 3] |= (uint8_t)(1u << (p->packet_id & 7));
    }
    delivered(e, c, p, t_user, t_kernel);
}

static void acknowledged(mqe_engine *e, mqe_client *c, int type, uint16_t packet_id) {
    if (type == MQE_PUBREL) {
        if (c->awaiting_pubrel)
            c->awaiting_pubrel[packet_id >> 3] &= (uint8_t)~(1u << (packet_id & 7));
        queue_ack(e, c, MQE_PUBCOMP, packet_id);
        return;
    }
    int awaited = c->inflight ? c->inflight[packet_id] : 0;
    if (awaited != type) {
        mqe_client_fail(e, c, "malformed packet from the broker: %s for packet id %u, which "
                        "awaits %s", mqe_type_name(type), packet_id,
                        awaited ? mqe_type_name(awaited) : "nothing");
        return;
    }
    if (type == MQE_PUBREC) {
        c->inflight[packet_id] = MQE_PUBCOMP;
        queue_ack(e, c, MQE_PUBREL, packet_id);
        return;
    }
    c->inflight[packet_id] = 0;
    c->acked++;
    if (c->closed_loop && e->running && c->sent < c->messages) {
        /* the next message is due now, or at its place in the schedule if that is later */
        int64_t due = mqe_due_ns(e, c, c->sent), now = mqe_now_ns();
        mqe_heap_push(e, due > now ? due : now, (int32_t)(c - e->clients), c->sent);
    }
}

static void handle_packet(mqe_engine *e, mqe_client *c, const mqe_packet *p, int64_t t_user,
                          int64_t t_kernel) {
    switch (p->type) {
    case MQE_PUBLISH:
        publish_received(e, c, p, t_user, t_kernel);
        break;
    case MQE_CONNACK:
        if (p->return_code)
            mqe_client_fail(e, c, "CONNACK refused: return code %u", p->return_code);
        else
            c->connected = 1;
        break;
    case MQE_SUBACK:
        for (size_t i = 0; i < p->payload_len; i++) {
            if (p->payload[i] == 0x80) {
                mqe_client_fail(e, c, "SUBACK refused '%s': return code 0x80",
                                mqe_topic(e, (uint32_t)c->subscribing_topic));
                return;
            }
        }
        c->subscribed = 1;
        record_subscribed(e, c);
        break;
    case MQE_PINGRESP:
        c->ping_sent_ns = 0;
        break;
    default:
        acknowledged(e, c, p->type, p->packet_id);
    }
}

static void frame(mqe_engine *e, mqe_client *c, int64_t t_user, int64_t t_kernel) {
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
        handle_packet(e, c, &packet, t_user, t_kernel);
        pos += (size_t)n;
    }
    if (pos == c->in_end)
        c->in_start = c->in_end = 0;
    else
        c->in_start = pos;
}

static int make_room(mqe_engine *e, mqe_client *c) {
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
    while (len && !c->dead) {
        if (c->in_cap - c->in_end < MQE_COMPACT_BELOW && make_room(e, c) != 0)
            break;
        size_t room = c->in_cap - c->in_end, take = len < room ? len : room;
        memcpy(c->in + c->in_end, data, take);
        c->in_end += take;
        data += take;
        len -= take;
        frame(e, c, mqe_now_ns(), MQE_NO_TIME);
    }
    mqe_gpio_settle(e);
    return c->failure[0] ? -1 : 0;
}

static void client_read(mqe_engine *e, mqe_client *c) {
    for (;;) {
        if (c->in_cap - c->in_end < MQE_COMPACT_BELOW && make_room(e, c) != 0)
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
            mqe_client_fail(e, c, "connection lost: [Errno %d] %s", errno, strerror(errno));
            return;
        }
        int64_t t_user = mqe_now_ns();
        if (n == 0) {
            mqe_client_fail(e, c, "broker closed the connection");
            return;
        }
        int64_t t_kernel = msg.msg_controllen ? kernel_stamp(e, &msg) : MQE_NO_TIME;
        c->in_end += (size_t)n;
        frame(e, c, t_user, t_kernel);
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
        while (c->tx_count && (int32_t)((uint32_t)(c->tx_end[c->tx_head] - 1) - key) <= 0) {
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
        if (c->dead)
            continue;
        if (events[i].events & EPOLLERR)
            client_read_errqueue(e, c);
        if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP))
            client_read(e, c);
        if ((events[i].events & EPOLLOUT) && !c->dead)
            mqe_flush(e, c);
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
    for (size_t i = 0; i < e->n_clients; i++) {
        mqe_client *c = &e->clients[i];
        if (c->fd < 0 || c->dead || !c->keepalive_ns)
            continue;
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
    e->last_misc_ns = now;
}
