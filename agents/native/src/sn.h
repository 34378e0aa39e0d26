/* MQTT-SN 1.2 for the engine (mqtt-sn-udp): what a gateway may send a client, checked as
 * strictly as core/mqttsn.py checks it, and the few messages a client sends. One datagram
 * is one message. Pure functions over byte buffers (fuzzed with the rest of the engine). */
#ifndef MQE_SN_H
#define MQE_SN_H

#include <stddef.h>
#include <stdint.h>

/* The MsgType octet (MQTT-SN 1.2 section 5.2.2, table 3): the ones the engine handles. */
enum {
    MQE_SN_CONNECT = 0x04, MQE_SN_CONNACK = 0x05, MQE_SN_REGISTER = 0x0A,
    MQE_SN_REGACK = 0x0B, MQE_SN_PUBLISH = 0x0C, MQE_SN_PUBACK = 0x0D,
    MQE_SN_SUBSCRIBE = 0x12, MQE_SN_SUBACK = 0x13, MQE_SN_PINGREQ = 0x16,
    MQE_SN_PINGRESP = 0x17, MQE_SN_DISCONNECT = 0x18,
};

/* Flags octet (section 5.3.4) and topic id types. */
#define MQE_SN_DUP 0x80
#define MQE_SN_QOS_MASK 0x60
#define MQE_SN_RETAIN 0x10
#define MQE_SN_CLEAN_SESSION 0x04
#define MQE_SN_ID_TYPE_MASK 0x03
enum { MQE_SN_NORMAL = 0, MQE_SN_PREDEFINED = 1, MQE_SN_SHORT_NAME = 2 };
#define MQE_SN_MAX_CLIENT_ID 23     /* section 5.3.1 */
#define MQE_SN_MAX_DATAGRAM 65535

/* One message from the gateway, pointing into the datagram. */
typedef struct {
    int type;
    int qos;                 /* PUBLISH: -1, 0, 1 or 2; SUBACK: the granted QoS */
    int id_type;             /* PUBLISH: MQE_SN_NORMAL, _PREDEFINED or _SHORT_NAME */
    uint16_t topic_id;       /* REGISTER, REGACK, PUBLISH, PUBACK, SUBACK */
    uint16_t msg_id;         /* REGISTER, REGACK, PUBLISH, PUBACK, SUBACK */
    uint8_t return_code;     /* CONNACK, REGACK, PUBACK, SUBACK: 0..3 */
    const uint8_t *data;     /* PUBLISH data; REGISTER topic name */
    size_t data_len;
} mqe_sn_packet;

#define MQE_SN_ERROR_CHARS 160

/* Parse one whole datagram: 0 (out filled), or -1 when it is not a message a gateway may
 * send a client (error says why, naming the section of MQTT-SN 1.2). */
int mqe_sn_parse(const uint8_t *buf, size_t len, mqe_sn_packet *out, char *error);
/* The length a datagram's header gives (the 1- or 3-octet form), 0 if it gives none. */
size_t mqe_sn_length(const uint8_t *buf, size_t len);

/* Encoders return the bytes written to `to`, which must hold what the *_size says. */
size_t mqe_sn_connect_size(size_t client_id_len);
size_t mqe_sn_encode_connect(uint8_t *to, const char *client_id, size_t client_id_len,
                             uint16_t duration_s);
size_t mqe_sn_register_size(size_t topic_len);
size_t mqe_sn_encode_register(uint8_t *to, uint16_t topic_id, uint16_t msg_id,
                              const char *topic, size_t topic_len);
size_t mqe_sn_subscribe_size(size_t topic_len);
size_t mqe_sn_encode_subscribe(uint8_t *to, uint16_t msg_id, const char *topic,
                               size_t topic_len, int qos);
#define MQE_SN_ACK_BYTES 7
/* REGACK or PUBACK: topic id, msg id, return code. */
size_t mqe_sn_encode_ack(uint8_t *to, int type, uint16_t topic_id, uint16_t msg_id,
                         uint8_t return_code);
/* PINGREQ (no client id) or DISCONNECT (no duration): 2 octets. */
size_t mqe_sn_encode_empty(uint8_t *to, int type);
/* A PUBLISH's length, type, flags and topic id for `data_len` data octets (the msg id
 * and the data follow): 5 octets, or 7 in the 3-octet length form. */
#define MQE_SN_PREFIX_MAX 7
size_t mqe_sn_publish_prefix(uint8_t *to, uint16_t topic_id, int qos, size_t data_len);
/* The most data a PUBLISH datagram carries. */
#define MQE_SN_MAX_DATA (MQE_SN_MAX_DATAGRAM - 9)

const char *mqe_sn_type_name(int type);
const char *mqe_sn_return_code_name(int code);

#endif
