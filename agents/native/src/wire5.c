/* MQTT 5's additions to what a broker sends (OASIS MQTT Version 5.0; see wire.h): the
 * properties section checked whole, reason codes checked against those each packet may
 * carry, and the names of reason codes and of 3.1.1 CONNACK return codes. Section numbers
 * in the messages are MQTT 5's. */
#include <stdio.h>
#include <string.h>

#include "wire.h"

static int fail(char *error, const char *what) {
    snprintf(error, MQE_ERROR_CHARS, "%s", what);
    return -1;
}

int mqe_get_varint(const uint8_t *at, size_t len, uint32_t *value) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        if ((size_t)i >= len)
            return 0;
        v |= (uint32_t)(at[i] & 0x7F) << (7 * i);
        if (!(at[i] & 0x80)) {
            *value = v;
            return i + 1;
        }
    }
    return -1;
}

/* -- properties (section 2.2.2) --------------------------------------------------------- */

enum { P_BYTE, P_TWO, P_FOUR, P_VARINT, P_STRING, P_BINARY, P_PAIR };
/* The packets a property may come in, from a broker to a client. */
enum { IN_CONNACK = 1, IN_PUBLISH = 2, IN_ACK = 4, IN_SUBACK = 8, IN_DISCONNECT = 16 };
#define IN_ALL (IN_CONNACK | IN_PUBLISH | IN_ACK | IN_SUBACK | IN_DISCONNECT)

typedef struct {
    uint8_t id, kind, in, repeats;  /* repeats: allowed more than once in those packets */
    const char *name;
} property_kind;

static const property_kind PROPERTIES[] = {
    {0x01, P_BYTE, IN_PUBLISH, 0, "Payload Format Indicator"},
    {0x02, P_FOUR, IN_PUBLISH, 0, "Message Expiry Interval"},
    {0x03, P_STRING, IN_PUBLISH, 0, "Content Type"},
    {0x08, P_STRING, IN_PUBLISH, 0, "Response Topic"},
    {0x09, P_BINARY, IN_PUBLISH, 0, "Correlation Data"},
    {0x0B, P_VARINT, IN_PUBLISH, 1, "Subscription Identifier"},
    {0x11, P_FOUR, IN_CONNACK, 0, "Session Expiry Interval"},  /* never in a server's DISCONNECT */
    {0x12, P_STRING, IN_CONNACK, 0, "Assigned Client Identifier"},
    {0x13, P_TWO, IN_CONNACK, 0, "Server Keep Alive"},
    {0x15, P_STRING, IN_CONNACK, 0, "Authentication Method"},
    {0x16, P_BINARY, IN_CONNACK, 0, "Authentication Data"},
    {0x1A, P_STRING, IN_CONNACK, 0, "Response Information"},
    {0x1C, P_STRING, IN_CONNACK | IN_DISCONNECT, 0, "Server Reference"},
    {0x1F, P_STRING, IN_CONNACK | IN_ACK | IN_SUBACK | IN_DISCONNECT, 0, "Reason String"},
    {0x21, P_TWO, IN_CONNACK, 0, "Receive Maximum"},
    {0x22, P_TWO, IN_CONNACK, 0, "Topic Alias Maximum"},
    {0x23, P_TWO, IN_PUBLISH, 0, "Topic Alias"},
    {0x24, P_BYTE, IN_CONNACK, 0, "Maximum QoS"},
    {0x25, P_BYTE, IN_CONNACK, 0, "Retain Available"},
    {0x26, P_PAIR, IN_ALL, 1, "User Property"},
    {0x27, P_FOUR, IN_CONNACK, 0, "Maximum Packet Size"},
    {0x28, P_BYTE, IN_CONNACK, 0, "Wildcard Subscription Available"},
    {0x29, P_BYTE, IN_CONNACK, 0, "Subscription Identifiers Available"},
    {0x2A, P_BYTE, IN_CONNACK, 0, "Shared Subscription Available"},
};
#define N_PROPERTIES (sizeof PROPERTIES / sizeof PROPERTIES[0])

static int packet_bit(int type) {
    switch (type) {
    case MQE_CONNACK: return IN_CONNACK;
    case MQE_PUBLISH: return IN_PUBLISH;
    case MQE_PUBACK: case MQE_PUBREC: case MQE_PUBREL: case MQE_PUBCOMP: return IN_ACK;
    case MQE_SUBACK: return IN_SUBACK;
    case MQE_DISCONNECT: return IN_DISCONNECT;
    default: return 0;
    }
}

static const property_kind *property_of(uint32_t id) {
    for (size_t i = 0; i < N_PROPERTIES; i++)
        if (PROPERTIES[i].id == id)
            return &PROPERTIES[i];
    return NULL;
}

