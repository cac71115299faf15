#include "process_hardening.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

int lockbox_reserve_standard_descriptors(void) {
    int result = 0;
    for (int descriptor = 0; descriptor <= 2; descriptor++) {
        if (fcntl(descriptor, F_GETFD) != -1 || errno != EBADF) continue;
        // The lowest free descriptor: this one, as the lower ones are open by now. Opened for
        // the other direction, so that using it fails as on a closed descriptor (EBADF): a
        // secret printed to a closed standard output is an error, not a success that wrote
        // nowhere, and a closed standard input is not read as an empty one.
        int opened = open("/dev/null", descriptor == 0 ? O_WRONLY : O_RDONLY);
        if (opened != descriptor) {
            if (opened >= 0) close(opened);
            result = -1;
        }
    }
    return result;
}

// prctl is variadic, which Swift cannot call; this file is its only caller.
int lockbox_harden_process(void) {
    // Reserved here too for a program that did not call it first; its failure (no /dev/null)
    // is no failure of the hardening this reports on.
    (void)lockbox_reserve_standard_descriptors();
    int result = 0;
    struct rlimit none = {0, 0};
    if (setrlimit(RLIMIT_CORE, &none) != 0) result = -1;
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) result = -1;
    return result;
}

int lockbox_process_is_dumpable(void) {
    return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
}
