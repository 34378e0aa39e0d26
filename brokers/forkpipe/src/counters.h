/* Socket bytes in and out of the whole broker, summed over all its processes.
 *
 * The per-process I/O counters a resource sampler reads (rchar/wchar) also count this
 * broker's pipe traffic, each message written into a pipe and read out again. To compare
 * network bytes with a single-process broker on equal terms, every process adds what it
 * reads from and writes to client sockets into two 64-bit counters in a shared file
 * mapping (--counters-file): native-endian uint64 bytes_in, then bytes_out. The mapping
 * is made by the listener before it forks, so every process inherits it; readers (the
 * mqttbed backend) read the file at any time. */
#ifndef MQTTBED_FORKPIPE_COUNTERS_H
#define MQTTBED_FORKPIPE_COUNTERS_H

#include <stdbool.h>
#include <stddef.h>

/* Maps `path` (created or truncated to 16 zero bytes); false with a message if it cannot. */
bool counters_open(const char *path);
/* Add to the counters; no-ops without counters_open. */
void counters_add_in(size_t bytes);
void counters_add_out(size_t bytes);

#endif
