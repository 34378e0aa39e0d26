/* MQTT 3.1.1 framing for the engine: what the broker may send a client, checked strictly,
 * and the few packets a client sends. Pure functions over byte buffers (fuzzed alone). */
#ifndef MQE_WIRE_H
#define MQE_WIRE_H

#include <stddef.h>
#include <stdint.h>

enum {
    MQE_CONNECT = 1, MQE_CONNACK = 2, MQE_PUBLISH = 3, MQE_PUBACK = 4, MQE_PUBREC = 5,
    MQE_PUBREL = 6, MQE_PUBCOMP = 7, MQE_SUBSCRIBE = 8, MQE_SUBACK = 9,
    MQE_PINGREQ = 12, MQE_PINGRESP = 13, MQE_DISCONNECT = 14,
};

/* One packet from the broker, pointing into the caller's buffer. */
typedef struct {
    int type;
    int qos;                 /* PUBLISH */
    int dup;                 /* PUBLISH */
    uint16_t packet_id;      /* PUBLISH QoS > 0, the acks, SUBACK */
    const uint8_t *topic;    /* PUBLISH */
    size_t topic_len;
    const uint8_t *payload;  /* PUBLISH payload; SUBACK return codes */
    size_t payload_len;
    uint8_t return_code;     /* CONNACK */
} mqe_packet;

#define MQE_ERROR_CHARS 160

/* Parse the packet at the start of buf: > 0 its length (out filled), 0 incomplete,
 * -1 malformed (error says why, naming the section of the standard). */
long mqe_parse(const uint8_t *buf, size_t len, mqe_packet *out, char *error);

/* Bytes a remaining-length field takes for this length (1..4). */
size_t mqe_varint_size(size_t remaining);
/* Write the remaining length; return its bytes. */
size_t mqe_put_varint(uint8_t *to, size_t remaining);

/* Encoders return the bytes written to `to`, which must hold what they say. */
size_t mqe_connect_size(size_t client_id_len);
size_t mqe_encode_connect(uint8_t *to, const char *client_id, size_t client_id_len,
                          uint16_t keepalive_s);
size_t mqe_subscribe_size(size_t topic_len);
size_t mqe_encode_subscribe(uint8_t *to, uint16_t packet_id, const char *topic,
                            size_t topic_len, int qos);
/* The fixed header and topic of a PUBLISH with `payload_len` payload bytes (the packet id,
 * for QoS > 0, and the payload follow). */
size_t mqe_publish_prefix(uint8_t *to, const char *topic, size_t topic_len, int qos,
                          size_t payload_len);
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
