/* TLS and WebSocket between a client's socket and its MQTT buffers.
 *
 * Receiving: what one recvmsg read (ciphertext, or WebSocket frames) is decoded at once,
 * through SSL_read and the frame decoder, into the client's MQTT input and framed there;
 * every MQTT packet this completes carries that read's user-space time and kernel stamp
 * (docs/explanation/timing.md). When the event tables are full, the decoded bytes wait
 * (`held`) until the caller drains them, and the loop resumes them before it waits again.
 *
 * Sending: the MQTT bytes in `out` are turned into one WebSocket frame and/or TLS records
 * of at most 16 KiB in `wire` only once `wire` has gone to the socket, so `out` keeps
 * counting what is not yet written (back-pressure and the end of a run see it as for a
 * plain client). Each own publish's send-stamp key is moved from its MQTT byte offset to
 * the socket byte offset of the record (or frame) that carries its last byte. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>

#include "client.h"

#define TLS_RECORD_BYTES 16384  /* the largest TLS plaintext record */
#define WS_READ_ROOM 16384      /* room made in ws_in before each SSL_read */

int mqe_wire_reserve(mqe_engine *e, mqe_client *c, size_t bytes) {
    if (c->wire_len + bytes <= c->wire_cap)
        return 0;
    if (c->wire_head) {
        memmove(c->wire, c->wire + c->wire_head, c->wire_len - c->wire_head);
        c->wire_len -= c->wire_head;
        c->wire_head = 0;
        if (c->wire_len + bytes <= c->wire_cap)
            return 0;
    }
    size_t cap = c->wire_cap ? c->wire_cap : 4096;
    while (cap < c->wire_len + bytes)
        cap *= 2;
    uint8_t *wire = realloc(c->wire, cap);
    if (wire == NULL) {
        mqe_client_fail(e, c, "out of memory for %zu bytes to send", c->wire_len + bytes);
        return -1;
    }
    c->wire = wire;
    c->wire_cap = cap;
    return 0;
}

static int ws_in_reserve(mqe_engine *e, mqe_client *c, size_t bytes) {
    if (c->ws_in_len + bytes <= c->ws_in_cap)
        return 0;
    size_t cap = c->ws_in_cap ? c->ws_in_cap : 4096;
    while (cap < c->ws_in_len + bytes)
        cap *= 2;
    uint8_t *in = realloc(c->ws_in, cap);
    if (in == NULL) {
        mqe_client_fail(e, c, "out of memory for %zu received bytes", c->ws_in_len + bytes);
        return -1;
    }
    c->ws_in = in;
    c->ws_in_cap = cap;
    return 0;
}

/* -- sending ---------------------------------------------------------------------------- */

/* Frame bytes (already masked) go through TLS if the client speaks it, else as they are. */
static int to_wire(mqe_engine *e, mqe_client *c, const uint8_t *data, size_t len) {
    if (c->tls)
        return mqe_tls_write(e, c, data, len);
    if (mqe_wire_reserve(e, c, len) != 0)
        return -1;
    memcpy(c->wire + c->wire_len, data, len);
    c->wire_len += len;
    c->wire_bytes += len;
    return 0;
}

/* RFC 6455 section 5.3 asks for an unpredictable mask per frame: each is drawn from a
 * generator seeded from getrandom (a system call per frame would cost more than the
 * frame's own send). */
static void next_mask(mqe_client *c, uint8_t mask[4]) {
    uint64_t x = c->ws_mask_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    c->ws_mask_state = x;
    uint32_t word = (uint32_t)((x * UINT64_C(0x2545F4914F6CDD1D)) >> 32);
    memcpy(mask, &word, 4);
}

static int send_control(mqe_engine *e, mqe_client *c, int opcode, const uint8_t *payload,
                        size_t len) {
    uint8_t frame[MQE_WS_MAX_HEADER + 125], mask[4];
    next_mask(c, mask);
    size_t head = mqe_ws_put_header(frame, opcode, len, mask);
    memcpy(frame + head, payload, len);
    mqe_ws_mask(frame + head, len, mask, 0);
    return to_wire(e, c, frame, head + len);
}

