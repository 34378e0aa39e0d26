/* The latency floor for bench/native_engine.py P1: the least a client can do between a
 * PUBLISH and its deliveries through a broker. One publisher and N subscribers on blocking
 * sockets (TCP_NODELAY), QoS 0, one ppoll() loop; each delivery's latency is the receive
 * time read right after recv() minus the send time read right before send(), both
 * CLOCK_MONOTONIC. Prints one line: "deliveries <n> p50_ns <x> p99_ns <y>".
 *
 *   pingfloor HOST PORT SUBSCRIBERS MESSAGES RATE_HZ PAYLOAD_BYTES
 */
#define _GNU_SOURCE
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int dial(const char *host, const char *port) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(host, port, &hints, &ai) != 0)
        return -1;
    int fd = socket(ai->ai_family, SOCK_STREAM, 0), one = 1;
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0)
        return -1;
    freeaddrinfo(ai);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int read_exactly(int fd, uint8_t *to, size_t n) {
    while (n) {
        ssize_t got = recv(fd, to, n, 0);
        if (got <= 0)
            return -1;
        to += got;
        n -= (size_t)got;
    }
    return 0;
}

/* One packet: its first byte, body into buf (at most cap bytes), body length. */
static long read_packet(int fd, uint8_t *first, uint8_t *buf, size_t cap) {
    uint8_t byte;
    size_t length = 0;
    unsigned shift = 0;
    if (read_exactly(fd, first, 1))
        return -1;
    do {
        if (read_exactly(fd, &byte, 1))
            return -1;
        length |= (size_t)(byte & 0x7F) << shift;
        shift += 7;
    } while (byte & 0x80);
    if (length > cap || read_exactly(fd, buf, length))
        return -1;
    return (long)length;
}

static void mqtt_connect(int fd, const char *id) {
    uint8_t packet[64], first, reply[8];
    size_t id_len = strlen(id), n = 0;
    packet[n++] = 0x10;
    packet[n++] = (uint8_t)(12 + id_len);
    memcpy(packet + n, "\0\4MQTT\4\2\0\x3c", 10);
    n += 10;
    packet[n++] = 0;
    packet[n++] = (uint8_t)id_len;
    memcpy(packet + n, id, id_len);
    n += id_len;
    if (send(fd, packet, n, 0) != (ssize_t)n || read_packet(fd, &first, reply, sizeof reply) != 2
        || first != 0x20 || reply[1] != 0) {
        fprintf(stderr, "%s: no CONNACK\n", id);
        exit(1);
    }
}

static int cmp(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: pingfloor HOST PORT SUBSCRIBERS MESSAGES RATE_HZ PAYLOAD_BYTES\n");
        return 2;
    }
    int subs = atoi(argv[3]), messages = atoi(argv[4]), payload = atoi(argv[6]);
    double rate = atof(argv[5]);
    const char *topic = "floor/t";
    size_t topic_len = strlen(topic);
    int pub = dial(argv[1], argv[2]);
    int *sub = calloc((size_t)subs, sizeof *sub);
    int64_t *latency = calloc((size_t)subs * (size_t)messages, sizeof *latency);
    if (pub < 0 || !sub || !latency)
        return 1;
    mqtt_connect(pub, "floor-pub");
    for (int j = 0; j < subs; j++) {
        char id[32];
        snprintf(id, sizeof id, "floor-sub-%d", j);
        if ((sub[j] = dial(argv[1], argv[2])) < 0)
            return 1;
        mqtt_connect(sub[j], id);
        uint8_t packet[64], first, reply[8];
        size_t n = 0;
        packet[n++] = 0x82;
        packet[n++] = (uint8_t)(2 + 2 + topic_len + 1);
        packet[n++] = 0;
        packet[n++] = 1;
        packet[n++] = 0;
        packet[n++] = (uint8_t)topic_len;
        memcpy(packet + n, topic, topic_len);
        n += topic_len;
        packet[n++] = 0;
        if (send(sub[j], packet, n, 0) != (ssize_t)n
            || read_packet(sub[j], &first, reply, sizeof reply) < 3 || first != 0x90)
            return 1;
    }
    size_t packet_len = 2 + 2 + topic_len + (size_t)payload;
    uint8_t *packet = calloc(packet_len + 4, 1), *body = malloc(1 << 16);
    size_t n = 0;
    packet[n++] = 0x30;
    size_t remaining = 2 + topic_len + (size_t)payload;
    do {
        uint8_t b = remaining & 0x7F;
        remaining >>= 7;
        packet[n++] = b | (remaining ? 0x80 : 0);
    } while (remaining);
    packet[n++] = 0;
    packet[n++] = (uint8_t)topic_len;
    memcpy(packet + n, topic, topic_len);
    n += topic_len;
    size_t stamp_at = n, total = n + (size_t)payload;
    struct pollfd *fds = calloc((size_t)subs, sizeof *fds);
    for (int j = 0; j < subs; j++)
        fds[j] = (struct pollfd){.fd = sub[j], .events = POLLIN};
    long recorded = 0;
    int64_t start = now_ns() + 20000000;
    for (int k = 0; k < messages; k++) {
        int64_t due = start + (int64_t)((double)k * 1e9 / rate);
        for (int64_t t; (t = now_ns()) < due;) {  /* wait for the due time, serving reads */
            /* ppoll's timeout is in ns: reads are served up to the due time itself (a
             * poll() in whole ms then a sleep for the rest left every delivery that came
             * in the last ms waiting, i.e. all of them at 1 kHz) */
            struct timespec wait = {.tv_sec = (time_t)((due - t) / 1000000000),
                                    .tv_nsec = (long)((due - t) % 1000000000)};
            if (ppoll(fds, (nfds_t)subs, &wait, NULL) <= 0)
                continue;
            for (int j = 0; j < subs; j++) {
                if (!(fds[j].revents & POLLIN))
                    continue;
                uint8_t first;
                long len = read_packet(sub[j], &first, body, 1 << 16);
                int64_t t_recv = now_ns();
                if (len < 0)
                    return 1;
                int64_t t_sent;
                memcpy(&t_sent, body + 2 + topic_len, sizeof t_sent);
                if (recorded < (long)subs * messages)
                    latency[recorded++] = t_recv - t_sent;
            }
        }
        int64_t t_send = now_ns();
        memcpy(packet + stamp_at, &t_send, sizeof t_send);
        if (send(pub, packet, total, 0) != (ssize_t)total)
            return 1;
    }
    int64_t end = now_ns() + 1000000000;
    while (recorded < (long)subs * messages && now_ns() < end) {
        if (poll(fds, (nfds_t)subs, 100) <= 0)
            continue;
        for (int j = 0; j < subs; j++) {
            if (!(fds[j].revents & POLLIN))
                continue;
            uint8_t first;
            long len = read_packet(sub[j], &first, body, 1 << 16);
            int64_t t_recv = now_ns();
            if (len < 0)
                return 1;
            int64_t t_sent;
            memcpy(&t_sent, body + 2 + topic_len, sizeof t_sent);
            if (recorded < (long)subs * messages)
                latency[recorded++] = t_recv - t_sent;
        }
    }
    qsort(latency, (size_t)recorded, sizeof *latency, cmp);
    printf("deliveries %ld p50_ns %lld p99_ns %lld\n", recorded,
           recorded ? (long long)latency[recorded / 2] : 0LL,
           recorded ? (long long)latency[(long)(recorded * 0.99)] : 0LL);
    return 0;
}
