/* What an mqtt-sn-udp client does with each datagram from the MQTT-SN gateway, with the
 * protocol choices of the lean Python client (agents/mqtt_sn.py): CONNACK, then a
 * publisher REGISTERs its topic and is connected once the REGACK gave the topic id;
 * a subscriber's SUBACK names its topic id (0 for a wildcard filter: the gateway then
 * REGISTERs each matching topic before its first PUBLISH, answered with REGACK); PUBLISH
 * by topic id, QoS 0 and 1 (PUBACK both ways); PINGRESP. CONNECT, REGISTER and SUBSCRIBE
 * are resent until answered (io.c, as for mqtt-udp); an answer to a resent copy is
 * ignored. A datagram that is malformed, unexpected or names a topic id this client never
 * learnt is dropped and counted (c->dropped); a refusal (a return code other than
 * "accepted") fails the client with the code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

static int32_t topic_of(const mqe_client *c, uint16_t id) {
    for (size_t i = 0; i < c->n_sn_topics; i++)
        if (c->sn_topics[i].id == id)
            return c->sn_topics[i].index;
    return -1;
}

static void learn(mqe_engine *e, mqe_client *c, uint16_t id, int32_t index) {
    for (size_t i = 0; i < c->n_sn_topics; i++) {
        if (c->sn_topics[i].id == id) {  /* a gateway may give an id another name */
            c->sn_topics[i].index = index;
            return;
        }
    }
    mqe_sn_topic *topics = realloc(c->sn_topics, (c->n_sn_topics + 1) * sizeof *topics);
    if (topics == NULL) {
        mqe_client_fail(e, c, "out of memory for MQTT-SN topic ids");
        return;
    }
    c->sn_topics = topics;
    c->sn_topics[c->n_sn_topics++] = (mqe_sn_topic){id, index};
}

static void send_now(mqe_engine *e, mqe_client *c, const uint8_t *datagram, size_t len) {
    if (mqe_out_reserve(e, c, len) != 0)
        return;
    memcpy(c->out + c->out_len, datagram, len);
    c->out_len += len;
    mqe_flush(e, c);
}

int mqe_sn_prepare(mqe_client *c, char *error) {
    size_t id_len = strlen(c->client_id);
    if (c->qos != 0 && c->qos != 1) {
        snprintf(error, MQE_FAILURE_CHARS, "client %s: mqtt-sn-udp carries QoS 0 and 1 here, "
                 "not %d", c->client_id, c->qos);
        return -1;
    }
    if (id_len < 1 || id_len > MQE_SN_MAX_CLIENT_ID) {
        snprintf(error, MQE_FAILURE_CHARS, "client %s: an MQTT-SN client id is 1..%d octets, "
                 "not %zu", c->client_id, MQE_SN_MAX_CLIENT_ID, id_len);
        return -1;
    }
    if (mqe_sn_register_size(c->topic_len) > MQE_SN_MAX_DATAGRAM) {
        snprintf(error, MQE_FAILURE_CHARS, "client %s: topic of %zu octets does not fit an "
                 "MQTT-SN datagram", c->client_id, c->topic_len);
        return -1;
    }
    if (c->role == 0) {
        size_t payload = c->payload_bytes > MQE_PAYLOAD_MIN ? (size_t)c->payload_bytes
                                                            : MQE_PAYLOAD_MIN;
        if (payload > MQE_SN_MAX_DATA) {
            snprintf(error, MQE_FAILURE_CHARS, "client %s: payload_bytes %zu exceeds the %d an "
                     "MQTT-SN PUBLISH datagram carries", c->client_id, payload, MQE_SN_MAX_DATA);
            return -1;
        }
        uint8_t *prefix = realloc(c->prefix, MQE_SN_PREFIX_MAX);
        if (prefix == NULL) {
            snprintf(error, MQE_FAILURE_CHARS, "out of memory for client %s", c->client_id);
            return -1;
        }
        c->prefix = prefix;  /* topic id 0 until the REGACK gives it */
        c->prefix_len = mqe_sn_publish_prefix(c->prefix, 0, c->qos, payload);
    }
    c->udp = c->sn = 1;
    c->sn_stage = MQE_SN_CONNECTING;
    return 0;
}