/* Own publishes whose MQTT bytes end at or before plain_end leave in the socket bytes
 * that end at wire_end: their send-stamp key. */
static void map_tx(mqe_client *c, uint64_t plain_end, uint64_t wire_end) {
    while (c->tx_mapped < c->tx_count) {
        size_t at = (c->tx_head + c->tx_mapped) % c->tx_cap;
        if ((int64_t)(c->tx_end[at] - plain_end) > 0)
            break;
        c->tx_end[at] = wire_end;
        c->tx_mapped++;
    }
}

/* out[out_head .. out_len) into wire: one WebSocket frame and/or TLS records. */
static int encode(mqe_engine *e, mqe_client *c) {
    const uint8_t *plain = c->out + c->out_head;
    size_t len = c->out_len - c->out_head;
    uint64_t plain_start = c->stream_bytes - len;  /* stream_bytes counts MQTT bytes queued */
    uint8_t mask[4], head[MQE_WS_MAX_HEADER];
    size_t head_len = 0;
    if (c->ws) {
        next_mask(c, mask);
        head_len = mqe_ws_put_header(head, MQE_WS_BINARY, len, mask);
    }
    if (!c->tls) {  /* WebSocket over TCP: the frame is built in wire itself */
        if (mqe_wire_reserve(e, c, head_len + len) != 0)
            return -1;
        uint8_t *to = c->wire + c->wire_len;
        memcpy(to, head, head_len);
        memcpy(to + head_len, plain, len);
        mqe_ws_mask(to + head_len, len, mask, 0);
        c->wire_len += head_len + len;
        c->wire_bytes += head_len + len;
        map_tx(c, plain_start + len, c->wire_bytes);
    } else {  /* records of at most 16 KiB, the frame's header in the first */
        uint8_t record[TLS_RECORD_BYTES];
        size_t done = 0;
        int first = 1;
        while (first || done < len) {
            size_t at = 0;
            if (first) {
                memcpy(record, head, head_len);
                at = head_len;
            }
            size_t take = len - done < TLS_RECORD_BYTES - at ? len - done : TLS_RECORD_BYTES - at;
            memcpy(record + at, plain + done, take);
            if (c->ws)
                mqe_ws_mask(record + at, take, mask, done);
            if (mqe_tls_write(e, c, record, at + take) != 0)
                return -1;
            done += take;
            first = 0;
            map_tx(c, plain_start + done, c->wire_bytes);
        }
    }
    c->out_head = c->out_len;  /* written into wire; out_len stays until wire is sent */
    return 0;
}

/* A broker that refuses (a TLS alert, a WebSocket close) often resets the connection
 * right after: what it said before is still in the socket, and names the reason better
 * than the reset does. */
static void read_last_words(mqe_engine *e, mqe_client *c) {
    for (int reads = 0; reads < 4 && !c->dead; reads++) {
        ssize_t n = recv(c->fd, e->scratch, MQE_RECEIVE_BUFFER, MSG_DONTWAIT);
        if (n <= 0)
            return;
        mqe_layers_receive(e, c, e->scratch, (size_t)n, mqe_now_ns(), MQE_NO_TIME, 0);
    }
}

