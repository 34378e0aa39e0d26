/* What the fuzz target (fuzz/fuzz_replies.c) and the selftest (tests/selftest.c) share: the
 * engine that broker replies are fed to (a QoS 2 publisher and a QoS 2 subscriber), and how
 * one input is cut. An input's first byte picks pulse mode (bit 0) and the size of each
 * read (the other bits, plus 1); the rest goes half to the publisher, half to the
 * subscriber. The selftest replays fuzz/seeds and fuzz/regressions exactly as libFuzzer
 * found them. */
#ifndef MQE_FUZZ_REPLIES_H
#define MQE_FUZZ_REPLIES_H

#include <stddef.h>
#include <stdint.h>

#include "../src/engine.h"

/* The two clients on one engine; NULL if the engine cannot be created. */
static inline mqe_engine *mqe_replies_engine(int pulse_mode, int *publisher, int *subscriber) {
    mqe_engine *e = mqe_create(1024, 0, pulse_mode);
    if (e == NULL)
        return NULL;
    *publisher = mqe_add_client(e, "pub-0", "127.0.0.1", 1, 0, "f/x", 2, 2, 0, 64, 1000.0,
                                10, 1, 0, 0);
    *subscriber = mqe_add_client(e, "sub-0", "127.0.0.1", 1, 1, "f/x", 2, 3, 0, 0, 0.0,
                                 10, 1, 0, 0);
    mqe_subscribe(e, *subscriber, "f/+", 2);
    return e;
}

/* ``size`` bytes to one client in reads of ``read_bytes``, until it fails. */
static inline void mqe_feed_in_reads(mqe_engine *e, int client, const uint8_t *data,
                                     size_t size, size_t read_bytes) {
    for (size_t at = 0; at < size; at += read_bytes) {
        size_t n = size - at < read_bytes ? size - at : read_bytes;
        if (mqe_feed(e, client, data + at, n) != 0)
            return;
    }
}

/* One input (``size`` >= 1) cut as above, to an engine of mqe_replies_engine(data[0] & 1). */
static inline void mqe_feed_input(mqe_engine *e, int publisher, int subscriber,
                                  const uint8_t *data, size_t size) {
    size_t read_bytes = (size_t)(data[0] >> 1) + 1, half = (size - 1) / 2;
    mqe_feed_in_reads(e, publisher, data + 1, half, read_bytes);
    mqe_feed_in_reads(e, subscriber, data + 1 + half, size - 1 - half, read_bytes);
}

#endif
