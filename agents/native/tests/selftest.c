/* The engine checked as a program of its own, with no Python: built for this machine and
 * cross-built for arm (`make cross`), it is run natively and under qemu user-mode
 * emulation, and tests/test_native_cross.py asserts that every architecture prints the same
 * text. Whatever a byte-order, type-width or alignment difference changed would show as a
 * line that differs.
 *
 *   selftest wire               the packets the engine encodes (hex) and payloads decoded
 *   selftest replies [FILE...]  broker replies fed to a QoS 2 publisher and subscriber,
 *                               and as datagrams to an MQTT-SN QoS 1 publisher and
 *                               subscriber (fuzz/replies.h): generated ones (a fixed
 *                               pseudo-random sequence, MQTT-SN messages among them), then each
 *                               FILE as fuzz/fuzz_replies.c cuts it; failures, counters,
 *                               recorded events (their time columns left out) and the
 *                               bytes each client queued in answer (acks, SUBSCRIBE)
 *   selftest broker HOST PORT   a real run through the engine's loop against a broker:
 *                               three publishers (QoS 0, 1, 2) and their subscribers
 *   selftest gpio CHIP          lines 2, 3 and 40 of a GPIO character device requested
 *                               (uAPI v2) and driven as a run's edges would drive them,
 *                               toggles then pulses; the edges (time columns left out)
 *                               and the writes the chip refused. Run on
 *                               tests/fakes/fake_gpiochip.c (LD_PRELOAD), whose log holds
 *                               what the chip saw
 *
 * It links the engine's sources, not the library, so that it can read what a client
 * queued (client.h): without a socket, the engine keeps its answers in the client's
 * output buffer. Exit status: 0, or 1 when a run against the broker fails. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../fuzz/replies.h"
#include "../src/client.h"
#include "../src/engine.h"
#include "../src/sn.h"
#include "../src/wire.h"

static void print_hex(const char *label, const uint8_t *data, size_t len) {
    printf("%s %zu:", label, len);
    for (size_t i = 0; i < len; i++)
        printf("%02x", data[i]);
    printf("\n");
}

/* -- wire ------------------------------------------------------------------------------ */

