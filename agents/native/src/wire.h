/* MQTT 3.1.1 and 5 framing for the engine: what the broker may send a client, checked
 * strictly, and the few packets a client sends. Pure functions over byte buffers (fuzzed
 * alone). A packet is read in two steps: mqe_parse frames it (the same for both versions),
 * mqe_decode checks and reads what the client's version puts in it (wire5.c: MQTT 5's
 * properties and reason codes). */
#ifndef MQE_WIRE_H
#define MQE_WIRE_H

#include <stddef.h>
#include <stdint.h>

enum {
    MQE_CONNECT = 1, MQE_CONNACK = 2, MQE_PUBLISH = 3, MQE_PUBACK = 4, MQE_PUBREC = 5,
    MQE_PUBREL = 6, MQE_PUBCOMP = 7, MQE_SUBSCRIBE = 8, MQE_SUBACK = 9,
    MQE_PINGREQ = 12, MQE_PINGRESP = 13, MQE_DISCONNECT = 14, MQE_AUTH = 15,
};

/* The protocol level a CONNECT names: MQTT 3.1.1 or MQTT 5. */
enum { MQE_MQTT_311 = 4, MQE_MQTT_5 = 5 };

/* One packet from the broker, pointing into the caller's buffer. */
typedef struct {
    int type;
    int flags;               /* the fixed header's low four bits */
    int qos;                 /* PUBLISH */
    int dup;                 /* PUBLISH */
    uint16_t packet_id;      /* PUBLISH QoS > 0, the acks, SUBACK */
    const uint8_t *topic;    /* PUBLISH */
    size_t topic_len;
    const uint8_t *payload;  /* PUBLISH payload (MQTT 5: after its properties once decoded);
                              * SUBACK return / reason codes, once decoded */
    size_t payload_len;
    const uint8_t *body;     /* what follows the fixed header */
    size_t body_len;
    uint8_t return_code;     /* CONNACK's return (3.1.1) or reason code (5); MQTT 5: an
                              * ack's or DISCONNECT's reason code (0 when left out) */
    const uint8_t *reason_string;  /* MQTT 5: the Reason String property, if sent */
    uint16_t reason_string_len;
} mqe_packet;

#define MQE_ERROR_CHARS 160

/* Frame the packet at the start of buf: > 0 its length (out filled: type, flags, body; a
 * PUBLISH's topic, packet id and the rest as payload), 0 incomplete, -1 malformed (error
 * says why, naming the section of the standard). */
long mqe_parse(const uint8_t *buf, size_t len, mqe_packet *out, char *error);

/* What an MQTT 5 CONNACK granted, the standard's defaults where it says nothing. */
typedef struct {
    uint16_t receive_maximum;        /* 65535 */
    uint16_t topic_alias_maximum;    /* 0 */
    uint8_t maximum_qos;             /* 2 */
    uint32_t maximum_packet_size;    /* 0: no limit beyond the standard's */
    int32_t server_keep_alive;       /* -1: not sent (the client's keep-alive holds) */
} mqe_connack_grants;

/* Check a framed packet as the client's protocol level (MQE_MQTT_311 or MQE_MQTT_5) has
 * it, and read what that version puts in it: CONNACK's code (and MQTT 5 properties into
 * grants, which may be NULL), a PUBLISH's properties skipped (payload then points past
 * them), the acks' and DISCONNECT's reason codes, SUBACK's codes into payload. 0, or -1
 * (error says why, naming the section of that version's standard). */
int mqe_decode(mqe_packet *p, int level, mqe_connack_grants *grants, char *error);
int mqe_decode_5(mqe_packet *p, mqe_connack_grants *grants, char *error);  /* wire5.c */
/* The usual MQTT 5 PUBLISH, inline for the hot path: a topic name and no property (its
 * property length a single 0). 1 if it is that (payload then past the length), else 0:
 * mqe_decode reads it. */
static inline int mqe_publish5_plain(mqe_packet *p) {
    if (p->topic_len == 0 || p->payload_len == 0 || p->payload[0] != 0)
        return 0;
    p->payload++;
    p->payload_len--;
    return 1;
}

