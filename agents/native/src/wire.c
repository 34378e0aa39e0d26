/* MQTT 3.1.1 framing for the engine and the packets a client sends in both versions
 * (see wire.h; MQTT 5's decoding is in wire5.c). */
#include "wire.h"

#include <stdio.h>
#include <string.h>

static const char *const TYPE_NAMES[16] = {
    "reserved type 0", "CONNECT", "CONNACK", "PUBLISH", "PUBACK", "PUBREC", "PUBREL",
    "PUBCOMP", "SUBSCRIBE", "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "PINGREQ", "PINGRESP",
    "DISCONNECT", "reserved type 15",
};

const char *mqe_type_name(int type) { return TYPE_NAMES[type & 0x0F]; }

static long malformed(char *error, const char *what) {
    snprintf(error, MQE_ERROR_CHARS, "%s", what);
    return -1;
}

long mqe_parse(const uint8_t *buf, size_t len, mqe_packet *out, char *error) {
    if (len < 2)
        return 0;
    size_t remaining = 0, at = 1;
    unsigned shift = 0;
    for (;;) {
        if (at >= len)
            return 0;
        uint8_t byte = buf[at++];
        remaining |= (size_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80))
            break;
        shift += 7;
        if (at - 1 >= 4)
            return malformed(error, "remaining length runs past four bytes (section 2.2.3)");
    }
    if (remaining > len - at)
        return 0;
    const uint8_t *body = buf + at;
    int type = buf[0] >> 4, flags = buf[0] & 0x0F;
    memset(out, 0, sizeof *out);
    out->type = type;
    out->flags = flags;
    out->body = body;
    out->body_len = remaining;
    if (type == MQE_PUBLISH) {  /* the same in both versions up to the packet id */
        out->qos = (flags >> 1) & 0x03;
        out->dup = flags >> 3;
        if (out->qos == 3)
            return malformed(error, "PUBLISH QoS 3 is not allowed (section 3.3.1.2)");
        size_t need = 2 + (out->qos ? 2u : 0u);
        if (remaining < 2)
            return malformed(error, "PUBLISH shorter than its topic name");
        size_t topic_len = ((size_t)body[0] << 8) | body[1];
        if (topic_len + need > remaining)
            return malformed(error, "PUBLISH shorter than its topic name");
        out->topic = body + 2;
        out->topic_len = topic_len;
        size_t pos = 2 + topic_len;
        if (out->qos) {
            out->packet_id = (uint16_t)((body[pos] << 8) | body[pos + 1]);
            if (out->packet_id == 0)
                return malformed(error, "PUBLISH with packet id 0 (section 2.3.1)");
            pos += 2;
        }
        out->payload = body + pos;
        out->payload_len = remaining - pos;
    }
    return (long)(at + remaining);
}

/* MQTT 3.1.1: everything but PUBLISH (framed already) is checked here. */
static int decode_311(mqe_packet *p, char *error) {
    const uint8_t *body = p->body;
    size_t remaining = p->body_len;
    int type = p->type, flags = p->flags;
    switch (type) {
    case MQE_PUBLISH:
        break;
    case MQE_CONNACK:
        if (flags || remaining != 2)
            return (int)malformed(error, "CONNACK is not 2 bytes with flags 0 (section 3.2)");
        if (body[0] & 0xFE)
            return (int)malformed(error, "CONNACK acknowledge flags reserved bits set "
                                  "(section 3.2.2.1)");
        p->return_code = body[1];
        break;
    case MQE_PUBACK: case MQE_PUBREC: case MQE_PUBREL: case MQE_PUBCOMP:
        if (remaining != 2 || flags != (type == MQE_PUBREL ? 2 : 0))
            return (int)malformed(error, type == MQE_PUBREL
                                  ? "PUBREL is not 2 bytes with flags 2 (section 3.6.1)"
                                  : "acknowledgement is not 2 bytes with flags 0 (section 3.4)");
        p->packet_id = (uint16_t)((body[0] << 8) | body[1]);
        break;
    case MQE_SUBACK:
        if (flags || remaining < 3)
            return (int)malformed(error, "SUBACK without a packet id and a return code "
                                  "(section 3.9)");
        p->packet_id = (uint16_t)((body[0] << 8) | body[1]);
        p->payload = body + 2;
        p->payload_len = remaining - 2;
        for (size_t i = 0; i < p->payload_len; i++) {
            uint8_t code = p->payload[i];
            if (code > 2 && code != 0x80)
                return (int)malformed(error, "SUBACK return code not 0, 1, 2 or 0x80 "
                                      "(section 3.9.3)");
        }
        break;
    case MQE_PINGRESP:
        if (flags || remaining)
            return (int)malformed(error, "PINGRESP is not empty with flags 0 (section 3.13)");
        break;
    default:
        snprintf(error, MQE_ERROR_CHARS, "unexpected %s from the broker", mqe_type_name(type));
        return -1;
    }
    return 0;
}

