/* One process per client: reads its packets and acts on them. */
#ifndef MQTTBED_FORKPIPE_CLIENT_H
#define MQTTBED_FORKPIPE_CLIENT_H

#include <sys/types.h>

/* Serves the connection `sock` until DISCONNECT, a dropped connection, a protocol
 * violation, an expired keep-alive, or a stop signal; then deletes the client's
 * directory, waits for its subscription processes and returns the exit status. */
int client_run(int sock, pid_t listener);

#endif