int64_t mqe_layers_flush(mqe_engine *e, mqe_client *c) {
    int64_t t = MQE_NO_TIME;
    if (c->fd < 0 || c->dead)
        return t;
    for (;;) {
        if (c->wire_head == c->wire_len) {
            c->wire_head = c->wire_len = 0;
            if (c->out_head == c->out_len)
                c->out_head = c->out_len = 0;
            /* MQTT (CONNECT first) waits for the handshakes */
            if (c->out_len == 0 || c->stage != MQE_STAGE_READY) {
                mqe_watch_out(e, c, 0);
                return t;
            }
            if (encode(e, c) != 0)
                return t;
        }
        ssize_t sent = send(c->fd, c->wire + c->wire_head, c->wire_len - c->wire_head,
                            MSG_NOSIGNAL | MSG_DONTWAIT);
        t = mqe_now_ns();
        if (sent < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                int error = errno;
                read_last_words(e, c);
                mqe_client_fail(e, c, "send failed: [Errno %d] %s", error, strerror(error));
                return t;
            }
            sent = 0;
        }
        c->last_sent_ns = t;
        c->wire_head += (size_t)sent;
        if (c->wire_head < c->wire_len) {
            mqe_watch_out(e, c, 1);
            return t;
        }
    }
}

/* -- the handshakes --------------------------------------------------------------------- */

static void ready(mqe_engine *e, mqe_client *c) {
    c->stage = MQE_STAGE_READY;
    c->t_mqtt_sent_ns = mqe_layers_flush(e, c);  /* the CONNECT queued at connect */
}

static int send_upgrade(mqe_engine *e, mqe_client *c) {
    char request[1024];
    const char *host = c->server_name ? c->server_name : c->host;
    size_t n = mqe_ws_request(request, sizeof request, host, c->port, c->ws_path, c->ws_key);
    if (n == 0) {
        mqe_client_fail(e, c, "WebSocket path '%.200s' is too long for the upgrade request",
                        c->ws_path);
        return -1;
    }
    c->stage = MQE_STAGE_UPGRADE;
    return to_wire(e, c, (const uint8_t *)request, n);
}

int mqe_layers_start(mqe_engine *e, mqe_client *c) {
    if (c->ws) {
        uint8_t random[16 + 8];
        if (getrandom(random, sizeof random, 0) != (ssize_t)sizeof random) {
            mqe_client_fail(e, c, "getrandom failed: [Errno %d] %s", errno, strerror(errno));
            return -1;
        }
        mqe_ws_key(random, c->ws_key);
        memcpy(&c->ws_mask_state, random + 16, 8);
        c->ws_mask_state |= 1;  /* xorshift never leaves 0 */
    }
    if (c->tls)
        return mqe_tls_start(e, c);
    return send_upgrade(e, c);
}

static void tls_done(mqe_engine *e, mqe_client *c) {
    c->t_tls_ns = c->rx_t_user;
    if (c->ws) {
        if (send_upgrade(e, c) == 0)
            mqe_layers_flush(e, c);
    } else {
        ready(e, c);
    }
}

/* -- receiving -------------------------------------------------------------------------- */

static void failed_ws(mqe_engine *e, mqe_client *c, const char *what, const char *detail) {
    mqe_client_fail(e, c, "%s broker %s:%d%s: %s", what, c->host, c->port,
                    c->ws_path ? c->ws_path : "", detail);
}

/* MQTT bytes of a data frame into `in`, as many as `in` and the tables take. */
static size_t take_payload(mqe_engine *e, mqe_client *c, const uint8_t *from, size_t avail,
                           int may_hold) {
    if (c->in_cap - c->in_end < MQE_COMPACT_BELOW && mqe_make_room(e, c) != 0)
        return 0;
    size_t take = avail < c->ws_payload_left ? avail : (size_t)c->ws_payload_left;
    if (take > c->in_cap - c->in_end)
        take = c->in_cap - c->in_end;
    if (may_hold) {
        size_t room = mqe_table_room_bytes(e);
        if (take > room)
            take = room;
    }
    memcpy(c->in + c->in_end, from, take);
    c->in_end += take;
    c->ws_payload_left -= take;
    mqe_frame(e, c, c->rx_t_user, c->rx_t_kernel);
    return take;
}

