/* The engine's GPIO edges through a real kernel GPIO driver: a run against a broker with a
 * publisher and a subscriber, each on a line of a GPIO character device that the engine
 * requests (uAPI v2, src/gpio_chip.c) and drives at every publish and every receive, as an
 * agent's run does (src/io.c, toggles). Built statically for arm64 (`make gpio-edges-arm64`)
 * and run in the arm64 guest of network/lab_vm_gpio.py, where the chip is the kernel's
 * PL061 driver on QEMU's `virt` board and QEMU's trace of that PL061 is the logic analyser.
 *
 *   gpio-edges CHIP HOST PORT MESSAGES RATE_HZ PUB_LINE SUB_LINE
 *
 * Prints, one a line: `requested T0 T1` (CLOCK_MONOTONIC ns around the line request),
 * `client I sent S deliveries D failed F`, `refused-writes N errno E`, then the engine's
 * recorded edges `edge LINE LEVEL T_NS WRITE_NS` in the order recorded, and `end STATUS`.
 * Exit status 0 when the run is done, 1 when it failed (what failed is printed), 2 on
 * bad arguments. Only the engine's public surface (src/engine.h) is used. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/engine.h"

#define EDGES_MAX 65536
#define WAIT_NS 20000000000LL

static struct {
    int32_t line;
    uint8_t level;
    int64_t t_ns, write_ns;
} edges[EDGES_MAX];
static uint32_t n_edges;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int failed(mqe_engine *e, const char *stage) {
    printf("failed at %s: %s\n", stage, mqe_error(e));
    for (int i = 0; i < 2; i++)
        if (mqe_client_failure(e, i)[0])
            printf("  client %d: %s\n", i, mqe_client_failure(e, i));
    printf("end failed\n");
    mqe_disconnect_all(e);
    mqe_destroy(e);
    return 1;
}

/* Keep the edges recorded so far, then forget every table's rows. */
static void drain(mqe_engine *e) {
    uint32_t rows = mqe_rows(e, MQE_T_EDGE);
    const int32_t *line = mqe_column(e, MQE_T_EDGE, EDGE_PIN);
    const uint8_t *level = mqe_column(e, MQE_T_EDGE, EDGE_LEVEL);
    const int64_t *t = mqe_column(e, MQE_T_EDGE, EDGE_T);
    const int64_t *write = mqe_column(e, MQE_T_EDGE, EDGE_WRITE);
    for (uint32_t row = 0; row < rows && n_edges < EDGES_MAX; row++, n_edges++) {
        edges[n_edges].line = line[row];
        edges[n_edges].level = level[row];
        edges[n_edges].t_ns = t[row];
        edges[n_edges].write_ns = write[row];
    }
    for (int table = 0; table < MQE_TABLES; table++)
        mqe_clear(e, table);
}

/* Serve the sockets until client `client` is connected (subscribed, if `subscribed`). */
static int wait_until(mqe_engine *e, int client, int subscribed) {
    int64_t deadline = now_ns() + WAIT_NS;
    while (now_ns() < deadline) {
        mqe_client_stats s;
        mqe_client_stats_of(e, client, &s);
        if (s.failed)
            return -1;
        if (subscribed ? s.subscribed : s.connected)
            return 0;
        if (mqe_poll(e, 50000000) != 0)
            return -1;
    }
    return -1;
}

static long argument(const char *name, const char *text, long low, long high) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno || *end || end == text || value < low || value > high) {
        fprintf(stderr, "gpio-edges: %s %s: an integer in %ld..%ld\n", name, text, low, high);
        exit(2);
    }
    return value;
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: gpio-edges CHIP HOST PORT MESSAGES RATE_HZ PUB_LINE SUB_LINE\n");
        return 2;
    }
    const char *chip = argv[1], *host = argv[2];
    int port = (int)argument("PORT", argv[3], 1, 65535);
    long messages = argument("MESSAGES", argv[4], 1, EDGES_MAX / 2 - 1);
    double rate_hz = (double)argument("RATE_HZ", argv[5], 1, 10000);
    int32_t lines[2] = {(int32_t)argument("PUB_LINE", argv[6], 0, 63),
                        (int32_t)argument("SUB_LINE", argv[7], 0, 63)};
    if (lines[0] == lines[1]) {
        fprintf(stderr, "gpio-edges: PUB_LINE and SUB_LINE are both %d: two lines\n", lines[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    mqe_engine *e = mqe_create(4096, 0, 0);
    if (e == NULL)
        return 1;
    if (mqe_add_client(e, "gpio-pub", host, port, 0, "mqttbed/gpio", 0, lines[0], 0, 64,
                       rate_hz, messages, 0, 0, 0) < 0
        || mqe_add_client(e, "gpio-sub", host, port, 1, "mqttbed/gpio", 0, lines[1], 0, 0,
                          0.0, messages, 0, 0, 0) < 0)
        return failed(e, "add_client");
    int64_t t_request = now_ns();
    if (mqe_gpio_open_chip(e, chip, lines, 2) != 0)
        return failed(e, "the line request");
    printf("requested %" PRId64 " %" PRId64 "\n", t_request, now_ns());
    if (mqe_connect_all(e, 30, 10000) != 0 || wait_until(e, 0, 0) || wait_until(e, 1, 0))
        return failed(e, "CONNACK");
    if (mqe_subscribe(e, 1, "mqttbed/gpio", 0) != 0 || wait_until(e, 1, 1))
        return failed(e, "SUBACK");
    drain(e);
    int64_t start = now_ns() + 50000000;
    int64_t deadline = start + (int64_t)(messages / rate_hz * 1e9) + WAIT_NS;
    mqe_run_begin(e, start, deadline, deadline, 0, 0);
    int status;
    do {
        status = mqe_step(e, now_ns() + 100000000);
        drain(e);
    } while (status == MQE_SLICE || status == MQE_DRAIN || status == MQE_WOKEN);
    for (int i = 0; i < 2; i++) {
        mqe_client_stats s;
        mqe_client_stats_of(e, i, &s);
        printf("client %d sent %" PRId64 " deliveries %" PRId64 " failed %d\n", i, s.sent,
               s.deliveries, s.failed);
    }
    int last_errno = 0;
    int64_t refused = mqe_gpio_write_failures(e, &last_errno);
    printf("refused-writes %" PRId64 " errno %d\n", refused, last_errno);
    for (uint32_t i = 0; i < n_edges; i++)
        printf("edge %d %d %" PRId64 " %" PRId64 "\n", edges[i].line, edges[i].level,
               edges[i].t_ns, edges[i].write_ns);
    if (status != MQE_DONE)
        return failed(e, status == MQE_DEADLINE ? "the run's deadline" : "the run");
    printf("end done\n");
    mqe_disconnect_all(e);
    mqe_destroy(e);
    return 0;
}