static int wire(void) {
    static uint8_t buf[1 << 16];
    static const char id[] = "a-client-id-with-some-length-to-it-0123456789";
    for (size_t len = 0; len < sizeof id; len += 11) {
        size_t n = mqe_encode_connect(buf, id, len, (uint16_t)(len * 997));
        if (n != mqe_connect_size(len))
            printf("CONNECT size %zu != %zu\n", n, mqe_connect_size(len));
        print_hex("connect", buf, n);
    }
    for (int qos = 0; qos <= 2; qos++) {
        size_t n = mqe_encode_subscribe(buf, (uint16_t)(0xFFFF - qos * 4097), "s/+/#", 5, qos);
        print_hex("subscribe", buf, n);
    }
    /* the remaining-length field at each of its width boundaries, up to the standard's
     * largest packet (268,435,455 bytes: the prefix only, never the payload) */
    static const size_t payloads[] = {0, 32, 120, 121, 122, 123, 16376, 16377, 16378, 16379,
                                      2097144, 2097145, 2097146, 2097147, 268435450};
    for (size_t i = 0; i < sizeof payloads / sizeof payloads[0]; i++)
        for (int qos = 0; qos <= 2; qos += 2) {  /* qos 2: two more bytes (packet id) */
            size_t n = mqe_publish_prefix(buf, "t/q", 3, qos, payloads[i]);
            printf("varint %zu bytes, ", mqe_varint_size(2 + 3 + (qos ? 2u : 0u) + payloads[i]));
            print_hex("publish-prefix", buf, n);
        }
    for (int type = MQE_PUBACK; type <= MQE_PUBCOMP; type++) {
        size_t n = mqe_encode_ack(buf, type, (uint16_t)(0x8001 + type));
        print_hex(mqe_type_name(type), buf, n);
    }
    /* MQTT-SN: each message a client sends, both length forms */
    for (size_t len = 1; len <= MQE_SN_MAX_CLIENT_ID; len += 11)
        print_hex("sn-connect", buf, mqe_sn_encode_connect(buf, id, len, (uint16_t)(len * 997)));
    static const size_t topic_lens[] = {1, 249, 250, 251, 252, 400};
    static char long_topic[400];
    memset(long_topic, 't', sizeof long_topic);
    for (size_t i = 0; i < sizeof topic_lens / sizeof topic_lens[0]; i++) {
        size_t n = mqe_sn_encode_register(buf, 0, (uint16_t)(0xFFFF - i), long_topic,
                                          topic_lens[i]);
        if (n != mqe_sn_register_size(topic_lens[i]))
            printf("REGISTER size %zu != %zu\n", n, mqe_sn_register_size(topic_lens[i]));
        printf("sn-register %zu: length %zu\n", topic_lens[i], mqe_sn_length(buf, n));
        n = mqe_sn_encode_subscribe(buf, (uint16_t)(0x8000 + i), long_topic, topic_lens[i],
                                    (int)(i % 2));
        if (n != mqe_sn_subscribe_size(topic_lens[i]))
            printf("SUBSCRIBE size %zu != %zu\n", n, mqe_sn_subscribe_size(topic_lens[i]));
        print_hex("sn-subscribe-head", buf, n < 8 ? n : 8);
    }
    static const size_t sn_payloads[] = {32, 248, 249, 250, MQE_SN_MAX_DATA};
    for (size_t i = 0; i < sizeof sn_payloads / sizeof sn_payloads[0]; i++)
        for (int qos = 0; qos <= 1; qos++)
            print_hex("sn-publish-prefix", buf,
                      mqe_sn_publish_prefix(buf, (uint16_t)(0x1234 + i), qos, sn_payloads[i]));
    print_hex("sn-regack", buf, mqe_sn_encode_ack(buf, MQE_SN_REGACK, 0xFEDC, 0x0102, 0));
    print_hex("sn-puback", buf, mqe_sn_encode_ack(buf, MQE_SN_PUBACK, 0x0102, 0xFEDC, 0));
    print_hex("sn-pingreq", buf, mqe_sn_encode_empty(buf, MQE_SN_PINGREQ));
    print_hex("sn-disconnect", buf, mqe_sn_encode_empty(buf, MQE_SN_DISCONNECT));
    /* payloads with values that need all 64 bits, and negative times */
    static const int64_t times[] = {0, -1, INT64_MIN, INT64_MAX, 1700000000123456789LL,
                                    -4294967296LL};
    for (size_t i = 0; i < sizeof times / sizeof times[0]; i++) {
        uint64_t seq = UINT64_C(0x0123456789ABCDEF) ^ ((uint64_t)i << 59);
        uint32_t publisher = UINT32_C(0xFEDCBA98) - (uint32_t)i;
        mqe_encode_payload(buf + 1, 40, seq, publisher, times[i], times[(i + 1) % 6]);
        print_hex("payload", buf + 1, 40);  /* odd address: an unaligned write and read */
        uint64_t seq_back;
        uint32_t publisher_back;
        int64_t t_pub, t_intended;
        int ok = mqe_decode_payload(buf + 1, 40, &seq_back, &publisher_back, &t_pub,
                                    &t_intended);
        printf("decoded %d seq %" PRIu64 " publisher %" PRIu32 " t_pub %" PRId64
               " t_intended %" PRId64 "\n", ok, seq_back, publisher_back, t_pub, t_intended);
    }
    /* a PUBLISH built from the encoders, parsed back as a broker's */
    size_t n = mqe_publish_prefix(buf, "t/q", 3, 1, 40);
    buf[n++] = 0x12;
    buf[n++] = 0x34;
    mqe_encode_payload(buf + n, 40, 7, 3, 11, 10);
    n += 40;
    mqe_packet packet;
    char error[MQE_ERROR_CHARS] = "";
    long used = mqe_parse(buf, n, &packet, error);
    printf("parsed %ld of %zu: %s qos %d id %u topic %.*s payload %zu%s\n", used, n,
           mqe_type_name(packet.type), packet.qos, (unsigned)packet.packet_id,
           (int)packet.topic_len, (const char *)packet.topic, packet.payload_len, error);
    return 0;
}

/* -- replies ----------------------------------------------------------------------------- */

static uint64_t prng_state = UINT64_C(0x9E3779B97F4A7C15);

static uint64_t prng(void) {  /* xorshift64*: the same sequence on every architecture */
    prng_state ^= prng_state >> 12;
    prng_state ^= prng_state << 25;
    prng_state ^= prng_state >> 27;
    return prng_state * UINT64_C(2685821657736338717);
}

