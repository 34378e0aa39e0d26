/* The engine's surface (engine.h): clients, connections, the open-loop run. */
#include <errno.h>
#include <fcntl.h>
#include <linux/net_tstamp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "client.h"

#define OFFSET_SAMPLES 64
#define MISC_INTERVAL_NS 250000000LL  /* keep-alive, and mqtt-udp's resends (every 0.5 s) */

static const int SN_RECEIVE_BUFFER = 1 << 20;  /* agents/mqtt_session.py's, for MQTT-SN */

static const uint8_t PUB_WIDTHS[PUB_COLUMNS] = {4, 8, 8, 8, 1, 4};
static const uint8_t DLV_WIDTHS[DLV_COLUMNS] = {4, 4, 8, 4, 4, 1, 1, 8, 8, 8, 1, 8, 1};
static const uint8_t SUB_WIDTHS[SUB_COLUMNS] = {4, 4, 1, 8, 8, 8};
static const uint8_t TX_WIDTHS[TX_COLUMNS] = {4, 8, 8, 8, 8};
static const uint8_t EDGE_WIDTHS[EDGE_COLUMNS] = {4, 8, 1, 8, 8};

static int set_error(mqe_engine *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int set_error(mqe_engine *e, int code, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(e->error, sizeof e->error, fmt, args);
    va_end(args);
    return code;
}

int mqe_refuse(mqe_engine *e, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(e->error, sizeof e->error, fmt, args);
    va_end(args);
    return -1;
}

/* CLOCK_REALTIME - CLOCK_MONOTONIC from the pair read closest together (kernel stamps are
 * on CLOCK_REALTIME; the run measures on CLOCK_MONOTONIC). */
static void measure_realtime_offset(mqe_engine *e) {
    int64_t best_gap = INT64_MAX;
    for (int i = 0; i < OFFSET_SAMPLES; i++) {
        struct timespec wall;
        int64_t before = mqe_now_ns();
        clock_gettime(CLOCK_REALTIME, &wall);
        int64_t after = mqe_now_ns();
        if (after - before < best_gap) {
            best_gap = after - before;
            e->realtime_offset_ns = (int64_t)wall.tv_sec * 1000000000 + wall.tv_nsec
                                    - (before + (after - before) / 2);
        }
    }
    e->realtime_gap_ns = best_gap;
}

mqe_engine *mqe_create(uint32_t event_capacity, int kernel_stamps, int pulse_mode) {
    mqe_engine *e = calloc(1, sizeof *e);
    if (e == NULL)
        return NULL;
    e->epoll_fd = e->wake_fd = e->timer_fd = -1;
    const uint8_t *widths[MQE_TABLES] = {PUB_WIDTHS, DLV_WIDTHS, SUB_WIDTHS, TX_WIDTHS,
                                         EDGE_WIDTHS};
    const uint32_t columns[MQE_TABLES] = {PUB_COLUMNS, DLV_COLUMNS, SUB_COLUMNS, TX_COLUMNS,
                                          EDGE_COLUMNS};
    int failed = 0;
    for (int t = 0; t < MQE_TABLES; t++) {
        /* edges: one per publish and delivery, two in pulse mode */
        uint32_t capacity = t == MQE_T_EDGE ? 2 * event_capacity : event_capacity;
        failed |= mqe_table_init(&e->tables[t], capacity, widths[t], columns[t]);
    }
    failed |= mqe_topics_init(&e->topics);
    e->levels = calloc(MQE_GPIO_PINS, 1);
    e->line_bit = calloc(MQE_GPIO_PINS, 1);
    e->line_fd = -1;
    e->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    e->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    e->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    e->scratch = malloc(MQE_RECEIVE_BUFFER);
    if (failed || e->scratch == NULL || e->levels == NULL || e->line_bit == NULL || e->epoll_fd < 0 || e->wake_fd < 0 || e->timer_fd < 0) {
        mqe_destroy(e);
        return NULL;
    }
    struct epoll_event wake = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
    struct epoll_event timer = {.events = EPOLLIN, .data.u64 = UINT64_MAX - 1};
    epoll_ctl(e->epoll_fd, EPOLL_CTL_ADD, e->wake_fd, &wake);
    epoll_ctl(e->epoll_fd, EPOLL_CTL_ADD, e->timer_fd, &timer);
    e->kernel_stamps_wanted = e->kernel_stamps_ok = kernel_stamps != 0;
    e->pulse_mode = pulse_mode != 0;
    measure_realtime_offset(e);
    return e;
}

static void free_client(mqe_client *c) {
    mqe_reconnect_free(c);
    mqe_session_free(c);  /* the password and the buffers a CONNECT went through, wiped */
    if (c->fd >= 0)
        close(c->fd);
    free(c->client_id);
    free(c->topic);
    free(c->host);
    free(c->ranges);
    free(c->in);
    free(c->out);
    free(c->prefix);
    free(c->inflight);
    free(c->awaiting_pubrel);
    free(c->resend);
    free(c->sn_topics);
    for (size_t i = 0; i < c->n_subs; i++)
        free(c->subs[i].name);
    free(c->subs);
    mqe_set_free(&c->received);
    free(c->tx_seq);
    free(c->tx_t_pub);
    free(c->tx_end);
    mqe_layers_free(c);
    mqe_later_free(c);
}

void mqe_destroy(mqe_engine *e) {
    if (e == NULL)
        return;
    for (size_t i = 0; i < e->n_clients; i++)
        free_client(&e->clients[i]);
    free(e->clients);
    for (int t = 0; t < MQE_TABLES; t++)
        mqe_table_free(&e->tables[t]);
    mqe_trees_free(e);
    mqe_storm_free(e);
    mqe_topics_free(&e->topics);
    free(e->levels);
    free(e->line_bit);
    if (e->line_fd >= 0)
        close(e->line_fd);
    free(e->raised);
    free(e->batch);
    free(e->heap);
    free(e->scratch);
    mqe_tls_free_context(e);
    for (int fd = 0; fd < 3; fd++) {
        int which = fd == 0 ? e->epoll_fd : fd == 1 ? e->wake_fd : e->timer_fd;
        if (which >= 0)
            close(which);
    }
    free(e);
}

const char *mqe_error(const mqe_engine *e) { return e->error; }
int64_t mqe_realtime_offset_ns(const mqe_engine *e) { return e->realtime_offset_ns; }
int64_t mqe_realtime_gap_ns(const mqe_engine *e) { return e->realtime_gap_ns; }
int mqe_kernel_stamps(const mqe_engine *e) { return e->kernel_stamps_ok; }

int mqe_add_client(mqe_engine *e, const char *client_id, const char *host, int port,
                   int role, const char *topic, int qos, int gpio_pin,
                   uint32_t publisher_index, int32_t payload_bytes, double rate_hz,
                   int64_t messages, int64_t warmup_messages, int64_t start_offset_ns,
                   int closed_loop) {
    if (qos < 0 || qos > 2)
        return set_error(e, -1, "client %s: qos %d is not 0, 1 or 2", client_id, qos);
    if (gpio_pin < 0 || gpio_pin >= MQE_GPIO_PINS)
        return set_error(e, -1, "client %s: gpio_pin %d is outside 0..%d", client_id,
                         gpio_pin, MQE_GPIO_PINS - 1);
    if (role == 0 && !(rate_hz > 0) && messages > 0)
        return set_error(e, -1, "client %s: rate_hz %g is not positive", client_id, rate_hz);
    size_t topic_len = strlen(topic);
    if (topic_len > 65535)
        return set_error(e, -1, "client %s: topic of %zu bytes is longer than 65535",
                         client_id, topic_len);
    if (e->n_clients == e->cap_clients) {
        size_t cap = e->cap_clients ? e->cap_clients * 2 : 16;
        mqe_client *clients = realloc(e->clients, cap * sizeof *clients);
        int32_t *raised = realloc(e->raised, cap * sizeof *raised);
        if (raised)
            e->raised = raised;
        int32_t *batch = realloc(e->batch, cap * sizeof *batch);
        if (batch)
            e->batch = batch;
        if (clients == NULL || raised == NULL || batch == NULL) {
            if (clients)
                e->clients = clients;
            return set_error(e, -1, "out of memory for %zu clients", cap);
        }
        e->clients = clients;
        e->cap_clients = cap;
    }
    mqe_client *c = &e->clients[e->n_clients];
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->client_id = strdup(client_id);
    c->host = strdup(host);
    c->topic = strdup(topic);
    c->topic_len = topic_len;
    c->port = port;
    c->role = role;
    c->qos = qos;
    c->gpio_pin = gpio_pin;
    c->publisher_index = publisher_index;
    c->payload_bytes = payload_bytes;
    c->rate_hz = rate_hz;
    c->messages = messages;
    c->warmup = warmup_messages;
    c->start_offset_ns = start_offset_ns;
    c->closed_loop = closed_loop;
    c->in_cap = MQE_RECEIVE_BUFFER;
    c->t_subscribe_sent_ns = c->t_subscribe_intended_ns = c->t_suback_ns = MQE_NO_TIME;
    c->t_connect_ns = c->t_tcp_ns = c->t_tls_ns = c->t_ws_ns = c->t_mqtt_sent_ns
        = c->t_connack_ns = MQE_NO_TIME;
    c->in = malloc(c->in_cap);
    c->topic_index = (int32_t)mqe_intern(&e->topics, topic, topic_len);
    if (role == 0) {
        size_t payload = payload_bytes > MQE_PAYLOAD_MIN ? (size_t)payload_bytes : MQE_PAYLOAD_MIN;
        c->prefix = malloc(topic_len + 8);
        if (c->prefix)
            c->prefix_len = mqe_publish_prefix(c->prefix, topic, topic_len, qos, payload,
                                               MQE_MQTT_311, NULL);  /* mqe_set_session: 5 */
        if (qos)
            c->inflight = calloc(65536, 1);
    }
    e->n_clients++;
    if (!c->client_id || !c->host || !c->topic || !c->in || c->topic_index < 0
        || (role == 0 && (!c->prefix || (qos && !c->inflight))))
        return set_error(e, -1, "out of memory for client %s", client_id);
    return (int)(e->n_clients - 1);
}

int mqe_set_udp(mqe_engine *e, int client) {
    mqe_client *c = &e->clients[client];
    if (c->qos)
        return set_error(e, -1, "client %s: mqtt-udp carries QoS 0 only, not %d", c->client_id,
                         c->qos);
    c->udp = 1;
    return 0;
}

int mqe_set_mqttsn(mqe_engine *e, int client) {
    return mqe_sn_prepare(&e->clients[client], e->error);
}

int mqe_set_tls(mqe_engine *e, int client, const char *server_name) {
    mqe_client *c = &e->clients[client];
    if (c->udp || c->sn)
        return set_error(e, -1, "client %s: TLS rides on mqtt-tcp only", c->client_id);
    if (e->ssl_ctx == NULL)
        return set_error(e, -1, "client %s: TLS is not configured (mqe_tls_configure first)",
                         c->client_id);
    if (server_name != NULL && (server_name[0] == 0 || strlen(server_name) > 253))
        return set_error(e, -1, "client %s: server name of %zu characters is not 1..253",
                         c->client_id, strlen(server_name));
    free(c->server_name);
    c->server_name = server_name ? strdup(server_name) : NULL;
    if (server_name && c->server_name == NULL)
        return set_error(e, -1, "out of memory for client %s", c->client_id);
    c->tls = c->layered = 1;
    return 0;
}

int mqe_set_websocket(mqe_engine *e, int client, const char *path) {
    mqe_client *c = &e->clients[client];
    if (c->udp || c->sn)
        return set_error(e, -1, "client %s: WebSocket rides on mqtt-tcp only", c->client_id);
    if (path[0] != '/' || strlen(path) > 512 || strpbrk(path, " \r\n\t") != NULL)
        return set_error(e, -1, "client %s: WebSocket path '%.100s' must start with / and "
                         "hold no blank (at most 512 characters)", c->client_id, path);
    free(c->ws_path);
    c->ws_path = strdup(path);
    if (c->ws_path == NULL)
        return set_error(e, -1, "out of memory for client %s", c->client_id);
    c->ws = c->layered = 1;
    return 0;
}

int mqe_connect_phases_of(const mqe_engine *e, int client, mqe_connect_phases *out) {
    const mqe_client *c = &e->clients[client];
    *out = (mqe_connect_phases){
        .t_connect_ns = c->t_connect_ns, .t_tcp_ns = c->t_tcp_ns, .t_tls_ns = c->t_tls_ns,
        .t_websocket_ns = c->t_ws_ns, .t_mqtt_sent_ns = c->t_mqtt_sent_ns,
        .t_connack_ns = c->t_connack_ns};
    snprintf(out->tls, sizeof out->tls, "%s", c->tls_description);
    return 0;
}

int mqe_add_warmup_range(mqe_engine *e, int client, uint32_t first, uint32_t end,
                         int64_t warmup_messages) {
    mqe_client *c = &e->clients[client];
    mqe_warmup_range *ranges = realloc(c->ranges, (c->n_ranges + 1) * sizeof *ranges);
    if (ranges == NULL)
        return set_error(e, -1, "out of memory for warm-up ranges");
    c->ranges = ranges;
    c->ranges[c->n_ranges++] = (mqe_warmup_range){first, end, warmup_messages};
    return 0;
}

/* A blocking connect with a timeout, then the socket goes non-blocking. */
static int open_socket(mqe_engine *e, mqe_client *c, int timeout_ms) {
    char port[16];
    snprintf(port, sizeof port, "%d", c->port);
    int type = c->udp ? SOCK_DGRAM : SOCK_STREAM;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = type}, *found;
    int rc = getaddrinfo(c->host, port, &hints, &found);
    if (rc != 0)
        return set_error(e, -EHOSTUNREACH, "%s: cannot resolve %s: %s", c->client_id, c->host,
                         gai_strerror(rc));
    int error = ECONNREFUSED;
    for (struct addrinfo *ai = found; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            error = errno;
            continue;
        }
        c->t_connect_ns = mqe_now_ns();
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
            error = errno;
            close(fd);
            continue;
        }
        if (c->udp) {  /* connect() only fixes the peer: nothing to wait for */
            c->fd = fd;
            break;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int soerr = 0;
        socklen_t len = sizeof soerr;
        if (poll(&pfd, 1, timeout_ms) != 1) {
            error = ETIMEDOUT;
            close(fd);
            continue;
        }
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
        if (soerr) {
            error = soerr;
            close(fd);
            continue;
        }
        c->t_tcp_ns = mqe_now_ns();
        c->fd = fd;
        break;
    }
    freeaddrinfo(found);
    if (c->fd < 0)
        return set_error(e, -error, "[Errno %d] %s (%s to %s:%d)", error, strerror(error),
                         c->client_id, c->host, c->port);
    return 0;
}

