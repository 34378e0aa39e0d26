/* Whole packets onto a client's socket from several processes.
 *
 * A client's socket is written by its client process (CONNACK, SUBACK, PINGRESP ...)
 * and by each of its subscription processes (PUBLISH). A blocking send() can be split
 * when the socket buffer fills, so without a lock the bytes of two packets could
 * interleave. The lock is a robust, process-shared mutex in a shared anonymous mapping
 * made by the client process before it forks its subscription processes. */
#ifndef MQTTBED_FORKPIPE_SENDLOCK_H
#define MQTTBED_FORKPIPE_SENDLOCK_H

#include <stdbool.h>
#include <stddef.h>

/* Creates this client's lock; call once in the client process, before any fork. */
bool sendlock_init(void);
/* Releases the mapping (each process that inherited it, on its way out). */
void sendlock_release(void);

/* Sends all of buf on `sock` under the lock; false if the peer is gone, it read nothing
 * for send_timeout_ms (SO_SNDTIMEO), or the process is stopping. */
bool send_packet(int sock, const void *buf, size_t len);

#endif
