/* One process per client: reads its connection and hands each packet to packets.c.
 *
 * The process serves until DISCONNECT, a dropped connection, a protocol violation, an
 * expired keep-alive (1.5 x the client's) or a stop signal; then it deletes the client's
 * directory (which stops its subscription processes) and waits for them.
 */
#include "client.h"

#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "counters.h"
#include "mqtt.h"
#include "proc.h"
#include "sendlock.h"
#include "session.h"
#include "topicfs.h"

#define INITIAL_BUFFER 4096u

/* A global so that a forked subscription process still reaches (and LeakSanitizer
 * still sees) the buffers it inherited. */
static struct client g_client;

/* -- the connection loop -------------------------------------------------------------- */

/* Handles every complete packet in the input buffer; false when the connection ends. */
static bool handle_buffered(struct client *c) {
    size_t done = 0;
    bool keep = true;
    while (keep && done < c->in_len) {
        size_t header, remaining;
        enum mqtt_frame_status st = mqtt_frame(c->in + done, c->in_len - done, &header,
                                               &remaining);
        if (st == MQTT_FRAME_MALFORMED) {
            keep = close_because(c, true, "remaining length longer than four bytes");
            break;
        }
        if (st == MQTT_FRAME_INCOMPLETE)
            break;
        if (header + remaining > g_config.max_packet_bytes) {
            keep = close_because(c, true, "%s of %zu bytes, over max-packet-bytes %zu",
                                 mqtt_packet_name(c->in[done] >> 4), header + remaining,
                                 g_config.max_packet_bytes);
            break;
        }
        if (header + remaining > c->in_len - done)
            break; /* the rest has not arrived yet */
        c->last_packet_ms = proc_now_ms();
        keep = handle_packet(c, c->in[done], c->in + done + header, remaining);
        done += header + remaining;
    }
    memmove(c->in, c->in + done, c->in_len - done);
    c->in_len -= done;
    /* A full buffer holds the start of a packet larger than it (and at most
     * max_packet_bytes, checked above): grow it as the bytes arrive, never up front, so
     * announcing a huge packet costs the sender as much as it costs us. */
    if (keep && c->in_len == c->in_cap) {
        size_t cap = c->in_cap * 2 < g_config.max_packet_bytes ? c->in_cap * 2
                                                                : g_config.max_packet_bytes;
        uint8_t *grown = realloc(c->in, cap);
        if (grown == NULL)
            return close_because(c, false, "out of memory reading a packet");
        c->in = grown;
        c->in_cap = cap;
    }
    return keep;
}

/* Milliseconds until the connection must have shown life, or -1 for no limit. */
static int wait_limit_ms(const struct client *c, long long now) {
    long long limit;
    if (!c->connected)
        limit = c->last_packet_ms + g_config.connect_timeout_ms;
    else if (c->keepalive_s > 0)
        limit = c->last_packet_ms + c->keepalive_s * 1500LL; /* 1.5 x keep-alive (3.1.2.10) */
    else
        return -1;
    return limit <= now ? 0 : (int)(limit - now > INT_MAX ? INT_MAX : limit - now);
}

static bool serve(struct client *c) {
    for (;;) {
        long long now = proc_now_ms();
        int limit_ms = wait_limit_ms(c, now);
        if (limit_ms == 0)
            return close_because(c, !c->connected, "%s",
                                 c->connected ? "keep-alive expired" : "no CONNECT in time");
        struct pollfd p = {.fd = c->sock, .events = POLLIN};
        struct timespec timeout = {.tv_sec = limit_ms / 1000,
                                   .tv_nsec = (limit_ms % 1000) * 1000000L};
        sigset_t old;
        proc_block_wake_signals(&old);
        int ready = g_stop ? -1 : ppoll(&p, 1, limit_ms < 0 ? NULL : &timeout, &old);
        proc_restore_signals(&old);
        pid_list_reap(&c->subscriptions);
        if (g_stop)
            return close_because(c, false, "broker stopping");
        if (ready <= 0)
            continue;
        /* read(), not recv(): like Mosquitto, so both brokers' socket bytes show in the
         * per-process I/O counters (rchar/wchar) the resource sampler reads. */
        ssize_t n = read(c->sock, c->in + c->in_len, c->in_cap - c->in_len);
        if (n == 0)
            return close_because(c, false, "connection closed by the client");
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return close_because(c, false, "connection lost: %s", strerror(errno));
        }
        counters_add_in((size_t)n);
        c->in_len += (size_t)n;
        if (!handle_buffered(c))
            return false;
    }
}

/* Tears the client down: connection, directory, subscription processes. */
static void finish(struct client *c) {
    /* shutdown, not just close: the subscription processes hold the socket too. */
    shutdown(c->sock, SHUT_RDWR);
    if (c->dir_created)
        topicfs_remove_client_dir(c->pid);
    if (c->violation || g_config.verbose)
        log_line("client '%s' closed: %s", c->id, c->reason);
    /* Deleting the pipes stops the subscription processes within one select timeout;
     * when the broker is stopping they are told at once instead. */
    if (g_stop)
        pid_list_signal(&c->subscriptions, SIGTERM);
    pid_list_wait(&c->subscriptions, proc_now_ms() + 3LL * g_config.select_timeout_ms + 2000);
    for (size_t i = 0; i < c->subscriptions.n; i++) {
        log_line("subscription process %d did not end; killing it",
                 (int)c->subscriptions.pids[i]);
        kill(c->subscriptions.pids[i], SIGKILL);
        waitpid(c->subscriptions.pids[i], NULL, 0);
    }
    close(c->sock);
    free(c->in);
    free(c->out);
    pid_list_free(&c->subscriptions);
    sendlock_release();
    /* The listener was killed: the last client out removes the base directory. */
    if (g_config.created_base && getppid() != c->listener)
        rmdir(g_config.base_dir);
}

int client_run(int sock, pid_t listener) {
    struct client *c = &g_client;
    proc_die_with_parent(listener);
    c->sock = sock;
    c->pid = getpid();
    c->listener = listener;
    strcpy(c->id, "?");
    c->last_packet_ms = proc_now_ms();
    int one = 1;
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval send_timeout = {.tv_sec = g_config.send_timeout_ms / 1000,
                                   .tv_usec = (g_config.send_timeout_ms % 1000) * 1000};
    setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
    c->in_cap = INITIAL_BUFFER < g_config.max_packet_bytes ? INITIAL_BUFFER
                                                           : g_config.max_packet_bytes;
    c->in = malloc(c->in_cap);
    if (c->in == NULL || !sendlock_init() || !topicfs_client_dir(c->pid, c->dir)) {
        close_because(c, false, "cannot set up the client process");
    } else {
        serve(c);
    }
    finish(c);
    return EXIT_SUCCESS;
}