int mqe_connect_all(mqe_engine *e, int keepalive_s, int timeout_ms) {
    const int one = 1;
    const int stamping = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_TX_SOFTWARE
                         | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_ID
                         | SOF_TIMESTAMPING_OPT_TSONLY;
    for (size_t i = 0; i < e->n_clients; i++) {
        mqe_client *c = &e->clients[i];
        if (c->fd >= 0)
            continue;
        int rc = open_socket(e, c, timeout_ms);
        if (rc != 0)
            return rc;
        if (!c->udp)
            setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (c->sn)  /* ~1 s of a 1 kHz subscriber's datagrams, as the lean client asks */
            setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &SN_RECEIVE_BUFFER,
                       sizeof SN_RECEIVE_BUFFER);
        /* UDP: receive stamps only (a send stamp's OPT_ID counts datagrams, not bytes) */
        const int rx_only = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE;
        if (e->kernel_stamps_wanted
            && setsockopt(c->fd, SOL_SOCKET, SO_TIMESTAMPING, c->udp ? &rx_only : &stamping,
                          sizeof stamping) != 0)
            e->kernel_stamps_ok = 0;
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = i};
        if (epoll_ctl(e->epoll_fd, EPOLL_CTL_ADD, c->fd, &ev) != 0)
            return set_error(e, -errno, "epoll_ctl: %s", strerror(errno));
        c->keepalive_ns = (int64_t)keepalive_s * 1000000000;
        size_t id_len = strlen(c->client_id);
        size_t size = c->sn ? mqe_sn_connect_size(id_len) : mqe_session_connect_size(c);
        uint8_t *connect = malloc(size);
        if (connect == NULL || mqe_out_reserve(e, c, size) != 0) {
            free(connect);
            return set_error(e, -ENOMEM, "out of memory");
        }
        size_t n = c->sn ? mqe_sn_encode_connect(connect, c->client_id, id_len,
                                                 (uint16_t)keepalive_s)
                         : mqe_session_encode_connect(c, connect, (uint16_t)keepalive_s);
        if (c->udp) {
            mqe_udp_control(e, c, connect, n);
        } else {
            memcpy(c->out + c->out_len, connect, n);
            c->out_len += n;
            c->stream_bytes += n;
            if (c->layered) {  /* the CONNECT waits for the TLS and WebSocket handshakes */
                if (mqe_layers_start(e, c) == 0)
                    mqe_flush(e, c);
            } else {
                c->t_mqtt_sent_ns = mqe_flush(e, c);
            }
        }
        explicit_bzero(connect, size);  /* it may hold the password */
        free(connect);
        /* what earlier clients' brokers answered (handshakes, CONNACKs) is handled while
         * the rest connect, so that their phases are not timed waiting for the last */
        mqe_handle_events(e, 0);
    }
    return 0;
}