static size_t below(size_t n) {
    return (size_t)(prng() % n);
}

/* One packet a broker might send (or not quite): appended at `to`, its length returned. */
static size_t generated_packet(uint8_t *to) {
    static const uint8_t types[] = {0x20, 0x30, 0x32, 0x34, 0x36, 0x3A, 0x40, 0x50, 0x62,
                                    0x70, 0x90, 0xD0, 0x10, 0xB0, 0x60};
    size_t n = 0;
    switch (below(5)) {
    case 0: {  /* any bytes */
        size_t len = below(65);
        for (; n < len; n++)
            to[n] = (uint8_t)prng();
        return n;
    }
    case 1: {  /* a packet type and a body of any bytes */
        size_t len = below(41);
        to[n++] = types[below(sizeof types)];
        to[n++] = (uint8_t)len;
        for (size_t i = 0; i < len; i++)
            to[n++] = (uint8_t)prng();
        return n;
    }
    case 2: {  /* an mqttbed PUBLISH with values that need every bit of their fields */
        int qos = (int)below(3);
        size_t payload = MQE_PAYLOAD_MIN + below(48);
        const char *topic = below(2) ? "f/x" : "f/y";
        n = mqe_publish_prefix(to, topic, 3, qos, payload);
        to[0] |= below(4) == 0 ? 0x08 : 0;  /* DUP, now and then */
        if (qos) {
            to[n++] = 0;
            to[n++] = (uint8_t)(1 + below(4));
        }
        /* one draw per statement: the order a call's arguments are evaluated in is
         * unspecified (gcc takes them in another order on arm than on x86_64) */
        uint64_t seq = below(3) ? below(12) : prng();
        uint32_t publisher = below(2) ? 0 : (uint32_t)prng();
        int64_t t_pub = (int64_t)prng();
        int64_t t_intended = (int64_t)prng();
        mqe_encode_payload(to + n, payload, seq, publisher, t_pub, t_intended);
        return n + payload;
    }
    case 4: {  /* an MQTT-SN gateway message, right or wrong for the moment */
        uint16_t topic_id = (uint16_t)below(4), msg_id = (uint16_t)below(5);
        uint8_t code = below(4) ? 0 : (uint8_t)below(5);
        switch (below(6)) {
        case 0:
            to[0] = 3;
            to[1] = MQE_SN_CONNACK;
            to[2] = code;
            return 3;
        case 1:
        case 2: {
            int type = below(2) ? MQE_SN_REGACK : MQE_SN_PUBACK;
            n = mqe_sn_encode_ack(to, type, topic_id, msg_id, code);
            to[6] = code;  /* a reserved code now and then: the parser refuses it */
            return n;
        }
        case 3:
            n = mqe_sn_encode_ack(to, MQE_SN_SUBACK, 0, topic_id, msg_id);
            memmove(to + 3, to + 2, 5);  /* SUBACK: flags, topic id, msg id, return code */
            to[0] = 8;
            to[2] = below(3) ? 0x20 : 0x00;
            to[7] = code;
            return 8;
        case 4:
            return mqe_sn_encode_register(to, topic_id, msg_id, below(2) ? "f/x" : "f/y", 3);
        default: {
            int qos = (int)below(3);
            size_t payload = MQE_PAYLOAD_MIN + below(300);
            n = mqe_sn_publish_prefix(to, topic_id, qos, payload);
            to[n++] = 0;
            to[n++] = (uint8_t)msg_id;
            uint64_t seq = below(12);
            int64_t t_pub = (int64_t)prng();
            mqe_encode_payload(to + n, payload, seq, 0, t_pub, t_pub - 1);
            return n + payload;
        }
        }
    }
    default: {  /* a well-formed control packet, right or wrong for the moment */
        static const uint8_t control[][5] = {
            {0x20, 2, 0, 0}, {0x20, 2, 0, 5}, {0x40, 2, 0, 1}, {0x50, 2, 0, 2},
            {0x70, 2, 0, 2}, {0x62, 2, 0, 3}, {0x90, 3, 0, 1, 2}, {0x90, 3, 0, 1, 0x80},
            {0xD0, 0}};
        const uint8_t *p = control[below(sizeof control / sizeof control[0])];
        n = (size_t)p[1] + 2;
        memcpy(to, p, n);
        return n;
    }
    }
}