/* The bytes a value of `kind` takes at `at` (at most `left`), or 0 if it runs past it. */
static size_t value_size(int kind, const uint8_t *at, size_t left, uint32_t *number) {
    size_t n = 0;
    switch (kind) {
    case P_BYTE: n = 1; break;
    case P_TWO: n = 2; break;
    case P_FOUR: n = 4; break;
    case P_VARINT: {
        int used = mqe_get_varint(at, left, number);
        return used > 0 ? (size_t)used : 0;
    }
    case P_STRING: case P_BINARY:
        if (left < 2)
            return 0;
        n = 2 + (((size_t)at[0] << 8) | at[1]);
        break;
    case P_PAIR: {
        size_t key = value_size(P_STRING, at, left, number);
        if (key == 0)
            return 0;
        size_t value = value_size(P_STRING, at + key, left - key, number);
        return value ? key + value : 0;
    }
    }
    if (n > left)
        return 0;
    *number = 0;
    for (size_t i = 0; kind <= P_FOUR && i < n; i++)
        *number = (*number << 8) | at[i];
    return n;
}

long mqe_properties(const uint8_t *at, size_t len, int type, mqe_packet *p,
                    mqe_connack_grants *grants, char *error) {
    char what[MQE_ERROR_CHARS];
    uint32_t section;
    int used = mqe_get_varint(at, len, &section);
    if (used <= 0)
        return fail(error, used ? "property length runs past four bytes (section 1.5.5)"
                                : "property length missing (section 2.2.2.1)");
    if (section > len - (size_t)used) {
        snprintf(what, sizeof what, "%s properties of %u bytes run past the packet "
                 "(section 2.2.2.1)", mqe_type_name(type), (unsigned)section);
        return fail(error, what);
    }
    const uint8_t *end = at + used + section;
    uint64_t seen = 0;
    int in = packet_bit(type);
    for (const uint8_t *q = at + used; q < end;) {
        uint32_t id, number = 0;
        int id_bytes = mqe_get_varint(q, (size_t)(end - q), &id);
        const property_kind *kind = id_bytes > 0 ? property_of(id) : NULL;
        if (kind == NULL || !(kind->in & in)) {
            snprintf(what, sizeof what, "%s carries %s property 0x%02X (section 2.2.2.2)",
                     mqe_type_name(type), kind ? "a misplaced" : "an unknown",
                     id_bytes > 0 ? (unsigned)id : 0u);
            return fail(error, what);
        }
        q += id_bytes;
        if (!kind->repeats && (seen >> kind->id) & 1) {
            snprintf(what, sizeof what, "%s carries %s twice (section 2.2.2.2)",
                     mqe_type_name(type), kind->name);
            return fail(error, what);
        }
        seen |= UINT64_C(1) << kind->id;
        size_t size = value_size(kind->kind, q, (size_t)(end - q), &number);
        if (size == 0) {
            snprintf(what, sizeof what, "%s property %s runs past its properties "
                     "(section 2.2.2)", mqe_type_name(type), kind->name);
            return fail(error, what);
        }
        /* the values the standard bounds (a byte that is a yes/no, a maximum that is not 0) */
        int bad = (kind->kind == P_BYTE && number > 1)
                  || ((kind->id == 0x21 || kind->id == 0x27 || kind->id == 0x0B) && number == 0);
        if (bad) {
            snprintf(what, sizeof what, "%s property %s has the value %u, outside what "
                     "the standard allows (section 2.2.2.2)", mqe_type_name(type), kind->name,
                     (unsigned)number);
            return fail(error, what);
        }
        if (kind->id == 0x23)  /* a Topic Alias: this client's CONNECT allows none */
            return fail(error, "PUBLISH carries a Topic Alias, which this client never allows "
                        "(its CONNECT sets no Topic Alias Maximum: section 3.3.2.3.4)");
        if (kind->id == 0x1F && p != NULL) {
            p->reason_string = q + 2;
            p->reason_string_len = (uint16_t)(size - 2);
        }
        if (grants != NULL) {
            switch (kind->id) {
            case 0x21: grants->receive_maximum = (uint16_t)number; break;
            case 0x22: grants->topic_alias_maximum = (uint16_t)number; break;
            case 0x24: grants->maximum_qos = (uint8_t)number; break;
            case 0x27: grants->maximum_packet_size = number; break;
            case 0x13: grants->server_keep_alive = (int32_t)number; break;
            default: break;
            }
        }
        q += size;
    }
    return (long)(end - at);
}

/* -- reason codes (section 2.4) ----------------------------------------------------------- */

static const uint8_t CONNACK_CODES[] = {0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87,
                                        0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A,
                                        0x9B, 0x9C, 0x9D, 0x9F};
static const uint8_t PUBACK_CODES[] = {0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99};
static const uint8_t PUBREL_CODES[] = {0x00, 0x92};
static const uint8_t SUBACK_CODES[] = {0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97,
                                       0x9E, 0xA1, 0xA2};
