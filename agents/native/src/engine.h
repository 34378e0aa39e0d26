/* mqttbed's native load engine: every MQTT client of one agent process on one thread.
 *
 * The Python agent drives it through ctypes (agents/native/engine.py): it adds clients,
 * connects and subscribes them, then steps the open-loop run in slices, draining the
 * event tables (struct of arrays, preallocated) between slices. Nothing here calls Python.
 */
#ifndef MQE_ENGINE_H
#define MQE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(default)  /* the library exports this surface only */

typedef struct mqe_engine mqe_engine;

/* Event tables and their columns (the Python side reads them by these numbers). */
enum { MQE_T_PUBLISH, MQE_T_DELIVERY, MQE_T_SUBSCRIBE, MQE_T_TX, MQE_T_EDGE, MQE_TABLES };
/* PUB_TOPIC: the topic the message went to, in the interned topics (mqe_topic) */
enum { PUB_CLIENT, PUB_SEQ, PUB_T_INTENDED, PUB_T_PUB, PUB_WARMUP, PUB_TOPIC, PUB_COLUMNS };
/* DLV_RETAIN: the delivered PUBLISH's RETAIN flag (a retained value sent on subscribing) */
enum { DLV_CLIENT, DLV_PUBLISHER, DLV_SEQ, DLV_TOPIC, DLV_PAYLOAD_BYTES, DLV_QOS, DLV_WARMUP,
       DLV_T_INTENDED, DLV_T_PUB, DLV_T_RECV, DLV_KERNEL, DLV_T_RECV_USER, DLV_RETAIN,
       DLV_COLUMNS };
/* SUB_T_SENT: the SUBSCRIBE written; SUB_T_INTENDED: when a later subscription was due
 * (mqe_subscribe_later), MQE_NO_TIME (INT64_MIN) for one made before the run */
enum { SUB_CLIENT, SUB_TOPIC, SUB_QOS, SUB_T_SUBACK, SUB_T_SENT, SUB_T_INTENDED, SUB_COLUMNS };
enum { TX_CLIENT, TX_SEQ, TX_T_PUB, TX_T_KERNEL, TX_LAG, TX_COLUMNS };
/* EDGE_T: read right before the line is driven; EDGE_LAG: EDGE_T - the return of the send
 * or receive call the edge marks; EDGE_WRITE: how long driving a chip's line took (the
 * SET_VALUES ioctl: the line moved within [EDGE_T, EDGE_T + EDGE_WRITE]; 0 when virtual). */
enum { EDGE_PIN, EDGE_T, EDGE_LEVEL, EDGE_LAG, EDGE_WRITE, EDGE_COLUMNS };

/* What mqe_step returns. */
enum { MQE_DONE = 0, MQE_SLICE = 1, MQE_DRAIN = 2, MQE_WOKEN = 3, MQE_DEADLINE = 4,
       MQE_FAILED = -1 };

typedef struct {
    int64_t sent, acked, received_unique, deliveries;
    int64_t first_intended_ns, last_pub_ns, send_lag_max_ns, last_delivery_ns;
    int32_t connected, subscribed, failed, fd;
    int64_t dropped;  /* mqtt-sn-udp: malformed or unexpected datagrams dropped */
} mqe_client_stats;

mqe_engine *mqe_create(uint32_t event_capacity, int kernel_stamps, int pulse_mode);
void mqe_destroy(mqe_engine *e);
const char *mqe_error(const mqe_engine *e);  /* the last failure, "" if none */
int64_t mqe_realtime_offset_ns(const mqe_engine *e);
int64_t mqe_realtime_gap_ns(const mqe_engine *e);
int mqe_kernel_stamps(const mqe_engine *e);   /* 1 if every socket took SO_TIMESTAMPING */

/* role: 0 publisher, 1 subscriber. Returns the client's index, or -1 (mqe_error says). */
int mqe_add_client(mqe_engine *e, const char *client_id, const char *host, int port,
                   int role, const char *topic, int qos, int gpio_pin,
                   uint32_t publisher_index, int32_t payload_bytes, double rate_hz,
                   int64_t messages, int64_t warmup_messages, int64_t start_offset_ns,
                   int closed_loop);
/* Speak mqtt-udp on this client (before connecting): one packet per datagram, QoS 0,
 * CONNECT and SUBSCRIBE sent again every half second until acknowledged. */
