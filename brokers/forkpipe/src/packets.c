/* What a client process does with each MQTT packet.
 *
 * CONNECT must come first (anything else closes the connection). A PUBLISH is written
 * by this process into every matching pipe (topicfs_publish); a SUBSCRIBE creates a
 * pipe and forks the process that serves it; UNSUBSCRIBE deletes the pipe; DISCONNECT
 * or a dropped connection deletes the client's directory. A protocol violation closes
 * this connection only.
 *
 * What the broker does with the parts of MQTT 3.1.1 it does not implement:
 * - QoS: subscriptions are granted QoS 0. A QoS 1 PUBLISH is answered with PUBACK and a
 *   QoS 2 PUBLISH with PUBREC (then PUBREL -> PUBCOMP), so publishers complete their
 *   flows; the message goes to subscribers at QoS 0, once per matching subscription.
 * - Retain: the flag is accepted and ignored; nothing is stored, and subscribers get
 *   the message with retain 0.
 * - Will: a will in CONNECT is validated and then dropped; it is never published.
 * - Sessions: clean session 0 is accepted, but nothing survives the connection
 *   (CONNACK says session present 0). Two clients with one client id are not
 *   disconnected from each other.
 * - Username and password are accepted and not checked.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mqtt.h"
#include "proc.h"
#include "sendlock.h"
#include "session.h"
#include "subscription.h"
#include "topicfs.h"

bool close_because(struct client *c, bool violation, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(c->reason, sizeof c->reason, fmt, args);
    va_end(args);
    c->violation = violation;
    return false;
}

static bool ensure_out(struct client *c, size_t needed) {
    if (needed <= c->out_cap)
        return true;
    uint8_t *grown = realloc(c->out, needed);
    if (grown == NULL)
        return false;
    c->out = grown;
    c->out_cap = needed;
    return true;
}

static bool send_or_close(struct client *c, const uint8_t *packet, size_t len) {
    if (send_packet(c->sock, packet, len))
        return true;
    return close_because(c, false, "sending failed: %s",
                         errno == EAGAIN ? "client read nothing for send_timeout_ms"
                                         : strerror(errno));
}

static bool send_ack(struct client *c, uint8_t type_and_flags, uint16_t packet_id) {
    uint8_t ack[4] = {type_and_flags, 2, (uint8_t)(packet_id >> 8), (uint8_t)packet_id};
    return send_or_close(c, ack, sizeof ack);
}

static bool send_connack(struct client *c, uint8_t code) {
    uint8_t connack[4] = {MQTT_CONNACK << 4, 2, 0, code};
    return send_or_close(c, connack, sizeof connack);
}

static void remember_id(struct client *c, const uint8_t *id, size_t len) {
    size_t n = len < CLIENT_ID_SHOWN ? len : CLIENT_ID_SHOWN;
    for (size_t i = 0; i < n; i++)
        c->id[i] = id[i] >= 0x20 && id[i] < 0x7F ? (char)id[i] : '?';
    c->id[n] = '\0';
}

/* -- packets ------------------------------------------------------------------------ */

static bool handle_connect(struct client *c, const uint8_t *body, size_t len) {
    struct mqtt_cursor cur = {body, len};
    const uint8_t *name, *id, *field;
    size_t name_len, id_len, field_len;
    uint8_t level, flags;
    uint16_t keepalive;
    if (!mqtt_read_prefixed(&cur, &name, &name_len) || !mqtt_read_u8(&cur, &level) ||
        !mqtt_read_u8(&cur, &flags) || !mqtt_read_u16(&cur, &keepalive))
        return close_because(c, true, "truncated CONNECT");
    if (name_len != 4 || memcmp(name, "MQTT", 4) != 0) {
        if (name_len == 6 && memcmp(name, "MQIsdp", 6) == 0)
            send_connack(c, 0x01); /* MQTT 3.1: unacceptable protocol version */
        return close_because(c, true, "CONNECT for a protocol other than MQTT 3.1.1");
    }
    if (level != 4) {
        send_connack(c, 0x01);
        return close_because(c, true, "CONNECT with protocol level %u, not 4 (3.1.1)", level);
    }
    bool clean = flags & 0x02, will = flags & 0x04, username = flags & 0x80,
         password = flags & 0x40;
    unsigned will_qos = (flags >> 3) & 3u;
    if ((flags & 0x01) || will_qos == 3 || (!will && (flags & 0x38)) || (password && !username))
        return close_because(c, true, "CONNECT with invalid flags 0x%02x", flags);
    if (!mqtt_read_prefixed(&cur, &id, &id_len) || !mqtt_utf8_valid(id, id_len))
        return close_because(c, true, "CONNECT with a malformed client id");
    remember_id(c, id, id_len);
    if (will && (!mqtt_read_prefixed(&cur, &field, &field_len) ||
                 !mqtt_topic_name_valid(field, field_len) ||
                 !mqtt_read_prefixed(&cur, &field, &field_len)))
        return close_because(c, true, "CONNECT with a malformed will");
    if (username && (!mqtt_read_prefixed(&cur, &field, &field_len) ||
                     !mqtt_utf8_valid(field, field_len)))
        return close_because(c, true, "CONNECT with a malformed user name");
    if (password && !mqtt_read_prefixed(&cur, &field, &field_len))
        return close_because(c, true, "CONNECT with a malformed password");
    if (cur.left != 0)
        return close_because(c, true, "CONNECT with %zu bytes after its payload", cur.left);
    if (id_len == 0 && !clean) {
        send_connack(c, 0x02); /* identifier rejected: no id needs a clean session */
        return close_because(c, true, "empty client id without clean session");
    }
    if (!topicfs_create_client_dir(c->pid)) {
        send_connack(c, 0x03); /* server unavailable */
        return close_because(c, false, "cannot create the client directory");
    }
    c->dir_created = true;
    c->connected = true;
    c->keepalive_s = keepalive;
    if (g_config.verbose)
        log_line("client '%s' connected (keep-alive %u s)", c->id, keepalive);
    return send_connack(c, 0x00);
}