/* MQTT 5 properties (wire5.c): the section at `at` (its length varint first) as allowed in
 * a packet of `type` (MQE_CONNACK, MQE_PUBLISH, MQE_PUBACK..MQE_PUBCOMP, MQE_SUBACK,
 * MQE_DISCONNECT): each identifier allowed there, at most once where the standard says so,
 * each value whole and in its range; a Topic Alias refused (this client allows none). The
 * bytes it takes, or -1 (error says why). Grants (may be NULL) and the Reason String into
 * p are filled from what it reads. */
long mqe_properties(const uint8_t *at, size_t len, int type, mqe_packet *p,
                    mqe_connack_grants *grants, char *error);
/* A variable byte integer (section 1.5.5) at `at`: its bytes (1..4), 0 if `len` ends
 * first, -1 if it runs past four bytes; the value into *value. */
int mqe_get_varint(const uint8_t *at, size_t len, uint32_t *value);
/* Names of what a broker answers: 3.1.1 CONNACK return codes ("bad user name or
 * password"), MQTT 5 reason codes as the standard names them ("Bad User Name or
 * Password"); "reserved" / "unknown reason code" for the rest. */
const char *mqe_return_code_name(uint8_t code);
const char *mqe_reason_name(uint8_t code, int type);
/* The Reason String a packet carried as ` (the broker says "...")`, its printable ASCII
 * only (cut to fit `cap`), or "" when there was none. */
void mqe_reason_string(const mqe_packet *p, char *to, size_t cap);

/* Bytes a remaining-length field takes for this length (1..4). */
size_t mqe_varint_size(size_t remaining);
/* Write the remaining length; return its bytes. */
size_t mqe_put_varint(uint8_t *to, size_t remaining);

/* What a CONNECT carries: clean session / clean start always, no will; MQTT 5 with no
 * property (every default: session expiry 0, no topic alias, no packet size limit). */
typedef struct {
    int level;                        /* MQE_MQTT_311 or MQE_MQTT_5 */
    const char *client_id;
    size_t client_id_len;
    uint16_t keepalive_s;
    const char *username;             /* NULL: none */
    size_t username_len;
    const uint8_t *password;          /* NULL: none (3.1.1: only with a user name) */
    size_t password_len;
    int keep_session;                 /* reconnect.c: clean session / clean start 0 */
    uint32_t session_expiry_s;        /* MQTT 5, keep_session: Session Expiry Interval */
} mqe_connect_fields;

/* Encoders return the bytes written to `to`, which must hold what they say. */
size_t mqe_connect_size(const mqe_connect_fields *f);
size_t mqe_encode_connect(uint8_t *to, const mqe_connect_fields *f);
/* SUBSCRIBE: MQTT 5 adds a property length (0), and its options byte is the QoS with No
 * Local, Retain As Published and Retain Handling 0. */
size_t mqe_subscribe_size(size_t topic_len, int level);
size_t mqe_encode_subscribe(uint8_t *to, uint16_t packet_id, const char *topic,
                            size_t topic_len, int qos, int level);
/* The start of a PUBLISH with `payload_len` payload bytes: the fixed header and topic,
 * then for MQTT 5 the packet id's slot (QoS > 0, at *packet_id_at) and a property length
 * 0; for 3.1.1 the packet id (QoS > 0) follows the prefix (*packet_id_at 0). The payload
 * follows. packet_id_at may be NULL for 3.1.1. */
size_t mqe_publish_prefix(uint8_t *to, const char *topic, size_t topic_len, int qos,
                          size_t payload_len, int level, size_t *packet_id_at);
/* PUBACK, PUBREC, PUBREL, PUBCOMP: success in both versions (MQTT 5 leaves out reason code
 * 0 and the properties). */
size_t mqe_encode_ack(uint8_t *to, int type, uint16_t packet_id);

/* The mqttbed payload header (core/events.py PAYLOAD_HEADER "<QIqq" after "MQB1"). */
#define MQE_PAYLOAD_MIN 32
void mqe_encode_payload(uint8_t *to, size_t size, uint64_t seq, uint32_t publisher,
                        int64_t t_pub_ns, int64_t t_intended_ns);
/* 0 and the fields if `p` is an mqttbed payload, else -1. */
int mqe_decode_payload(const uint8_t *p, size_t size, uint64_t *seq, uint32_t *publisher,
                       int64_t *t_pub_ns, int64_t *t_intended_ns);

const char *mqe_type_name(int type);

#endif
