/* The engine's private state: one MQTT client and the engine that runs them all. */
#ifndef MQE_CLIENT_H
#define MQE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "sn.h"
#include "tables.h"
#include "wire.h"
#include "ws.h"

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
    /* TLS and WebSocket under MQTT (layers.c, tls.c): `in` and `out` hold MQTT bytes; what
     * goes on the socket waits in `wire` (TLS records, WebSocket frames, handshakes) */
    int layered;                /* tls or ws: the socket's bytes are not MQTT's */
    int tls, ws;
    int stage;                  /* MQE_STAGE_*: the handshakes before MQTT */
    void *ssl;                  /* SSL * (tls.c) */
    char *server_name;          /* SNI and the name verified; NULL: the host */
    char *ws_path;
    char ws_key[MQE_WS_KEY_CHARS + 1];
    uint64_t ws_mask_state;     /* each frame's mask (xorshift64*, seeded from getrandom) */
    uint64_t ws_payload_left;   /* of the data frame being read: bytes still to come */
    int ws_in_message;          /* a fragmented binary message is open */
    uint8_t *ws_in;             /* WebSocket bytes not yet decoded: the upgrade answer, frames */
    size_t ws_in_len, ws_in_cap;
    uint8_t *wire;              /* bytes wire[wire_head .. wire_len) wait for the socket */
    size_t wire_head, wire_len, wire_cap;
    uint64_t wire_bytes;        /* bytes queued to the socket since connect: its TX stamp key */
    size_t tx_mapped;           /* own publishes at the TX ring's head keyed by wire bytes */
    int held;                   /* decoded bytes wait for a drain of the event tables */
    int64_t rx_t_user, rx_t_kernel;  /* the read that brought the bytes being decoded */
    char tls_description[64];   /* protocol and cipher, once the handshake is done */
    /* the MQTT session (session.c, mqe_set_session): version and credentials of CONNECT */
    int mqtt5;                  /* MQTT 5 (protocol level 5), else 3.1.1 */
    char *username;             /* NULL: none */
    size_t username_len;
    uint8_t *password;          /* NULL: none; wiped before it is freed, never printed */
    size_t password_len;
    size_t packet_id_at;        /* MQTT 5, QoS > 0: the packet id's slot in `prefix`; 0:
                                 * the id follows the prefix (3.1.1, MQTT-SN) */
    mqe_connack_grants grants;  /* what an MQTT 5 CONNACK granted */
    /* connection phases (mqe_connect_phases_of; MQE_NO_TIME: not reached) */
    int64_t t_connect_ns, t_tcp_ns, t_tls_ns, t_ws_ns, t_mqtt_sent_ns, t_connack_ns;
    /* state and statistics */
    int connected, subscribed, dead, closing, in_batch;
    char failure[MQE_FAILURE_CHARS];
    int64_t sent, acked, deliveries;
    int64_t first_intended_ns, last_pub_ns, send_lag_max_ns, last_delivery_ns;
    struct mqe_tree *tree;      /* topics_tree.c: a topic per message, NULL: `topic` */
    uint64_t tree_first;
    /* reconnect.c: a persistent session, absences and reconnects (NULL: none asked) */
    struct mqe_reconnect *rc;
    int keep_session;           /* CONNECT with clean session / clean start 0 */
    uint32_t session_expiry_s;  /* MQTT 5: its Session Expiry Interval */
    int session_present;        /* the last CONNACK's session present flag (-1: none) */
    /* retained.c: a retained publisher's topics; a subscription made during the run */
    int retain;
    uint32_t retain_first, retain_stride, retain_count;
    struct mqe_later *later;    /* NULL: subscribed before the run */
    int64_t t_subscribe_sent_ns, t_subscribe_intended_ns, t_suback_ns;
    /* storm.c: the CONNACK's return / reason code as read (io.c's mqe_frame) */
    int connack_seen, connack_code;
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
    int64_t hand_back_ns;       /* the last MQE_SLICE's clock reading ... */
    int hand_back_quiet;        /* ... and whether it was quiet (else the forced one) */
    int need_drain;
    int woken;                  /* mqe_wake was called: the step returns */
    void *ssl_ctx;              /* SSL_CTX * for every TLS client (mqe_tls_configure) */
    int tls_verify;
    uint8_t *scratch;           /* a TLS client's ciphertext as read (one read at a time) */
    size_t n_held;              /* clients with held bytes (layers.c) */
    char error[MQE_FAILURE_CHARS];
    struct mqe_tree **trees;    /* topics_tree.c: the publishers' topic trees */
    size_t n_trees;
    size_t n_rc;                /* reconnect.c: clients with an absence or reconnects */
    int64_t rc_due_ns;          /* ... the next time one has something to do */
    int64_t publishers_done_ns; /* retained.c: every publisher done (MQE_NO_TIME: not yet) */
    size_t n_later, n_later_unsent; /* ... clients subscribing during the run; not yet */
    struct mqe_storm *storm;    /* storm.c: a connection storm's schedule and outcomes */
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
void mqe_handle_packet(mqe_engine *e, mqe_client *c, mqe_packet *p, int64_t t_user,
                       int64_t t_kernel);
/* session.c: the client's CONNECT (with its version and credentials), the CONNACK taken
 * (a refusal named, MQTT 5's grants applied), the credentials wiped */
size_t mqe_session_connect_size(const mqe_client *c);
size_t mqe_session_encode_connect(const mqe_client *c, uint8_t *to, uint16_t keepalive_s);
void mqe_session_connack(mqe_engine *e, mqe_client *c, const mqe_packet *p,
                         const mqe_connack_grants *grants);