static const uint8_t DISCONNECT_CODES[] = {0x00, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B,
                                           0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95, 0x96,
                                           0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E,
                                           0x9F, 0xA0, 0xA1, 0xA2};

static int reason_allowed(int type, uint8_t code) {
    const uint8_t *codes;
    size_t n;
    switch (type) {
    case MQE_CONNACK: codes = CONNACK_CODES; n = sizeof CONNACK_CODES; break;
    case MQE_PUBACK: case MQE_PUBREC: codes = PUBACK_CODES; n = sizeof PUBACK_CODES; break;
    case MQE_PUBREL: case MQE_PUBCOMP: codes = PUBREL_CODES; n = sizeof PUBREL_CODES; break;
    case MQE_SUBACK: codes = SUBACK_CODES; n = sizeof SUBACK_CODES; break;
    default: codes = DISCONNECT_CODES; n = sizeof DISCONNECT_CODES; break;
    }
    return memchr(codes, code, n) != NULL;
}

typedef struct {
    uint8_t code;
    const char *name;
} reason_name;

static const reason_name REASONS[] = {
    {0x04, "Disconnect with Will Message"}, {0x10, "No matching subscribers"},
    {0x11, "No subscription existed"}, {0x18, "Continue authentication"},
    {0x19, "Re-authenticate"}, {0x80, "Unspecified error"}, {0x81, "Malformed Packet"},
    {0x82, "Protocol Error"}, {0x83, "Implementation specific error"},
    {0x84, "Unsupported Protocol Version"}, {0x85, "Client Identifier not valid"},
    {0x86, "Bad User Name or Password"}, {0x87, "Not authorized"},
    {0x88, "Server unavailable"}, {0x89, "Server busy"}, {0x8A, "Banned"},
    {0x8B, "Server shutting down"}, {0x8C, "Bad authentication method"},
    {0x8D, "Keep Alive timeout"}, {0x8E, "Session taken over"},
    {0x8F, "Topic Filter invalid"}, {0x90, "Topic Name invalid"},
    {0x91, "Packet Identifier in use"}, {0x92, "Packet Identifier not found"},
    {0x93, "Receive Maximum exceeded"}, {0x94, "Topic Alias invalid"},
    {0x95, "Packet too large"}, {0x96, "Message rate too high"}, {0x97, "Quota exceeded"},
    {0x98, "Administrative action"}, {0x99, "Payload format invalid"},
    {0x9A, "Retain not supported"}, {0x9B, "QoS not supported"},
    {0x9C, "Use another server"}, {0x9D, "Server moved"},
    {0x9E, "Shared Subscriptions not supported"}, {0x9F, "Connection rate exceeded"},
    {0xA0, "Maximum connect time"}, {0xA1, "Subscription Identifiers not supported"},
    {0xA2, "Wildcard Subscriptions not supported"},
};

const char *mqe_reason_name(uint8_t code, int type) {
    if (code == 0x00)
        return type == MQE_DISCONNECT ? "Normal disconnection"
             : type == MQE_SUBACK ? "Granted QoS 0" : "Success";
    if (code == 0x01 || code == 0x02)
        return code == 0x01 ? "Granted QoS 1" : "Granted QoS 2";
    for (size_t i = 0; i < sizeof REASONS / sizeof REASONS[0]; i++)
        if (REASONS[i].code == code)
            return REASONS[i].name;
    return "unknown reason code";
}

const char *mqe_return_code_name(uint8_t code) {
    static const char *const NAMES[] = {
        "accepted", "unacceptable protocol version", "identifier rejected",
        "server unavailable", "bad user name or password", "not authorized"};
    return code < sizeof NAMES / sizeof NAMES[0] ? NAMES[code] : "reserved";
}

void mqe_reason_string(const mqe_packet *p, char *to, size_t cap) {
    static const char head[] = " (the broker says \"", tail[] = "\")";
    to[0] = 0;
    if (p->reason_string == NULL || cap < sizeof head + sizeof tail + 1)
        return;
    size_t n = sizeof head - 1;
    memcpy(to, head, n);
    for (size_t i = 0; i < p->reason_string_len && n + sizeof tail < cap; i++) {
        uint8_t ch = p->reason_string[i];
        to[n++] = ch >= 0x20 && ch < 0x7F ? (char)ch : '?';  /* nothing a terminal acts on */
    }
    memcpy(to + n, tail, sizeof tail);
}

/* -- the packets ------------------------------------------------------------------------- */

static int bad_code(char *error, int type, uint8_t code, const char *section) {
    snprintf(error, MQE_ERROR_CHARS, "%s reason code 0x%02X is not one it may carry "
             "(section %s)", mqe_type_name(type), code, section);
    return -1;
}

