/* What the fuzz target (fuzz/fuzz_replies.c) and the selftest (tests/selftest.c) share: the
 * engine that broker replies are fed to (a QoS 2 publisher and a QoS 2 subscriber on MQTT,
 * the same two on MQTT over WebSocket and on MQTT 5, a QoS 1 publisher and a QoS 1 wildcard
 * subscriber on MQTT-SN), and how one input is cut. The MQTT 5 pair reads the very bytes
 * the 3.1.1 pair reads.
 * An input's first byte picks pulse mode (bit 0) and the size of each read (the other
 * bits, plus 1); the rest goes half to the publishers, half to the subscribers. The MQTT
 * clients read it as a stream, in reads of that size, and so do the WebSocket
 * clients, as the frames a broker sends (upgraded already: the bytes after the 101); the MQTT-SN clients as datagrams,
 * each as long as its length field says, or a read's size where the field says nothing
 * that fits (so a seed can hold valid gateway messages, and garbage gets through too).
 * The selftest replays fuzz/seeds and fuzz/regressions exactly as libFuzzer found them. */
#ifndef MQE_FUZZ_REPLIES_H
#define MQE_FUZZ_REPLIES_H

#include <stddef.h>
#include <stdint.h>

#include "../src/engine.h"

typedef struct {
    int publisher, subscriber;        /* MQTT 3.1.1 */
    int sn_publisher, sn_subscriber;  /* MQTT-SN 1.2 */
    int ws_publisher, ws_subscriber;  /* MQTT 3.1.1 in WebSocket frames */
    int v5_publisher, v5_subscriber;  /* MQTT 5, with a user name and password */
} mqe_reply_clients;

/* The four clients on one engine; NULL if the engine cannot be created. */
static inline mqe_engine *mqe_replies_engine(int pulse_mode, mqe_reply_clients *clients) {
    mqe_engine *e = mqe_create(1024, 0, pulse_mode);
    if (e == NULL)
        return NULL;
    clients->publisher = mqe_add_client(e, "pub-0", "127.0.0.1", 1, 0, "f/x", 2, 2, 0, 64,
                                        1000.0, 10, 1, 0, 0);
    clients->subscriber = mqe_add_client(e, "sub-0", "127.0.0.1", 1, 1, "f/x", 2, 3, 0, 0, 0.0,
                                         10, 1, 0, 0);
    mqe_subscribe(e, clients->subscriber, "f/+", 2);
    clients->sn_publisher = mqe_add_client(e, "sn-pub-0", "127.0.0.1", 1, 0, "f/x", 1, 4, 0,
                                           64, 1000.0, 10, 1, 0, 0);
    mqe_set_mqttsn(e, clients->sn_publisher);
    clients->sn_subscriber = mqe_add_client(e, "sn-sub-0", "127.0.0.1", 1, 1, "f/x", 1, 5, 0, 0,
                                            0.0, 10, 1, 0, 0);
    mqe_set_mqttsn(e, clients->sn_subscriber);
    mqe_subscribe(e, clients->sn_subscriber, "f/+", 1);
    clients->ws_publisher = mqe_add_client(e, "ws-pub-0", "127.0.0.1", 1, 0, "f/x", 2, 6, 0,
                                           64, 1000.0, 10, 1, 0, 0);
    mqe_set_websocket(e, clients->ws_publisher, "/mqtt");
    clients->ws_subscriber = mqe_add_client(e, "ws-sub-0", "127.0.0.1", 1, 1, "f/x", 2, 7, 0,
                                            0, 0.0, 10, 1, 0, 0);
    mqe_set_websocket(e, clients->ws_subscriber, "/mqtt");
    mqe_subscribe(e, clients->ws_subscriber, "f/+", 2);
    /* MQTT 5: the same bytes, read as an MQTT 5 client reads them (properties, reason
     * codes, the broker's DISCONNECT); fuzz/seeds/mqtt5-* are replies in MQTT 5's form */
    static const uint8_t password[] = {'f', 'u', 'z', 'z'};
    clients->v5_publisher = mqe_add_client(e, "v5-pub-0", "127.0.0.1", 1, 0, "f/x", 2, 8, 0,
                                           64, 1000.0, 10, 1, 0, 0);
    mqe_set_session(e, clients->v5_publisher, 5, "user", password, sizeof password);
    clients->v5_subscriber = mqe_add_client(e, "v5-sub-0", "127.0.0.1", 1, 1, "f/x", 2, 9, 0,
                                            0, 0.0, 10, 1, 0, 0);
    mqe_set_session(e, clients->v5_subscriber, 5, "user", password, sizeof password);
    mqe_subscribe(e, clients->v5_subscriber, "f/+", 2);
    return e;
}

/* ``size`` bytes to one client in reads of ``read_bytes``, until it fails. */
static inline void mqe_feed_in_reads(mqe_engine *e, int client, const uint8_t *data,
                                     size_t size, size_t read_bytes) {
    for (size_t at = 0; at < size; at += read_bytes) {
        size_t n = size - at < read_bytes ? size - at : read_bytes;
        if (mqe_feed(e, client, data + at, n) != 0)
            return;
    }
}

/* ``size`` bytes to an MQTT-SN client as datagrams (cut as above), until it fails. */
static inline void mqe_feed_datagrams(mqe_engine *e, int client, const uint8_t *data,
                                      size_t size, size_t read_bytes) {
    for (size_t at = 0; at < size;) {
        size_t left = size - at, n = data[at];
        if (n == 1)  /* the 3-octet length form */
            n = left >= 3 ? ((size_t)data[at + 1] << 8) | data[at + 2] : 0;
        if (n < 2 || n > left)
            n = read_bytes < left ? read_bytes : left;
        if (mqe_feed(e, client, data + at, n) != 0)
            return;
        at += n;
    }
}

/* One input (``size`` >= 1) cut as above, to an engine of mqe_replies_engine(data[0] & 1). */
static inline void mqe_feed_input(mqe_engine *e, const mqe_reply_clients *clients,
                                  const uint8_t *data, size_t size) {
    size_t read_bytes = (size_t)(data[0] >> 1) + 1, half = (size - 1) / 2;
    mqe_feed_in_reads(e, clients->publisher, data + 1, half, read_bytes);
    mqe_feed_in_reads(e, clients->subscriber, data + 1 + half, size - 1 - half, read_bytes);
    mqe_feed_datagrams(e, clients->sn_publisher, data + 1, half, read_bytes);
    mqe_feed_datagrams(e, clients->sn_subscriber, data + 1 + half, size - 1 - half, read_bytes);
    mqe_feed_in_reads(e, clients->ws_publisher, data + 1, half, read_bytes);
    mqe_feed_in_reads(e, clients->ws_subscriber, data + 1 + half, size - 1 - half, read_bytes);
    mqe_feed_in_reads(e, clients->v5_publisher, data + 1, half, read_bytes);
    mqe_feed_in_reads(e, clients->v5_subscriber, data + 1 + half, size - 1 - half, read_bytes);
}

#endif
