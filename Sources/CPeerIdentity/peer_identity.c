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

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <string.h>
#include <sys/stat.h>

int lockbox_unix_peer_inode(int socket_descriptor, unsigned int *peer_inode) {
    struct stat status;
    if (fstat(socket_descriptor, &status) != 0) return -1;
    int diag = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (diag < 0) return -1;

    struct {
        struct nlmsghdr header;
        struct unix_diag_req request;
    } message;
    memset(&message, 0, sizeof message);
    message.header.nlmsg_len = sizeof message;
    message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    message.header.nlmsg_flags = NLM_F_REQUEST;
    message.request.sdiag_family = AF_UNIX;
    message.request.udiag_states = ~0U;
    message.request.udiag_ino = (unsigned int)status.st_ino;
    message.request.udiag_show = UDIAG_SHOW_PEER;
    message.request.udiag_cookie[0] = ~0U;
    message.request.udiag_cookie[1] = ~0U;
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    ssize_t sent;
    do {
        sent = sendto(diag, &message, sizeof message, 0, (struct sockaddr *)&kernel, sizeof kernel);
    } while (sent < 0 && errno == EINTR);
    if (sent != (ssize_t)sizeof message) {
        int saved = sent < 0 ? errno : EIO;
        close(diag);
        errno = saved;
        return -1;
    }

    long buffer[1024];
    ssize_t received;
    do {
        received = recv(diag, buffer, sizeof buffer, 0);
    } while (received < 0 && errno == EINTR);
    int saved = errno;
    close(diag);
    if (received < 0) {
        errno = saved;
        return -1;
    }
    for (struct nlmsghdr *header = (struct nlmsghdr *)buffer; NLMSG_OK(header, (size_t)received);
         header = NLMSG_NEXT(header, received)) {
        if (header->nlmsg_type == NLMSG_ERROR) {
            struct nlmsgerr *error = NLMSG_DATA(header);
            errno = error->error < 0 ? -error->error : EIO;
            return -1;
        }
        if (header->nlmsg_type != SOCK_DIAG_BY_FAMILY) continue;
        struct unix_diag_msg *reply = NLMSG_DATA(header);
        if (reply->udiag_ino != (unsigned int)status.st_ino) continue;
        int length = (int)(header->nlmsg_len - NLMSG_LENGTH(sizeof *reply));
        for (struct rtattr *attribute = (struct rtattr *)(reply + 1); RTA_OK(attribute, length);
             attribute = RTA_NEXT(attribute, length)) {
            if (attribute->rta_type == UNIX_DIAG_PEER && RTA_PAYLOAD(attribute) >= sizeof(unsigned int)) {
                memcpy(peer_inode, RTA_DATA(attribute), sizeof(unsigned int));
                return 0;
            }
        }
    }
    errno = ENOENT;
    return -1;
}
