/* libFuzzer harness: the bytes one client sends, through the broker's real framing and
 * packet handling (packets.c, mqtt.c, topicfs.c), with only process and socket effects
 * replaced.
 *
 * Each input is a fresh connection: it is framed as client.c frames it, and each complete
 * packet goes to handle_packet until that closes the connection. What would fork a
 * subscription process pretends it did; what would go out on the socket or into a pipe is
 * checked instead: every packet the broker sends must frame to exactly its length and be
 * of a type a broker sends, and every PUBLISH it writes for subscribers must carry the
 * topic it was published to. A violation aborts: libFuzzer reports it as a crash, with
 * the input that caused it.
 *
 * Build and run: `make -C brokers/forkpipe fuzz` (a long run), or the bounded run of
 * tests/test_fuzz_forkpipe_parser.py.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/mqtt.h"
#include "../src/proc.h"
#include "../src/session.h"
#include "../src/subscription.h"
#include "../src/topicfs.h"

struct broker_config g_config = {.max_packet_bytes = 1u << 20};
volatile sig_atomic_t g_stop;

static void expect(bool holds, const char *what) {
    if (!holds) {
        fprintf(stderr, "fuzz_packets: broken invariant: %s\n", what);
        abort();
    }
}

/* A whole packet: its fixed header says exactly its length. */
static unsigned whole_packet(const uint8_t *packet, size_t len) {
    size_t header, remaining;
    expect(len >= 2, "a sent packet has at least two bytes");
    expect(mqtt_frame(packet, len, &header, &remaining) == MQTT_FRAME_OK,
           "a sent packet frames");
    expect(header + remaining == len, "a sent packet's remaining length is its length");
    return packet[0] >> 4;
}

/* -- what would touch sockets, processes and the log ------------------------------------- */

bool send_packet(int sock, const void *buf, size_t len) {
    (void)sock;
    unsigned type = whole_packet(buf, len);
    expect(type == MQTT_CONNACK || type == MQTT_PUBACK || type == MQTT_PUBREC ||
               type == MQTT_PUBCOMP || type == MQTT_SUBACK || type == MQTT_UNSUBACK ||
               type == MQTT_PINGRESP,
           "a broker sends only CONNACK, acks, SUBACK, UNSUBACK and PINGRESP");
    return true;
}

/* Linked with -Wl,--wrap=topicfs_publish: packets.c's deliveries come here instead of
 * into pipes; the rest of topicfs.c (names, client directories) is the real one. */
int __wrap_topicfs_publish(const uint8_t *topic, size_t topic_len, const uint8_t *packet,
                           size_t packet_len);

int __wrap_topicfs_publish(const uint8_t *topic, size_t topic_len, const uint8_t *packet,
                           size_t packet_len) {
    expect(whole_packet(packet, packet_len) == MQTT_PUBLISH, "a delivery is a PUBLISH");
    expect(packet[0] == MQTT_PUBLISH << 4, "a delivery goes out at QoS 0, retain 0");
    size_t header, remaining;
    mqtt_frame(packet, packet_len, &header, &remaining);
    struct mqtt_cursor cur = {packet + header, remaining};
    const uint8_t *carried;
    size_t carried_len;
    expect(mqtt_read_prefixed(&cur, &carried, &carried_len) && carried_len == topic_len &&
               memcmp(carried, topic, topic_len) == 0,
           "a delivery carries the topic it was published to");
    expect(mqtt_topic_name_valid(topic, topic_len), "only valid topic names are published");
    return 0;
}

enum subscription_result subscription_start(int sock, const char *dir_path,
                                            const char *pipe_name, pid_t *pid) {
    (void)sock;
    (void)dir_path;
    uint8_t filter[NAME_MAX];
    size_t len;
    expect(topicfs_decode(pipe_name, filter, &len), "a pipe name decodes");
    expect(mqtt_topic_filter_valid(filter, len), "only valid filters become pipes");
    *pid = 1;
    return SUBSCRIPTION_STARTED;
}

bool pid_list_reserve(struct pid_list *list) {
    return list->n < 64;
}

void pid_list_push(struct pid_list *list, pid_t pid) {
    (void)pid;
    list->n++;
}

void log_line(const char *fmt, ...) {
    (void)fmt;
}

/* -- one connection per input ------------------------------------------------------------- */

#define CLIENT_PID 4242

static void remove_scratch(void) {
    topicfs_remove_client_dir(CLIENT_PID);
    rmdir(g_config.base_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    static char base[] = "/tmp/mqttbed-fuzz-XXXXXX";
    g_config.base_dir = mkdtemp(base);
    expect(g_config.base_dir != NULL, "a scratch base directory");
    atexit(remove_scratch);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct client c;
    memset(&c, 0, sizeof c);
    c.sock = -1;
    c.pid = CLIENT_PID;
    topicfs_client_dir(c.pid, c.dir);
    size_t done = 0;
    bool keep = true;
    while (keep && done < size) {
        size_t header, remaining;
        enum mqtt_frame_status st = mqtt_frame(data + done, size - done, &header, &remaining);
        if (st != MQTT_FRAME_OK || header + remaining > size - done ||
            header + remaining > g_config.max_packet_bytes)
            break;
        /* The body in a buffer of its own: ASan sees any read past the packet. */
        uint8_t *body = malloc(remaining ? remaining : 1);
        memcpy(body, data + done + header, remaining);
        keep = handle_packet(&c, data[done], body, remaining);
        free(body);
        expect(keep || c.reason[0] != '\0', "a closed connection says why");
        done += header + remaining;
    }
    free(c.out);
    return 0;
}
