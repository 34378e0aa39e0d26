/* The engine checked as a program of its own, with no Python: built for this machine and
 * cross-built for arm (`make cross`), it is run natively and under qemu user-mode
 * emulation, and tests/test_native_cross.py asserts that every architecture prints the same
 * text. Whatever a byte-order, type-width or alignment difference changed would show as a
 * line that differs.
 *
 *   selftest wire               the packets the engine encodes (hex) and payloads decoded;
 *                               WebSocket frames decoded (fixed inputs), the upgrade's
 *                               request and the answers it takes or refuses; MQTT 5's
 *                               packets (CONNECT with a user name and password, SUBSCRIBE,
 *                               PUBLISH prefixes) and MQTT 5 broker replies decoded
 *                               (properties, reason codes and their names)
 *   selftest replies [FILE...]  broker replies fed to a QoS 2 publisher and subscriber, in
 *                               WebSocket frames to the same pair, as MQTT 5 to the same
 *                               pair, and as datagrams to an
 *                               MQTT-SN QoS 1 publisher and subscriber (fuzz/replies.h):
 *                               generated ones (a fixed pseudo-random sequence, MQTT-SN
 *                               messages and frames among them), then each FILE as
 *                               fuzz/fuzz_replies.c cuts it; failures, counters, recorded
 *                               events (their time columns left out), the bytes each client
 *                               queued in answer (acks, SUBSCRIBE) and the WebSocket
 *                               control frames it answered with. Last, a TLS exchange with
 *                               an in-process OpenSSL server (TLS 1.2, then 1.3): every
 *                               byte of the server's handshake and records fed alone, and
 *                               the MQTT packets decoded the same as without TLS
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
 * output buffer (and a TLS or WebSocket client what it would send in `wire`). Exit status:
 * 0, or 1 when a run against the broker fails or TLS decoded other packets than plain. */
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
#include "../src/ws.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

static void print_hex(const char *label, const uint8_t *data, size_t len) {
    printf("%s %zu:", label, len);
    for (size_t i = 0; i < len; i++)
        printf("%02x", data[i]);
    printf("\n");
}

/* -- wire ------------------------------------------------------------------------------ */