/* A table's rows, but for columns that hold clock readings (they differ run to run). */
static void print_table(const mqe_engine *e, const char *name, int table,
                        const int *clock_columns) {
    const mqe_table *t = &e->tables[table];
    for (uint32_t row = 0; row < t->rows; row++) {
        printf("  %s", name);
        for (uint32_t col = 0; col < t->columns; col++) {
            int is_clock = 0;
            for (const int *c = clock_columns; *c >= 0; c++)
                is_clock |= *c == (int)col;
            if (is_clock)
                printf(" -");
            else if (t->width[col] == 8)
                printf(" %" PRId64, MQE_I64(t, col)[row]);
            else if (t->width[col] == 4)
                printf(" %" PRId32, MQE_I32(t, col)[row]);
            else
                printf(" %u", (unsigned)MQE_U8(t, col)[row]);
        }
        printf("\n");
    }
}

static void print_engine(const mqe_engine *e) {
    static const int pub_clock[] = {PUB_T_INTENDED, PUB_T_PUB, -1};
    static const int dlv_clock[] = {DLV_T_RECV, DLV_T_RECV_USER, -1};
    static const int sub_clock[] = {SUB_T_SUBACK, -1};
    static const int edge_clock[] = {EDGE_T, EDGE_LAG, -1};
    for (size_t i = 0; i < e->n_clients; i++) {
        const mqe_client *c = &e->clients[i];
        mqe_client_stats s;
        mqe_client_stats_of(e, (int)i, &s);
        printf("  client %zu sent %" PRId64 " acked %" PRId64 " unique %" PRId64
               " deliveries %" PRId64 " connected %d subscribed %d dropped %" PRId64
               " failed %d: %s\n", i, s.sent, s.acked, s.received_unique, s.deliveries,
               s.connected, s.subscribed, s.dropped, s.failed, mqe_client_failure(e, (int)i));
        print_hex("  queued", c->out, c->out_len);
    }
    print_table(e, "publish", MQE_T_PUBLISH, pub_clock);
    print_table(e, "delivery", MQE_T_DELIVERY, dlv_clock);
    print_table(e, "subscribe", MQE_T_SUBSCRIBE, sub_clock);
    print_table(e, "edge", MQE_T_EDGE, edge_clock);
    for (uint32_t i = 0; i < mqe_topics(e); i++)
        printf("  topic %" PRIu32 " %s\n", i, mqe_topic(e, i));
}

/* The engine of fuzz/fuzz_replies.c: a QoS 2 publisher and a QoS 2 wildcard subscriber,
 * an MQTT-SN QoS 1 publisher and an MQTT-SN QoS 1 wildcard subscriber. */
static mqe_engine *fuzz_engine(int pulse_mode, mqe_reply_clients *clients) {
    mqe_engine *e = mqe_replies_engine(pulse_mode, clients);
    if (e == NULL) {
        fprintf(stderr, "selftest: mqe_create failed\n");
        exit(2);
    }
    return e;
}

static uint8_t *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        exit(2);
    }
    size_t cap = 4096, n = 0;
    uint8_t *data = malloc(cap);
    size_t got;
    while (data != NULL && (got = fread(data + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap)
            data = realloc(data, cap *= 2);
    }
    fclose(f);
    if (data == NULL) {
        fprintf(stderr, "selftest: out of memory reading %s\n", path);
        exit(2);
    }
    *size = n;
    return data;
}

#define GENERATED_CASES 300

static int replies(int files, char **paths) {
    static uint8_t streams[2][16 * 128];
    for (int i = 0; i < GENERATED_CASES; i++) {
        mqe_reply_clients clients;
        mqe_engine *e = fuzz_engine((int)below(2), &clients);
        size_t read_bytes = 1 + below(64), len[2] = {0, 0};
        for (int s = 0; s < 2; s++)
            for (size_t k = below(13); k > 0; k--)
                len[s] += generated_packet(streams[s] + len[s]);
        printf("case %d: reads of %zu\n", i, read_bytes);
        print_hex("  to publisher", streams[0], len[0]);
        print_hex("  to subscriber", streams[1], len[1]);
        mqe_feed_in_reads(e, clients.publisher, streams[0], len[0], read_bytes);
        mqe_feed_in_reads(e, clients.subscriber, streams[1], len[1], read_bytes);
        mqe_feed_datagrams(e, clients.sn_publisher, streams[0], len[0], read_bytes);
        mqe_feed_datagrams(e, clients.sn_subscriber, streams[1], len[1], read_bytes);
        print_engine(e);
        mqe_destroy(e);
    }
    for (int f = 0; f < files; f++) {
        size_t size;
        uint8_t *data = read_file(paths[f], &size);
        const char *name = strrchr(paths[f], '/');
        printf("file %s: %zu bytes\n", name ? name + 1 : paths[f], size);
        if (size >= 1) {
            mqe_reply_clients clients;
            mqe_engine *e = fuzz_engine(data[0] & 1, &clients);
            mqe_feed_input(e, &clients, data, size);
            print_engine(e);
            mqe_destroy(e);
        }
        free(data);
    }
    return 0;
}