/* The reason code and properties after `at` bytes of the body (acks, DISCONNECT): both
 * may be left out, the properties alone too. */
static int reason_and_properties(mqe_packet *p, size_t at, const char *section, char *error) {
    if (p->body_len > at) {
        p->return_code = p->body[at];
        if (!reason_allowed(p->type, p->return_code))
            return bad_code(error, p->type, p->return_code, section);
    }
    if (p->body_len > at + 1) {
        long used = mqe_properties(p->body + at + 1, p->body_len - at - 1, p->type, p, NULL,
                                   error);
        if (used < 0)
            return -1;
        if ((size_t)used != p->body_len - at - 1) {
            snprintf(error, MQE_ERROR_CHARS, "%s has %zu bytes after its properties "
                     "(section %s)", mqe_type_name(p->type), p->body_len - at - 1 - (size_t)used,
                     section);
            return -1;
        }
    }
    return 0;
}

int mqe_decode_5(mqe_packet *p, mqe_connack_grants *grants, char *error) {
    const uint8_t *body = p->body;
    size_t remaining = p->body_len;
    int type = p->type, flags = p->flags;
    switch (type) {
    case MQE_PUBLISH: {
        if (p->topic_len == 0)  /* only a Topic Alias may stand for the name, and none may come */
            return fail(error, "PUBLISH without a topic name (section 3.3.2.1)");
        if (mqe_publish5_plain(p))
            return 0;
        long used = mqe_properties(p->payload, p->payload_len, MQE_PUBLISH, p, NULL, error);
        if (used < 0)
            return -1;
        p->payload += used;
        p->payload_len -= (size_t)used;
        return 0;
    }
    case MQE_CONNACK: {
        if (flags || remaining < 3)
            return fail(error, "CONNACK is not 3 bytes or more with flags 0 (section 3.2)");
        if (body[0] & 0xFE)
            return fail(error, "CONNACK acknowledge flags reserved bits set (section 3.2.2.1)");
        p->return_code = body[1];
        if (!reason_allowed(MQE_CONNACK, p->return_code))
            return bad_code(error, MQE_CONNACK, p->return_code, "3.2.2.2");
        if (grants != NULL)
            *grants = (mqe_connack_grants){.receive_maximum = 65535, .maximum_qos = 2,
                                           .server_keep_alive = -1};
        long used = mqe_properties(body + 2, remaining - 2, MQE_CONNACK, p, grants, error);
        if (used < 0)
            return -1;
        if ((size_t)used != remaining - 2)
            return fail(error, "CONNACK has bytes after its properties (section 3.2.3)");
        return 0;
    }
    case MQE_PUBACK: case MQE_PUBREC: case MQE_PUBREL: case MQE_PUBCOMP: {
        static const char *const SECTIONS[] = {"3.4.2.1", "3.5.2.1", "3.6.2.1", "3.7.2.1"};
        if (remaining < 2 || flags != (type == MQE_PUBREL ? 2 : 0))
            return fail(error, type == MQE_PUBREL
                        ? "PUBREL is not 2 bytes or more with flags 2 (section 3.6.1)"
                        : "acknowledgement is not 2 bytes or more with flags 0 (section 3.4)");
        p->packet_id = (uint16_t)((body[0] << 8) | body[1]);
        return reason_and_properties(p, 2, SECTIONS[type - MQE_PUBACK], error);
    }
    case MQE_SUBACK: {
        if (flags || remaining < 3)
            return fail(error, "SUBACK without a packet id and properties (section 3.9)");
        p->packet_id = (uint16_t)((body[0] << 8) | body[1]);
        long used = mqe_properties(body + 2, remaining - 2, MQE_SUBACK, p, NULL, error);
        if (used < 0)
            return -1;
        p->payload = body + 2 + used;
        p->payload_len = remaining - 2 - (size_t)used;
        if (p->payload_len == 0)
            return fail(error, "SUBACK without a reason code (section 3.9.3)");
        for (size_t i = 0; i < p->payload_len; i++)
            if (!reason_allowed(MQE_SUBACK, p->payload[i]))
                return bad_code(error, MQE_SUBACK, p->payload[i], "3.9.3");
        return 0;
    }
    case MQE_DISCONNECT:
        if (flags)
            return fail(error, "DISCONNECT with flags set (section 3.14.1)");
        return reason_and_properties(p, 0, "3.14.2.1", error);
    case MQE_PINGRESP:
        if (flags || remaining)
            return fail(error, "PINGRESP is not empty with flags 0 (section 3.13)");
        return 0;
    case MQE_AUTH:
        return fail(error, "unexpected AUTH from the broker (it answers an Authentication "
                    "Method, which this client never sends: section 4.12)");
    default:
        snprintf(error, MQE_ERROR_CHARS, "unexpected %s from the broker", mqe_type_name(type));
        return -1;
    }
}