int mqe_decode(mqe_packet *p, int level, mqe_connack_grants *grants, char *error) {
    return level == MQE_MQTT_5 ? mqe_decode_5(p, grants, error) : decode_311(p, error);
}

size_t mqe_varint_size(size_t remaining) {
    return remaining < 128 ? 1 : remaining < 16384 ? 2 : remaining < 2097152 ? 3 : 4;
}

size_t mqe_put_varint(uint8_t *to, size_t remaining) {
    size_t n = 0;
    do {
        uint8_t byte = remaining & 0x7F;
        remaining >>= 7;
        to[n++] = byte | (remaining ? 0x80 : 0);
    } while (remaining);
    return n;
}

static size_t put_string(uint8_t *to, const char *text, size_t len) {
    to[0] = (uint8_t)(len >> 8);
    to[1] = (uint8_t)len;
    memcpy(to + 2, text, len);
    return len + 2;
}

static size_t connect_remaining(const mqe_connect_fields *f) {
    /* MQTT 5: a property length, and the Session Expiry Interval (5 bytes) if kept */
    size_t properties = f->level != MQE_MQTT_5 ? 0u : f->keep_session ? 6u : 1u;
    return 10 + properties + 2 + f->client_id_len
           + (f->username ? 2 + f->username_len : 0) + (f->password ? 2 + f->password_len : 0);
}

size_t mqe_connect_size(const mqe_connect_fields *f) {
    size_t remaining = connect_remaining(f);
    return 1 + mqe_varint_size(remaining) + remaining;
}

size_t mqe_encode_connect(uint8_t *to, const mqe_connect_fields *f) {
    static const uint8_t name[] = {0, 4, 'M', 'Q', 'T', 'T'};
    size_t n = 0;
    to[n++] = MQE_CONNECT << 4;
    n += mqe_put_varint(to + n, connect_remaining(f));
    memcpy(to + n, name, sizeof name);
    n += sizeof name;
    to[n++] = (uint8_t)f->level;
    /* clean session (3.1.1) / clean start (5); the user name and password flags */
    to[n++] = (uint8_t)((f->keep_session ? 0 : 0x02) | (f->username ? 0x80 : 0)
                        | (f->password ? 0x40 : 0));
    to[n++] = (uint8_t)(f->keepalive_s >> 8);
    to[n++] = (uint8_t)f->keepalive_s;
    if (f->level == MQE_MQTT_5 && f->keep_session) {  /* the session outlives the connection */
        to[n++] = 5;
        to[n++] = 0x11;  /* Session Expiry Interval (section 3.1.2.11.2) */
        for (int shift = 24; shift >= 0; shift -= 8)
            to[n++] = (uint8_t)(f->session_expiry_s >> shift);
    } else if (f->level == MQE_MQTT_5) {
        to[n++] = 0;  /* no property: every default is what a measurement wants */
    }
    n += put_string(to + n, f->client_id, f->client_id_len);
    if (f->username)
        n += put_string(to + n, f->username, f->username_len);
    if (f->password)
        n += put_string(to + n, (const char *)f->password, f->password_len);
    return n;
}

