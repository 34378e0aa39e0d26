/* MQTT-SN 1.2 codec for the engine (see sn.h). */
#include "sn.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *mqe_sn_type_name(int type) {
    switch (type) {
    case 0x00: return "ADVERTISE";
    case 0x01: return "SEARCHGW";
    case 0x02: return "GWINFO";
    case MQE_SN_CONNECT: return "CONNECT";
    case MQE_SN_CONNACK: return "CONNACK";
    case 0x06: return "WILLTOPICREQ";
    case 0x07: return "WILLTOPIC";
    case 0x08: return "WILLMSGREQ";
    case 0x09: return "WILLMSG";
    case MQE_SN_REGISTER: return "REGISTER";
    case MQE_SN_REGACK: return "REGACK";
    case MQE_SN_PUBLISH: return "PUBLISH";
    case MQE_SN_PUBACK: return "PUBACK";
    case 0x0E: return "PUBCOMP";
    case 0x0F: return "PUBREC";
    case 0x10: return "PUBREL";
    case MQE_SN_SUBSCRIBE: return "SUBSCRIBE";
    case MQE_SN_SUBACK: return "SUBACK";
    case 0x14: return "UNSUBSCRIBE";
    case 0x15: return "UNSUBACK";
    case MQE_SN_PINGREQ: return "PINGREQ";
    case MQE_SN_PINGRESP: return "PINGRESP";
    case MQE_SN_DISCONNECT: return "DISCONNECT";
    case 0x1A: return "WILLTOPICUPD";
    case 0x1B: return "WILLTOPICRESP";
    case 0x1C: return "WILLMSGUPD";
    case 0x1D: return "WILLMSGRESP";
    case 0xFE: return "ENCAPSULATED";
    default: return NULL;
    }
}

const char *mqe_sn_return_code_name(int code) {
    static const char *const NAMES[4] = {"accepted", "rejected: congestion",
                                         "rejected: invalid topic ID",
                                         "rejected: not supported"};
    return code >= 0 && code < 4 ? NAMES[code] : "reserved";
}

static int malformed(char *error, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int malformed(char *error, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(error, MQE_SN_ERROR_CHARS, fmt, args);
    va_end(args);
    return -1;
}

static uint16_t be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }

size_t mqe_sn_length(const uint8_t *buf, size_t len) {
    if (len < 1)
        return 0;
    if (buf[0] != 0x01)
        return buf[0] < 2 ? 0 : buf[0];
    return len < 3 ? 0 : be16(buf + 1);
}

/* A return code octet: 0x00-0x03 (section 5.3.10); -1 for a reserved one. */
static int return_code(const uint8_t *at, mqe_sn_packet *out, char *error, const char *what) {
    if (*at > 3) {
        snprintf(error, MQE_SN_ERROR_CHARS, "%s return code 0x%02x is reserved (section 5.3.10)",
                 what, *at);
        return -1;
    }
    out->return_code = *at;
    return 0;
}

/* 1 if `p` is well-formed UTF-8 (no overlong form, no surrogate, at most U+10FFFF): what
 * Python's decode("utf-8") accepts, as core/mqttsn.py asks of a topic name. */
