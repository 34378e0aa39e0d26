/* The engine's private state: one MQTT client and the engine that runs them all. */
#ifndef MQE_CLIENT_H
#define MQE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "sn.h"
#include "tables.h"
#include "wire.h"

#define MQE_FAILURE_CHARS 256
#define MQE_MAX_BATCH 64            /* publishes per loop turn before writes and reads */
#define MQE_RECEIVE_BUFFER (1u << 16)
#define MQE_COMPACT_BELOW 4096u
#define MQE_GPIO_PINS 65536
#define MQE_NO_TIME INT64_MIN

typedef struct {
    char *name;
    size_t len;
    int32_t index;              /* in the engine's topic table */
} mqe_subscription;

typedef struct {
    uint32_t first, end;
    int64_t warmup;
} mqe_warmup_range;

typedef struct {
    uint16_t id;                /* an MQTT-SN topic id ... */
    int32_t index;              /* ... and its name in the engine's topic table */
} mqe_sn_topic;

typedef struct {
    /* the assignment */
    char *client_id;
    char *topic;
    size_t topic_len;
    int32_t topic_index;
    int role, qos, gpio_pin, closed_loop;
    uint32_t publisher_index;
    int32_t payload_bytes;
    double rate_hz;
    int64_t messages, warmup, start_offset_ns;
    char *host;
    int port;
    mqe_warmup_range *ranges;
    size_t n_ranges;
    /* the connection */
    int udp;                    /* mqtt-udp: one packet per datagram, no connection */
    int fd;
    uint8_t *in;
    size_t in_cap, in_start, in_end;
    uint8_t *out;               /* bytes out[out_head .. out_len) wait to be sent */
    size_t out_head, out_len, out_cap;
    int watching_out;           /* EPOLLOUT registered: the socket did not take everything */
    uint64_t stream_bytes;      /* bytes queued since connect: the kernel's TX stamp key */
    int64_t last_sent_ns, ping_sent_ns, keepalive_ns;
    uint8_t *prefix;            /* the PUBLISH fixed header and topic (one per publisher) */
    size_t prefix_len;
    uint16_t next_packet_id;
    uint8_t *inflight;          /* own QoS 1/2 publishes: packet id -> awaited ack type */
    uint8_t *awaiting_pubrel;   /* QoS 2 deliveries before their PUBREL: bit per packet id */
    mqe_subscription *subs;
    size_t n_subs;
    int32_t subscribing_topic;
    int subscribing_qos;
    mqe_key_set received;
    /* own publishes awaiting their kernel TX stamp (ring) */
    int64_t *tx_seq, *tx_t_pub;
    uint64_t *tx_end;
    size_t tx_head, tx_count, tx_cap;
    /* mqtt-udp: CONNECT and SUBSCRIBE are sent again until acknowledged */
    uint8_t *resend;
    size_t resend_len;
    int64_t resend_at_ns;
    int64_t send_errors;        /* datagrams the socket refused (a full buffer, a firewall) */
    /* mqtt-sn-udp (sn_flows.c): MQTT-SN 1.2 over the mqtt-udp socket handling */
    int sn;
    int sn_stage;               /* MQE_SN_CONNECTING, _REGISTERING, _READY */
    uint16_t sn_register_id;    /* the msg id of the publisher's REGISTER */
    mqe_sn_topic *sn_topics;    /* the ids this client learnt (REGACK, SUBACK, REGISTER) */
    size_t n_sn_topics;
    int64_t dropped;            /* malformed or unexpected datagrams, dropped */
    /* state and statistics */
    int connected, subscribed, dead, closing, in_batch;
    char failure[MQE_FAILURE_CHARS];
    int64_t sent, acked, deliveries;
    int64_t first_intended_ns, last_pub_ns, send_lag_max_ns, last_delivery_ns;
} mqe_client;

typedef struct {
    int64_t due_ns;
    int32_t client;
    int64_t k;
} mqe_due;