int mqe_set_udp(mqe_engine *e, int client);
/* Speak MQTT-SN 1.2 on this client (mqtt-sn-udp, before connecting): the mqtt-udp socket
 * handling, QoS 0 or 1, a client id of 1..23 octets; a publisher REGISTERs its topic after
 * CONNACK and is connected once the REGACK gave the topic id (src/sn_flows.c). */
int mqe_set_mqttsn(mqe_engine *e, int client);
/* TLS for every client set with mqe_set_tls (one configuration per engine: a run's
 * clients share its endpoint's), TLS 1.2 or 1.3 as the broker chooses. ca_pem: the CAs
 * trusted (PEM text; NULL: the system's); cert_pem and key_pem: a client certificate and
 * its key (PEM, both or neither); verify 0: neither the chain nor the name is checked (a
 * lab broker). 0, or -1 (mqe_error names what does not load and OpenSSL's reason). */
int mqe_tls_configure(mqe_engine *e, const char *ca_pem, const char *cert_pem,
                      const char *key_pem, int verify);
/* Speak TLS on this client (before connecting, after mqe_tls_configure): server_name is
 * verified in the broker's certificate and sent as SNI unless it is an IP address; NULL:
 * the client's host. The handshake runs non-blocking in the loop after the TCP connect. */
int mqe_set_tls(mqe_engine *e, int client, const char *server_name);
/* Carry this client's MQTT in WebSocket frames (RFC 6455; before connecting): the upgrade
 * GET to path with the subprotocol mqtt, over TLS if mqe_set_tls was called too. */
int mqe_set_websocket(mqe_engine *e, int client, const char *path);
/* How a client's connection was made, on CLOCK_MONOTONIC (ns; MQE_NO_TIME, INT64_MIN: the
 * phase did not happen on its transport, or has not ended): connect() called, TCP
 * established, TLS handshake done, WebSocket 101 read, CONNECT written, CONNACK read. */
typedef struct {
    int64_t t_connect_ns, t_tcp_ns, t_tls_ns, t_websocket_ns, t_mqtt_sent_ns, t_connack_ns;
    char tls[64];  /* the TLS protocol and cipher ("TLSv1.3 TLS_AES_256_GCM_SHA384"), or "" */
} mqe_connect_phases;
int mqe_connect_phases_of(const mqe_engine *e, int client, mqe_connect_phases *out);
/* The MQTT version and credentials of this client's CONNECT (mqtt-tcp, before connecting):
 * protocol_level 4 (MQTT 3.1.1, the default) or 5 (MQTT 5); username NULL: none; password
 * (password_len bytes) NULL: none, and 3.1.1 sends one only with a user name. The password
 * is copied, wiped (with every buffer that held a CONNECT) when the engine is destroyed,
 * and never written into a message. 0, or -1 (mqe_error says why). */
int mqe_set_session(mqe_engine *e, int client, int protocol_level, const char *username,
                    const uint8_t *password, size_t password_len);
/* A subscriber's warm-up for publishers first..end-1 (a message mix's stream). */
int mqe_add_warmup_range(mqe_engine *e, int client, uint32_t first, uint32_t end,
                         int64_t warmup_messages);
/* Connect every client (TCP_NODELAY, stamps) and send CONNECT; 0, or -1 (mqe_error). */
int mqe_connect_all(mqe_engine *e, int keepalive_s, int timeout_ms);
int mqe_subscribe(mqe_engine *e, int client, const char *topic, int qos);
/* Serve every socket for up to timeout_ns (reads, acks, keep-alive); -1 on a failure. */
int mqe_poll(mqe_engine *e, int64_t timeout_ns);
void mqe_wake(mqe_engine *e);  /* thread-safe: the current poll or step returns */
int mqe_client_stats_of(const mqe_engine *e, int client, mqe_client_stats *out);
const char *mqe_client_failure(const mqe_engine *e, int client);

/* The run: begin it, then step until MQE_DONE / MQE_DEADLINE / MQE_FAILED. */
void mqe_run_begin(mqe_engine *e, int64_t t_start_ns, int64_t t_deadline_ns,
                   int64_t t_publish_end_ns, int64_t drain_window_end_ns,
                   int64_t drain_idle_ns);
/* A step hands back (MQE_SLICE) once slice_end_ns has passed, at the first quiet moment:
 * no PUBLISH written for MQE_QUIET_AFTER_PUBLISH_NS, no socket read for
 * MQE_QUIET_AFTER_READ_NS and no publish due within MQE_QUIET_BEFORE_DUE_NS; at
 * slice_end_ns + MQE_SLICE_GRACE_NS, at the next turn with a publish due (before it is
 * sent), if none came before. The caller's work between steps then
 * does not run while a PUBLISH is on its way through the broker: woken by the send, the
 * broker tends to be placed on the sender's CPU, and waits there for that work (at
 * 100 Hz it put the drain in the p99 of latency, kernel receive stamps included). Rates
 * of ~1 kHz and more leave no quiet moment: their slices end before a publish, which the
 * caller's work delays instead (the send lag shows it). */