static int utf8_ok(const uint8_t *p, size_t len) {
    for (size_t i = 0; i < len;) {
        uint8_t b = p[i];
        size_t more;
        uint32_t cp, least;
        if (b < 0x80) {
            i++;
            continue;
        } else if ((b & 0xE0) == 0xC0) {
            more = 1, cp = b & 0x1Fu, least = 0x80;
        } else if ((b & 0xF0) == 0xE0) {
            more = 2, cp = b & 0x0Fu, least = 0x800;
        } else if ((b & 0xF8) == 0xF0) {
            more = 3, cp = b & 0x07u, least = 0x10000;
        } else {
            return 0;
        }
        if (len - i <= more)
            return 0;
        for (size_t k = 1; k <= more; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (p[i + k] & 0x3Fu);
        }
        if (cp < least || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += more + 1;
    }
    return 1;
}

static int body_size(size_t got, size_t want, int exact, char *error, const char *what) {
    if (got < want || (exact && got != want)) {
        snprintf(error, MQE_SN_ERROR_CHARS, "%s: body of %zu octets, %s%zu expected", what,
                 got, exact ? "" : "at least ", want);
        return -1;
    }
    return 0;
}

int mqe_sn_parse(const uint8_t *buf, size_t len, mqe_sn_packet *out, char *error) {
    memset(out, 0, sizeof *out);
    if (len < 2)
        return malformed(error, "datagram of %u octets is shorter than a header (section 5.2)",
                         (unsigned)len);
    size_t header, length;
    if (buf[0] == 0x01) {
        if (len < 4)
            return malformed(error, "3-octet length field truncated (section 5.2.1)");
        length = be16(buf + 1);
        if (length < 256)
            return malformed(error, "3-octet length form used for %u octets; it is for "
                             "packets longer than 255 (section 5.2.1)", (unsigned)length);
        header = 3;
    } else {
        length = buf[0];
        header = 1;
        if (length < 2)
            return malformed(error, "length field %u is shorter than a header (section 5.2.1)",
                             (unsigned)length);
    }
    if (length != len)
        return malformed(error, "length field says %u octets, the datagram has %u",
                         (unsigned)length, (unsigned)len);
    int type = buf[header];
    const uint8_t *body = buf + header + 1;
    size_t size = len - header - 1;
    out->type = type;
    switch (type) {
    case MQE_SN_CONNACK:
        if (body_size(size, 1, 1, error, "CONNACK"))
            return -1;
        return return_code(body, out, error, "CONNACK");
    case MQE_SN_REGISTER:
        if (body_size(size, 5, 0, error, "REGISTER"))
            return -1;
        out->topic_id = be16(body);
        out->msg_id = be16(body + 2);
        out->data = body + 4;
        out->data_len = size - 4;
        for (size_t i = 0; i < out->data_len; i++)
            if (out->data[i] == '+' || out->data[i] == '#' || out->data[i] == 0) {
                snprintf(error, MQE_SN_ERROR_CHARS, "REGISTER topic name holds %s at octet "
                         "%zu (section 5.4.10)",
                         out->data[i] ? "a wildcard character" : "U+0000", i);
                return -1;
            }
        if (!utf8_ok(out->data, out->data_len))
            return malformed(error, "REGISTER topic name is not valid UTF-8 (section 5.3.12)");
        return 0;
    case MQE_SN_REGACK:
    case MQE_SN_PUBACK:
        if (body_size(size, 5, 1, error, mqe_sn_type_name(type)))
            return -1;
        out->topic_id = be16(body);
        out->msg_id = be16(body + 2);
        return return_code(body + 4, out, error, mqe_sn_type_name(type));
    case MQE_SN_PUBLISH: {
        if (body_size(size, 5, 0, error, "PUBLISH"))
            return -1;
        uint8_t flags = body[0];
        if (flags & ~(MQE_SN_DUP | MQE_SN_QOS_MASK | MQE_SN_RETAIN | MQE_SN_ID_TYPE_MASK))
            return malformed(error, "PUBLISH: reserved flag bits set (0x%02x) (section 5.3.4)",
                             flags & 0x0Cu);
        out->id_type = flags & MQE_SN_ID_TYPE_MASK;
        if (out->id_type == 3)
            return malformed(error, "PUBLISH: topic id type 0b11 is reserved (section 5.3.4)");
        int qos_bits = (flags & MQE_SN_QOS_MASK) >> 5;
        out->qos = qos_bits == 3 ? -1 : qos_bits;
        out->topic_id = be16(body + 1);
        out->msg_id = be16(body + 3);
        out->data = body + 5;
        out->data_len = size - 5;
        if (out->id_type == MQE_SN_SHORT_NAME) {
            if ((body[1] | body[2]) & 0x80)
                return malformed(error, "PUBLISH: short topic name 0x%04x is not two ASCII "
                                 "characters (section 5.3.11)", out->topic_id);
        } else if (out->topic_id == 0x0000 || out->topic_id == 0xFFFF) {
            return malformed(error, "PUBLISH: topic id 0x%04x is reserved (section 5.3.11)",
                             out->topic_id);
        }
        if (out->qos == -1 && out->id_type == MQE_SN_NORMAL)
            return malformed(error, "PUBLISH: QoS -1 needs a pre-defined topic id or a short "
                             "name (section 6.8)");
        return 0;
    }
    case MQE_SN_SUBACK: {
        if (body_size(size, 6, 1, error, "SUBACK"))
            return -1;
        if (body[0] & ~MQE_SN_QOS_MASK)
            return malformed(error, "SUBACK: reserved flag bits set (0x%02x) (section 5.3.4)",
                             body[0] & ~(unsigned)MQE_SN_QOS_MASK);
        out->qos = (body[0] & MQE_SN_QOS_MASK) >> 5;
        if (out->qos == 3)
            return malformed(error, "SUBACK: QoS -1 is allowed only in PUBLISH (section 5.3.4)");
        out->topic_id = be16(body + 1);
        out->msg_id = be16(body + 3);
        return return_code(body + 5, out, error, "SUBACK");
    }
    case MQE_SN_PINGRESP:
        return body_size(size, 0, 1, error, "PINGRESP");
    case MQE_SN_DISCONNECT:
        if (size != 0 && size != 2)
            return malformed(error, "DISCONNECT: body of %u octets, 0 or 2 expected "
                             "(section 5.4.21)", (unsigned)size);
        return 0;
    default:
        if (mqe_sn_type_name(type) == NULL)
            return malformed(error, "reserved message type 0x%02x (section 5.2.2)",
                             (unsigned)type);
        snprintf(error, MQE_SN_ERROR_CHARS, "unexpected %s from the gateway",
                 mqe_sn_type_name(type));
        return -1;
    }
}

/* The length field for a message of `body` octets after the MsgType: its octets. */
static size_t put_length(uint8_t *to, size_t body) {
    size_t total = body + 2;
    if (total <= 255) {
        to[0] = (uint8_t)total;
        return 1;
    }
    total += 2;
    to[0] = 0x01;
    to[1] = (uint8_t)(total >> 8);
    to[2] = (uint8_t)total;
    return 3;
}

static size_t message_size(size_t body) { return body + 2 <= 255 ? body + 2 : body + 4; }

static size_t put16(uint8_t *to, uint16_t value) {
    to[0] = (uint8_t)(value >> 8);
    to[1] = (uint8_t)value;
    return 2;
}

size_t mqe_sn_connect_size(size_t client_id_len) { return message_size(4 + client_id_len); }

size_t mqe_sn_encode_connect(uint8_t *to, const char *client_id, size_t client_id_len,
                             uint16_t duration_s) {
    size_t n = put_length(to, 4 + client_id_len);
    to[n++] = MQE_SN_CONNECT;
    to[n++] = MQE_SN_CLEAN_SESSION;
    to[n++] = 0x01;  /* ProtocolId */
    n += put16(to + n, duration_s);
    memcpy(to + n, client_id, client_id_len);
    return n + client_id_len;
}

size_t mqe_sn_register_size(size_t topic_len) { return message_size(4 + topic_len); }

size_t mqe_sn_encode_register(uint8_t *to, uint16_t topic_id, uint16_t msg_id,
                              const char *topic, size_t topic_len) {
    size_t n = put_length(to, 4 + topic_len);
    to[n++] = MQE_SN_REGISTER;
    n += put16(to + n, topic_id);
    n += put16(to + n, msg_id);
    memcpy(to + n, topic, topic_len);
    return n + topic_len;
}

size_t mqe_sn_subscribe_size(size_t topic_len) { return message_size(3 + topic_len); }

size_t mqe_sn_encode_subscribe(uint8_t *to, uint16_t msg_id, const char *topic,
                               size_t topic_len, int qos) {
    size_t n = put_length(to, 3 + topic_len);
    to[n++] = MQE_SN_SUBSCRIBE;
    to[n++] = (uint8_t)((qos << 5) | MQE_SN_NORMAL);
    n += put16(to + n, msg_id);
    memcpy(to + n, topic, topic_len);
    return n + topic_len;
}

size_t mqe_sn_encode_ack(uint8_t *to, int type, uint16_t topic_id, uint16_t msg_id,
                         uint8_t return_code) {
    to[0] = MQE_SN_ACK_BYTES;
    to[1] = (uint8_t)type;
    put16(to + 2, topic_id);
    put16(to + 4, msg_id);
    to[6] = return_code;
    return MQE_SN_ACK_BYTES;
}

size_t mqe_sn_encode_empty(uint8_t *to, int type) {
    to[0] = 2;
    to[1] = (uint8_t)type;
    return 2;
}

size_t mqe_sn_publish_prefix(uint8_t *to, uint16_t topic_id, int qos, size_t data_len) {
    size_t n = put_length(to, 5 + data_len);
    to[n++] = MQE_SN_PUBLISH;
    to[n++] = (uint8_t)((qos << 5) | MQE_SN_NORMAL);
    return n + put16(to + n, topic_id);
}
