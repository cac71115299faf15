#ifndef LOCKBOX_PEER_IDENTITY_H
#define LOCKBOX_PEER_IDENTITY_H

#include <sys/types.h>

/// O_PATH (an open that only names a file), which Glibc's Swift module hides behind _GNU_SOURCE.
#define LOCKBOX_O_PATH 0x200000

/// The credentials the kernel recorded for a Unix socket's peer when it connected
/// (SO_PEERCRED). Returns 0, or -1 with errno set.
int lockbox_peer_credentials(int socket, pid_t *pid, uid_t *uid, gid_t *gid);

/// A pidfd for the socket's peer taken by the kernel at connect time (SO_PEERPIDFD, Linux 6.5).
/// Returns the descriptor, or -1 with errno set (ENOPROTOOPT on older kernels).
int lockbox_peer_pidfd(int socket);

/// pidfd_open(2): a descriptor that refers to process `pid` and to no later process that reuses
/// its number. Returns the descriptor, or -1 with errno set.
int lockbox_pidfd_open(pid_t pid);

/// pidfd_send_signal(2) with signal 0: 0 while the process exists (a zombie included), -1 with
/// errno ESRCH once it has been reaped.
int lockbox_pidfd_probe(int pidfd);

/// The inode of the socket at the other end of a connected Unix socket, asked of the kernel's
/// socket diagnostics (NETLINK_SOCK_DIAG, UNIX_DIAG_PEER). Returns 0, or -1 with errno set
/// (ENOENT when the kernel reports no peer).
int lockbox_unix_peer_inode(int socket, unsigned int *peer_inode);

#endif