#define MQE_QUIET_AFTER_PUBLISH_NS 1000000LL
#define MQE_QUIET_AFTER_READ_NS 200000LL
#define MQE_QUIET_BEFORE_DUE_NS 500000LL
#define MQE_SLICE_GRACE_NS 10000000LL
int mqe_step(mqe_engine *e, int64_t slice_end_ns);
/* The last MQE_SLICE: when the step decided it, and (quiet_out) 1 if at a quiet moment,
 * 0 if forced once the grace was over. */
int64_t mqe_hand_back_of(const mqe_engine *e, int *quiet_out);

/* Event tables: rows, a column's first element, forget the rows. */
uint32_t mqe_rows(const mqe_engine *e, int table);
void *mqe_column(const mqe_engine *e, int table, int column);
void mqe_clear(mqe_engine *e, int table);
/* Interned topic names (deliveries' and subscriptions' topic column index them). */
uint32_t mqe_topics(const mqe_engine *e);
const char *mqe_topic(const mqe_engine *e, uint32_t index);

void mqe_disconnect_all(mqe_engine *e);

/* Hand bytes to a client as if its socket had read them (fuzzing and tests: the parser and
 * every flow behind it, without a broker); to an mqtt-sn-udp client, the bytes are one
 * datagram. 0, or -1 once the client has failed. */
int mqe_feed(mqe_engine *e, int client, const uint8_t *data, size_t len);
/* Drive these pins' lines on a GPIO character device too (uAPI v2 GPIO_V2_GET_LINE_IOCTL:
 * one request of at most 64 output lines, driven low; once per engine). Every edge then
 * goes to the chip with GPIO_V2_LINE_SET_VALUES_IOCTL right where it is recorded. 0, or
 * -errno (mqe_error names the chip and why). Validated against tests/fakes/fake_gpiochip.c
 * (the same ioctls) and against the kernel's PL061 driver on QEMU's arm64 `virt` board
 * (tests/test_lab_vm_gpio.py); not on a Pi's chip. */
int mqe_gpio_open_chip(mqe_engine *e, const char *chip, const int32_t *pins, uint32_t n);
/* Drive one requested line to level outside a run (a toggle-cost calibration): 0, or
 * -errno (-ENOENT: the pin is not in the chip's request). The engine's level follows. */
int mqe_gpio_set(mqe_engine *e, int pin, int level);
/* SET_VALUES calls the chip refused during runs, and the errno of the last one. */
int64_t mqe_gpio_write_failures(const mqe_engine *e, int *last_errno);
/* The level a virtual GPIO line is at (0 for a pin outside 0..65535). */
int mqe_gpio_level(const mqe_engine *e, int pin);

/* A publisher's messages over a tree of topics (workload.topic_tree; mqtt-tcp or mqtt-udp,
 * before connecting): message k goes to topic (first + k) mod fanout^levels of the tree
 * under the client's topic, {topic}/{a}/{b}/... (decimal levels, the last fastest). The
 * tree's names are interned once per engine; 0, or -1 (mqe_error says why). */
#define MQE_TREE_MAX_TOPICS 1000000
int mqe_set_topic_tree(mqe_engine *e, int client, uint32_t levels, uint32_t fanout,
                       uint64_t first);

/* Retained values (workload.retained, src/retained.c; before connecting): this publisher's
 * message k goes with the RETAIN flag to topic first + (k mod count) * stride of
 * {topic}/{i}, i < topics. 0, or -1 (mqe_error says why). */
int mqe_set_retained(mqe_engine *e, int client, uint32_t topics, uint32_t first,
                     uint32_t stride, uint32_t count);
/* Subscribe this client to topic_filter during the run, not before it: at the start plus
 * after_start_ns, and no earlier than after_publishers_ns past the moment every publisher
 * of this engine had sent its messages (acknowledged, at QoS > 0). The subscription's
 * row has the SUBSCRIBE's intended and written times. 0, or -1 (mqe_error says why). */
int mqe_subscribe_later(mqe_engine *e, int client, const char *topic_filter, int qos,
                        int64_t after_start_ns, int64_t after_publishers_ns);