static void connack(mqe_engine *e, mqe_client *c, const mqe_sn_packet *p) {
    if (c->sn_stage != MQE_SN_CONNECTING)
        return;  /* the answer to a CONNECT sent again */
    c->resend_len = 0;
    if (p->return_code) {
        mqe_client_fail(e, c, "CONNACK refused: return code %u (%s)", p->return_code,
                        mqe_sn_return_code_name(p->return_code));
        return;
    }
    if (c->role != 0) {
        c->sn_stage = MQE_SN_READY;
        c->connected = 1;
        return;
    }
    /* a publisher registers its topic: sent again until the REGACK */
    c->sn_register_id = c->next_packet_id = (uint16_t)(c->next_packet_id % 0xFFFF + 1);
    size_t size = mqe_sn_register_size(c->topic_len);
    if (mqe_out_reserve(e, c, size) != 0)
        return;
    size_t n = mqe_sn_encode_register(c->out + c->out_len, 0, c->sn_register_id, c->topic,
                                      c->topic_len);
    c->sn_stage = MQE_SN_REGISTERING;
    mqe_udp_control(e, c, c->out + c->out_len, n);
}

static void regack(mqe_engine *e, mqe_client *c, const mqe_sn_packet *p) {
    if (p->msg_id != c->sn_register_id || c->role != 0) {
        c->dropped++;  /* answers no REGISTER of this client */
        return;
    }
    if (c->sn_stage != MQE_SN_REGISTERING)
        return;  /* the answer to a REGISTER sent again */
    c->resend_len = 0;
    if (p->return_code) {
        mqe_client_fail(e, c, "REGACK refused topic '%s': return code %u (%s)", c->topic,
                        p->return_code, mqe_sn_return_code_name(p->return_code));
        return;
    }
    if (p->topic_id == 0x0000 || p->topic_id == 0xFFFF) {
        mqe_client_fail(e, c, "REGACK accepted topic '%s' with the reserved topic id 0x%04x",
                        c->topic, p->topic_id);
        return;
    }
    c->prefix[c->prefix_len - 2] = (uint8_t)(p->topic_id >> 8);
    c->prefix[c->prefix_len - 1] = (uint8_t)p->topic_id;
    learn(e, c, p->topic_id, c->topic_index);
    c->sn_stage = MQE_SN_READY;
    c->connected = !c->dead;
}

static void suback(mqe_engine *e, mqe_client *c, const mqe_sn_packet *p) {
    /* a subscriber's msg ids are its SUBSCRIBEs', 1, 2, ... in order */
    if (c->role == 0 || p->msg_id == 0 || p->msg_id > c->next_packet_id) {
        c->dropped++;  /* answers no SUBSCRIBE of this client */
        return;
    }
    if (c->subscribed || p->msg_id != c->next_packet_id)
        return;  /* the answer to a SUBSCRIBE sent again */
    c->resend_len = 0;
    const char *topic = mqe_topic(e, (uint32_t)c->subscribing_topic);
    if (p->return_code) {
        mqe_client_fail(e, c, "SUBACK refused '%s': return code %u (%s)", topic,
                        p->return_code, mqe_sn_return_code_name(p->return_code));
        return;
    }
    if (p->topic_id != 0x0000)  /* 0x0000: a wildcard filter, names come by REGISTER */
        learn(e, c, p->topic_id, c->subscribing_topic);
    c->subscribed = 1;
    mqe_record_subscribed(e, c);
}

