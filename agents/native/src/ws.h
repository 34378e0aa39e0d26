/* RFC 6455 WebSocket for the engine, as a client under MQTT (subprotocol "mqtt"): the
 * upgrade request and the check of its answer, frame headers decoded strictly and client
 * frames encoded masked. Pure functions over byte buffers (fuzzed alone). */
#ifndef MQE_WS_H
#define MQE_WS_H

#include <stddef.h>
#include <stdint.h>

enum {
    MQE_WS_CONTINUATION = 0, MQE_WS_TEXT = 1, MQE_WS_BINARY = 2,
    MQE_WS_CLOSE = 8, MQE_WS_PING = 9, MQE_WS_PONG = 10,
};

/* The largest frame a broker may send: an MQTT packet of the benchmark's size fits many
 * times over; a length beyond it is a broken or hostile peer, not a message. */
#define MQE_WS_MAX_FRAME ((uint64_t)64 << 20)
/* The largest upgrade answer read (status line and headers). */
#define MQE_WS_MAX_RESPONSE 8192
#define MQE_WS_KEY_CHARS 24           /* base64 of 16 random bytes */
#define MQE_WS_MAX_HEADER 14          /* 2 + 8 (length) + 4 (mask) */
#define MQE_WS_ERROR_CHARS 256

/* One frame's header; its payload follows it in the stream. */
typedef struct {
    int fin;
    int opcode;
    int masked;
    uint8_t mask[4];
    uint64_t payload_len;
} mqe_ws_header;

/* Decode the header at the start of buf: > 0 its length (out filled), 0 incomplete, -1
 * malformed (error says why, naming the section of RFC 6455). from_server: a masked frame
 * is an error (section 5.1); otherwise (the engine's own frames, read back by the
 * selftest) the mask is read. */
long mqe_ws_parse_header(const uint8_t *buf, size_t len, int from_server, mqe_ws_header *out,
                         char *error);

/* Bytes of a client frame's header (with its mask) for this payload length. */
size_t mqe_ws_header_size(uint64_t payload_len);
/* Write a final client frame's header, mask included; return its length. */
size_t mqe_ws_put_header(uint8_t *to, int opcode, uint64_t payload_len, const uint8_t mask[4]);
/* XOR data with the mask, starting at byte `offset` of the frame's payload. */
void mqe_ws_mask(uint8_t *data, size_t len, const uint8_t mask[4], uint64_t offset);

/* Sec-WebSocket-Key from 16 random bytes (24 characters and a NUL). */
void mqe_ws_key(const uint8_t random16[16], char key[MQE_WS_KEY_CHARS + 1]);
/* The upgrade request (GET path, Host, Upgrade, Connection, key, version 13, protocol
 * mqtt); its length, or 0 if it does not fit `cap`. */
size_t mqe_ws_request(char *to, size_t cap, const char *host, int port, const char *path,
                      const char *key);
/* Check the upgrade answer at the start of buf: > 0 the length of its head (status line and
 * headers; frames may follow), 0 incomplete, -1 refused or invalid (error names the
 * status line, or the header that is wrong). */
long mqe_ws_check_response(const uint8_t *buf, size_t len, const char *key, char *error);

const char *mqe_ws_opcode_name(int opcode);

#endif