static bool handle_publish(struct client *c, uint8_t flags, const uint8_t *body, size_t len) {
    unsigned qos = (flags >> 1) & 3u;
    if (qos == 3 || (qos == 0 && (flags & 0x08)))
        return close_because(c, true, "PUBLISH with invalid flags 0x%x", flags);
    struct mqtt_cursor cur = {body, len};
    const uint8_t *topic;
    size_t topic_len;
    uint16_t packet_id = 0;
    if (!mqtt_read_prefixed(&cur, &topic, &topic_len) ||
        !mqtt_topic_name_valid(topic, topic_len))
        return close_because(c, true, "PUBLISH with a malformed topic name");
    if (qos > 0 && (!mqtt_read_u16(&cur, &packet_id) || packet_id == 0))
        return close_because(c, true, "PUBLISH at QoS %u without a packet identifier", qos);

    /* Subscribers get it at QoS 0, retain 0: fixed header, topic, payload. */
    size_t remaining = 2 + topic_len + cur.left;
    if (!ensure_out(c, MQTT_MAX_FIXED_HEADER + remaining))
        return close_because(c, false, "out of memory for a %zu-byte PUBLISH", remaining);
    size_t n = mqtt_fixed_header(c->out, MQTT_PUBLISH << 4, remaining);
    c->out[n++] = (uint8_t)(topic_len >> 8);
    c->out[n++] = (uint8_t)topic_len;
    memcpy(c->out + n, topic, topic_len);
    memcpy(c->out + n + topic_len, cur.at, cur.left);
    topicfs_publish(topic, topic_len, c->out, n + topic_len + cur.left);

    if (qos == 1)
        return send_ack(c, MQTT_PUBACK << 4, packet_id);
    if (qos == 2)
        return send_ack(c, MQTT_PUBREC << 4, packet_id);
    return true;
}

static bool handle_subscribe(struct client *c, const uint8_t *body, size_t len) {
    struct mqtt_cursor cur = {body, len};
    uint16_t packet_id;
    if (!mqtt_read_u16(&cur, &packet_id) || packet_id == 0 || cur.left == 0)
        return close_because(c, true, "SUBSCRIBE without packet identifier or filters");
    /* SUBACK: header, packet id, one code per filter (a filter takes >= 3 bytes). */
    if (!ensure_out(c, MQTT_MAX_FIXED_HEADER + 2 + len / 3))
        return close_because(c, false, "out of memory for a SUBACK");
    uint8_t *codes = c->out + MQTT_MAX_FIXED_HEADER + 2;
    size_t n_codes = 0;
    while (cur.left > 0) {
        const uint8_t *filter;
        size_t filter_len;
        uint8_t requested;
        if (!mqtt_read_prefixed(&cur, &filter, &filter_len) || !mqtt_read_u8(&cur, &requested))
            return close_because(c, true, "truncated SUBSCRIBE");
        if (requested > 2)
            return close_because(c, true, "SUBSCRIBE with requested QoS byte 0x%02x", requested);
        if (!mqtt_topic_filter_valid(filter, filter_len))
            return close_because(c, true, "SUBSCRIBE with an invalid topic filter");
        char name[NAME_MAX + 1];
        uint8_t code = MQTT_SUBACK_FAILURE;
        pid_t pid;
        if (!topicfs_encode(filter, filter_len, name)) {
            log_line("client '%s': topic filter of %zu bytes is too long to be a pipe name",
                     c->id, filter_len);
        } else if (pid_list_reserve(&c->subscriptions)) {
            switch (subscription_start(c->sock, c->dir, name, &pid)) {
            case SUBSCRIPTION_STARTED:
                pid_list_push(&c->subscriptions, pid);
                code = 0x00;
                break;
            case SUBSCRIPTION_EXISTED:
                code = 0x00;
                break;
            case SUBSCRIPTION_FAILED:
                break;
            }
        }
        codes[n_codes++] = code; /* granted QoS 0 whatever was asked for */
    }
    /* Header in front of the codes, so the SUBACK goes out with one send. */
    uint8_t header[MQTT_MAX_FIXED_HEADER];
    size_t h = mqtt_fixed_header(header, MQTT_SUBACK << 4, 2 + n_codes);
    uint8_t *start = codes - 2 - h;
    memcpy(start, header, h);
    start[h] = (uint8_t)(packet_id >> 8);
    start[h + 1] = (uint8_t)packet_id;
    return send_or_close(c, start, h + 2 + n_codes);
}