/* -- a run against a broker -------------------------------------------------------------- */

#define RUN_MESSAGES 40
#define RUN_WARMUP 4

static int fail_run(mqe_engine *e, const char *stage) {
    printf("run failed at %s: %s\n", stage, mqe_error(e));
    for (size_t i = 0; i < e->n_clients; i++)
        if (mqe_client_failure(e, (int)i)[0])
            printf("  client %zu: %s\n", i, mqe_client_failure(e, (int)i));
    mqe_disconnect_all(e);
    mqe_destroy(e);
    return 1;
}

/* Serve the sockets until `done` says every client is there, for up to 10 s. */
static int wait_for(mqe_engine *e, int (*done)(const mqe_client_stats *)) {
    int64_t deadline = mqe_now_ns() + 10000000000LL;
    while (mqe_now_ns() < deadline) {
        int all = 1;
        for (size_t i = 0; i < e->n_clients; i++) {
            mqe_client_stats s;
            mqe_client_stats_of(e, (int)i, &s);
            all &= done(&s);
        }
        if (all)
            return 0;
        if (mqe_poll(e, 50000000) != 0)
            return -1;
    }
    return -1;
}

static int is_connected(const mqe_client_stats *s) {
    return s->connected;
}

static int broker(const char *host, int port) {
    mqe_engine *e = mqe_create(4096, 1, 0);
    if (e == NULL)
        return 1;
    char id[32], topic[16];
    for (int qos = 0; qos <= 2; qos++) {
        snprintf(id, sizeof id, "cross-pub-%d", qos);
        snprintf(topic, sizeof topic, "cross/q%d", qos);
        if (mqe_add_client(e, id, host, port, 0, topic, qos, 2 + qos, (uint32_t)qos, 100,
                           1000.0, RUN_MESSAGES, RUN_WARMUP, 0, 0) < 0)
            return fail_run(e, "add_client");
        snprintf(id, sizeof id, "cross-sub-%d", qos);
        if (mqe_add_client(e, id, host, port, 1, topic, qos, 5 + qos, 0, 0, 0.0,
                           RUN_MESSAGES, RUN_WARMUP, 0, 0) < 0)
            return fail_run(e, "add_client");
    }
    if (mqe_connect_all(e, 10, 5000) != 0 || wait_for(e, is_connected) != 0)
        return fail_run(e, "CONNACK");
    for (int qos = 0; qos <= 2; qos++) {
        snprintf(topic, sizeof topic, "cross/q%d", qos);
        if (mqe_subscribe(e, 2 * qos + 1, topic, qos) != 0)
            return fail_run(e, "SUBSCRIBE");
        mqe_client_stats s = {0};
        int64_t deadline = mqe_now_ns() + 10000000000LL;
        while (!s.subscribed && mqe_now_ns() < deadline) {
            if (mqe_poll(e, 50000000) != 0)
                return fail_run(e, "SUBACK");
            mqe_client_stats_of(e, 2 * qos + 1, &s);
        }
        if (!s.subscribed)
            return fail_run(e, "SUBACK (none within 10 s)");
    }
    printf("kernel stamps on every socket: %d\n", mqe_kernel_stamps(e));
    /* deliveries kept across drains: per subscriber, how often each seq came */
    static int seen[3][RUN_MESSAGES];
    int64_t warmups[3] = {0, 0, 0}, others = 0;
    int64_t start = mqe_now_ns() + 20000000;
    mqe_run_begin(e, start, start + 15000000000LL, start + 15000000000LL, 0, 0);
    int status;
    do {
        status = mqe_step(e, mqe_now_ns() + 100000000);
        const mqe_table *dlv = &e->tables[MQE_T_DELIVERY];
        for (uint32_t row = 0; row < dlv->rows; row++) {
            int32_t client = MQE_I32(dlv, DLV_CLIENT)[row];
            int64_t seq = MQE_I64(dlv, DLV_SEQ)[row];
            int qos = (client - 1) / 2;
            if (client % 2 == 1 && qos == MQE_I32(dlv, DLV_PUBLISHER)[row]
                && MQE_U8(dlv, DLV_QOS)[row] == qos && seq >= 0 && seq < RUN_MESSAGES) {
                seen[qos][seq]++;
                warmups[qos] += MQE_U8(dlv, DLV_WARMUP)[row];
            } else {
                others++;
            }
        }
        for (int t = 0; t < MQE_TABLES; t++)
            mqe_clear(e, t);
    } while (status == MQE_SLICE || status == MQE_DRAIN || status == MQE_WOKEN);
    printf("run ended: %s\n", status == MQE_DONE ? "done" : status == MQE_DEADLINE
           ? "deadline" : "failed");
    for (size_t i = 0; i < e->n_clients; i++) {
        mqe_client_stats s;
        mqe_client_stats_of(e, (int)i, &s);
        printf("client %zu sent %" PRId64 " acked %" PRId64 " unique %" PRId64
               " deliveries %" PRId64 " failed %d%s%s\n", i, s.sent, s.acked,
               s.received_unique, s.deliveries, s.failed, s.failed ? ": " : "",
               mqe_client_failure(e, (int)i));
    }
    for (int qos = 0; qos <= 2; qos++) {
        int once = 0;
        for (int seq = 0; seq < RUN_MESSAGES; seq++)
            once += seen[qos][seq] == 1;
        printf("subscriber qos %d: %d of %d seqs delivered once, %" PRId64 " warm-up\n", qos,
               once, RUN_MESSAGES, warmups[qos]);
    }
    printf("deliveries from elsewhere: %" PRId64 "\n", others);
    mqe_disconnect_all(e);
    mqe_destroy(e);
    return status == MQE_DONE ? 0 : 1;
}