int mqe_subscribe(mqe_engine *e, int client, const char *topic, int qos) {
    mqe_client *c = &e->clients[client];
    size_t len = strlen(topic);
    int64_t index = mqe_intern(&e->topics, topic, len);
    if (index < 0)
        return set_error(e, -1, "out of memory for topic %s", topic);
    if (!strpbrk(topic, "+#")) {
        mqe_subscription *subs = realloc(c->subs, (c->n_subs + 1) * sizeof *subs);
        if (subs == NULL)
            return set_error(e, -1, "out of memory for subscriptions");
        c->subs = subs;
        c->subs[c->n_subs++] = (mqe_subscription){strdup(topic), len, (int32_t)index};
    }
    c->subscribed = 0;
    c->subscribing_topic = (int32_t)index;
    c->subscribing_qos = qos;
    if (c->rc && mqe_reconnect_remember(e, c, (int32_t)index, qos) != 0)
        return set_error(e, -1, "out of memory for subscriptions");
    uint16_t packet_id = (uint16_t)(c->next_packet_id % 0xFFFF + 1);
    c->next_packet_id = packet_id;
    if (c->sn && mqe_sn_subscribe_size(len) > MQE_SN_MAX_DATAGRAM)
        return set_error(e, -1, "client %s: topic filter of %zu octets does not fit an MQTT-SN "
                         "datagram", c->client_id, len);
    size_t size = c->sn ? mqe_sn_subscribe_size(len) : mqe_subscribe_size(len, mqe_level(c));
    if (mqe_out_reserve(e, c, size) != 0)
        return set_error(e, -1, "out of memory");
    size_t n = c->sn ? mqe_sn_encode_subscribe(c->out + c->out_len, packet_id, topic, len, qos)
                     : mqe_encode_subscribe(c->out + c->out_len, packet_id, topic, len, qos,
                                            mqe_level(c));
    if (c->udp) {  /* sent again until its SUBACK */
        mqe_udp_control(e, c, c->out + c->out_len, n);
        return 0;
    }
    c->out_len += n;
    c->stream_bytes += n;
    int64_t t_written = mqe_flush(e, c);
    c->t_subscribe_sent_ns = t_written != MQE_NO_TIME ? t_written : mqe_now_ns();
    return 0;
}