struct mqe_engine {
    mqe_client *clients;
    size_t n_clients, cap_clients;
    int epoll_fd, wake_fd, timer_fd;
    int64_t timer_armed_ns;
    int kernel_stamps_wanted, kernel_stamps_ok, pulse_mode;
    int64_t realtime_offset_ns, realtime_gap_ns;
    mqe_table tables[MQE_TABLES];
    mqe_topics_table topics;
    uint8_t *levels;            /* virtual GPIO: each pin's level */
    uint8_t *line_bit;          /* a GPIO chip's line request: pin -> bit + 1 (0: none) */
    int line_fd;                /* the line request (gpio_chip.c), -1 without a chip */
    int64_t line_write_failures;    /* SET_VALUES the chip refused */
    int line_write_errno;           /* ... the last one's errno */
    int32_t *raised;            /* pulse mode: pins raised since the last settle */
    size_t n_raised;
    int32_t *batch;             /* publishers with PUBLISHes queued this turn */
    size_t n_batch;
    mqe_due *heap;
    size_t n_heap, cap_heap;
    int running;
    int64_t t_start_ns, t_deadline_ns, t_publish_end_ns, drain_end_ns, drain_idle_ns;
    int64_t last_misc_ns;
    int64_t last_read_ns;       /* the last time a socket had something to read */
    int64_t last_publish_ns;    /* the last time PUBLISHes were written */
    int need_drain;
    int woken;                  /* mqe_wake was called: the step returns */
    char error[MQE_FAILURE_CHARS];
};

int64_t mqe_now_ns(void);
/* io.c: what the loop does with sockets */
void mqe_client_fail(mqe_engine *e, mqe_client *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int mqe_out_reserve(mqe_engine *e, mqe_client *c, size_t bytes);
int64_t mqe_flush(mqe_engine *e, mqe_client *c);
void mqe_handle_events(mqe_engine *e, int64_t timeout_ns);
void mqe_misc(mqe_engine *e, int64_t now);
void mqe_gpio_mark(mqe_engine *e, int pin, int64_t t_syscall_ns);
void mqe_gpio_settle(mqe_engine *e);
/* Drive a requested line (no-op without a chip); the ns the ioctl took from t_edge_ns. */
int64_t mqe_gpio_write(mqe_engine *e, int pin, int level, int64_t t_edge_ns);
void mqe_udp_control(mqe_engine *e, mqe_client *c, const uint8_t *packet, size_t len);
void mqe_udp_resend(mqe_engine *e, int64_t now);
/* flows.c: one packet from the broker */
void mqe_handle_packet(mqe_engine *e, mqe_client *c, const mqe_packet *p, int64_t t_user,
                       int64_t t_kernel);
void mqe_heap_push(mqe_engine *e, int64_t due_ns, int32_t client, int64_t k);
/* flows.c, shared with sn_flows.c: a delivery recorded, an own publish acknowledged
 * (type: the ack awaited), the pending SUBSCRIBE's SUBACK recorded */
void mqe_delivered(mqe_engine *e, mqe_client *c, const mqe_packet *p, int64_t t_user,
                   int64_t t_kernel);
void mqe_acknowledged(mqe_engine *e, mqe_client *c, int type, uint16_t packet_id);
void mqe_record_subscribed(mqe_engine *e, mqe_client *c);
/* sn_flows.c: one datagram from an MQTT-SN gateway; the publisher's prefix and CONNECT */
enum { MQE_SN_CONNECTING, MQE_SN_REGISTERING, MQE_SN_READY };
void mqe_sn_handle(mqe_engine *e, mqe_client *c, const uint8_t *datagram, size_t len,
                   int64_t t_user, int64_t t_kernel);
int mqe_sn_prepare(mqe_client *c, char *error);
int64_t mqe_due_ns(const mqe_engine *e, const mqe_client *c, int64_t k);

#endif