/* A control frame, whole in hand: ping answered, close answered and the client failed. */
static void control_frame(mqe_engine *e, mqe_client *c, int opcode, const uint8_t *payload,
                          size_t len) {
    if (opcode == MQE_WS_PING) {
        send_control(e, c, MQE_WS_PONG, payload, len);
    } else if (opcode == MQE_WS_CLOSE) {
        unsigned code = len >= 2 ? (unsigned)(payload[0] << 8 | payload[1]) : 1005;
        /* the close is answered (RFC 6455 section 5.5.1) before the client fails */
        send_control(e, c, MQE_WS_CLOSE, payload, len >= 2 ? 2 : 0);
        mqe_layers_flush(e, c);
        char reason[128];
        size_t n = len > 2 ? len - 2 : 0;
        for (size_t i = 0; i < n && i < sizeof reason - 1; i++)
            reason[i] = payload[2 + i] >= 0x20 && payload[2 + i] < 0x7F ? (char)payload[2 + i]
                                                                         : '?';
        reason[n < sizeof reason - 1 ? n : sizeof reason - 1] = 0;
        char detail[192];
        snprintf(detail, sizeof detail, "close code %u%s%s%s", code, n ? " (" : "", reason,
                 n ? ")" : "");
        failed_ws(e, c, "WebSocket closed by", detail);
    }
}

/* Decode ws_in: the upgrade answer, then frames. 0: all complete frames decoded; 1: held
 * for a drain; -1: the client failed. */
static int ws_decode(mqe_engine *e, mqe_client *c, int may_hold) {
    size_t at = 0;
    int held = 0;
    char error[MQE_WS_ERROR_CHARS];
    while (!c->dead && at < c->ws_in_len) {
        const uint8_t *here = c->ws_in + at;
        size_t avail = c->ws_in_len - at;
        if (c->stage == MQE_STAGE_UPGRADE) {
            long n = mqe_ws_check_response(here, avail, c->ws_key, error);
            if (n == 0)
                break;
            if (n < 0) {
                failed_ws(e, c, "WebSocket upgrade to", error);
                break;
            }
            at += (size_t)n;
            c->t_ws_ns = c->rx_t_user;
            ready(e, c);
            continue;
        }
        if (c->ws_payload_left) {
            size_t took = take_payload(e, c, here, avail, may_hold);
            if (took == 0 && !c->dead) {
                held = 1;
                break;
            }
            at += took;
            continue;
        }
        mqe_ws_header h;
        long n = mqe_ws_parse_header(here, avail, 1, &h, error);
        if (n == 0)
            break;
        if (n < 0) {
            failed_ws(e, c, "malformed WebSocket frame from", error);
            break;
        }
        if (h.opcode >= MQE_WS_CLOSE) {
            if (avail - (size_t)n < h.payload_len)
                break;  /* a control frame is acted on whole (125 bytes at most) */
            at += (size_t)n + h.payload_len;
            control_frame(e, c, h.opcode, here + n, (size_t)h.payload_len);
            continue;
        }
        /* binary or continuation: MQTT bytes, appended to the stream (section 5.4) */
        if ((h.opcode == MQE_WS_BINARY) == c->ws_in_message) {
            failed_ws(e, c, "malformed WebSocket frame from",
                      h.opcode == MQE_WS_BINARY
                          ? "a binary frame inside a fragmented message (RFC 6455 section 5.4)"
                          : "a continuation frame with no message open (RFC 6455 section 5.4)");
            break;
        }
        c->ws_in_message = !h.fin;
        c->ws_payload_left = h.payload_len;
        at += (size_t)n;
    }
    if (at) {
        memmove(c->ws_in, c->ws_in + at, c->ws_in_len - at);
        c->ws_in_len -= at;
    }
    return c->dead ? -1 : held;
}