static void registered(mqe_engine *e, mqe_client *c, const mqe_sn_packet *p) {
    if (p->topic_id == 0x0000 || p->topic_id == 0xFFFF) {
        c->dropped++;  /* a reserved id names nothing */
        return;
    }
    int64_t index = mqe_intern(&e->topics, (const char *)p->data, p->data_len);
    if (index < 0) {
        mqe_client_fail(e, c, "out of memory for topic names");
        return;
    }
    learn(e, c, p->topic_id, (int32_t)index);
    uint8_t ack[MQE_SN_ACK_BYTES];
    send_now(e, c, ack, mqe_sn_encode_ack(ack, MQE_SN_REGACK, p->topic_id, p->msg_id, 0));
}

static void published(mqe_engine *e, mqe_client *c, const mqe_sn_packet *p, int64_t t_user,
                      int64_t t_kernel) {
    if (p->qos == 2) {
        c->dropped++;  /* the engine speaks QoS 0 and 1 on MQTT-SN */
        return;
    }
    int32_t index;
    if (p->id_type == MQE_SN_SHORT_NAME) {
        char name[2] = {(char)(p->topic_id >> 8), (char)p->topic_id};
        int64_t interned = mqe_intern(&e->topics, name, 2);
        if (interned < 0) {
            mqe_client_fail(e, c, "out of memory for topic names");
            return;
        }
        index = (int32_t)interned;
    } else if ((index = topic_of(c, p->topic_id)) < 0) {
        c->dropped++;  /* an id this client never learnt: the message is lost */
        return;
    }
    if (p->qos == 1) {
        uint8_t ack[MQE_SN_ACK_BYTES];
        send_now(e, c, ack, mqe_sn_encode_ack(ack, MQE_SN_PUBACK, p->topic_id, p->msg_id, 0));
    }
    mqe_packet delivery = {
        .type = MQE_PUBLISH, .qos = p->qos > 0 ? p->qos : 0,
        .topic = (const uint8_t *)e->topics.names[index],
        .topic_len = e->topics.lengths[index], .payload = p->data,
        .payload_len = p->data_len};
    mqe_delivered(e, c, &delivery, t_user, t_kernel);
}

static void puback(mqe_engine *e, mqe_client *c, const mqe_sn_packet *p) {
    if (p->return_code) {
        mqe_client_fail(e, c, "PUBACK refused topic id 0x%04x: return code %u (%s)",
                        p->topic_id, p->return_code, mqe_sn_return_code_name(p->return_code));
        return;
    }
    if (c->inflight == NULL || c->inflight[p->msg_id] != MQE_PUBACK) {
        c->dropped++;  /* acknowledges nothing this client awaits */
        return;
    }
    mqe_acknowledged(e, c, MQE_PUBACK, p->msg_id);
}

void mqe_sn_handle(mqe_engine *e, mqe_client *c, const uint8_t *datagram, size_t len,
                   int64_t t_user, int64_t t_kernel) {
    mqe_sn_packet p;
    char error[MQE_SN_ERROR_CHARS];
    if (mqe_sn_parse(datagram, len, &p, error) != 0) {
        c->dropped++;
        return;
    }
    switch (p.type) {
    case MQE_SN_PUBLISH:
        published(e, c, &p, t_user, t_kernel);
        break;
    case MQE_SN_PUBACK:
        puback(e, c, &p);
        break;
    case MQE_SN_CONNACK:
        connack(e, c, &p);
        break;
    case MQE_SN_REGACK:
        regack(e, c, &p);
        break;
    case MQE_SN_SUBACK:
        suback(e, c, &p);
        break;
    case MQE_SN_REGISTER:
        registered(e, c, &p);
        break;
    case MQE_SN_PINGRESP:
        c->ping_sent_ns = 0;
        break;
    case MQE_SN_DISCONNECT:
        mqe_client_fail(e, c, "gateway %s:%d ended the session (DISCONNECT)", c->host, c->port);
        break;
    default:
        c->dropped++;
    }
}