static bool handle_unsubscribe(struct client *c, const uint8_t *body, size_t len) {
    struct mqtt_cursor cur = {body, len};
    uint16_t packet_id;
    if (!mqtt_read_u16(&cur, &packet_id) || packet_id == 0 || cur.left == 0)
        return close_because(c, true, "UNSUBSCRIBE without packet identifier or filters");
    while (cur.left > 0) {
        const uint8_t *filter;
        size_t filter_len;
        if (!mqtt_read_prefixed(&cur, &filter, &filter_len) ||
            !mqtt_topic_filter_valid(filter, filter_len))
            return close_because(c, true, "UNSUBSCRIBE with an invalid topic filter");
        char name[NAME_MAX + 1], path[PATH_MAX];
        /* Deleting the pipe is the whole unsubscription: its process notices and ends. */
        if (topicfs_encode(filter, filter_len, name) &&
            snprintf(path, sizeof path, "%s/%s", c->dir, name) < (int)sizeof path)
            unlink(path);
    }
    return send_ack(c, MQTT_UNSUBACK << 4, packet_id);
}

bool handle_packet(struct client *c, uint8_t first, const uint8_t *body, size_t len) {
    unsigned type = first >> 4, flags = first & 0x0Fu;
    if (!c->connected && type != MQTT_CONNECT)
        return close_because(c, true, "first packet is %s, not CONNECT", mqtt_packet_name(type));
    /* Fixed flags of every type but PUBLISH (spec 2.2.2). */
    unsigned expected_flags =
        (type == MQTT_PUBREL || type == MQTT_SUBSCRIBE || type == MQTT_UNSUBSCRIBE) ? 2u : 0u;
    if (type != MQTT_PUBLISH && flags != expected_flags)
        return close_because(c, true, "%s with flags 0x%x", mqtt_packet_name(type), flags);
    switch (type) {
    case MQTT_CONNECT:
        if (c->connected)
            return close_because(c, true, "second CONNECT");
        return handle_connect(c, body, len);
    case MQTT_PUBLISH:
        return handle_publish(c, (uint8_t)flags, body, len);
    case MQTT_PUBREL:
        if (len != 2)
            return close_because(c, true, "PUBREL of %zu bytes", len);
        return send_ack(c, MQTT_PUBCOMP << 4, (uint16_t)(body[0] << 8 | body[1]));
    case MQTT_PUBACK:
    case MQTT_PUBREC:
    case MQTT_PUBCOMP:
        /* Acks for QoS 1/2 messages this broker never sends: harmless, ignored. */
        if (len != 2)
            return close_because(c, true, "%s of %zu bytes", mqtt_packet_name(type), len);
        return true;
    case MQTT_SUBSCRIBE:
        return handle_subscribe(c, body, len);
    case MQTT_UNSUBSCRIBE:
        return handle_unsubscribe(c, body, len);
    case MQTT_PINGREQ: {
        if (len != 0)
            return close_because(c, true, "PINGREQ with a body");
        static const uint8_t pingresp[2] = {MQTT_PINGRESP << 4, 0};
        return send_or_close(c, pingresp, sizeof pingresp);
    }
    case MQTT_DISCONNECT:
        if (len != 0)
            return close_because(c, true, "DISCONNECT with a body");
        return close_because(c, false, "DISCONNECT");
    default:
        return close_because(c, true, "%s, which clients do not send", mqtt_packet_name(type));
    }
}