/* Persistent sessions and reconnects (src/reconnect.c; mqtt-tcp, with TLS and WebSocket
 * too; set before connecting, before the subscribes). mqe_set_persistent: the CONNECT keeps
 * the session: clean session 0 (3.1.1), clean start 0 and a Session Expiry Interval of
 * session_expiry_s (MQTT 5). mqe_set_absence: during the run the client goes away at_ns
 * after its start (drop 0: a DISCONNECT first; 1: the socket closed) and connects again
 * for_ns later with the same client id. mqe_set_reconnect: a connection lost during the
 * run does not fail the client: it connects again after backoff_initial_ns, the wait
 * doubling after each failed attempt up to backoff_max_ns (no jitter), and subscribes
 * again unless the broker kept its session (persistent, CONNACK's session present). While
 * away a publisher sends nothing (its due messages are skipped, counted) and its QoS 1/2
 * publishes in flight are given up (counted). 0, or -1 (mqe_error says why). */
int mqe_set_persistent(mqe_engine *e, int client, uint32_t session_expiry_s);
int mqe_set_absence(mqe_engine *e, int client, int64_t at_ns, int64_t for_ns, int drop);
int mqe_set_reconnect(mqe_engine *e, int client, int64_t backoff_initial_ns,
                      int64_t backoff_max_ns);
/* One absence of a client (a scheduled one, or a lost connection) and its way back, on
 * CLOCK_MONOTONIC (MQE_NO_TIME: not reached): the phases of the attempt that made it. */
typedef struct {
    int64_t t_lost_ns;          /* it left, or its loss was seen */
    int64_t t_connect_ns, t_tcp_ns, t_tls_ns, t_websocket_ns, t_mqtt_sent_ns, t_connack_ns;
    int64_t t_subscribed_ns;    /* the SUBACK of its subscribe again (none: session kept) */
    int64_t skipped;            /* own publishes due while away, not sent */
    int32_t attempts;           /* connects tried */
    int32_t session_present;    /* the CONNACK's flag; -1: no CONNACK came */
    int32_t scheduled;          /* 1: mqe_set_absence's; 0: a lost connection */
    int32_t abandoned;          /* own QoS 1/2 publishes in flight when it went */
    char reason[128];           /* how the connection went */
} mqe_reconnect_record;
int mqe_reconnects(const mqe_engine *e, int client);
int mqe_reconnect_of(const mqe_engine *e, int client, int n, mqe_reconnect_record *out);
/* The session present flag of a persistent or reconnecting client's first CONNACK (-1:
 * none yet, or neither). */
int mqe_session_present_of(const mqe_engine *e, int client);

/* A connection storm (workload.mode connect; src/storm.c): every client added, begun with
 * mqe_storm_begin, connects at t_start_ns + its start_offset_ns, non-blocking, many in
 * flight at once; mqe_storm_step serves them until until_ns (or a wake) and returns how
 * many are not yet connected or failed (-1: no storm begun). A connect not done within
 * timeout_ns of its connect() fails as a timeout; the storm goes on. keep_session: the
 * CONNECTs' clean session (clean start) 0, MQTT 5 with no session expiry. Held
 * connections keep alive; mqe_disconnect_all ends them. */
enum { MQE_STORM_PENDING, MQE_STORM_OPENING, MQE_STORM_CONNECTED, MQE_STORM_CONNACK,
       MQE_STORM_REFUSED, MQE_STORM_RESET, MQE_STORM_CLOSED, MQE_STORM_TIMEOUT, MQE_STORM_TLS,
       MQE_STORM_WEBSOCKET, MQE_STORM_OTHER, MQE_STORM_LOST };
/* One storm client's connect (CLOCK_MONOTONIC ns; MQE_NO_TIME: not reached): its intended
 * time, the phases as mqe_connect_phases, when it failed or (connected) was lost while
 * held; outcome MQE_STORM_*, code: the CONNACK's return / reason code, or the errno. */
typedef struct {
    int64_t t_intended_ns, t_connect_ns, t_tcp_ns, t_tls_ns, t_websocket_ns, t_mqtt_sent_ns,
        t_connack_ns, t_ended_ns;
    int32_t outcome, code;
    char detail[256];
} mqe_storm_outcome;
int mqe_storm_begin(mqe_engine *e, int64_t t_start_ns, int keepalive_s, int64_t timeout_ns,
                    int keep_session);
int64_t mqe_storm_step(mqe_engine *e, int64_t until_ns);
int mqe_storm_outcome_of(const mqe_engine *e, int client, mqe_storm_outcome *out);

#pragma GCC visibility pop

#endif
