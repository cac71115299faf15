#ifndef LOCKBOX_PROCESS_HARDENING_H
#define LOCKBOX_PROCESS_HARDENING_H

/// Makes this process refuse core dumps and ptrace attachment by other processes of the same
/// user (PR_SET_DUMPABLE 0, RLIMIT_CORE 0). Returns 0 on success, -1 if either step failed.
int lockbox_harden_process(void);

/// 1 when this process is marked non-dumpable.
int lockbox_process_is_dumpable(void);

#endif
