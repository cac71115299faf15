#include "process_hardening.h"

#include <sys/prctl.h>
#include <sys/resource.h>

// prctl is variadic, which Swift cannot call; this file is its only caller.
int lockbox_harden_process(void) {
    int result = 0;
    struct rlimit none = {0, 0};
    if (setrlimit(RLIMIT_CORE, &none) != 0) result = -1;
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) result = -1;
    return result;
}

int lockbox_process_is_dumpable(void) {
    return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
}