/* WebSocket: frame headers a server may send, decoded; the client's frames; the upgrade. */
static void websocket(void) {
    static const struct {
        const char *name;
        uint8_t bytes[16];
        size_t len;
    } frames[] = {
        {"binary 5", {0x82, 5, 1, 2, 3, 4, 5}, 7},
        {"binary 126", {0x82, 126, 0, 126}, 4},
        {"binary 65536", {0x82, 127, 0, 0, 0, 0, 0, 1, 0, 0}, 10},
        {"fragment", {0x02, 2, 0x20, 2}, 4},
        {"continuation", {0x80, 2, 0, 0}, 4},
        {"ping", {0x89, 2, 'h', 'i'}, 4},
        {"pong", {0x8A, 0}, 2},
        {"close 1000", {0x88, 2, 0x03, 0xE8}, 4},
        {"text", {0x81, 1, 'x'}, 3},
        {"rsv1", {0xC2, 0}, 2},
        {"opcode 3", {0x83, 0}, 2},
        {"opcode 11", {0x8B, 0}, 2},
        {"masked", {0x82, 0x81, 1, 2, 3, 4, 5}, 7},
        {"long ping", {0x89, 126, 0, 126}, 4},
        {"fragmented ping", {0x09, 0}, 2},
        {"not shortest 16", {0x82, 126, 0, 5}, 4},
        {"not shortest 64", {0x82, 127, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF}, 10},
        {"top bit", {0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 1}, 10},
        {"oversized", {0x82, 127, 0, 0, 0, 0, 0x04, 0, 0, 1}, 10},
        {"cut 16-bit length", {0x82, 126, 0}, 3},
        {"cut 64-bit length", {0x82, 127, 0, 0, 0}, 5},
    };
    char error[MQE_WS_ERROR_CHARS];
    for (size_t i = 0; i < sizeof frames / sizeof frames[0]; i++) {
        mqe_ws_header h;
        error[0] = 0;
        long n = mqe_ws_parse_header(frames[i].bytes, frames[i].len, 1, &h, error);
        printf("ws-frame %s: %ld", frames[i].name, n);
        if (n > 0)
            printf(" fin %d %s payload %" PRIu64, h.fin, mqe_ws_opcode_name(h.opcode),
                   h.payload_len);
        printf("%s%s\n", error[0] ? " " : "", error);
    }
    /* the client's frames, each length form, masked with a fixed key */
    static const uint8_t mask[4] = {0x37, 0xFA, 0x21, 0x3D};
    static uint8_t frame[MQE_WS_MAX_HEADER + 70000];
    static const size_t lengths[] = {0, 5, 125, 126, 65535, 65536, 69999};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        size_t head = mqe_ws_put_header(frame, MQE_WS_BINARY, lengths[i], mask);
        for (size_t k = 0; k < lengths[i]; k++)
            frame[head + k] = (uint8_t)(k * 7);
        mqe_ws_mask(frame + head, lengths[i], mask, 0);
        uint32_t sum = 0;
        for (size_t k = 0; k < head + lengths[i]; k++)
            sum = sum * 31 + frame[k];
        mqe_ws_header h;
        long n = mqe_ws_parse_header(frame, head + lengths[i], 0, &h, error);
        mqe_ws_mask(frame + head, lengths[i], h.mask, 0);
        int same = 1;
        for (size_t k = 0; k < lengths[i]; k++)
            same &= frame[head + k] == (uint8_t)(k * 7);
        printf("ws-encoded %zu: header %zu (size %zu) read back %ld payload %" PRIu64
               " unmasked %s checksum %08" PRIx32 "\n", lengths[i], head,
               mqe_ws_header_size(lengths[i]), n, h.payload_len, same ? "same" : "DIFFERENT",
               sum);
    }
    /* masking from an offset, as a frame split over TLS records is masked */
    uint8_t whole[11] = "hello world", split[11] = "hello world";
    mqe_ws_mask(whole, 11, mask, 0);
    mqe_ws_mask(split, 3, mask, 0);
    mqe_ws_mask(split + 3, 8, mask, 3);
    print_hex("ws-masked", whole, 11);
    printf("ws-masked in two parts: %s\n", memcmp(whole, split, 11) ? "DIFFERENT" : "same");
    /* the upgrade, with RFC 6455's own example key (section 1.3) */
    static const uint8_t nonce[16] = "the sample nonce";
    char key[MQE_WS_KEY_CHARS + 1], request[512];
    mqe_ws_key(nonce, key);
    printf("ws-key %s\n", key);
    mqe_ws_request(request, sizeof request, "::1", 8080, "/mqtt", key);
    printf("ws-request %s", request);
    static const char *const answers[] = {
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nSec-WebSocket-Protocol: mqtt"
        "\r\n\r\n\x82\x00",
        "HTTP/1.1 101 OK\r\nupgrade: WebSocket\r\nconnection: keep-alive, upgrade\r\n"
        "sec-websocket-accept:s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nsec-websocket-protocol:  mqtt "
        "\r\n\r\n",
        "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Accept: AAAAAAAAAAAAAAAAAAAAAAAAAAA=\r\nSec-WebSocket-Protocol: mqtt"
        "\r\n\r\n",
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n",
        "SSH-2.0-OpenSSH_9.2\r\n",
    };
    for (size_t i = 0; i < sizeof answers / sizeof answers[0]; i++) {
        error[0] = 0;
        long n = mqe_ws_check_response((const uint8_t *)answers[i], strlen(answers[i]), key,
                                       error);
        printf("ws-answer %zu: %ld%s%s\n", i, n, error[0] ? " " : "", error);
    }
}

/* MQTT 5 and credentials: what a client sends (CONNECT in both versions with a user name
 * and password, SUBSCRIBE, PUBLISH prefixes with the packet id's slot), then broker replies
 * with properties and reason codes decoded as an MQTT 5 client reads them. */
