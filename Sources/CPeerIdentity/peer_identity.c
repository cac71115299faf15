#define _GNU_SOURCE
#include "peer_identity.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

// struct ucred needs _GNU_SOURCE and syscall(2) is variadic: Swift can call neither directly.
int lockbox_peer_credentials(int socket, pid_t *pid, uid_t *uid, gid_t *gid) {
    struct ucred credentials;
    socklen_t length = sizeof credentials;
    if (getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) return -1;
    if (length != sizeof credentials) {
        errno = EINVAL;
        return -1;
    }
    *pid = credentials.pid;
    *uid = credentials.uid;
    *gid = credentials.gid;
    return 0;
}

int lockbox_peer_pidfd(int socket) {
    int pidfd = -1;
    socklen_t length = sizeof pidfd;
    if (getsockopt(socket, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &length) != 0) return -1;
    return pidfd;
}

int lockbox_pidfd_open(pid_t pid) {
    return (int)syscall(SYS_pidfd_open, pid, 0);
}

int lockbox_pidfd_probe(int pidfd) {
    return (int)syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0);
}

#include <fcntl.h>
_Static_assert(LOCKBOX_O_PATH == O_PATH, "O_PATH differs on this architecture");