size_t mqe_subscribe_size(size_t topic_len, int level) {
    size_t remaining = 2 + (level == MQE_MQTT_5 ? 1u : 0u) + 2 + topic_len + 1;
    return 1 + mqe_varint_size(remaining) + remaining;
}

size_t mqe_encode_subscribe(uint8_t *to, uint16_t packet_id, const char *topic,
                            size_t topic_len, int qos, int level) {
    size_t n = 0, v5 = level == MQE_MQTT_5;
    to[n++] = (MQE_SUBSCRIBE << 4) | 0x02;
    n += mqe_put_varint(to + n, 2 + v5 + 2 + topic_len + 1);
    to[n++] = (uint8_t)(packet_id >> 8);
    to[n++] = (uint8_t)packet_id;
    if (v5)
        to[n++] = 0;  /* property length */
    n += put_string(to + n, topic, topic_len);
    /* 3.1.1: the requested QoS; 5: the options byte, whose other fields (No Local, Retain
     * As Published, Retain Handling) are 0 */
    to[n++] = (uint8_t)qos;
    return n;
}

size_t mqe_publish_prefix(uint8_t *to, const char *topic, size_t topic_len, int qos,
                          size_t payload_len, int level, size_t *packet_id_at) {
    size_t n = 0, id = qos ? 2u : 0u, v5 = level == MQE_MQTT_5;
    to[n++] = (uint8_t)((MQE_PUBLISH << 4) | (qos << 1));
    n += mqe_put_varint(to + n, 2 + topic_len + id + v5 + payload_len);
    n += put_string(to + n, topic, topic_len);
    if (packet_id_at)
        *packet_id_at = 0;
    if (!v5)
        return n;
    if (id) {  /* the packet id goes before the properties: its slot is in the prefix */
        if (packet_id_at)
            *packet_id_at = n;
        to[n++] = 0;
        to[n++] = 0;
    }
    to[n++] = 0;  /* property length */
    return n;
}

size_t mqe_encode_ack(uint8_t *to, int type, uint16_t packet_id) {
    to[0] = (uint8_t)((type << 4) | (type == MQE_PUBREL ? 0x02 : 0));
    to[1] = 2;
    to[2] = (uint8_t)(packet_id >> 8);
    to[3] = (uint8_t)packet_id;
    return 4;
}

static void put_le(uint8_t *to, uint64_t value, int bytes) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(to, &value, (size_t)bytes);  /* the host order is the payload's: one store */
#else
    for (int i = 0; i < bytes; i++)
        to[i] = (uint8_t)(value >> (8 * i));
#endif
}

static uint64_t get_le(const uint8_t *from, int bytes) {
    uint64_t value = 0;
    for (int i = 0; i < bytes; i++)
        value |= (uint64_t)from[i] << (8 * i);
    return value;
}

void mqe_encode_payload(uint8_t *to, size_t size, uint64_t seq, uint32_t publisher,
                        int64_t t_pub_ns, int64_t t_intended_ns) {
    memcpy(to, "MQB1", 4);
    put_le(to + 4, seq, 8);
    put_le(to + 12, publisher, 4);
    put_le(to + 16, (uint64_t)t_pub_ns, 8);
    put_le(to + 24, (uint64_t)t_intended_ns, 8);
    if (size > MQE_PAYLOAD_MIN)
        memset(to + MQE_PAYLOAD_MIN, 0, size - MQE_PAYLOAD_MIN);
}

int mqe_decode_payload(const uint8_t *p, size_t size, uint64_t *seq, uint32_t *publisher,
                       int64_t *t_pub_ns, int64_t *t_intended_ns) {
    if (size < MQE_PAYLOAD_MIN || memcmp(p, "MQB1", 4) != 0)
        return -1;
    *seq = get_le(p + 4, 8);
    *publisher = (uint32_t)get_le(p + 12, 4);
    *t_pub_ns = (int64_t)get_le(p + 16, 8);
    *t_intended_ns = (int64_t)get_le(p + 24, 8);
    return 0;
}