/* Decode what the client holds (TLS records, ws_in) into `in`: as mqe_layers_receive. */
static int decode(mqe_engine *e, mqe_client *c, int may_hold) {
    while (!c->dead) {
        if (!c->tls)
            return ws_decode(e, c, may_hold);
        if (c->stage == MQE_STAGE_TLS) {
            int r = mqe_tls_handshake(e, c);
            if (r <= 0)
                return r;
            tls_done(e, c);
            continue;
        }
        if (c->ws) {
            int r = ws_decode(e, c, may_hold);
            if (r != 0)
                return r;
            if (ws_in_reserve(e, c, WS_READ_ROOM) != 0)
                return -1;
            long n = mqe_tls_read(e, c, c->ws_in + c->ws_in_len, c->ws_in_cap - c->ws_in_len);
            if (n <= 0)
                return (int)n;
            c->ws_in_len += (size_t)n;
            continue;
        }
        if (c->in_cap - c->in_end < MQE_COMPACT_BELOW && mqe_make_room(e, c) != 0)
            return -1;
        size_t room = c->in_cap - c->in_end;
        if (may_hold) {
            size_t tables = mqe_table_room_bytes(e);
            if (tables == 0)
                return 1;
            if (room > tables)
                room = tables;
        }
        long n = mqe_tls_read(e, c, c->in + c->in_end, room);
        if (n <= 0)
            return (int)n;
        c->in_end += (size_t)n;
        mqe_frame(e, c, c->rx_t_user, c->rx_t_kernel);
    }
    return -1;
}

/* Bookkeeping of held clients: the loop resumes them before it waits. */
static int settle(mqe_engine *e, mqe_client *c, int r) {
    if (r == 1) {
        if (!c->held) {
            c->held = 1;
            e->n_held++;
        }
        e->need_drain = 1;
    } else if (c->held) {
        c->held = 0;
        e->n_held--;
    }
    return r < 0 ? -1 : 0;
}

int mqe_layers_receive(mqe_engine *e, mqe_client *c, const uint8_t *data, size_t len,
                       int64_t t_user, int64_t t_kernel, int may_hold) {
    if (c->dead)
        return -1;
    c->rx_t_user = t_user;
    c->rx_t_kernel = t_kernel;
    if (c->tls) {
        if (c->ssl == NULL) {
            mqe_client_fail(e, c, "TLS bytes before the TLS session started");
            return -1;
        }
        if (mqe_tls_absorb(c, data, len) != 0) {
            mqe_client_fail(e, c, "out of memory for %zu TLS bytes", len);
            return -1;
        }
    } else {
        if (ws_in_reserve(e, c, len) != 0)
            return -1;
        memcpy(c->ws_in + c->ws_in_len, data, len);
        c->ws_in_len += len;
    }
    return settle(e, c, decode(e, c, may_hold));
}

int mqe_layers_resume(mqe_engine *e, mqe_client *c) {
    return settle(e, c, c->dead ? -1 : decode(e, c, 1));
}

void mqe_layers_closed(mqe_engine *e, mqe_client *c, const char *how) {
    if (c->stage == MQE_STAGE_TLS)
        mqe_client_fail(e, c, "TLS handshake with broker %s:%d failed: the broker %s (does "
                        "the port speak TLS?)", c->host, c->port, how);
    else if (c->stage == MQE_STAGE_UPGRADE)
        failed_ws(e, c, "WebSocket upgrade to", how[0] == 'c'
                  ? "the broker closed the connection (does the port speak WebSocket?)"
                  : how);
    else
        mqe_client_fail(e, c, "broker %s", how);
}

void mqe_layers_close(mqe_engine *e, mqe_client *c) {
    if (c->dead || c->fd < 0 || c->stage != MQE_STAGE_READY)
        return;
    if (c->ws)
        send_control(e, c, MQE_WS_CLOSE, (const uint8_t *)"\x03\xe8", 2);  /* 1000: normal */
    if (c->tls)
        mqe_tls_shutdown(e, c);
    mqe_layers_flush(e, c);
}

void mqe_layers_free(mqe_client *c) {
    mqe_tls_free(c);
    free(c->server_name);
    free(c->ws_path);
    free(c->ws_in);
    free(c->wire);
}
