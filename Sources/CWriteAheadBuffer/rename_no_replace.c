// A rename that never replaces what is at the new name (Linux's renameat2 with
// RENAME_NOREPLACE, which glibc declares only under _GNU_SOURCE, out of Swift's reach).

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>

#include "write_ahead_buffer.h"

int lockbox_rename_no_replace(const char *from, const char *to) {
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return 0;
    return errno;
}
