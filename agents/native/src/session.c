/* A client's MQTT session: the version it speaks (3.1.1 or 5), the user name and password
 * its CONNECT carries, and what the CONNACK said: a refusal named by its code, or MQTT 5's
 * grants applied (Server Keep Alive) and checked against the client's publishes (Maximum
 * QoS, Maximum Packet Size). The password lives in engine memory only: copied at set-up,
 * wiped with every buffer that held a CONNECT, never formatted into a message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

static void wipe_credentials(mqe_client *c) {
    if (c->password) {
        explicit_bzero(c->password, c->password_len);
        free(c->password);
    }
    free(c->username);
    c->password = NULL;
    c->username = NULL;
    c->password_len = c->username_len = 0;
}

void mqe_session_free(mqe_client *c) {
    wipe_credentials(c);
    /* the CONNECT went through these (the WebSocket frame masks it, no more) */
    if (c->out)
        explicit_bzero(c->out, c->out_cap);
    if (c->wire)
        explicit_bzero(c->wire, c->wire_cap);
}

int mqe_set_session(mqe_engine *e, int client, int protocol_level, const char *username,
                    const uint8_t *password, size_t password_len) {
    mqe_client *c = &e->clients[client];
    int credentials = username != NULL || password != NULL;
    if (protocol_level != MQE_MQTT_311 && protocol_level != MQE_MQTT_5)
        return mqe_refuse(e, "client %s: protocol level %d is neither 4 (MQTT 3.1.1) nor 5 "
                      "(MQTT 5)", c->client_id, protocol_level);
    if ((c->sn || c->udp) && (protocol_level == MQE_MQTT_5 || credentials))
        return mqe_refuse(e, "client %s: MQTT 5 and a user name or password ride on mqtt-tcp "
                      "only, not %s", c->client_id, c->sn ? "mqtt-sn-udp" : "mqtt-udp");
    size_t username_len = username ? strlen(username) : 0;
    if (username_len > 65535)
        return mqe_refuse(e, "client %s: a user name of %zu bytes is longer than 65535",
                      c->client_id, username_len);
    if (password_len > 65535)  /* its length only: the value is never written anywhere */
        return mqe_refuse(e, "client %s: a password of %zu bytes is longer than 65535",
                      c->client_id, password_len);
    if (protocol_level == MQE_MQTT_311 && password != NULL && username == NULL)
        return mqe_refuse(e, "client %s: MQTT 3.1.1 sends a password only with a user name "
                      "(section 3.1.2.9); give a user name or speak MQTT 5", c->client_id);
    wipe_credentials(c);
    if (username && (c->username = strdup(username)) == NULL)
        return mqe_refuse(e, "out of memory for client %s", c->client_id);
    c->username_len = username_len;
    if (password) {  /* malloc(0) may give NULL: an empty password takes one byte */
        if ((c->password = malloc(password_len ? password_len : 1)) == NULL)
            return mqe_refuse(e, "out of memory for client %s", c->client_id);
        memcpy(c->password, password, password_len);
        c->password_len = password_len;
    }
    c->mqtt5 = protocol_level == MQE_MQTT_5;
    if (c->role == 0) {  /* the publisher's prefix, built once for the version spoken */
        size_t payload = c->payload_bytes > MQE_PAYLOAD_MIN ? (size_t)c->payload_bytes
                                                             : MQE_PAYLOAD_MIN;
        uint8_t *prefix = realloc(c->prefix, c->topic_len + 16);
        if (prefix == NULL)
            return mqe_refuse(e, "out of memory for client %s", c->client_id);
        c->prefix = prefix;
        c->prefix_len = mqe_publish_prefix(prefix, c->topic, c->topic_len, c->qos, payload,
                                           mqe_level(c), &c->packet_id_at);
    }
    return 0;
}

static mqe_connect_fields connect_fields(const mqe_client *c, uint16_t keepalive_s) {
    return (mqe_connect_fields){
        .level = mqe_level(c), .client_id = c->client_id,
        .client_id_len = strlen(c->client_id), .keepalive_s = keepalive_s,
        .username = c->username, .username_len = c->username_len,
        .password = c->password, .password_len = c->password_len,
        .keep_session = c->keep_session, .session_expiry_s = c->session_expiry_s};
}

size_t mqe_session_connect_size(const mqe_client *c) {
    mqe_connect_fields f = connect_fields(c, 0);
    return mqe_connect_size(&f);
}

size_t mqe_session_encode_connect(const mqe_client *c, uint8_t *to, uint16_t keepalive_s) {
    mqe_connect_fields f = connect_fields(c, keepalive_s);
    return mqe_encode_connect(to, &f);
}

void mqe_session_connack(mqe_engine *e, mqe_client *c, const mqe_packet *p,
                         const mqe_connack_grants *grants) {
    if (!c->mqtt5) {
        if (p->return_code)
            mqe_client_fail(e, c, "CONNACK refused: return code %u %s (broker %s:%d)",
                            p->return_code, mqe_return_code_name(p->return_code), c->host,
                            c->port);
        else
            c->connected = 1;
        return;
    }
    if (p->return_code >= 0x80) {
        char said[MQE_ERROR_CHARS];
        mqe_reason_string(p, said, sizeof said);
        mqe_client_fail(e, c, "CONNACK refused: reason code 0x%02X %s%s (broker %s:%d)",
                        p->return_code, mqe_reason_name(p->return_code, MQE_CONNACK), said,
                        c->host, c->port);
        return;
    }
    c->grants = *grants;
    if (grants->server_keep_alive >= 0)  /* the broker's keep-alive replaces the client's */
        c->keepalive_ns = (int64_t)grants->server_keep_alive * 1000000000;
    if (c->role == 0 && c->qos > grants->maximum_qos) {
        mqe_client_fail(e, c, "CONNACK: broker %s:%d takes QoS %u at most (Maximum QoS), "
                        "below this publisher's QoS %d (MQTT 5 section 3.2.2.3.4)", c->host,
                        c->port, grants->maximum_qos, c->qos);
        return;
    }
    size_t payload = c->payload_bytes > MQE_PAYLOAD_MIN ? (size_t)c->payload_bytes
                                                         : MQE_PAYLOAD_MIN;
    size_t publish_bytes = c->prefix_len + payload;  /* the id's slot is in the prefix */
    if (c->role == 0 && grants->maximum_packet_size
        && publish_bytes > grants->maximum_packet_size) {
        mqe_client_fail(e, c, "CONNACK: broker %s:%d takes packets of %u bytes at most "
                        "(Maximum Packet Size), smaller than this publisher's PUBLISH of %zu "
                        "(MQTT 5 section 3.2.2.3.6)", c->host, c->port,
                        (unsigned)grants->maximum_packet_size, publish_bytes);
        return;
    }
    c->connected = 1;
}