static void mqtt5(void) {
    static uint8_t buf[512];
    static const uint8_t password[] = {'p', 0, 0xFF, 'w'};  /* binary data: any octet */
    static const mqe_connect_fields connects[] = {
        {MQE_MQTT_311, "c-311", 5, 60, "user", 4, password, sizeof password, 0, 0},
        {MQE_MQTT_311, "c-311", 5, 60, "user", 4, NULL, 0, 0, 0},
        {MQE_MQTT_5, "c-5", 3, 65535, NULL, 0, NULL, 0, 0, 0},
        {MQE_MQTT_5, "c-5", 3, 10, "user", 4, password, sizeof password, 0, 0},
        {MQE_MQTT_5, "c-5", 3, 10, NULL, 0, password, sizeof password, 0, 0},
        {MQE_MQTT_5, "", 0, 0, "", 0, password, 0, 0, 0},
        /* persistent sessions (src/reconnect.c): clean session / clean start 0, and MQTT
         * 5's Session Expiry Interval property */
        {MQE_MQTT_311, "c-311", 5, 60, NULL, 0, NULL, 0, 1, 0},
        {MQE_MQTT_5, "c-5", 3, 60, "user", 4, NULL, 0, 1, 0x01020304},
    };
    for (size_t i = 0; i < sizeof connects / sizeof connects[0]; i++) {
        size_t n = mqe_encode_connect(buf, &connects[i]);
        if (n != mqe_connect_size(&connects[i]))
            printf("CONNECT size %zu != %zu\n", n, mqe_connect_size(&connects[i]));
        print_hex(connects[i].level == MQE_MQTT_5 ? "connect-5" : "connect-311", buf, n);
    }
    for (int qos = 0; qos <= 2; qos++) {
        size_t n = mqe_encode_subscribe(buf, (uint16_t)(0xFFFF - qos * 4097), "s/+/#", 5, qos,
                                        MQE_MQTT_5);
        if (n != mqe_subscribe_size(5, MQE_MQTT_5))
            printf("SUBSCRIBE size %zu != %zu\n", n, mqe_subscribe_size(5, MQE_MQTT_5));
        print_hex("subscribe-5", buf, n);
    }
    static const size_t payloads[] = {32, 117, 118, 119, 120, 16373, 16374, 268435447};
    for (size_t i = 0; i < sizeof payloads / sizeof payloads[0]; i++)
        for (int qos = 0; qos <= 2; qos++) {
            size_t id_at = 99;
            size_t n = mqe_publish_prefix(buf, "t/q", 3, qos, payloads[i], MQE_MQTT_5, &id_at);
            printf("id at %zu, ", id_at);
            print_hex("publish-prefix-5", buf, n);
        }
    static const struct {
        const char *name;
        uint8_t bytes[64];
        size_t len;
    } replies[] = {
        {"connack plain", {0x20, 3, 0, 0, 0}, 5},
        {"connack grants", {0x20, 25, 1, 0, 22, 0x21, 0, 20, 0x24, 1, 0x22, 0, 10, 0x27, 0, 1,
                            0, 0, 0x13, 0, 30, 0x12, 0, 1, 'x', 0x25, 0}, 27},
        {"connack 0x86", {0x20, 3, 0, 0x86, 0}, 5},
        {"connack 0x87 said", {0x20, 11, 0, 0x87, 8, 0x1F, 0, 5, 'n', 'o', '\n', 'p', 'e'}, 13},
        {"connack 0x84", {0x20, 3, 0, 0x84, 0}, 5},
        {"connack 2 bytes", {0x20, 2, 0, 0}, 4},
        {"connack code 0x05", {0x20, 3, 0, 0x05, 0}, 5},
        {"connack qos 2", {0x20, 5, 0, 0, 2, 0x24, 2}, 7},
        {"connack receive 0", {0x20, 6, 0, 0, 3, 0x21, 0, 0}, 8},
        {"connack twice", {0x20, 7, 0, 0, 4, 0x24, 1, 0x24, 1}, 9},
        {"connack unknown", {0x20, 5, 0, 0, 2, 0x7F, 1}, 7},
        {"connack misplaced", {0x20, 5, 0, 0, 2, 0x01, 1}, 7},
        {"connack past end", {0x20, 5, 0, 0, 9, 0x24, 1}, 7},
        {"connack cut string", {0x20, 6, 0, 0, 3, 0x1F, 0, 9}, 8},
        {"connack length 5 bytes", {0x20, 7, 0, 0, 0x80, 0x80, 0x80, 0x80, 1}, 9},
        {"connack trailing", {0x20, 4, 0, 0, 0, 0}, 6},
        {"connack user properties", {0x20, 17, 0, 0, 14, 0x26, 0, 1, 'k', 0, 1, 'v', 0x26, 0, 1,
                                     'k', 0, 1, 'w'}, 19},
        {"publish no property", {0x30, 7, 0, 3, 'a', '/', 'b', 0, 'x'}, 9},
        {"publish properties", {0x32, 26, 0, 3, 'a', '/', 'b', 0, 7, 17, 0x01, 1, 0x02, 0, 0, 0,
                                60, 0x0B, 0x81, 0x01, 0x0B, 2, 0x26, 0, 0, 0, 0, 'x'}, 28},
        {"publish topic alias", {0x30, 9, 0, 3, 'a', '/', 'b', 3, 0x23, 0, 1}, 11},
        {"publish empty topic", {0x30, 3, 0, 0, 0}, 5},
        {"publish no length", {0x30, 5, 0, 3, 'a', '/', 'b'}, 7},
        {"publish format 2", {0x30, 8, 0, 3, 'a', '/', 'b', 2, 0x01, 2}, 10},
        {"publish subscription id 0", {0x30, 8, 0, 3, 'a', '/', 'b', 2, 0x0B, 0}, 10},
        {"puback 2", {0x40, 2, 0, 1}, 4},
        {"puback no subscribers", {0x40, 3, 0, 1, 0x10}, 5},
        {"puback quota", {0x40, 4, 0, 1, 0x97, 0}, 6},
        {"puback said", {0x40, 9, 0, 1, 0x87, 5, 0x1F, 0, 2, 'n', 'o'}, 11},
        {"puback bad code", {0x40, 3, 0, 1, 0x92}, 5},
        {"pubrec", {0x50, 3, 0, 2, 0x80}, 5},
        {"pubrel not found", {0x62, 3, 0, 3, 0x92}, 5},
        {"pubcomp", {0x70, 4, 0, 3, 0, 0}, 6},
        {"pubcomp trailing", {0x70, 5, 0, 3, 0, 0, 0}, 7},
        {"suback", {0x90, 6, 0, 1, 0, 0, 1, 2}, 8},
        {"suback refused", {0x90, 5, 0, 1, 0, 0x87, 0xA2}, 7},
        {"suback no code", {0x90, 3, 0, 1, 0}, 5},
        {"suback 0x03", {0x90, 4, 0, 1, 0, 3}, 6},
        {"disconnect 0", {0xE0, 0}, 2},
        {"disconnect taken over", {0xE0, 1, 0x8E}, 3},
        {"disconnect said", {0xE0, 9, 0x8B, 7, 0x1F, 0, 4, 'b', 'y', 'e', '!'}, 11},
        {"disconnect session expiry", {0xE0, 7, 0x80, 5, 0x11, 0, 0, 0, 1}, 9},
        {"disconnect 0x04", {0xE0, 1, 0x04}, 3},
        {"auth", {0xF0, 0}, 2},
    };
    for (size_t i = 0; i < sizeof replies / sizeof replies[0]; i++) {
        mqe_packet p;
        mqe_connack_grants g = {0, 0, 0, 0, -2};
        char error[MQE_ERROR_CHARS] = "", said[MQE_ERROR_CHARS];
        long n = mqe_parse(replies[i].bytes, replies[i].len, &p, error);
        int decoded = n > 0 ? mqe_decode(&p, MQE_MQTT_5, &g, error) : -1;
        printf("reply-5 %s: %ld %d", replies[i].name, n, decoded);
        if (decoded == 0) {
            mqe_reason_string(&p, said, sizeof said);
            printf(" %s code 0x%02X %s id %u payload %zu%s", mqe_type_name(p.type),
                   p.return_code, mqe_reason_name(p.return_code, p.type),
                   (unsigned)p.packet_id, p.payload_len, said);
            if (p.type == MQE_SUBACK)
                print_hex(" codes", p.payload, p.payload_len);
            else if (p.type == MQE_CONNACK)
                printf(" receive %u alias %u qos %u size %u keepalive %d",
                       (unsigned)g.receive_maximum, (unsigned)g.topic_alias_maximum,
                       (unsigned)g.maximum_qos, (unsigned)g.maximum_packet_size,
                       (int)g.server_keep_alive);
        }
        printf("%s%s\n", error[0] ? " " : "", error);
    }
    for (unsigned code = 0; code <= 6; code++)
        printf("return code %u %s\n", code, mqe_return_code_name((uint8_t)code));
}