/* A run's edges on a GPIO chip's lines, as io.c marks them (module comment). */
static int gpio(const char *chip) {
    static const int32_t pins[] = {2, 3, 40};
    static const int marks[] = {2, 3, 2, 40, 3, 3};
    static const int edge_clock[] = {EDGE_T, EDGE_LAG, EDGE_WRITE, -1};
    int status = 0;
    for (int pulse_mode = 0; pulse_mode <= 1 && status == 0; pulse_mode++) {
        mqe_engine *e = mqe_create(64, 0, pulse_mode);
        if (e == NULL)
            return 2;
        for (int i = 0; i < 3; i++)  /* a client per line (never connected): pulse room */
            mqe_add_client(e, "gpio", "127.0.0.1", 1883, 0, "t", 0, pins[i], (uint32_t)i, 16,
                           1.0, 1, 0, 0, 0);
        int opened = mqe_gpio_open_chip(e, chip, pins, 3);
        printf("%s: open %d %s\n", pulse_mode ? "pulses" : "toggles", opened, mqe_error(e));
        if (opened == 0) {
            for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++) {
                mqe_gpio_mark(e, marks[i], mqe_now_ns());
                if (i % 2)
                    mqe_gpio_settle(e);  /* a turn handled: pulses end */
            }
            print_table(e, "edge", MQE_T_EDGE, edge_clock);
            int last = 0;
            int64_t failures = mqe_gpio_write_failures(e, &last);
            printf("  refused writes %" PRId64 " (errno %d)\n", failures, last);
            printf("  set outside a run: pin 3 %d, pin 4 %d\n", mqe_gpio_set(e, 3, 0),
                   mqe_gpio_set(e, 4, 1));
        }
        status = opened != 0;
        mqe_destroy(e);
    }
    return status;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
    if (argc >= 2 && strcmp(argv[1], "wire") == 0)
        return wire();
    if (argc >= 2 && strcmp(argv[1], "replies") == 0)
        return replies(argc - 2, argv + 2);
    if (argc == 4 && strcmp(argv[1], "broker") == 0)
        return broker(argv[2], atoi(argv[3]));
    if (argc == 3 && strcmp(argv[1], "gpio") == 0)
        return gpio(argv[2]);
    fprintf(stderr, "usage: selftest wire | replies [FILE...] | broker HOST PORT | gpio CHIP\n");
    return 2;
}
