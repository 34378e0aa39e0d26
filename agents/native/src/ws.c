/* RFC 6455 WebSocket for the engine (see ws.h). */
#include "ws.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <openssl/evp.h>

static const char ACCEPT_GUID[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

static const char *const OPCODE_NAMES[16] = {
    "continuation", "text", "binary", "reserved opcode 3", "reserved opcode 4",
    "reserved opcode 5", "reserved opcode 6", "reserved opcode 7", "close", "ping", "pong",
    "reserved opcode 11", "reserved opcode 12", "reserved opcode 13", "reserved opcode 14",
    "reserved opcode 15",
};

const char *mqe_ws_opcode_name(int opcode) { return OPCODE_NAMES[opcode & 0x0F]; }

static long malformed(char *error, const char *what) {
    snprintf(error, MQE_WS_ERROR_CHARS, "%s", what);
    return -1;
}

long mqe_ws_parse_header(const uint8_t *buf, size_t len, int from_server, mqe_ws_header *out,
                         char *error) {
    if (len < 2)
        return 0;
    memset(out, 0, sizeof *out);
    out->fin = buf[0] >> 7;
    out->opcode = buf[0] & 0x0F;
    out->masked = buf[1] >> 7;
    if (buf[0] & 0x70)
        return malformed(error, "a frame with reserved bits set and no extension agreed "
                                "(RFC 6455 section 5.2)");
    if (out->opcode == MQE_WS_TEXT)
        return malformed(error, "a text frame: MQTT travels in binary frames only "
                                "(MQTT 3.1.1 section 6)");
    if ((out->opcode > MQE_WS_BINARY && out->opcode < MQE_WS_CLOSE) || out->opcode > MQE_WS_PONG) {
        snprintf(error, MQE_WS_ERROR_CHARS, "a frame with %s (RFC 6455 section 5.2)",
                 mqe_ws_opcode_name(out->opcode));
        return -1;
    }
    if (out->masked && from_server)
        return malformed(error, "a masked frame from the server (RFC 6455 section 5.1)");
    size_t at = 2;
    uint64_t length = buf[1] & 0x7F;
    if (length == 126) {
        if (len < 4)
            return 0;
        length = ((uint64_t)buf[2] << 8) | buf[3];
        at = 4;
        if (length < 126)
            return malformed(error, "a frame length not in its shortest form (RFC 6455 "
                                    "section 5.2)");
    } else if (length == 127) {
        if (len < 10)
            return 0;
        length = 0;
        for (int i = 0; i < 8; i++)
            length = (length << 8) | buf[2 + i];
        at = 10;
        if (length >> 63)
            return malformed(error, "a frame length with its most significant bit set "
                                    "(RFC 6455 section 5.2)");
        if (length <= 0xFFFF)
            return malformed(error, "a frame length not in its shortest form (RFC 6455 "
                                    "section 5.2)");
    }
    if (out->opcode >= MQE_WS_CLOSE && (length > 125 || !out->fin))
        return malformed(error, "a control frame longer than 125 bytes or fragmented "
                                "(RFC 6455 section 5.5)");
    if (length > MQE_WS_MAX_FRAME) {
        snprintf(error, MQE_WS_ERROR_CHARS, "a frame of %llu bytes, more than the %llu the "
                 "engine takes", (unsigned long long)length,
                 (unsigned long long)MQE_WS_MAX_FRAME);
        return -1;
    }
    if (out->masked) {
        if (len < at + 4)
            return 0;
        memcpy(out->mask, buf + at, 4);
        at += 4;
    }
    out->payload_len = length;
    return (long)at;
}

size_t mqe_ws_header_size(uint64_t payload_len) {
    return (payload_len < 126 ? 2u : payload_len <= 0xFFFF ? 4u : 10u) + 4u;
}

size_t mqe_ws_put_header(uint8_t *to, int opcode, uint64_t payload_len, const uint8_t mask[4]) {
    size_t at = 2;
    to[0] = (uint8_t)(0x80 | opcode);
    if (payload_len < 126) {
        to[1] = (uint8_t)(0x80 | payload_len);
    } else if (payload_len <= 0xFFFF) {
        to[1] = 0x80 | 126;
        to[2] = (uint8_t)(payload_len >> 8);
        to[3] = (uint8_t)payload_len;
        at = 4;
    } else {
        to[1] = 0x80 | 127;
        for (int i = 0; i < 8; i++)
            to[2 + i] = (uint8_t)(payload_len >> (56 - 8 * i));
        at = 10;
    }
    memcpy(to + at, mask, 4);
    return at + 4;
}

void mqe_ws_mask(uint8_t *data, size_t len, const uint8_t mask[4], uint64_t offset) {
    size_t i = 0;
    /* eight bytes at a time where the data allows: the key repeats every four */
    uint8_t rotated[8];
    for (int k = 0; k < 8; k++)
        rotated[k] = mask[(offset + (uint64_t)k) & 3];
    uint64_t wide;
    memcpy(&wide, rotated, 8);
    for (; i + 8 <= len; i += 8) {
        uint64_t chunk;
        memcpy(&chunk, data + i, 8);
        chunk ^= wide;
        memcpy(data + i, &chunk, 8);
    }
    for (; i < len; i++)
        data[i] ^= rotated[i & 7];
}

void mqe_ws_key(const uint8_t random16[16], char key[MQE_WS_KEY_CHARS + 1]) {
    EVP_EncodeBlock((unsigned char *)key, random16, 16);
}

size_t mqe_ws_request(char *to, size_t cap, const char *host, int port, const char *path,
                      const char *key) {
    /* an IPv6 literal is bracketed in Host (RFC 7230 section 5.4, RFC 3986 section 3.2.2) */
    int v6 = strchr(host, ':') != NULL;
    int n = snprintf(to, cap,
                     "GET %s HTTP/1.1\r\n"
                     "Host: %s%s%s:%d\r\n"
                     "Upgrade: websocket\r\n"
                     "Connection: Upgrade\r\n"
                     "Sec-WebSocket-Key: %s\r\n"
                     "Sec-WebSocket-Version: 13\r\n"
                     "Sec-WebSocket-Protocol: mqtt\r\n"
                     "\r\n", path, v6 ? "[" : "", host, v6 ? "]" : "", port, key);
    return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

/* A header line's value with surrounding blanks trimmed, copied (truncated) into `to`. */
static void header_value(const char *from, const char *end, char *to, size_t cap) {
    while (from < end && (*from == ' ' || *from == '\t'))
        from++;
    while (end > from && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    size_t n = (size_t)(end - from) < cap - 1 ? (size_t)(end - from) : cap - 1;
    memcpy(to, from, n);
    to[n] = 0;
}

/* Whether the comma-separated list `value` holds `token` (case-insensitive). */
static int has_token(const char *value, const char *token) {
    size_t len = strlen(token);
    for (const char *at = value; *at;) {
        while (*at == ' ' || *at == '\t' || *at == ',')
            at++;
        const char *end = at;
        while (*end && *end != ',')
            end++;
        const char *last = end;
        while (last > at && (last[-1] == ' ' || last[-1] == '\t'))
            last--;
        if ((size_t)(last - at) == len && strncasecmp(at, token, len) == 0)
            return 1;
        at = end;
    }
    return 0;
}

/* The status line, printable, for an error message. */
static void status_line(const uint8_t *buf, size_t len, char *to, size_t cap) {
    size_t n = 0;
    for (; n < len && n < cap - 1 && buf[n] != '\r' && buf[n] != '\n'; n++)
        to[n] = isprint(buf[n]) ? (char)buf[n] : '?';
    to[n] = 0;
}

long mqe_ws_check_response(const uint8_t *buf, size_t len, const char *key, char *error) {
    char status[96];
    size_t head = 0;
    for (size_t i = 0; i + 3 < len && i + 4 <= MQE_WS_MAX_RESPONSE; i++)
        if (memcmp(buf + i, "\r\n\r\n", 4) == 0) {
            head = i + 4;
            break;
        }
    if (head == 0) {
        /* an answer that is not HTTP at all is named at once, not waited out */
        if (len >= 5 && memcmp(buf, "HTTP/", 5) != 0) {
            status_line(buf, len, status, sizeof status);
            snprintf(error, MQE_WS_ERROR_CHARS, "the WebSocket upgrade was answered with "
                     "\"%s\", not HTTP", status);
            return -1;
        }
        if (len >= MQE_WS_MAX_RESPONSE) {
            snprintf(error, MQE_WS_ERROR_CHARS, "the WebSocket upgrade answer has no end "
                     "within %d bytes", MQE_WS_MAX_RESPONSE);
            return -1;
        }
        return 0;
    }
    status_line(buf, head, status, sizeof status);
    if (strncmp(status, "HTTP/1.1 101", 12) != 0 || (status[12] && status[12] != ' ')) {
        snprintf(error, MQE_WS_ERROR_CHARS, "the WebSocket upgrade was refused: \"%s\"",
                 status);
        return -1;
    }
    char expected[64], concatenated[MQE_WS_KEY_CHARS + sizeof ACCEPT_GUID];
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int digest_len = 0;
    snprintf(concatenated, sizeof concatenated, "%s%s", key, ACCEPT_GUID);
    EVP_Digest(concatenated, strlen(concatenated), digest, &digest_len, EVP_sha1(), NULL);
    EVP_EncodeBlock((unsigned char *)expected, digest, (int)digest_len);
    int upgrade = 0, connection = 0, accept = 0, protocol = 0;
    char value[128];
    const char *text = (const char *)buf, *end = text + head - 2;
    for (const char *line = (const char *)memchr(text, '\n', head) + 1; line < end;) {
        const char *eol = memchr(line, '\r', (size_t)(end - line));
        if (eol == NULL)
            eol = end;
        const char *colon = memchr(line, ':', (size_t)(eol - line));
        if (colon != NULL) {
            size_t name_len = (size_t)(colon - line);
            header_value(colon + 1, eol, value, sizeof value);
#define IS(name) (name_len == sizeof name - 1 && strncasecmp(line, name, name_len) == 0)
            if (IS("Upgrade"))
                upgrade = strcasecmp(value, "websocket") == 0;
            else if (IS("Connection"))
                connection = has_token(value, "upgrade");
            else if (IS("Sec-WebSocket-Accept"))
                accept = strcmp(value, expected) == 0 ? 1 : -1;
            else if (IS("Sec-WebSocket-Protocol"))
                protocol = strcmp(value, "mqtt") == 0 ? 1 : -1;
#undef IS
        }
        line = eol + 2;
    }
    const char *wrong = !upgrade ? "no \"Upgrade: websocket\" header"
                        : !connection ? "no \"Connection: Upgrade\" header"
                        : accept == 0 ? "no Sec-WebSocket-Accept header"
                        : accept < 0 ? "a Sec-WebSocket-Accept that does not match the key "
                                       "(RFC 6455 section 4.1)"
                        : protocol == 0 ? "no Sec-WebSocket-Protocol: the server did not agree "
                                          "to the subprotocol mqtt"
                        : protocol < 0 ? "a Sec-WebSocket-Protocol other than mqtt" : NULL;
    if (wrong != NULL) {
        snprintf(error, MQE_WS_ERROR_CHARS, "the WebSocket upgrade answer (\"%s\") has %s",
                 status, wrong);
        return -1;
    }
    return (long)head;
}