static int wire(void) {
    static uint8_t buf[1 << 16];
    static const char id[] = "a-client-id-with-some-length-to-it-0123456789";
    for (size_t len = 0; len < sizeof id; len += 11) {
        mqe_connect_fields f = {.level = MQE_MQTT_311, .client_id = id, .client_id_len = len,
                                .keepalive_s = (uint16_t)(len * 997)};
        size_t n = mqe_encode_connect(buf, &f);
        if (n != mqe_connect_size(&f))
            printf("CONNECT size %zu != %zu\n", n, mqe_connect_size(&f));
        print_hex("connect", buf, n);
    }
    for (int qos = 0; qos <= 2; qos++) {
        size_t n = mqe_encode_subscribe(buf, (uint16_t)(0xFFFF - qos * 4097), "s/+/#", 5, qos,
                                        MQE_MQTT_311);
        print_hex("subscribe", buf, n);
    }
    /* the remaining-length field at each of its width boundaries, up to the standard's
     * largest packet (268,435,455 bytes: the prefix only, never the payload) */
    static const size_t payloads[] = {0, 32, 120, 121, 122, 123, 16376, 16377, 16378, 16379,
                                      2097144, 2097145, 2097146, 2097147, 268435450};
    for (size_t i = 0; i < sizeof payloads / sizeof payloads[0]; i++)
        for (int qos = 0; qos <= 2; qos += 2) {  /* qos 2: two more bytes (packet id) */
            size_t n = mqe_publish_prefix(buf, "t/q", 3, qos, payloads[i], MQE_MQTT_311,
                                          NULL);
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
    size_t n = mqe_publish_prefix(buf, "t/q", 3, 1, 40, MQE_MQTT_311, NULL);
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
    websocket();
    mqtt5();
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
    case 2: {  /* an mqttbed PUBLISH with values that need every bit of their fields, as
                * 3.1.1 or MQTT 5 (with a property length 0) has it */
        int qos = (int)below(3);
        size_t payload = MQE_PAYLOAD_MIN + below(48);
        const char *topic = below(2) ? "f/x" : "f/y";
        int level = below(2) ? MQE_MQTT_311 : MQE_MQTT_5;
        size_t id_at = 0;
        n = mqe_publish_prefix(to, topic, 3, qos, payload, level, &id_at);
        to[0] |= below(4) == 0 ? 0x08 : 0;  /* DUP, now and then */
        if (qos) {
            uint8_t *id = id_at ? to + id_at : to + n;
            id[0] = 0;
            id[1] = (uint8_t)(1 + below(4));
            n += id_at ? 0u : 2u;
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
        static const uint8_t control[][6] = {
            {0x20, 2, 0, 0}, {0x20, 2, 0, 5}, {0x40, 2, 0, 1}, {0x50, 2, 0, 2},
            {0x70, 2, 0, 2}, {0x62, 2, 0, 3}, {0x90, 3, 0, 1, 2}, {0x90, 3, 0, 1, 0x80},
            {0xD0, 0},
            /* MQTT 5: CONNACK with properties, a reason code or a property length, a
             * SUBACK with a property length, the broker's DISCONNECT */
            {0x20, 3, 0, 0, 0}, {0x20, 3, 0, 0x86, 0}, {0x40, 3, 0, 1, 0x10},
            {0x50, 3, 0, 2, 0x97}, {0x62, 3, 0, 3, 0x92}, {0x70, 3, 0, 2, 0},
            {0x90, 4, 0, 1, 0, 2}, {0xE0, 1, 0x8E}};
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

/* The WebSocket control frames a client answered with (pong, close), unmasked. */
static void print_ws_sent(const mqe_client *c) {
    char error[MQE_WS_ERROR_CHARS];
    for (size_t at = c->wire_head; at < c->wire_len;) {
        mqe_ws_header h;
        long n = mqe_ws_parse_header(c->wire + at, c->wire_len - at, 0, &h, error);
        if (n <= 0 || c->wire_len - at - (size_t)n < h.payload_len) {
            printf("  ws-sent unreadable: %s\n", n < 0 ? error : "cut");
            return;
        }
        uint8_t payload[125];
        size_t len = (size_t)h.payload_len < sizeof payload ? (size_t)h.payload_len : 0;
        memcpy(payload, c->wire + at + n, len);
        mqe_ws_mask(payload, len, h.mask, 0);
        printf("  ws-sent %s", mqe_ws_opcode_name(h.opcode));
        print_hex("", payload, len);
        at += (size_t)n + (size_t)h.payload_len;
    }
}

static void print_engine(const mqe_engine *e) {
    static const int pub_clock[] = {PUB_T_INTENDED, PUB_T_PUB, -1};
    static const int dlv_clock[] = {DLV_T_RECV, DLV_T_RECV_USER, -1};
    static const int sub_clock[] = {SUB_T_SUBACK, SUB_T_SENT, SUB_T_INTENDED, -1};
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
        if (c->ws)
            print_ws_sent(c);
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

static int tls_replies(void);

/* A broker's stream in WebSocket frames, as a broker might cut it (or not quite): binary
 * frames and continuations, pings and pongs between, now and then a frame that is wrong. */
#define FRAMED_BYTES (16 * 128 * 4)

static size_t generated_frames(const uint8_t *stream, size_t len, uint8_t *to) {
    size_t n = 0, at = 0;
    int open = 0;
    /* at most 3 header bytes per stream byte, and control frames while room is left */
    while (at < len || (below(8) == 0 && n + 3 * len + 16 < FRAMED_BYTES)) {
        switch (below(32)) {
        case 0:
        case 1: {  /* a control frame */
            static const uint8_t controls[] = {0x89, 0x8A, 0x88};
            uint8_t opcode = controls[below(below(4) ? 2 : 3)];
            size_t payload = below(6);
            to[n++] = opcode;
            to[n++] = (uint8_t)payload;
            for (size_t i = 0; i < payload; i++)
                to[n++] = (uint8_t)(opcode == 0x88 && i < 2 ? (i ? 0xE9 : 0x03) : prng());
            continue;
        }
        case 2: {  /* a header that is wrong: text, reserved bits or opcode, masked */
            static const uint8_t wrong[][2] = {{0x81, 0}, {0xC2, 0}, {0x83, 0}, {0x82, 0x80}};
            memcpy(to + n, wrong[below(4)], 2);
            n += 2;
            continue;
        }
        default:
            break;
        }
        size_t take = len - at < 1 + below(40) ? len - at : 1 + below(40);
        int fin = at + take == len || below(3) == 0;
        to[n++] = (uint8_t)((fin ? 0x80 : 0) | (open ? 0 : 2));
        if (take < 126) {
            to[n++] = (uint8_t)take;
        } else {  /* the 16-bit form, with a length over 125 */
            to[n++] = 126;
            to[n++] = 0;
            to[n++] = (uint8_t)take;
        }
        memcpy(to + n, stream + at, take);
        n += take;
        at += take;
        open = !fin;
        if (at == len)
            break;
    }
    return n;
}

static int replies(int files, char **paths) {
    static uint8_t streams[2][16 * 128], framed[2][FRAMED_BYTES];
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
        size_t framed_len[2];
        for (int s = 0; s < 2; s++)
            framed_len[s] = generated_frames(streams[s], len[s], framed[s]);
        print_hex("  framed to publisher", framed[0], framed_len[0]);
        print_hex("  framed to subscriber", framed[1], framed_len[1]);
        mqe_feed_in_reads(e, clients.publisher, streams[0], len[0], read_bytes);
        mqe_feed_in_reads(e, clients.subscriber, streams[1], len[1], read_bytes);
        mqe_feed_datagrams(e, clients.sn_publisher, streams[0], len[0], read_bytes);
        mqe_feed_datagrams(e, clients.sn_subscriber, streams[1], len[1], read_bytes);
        mqe_feed_in_reads(e, clients.ws_publisher, framed[0], framed_len[0], read_bytes);
        mqe_feed_in_reads(e, clients.ws_subscriber, framed[1], framed_len[1], read_bytes);
        mqe_feed_in_reads(e, clients.v5_publisher, streams[0], len[0], read_bytes);
        mqe_feed_in_reads(e, clients.v5_subscriber, streams[1], len[1], read_bytes);
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
    return tls_replies();
}

/* -- TLS: an in-process OpenSSL server, every byte of its side fed alone ------------------- */

#define TLS_NAME "selftest.mqttbed.test"

/* A self-signed certificate for TLS_NAME (the client trusts it as its CA) and its key. */
static int make_certificate(EVP_PKEY **key, X509 **cert, char **pem) {
    *key = EVP_EC_gen("P-256");
    *cert = X509_new();
    if (*key == NULL || *cert == NULL)
        return -1;
    X509_set_version(*cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(*cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(*cert), -300);
    X509_gmtime_adj(X509_getm_notAfter(*cert), 3600);
    X509_set_pubkey(*cert, *key);
    X509_NAME *name = X509_get_subject_name(*cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)TLS_NAME, -1,
                               -1, 0);
    X509_set_issuer_name(*cert, name);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, *cert, *cert, NULL, NULL, 0);
    X509_EXTENSION *san = X509V3_EXT_conf_nid(NULL, &ctx, NID_subject_alt_name,
                                              "DNS:" TLS_NAME);
    if (san == NULL || !X509_add_ext(*cert, san, -1) || !X509_sign(*cert, *key, EVP_sha256()))
        return -1;
    X509_EXTENSION_free(san);
    BIO *out = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(out, *cert);
    char *text;
    long len = BIO_get_mem_data(out, &text);
    *pem = calloc(1, (size_t)len + 1);
    memcpy(*pem, text, (size_t)len);
    BIO_free(out);
    return 0;
}

/* What the client wrote goes to the server; what the server wrote is fed to the client one
 * byte per read. The bytes fed are counted. */
static void shuttle(mqe_engine *e, int client, SSL *server, size_t *fed) {
    mqe_client *c = &e->clients[client];
    if (c->wire_len > c->wire_head)
        BIO_write(SSL_get_rbio(server), c->wire + c->wire_head,
                  (int)(c->wire_len - c->wire_head));
    c->wire_head = c->wire_len = 0;
    uint8_t byte;
    while (BIO_read(SSL_get_wbio(server), &byte, 1) == 1) {
        mqe_feed(e, client, &byte, 1);
        (*fed)++;
    }
}

/* A QoS 2 subscriber of f/+ (its SUBSCRIBE queued, packet id 1), as the replies' one. */
static mqe_engine *subscriber_engine(int *client) {
    mqe_engine *e = mqe_create(64, 0, 0);
    if (e == NULL)
        exit(2);
    *client = mqe_add_client(e, "tls-sub-0", "127.0.0.1", 1, 1, "f/x", 2, 3, 0, 0, 0.0, 10,
                             1, 0, 0);
    return e;
}

/* The replies a broker sends the subscriber: CONNACK, SUBACK, PUBLISH at QoS 0, 1 and 2
 * (one with a payload longer than a record cut), PUBREL. */
static size_t broker_stream(uint8_t *to) {
    static const uint8_t head[] = {0x20, 2, 0, 0, 0x90, 3, 0, 1, 2};
    size_t n = sizeof head;
    memcpy(to, head, n);
    for (int k = 0; k < 4; k++) {
        int qos = k % 3;
        size_t payload = k == 3 ? 300 : MQE_PAYLOAD_MIN + 8 * (size_t)k;
        n += mqe_publish_prefix(to + n, "f/x", 3, qos, payload, MQE_MQTT_311, NULL);
        if (qos) {
            to[n++] = 0;
            to[n++] = (uint8_t)(k + 1);
        }
        mqe_encode_payload(to + n, payload, (uint64_t)k, 0, 1000 + k, 999 + k);
        n += payload;
    }
    static const uint8_t pubrel[] = {0x62, 2, 0, 3};
    memcpy(to + n, pubrel, sizeof pubrel);
    return n + sizeof pubrel;
}

static int same_events(const mqe_engine *a, const mqe_engine *b) {
    const mqe_table *x = &a->tables[MQE_T_DELIVERY], *y = &b->tables[MQE_T_DELIVERY];
    if (x->rows != y->rows || a->clients[0].out_len != b->clients[0].out_len
        || memcmp(a->clients[0].out, b->clients[0].out, a->clients[0].out_len) != 0)
        return 0;
    static const int columns[] = {DLV_PUBLISHER, DLV_SEQ, DLV_PAYLOAD_BYTES, DLV_QOS};
    for (uint32_t row = 0; row < x->rows; row++)
        for (size_t i = 0; i < sizeof columns / sizeof columns[0]; i++) {
            size_t width = x->width[columns[i]];
            if (memcmp((const uint8_t *)x->column[columns[i]] + row * width,
                       (const uint8_t *)y->column[columns[i]] + row * width, width) != 0)
                return 0;
        }
    return 1;
}

static int tls_replies(void) {
    EVP_PKEY *key;
    X509 *cert;
    char *pem;
    if (make_certificate(&key, &cert, &pem) != 0) {
        fprintf(stderr, "selftest: no certificate: %s\n",
                ERR_reason_error_string(ERR_get_error()));
        return 2;
    }
    static uint8_t stream[1024];
    size_t stream_len = broker_stream(stream);
    int plain_client;
    mqe_engine *plain = subscriber_engine(&plain_client);
    mqe_subscribe(plain, plain_client, "f/+", 2);
    mqe_feed(plain, plain_client, stream, stream_len);
    static const int versions[] = {TLS1_2_VERSION, TLS1_3_VERSION};
    int status = 0;
    for (size_t v = 0; v < 2; v++) {
        SSL_CTX *server_ctx = SSL_CTX_new(TLS_server_method());
        SSL_CTX_use_certificate(server_ctx, cert);
        SSL_CTX_use_PrivateKey(server_ctx, key);
        SSL_CTX_set_min_proto_version(server_ctx, versions[v]);
        SSL_CTX_set_max_proto_version(server_ctx, versions[v]);
        SSL *server = SSL_new(server_ctx);
        SSL_set_bio(server, BIO_new(BIO_s_mem()), BIO_new(BIO_s_mem()));
        SSL_set_accept_state(server);
        int client;
        mqe_engine *e = subscriber_engine(&client);
        if (mqe_tls_configure(e, pem, NULL, NULL, 1) != 0
            || mqe_set_tls(e, client, TLS_NAME) != 0) {
            printf("tls: %s\n", mqe_error(e));
            return 1;
        }
        mqe_subscribe(e, client, "f/+", 2);
        mqe_client *c = &e->clients[client];
        size_t fed = 0;
        mqe_layers_start(e, c);  /* the ClientHello, as after a TCP connect */
        for (int round = 0; round < 8 && !c->dead; round++) {
            SSL_do_handshake(server);
            shuttle(e, client, server, &fed);
            if (c->stage == MQE_STAGE_READY && SSL_is_init_finished(server))
                break;
        }
        printf("tls %s: handshake %s, the server's bytes fed one at a time%s%s\n",
               SSL_get_version(server), c->stage == MQE_STAGE_READY && fed ? "done" : "NOT DONE",
               c->dead ? ": " : "", c->failure);
        /* records cut inside packets: 5, 9 and 30 bytes, then two halves of the rest */
        size_t cuts[] = {5, 14, 44, 44 + (stream_len - 44) / 2, stream_len}, at = 0;
        for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
            SSL_write(server, stream + at, (int)(cuts[i] - at));
            at = cuts[i];
        }
        size_t handshake = fed;
        shuttle(e, client, server, &fed);
        printf("tls %s: %zu MQTT bytes in 5 records, %s\n", SSL_get_version(server),
               stream_len, fed - handshake > stream_len ? "every byte of them fed alone"
                                                         : "NOT FED");
        print_engine(e);
        printf("tls %s: the same deliveries and answers as without TLS: %s\n",
               SSL_get_version(server), same_events(e, plain) ? "yes" : "NO");
        status |= !same_events(e, plain);
        SSL_free(server);
        SSL_CTX_free(server_ctx);
        mqe_destroy(e);
    }
    printf("without TLS:\n");
    print_engine(plain);
    mqe_destroy(plain);
    X509_free(cert);
    EVP_PKEY_free(key);
    free(pem);
    return status;
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