static int any_failed(const mqe_engine *e) {
    for (size_t i = 0; i < e->n_clients; i++)
        if (e->clients[i].failure[0])
            return 1;
    return 0;
}

int mqe_poll(mqe_engine *e, int64_t timeout_ns) {
    e->need_drain = 0;
    mqe_handle_events(e, timeout_ns);
    int64_t now = mqe_now_ns();
    if (now - e->last_misc_ns > MISC_INTERVAL_NS)
        mqe_misc(e, now);
    return any_failed(e) ? -1 : 0;
}

void mqe_wake(mqe_engine *e) {
    uint64_t one = 1;
    ssize_t n = write(e->wake_fd, &one, sizeof one);
    (void)n;
}

int mqe_client_stats_of(const mqe_engine *e, int client, mqe_client_stats *out) {
    const mqe_client *c = &e->clients[client];
    *out = (mqe_client_stats){
        .sent = c->sent, .acked = c->acked, .received_unique = (int64_t)c->received.count,
        .deliveries = c->deliveries, .first_intended_ns = c->first_intended_ns,
        .last_pub_ns = c->last_pub_ns, .send_lag_max_ns = c->send_lag_max_ns,
        .last_delivery_ns = c->last_delivery_ns, .connected = c->connected,
        .subscribed = c->subscribed, .failed = c->failure[0] != 0, .fd = c->fd,
        .dropped = c->dropped};
    return 0;
}