void mqe_session_free(mqe_client *c);
static inline int mqe_level(const mqe_client *c) { return c->mqtt5 ? MQE_MQTT_5 : MQE_MQTT_311; }
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
/* io.c, for layers.c */
void mqe_watch_out(mqe_engine *e, mqe_client *c, int on);
void mqe_frame(mqe_engine *e, mqe_client *c, int64_t t_user, int64_t t_kernel);
int mqe_make_room(mqe_engine *e, mqe_client *c);
/* MQTT bytes a read may add to `in` before the event tables need a drain (0: drain now) */
size_t mqe_table_room_bytes(const mqe_engine *e);
/* layers.c: TLS and WebSocket between the socket and the MQTT buffers */
enum { MQE_STAGE_READY = 0, MQE_STAGE_TLS = 1, MQE_STAGE_UPGRADE = 2 };
int mqe_layers_start(mqe_engine *e, mqe_client *c);       /* after TCP connect */
/* Bytes from the socket (or fed): decoded into `in` and framed. may_hold: stop for a
 * drain of the tables (held), else decode all. 0, or -1 once the client has failed. */
int mqe_layers_receive(mqe_engine *e, mqe_client *c, const uint8_t *data, size_t len,
                       int64_t t_user, int64_t t_kernel, int may_hold);
int mqe_layers_resume(mqe_engine *e, mqe_client *c);     /* decode what was held */
int64_t mqe_layers_flush(mqe_engine *e, mqe_client *c);
void mqe_layers_closed(mqe_engine *e, mqe_client *c, const char *how);
void mqe_layers_close(mqe_engine *e, mqe_client *c);     /* close_notify, best effort */
void mqe_layers_free(mqe_client *c);
/* tls.c */
int mqe_tls_start(mqe_engine *e, mqe_client *c);
int mqe_tls_handshake(mqe_engine *e, mqe_client *c);     /* 1 done, 0 more, -1 failed */
long mqe_tls_read(mqe_engine *e, mqe_client *c, uint8_t *to, size_t cap);  /* 0: none */
int mqe_tls_absorb(mqe_client *c, const uint8_t *data, size_t len);
int mqe_tls_write(mqe_engine *e, mqe_client *c, const uint8_t *data, size_t len);
int mqe_tls_shutdown(mqe_engine *e, mqe_client *c);
void mqe_tls_free(mqe_client *c);
void mqe_tls_free_context(mqe_engine *e);
/* layers.c, for tls.c: room for `bytes` more in `wire`, and a record queued */
int mqe_wire_reserve(mqe_engine *e, mqe_client *c, size_t bytes);

/* topics_tree.c: the PUBLISH prefix of a tree publisher's message k (its longest first),
 * with the topic's index; the trees freed */
size_t mqe_tree_prefix_max(const mqe_client *c);
size_t mqe_tree_prefix(mqe_client *c, int64_t k, uint8_t *to, size_t *packet_id_at,
                       int32_t *topic_index);
void mqe_trees_free(mqe_engine *e);
/* retained.c: a retained publisher's topic of message k; later subscriptions written when
 * due, the loop's wait cut to the next, one without its SUBACK yet; freed */
int64_t mqe_retained_slot(const mqe_client *c, int64_t k);
void mqe_later_tick(mqe_engine *e, int64_t now);
int64_t mqe_later_wait(mqe_engine *e, int64_t now, int64_t wait);
int mqe_later_pending(const mqe_engine *e);
void mqe_later_free(mqe_client *c);

/* reconnect.c: the hooks of absences and reconnects in the loop. mqe_reconnect_lost: a
 * client's connection failed (why: the failure's text); 1 if it reconnects instead of
 * failing. mqe_reconnect_named: a failed persistent client's failure says a client id
 * collision may be why. _event: 1 if the epoll event was the reconnect's (a connect under
 * way, or a socket already gone). _tick: absences and attempts that are due; the wait
 * bounded by the next. _connack / _suback: a reconnect's answers (1: taken). */
int mqe_reconnect_lost(mqe_engine *e, mqe_client *c, const char *why);
void mqe_reconnect_named(mqe_client *c);
int mqe_reconnect_event(mqe_engine *e, mqe_client *c, uint32_t events);
int64_t mqe_reconnect_tick(mqe_engine *e, int64_t now, int64_t wait_ns);
void mqe_reconnect_connack(mqe_engine *e, mqe_client *c, int64_t t_read_ns);
int mqe_reconnect_suback(mqe_engine *e, mqe_client *c);
int mqe_reconnect_remember(mqe_engine *e, mqe_client *c, int32_t topic, int qos);
int mqe_reconnect_away(const mqe_client *c);     /* 1: no connection to publish on */
int64_t mqe_reconnect_abandoned(const mqe_client *c);
int64_t mqe_reconnect_not_sent(const mqe_client *c);  /* publishes skipped while away */
void mqe_reconnect_skipped(mqe_client *c);       /* a publish due while away, not sent */
void mqe_reconnect_free(mqe_client *c);


/* storm.c: a connection storm. _event: 1 if the epoll event was a storm client's connect
 * under way (taken); _free: the storm's state freed (mqe_destroy). */
typedef struct mqe_storm mqe_storm;
int mqe_storm_event(mqe_engine *e, mqe_client *c, uint32_t events);
void mqe_storm_free(mqe_engine *e);

/* engine.c: a set-up call refused: its reason formatted into mqe_error's text; -1. */
int mqe_refuse(mqe_engine *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