int mqe_gpio_level(const mqe_engine *e, int pin) {
    return pin >= 0 && pin < MQE_GPIO_PINS ? e->levels[pin] : 0;
}

const char *mqe_client_failure(const mqe_engine *e, int client) {
    return e->clients[client].failure;
}

uint32_t mqe_rows(const mqe_engine *e, int table) { return e->tables[table].rows; }
void *mqe_column(const mqe_engine *e, int table, int column) {
    return e->tables[table].column[column];
}
void mqe_clear(mqe_engine *e, int table) { e->tables[table].rows = 0; }
uint32_t mqe_topics(const mqe_engine *e) { return e->topics.count; }
const char *mqe_topic(const mqe_engine *e, uint32_t index) {
    return index < e->topics.count ? e->topics.names[index] : "";
}

void mqe_disconnect_all(mqe_engine *e) {
    static const uint8_t disconnect[2] = {MQE_DISCONNECT << 4, 0};
    static const uint8_t sn_disconnect[2] = {2, MQE_SN_DISCONNECT};
    for (size_t i = 0; i < e->n_clients; i++) {
        mqe_client *c = &e->clients[i];
        if (c->fd < 0)
            continue;
        if (c->connected && !c->dead && mqe_out_reserve(e, c, 2) == 0) {
            memcpy(c->out + c->out_len, c->sn ? sn_disconnect : disconnect, 2);
            c->out_len += 2;
            c->stream_bytes += 2;
            c->closing = 1;
            mqe_flush(e, c);
            if (c->layered)  /* the WebSocket close and TLS close_notify after it */
                mqe_layers_close(e, c);
        }
        c->closing = 1;
        epoll_ctl(e->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
        c->connected = 0;
    }
}
